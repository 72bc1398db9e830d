#!/bin/bash
# Second device call (one H100), after call1: (1) whether the 12 s import of call1 is the machine's bytecode
# cache (site-packages without writable __pycache__): import timed three times with PYTHONPYCACHEPREFIX set;
# (2) the default recipe's whole command twice with that cache warm; (3) the app's bench at batch 256
# compiled, with the textbook loop beside it (call1's 90 s limit was too short).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r; L=$OUT/r/log.txt
nvidia-smi -L | tee $L; nproc | tee -a $L
python3 - <<'PY' | tee -a $L
import importlib.util, os, sys
for m in ("torch", "transformers"):
    d = os.path.dirname(importlib.util.find_spec(m).origin)
    pc = os.path.join(d, "__pycache__")
    n = len(os.listdir(pc)) if os.path.isdir(pc) else 0
    print(m, d, "pycache files:", n, "writable:", os.access(d, os.W_OK), sys.version.split()[0])
PY
for i in 1 2 3; do /usr/bin/time -f "import finetune.run, plain, try $i: %e s" python3 -c "import finetune.run" 2>&1 | tail -1 | tee -a $L; done
export PYTHONPYCACHEPREFIX=/tmp/pyc
for i in 1 2 3; do /usr/bin/time -f "import finetune.run, PYTHONPYCACHEPREFIX=/tmp/pyc, try $i: %e s" python3 -c "import finetune.run" 2>&1 | tail -1 | tee -a $L; done
python3 -X importtime -c "import finetune.run" 2> $OUT/r/importtime_prefix.txt
R="finetune/run.py --config finetune/configs/bert_rotten_tomatoes.yaml seed=1"
for i in 1 2; do
 ACCELERATE_MIXED_PRECISION=bf16 /usr/bin/time -o /tmp/tw -f "%e" timeout 70 python3 $R output_dir=/tmp/w_$i > $OUT/r/whole_$i.log 2>&1
 echo "whole command $i, python direct, bf16, eager, PYTHONPYCACHEPREFIX: exit $? wall $(cat /tmp/tw) s" | tee -a $L
 grep -E "seconds:|test acc|^error|Error" $OUT/r/whole_$i.log | tail -4 | tee -a $L
done
MC='model_config={model_type: bert, hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072, max_position_embeddings: 512}'
echo "== bench b256c (batch 256): torch_compile=true length_buckets=1" | tee -a $L
timeout 200 python3 -m benchmarks.bench --recipe bert_full --precision bf16 --seq-len 128 --no-split --steps 40 --warmup 10 \
  --gemm-size 8192 --gemm-reps 10 --override per_device_train_batch_size=256 --override "$MC" --override torch_compile=true \
  --override length_buckets=1 --out $OUT/r/b256c > $OUT/r/b256c.log 2>&1
echo "exit $?" | tee -a $L; grep -E "samples/s \||MFU|step time|wall|graphs" $OUT/r/b256c/bench.md 2>/dev/null | tee -a $L
tar -czf $OUT/results.tgz -C $OUT r
