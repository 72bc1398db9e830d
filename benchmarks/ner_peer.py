"""The NER peer benchmark: test entity F1 against training time, the app's NER recipe against
transformers' `run_ner_no_trainer.py` at its defaults, on the same model and data files.

    python -m benchmarks.ner_peer --out benchmarks/results          # about 15 minutes on 2 quiet cores
    python -m benchmarks.ner_peer --smoke --out /tmp/ner_peer       # tiny models, a few steps: the test's run

Writes `ner_peer.json`, `ner_peer.md` and `ner_peer.png` (both curves in one plot) into --out.
Where each number comes from:

- **app**: the real `finetune.run.train(cfg, hooks)` on `finetune/configs/bert_ner.yaml` under
  `--precision` (default bf16 where torch reports native bf16, as `cpu_bf16.yaml` runs it; else
  fp32), once per `--seeds` seed. It trains on what the recipe trains on: `validation.jsonl` less
  its seeded 10% held out (the recipe's validation split, evaluated at each epoch's end as the recipe
  does). The hooks (`TestCurve`) score the recipe's test split every `--app-eval-steps` optimizer steps
  and after the last one (past `--app-dense-s` seconds of its clock, every `--app-eval-steps-after`),
  through the app's own `evaluate_model` (the word's tag is its first
  subword's; a sentence longer than a window is split into windows, so every word is scored once);
  the global RNG states are put back after each such evaluation, so the run trains exactly as it
  would without them. Passing the test file as the validation split instead would change what it
  trains on (no share is held out when a validation file is given).
- **peer**: `run_ner_no_trainer.py` at its documented defaults, written as a loop in
  benchmarks/reference.py (`run_ner`, `RUN_NER`): batch 8, AdamW at 5e-5 without weight decay, linear
  decay without warm-up, 3 epochs, truncation at 128 subwords, first subwords labelled, the model's
  own dropout and attention kernel, fp32; on the app's training split (same files, same held-out
  share, the recipe's seed), seed `--peer-seed`. Evaluated on the test split every
  `--peer-eval-steps` optimizer steps and at the end. (One test sentence is longer than 128
  subwords with this tokenizer: a single 335-subword URL; truncation keeps its first subword, so the
  peer too scores every word of test.jsonl once. The report counts the words each loop scored.)
- **scoring**: both loops' word predictions are scored twice: `f1` is the peer's own metric,
  `evaluate.load("seqeval")` at its defaults (seqeval's default, conlleval-style mode: an I-X after O
  starts an entity), computed with seqeval directly as `evaluate`'s metric does (`evaluate` fetches
  the metric's script from the Hub, which fails offline); `f1_strict` is the app's metric (strict
  IOB2, finetune/metrics.py). The target and the ratio use `f1`.
- **the clock**: from the start of each run (data loading, tokenization and model building
  included) to each evaluation, the evaluations themselves (the app's validation ones too) left out.
  Process start-up (imports) is not in it: the **command** row is the recipe's README command in a
  fresh process (`accelerate launch --config_file accelerate_configs/cpu_bf16.yaml finetune/run.py
  --config finetune/configs/bert_ner.yaml`, `cpu.yaml` under --precision no), its wall time and the
  test entity F1 (strict) it printed (`--no-command` leaves it out).
- **target and ratio**: the peer's best `f1` over its curve, and the clock when it got there; for
  each app seed the clock at its first evaluation at or above that F1 (or none), and the ratio
  peer seconds / app seconds (> 1: the app got there sooner).
- **load**: the machine is shared: before each of the runs the benchmark waits (up to
  `--quiet-wait` seconds) until the 1-minute load average is below `--quiet-load`, and records the
  load average it started at.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np
import torch

from benchmarks.recipes import RESERVED_OVERRIDES, SMOKE, check_arguments
from benchmarks.reference import RUN_NER, run_ner, seqeval_scores
from benchmarks.report import machine, machine_line, write_report
from benchmarks.runs import environment, reset_accelerate
from finetune.config import CONFIGS_DIR, REPO_DIR, TrainConfig, load_config
from finetune.data import load_splits
from finetune.evaluation import evaluate_model
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.metrics import TOKENS, token_report
from finetune.run import Hooks, due, train
from finetune.runtime import cpu_threads, native_bf16

RECIPE = CONFIGS_DIR / "bert_ner.yaml"
ACCELERATE_CONFIGS = {"bf16": REPO_DIR / "accelerate_configs" / "cpu_bf16.yaml",
                      "no": REPO_DIR / "accelerate_configs" / "cpu.yaml"}  # fmt: skip
SMOKE_SIZES = ["max_train_samples=64", "max_eval_samples=16", "max_test_samples=32", "max_length=32"]


# --- the clock ----------------------------------------------------------------------------------------------


class Clock(Hooks):
    """Seconds since the start of a run with its evaluations (phase "evaluate") left out; `starts`
    holds the clock at the start of each evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()
        self.excluded = 0.0
        self.starts: list[float] = []

    def now(self) -> float:
        return time.perf_counter() - self.start - self.excluded

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name != "evaluate":
            with super().phase(name):
                yield
            return
        self.starts.append(self.now())
        t = time.perf_counter()
        try:
            with super().phase(name):
                yield
        finally:
            self.excluded += time.perf_counter() - t


