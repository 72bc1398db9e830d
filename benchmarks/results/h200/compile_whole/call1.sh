#!/bin/bash
# Device call (one H200: the H100 asked for was not free) after the app compiles the model whole (finetune/shapes.py compile_model), not region
# by region: (1) exp.py's bare compiled step under autocast, the same-host reference; (2) the app's bench at
# batch 256 x 128, compiled, beside the textbook loop (as ../precision/call2.sh, which measured MFU 0.332 with
# regional compilation); (3) the same with CUDA graphs (torch_compile_mode=reduce-overhead).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; L=$OUT/r/log.txt
nvidia-smi -L | tee $L
timeout 110 python3 benchmarks/results/h100/precision/exp.py amp > $OUT/r/exp.log 2>&1; echo "exp.py amp: exit $?" | tee -a $L
grep "^| amp" $OUT/r/exp.log | tee -a $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
for mode in default reduce-overhead; do
 echo "== bench b256 compiled whole, torch_compile_mode=$mode" | tee -a $L
 timeout 200 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=256 --override "$MC" --override torch_compile=true \
  --override length_buckets=1 --override torch_compile_mode=$mode --out $OUT/r/b256_$mode > $OUT/r/b256_$mode.log 2>&1
 echo "exit $?" | tee -a $L; grep -E "samples/s \||MFU|step time|CPU time|wall" $OUT/r/b256_$mode/bench.md 2>/dev/null | tee -a $L
done
tar -czf $OUT/results.tgz -C $OUT r
