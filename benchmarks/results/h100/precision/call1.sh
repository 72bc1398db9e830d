#!/bin/bash
# Device call (one H100), run as `bash benchmarks/results/h100/precision/call1.sh` with the wheels of datasets
# and its dependencies carried in .whl/: (1) exp.py, bf16 weights against autocast, compiled; (2) the app's bench
# at batch 256 compiled, for the app's own MFU on this card; (3) the default recipe's whole command, eager bf16,
# three times in a row (the first on a cold machine), with its phase line; (4) the package's import time, warm.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; L=$OUT/r/log.txt
nvidia-smi -L | tee $L; python3 -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__)" | tee -a $L
R="finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1"
for i in 1 2 3; do
 ACCELERATE_MIXED_PRECISION=bf16 /usr/bin/time -o /tmp/tw -f "%e" timeout 70 python3 $R output_dir=/tmp/w_$i > $OUT/r/whole_$i.log 2>&1
 echo "whole command $i, python direct, bf16, eager: exit $? wall $(cat /tmp/tw) s" | tee -a $L
 grep -E "seconds:|test acc|^error|Error" $OUT/r/whole_$i.log | tail -4 | tee -a $L
done
python3 -X importtime -c "import finetune.run" 2> $OUT/r/importtime.txt; /usr/bin/time -f "import finetune.run (warm): %e s" python3 -c "import finetune.run" 2>&1 | tee -a $L
echo "== exp.py" | tee -a $L
timeout 240 python3 benchmarks/results/h100/precision/exp.py > $OUT/r/exp.log 2>&1; echo "exit $?" | tee -a $L
grep -E "^\|" $OUT/r/exp.log | tee -a $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
echo "== bench b256c (batch 256): torch_compile=true length_buckets=1" | tee -a $L
timeout 90 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=256 --override "$MC" --override torch_compile=true \
  --override length_buckets=1 --out $OUT/r/b256c > $OUT/r/b256c.log 2>&1
echo "exit $?" | tee -a $L; grep -E "samples/s \||MFU|step time|wall" $OUT/r/b256c/bench.md 2>/dev/null | tee -a $L
tar -czf $OUT/results.tgz -C $OUT r
