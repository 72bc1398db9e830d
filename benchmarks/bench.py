"""Benchmark the app's training loop against the hardware's matmul peak and a textbook loop.

    python -m benchmarks.bench                                  # BERT recipe, the recipe's steps
    python -m benchmarks.bench --recipe both --out runs/bench   # BERT and ViT
    python -m benchmarks.bench --recipe all --steps 30          # every task: text, tags, QA, ViT, EfficientNet
    python -m benchmarks.bench --steps 40 --levers              # plus each speed lever on/off
    python -m benchmarks.bench --precision bf16 --steps 4       # bf16 autocast (slow on CPUs without bf16)
    python -m benchmarks.bench --precision bf16 --seq-len 128 --no-split --override 'model_config={...}'  # a GPU's MFU
    python -m benchmarks.bench --smoke --out /tmp/b             # tiny models, a few steps: the test's run
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 -m benchmarks.bench --steps 20

Writes `bench.json` and `bench.md` into --out. Where each number comes from:

- **app**: the real `finetune.run.train(cfg, hooks)` on the recipe plus `output_dir=<temp> max_steps=N`,
  not a copy of its loop. Its phases come from the hooks it calls (benchmarks/recorder.py says which
  mark ends which phase): data, forward + loss, backward, clip + optimizer, and what is left of the
  step ("other": scheduler, logging, checkpoints). Throughput is over the optimizer steps after
  `--warmup`, evaluations left out. `--no-split` synchronises a GPU only at the timed window's ends
  (benchmarks/recorder.py): the loops' own throughput, without the phase split. Eval accuracy is what `train()` returned for the test split (the
  validation split when the recipe has no test split).
- **reference**: accelerate's `nlp_example.py` loop (benchmarks/reference.py), on the same process,
  model (same seed, so same initial weights), data, precision, batch size and number of optimizer
  steps, timed through the same marks; evaluated on the same split.
- **MFU**: model FLOPs per second (benchmarks/flops.py) over the best matmul peak measured in this run
  (benchmarks/peak.py: `--gemm-reps` square GEMMs of `--gemm-size` in the training dtype, every layout a
  step uses, before, between and after the runs: the machine may be shared).
- **memory**: peak process RSS during the run (CPU; the kernel's high-water mark, reset when the run
  starts), `max_memory_allocated` (GPU).
- **communication** (several processes): all-reduce of one flat fp32 tensor the size of the
  gradients, timed alone in the reference's process group; DDP overlaps it with backward, so the
  backward phase already contains it.
- **levers** (`--levers`): benchmarks/levers.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from benchmarks.flops import mfu
from benchmarks.levers import LEVERS, bench_levers, lever_skipped, ratio, tokenize_cache
from benchmarks.peak import PEAK_DTYPES, gemm_peak
from benchmarks.recipes import (
    EVERY_TASK,
    RECIPES,
    SEQ_LEN_SETTINGS,
    check_arguments,
    recipe_config,
    recipe_overrides,
    recipe_task,
)
from benchmarks.report import bench_markdown, import_seconds, machine, write_report
from benchmarks.runs import environment, reset_accelerate, run_app, run_reference
from finetune.config import REPO_DIR
from finetune.errors import UserError
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.runtime import cpu_threads, native_bf16

# The app's scores that are the textbook loop's argmax accuracy too (benchmarks/reference.py, `accuracy`).
COMPARABLE_METRICS = ("accuracy", "word_accuracy")


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["samples_per_s"])[(len(runs) - 1) // 2]


def bench_recipe(
    recipe: str, args: argparse.Namespace, peak: Callable[[], float], tmp: Path, device: torch.device
) -> dict[str, Any]:
    """App and reference alternately, `--reps` times each, with the matmul peak measured between."""
    cfg = recipe_config(recipe, args, tmp / f"{recipe}-app")
    pad_to = args.seq_len if SEQ_LEN_SETTINGS <= recipe_task(recipe).own_settings else None
    peaks = [peak()]
    apps, refs = [], []
    for _ in range(args.reps):
        apps.append(run_app(cfg, args.warmup, device, not args.no_split))
        peaks.append(peak())
        steps, split = apps[-1]["optimizer_steps"], apps[-1]["eval_split"]
        refs.append(run_reference(cfg, steps, split, args.warmup, device, pad_to, not args.no_split))
        peaks.append(peak())
    for r in apps + refs:
        r["mfu"] = mfu(r["model_flops_per_s"], max(peaks))
        r["mfu_real"] = mfu(r["model_flops_real_per_s"], max(peaks))
    app_r, ref_r = median_run(apps), median_run(refs)
    return {
        "recipe": str(RECIPES[recipe].relative_to(REPO_DIR)),
        "overrides": recipe_overrides(recipe, args),
        "peak_flops_per_s_measured": peaks,
        "app": app_r,
        "reference": ref_r,
        "app_runs": apps,
        "reference_runs": refs,
        "app_over_reference": {
            "samples_per_s": ratio(app_r["samples_per_s"], ref_r["samples_per_s"]),
            "samples_per_s_per_rep": [
                ratio(a["samples_per_s"], b["samples_per_s"]) for a, b in zip(apps, refs, strict=True)
            ],
            "padded_tokens_per_s": ratio(app_r["padded_tokens_per_s"], ref_r["padded_tokens_per_s"]),
            "model_flops_per_s": ratio(app_r["model_flops_per_s"], ref_r["model_flops_per_s"]),
            # the same score where the app's is the textbook's argmax accuracy (QA's exact match is not)
            "eval_accuracy_difference": app_r["eval_accuracy"] - ref_r["eval_accuracy"]
            if app_r["eval_metric"] in COMPARABLE_METRICS else None,
            "validation_evaluation_s": evaluation_ratio(app_r, ref_r),
        },
    }


def outside_training(app: dict[str, Any], import_s: float | None) -> dict[str, Any]:
    """The app's seconds outside its training loop (the imports of a fresh interpreter, start-up, data,
    building, evaluation and export: `train()`'s phases but "train"), and their share of the whole
    (imports + `train()`'s wall). The launcher's own start is apart: benchmarks/launcher.py."""
    imports = import_s or 0.0
    outside = imports + app["train_wall_s"] - app["stages_s"].get("train", 0.0)
    return {"seconds": outside, "share": outside / (imports + app["train_wall_s"]), "imports_counted": import_s is not None}


def evaluation_ratio(app: dict[str, Any], ref: dict[str, Any]) -> float | None:
    """Seconds of the app's last validation evaluation (metrics, gathering, a task's post-processing)
    over a plain `model.eval()` loop's forward passes on the same split with the same batch size."""
    timed, plain = app.get("validation_evaluation"), ref.get("plain_validation")
    return ratio(timed["seconds"], plain["seconds"]) if timed and plain and plain["seconds"] > 0 else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=[*RECIPES, "both", "all"], default="bert",
                   help=f"both: bert and vit; all: one recipe of each task and image model ({', '.join(EVERY_TASK)})")  # fmt: skip
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    p.add_argument(
        "--reps", type=int, default=1, help="app/reference pairs, run alternately; medians reported"
    )
    p.add_argument("--warmup", type=int, default=3, help="optimizer steps left out of the timing")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument("--precision", choices=["no", "bf16", "fp16"], default=None,
                   help="mixed precision for both loops (default: the accelerate config's; else on a CPU the one "
                        "it computes natively: bf16 with AMX or AVX512-BF16, else no)")  # fmt: skip
    p.add_argument("--seq-len", type=int, default=None,
                   help="text: pad every batch of both loops to this many tokens (max_length and pad_to_multiple_of)")  # fmt: skip
    p.add_argument("--no-split", action="store_true",
                   help="GPU: synchronise only at the timed window's ends (the loops' own throughput; no phase split)")  # fmt: skip
    p.add_argument("--gemm-size", type=int, default=2048)
    p.add_argument("--gemm-reps", type=int, default=5)
    p.add_argument("--levers", action="store_true", help="also measure each lever on/off")
    p.add_argument("--levers-only", nargs="*", default=None, help="run only these levers (none named: all)")
    p.add_argument("--lever-steps", type=int, default=30)
    p.add_argument("--lever-reps", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="include the torch.compile lever (slow to compile)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the whole bench")
    p.add_argument("--smoke", action="store_true", help="tiny models from config, a slice of the data")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra recipe override for both loops (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    if args.seq_len is not None and args.seq_len <= 0:
        p.error(f"--seq-len must be a positive number of tokens, got {args.seq_len}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.steps is not None and args.steps <= 0:
        p.error(f"--steps must be positive, got {args.steps}")
    if args.steps is not None and not args.smoke and args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} (the default is 3) leaves none of --steps {args.steps} to time; give more "
                "steps or a smaller --warmup")
    if unknown := [name for name in args.levers_only or [] if name not in LEVERS]:
        p.error(f"--levers-only: no lever named {', '.join(unknown)}; the levers: {', '.join(LEVERS)}")
    args.levers = args.levers or args.levers_only is not None  # naming levers asks for them
    check_arguments(
        p, args, ["steps", "reps", "gemm_size", "gemm_reps", "lever_steps", "lever_reps", "threads"]
    )
    if args.smoke:
        args.steps = args.steps or 4
        args.warmup = min(args.warmup, 1)
        args.gemm_size, args.gemm_reps = min(args.gemm_size, 256), min(args.gemm_reps, 2)
        args.lever_steps, args.lever_reps = min(args.lever_steps, 3), 1
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # the asked precision, the accelerate config's, or on a CPU the one it computes natively: bf16 with AMX
    # or AVX512-BF16, else fp32 (bf16 emulated); set for the bench's runs only
    native = "bf16" if not torch.cuda.is_available() and native_bf16() else "no"
    precision = args.precision or os.environ.get("ACCELERATE_MIXED_PRECISION") or native
    tokenizers = os.environ.get("TOKENIZERS_PARALLELISM", "false")
    with environment({"ACCELERATE_MIXED_PRECISION": precision, "TOKENIZERS_PARALLELISM": tokenizers}):
        return bench(args, argv, precision)