class TestCurve(Clock):
    """The app's hooks: after every `every`-th optimizer step and the last, the test split scored
    with the app's `evaluate_model` (word predictions, first subwords), the global RNG states kept.
    Once the clock is past `dense_s` seconds (None: never), every `then_every`-th step instead."""

    def __init__(self, every: int, gold: list[list[str]], dense_s: float | None = None,
                 then_every: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.every, self.gold = every, gold
        self.dense_s, self.then_every = dense_s, then_every or every
        self.run: Any = None
        self.points: list[dict[str, Any]] = []

    def mark(self, name: str, value: Any = None) -> None:
        if name == "prepared":
            self.run = value
        elif name == "step":
            dense = self.dense_s is None or self.now() <= self.dense_s
            if due(self.every if dense else self.then_every, value) or value == self.run.plan.total_steps:
                self.score(value)

    def score(self, step: int) -> None:
        run = self.run
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        with self.phase("evaluate"):
            metrics = evaluate_model(run.model, run.eval_loaders["test"], run.accelerator, run.labels,
                                     problem_type=TOKENS, keep_predictions=True)  # fmt: skip
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        names = run.labels
        predicted = [[names[i] for i in sentence] for sentence in metrics["predictions"]]
        self.points.append({"seconds": self.starts[-1], "step": step, **scores(predicted, self.gold)})


def scores(predicted: list[list[str]], gold: list[list[str]]) -> dict[str, Any]:
    """Both scorings of word predictions: the peer's (`evaluate`'s seqeval defaults) and the app's
    (strict IOB2), and the words scored."""
    names = sorted({t for s in gold for t in s} | {t for s in predicted for t in s})
    ids = {n: i for i, n in enumerate(names)}
    strict = token_report([[ids[t] for t in s] for s in predicted], [[ids[t] for t in s] for s in gold], names)
    return {
        "f1": seqeval_scores(predicted, gold)["overall_f1"],
        "f1_strict": strict["entity_f1"],
        "words": strict["num_words"],
    }


def time_to(curve: list[dict[str, Any]], target: float) -> float | None:
    """The clock at the first point whose `f1` is at or above `target`, or None."""
    return next((p["seconds"] for p in curve if p["f1"] >= target), None)


def wait_for_quiet(threshold: float | None, limit_s: float) -> dict[str, Any]:
    """Wait (up to `limit_s`) until the 1-minute load average is below `threshold` (None: no wait)."""
    t = time.perf_counter()
    while threshold is not None and os.getloadavg()[0] >= threshold and time.perf_counter() - t < limit_s:
        time.sleep(10)
    load = os.getloadavg()
    return {"load_avg": list(load), "waited_s": round(time.perf_counter() - t, 1),
            "quiet": threshold is None or load[0] < threshold}  # fmt: skip


# --- the runs -----------------------------------------------------------------------------------------------


def test_gold(cfg: TrainConfig) -> list[list[str]]:
    """The test split's tag names, sentence by sentence (outside any clock)."""
    raw, names = load_splits(cfg.data_args)
    return [[names[i] for i in tags] for tags in raw["test"]["labels"]]


def run_app(cfg: TrainConfig, precision: str, every: int, gold: list[list[str]], dense_s: float | None = None,
            then_every: int | None = None) -> dict[str, Any]:  # fmt: skip
    """`train(cfg, hooks)` with a test point every `every` optimizer steps (`TestCurve`), every
    `then_every` once the clock is past `dense_s`."""
    reset_accelerate()
    hooks = TestCurve(every, gold, dense_s, then_every)
    try:
        with environment({"ACCELERATE_MIXED_PRECISION": precision}):
            results = train(cfg, hooks)
        wall = time.perf_counter() - hooks.start
    finally:
        reset_accelerate()
    final = hooks.points[-1]
    return {
        "seed": cfg.seed,
        "optimizer_steps": results["step"],
        "train_wall_s": wall,
        "phases_s": hooks.seconds,
        # What train() itself reported for the test split: the curve's last point, scored by the app.
        "reported_test_f1_strict": results["test"]["entity_f1"],
        "final": {"f1": final["f1"], "f1_strict": final["f1_strict"]},
        "curve": hooks.points,
    }


def run_peer(cfg: TrainConfig, every: int, epochs: int) -> dict[str, Any]:
    """run_ner_no_trainer.py's loop at its defaults (benchmarks/reference.py), timed by the same clock."""
    reset_accelerate()
    hooks = Clock()
    try:
        ran = run_ner(cfg, epochs, every, hooks)
        wall = time.perf_counter() - hooks.start
    finally:
        reset_accelerate()
    starts = hooks.starts  # run_ner's evaluations are its only "evaluate" phases
    curve = [{"seconds": s, "step": e["step"], **scores(e["predictions"], e["references"])}
             for s, e in zip(starts, ran["evaluations"], strict=True)]  # fmt: skip
    return {
        "seed": cfg.seed,
        "settings": {**RUN_NER, "epochs": epochs, "precision": "no", "dropout": "the model's",
                     "label_list": ran["label_list"]},  # fmt: skip
        "optimizer_steps": ran["optimizer_steps"],
        "train_wall_s": wall,
        "phases_s": hooks.seconds,
        "final": {"f1": curve[-1]["f1"], "f1_strict": curve[-1]["f1_strict"]},
        "curve": curve,
    }


def run_command(precision: str, extra: list[str], out: Path) -> dict[str, Any]:
    """The README command in a fresh process: its whole wall time and the test entity F1 it printed."""
    config = ACCELERATE_CONFIGS[precision]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file", str(config),
           str(REPO_DIR / "finetune" / "run.py"), "--config", str(RECIPE), f"output_dir={out}", *extra]  # fmt: skip
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_DIR)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"the command failed ({proc.returncode}): {proc.stderr[-2000:]}")
    found = re.search(r"^test entity F1 ([0-9.]+)", proc.stdout, re.M)
    shown = (f"accelerate launch --config_file {config.relative_to(REPO_DIR)} finetune/run.py --config "
             f"{RECIPE.relative_to(REPO_DIR)}")  # fmt: skip
    return {"command": shown, "wall_s": wall, "test_f1_strict": float(found.group(1)) if found else None}


