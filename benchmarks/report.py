"""What the benchmarks write: the machine they ran on, the bench's Markdown table, and the report
files (`<name>.json` and `<name>.md` in --out; the table is also printed).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch


def machine() -> dict[str, Any]:
    """The CPU, GPU, threads, library versions and OpenMP settings of this run."""
    import accelerate
    import transformers

    cpu, flags = platform.processor() or platform.machine(), []
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        lines = f.read().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
        listed = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
        flags = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in listed]  # bf16 in hardware
    return {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "bf16_flags": flags,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "accelerate": accelerate.__version__,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
    }  # fmt: skip


def machine_line(m: dict[str, Any]) -> str:
    """The first words of a report: the machine and the libraries."""
    gpu = f", GPU {m['gpu']}" if m["gpu"] else ""
    simd = f" ({m['cpu_capability']}{''.join(', ' + f for f in m.get('bf16_flags') or [])})" if "cpu_capability" in m else ""
    return (
        f"Machine: {m['cpu']}{simd}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads{gpu}; torch {m['torch']}, "
        f"transformers {m['transformers']}, accelerate {m['accelerate']}"
    )


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import the app's entry point (what every launch pays)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import finetune.run"], check=True, capture_output=True)
    return time.perf_counter() - t


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}{unit}"


def write_report(out: Path, name: str, report: dict[str, Any], table: str) -> None:
    """`name`.json (the report) and `name`.md (the table) in `out`; the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(table)
    print(table)


# --- the bench's table ------------------------------------------------------------------------------------

# (label, key in a run's summary or its phases_s, unit, digits); key None: padded / real tokens
ROWS = [
    ("samples/s", "samples_per_s", "", 1),
    ("real tokens/s", "real_tokens_per_s", "", 0),
    ("padded tokens/s", "padded_tokens_per_s", "", 0),
    ("padded / real tokens", None, "", 2),
    ("step time (ms)", "step_time_s", "ms", 0),
    ("CPU time of this process per step (ms)", "cpu_s_per_step", "ms", 0),
    ("— data (ms)", "data", "ms", 0),
    ("— forward + loss (ms)", "forward", "ms", 0),
    ("— backward (ms)", "backward", "ms", 0),
    ("— optimizer (ms)", "optimizer", "ms", 0),
    ("— other (ms)", "other", "ms", 0),
    ("— communication (ms, inside backward)", "communication", "ms", 1),
    ("model GFLOP/s", "model_flops_per_s", "G", 1),
    ("MFU (padded tokens counted)", "mfu", "", 3),
    ("MFU at real lengths", "mfu_real", "", 3),
    ("peak RSS (MiB)", "peak_rss_mib", "", 0),
    ("peak GPU allocated (MiB)", "peak_gpu_allocated_mib", "", 0),
    ("eval score (metric below)", "eval_accuracy", "", 4),
    ("CPU cores used by other processes meanwhile", "other_processes_cpu_cores", "", 2),
]


def _value(run: dict[str, Any], key: str | None, unit: str) -> float | None:
    if key is None:
        return run["padded_tokens"] / max(run["real_tokens"], 1)
    v = run["phases_s"].get(key) if key in run["phases_s"] else run.get(key)
    if v is None:
        return None
    return v * 1e3 if unit == "ms" else v / 1e9 if unit == "G" else v


