"""Benchmarks of the app, kept out of the `finetune` package: they are tools for developers, need the
repository's data and recipes, and use the app as a user does (its `train()` and the hooks it calls,
its modules).

    python -m benchmarks.bench --recipe both --out runs/bench
    python -m benchmarks.time_to_accuracy --out runs/tta
    python -m benchmarks.bench_parallel --devices cuda:0,cuda:1 --chunks 4
    python -m benchmarks.profile_step

bench.py and time_to_accuracy.py are the command lines; the pieces they share: peak.py (the matmul
peak), flops.py (the FLOP model), recorder.py (per-step phases from the loop's hooks, memory),
reference.py (the textbook loops), runs.py (one measured run of each loop), levers.py (the speed
levers), recipes.py (the recipes and what --override may set), report.py (the machine, the files).
"""

import os

# As finetune/run.py does before torch loads OpenMP (it reads this once): waiting threads sleep
# instead of spinning. A benchmark imports torch before finetune.run, so without this it would time
# the app with spinning threads, which beside another job ran 7x slower (benchmarks/README.md, "CPU
# threads"). A user's own policy is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
