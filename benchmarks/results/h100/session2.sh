#!/bin/bash
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/log2.txt
{
echo "== whole command"
/usr/bin/time -o /tmp/t1 -f "%e" accelerate launch --config_file accelerate_configs/single_gpu_bf16.yaml finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1 output_dir=/tmp/al1 > /tmp/al1.log 2>&1
echo "accelerate launch whole command: $(cat /tmp/t1) s"; grep -E "seconds:|test acc" /tmp/al1.log
ACCELERATE_MIXED_PRECISION=bf16 /usr/bin/time -o /tmp/t2 -f "%e" python3 finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1 output_dir=/tmp/py1 > /tmp/py1.log 2>&1
echo "python direct whole command: $(cat /tmp/t2) s"; grep -E "seconds:|test acc|bf16|precision" /tmp/py1.log | head -5
echo "== profile"
timeout 60 python3 .whl/prof.py sdpa
} 2>&1 | tee $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
echo "== bench b256 compiled" | tee -a $L
timeout 170 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=256 --override "$MC" --override torch_compile=true --override length_buckets=1 --out $OUT/b256c 2>&1 | tail -3 | tee -a $L
grep -E "samples/s \||MFU|step time|wall" $OUT/b256c/bench.md | tee -a $L
