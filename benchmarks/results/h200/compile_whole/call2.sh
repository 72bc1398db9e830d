#!/bin/bash
# Device call after call1 (the bench put the app's whole-compiled step at 49 ms where exp.py's bare step took
# 40.6 ms) and syncs.py (no host sync left in the step but the logging step's; 39 ms/step, on another host).
# On one host: exp.py amp, the app's own step timed in train() (syncs.py plain), and the bench again.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; L=$OUT/r/log.txt
nvidia-smi -L | tee $L
timeout 80 python3 benchmarks/results/h100/precision/exp.py amp > $OUT/r/exp.log 2>&1; echo "exp.py amp: exit $?" | tee -a $L
grep "^| amp" $OUT/r/exp.log | tail -1 | tee -a $L
ACCELERATE_MIXED_PRECISION=bf16 timeout 100 python3 benchmarks/results/h200/compile_whole/syncs.py plain > $OUT/r/plain.log 2>&1; echo "syncs.py plain: exit $?" | tee -a $L
grep -E "^steps|torch_compile:" $OUT/r/plain.log | tee -a $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
timeout 130 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=256 --override "$MC" --override torch_compile=true \
  --override length_buckets=1 --out $OUT/r/b256 > $OUT/r/b256.log 2>&1
echo "bench: exit $?" | tee -a $L; grep -E "samples/s \||MFU|step time|CPU time|wall" $OUT/r/b256/bench.md 2>/dev/null | tee -a $L
tar -czf $OUT/results.tgz -C $OUT r