def bench(args: argparse.Namespace, argv: list[str] | None, precision: str) -> dict[str, Any]:
    """The bench's runs and report (`main`, with its precision set)."""
    load_start = os.getloadavg()
    probe = Accelerator()  # the device and process layout, as the runs will see them
    device, processes, is_main = probe.device, probe.num_processes, probe.is_main_process
    reset_accelerate()
    # train() leaves the process group to its entry point: one group serves every run here, destroyed at the end.
    if device.type == "cpu":  # both loops with the threads the app takes (train() sets them too)
        threads = cpu_threads(args.threads, processes)
        torch.set_num_threads(threads)
        args.override = [f"cpu_threads={threads}", *args.override]
    peaks: list[dict] = []

    def peak() -> float:
        peaks.append(gemm_peak(PEAK_DTYPES[precision], args.gemm_size, args.gemm_reps, device))
        return peaks[-1]["flops_per_s"]

    recipes = {"both": ["bert", "vit"], "all": EVERY_TASK}.get(args.recipe, [args.recipe])
    for name in args.levers_only or []:  # a named lever that would be skipped: say so before any run
        if why := lever_skipped(LEVERS[name], recipes[0], args, device, processes):
            raise UserError(f"--levers-only {name}: {why}")
    report: dict[str, Any] = {
        "command": "python -m benchmarks.bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(), "precision": precision, "processes": processes,
        "import_seconds": None if args.smoke else import_seconds(), "load_avg_start": load_start, "recipes": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="finetune-bench-") as tmp:
        for recipe in recipes:
            report["recipes"][recipe] = bench_recipe(recipe, args, peak, Path(tmp), device)
            report["recipes"][recipe]["outside_training"] = outside_training(report["recipes"][recipe]["app"],
                                                                             report["import_seconds"])  # fmt: skip
        if args.levers:
            report["levers"] = bench_levers(recipes[0], args, Path(tmp), device, processes)
            if recipes[0] == "bert":
                report["tokenize_cache"] = tokenize_cache("bert", args, Path(tmp))
    if processes > 1:
        torch.distributed.destroy_process_group()
    best = max(peaks, key=lambda p: p["flops_per_s"])
    report["peak"] = {**best, "all_flops_per_s": [p["flops_per_s"] for p in peaks]}
    report["load_avg_end"] = os.getloadavg()
    if is_main:
        write_report(args.out, "bench", report, bench_markdown(report))
    return report


if __name__ == "__main__":
    main()
