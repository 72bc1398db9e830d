"""ONNX on the CPU against the PyTorch export: accuracy through evaluate_checkpoint.py's metrics, latency,
file sizes. The model is the default recipe's (MiniLM-L6 fine-tuned on the bundled rotten_tomatoes, 2,400
samples, one epoch: a few minutes on two cores), or a finished run given with --run.

    python -m benchmarks.onnx --out benchmarks/results              # trains the default recipe first
    python -m benchmarks.onnx --run runs/bert-rotten-tomatoes --out benchmarks/results

Steps: `python -m finetune.onnx_export <run>`; `python -m finetune.evaluate_checkpoint <run>/model` without and
with `--onnx` and `--onnx int8` on the run's test split (1,066 reviews); then, in this process, the median
time of one forward pass of the PyTorch export and of each ONNX file on onnxruntime (CPU execution provider)
at batch 1 and batch 32 (test reviews, padded to the batch's longest), with the same number of threads.
Times carry to no other machine; the ratios are the result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parents[1]
ENV = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def _run(*args: str) -> None:
    import os

    done = subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **ENV}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")


def evaluated(run: Path, *flags: str) -> dict:
    """evaluate_checkpoint.py's metrics.json of the run's test split."""
    folder = run / "eval" / ("-".join(["test", *(f.lstrip("-") for f in flags)]) if flags else "test")
    _run("-m", "finetune.evaluate_checkpoint", str(run / "model"), *flags, "--output", str(folder))
    return json.loads((folder / "metrics.json").read_text())


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def latencies(run: Path, repeats: int) -> dict:
    import csv

    import onnxruntime as ort
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    texts = [row["text"] for row in csv.DictReader((REPO / "data/rotten_tomatoes/test.csv").open())]
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    model = AutoModelForSequenceClassification.from_pretrained(run / "model").eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    sessions = {p: ort.InferenceSession(str(run / "onnx" / f), options, providers=["CPUExecutionProvider"])
                for p, f in (("onnx fp32", "model.onnx"), ("onnx int8", "model_int8.onnx"))}  # fmt: skip
    result = {}
    for batch in (1, 32):
        inputs = tokenizer(texts[:batch], padding=True, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            result[f"pytorch batch {batch}"] = median_ms(lambda inputs=inputs: model(**inputs), repeats)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        for name, session in sessions.items():
            result[f"{name} batch {batch}"] = median_ms(lambda s=session, f=feeds: s.run(None, f), repeats)
    return result


def table(report: dict) -> str:
    ev, lat, sizes = report["evaluations"], report["latency_ms"], report["size_mb"]
    lines = [
        "# ONNX and int8 against the PyTorch export, on the CPU",
        "",
        f"Written by `python -m benchmarks.onnx` ({report['run']}). {machine_line(report['machine'])}, "
        f"onnxruntime {report['onnxruntime']}.",
        "",
        "| model | file MB | test accuracy | macro F1 | loss | batch 1 ms | batch 32 ms | speed-up at 32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, key, size in (("PyTorch export", "pytorch", "model.safetensors"), ("ONNX fp32", "onnx fp32", "model.onnx"),
                            ("ONNX int8", "onnx int8", "model_int8.onnx")):  # fmt: skip
        m = ev[key]
        lines.append(f"| {name} | {sizes[size]:.1f} | {m['accuracy']:.4f} | {m['macro_f1']:.4f} | {m['loss']:.4f} | "
                     f"{lat[f'{key} batch 1']:.1f} | {lat[f'{key} batch 32']:.1f} | "
                     f"{lat['pytorch batch 32'] / lat[f'{key} batch 32']:.2f}x |")  # fmt: skip
    drop = ev["pytorch"]["accuracy"] - ev["onnx int8"]["accuracy"]
    lines += ["", f"int8 accuracy cost on {ev['pytorch']['num_samples']} test reviews: {100 * drop:+.2f} points "
              f"(positive: int8 is worse); fp32 ONNX against PyTorch: "
              f"{100 * (ev['pytorch']['accuracy'] - ev['onnx fp32']['accuracy']):+.2f} points.",
              f"Median of {report['repeats']} forward passes each, {report['machine']['torch_threads']} threads for "
              f"both runtimes; the ONNX export took {report['export_s']:.1f} s.", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="a finished run of a text classifier (default: train the default recipe)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    import onnxruntime

    run = Path(args.run) if args.run else Path(tempfile.mkdtemp(prefix="onnx-bench-")) / "run"
    if not args.run:
        _run("finetune/run.py", f"output_dir={run}")  # the default recipe, configs/bert_rotten_tomatoes.yaml
    started = time.perf_counter()
    _run("-m", "finetune.onnx_export", str(run))
    export_s = time.perf_counter() - started
    evaluations = {"pytorch": evaluated(run), "onnx fp32": evaluated(run, "--onnx", "fp32"),
                   "onnx int8": evaluated(run, "--onnx", "int8")}  # fmt: skip
    sizes = {f: (run / d / f).stat().st_size / 2**20
             for d, f in (("model", "model.safetensors"), ("onnx", "model.onnx"), ("onnx", "model_int8.onnx"))}  # fmt: skip
    report = {"run": "the default recipe, trained by the benchmark" if not args.run else str(run),
              "machine": machine(), "onnxruntime": onnxruntime.__version__, "export_s": export_s,
              "evaluations": {k: {m: v[m] for m in ("accuracy", "macro_f1", "loss", "num_samples")}
                              for k, v in evaluations.items()},
              "latency_ms": latencies(run, args.repeats), "size_mb": sizes, "repeats": args.repeats}  # fmt: skip
    write_report(Path(args.out), "onnx", report, table(report))


if __name__ == "__main__":
    main()
