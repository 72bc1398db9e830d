#!/bin/bash
# One device call: start-up profile, the default command's wall time, and a batch sweep of the bench.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/log.txt
{
nvidia-smi -L; python3 -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__)"
echo "== imports"
for i in 1 2; do /usr/bin/time -f "import torch: %e s" python3 -c "import torch"; done
/usr/bin/time -f "import torch + cuda init: %e s" python3 -c "import torch; torch.zeros(1, device='cuda')"
/usr/bin/time -f "import accelerate: %e s" python3 -c "import accelerate"
/usr/bin/time -f "import transformers AutoModel: %e s" python3 -c "from transformers import AutoModelForSequenceClassification"
/usr/bin/time -f "import finetune.run: %e s" python3 -c "import finetune.run"
python3 -X importtime -c "import finetune.run" 2> $OUT/importtime.txt
/usr/bin/time -f "run.py --help: %e s" python3 finetune/run.py --help > /dev/null
/usr/bin/time -f "accelerate launch --help: %e s" accelerate launch --help > /dev/null
echo "== whole command"
for s in 1 2; do
 /usr/bin/time -f "accelerate launch seed=$s: %e s" accelerate launch --config_file accelerate_configs/single_gpu_bf16.yaml finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=$s output_dir=/tmp/al$s 2>&1 | grep -E "seconds:|test|^error|Traceback" | tail -4
 ACCELERATE_MIXED_PRECISION=bf16 /usr/bin/time -f "python direct seed=$s: %e s" python3 finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=$s output_dir=/tmp/py$s 2>&1 | grep -E "seconds:|test|^error|Traceback" | tail -4
done
} 2>&1 | tee $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
for b in 128 256 512; do
 echo "== bench b$b" | tee -a $L
 timeout 150 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=$b --override "$MC" --out $OUT/b$b 2>&1 | tail -3 | tee -a $L
 grep -E "samples/s \||MFU|step time|wall" $OUT/b$b/bench.md | tee -a $L
done
