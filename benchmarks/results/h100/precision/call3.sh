#!/bin/bash
# Third device call (one H100): appprof.py, the app's compiled step at BERT-base size profiled (call2's bench
# measured the app at MFU 0.332 where exp.py's bare compiled step reached 0.440).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r
timeout 170 python3 benchmarks/results/h100/precision/appprof.py > $OUT/r/appprof.log 2>&1; echo "exit $?" >> $OUT/r/appprof.log
grep -v "training:" $OUT/r/appprof.log | tail -100 | cut -c1-200
