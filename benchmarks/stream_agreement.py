"""What a streamed DDP run's per-micro-batch agreement costs (finetune/streams.py `TrainStream._agree`).

    python -m benchmarks.stream_agreement --out benchmarks/results

A streamed run's processes agree before each micro-batch whether one of them failed reading its rows: one
all-reduce (MIN) of a one-element CPU integer over a gloo group of its own. Here two processes on this
machine (gloo, as CPU DDP runs) time --calls of exactly that call, and, in the same run, the all-reduce DDP
makes of a step's gradients anyway: the bundled MiniLM-L6's trainable parameters as one fp32 tensor (DDP
sends them in buckets; one tensor is the floor of that cost). Reported: the median of each per call and
their ratio, which carries to other machines where seconds do not.

Writes `stream_agreement.json` and `stream_agreement.md` in --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.report import machine, machine_line, write_report

MINILM = Path(__file__).resolve().parents[1] / "data" / "bert_minilm_l6_uncased" / "model.safetensors"


def parameters(path: Path = MINILM) -> int:
    """The values a model's safetensors file holds: what DDP all-reduces of it when every weight trains."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _worker(rank: int, world: int, init: str, calls: int, gradient_calls: int, values: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    group = dist.new_group(backend="gloo")
    flag = torch.tensor([world])
    for _ in range(10):  # warm-up
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    agree = []
    for _ in range(calls):
        t = time.perf_counter()
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        agree.append(time.perf_counter() - t)
    gradients = torch.zeros(values)
    dist.all_reduce(gradients)  # warm-up
    reduce = []
    for _ in range(gradient_calls):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(gradients)
        reduce.append(time.perf_counter() - t)
    if rank == 0:
        Path(out).write_text(json.dumps({"agree": agree, "gradients": reduce}))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stream_agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--gradient-calls", type=int, default=10)
    args = p.parse_args(argv)
    values = parameters()
    with tempfile.TemporaryDirectory() as work:
        init, out = f"file://{work}/rendezvous", f"{work}/times"
        mp.spawn(_worker, args=(2, init, args.calls, args.gradient_calls, values, out), nprocs=2, join=True)
        times = json.loads(Path(out).read_text())
    agree, gradients = statistics.median(times["agree"]), statistics.median(times["gradients"])
    report = {"command": "python -m benchmarks.stream_agreement " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": machine(), "load": [round(x, 2) for x in os.getloadavg()], "calls": args.calls, "gradient_values": values,
              "agreement_median_s": agree, "gradient_all_reduce_median_s": gradients,
              "agreement_over_gradients": agree / gradients}  # fmt: skip
    table = (
        "# A streamed DDP run's agreement before each micro-batch\n\n"
        f"{machine_line(report['machine'])}. `{report['command']}`; load average at the end "
        f"{report['load'][0]}.\n\n2 processes, gloo, one thread each.\n\n"
        "| all-reduce | median per call |\n|---|---|\n"
        f"| the agreement: one int64, MIN, its own gloo group ({args.calls:,} calls) | {agree * 1e6:,.0f} us |\n"
        f"| a step's gradients: MiniLM-L6's {values:,} fp32 values, SUM ({args.gradient_calls} calls) "
        f"| {gradients * 1e3:,.1f} ms |\n\n"
        f"The agreement costs **{agree / gradients:.4f}** of the gradients' all-reduce that every DDP step makes "
        "(once per optimizer step; the agreement runs once per micro-batch, so with accumulation k it is k of these "
        "against one).\n"
    )
    write_report(args.out, "stream_agreement", report, table)
    return report


if __name__ == "__main__":
    main()
