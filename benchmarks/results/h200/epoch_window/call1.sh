#!/bin/bash
# Device call (issue 30, GPU part). (1) The app's compiled bench at batch 256 x 128 and 128 x 128 with the timed
# window inside the first epoch (bert_full: 8,530 samples, 34 steps of 256, 67 of 128), beside the textbook loop,
# under TORCH_LOGS=recompiles to name the guard behind the one graph compiled after the warm-up; (2) the default
# recipe's whole command under accelerate launch, twice, and once with PYTHONPROFILEIMPORTTIME=1 (the launcher's and
# the run's imports); (3) imports alone.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; L=$OUT/r/log.txt
nvidia-smi -L | tee $L
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
bench() {  # name batch steps warmup
 echo "== bench $1: batch $2, steps $3, warm-up $4, compiled" | tee -a $L
 TORCH_LOGS=recompiles timeout 150 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split \
  --steps $3 --warmup $4 --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=$2 --override "$MC" \
  --override torch_compile=true --override length_buckets=1 --out $OUT/r/$1 > $OUT/r/$1.log 2>&1
 echo "exit $?" | tee -a $L
 grep -E "samples/s \||MFU|step time|CPU time|wall|peak measured" $OUT/r/$1/bench.md 2>/dev/null | tee -a $L
 grep -E "torch_compile:|Recompiling|triggered by|guard" $OUT/r/$1.log | head -8 | tee -a $L
}
bench b256 256 30 5
bench b128 128 60 10
echo "== whole command (accelerate launch, default recipe)" | tee -a $L
for i in 1 2; do
 /usr/bin/time -o /tmp/t$i -f "%e" accelerate launch --config_file accelerate_configs/single_gpu_bf16.yaml finetune/run.py \
  --config finetune/configs/bert_rotten_tomatoes.yaml seed=1 output_dir=/tmp/w$i > $OUT/r/whole$i.log 2>&1
 echo "run $i: exit $?, $(cat /tmp/t$i) s; $(grep -E '^seconds:|test acc' $OUT/r/whole$i.log | tr '\n' ' ')" | tee -a $L
done
PYTHONPROFILEIMPORTTIME=1 /usr/bin/time -o /tmp/t3 -f "%e" accelerate launch --config_file accelerate_configs/single_gpu_bf16.yaml \
 finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1 output_dir=/tmp/w3 > $OUT/r/whole_importtime.log 2>&1
echo "run with import times: $(cat /tmp/t3) s" | tee -a $L
grep -E "\| (torch|accelerate|transformers|datasets|finetune\.run|accelerate\.commands\.launch|finetune\.models)$" $OUT/r/whole_importtime.log | tee -a $L
echo "== imports alone" | tee -a $L
for m in torch accelerate.commands.launch finetune.run; do
 s=$(date +%s.%N); python3 -c "import $m"; e=$(date +%s.%N); echo "import $m: $(echo "$e - $s" | bc) s" | tee -a $L
done
stat -f -c "%T" $(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))") | tee -a $L
tar -czf $OUT/results.tgz -C $OUT r
