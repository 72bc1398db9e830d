"""A streamed run's memory: a JSON Lines training file of --gigabytes (2 by default) trained on with
streaming=true for --steps optimizer steps, the process's resident memory sampled at every step.

    python -m benchmarks.streaming_memory --out benchmarks/results

The file is written, seeded, into a temporary folder from the bundled rotten_tomatoes reviews (a row: three
reviews joined, and the first one's label) and deleted at the end. The run is finetune/run.py's `main`, in this
process, on a tiny BERT built from a config (the bundled MiniLM's tokenizer) with one torch thread, so the
numbers are the data path's, not a large model's: train_file=<the file> streaming=true, max_steps, batches of
16, max_length 64, a checkpoint halfway. `Hooks` samples the resident set size (psutil) after each optimizer
step; the kernel's peak (VmHWM, reset before the run) is the run's peak, the data phase included (the file's
sha256 is read in blocks of 1 MiB, its first 10,000 rows are the first pass). The report says the file's size
beside the peak: a run that held the file would need more memory than the file.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from pathlib import Path

import psutil
import torch

from benchmarks.recorder import RunMonitor
from benchmarks.report import machine, machine_line, write_report
from finetune.run import Hooks, main

REPO = Path(__file__).resolve().parents[1]
ROTTEN = REPO / "data" / "rotten_tomatoes"
TINY_BERT = ("{model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
             "intermediate_size: 37, max_position_embeddings: 128}")  # fmt: skip


def write_file(path: Path, gigabytes: float, seed: int = 0) -> int:
    """A JSON Lines file of at least `gigabytes` GB of labelled reviews; returns its rows."""
    with (ROTTEN / "train.csv").open() as f:
        reviews = [(r["text"], r["label"]) for r in csv.DictReader(f)]
    rng, target, rows = random.Random(seed), gigabytes * 1e9, 0
    with path.open("w") as f:
        while f.tell() < target:
            lines = []
            for _ in range(10_000):
                three = rng.sample(reviews, 3)
                lines.append(json.dumps({"text": " ".join(t for t, _ in three), "label": three[0][1]}))
            f.write("\n".join(lines) + "\n")
            rows += len(lines)
    return rows


class Sampled(Hooks):
    """The resident set size after each optimizer step: (step, seconds since the first, MiB)."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[int, float, float]] = []
        self.t0 = time.perf_counter()

    def mark(self, name: str, value=None) -> None:
        if name == "step":
            self.points.append((value, time.perf_counter() - self.t0, psutil.Process().memory_info().rss / 2**20))