# --- report -------------------------------------------------------------------------------------------------


def summarize(report: dict[str, Any]) -> None:
    """The target (the peer's best f1 and when), each app run's time to it and ratio, the app's seeds."""
    peer = report["peer"]
    best = max(peer["curve"], key=lambda p: p["f1"])  # the first of equal ones: the earliest
    peer["best"] = best
    target = best["f1"]
    for run in report["app"]["runs"]:
        run["time_to_target_s"] = time_to(run["curve"], target)
        run["ratio"] = best["seconds"] / run["time_to_target_s"] if run["time_to_target_s"] else None
    runs = report["app"]["runs"]
    ratios = [r["ratio"] for r in runs]
    report["target"] = {"f1": target, "peer_seconds": best["seconds"], "peer_step": best["step"]}
    report["ratio"] = ratios[0]  # the recipe's seed (the first of --seeds)
    report["ratios"] = ratios
    report["ratio_min"] = None if None in ratios else min(ratios)
    report["app"]["final_f1"] = {
        key: {"mean": mean(r["final"][key] for r in runs), "min": min(r["final"][key] for r in runs),
              "each": [r["final"][key] for r in runs]}
        for key in ("f1", "f1_strict")
    }  # fmt: skip


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, run in enumerate(report["app"]["runs"]):
        xs, ys = [p["seconds"] for p in run["curve"]], [p["f1"] for p in run["curve"]]
        label = f"app: {report['app']['label']}, seed {run['seed']}"
        ax.plot(xs, ys, "o-", color="C0", alpha=1.0 if i == 0 else 0.35, markersize=3, label=label)
    peer = report["peer"]
    xs, ys = [p["seconds"] for p in peer["curve"]], [p["f1"] for p in peer["curve"]]
    ax.plot(xs, ys, "s--", color="C1", markersize=3, label=f"peer: {peer['label']}, seed {peer['seed']}")
    target = report["target"]
    ax.axhline(target["f1"], color="grey", linewidth=0.8, linestyle=":", label=f"peer's best {target['f1']:.4f}")
    ax.plot([target["peer_seconds"]], [target["f1"]], "o", color="C1", markerfacecolor="none", markersize=9)
    first = report["app"]["runs"][0]
    if first["time_to_target_s"]:
        ax.plot([first["time_to_target_s"]], [target["f1"]], "o", color="C0", markerfacecolor="none", markersize=9)
    if report.get("command") and report["command"]["test_f1_strict"] is not None:
        c = report["command"]
        ax.plot([c["wall_s"]], [c["test_f1_strict"]], "k*", markersize=9, label="app, whole command (strict F1)")
    ax.set_xscale("log")
    ax.set_xlabel("seconds of training (data and model building included, evaluations left out)")
    ax.set_ylabel("test entity F1 (seqeval default mode)")
    ratio = f"{report['ratio']:.1f}x sooner" if report["ratio"] else "not reached"
    ax.set_title(f"NER time to F1, {report['machine']['cpu_count']} CPU cores: the app {ratio}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    app, peer, target = report["app"], report["peer"], report["target"]
    runs, f1 = app["runs"], app["final_f1"]
    lines = [
        machine_line(report["machine"]) + ".",
        f"Command: `{report['invocation']}`",
        "Load average (1 min) when each run started: "
        + ", ".join(f"{k} {v['load_avg'][0]:.2f}" for k, v in report["load"].items()) + ".",
        "",
        f"Test entity F1 is seqeval's default mode (`evaluate`'s seqeval metric, the peer's own); strict "
        f"IOB2 (the app's) in brackets. Peer's best: **{target['f1']:.4f}** at {fmt(target['peer_seconds'])} s "
        f"(step {target['peer_step']}). The app reached it after "
        + ", ".join(f"{fmt(r['time_to_target_s'])} s (seed {r['seed']})" for r in runs)
        + ": **" + ", ".join("–" if x is None else f"{x:.1f}x" for x in report["ratios"]) + " sooner**.",
        "",
        f"| | app: {app['label']} | peer: {peer['label']} |",
        "|---|---:|---:|",
        f"| best test F1 (at s) | {max(p['f1'] for p in runs[0]['curve']):.4f} | "
        f"{target['f1']:.4f} ({fmt(target['peer_seconds'])}) |",
        f"| final test F1 [strict], seed {runs[0]['seed']} / {peer['seed']} | {runs[0]['final']['f1']:.4f} "
        f"[{runs[0]['final']['f1_strict']:.4f}] | {peer['final']['f1']:.4f} [{peer['final']['f1_strict']:.4f}] |",
        f"| final test F1 over the app's {len(runs)} seeds: mean, min [strict mean, min] | {f1['f1']['mean']:.4f}, "
        f"{f1['f1']['min']:.4f} [{f1['f1_strict']['mean']:.4f}, {f1['f1_strict']['min']:.4f}] | |",
        f"| time to the peer's best (s) | {fmt(runs[0]['time_to_target_s'])} | {fmt(target['peer_seconds'])} |",
        f"| optimizer steps | {runs[0]['optimizer_steps']} | {peer['optimizer_steps']} |",
        f"| training clock at the last point (s) | {fmt(runs[0]['curve'][-1]['seconds'])} | "
        f"{fmt(peer['curve'][-1]['seconds'])} |",
        f"| run wall time with its evaluations (s) | {fmt(runs[0]['train_wall_s'])} | {fmt(peer['train_wall_s'])} |",
        f"| words scored | {runs[0]['curve'][-1]['words']:,} | {peer['curve'][-1]['words']:,} |",
    ]
    if report.get("command"):
        c = report["command"]
        lines.append(
            f"| whole command, fresh process (s) | {fmt(c['wall_s'])} (test F1 [strict] "
            f"{fmt(c['test_f1_strict'], 4)}): `{c['command']}` | |"
        )
    lines += ["", "Curve points (seconds, F1 [strict]):", ""]
    for run in runs:
        pts = ", ".join(f"{p['seconds']:.1f} s {p['f1']:.4f} [{p['f1_strict']:.4f}]" for p in run["curve"])
        lines.append(f"- app, seed {run['seed']}: {pts}")
    pts = ", ".join(f"{p['seconds']:.1f} s {p['f1']:.4f} [{p['f1_strict']:.4f}]" for p in peer["curve"])
    lines.append(f"- peer, seed {peer['seed']}: {pts}")
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.ner_peer", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/ner_peer"))
    p.add_argument("--precision", choices=["no", "bf16"], default=None,
                   help="the app's mixed precision (default: bf16 where torch reports native bf16, else no)")  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="the app's seeds (default: the recipe's seed, then 1 and 2)")  # fmt: skip
    p.add_argument("--peer-seed", type=int, default=None, help="the peer's seed (default: the recipe's)")
    p.add_argument("--app-eval-steps", type=int, default=10)
    p.add_argument("--app-dense-s", type=float, default=None,
                   help="past this many seconds of the app's clock, test every --app-eval-steps-after steps instead")
    p.add_argument("--app-eval-steps-after", type=int, default=None)
    p.add_argument("--peer-eval-steps", type=int, default=25)
    p.add_argument("--peer-epochs", type=int, default=RUN_NER["epochs"])
    p.add_argument("--quiet-load", type=float, default=0.8,
                   help="wait before each run until the 1-minute load average is below this")  # fmt: skip
    p.add_argument("--quiet-wait", type=float, default=900, help="seconds to wait for that at most, per run")
    p.add_argument("--no-command", action="store_true", help="leave out the whole-command run")
    p.add_argument("--smoke", action="store_true", help="tiny models from config, a slice of the data")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra override of the app's recipe (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    curve = dict.fromkeys(("test_file", "validation_file", "train_file", "seed"),
                          "the benchmark gives both loops the recipe's files and seeds (--seeds)")  # fmt: skip
    check_arguments(p, args, ["app_eval_steps", "app_dense_s", "app_eval_steps_after", "peer_eval_steps", "peer_epochs",
                              "quiet_wait"],
                    {**RESERVED_OVERRIDES, **curve})  # fmt: skip
    if args.smoke:
        args.no_command, args.quiet_load = True, None
        args.app_eval_steps, args.peer_eval_steps, args.peer_epochs = 2, 4, 1
        args.seeds = args.seeds or [42]
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    precision = args.precision or ("bf16" if native_bf16() else "no")
    threads = cpu_threads(None, 1)
    torch.set_num_threads(threads)
    base = [f"cpu_threads={threads}", "report_to=[]", "overwrite_output_dir=true"]
    base += [*SMOKE["text"], *SMOKE_SIZES] if args.smoke else []
    recipe = load_config(RECIPE, [*base, *args.override])
    seeds = args.seeds or [recipe.seed, *(s for s in (1, 2) if s != recipe.seed)]
    peer_seed = recipe.seed if args.peer_seed is None else args.peer_seed
    report: dict[str, Any] = {
        "invocation": "python -m benchmarks.ner_peer " + " ".join(sys.argv[1:] if argv is None else argv),
        "recipe": str(RECIPE.relative_to(REPO_DIR)), "overrides": list(args.override),
        "metric": "test entity F1, seqeval default mode as evaluate's seqeval metric computes it (f1); "
                  "strict IOB2 as the app reports it (f1_strict)",
        "machine": machine(), "load": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="finetune-ner-peer-") as tmp:
        gold = test_gold(recipe)
        runs = []
        for seed in seeds:
            cfg = load_config(RECIPE, [*base, f"output_dir={tmp}/app-{seed}", f"seed={seed}", *args.override])
            report["load"][f"app seed {seed}"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
            runs.append(run_app(cfg, precision, args.app_eval_steps, gold, args.app_dense_s, args.app_eval_steps_after))
        label = f"{RECIPE.name}, {'fp32' if precision == 'no' else precision}"
        report["app"] = {"label": label, "precision": precision, "runs": runs,
                         "source": "finetune.run.train(cfg, hooks) on the recipe; test scored by its hooks"}  # fmt: skip
        peer_cfg = load_config(RECIPE, [*base, f"output_dir={tmp}/peer", f"seed={peer_seed}"])
        report["load"]["peer"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
        report["peer"] = run_peer(peer_cfg, args.peer_eval_steps, args.peer_epochs)
        report["peer"]["label"] = f"run_ner_no_trainer defaults, fp32, {args.peer_epochs} epoch(s)"
        report["peer"]["source"] = "run_ner_no_trainer.py's loop at its defaults, in benchmarks/reference.py"
        if not args.no_command:
            report["load"]["command"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
            report["command"] = run_command(precision, list(args.override), Path(tmp) / "command")
    report["load"]["end"] = {"load_avg": list(os.getloadavg())}
    summarize(report)
    plot(report, args.out / "ner_peer.png")
    write_report(args.out, "ner_peer", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
