"""Benchmark naive layer-wise model parallelism against GPipe-style micro-batches.

    python -m benchmarks.bench_parallel --devices cuda:0,cuda:1 --chunks 4 --out bench.json
    python -m benchmarks.bench_parallel --devices cuda:0,cpu --layers 4 --hidden 256 --seq-len 64
    python -m benchmarks.bench_parallel --devices cpu,cpu --layers 2 --hidden 32 --steps 1   # smoke run

A BERT classifier built from a config (random weights, nothing downloaded) is split by
`plan_model_parallel` and trained for `--warmup` + `--steps` optimizer steps on one fixed random
batch, first naively (the whole batch goes through stage after stage, so one device works at a time)
and then as `--chunks` micro-batches (`pipelined_forward`). A step is forward, backward and AdamW, in
fp32.

The bubble is the fraction of device time spent idle: 1 - busy / (stages * step time), where busy is
the per-stage busy time summed over stages. It is measured by running the same micro-batches one at a
time with a device synchronisation after each (forward, backward, then every stage's optimizer); then
exactly one stage works at any moment, so that run's step time *is* the summed busy time (host launch
gaps count as busy, which understates the bubble a little). The GPipe bound (S-1)/(k+S-1) for S stages
and k chunks is printed beside it. A CPU stage runs on the Python thread and blocks it, so pipelining
only overlaps work between GPUs; on cpu,cpu expect no speedup (the smoke run checks mechanics only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

from benchmarks.peak import synchronize as synchronize_device
from finetune.errors import UserError
from finetune.parallel import (
    apply_model_parallel,
    parse_devices,
    pipelined_forward,
    plan_model_parallel,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default=None, help="e.g. cuda:0,cuda:1 or cuda:0,cpu; default: every GPU")
    p.add_argument("--chunks", type=int, default=4, help="micro-batches per step in the pipelined run")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=None, help="default: hidden // 64")
    p.add_argument("--intermediate", type=int, default=None, help="default: 4 * hidden")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each timed run")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    return p.parse_args(argv)


def synchronize(devices: list[torch.device]) -> None:
    for d in set(devices):
        synchronize_device(d)


def timed(step: Callable[[], None], warmup: int, steps: int, devices: list[torch.device]) -> float:
    """Seconds per step, averaged over `steps` after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    synchronize(devices)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(devices)
    return (time.perf_counter() - start) / steps


def run(args: argparse.Namespace) -> dict:
    devices = parse_devices(args.devices)
    args.heads = args.heads or max(1, args.hidden // 64)
    args.intermediate = args.intermediate or 4 * args.hidden
    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate,
        max_position_embeddings=max(512, args.seq_len),
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    # GPipe keeps every chunk's activations until backward: plan for the whole batch.
    plan = plan_model_parallel(model, devices, micro_batch_size=args.batch_size, seq_len=args.seq_len)
    print(plan.format_table())
    model = apply_model_parallel(model, plan)
    model.train()

    # One AdamW per stage, so that the serial run can synchronise after each stage's update.
    optimizers = []
    for stage in plan.stages:
        modules = [m for b in plan.blocks if b.name in stage.blocks for m in b.modules]
        params = [p for m in modules for p in model.get_submodule(m).parameters()]
        optimizers.append(torch.optim.AdamW(params, lr=1e-5))

    B, first, last = args.batch_size, plan.stages[0].device, plan.stages[-1].device
    batch = {
        "input_ids": torch.randint(0, args.vocab_size, (B, args.seq_len), device=first),
        "attention_mask": torch.ones(B, args.seq_len, dtype=torch.long, device=first),
    }
    labels = torch.randint(0, 2, (B,), device=last)

    def update(sync: bool) -> None:
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
            if sync:
                synchronize(devices)

    def pipelined_step(chunks: int) -> None:
        logits = model(**batch).logits if chunks == 1 else pipelined_forward(model, batch, chunks, lambda o, _: o.logits)
        (F.cross_entropy(logits, labels, reduction="sum") / B).backward()
        update(sync=False)

    def serial_step(chunks: int) -> None:
        parts = {k: torch.tensor_split(v, chunks) for k, v in batch.items()}
        for j, y in enumerate(torch.tensor_split(labels, chunks)):
            logits = model(**{k: v[j] for k, v in parts.items()}).logits
            (F.cross_entropy(logits, y, reduction="sum") / B).backward()
            synchronize(devices)
        update(sync=True)

    S, results = len(plan.stages), {}
    for mode, chunks in (("naive", 1), ("pipelined", min(args.chunks, B))):
        for d in {d for d in devices if d.type == "cuda"}:
            torch.cuda.reset_peak_memory_stats(d)
        step_s = timed(lambda c=chunks: pipelined_step(c), args.warmup, args.steps, devices)
        peak = {str(d): torch.cuda.max_memory_allocated(d) for d in devices if d.type == "cuda"}
        busy_s = timed(lambda c=chunks: serial_step(c), args.warmup, args.steps, devices)
        results[mode] = {
            "chunks": chunks,
            "step_s": step_s,
            "busy_s": busy_s,
            "bubble_measured": max(0.0, 1 - busy_s / (S * step_s)),
            "bubble_theoretical": (S - 1) / (chunks + S - 1),
            "peak_memory_bytes": peak,
        }
    estimated: dict[str, int] = {}
    for s in plan.stages:
        estimated[str(s.device)] = estimated.get(str(s.device), 0) + s.estimated_bytes

    return {
        "devices": [str(d) for d in devices],
        "stages": [
            {
                "index": s.index,
                "device": str(s.device),
                "blocks": s.blocks,
                "parameters": s.num_parameters,
                "estimated_bytes": s.estimated_bytes,
            }
            for s in plan.stages
        ],  # fmt: skip
        "estimated_bytes_per_device": estimated,
        "config": {k: v for k, v in vars(args).items() if k != "out"},  # heads, intermediate resolved
        "naive": results["naive"],
        "pipelined": results["pipelined"],
        "speedup": results["naive"]["step_s"] / results["pipelined"]["step_s"],
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report = run(args)
    for mode in ("naive", "pipelined"):
        r = report[mode]
        print(
            f"{mode:9s} chunks={r['chunks']:<3d} step {r['step_s'] * 1e3:9.1f} ms   busy {r['busy_s'] * 1e3:9.1f} ms   "
            f"bubble measured {r['bubble_measured']:.2f}, GPipe bound {r['bubble_theoretical']:.2f}"
        )
        for device, peak in r["peak_memory_bytes"].items():
            est = report["estimated_bytes_per_device"][device]
            print(
                f"          peak memory on {device}: {peak / 2**20:.0f} MiB (planned {est / 2**20:.0f} MiB)"
            )
    print(f"speedup of pipelined over naive: {report['speedup']:.2f}x")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
