#!/bin/bash
# Second device call (run inline): the default recipe compiled in both modes with TORCH_LOGS=recompiles, to see
# what compiled after the warm-up (the model in eval mode at load; SDPA dropping an all-ones mask).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site:$PWD
R="finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1"
for m in default reduce-overhead; do
  TORCH_LOGS=recompiles ACCELERATE_MIXED_PRECISION=bf16 timeout 110 python3 $R output_dir=/tmp/d_$m torch_compile=true length_buckets=4 torch_compile_mode=$m > $OUT/diag_$m.log 2>&1
done