def bench_markdown(report: dict[str, Any]) -> str:
    """The bench's report as Markdown: the peak, each recipe's app/reference table, the levers."""
    lines = [
        f"{machine_line(report['machine'])}; precision {report['precision']}; {report['processes']} process(es).",
        f"Load average (1 min) at start / end: {report['load_avg_start'][0]:.2f} / {report['load_avg_end'][0]:.2f}.",
        f"Command: `{report['command']}`",
        "",
    ]
    p = report["peak"]
    lines.append(
        f"Matmul peak ({p['dtype']}, {p['size']}^3, {p['layout']}): best {p['flops_per_s'] / 1e9:.1f} GFLOP/s; "
        "each layout: "
        + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in p["layouts_flops_per_s"].items())
        + " GFLOP/s."
    )
    for name, r in report["recipes"].items():
        lines += _recipe_lines(name, r, report["import_seconds"])
    if report.get("levers"):
        lines += _lever_lines(report["levers"])
    if report.get("tokenize_cache"):
        t = report["tokenize_cache"]
        lines += ["", "Tokenization (`prepare_splits`, BERT recipe's splits): "
                  + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in t.items()) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _recipe_lines(name: str, r: dict[str, Any], import_s: float | None) -> list[str]:
    a, b, q = r["app"], r["reference"], r["app_over_reference"]
    lines = [
        "",
        f"### {name}: `{r['recipe']}` {' '.join(r['overrides'])}",
        "",
        f"{a['optimizer_steps']} optimizer steps each, {a['steps_timed']} timed (after warm-up); peak measured in "
        "this run: "
        + ", ".join(f"{x / 1e9:.1f}" for x in r["peak_flops_per_s_measured"])
        + " GFLOP/s (MFU uses the best).",
        "",
        f"{len(r['app_runs'])} app/reference pair(s), run alternately; the table shows the median run of each; "
        "app/reference samples/s per pair: "
        + ", ".join(f"{x:.2f}x" for x in q["samples_per_s_per_rep"])
        + ".",
        "",
        "| | app (`finetune.run.train`) | reference (textbook loop) | app / reference |",
        "|---|---:|---:|---:|",
    ]
    for label, key, unit, digits in ROWS:
        va, vb = _value(a, key, unit), _value(b, key, unit)
        rr = "–" if va is None or not vb else f"{va / vb:.2f}x"
        if key == "eval_accuracy":
            d = q.get("eval_accuracy_difference")
            rr = "– (other metrics)" if d is None else f"{d * 100:+.2f} points"
        lines.append(f"| {label} | {fmt(va, '', digits)} | {fmt(vb, '', digits)} | {rr} |")
    lines.append(
        f"| eval split (samples) | {a['eval_split']} ({a['eval_samples']}) | {b['eval_split']} ({b['eval_samples']}) | |"
    )
    lines.append(f"| eval metric | {a.get('eval_metric', 'accuracy')} | {b.get('eval_metric', 'accuracy')} | |")
    timed, plain = a.get("validation_evaluation"), b.get("plain_validation")
    if timed and plain:
        lines += [
            "",
            f"Evaluation of the validation split: the app's {timed['seconds']:.2f} s for {timed['samples']} samples "
            f"(metrics, gathering, the task's post-processing) against {plain['seconds']:.2f} s for a plain "
            f"`model.eval()` loop's forward passes over its {plain['rows']} rows in {plain['batches']} batches: "
            f"app / plain {q['validation_evaluation_s']:.2f}x the time. The app's validation evaluations, each: "
            + ", ".join(f"{e['seconds']:.2f}" for e in a.get("validation_evaluations", [timed])) + " s.",
        ]
    imports = f"; imports before it (fresh interpreter) {import_s:.1f} s" if import_s else ""
    lines += [
        "",
        f"App `train()` wall: {a['train_wall_s']:.1f} s; its phases (each without those inside it): "
        + ", ".join(f"{k} {v:.1f}" for k, v in a["stages_s"].items())
        + f" s; {a['steps_recorded']} steps {a['steps_recorded'] * a['step_time_s']:.1f} s (est.){imports}.",
    ]
    if out := r.get("outside_training"):
        lines.append(f"Outside the training loop: {out['seconds']:.1f} s, {out['share']:.0%} of the "
                     f"{'imports and ' if out['imports_counted'] else ''}`train()` wall.")  # fmt: skip
    return lines


def _lever_lines(levers: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Levers (the app's loop as shipped vs one thing changed; short runs, interleaved)",
        "",
        "on / off = the shipped setting's samples/s over the changed one's (> 1: the shipped one is faster), "
        "geometric mean over the pairs; by wall time, and by this process's CPU time (robust to other "
        "processes' load for a 1-thread run; not comparable when threads or worker processes differ).",
        "",
        "| lever | as shipped (on) | changed to (off) | steps | on / off, wall | per pair | on / off, CPU | "
        "per pair | padded tokens on / off |",
        "|---|---|---|---:|---:|---|---:|---|---:|",
    ]
    for row in levers:
        lines.append(
            f"| {row['lever']} | {row['on']} | {row['off']} | {row['steps']} | {row['ratio']:.2f}x | "
            + ", ".join(f"{x:.2f}" for x in row["ratio_per_rep"])
            + f" | {fmt(row.get('cpu_ratio'), 'x', 2)} | "
            + ", ".join(f"{x:.2f}" for x in row.get("cpu_ratio_per_rep", []) if x)
            + f" | {row['on_padded_tokens']:,} / {row['off_padded_tokens']:,} |"
        )
    return lines
