#!/bin/bash
# Run on the device as `bash .whl/session4.sh` (the wheels carried in .whl/), after call2.
# Third device call: the default recipe compiled with CUDA graphs after the warm-up fix (training mode,
# both mask variants), then the bench at batch 256 with CUDA graphs and with the default compile mode.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/log.txt; mkdir -p $OUT/r
nvidia-smi -L | tee $L
R="finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1"
o="torch_compile=true length_buckets=4 torch_compile_mode=reduce-overhead"
ACCELERATE_MIXED_PRECISION=bf16 /usr/bin/time -o /tmp/tw -f "%e" timeout 100 python3 $R output_dir=/tmp/w_ro $o > $OUT/r/whole_ro.log 2>&1
echo "whole command, python direct, bf16, $o: exit $? wall $(cat /tmp/tw) s" | tee -a $L
grep -E "seconds:|test acc|torch_compile:|^error|Error" $OUT/r/whole_ro.log | tail -5 | tee -a $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
for v in "b256ro:torch_compile_mode=reduce-overhead" "b256c:torch_compile_mode=default"; do
 n=${v%%:*}; m=${v#*:}
 echo "== bench $n (batch 256): torch_compile=true length_buckets=1 $m" | tee -a $L
 timeout 75 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=256 --override "$MC" --override torch_compile=true \
  --override length_buckets=1 --override $m --out $OUT/r/$n > $OUT/r/$n.log 2>&1
 echo "exit $?" | tee -a $L; grep -E "samples/s \||MFU|step time|wall" $OUT/r/$n/bench.md 2>/dev/null | tee -a $L
done
tar -czf $OUT/results.tgz -C $OUT r