def run(folder: Path, gigabytes: float, steps: int) -> dict:
    train, validation = folder / "train.jsonl", folder / "validation.jsonl"
    t = time.perf_counter()
    rows = write_file(train, gigabytes)
    written = time.perf_counter() - t
    with (ROTTEN / "validation.csv").open() as f:
        validation.write_text("".join(json.dumps(r) + "\n" for r in list(csv.DictReader(f))[:200]))
    args = [f"train_file={train}", f"validation_file={validation}", "test_file=null", "task=text-classification",
            f"model_config={TINY_BERT}", f"tokenizer_name={REPO / 'data' / 'bert_minilm_l6_uncased'}",
            "streaming=true", f"max_steps={steps}", "per_device_train_batch_size=16", "max_length=64",
            "max_train_samples=null", "max_eval_samples=null", "label_names=null", "cpu_threads=1",
            f"save_steps={steps // 2}", f"logging_steps={max(1, steps // 10)}", f"output_dir={folder / 'run'}"]  # fmt: skip
    hooks = Sampled()
    with RunMonitor(torch.device("cpu")) as monitor:
        results = main(args, hooks=hooks)
    passed = whole_pass(train)
    rss = [mib for _, _, mib in hooks.points]
    tenth = max(1, len(rss) // 10)
    return {
        "file_gb": train.stat().st_size / 1e9, "file_rows": rows, "seconds_to_write": written, "steps": steps,
        "samples_trained": steps * 16, "seconds": {k: round(v, 1) for k, v in hooks.seconds.items()},
        **monitor.report(), "rss_first_tenth_mib": max(rss[:tenth]), "rss_last_tenth_mib": max(rss[-tenth:]),
        "rss_by_step": [{"step": s, "seconds": round(t, 2), "rss_mib": round(m, 1)} for s, t, m in hooks.points],
        "validation_accuracy": results["validation"]["accuracy"], "whole_pass": passed,
    }  # fmt: skip


def whole_pass(train: Path) -> dict:
    """One pass over the whole file by the reader a streamed run uses (`data.open_stream`, datasets' JSON
    streaming), rows counted, not tokenized: the memory of reading all of it, which the run's steps do not."""
    from finetune.config import load_config
    from finetune.data import open_stream

    args = load_config(None, [f"train_file={train}", "validation_file=null", "test_file=null", "streaming=true",
                                "max_steps=1", "max_train_samples=null"]).data_args
    t, rows = time.perf_counter(), 0
    with RunMonitor(torch.device("cpu")) as monitor:
        for _ in open_stream(args):
            rows += 1
    return {"rows": rows, "seconds": time.perf_counter() - t, **monitor.report()}


def table(report: dict) -> str:
    m, r = report["machine"], report["run"]
    every = max(1, len(r["rss_by_step"]) // 10)
    shown = r["rss_by_step"][every - 1 :: every]
    lines = [
        "# A streamed run's memory", "",
        f"{machine_line(m)}. Written by `python -m benchmarks.streaming_memory` ({report['date']}).", "",
        f"A {r['file_gb']:.2f} GB JSON Lines file ({r['file_rows']:,} rows) trained on with `streaming=true` for "
        f"{r['steps']} optimizer steps of 16 samples (a tiny BERT, one torch thread). Peak resident memory of the "
        f"whole process (the kernel's VmHWM, data phase included): **{r['peak_rss_mib']:,.0f} MiB**, "
        f"{r['peak_rss_mib'] * 2**20 / (r['file_gb'] * 1e9):.0%} of the file; before the run "
        f"{r['rss_before_mib']:,.0f} MiB. The largest resident size in the first tenth of the steps, "
        f"{r['rss_first_tenth_mib']:,.0f} MiB; in the last tenth, {r['rss_last_tenth_mib']:,.0f} MiB.", "",
        f"The {r['steps']} steps read the file's first {r['samples_trained']:,} rows (and its first 10,000 for the "
        "first pass); the data phase reads all of it once for its sha256, in blocks of 1 MiB. Then one pass over the "
        f"whole file by the stream's reader (`data.open_stream`, rows counted, not tokenized): "
        f"{r['whole_pass']['rows']:,} rows in {r['whole_pass']['seconds']:.0f} s, peak resident memory "
        f"{r['whole_pass']['peak_rss_mib']:,.0f} MiB (from {r['whole_pass']['rss_before_mib']:,.0f} MiB before it).", "",
        f"Seconds by phase: {', '.join(f'{k} {v}' for k, v in r['seconds'].items())}; writing the file took "
        f"{r['seconds_to_write']:.0f} s (not part of the run). Other processes kept "
        f"{r['other_processes_cpu_cores'] or 0:.1f} cores busy on average meanwhile.", "",
        "| step | seconds | resident MiB |", "|---:|---:|---:|",
        *(f"| {p['step']} | {p['seconds']:.1f} | {p['rss_mib']:,.1f} |" for p in shown), "",
    ]  # fmt: skip
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=300)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="streaming-memory-") as folder:  # the file goes with it
        report = {"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                  "run": run(Path(folder), options.gigabytes, options.steps)}  # fmt: skip
    write_report(options.out, "streaming_memory", report, table(report))


if __name__ == "__main__":
    cli()
