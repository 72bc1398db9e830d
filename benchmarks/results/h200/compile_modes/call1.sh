#!/bin/bash
# Run on the device as `bash .whl/session3.sh` (the wheels of datasets and its dependencies carried in .whl/).
# One device call: torch_compile_mode (CUDA graphs) against eager and default compile, the bench's textbook
# loop beside each; then the default recipe's whole command compiled with CUDA graphs, against eager.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/log.txt
nvidia-smi -L | tee $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
bench() {  # name, batch, timeout, extra overrides...
 local name=$1 b=$2 t=$3; shift 3
 local extra=(); for o in "$@"; do extra+=(--override "$o"); done
 echo "== bench $name (batch $b): $*" | tee -a $L
 /usr/bin/time -o /tmp/t_$name -f "%e" timeout $t python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=$b --override "$MC" "${extra[@]}" --out $OUT/$name > $OUT/$name.log 2>&1
 echo "exit $? wall $(cat /tmp/t_$name) s" | tee -a $L
 tail -3 $OUT/$name.log | tee -a $L
 grep -E "samples/s \||MFU|step time|wall" $OUT/$name/bench.md 2>/dev/null | tee -a $L
}
bench b256 256 120
bench b256c 256 150 torch_compile=true length_buckets=1
bench b256ro 256 150 torch_compile=true length_buckets=1 torch_compile_mode=reduce-overhead
bench b512ro 512 150 torch_compile=true length_buckets=1 torch_compile_mode=reduce-overhead
echo "== whole command, python direct, bf16" | tee -a $L
R="finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1"
for v in "eager:" "ro:torch_compile=true length_buckets=4 torch_compile_mode=reduce-overhead"; do
 n=${v%%:*}; o=${v#*:}
 ACCELERATE_MIXED_PRECISION=bf16 /usr/bin/time -o /tmp/tw_$n -f "%e" timeout 150 python3 $R output_dir=/tmp/w_$n $o > $OUT/whole_$n.log 2>&1
 echo "$n ($o): exit $? wall $(cat /tmp/tw_$n) s" | tee -a $L
 grep -E "seconds:|test acc|torch_compile:|^error|Error" $OUT/whole_$n.log | tail -5 | tee -a $L
done
bench b256mx 256 140 torch_compile=true length_buckets=1 torch_compile_mode=max-autotune
echo done | tee -a $L
