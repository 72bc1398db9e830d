"""Benchmarks of the app, kept out of the `finetune` package: they are tools for developers, need the
repository's data and recipes, and use the app as a user does (its `train()`, its modules).

    python -m benchmarks.bench --recipe both --out runs/bench
    python -m benchmarks.bench_parallel --devices cuda:0,cuda:1 --chunks 4
"""
