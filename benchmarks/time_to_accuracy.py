"""Time to accuracy: test accuracy against wall time, the app's full-data recipe against the textbook loop.

    python -m benchmarks.time_to_accuracy --out runs/tta          # about 15 minutes on 2 cores
    python -m benchmarks.time_to_accuracy --smoke --out /tmp/tta  # tiny models, a few steps: the test's run

Writes `time_to_accuracy.json`, `time_to_accuracy.md` and `time_to_accuracy.png` (both curves in one
plot) into --out. Where each number comes from:

- **app**: the real `finetune.run.train(cfg, hooks)` on `finetune/configs/bert_rotten_tomatoes_full.yaml`,
  under `--precision` (default bf16 where torch reports native bf16, as `cpu_bf16.yaml` runs it;
  else fp32), with the recipe's test file as its validation split, evaluated every
  `--app-eval-steps` optimizer steps and at the end; each accuracy is the one the run logged in its
  metrics.jsonl, each time the hooks' clock when that evaluation started (`Curve`). Nothing in the
  run depends on those evaluations (no best-model choice, no early stopping), so its weights are
  the recipe's.
- **reference**: transformers' `run_glue_no_trainer.py` at its documented defaults, written as a
  loop in benchmarks/reference.py: batch 8, `AdamW(lr=5e-5)` with weight decay 0, no warm-up, linear
  decay, 3 epochs, max_length 128, dynamic padding to the longest in the batch, every weight
  trained, fp32; dropout as the recipe sets it (`dropout: 0.0`: run_glue_no_trainer keeps the
  model's 0.1; the report's `settings` say which ran). Same model files, data files and threads;
  evaluated on the test split every `--reference-eval-steps` optimizer steps and at the end.
- **the clock**: from the start of each run (data loading, tokenization and model building
  included) to each evaluation, the evaluations themselves left out: they measure, neither run
  needs them to train. Process start-up (imports) is not in it: the **command** row is the whole
  README command for the recipe, run in a fresh process (`accelerate launch --config_file
  accelerate_configs/cpu_bf16.yaml finetune/run.py --config <recipe>`; `cpu.yaml` at --precision no;
  on a GPU `single_gpu_bf16.yaml`, `single_gpu.yaml`), its wall time and the test accuracy it printed
  (`--no-command` leaves it out; `--command-recipe bert` runs the default recipe instead).
- **time to target**: the clock at the first evaluation at or above `--target` (0.81), or none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.recipes import RECIPES, RESERVED_OVERRIDES, SMOKE, check_arguments, recipe_task
from benchmarks.reference import RUN_GLUE, run_glue
from benchmarks.report import machine, machine_line, write_report
from benchmarks.runs import environment, reset_accelerate
from finetune.config import REPO_DIR, TrainConfig, load_config
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.layout import RunDir
from finetune.run import Hooks, train
from finetune.runtime import cpu_threads, native_bf16

RECIPE = RECIPES["bert_full"]
# The command's accelerate config, by device and --precision.
ACCELERATE_CONFIGS = {
    "cpu": {"bf16": "cpu_bf16.yaml", "no": "cpu.yaml"},
    "cuda": {"bf16": "single_gpu_bf16.yaml", "fp16": "single_gpu_fp16.yaml", "no": "single_gpu.yaml"},
}
SMOKE_SIZES = ["max_train_samples=64", "max_eval_samples=32", "max_test_samples=32", "max_steps=8"]


class Curve(Hooks):
    """The clock of an accuracy curve, as hooks of a run: seconds since the start with the
    evaluations (phase "evaluate") left out, read when each evaluation starts. A loop evaluates an
    optimizer step before it marks the step done, so an evaluation belongs to the step after the last
    "step" mark (the app's final one, after its last step, to none)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()
        self.excluded = 0.0
        self.step = 0  # the last optimizer step marked done
        self.at: dict[int, float] = {}  # optimizer step -> the clock when its evaluation started

    def now(self) -> float:
        return time.perf_counter() - self.start - self.excluded

    def mark(self, name: str, value: Any = None) -> None:
        if name == "step":
            self.step = value

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name != "evaluate":
            with super().phase(name):
                yield
            return
        self.at.setdefault(self.step + 1, self.now())
        t = time.perf_counter()
        try:
            with super().phase(name):
                yield
        finally:
            self.excluded += time.perf_counter() - t

    def curve(self, evaluations: list[dict[str, Any]]) -> list[dict[str, float]]:
        """Each evaluation ({"step", "accuracy"}) with the clock at its start."""
        return [
            {"seconds": self.at[e["step"]], "step": e["step"], "accuracy": e["accuracy"]} for e in evaluations
        ]


def time_to(curve: list[dict[str, float]], target: float) -> float | None:
    """The clock at the first point at or above `target`, or None."""
    return next((p["seconds"] for p in curve if p["accuracy"] >= target), None)


# --- the two runs ------------------------------------------------------------------------------------------


def logged_evaluations(cfg: TrainConfig) -> list[dict[str, float]]:
    """The validation accuracy the run logged at each evaluation (its metrics.jsonl)."""
    records = [json.loads(line) for line in RunDir(cfg.output_dir).metrics.read_text().splitlines() if line]
    return [{"step": r["step"], "accuracy": r["eval_accuracy"]} for r in records if "eval_accuracy" in r]


def run_app(cfg: TrainConfig, precision: str) -> dict[str, Any]:
    """`train(cfg, hooks)` with an accuracy point at every evaluation (the test file is its validation
    split, evaluated every `eval_steps`; the accuracies from the run's log, the clock from its hooks)."""
    reset_accelerate()
    hooks = Curve()
    try:
        with environment({"ACCELERATE_MIXED_PRECISION": precision}):
            results = train(cfg, hooks)
        wall = time.perf_counter() - hooks.start
    finally:
        reset_accelerate()
    return {
        "source": "finetune.run.train(cfg, hooks) on the recipe, the test file as its validation split",
        "precision": precision,
        "optimizer_steps": results["step"],
        "train_wall_s": wall,
        "phases_s": hooks.seconds,
        "curve": hooks.curve(logged_evaluations(cfg)),
    }


def run_reference(cfg: TrainConfig, eval_steps: int, epochs: int) -> dict[str, Any]:
    """run_glue_no_trainer.py's loop at its defaults (benchmarks/reference.py), on the recipe's model
    and data files, timed by the same clock."""
    reset_accelerate()
    hooks = Curve()
    try:
        ran = run_glue(cfg, epochs, eval_steps, hooks)
        wall = time.perf_counter() - hooks.start
    finally:
        reset_accelerate()
    return {
        "source": "run_glue_no_trainer.py's loop at its defaults, in benchmarks/reference.py",
        "settings": {**RUN_GLUE, "epochs": epochs, "precision": "no", "embeddings": "trained",
                     "dropout": "the model's" if cfg.dropout is None else cfg.dropout},
        "optimizer_steps": ran["optimizer_steps"],
        "train_wall_s": wall,
        "phases_s": hooks.seconds,
        "curve": hooks.curve(ran["evaluations"]),
    }  # fmt: skip


def run_command(recipe: Path, extra: list[str], out: Path, precision: str = "bf16") -> dict[str, Any]:
    """The README command in a fresh process: whole wall time, the test accuracy it printed, the phase
    seconds of its last line (start-up, data, build, compile, train, evaluate, export; imports and the
    launcher are the wall time's rest) and, compiled, its graphs compiled in and after the warm-up."""
    configs = ACCELERATE_CONFIGS["cuda" if torch.cuda.is_available() else "cpu"]
    config = configs.get(precision, configs["no"])
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file",
           str(REPO_DIR / "accelerate_configs" / config),
           str(REPO_DIR / "finetune" / "run.py"), "--config", str(recipe), f"output_dir={out}", *extra]  # fmt: skip
    load = os.getloadavg()
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_DIR)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"the command failed ({proc.returncode}): {proc.stderr[-2000:]}")
    found = re.search(r"^test accuracy ([0-9.]+)", proc.stdout, re.M)
    seconds = re.search(r"^seconds: (.*)$", proc.stdout, re.M)
    phases = dict((k, float(v)) for k, v in re.findall(r"([a-z-]+) ([0-9.]+)", seconds.group(1))) if seconds else {}
    compiled = re.search(r"^torch_compile: (\d+) graphs compiled in the warm-up, (\d+) after it", proc.stdout, re.M)
    shown = " ".join(
        [f"accelerate launch --config_file accelerate_configs/{config} finetune/run.py --config",
         str(recipe.relative_to(REPO_DIR)), *extra]  # fmt: skip
    )
    return {
        "command": shown, "wall_s": wall, "test_accuracy": float(found.group(1)) if found else None,
        "phases_s": phases, "outside_phases_s": wall - sum(phases.values()), "load_avg_start": load,
        **({"graphs_compiled_in_warm_up": int(compiled.group(1)), "graphs_compiled_after_warm_up": int(compiled.group(2))}
           if compiled else {}),
    }  # fmt: skip


def command_rows(recipe: Path, extra: list[str], seeds: list[int] | None, out: Path, precision: str) -> dict[str, Any]:
    """The whole command once per seed (the recipe's when none are given): each run, and the means."""
    runs = [
        run_command(recipe, [*extra, *([f"seed={seed}"] if seed is not None else [])], out / f"seed-{seed}", precision)
        for seed in (seeds or [None])
    ]
    accuracies = [r["test_accuracy"] for r in runs if r["test_accuracy"] is not None]
    return {
        **runs[0],
        "runs": runs,
        "mean_wall_s": sum(r["wall_s"] for r in runs) / len(runs),
        "mean_test_accuracy": sum(accuracies) / len(accuracies) if accuracies else None,
    }


# --- report -------------------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, style in (("app", "o-"), ("reference", "s--")):
        run = report[name]
        xs, ys = [p["seconds"] for p in run["curve"]], [p["accuracy"] for p in run["curve"]]
        ax.plot(xs, ys, style, markersize=3, label=f"{name}: {run['label']}")
    ax.axhline(
        report["target"], color="grey", linewidth=0.8, linestyle=":", label=f"target {report['target']}"
    )
    if report.get("command"):
        c = report["command"]
        ax.plot([c["wall_s"]], [c["test_accuracy"]], "k*", markersize=9, label="app, whole command")
    ax.set_xscale("log")
    ax.set_xlabel("seconds (evaluations left out)")
    ax.set_ylabel("test accuracy")
    gpu = report["machine"].get("gpu")
    ax.set_title(f"Time to accuracy, {gpu or str(report['machine']['cpu_count']) + ' CPU cores'}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(report: dict[str, Any]) -> str:
    target = report["target"]

    def fmt(v: float | None, digits: int = 1) -> str:
        return "–" if v is None else f"{v:,.{digits}f}"

    a, r = report["app"], report["reference"]
    lines = [
        machine_line(report["machine"]) + ".",
        f"Command: `{report['invocation']}`",
        "",
        f"| | app: {a['label']} | reference: {r['label']} |",
        "|---|---:|---:|",
        f"| time to test accuracy {target} (s) | {fmt(a['time_to_target_s'])} | {fmt(r['time_to_target_s'])} |",
        f"| best test accuracy (at s) | {a['best']['accuracy']:.4f} ({fmt(a['best']['seconds'])}) | "
        f"{r['best']['accuracy']:.4f} ({fmt(r['best']['seconds'])}) |",
        f"| final test accuracy | {a['curve'][-1]['accuracy']:.4f} | {r['curve'][-1]['accuracy']:.4f} |",
        f"| optimizer steps | {a['optimizer_steps']} | {r['optimizer_steps']} |",
        f"| run wall time with its evaluations (s) | {fmt(a['train_wall_s'])} | {fmt(r['train_wall_s'])} |",
    ]
    if report.get("command"):
        c = report["command"]
        lines.append(
            f"| whole command, fresh process (s) | {fmt(c['wall_s'])} (test accuracy "
            f"{fmt(c['test_accuracy'], 4)}): `{c['command']}` | |"
        )
        if len(c["runs"]) > 1:
            each = ", ".join(f"{fmt(r['test_accuracy'], 4)} in {fmt(r['wall_s'])} s" for r in c["runs"])
            lines.append(
                f"| whole command over {len(c['runs'])} seeds: mean test accuracy, mean seconds | "
                f"{fmt(c['mean_test_accuracy'], 4)}, {fmt(c['mean_wall_s'])} ({each}) | |"
            )
        phases = ", ".join(f"{k} {v:.1f}" for k, v in c["phases_s"].items())
        lines.append(f"| the command's phases (s) | {phases}; imports and launcher {fmt(c['outside_phases_s'])} | |")
        if "graphs_compiled_after_warm_up" in c:
            lines.append(
                f"| graphs compiled in / after the warm-up | {c['graphs_compiled_in_warm_up']} / "
                f"{c['graphs_compiled_after_warm_up']} | |"
            )
    lines += ["", "Curve points (seconds, accuracy):", ""]
    for name in ("app", "reference"):
        pts = ", ".join(f"{p['seconds']:.0f} s {p['accuracy']:.4f}" for p in report[name]["curve"])
        lines.append(f"- {name}: {pts}")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.time_to_accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/time_to_accuracy"))
    p.add_argument("--target", type=float, default=0.81, help="the test accuracy to time (default 0.81)")
    p.add_argument(
        "--precision",
        choices=["no", "bf16", "fp16"],
        default=None,
        help="the app's mixed precision (default: bf16 where torch reports native bf16, else no)",
    )
    p.add_argument("--app-eval-steps", type=int, default=20)
    p.add_argument("--reference-eval-steps", type=int, default=200)
    p.add_argument("--reference-epochs", type=int, default=RUN_GLUE["epochs"])
    p.add_argument("--no-command", action="store_true", help="leave out the whole-command run")
    p.add_argument("--command-seeds", type=int, nargs="+", default=None,
                   help="run the whole command once per seed (default: once, at the recipe's seed)")  # fmt: skip
    p.add_argument("--command-recipe", choices=["bert", "bert_full"], default="bert_full",
                   help="the recipe of the whole-command rows (default: the curves' bert_full; bert: the default recipe)")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="tiny models from config, a slice of the data")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra override of the app's recipe (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    if not 0 < args.target <= 1:  # NaN fails both comparisons
        p.error(f"--target is an accuracy in (0, 1], got {args.target}")
    curve = dict.fromkeys(  # what the curve is made of
        ("test_file", "validation_file", "eval_steps"),
        "the benchmark evaluates the recipe's test file every --app-eval-steps",
    )
    check_arguments(
        p,
        args,
        ["app_eval_steps", "reference_eval_steps", "reference_epochs"],
        {**RESERVED_OVERRIDES, **curve},
    )
    if args.smoke:
        args.no_command = True
        args.app_eval_steps, args.reference_eval_steps, args.reference_epochs = 2, 4, 1
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    precision = args.precision or ("bf16" if native_bf16() else "no")
    threads = cpu_threads(None, 1)
    torch.set_num_threads(threads)
    base = [f"cpu_threads={threads}", "report_to=[]", "overwrite_output_dir=true"]
    base += [*SMOKE[recipe_task("bert_full").modality], *SMOKE_SIZES] if args.smoke else []
    with tempfile.TemporaryDirectory(prefix="finetune-tta-") as tmp:
        recipe = load_config(RECIPE, [*base, f"output_dir={tmp}/app", *args.override])
        app_cfg = load_config(RECIPE, [
            *base, f"output_dir={tmp}/app", f"validation_file={recipe.test_file}", "test_file=null",
            "max_eval_samples=null" if not args.smoke else "max_eval_samples=32",
            f"eval_steps={args.app_eval_steps}", "load_best_model_at_end=false", "early_stopping_patience=null",
            *args.override,
        ])  # fmt: skip
        ref_cfg = load_config(RECIPE, [
            *base, f"output_dir={tmp}/reference", f"max_length={RUN_GLUE['max_length']}", "group_by_length=false",
        ])  # fmt: skip
        report: dict[str, Any] = {
            "invocation": "python -m benchmarks.time_to_accuracy " + " ".join(sys.argv[1:] if argv is None else argv),
            "recipe": str(RECIPE.relative_to(REPO_DIR)), "target": args.target, "machine": machine(),
            "load_avg_start": os.getloadavg(),
        }  # fmt: skip
        report["app"] = run_app(app_cfg, precision)
        report["app"]["label"] = f"{RECIPE.name}, {'fp32' if precision == 'no' else precision}"
        report["reference"] = run_reference(ref_cfg, args.reference_eval_steps, args.reference_epochs)
        report["reference"]["label"] = (
            f"run_glue_no_trainer defaults, fp32, {args.reference_epochs} epoch"
            + ("s" if args.reference_epochs != 1 else "")
        )
        if not args.no_command:
            report["command"] = command_rows(RECIPES[args.command_recipe], list(args.override), args.command_seeds,
                                             Path(tmp) / "command", precision)  # fmt: skip
    for name in ("app", "reference"):
        run = report[name]
        run["time_to_target_s"] = time_to(run["curve"], args.target)
        run["best"] = max(run["curve"], key=lambda p: p["accuracy"])
    report["load_avg_end"] = os.getloadavg()
    plot(report, args.out / "time_to_accuracy.png")
    write_report(args.out, "time_to_accuracy", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
