"""Search against defaults: on two tasks, the recipe's default command, then `finetune.search` given
--budget-factor times its wall time; validation and test metrics of both.

    python -m benchmarks.search_vs_defaults --out benchmarks/results        # about 35 min on 2 cores, quiet
    python -m benchmarks.search_vs_defaults --out /tmp/svd --tasks multi_label --budget-factor 1
    python -m benchmarks.search_vs_defaults --smoke --out /tmp/svd          # tiny models: the test's run

Writes `search_vs_defaults.json` and `search_vs_defaults.md` into --out. Where each number comes from:

- **the tasks**: two of benchmarks/expected_results.py's, on data `python scripts/public_tasks.py`
  builds (into --data before the runs; each built folder's manifest goes into the report): by default
  multi-label entity types (`uner_entity_types`, with `finetune/configs/bert_multi_label.yaml`) and
  the entity-count regression (`uner_entity_count`, with `finetune/configs/bert_regression.yaml`);
  `--tasks sentence_pair` adds the sentence pairs (about 20 min for the defaults alone), `--tasks
  few_reviews` a user's small set on the generic recipe, which no recipe was tuned on (`rt_few`: 500
  movie reviews with `finetune/configs/bert_custom_files.yaml`). Only the keys that name the
  data (`DATA_KEYS`) are set: every hyperparameter is the recipe's default.
- **defaults**: `accelerate launch --config_file accelerate_configs/<file> finetune/run.py --config
  <recipe> <data keys>` in a fresh process from the repository root (as `accelerate launch -q`, with
  HF_HUB_OFFLINE=1), training into a temporary output_dir; its wall time is the whole command's,
  interpreter start to exit. Its metrics are its own results.json's.
- **search**: `accelerate launch --config_file <the same file> -m finetune.search --config <recipe>
  --budget <the defaults' wall time times --budget-factor, rounded up to a second> <data keys>` in a
  fresh process (the
  search's default space unless --space; a trial still running when the budget is spent is stopped
  at its next evaluation, finetune/search.py). Its wall time is the whole command's too; the report
  keeps its search.json (trials, pruned, cut at the budget, the best trial's settings). The metrics
  are those of the best trial by validation (its results.json; the test split is never looked at to
  choose). Validation is at the tuned multi-label threshold where the run tuned one
  (`validation_tuned`), as both the search and the app's own verdict read it.
- **the defaults given the budget**: the defaults' command again, with the recipe's `num_train_epochs`
  (or `max_steps`) times --budget-factor, its schedule stretched with them: the other way to spend the
  search's time. The report says whether the search's best trial beats it on validation and on test.
- **the machine**: its CPU, threads and libraries, and the 1-minute load average, waited on before
  each task (below --max-load, at most --max-wait seconds) and recorded before and after it: wall
  times on a loaded machine are not comparable, and a search on a busy machine runs fewer trials.

`--smoke` runs tiny BERTs from config for a few steps; its search gets one trial and a budget of at
least `SMOKE_BUDGET_S` (a tiny run takes seconds, its trial as long) — it checks the pipeline, not the
claim.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.expected_results import (
    BY_NAME,
    SMOKE_STEPS,
    Task,
    accelerate_config_file,
    parse_run_options,
    report_head,
    shown_path,
    task_settings,
    wait_for_quiet,
)
from benchmarks.recipes import SMOKE
from benchmarks.report import machine_line, write_report
from finetune.config import CONFIGS_DIR, REPO_DIR, load_config
from finetune.errors import UserError
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.metrics import METRICS

# A user's own small set with the generic recipe: no recipe was tuned on it (expected_results has none such).
FEW_REVIEWS = Task(
    "few reviews", "single-label classification, one text, few examples",
    "rt_few: 500 / 300 / 1,066 rotten_tomatoes sentences, half of each polarity in train and validation",
    "bert_custom_files.yaml", "cpu_bf16.yaml",
    settings=("train_file={data}/rt_few/train.jsonl", "validation_file={data}/rt_few/validation.jsonl",
              "test_file={data}/rt_few/test.jsonl"),
    built="rt_few",
)  # fmt: skip
REGISTRY = {**BY_NAME, "few_reviews": FEW_REVIEWS}
TASKS = {"multi_label": "micro_f1", "regression": "mse", "sentence_pair": "accuracy",
         "few_reviews": "accuracy"}  # REGISTRY key: the metric  # fmt: skip
DEFAULT_TASKS = ["multi_label", "regression"]
DATA_KEYS = ("train_file", "validation_file", "test_file", "text_pair_column", "label_column", "label_names")
SMOKE_BUDGET_S = 120
SPLIT_KEYS = ("num_samples", "loss")


def data_settings(task: Task, data: Path) -> list[str]:
    """The task's settings that name its data, and nothing else: the recipe's defaults train."""
    return [s for s in task_settings(task, data) if s.split("=", 1)[0] in DATA_KEYS]


def timed(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_DIR, env=env)
    return proc, time.perf_counter() - t


def scores(results: dict[str, Any], metrics: tuple[str, ...]) -> dict[str, Any]:
    """Validation (at the tuned threshold where one was tuned) and test metrics of a run's results.json."""
    validation = results.get("validation_tuned") or results["validation"]
    test = results.get("test") or {}
    return {
        "validation": {k: validation.get(k) for k in (*metrics, *SPLIT_KEYS) if validation.get(k) is not None},
        "validation_at": "tuned threshold" if results.get("validation_tuned") else "as trained",
        "test": {k: test.get(k) for k in (*metrics, *SPLIT_KEYS) if test.get(k) is not None},
        "optimizer_steps": results.get("step"),
    }


def launch(config_file: Path) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file", str(config_file)]


def run_defaults(task: Task, data: Path, out: Path, extra: list[str], longer: list[str] = ()) -> dict[str, Any]:
    """The recipe's command with the data keys alone (and `longer`, the settings that give it more time),
    in a fresh process: its wall time and metrics."""
    recipe, config_file = CONFIGS_DIR / task.recipe, accelerate_config_file(task)
    settings = [*data_settings(task, data), *longer]
    shown = ["accelerate", "launch", "--config_file", shown_path(config_file), "finetune/run.py", "--config",
             shown_path(recipe), *settings]  # fmt: skip
    proc, wall = timed([*launch(config_file), str(REPO_DIR / "finetune" / "run.py"), "--config", str(recipe), *settings,
                        *extra, *longer, f"output_dir={out}", "overwrite_output_dir=true", "report_to=[]"])  # fmt: skip
    row: dict[str, Any] = {"command": shlex.join(shown), "exit_status": proc.returncode, "wall_s": round(wall, 1)}
    if proc.returncode != 0:
        row["error"] = (proc.stderr or proc.stdout)[-3000:]
        return row
    return {**row, **scores(json.loads((out / "results.json").read_text()), (TASKS[key_of(task)],))}


def run_search(task: Task, data: Path, out: Path, budget: float, extra: list[str], space: str | None,
               trials: int | None) -> dict[str, Any]:  # fmt: skip
    """finetune.search on the same recipe and data with `budget` seconds, in a fresh process."""
    recipe, config_file = CONFIGS_DIR / task.recipe, accelerate_config_file(task)
    settings = data_settings(task, data)
    options = ["--budget", f"{budget:g}", *(["--space", space] if space else []),
               *(["--trials", str(trials)] if trials else [])]  # fmt: skip
    shown = ["accelerate", "launch", "--config_file", shown_path(config_file), "-m", "finetune.search", "--config",
             shown_path(recipe), *options, *settings]  # fmt: skip
    proc, wall = timed([*launch(config_file), "-m", "finetune.search", "--config", str(recipe), *options, *settings,
                        *extra, f"output_dir={out}", "report_to=[]"])  # fmt: skip
    row: dict[str, Any] = {"command": shlex.join(shown), "exit_status": proc.returncode, "wall_s": round(wall, 1),
                           "budget_s": budget}  # fmt: skip
    if proc.returncode != 0:
        row["error"] = (proc.stderr or proc.stdout)[-3000:]
        return row
    record = json.loads((out / "search.json").read_text())
    row["search"] = record
    best = json.loads((out / f"trial-{record['best_trial']}" / "results.json").read_text())
    row.update(scores(best, (TASKS[key_of(task)],)))
    row["summary"] = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("best: ")), None)
    return row


def longer(task: Task, data: Path, extra: list[str], factor: float) -> list[str]:
    """The settings that give the recipe's defaults `factor` times their training: its epochs (or
    max_steps) times `factor`, every other hyperparameter its own; the schedule stretches with them."""
    cfg = load_config(str(CONFIGS_DIR / task.recipe), [*data_settings(task, data), *extra])
    if cfg.max_steps:
        return [f"max_steps={math.ceil(cfg.max_steps * factor)}"]
    return [f"num_train_epochs={cfg.num_train_epochs * factor:g}"]


def key_of(task: Task) -> str:
    return next(k for k, t in REGISTRY.items() if t is task)


# --- the report ---------------------------------------------------------------------------------------------


def fmt(v: Any) -> str:
    return "–" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def cell(run: dict[str, Any], metric: str) -> str:
    if run.get("exit_status"):
        return f"failed (exit {run['exit_status']})"
    return f"{fmt(run['validation'].get(metric))} / {fmt(run['test'].get(metric))}"


def verdict(search: dict[str, Any], longer: dict[str, Any], metric: str) -> str:
    """Whether the search's best trial beats the defaults given the budget, on validation and on test."""
    if not search or not longer or search.get("exit_status") or longer.get("exit_status"):
        return "–"
    sign = 1 if METRICS[metric].greater_is_better else -1

    def beats(split: str) -> str:
        a, b = search[split].get(metric), longer[split].get(metric)
        return "–" if a is None or b is None else "yes" if sign * (a - b) > 0 else "no"

    return f"{beats('validation')}, {beats('test')}"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        machine_line(report["machine"]) + ".",
        f"Command: `{report['invocation']}`; {report['date']}." + (" Smoke run: tiny models." if report["smoke"] else ""),
        "",
        "| task | metric | defaults: validation / test | defaults' wall time (s) | defaults given the budget: "
        "validation / test | their wall time (s) | search: validation / test (best trial) | search's budget / "
        "wall time (s) | search better than the defaults given the budget (validation, test) | trials (pruned, "
        "cut at the budget) | best settings | load before |",
        "|---|---|---|---:|---|---:|---|---:|---|---|---|---:|",
    ]
    for row in report["tasks"]:
        d, s, metric = row["defaults"], row["search"], row["metric"]
        more = row.get("defaults_longer") or {}
        record = s.get("search") or {}
        trials = f"{record['trials']} ({record['pruned']}, {record['cut_at_budget']})" if record else "–"
        settings = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in (record.get("params") or {}).items()) or "–"  # fmt: skip
        budget = f"{s['budget_s']:g} / {s['wall_s']:.1f}" if "budget_s" in s else "–"
        longer_cells = f"{cell(more, metric)} | {more['wall_s']:.1f}" if more else "– | –"
        lines.append(
            f"| {row['task']} (`{row['recipe']}`) | {metric} | {cell(d, metric)} | {d['wall_s']:.1f} | {longer_cells} | "
            f"{cell(s, metric) if s else '–'} | {budget} | {verdict(s, more, metric)} | {trials} | {settings} | "
            f"{row['load_before'][0]:.2f}{'' if row['quiet'] else ' (busy)'} |"
        )
    factor = report["budget_factor"]
    lines += [
        "",
        "Validation at the tuned multi-label threshold where the run tuned one; test on the whole test split, "
        f"never used to choose. The search's budget is {factor:g} times the defaults' wall time (the whole command "
        "each); its first trial is the recipe's defaults (finetune/search.py), so with a budget of 1 times it ties "
        "them (tests/test_search.py::test_trial_0_is_the_recipes_own_settings_run_as_the_recipe_runs). The "
        f"defaults given the budget are the same command with {factor:g} times the recipe's epochs (its schedule "
        "stretched with them): the other way to spend the same time. The search is better where its value beats "
        "theirs on validation and on test.",
        "",
        *(f"- {row['task']}: defaults `{row['defaults']['command']}`; given the budget "
          f"`{(row.get('defaults_longer') or {}).get('command', '–')}`; search `{row['search'].get('command', '–')}`"
          for row in report["tasks"]),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.search_vs_defaults", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/search_vs_defaults"))
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=DEFAULT_TASKS,
                   help=f"which tasks (default {' and '.join(DEFAULT_TASKS)})")
    p.add_argument("--budget-factor", type=float, default=2.0,
                   help="the search's budget in units of the defaults' wall time (default 2: the search's first "
                        "trial is the defaults, finetune/search.py, so at 1 it ties them)")
    p.add_argument("--space", help="the search's --space (default: its whole space)")
    args = parse_run_options(p, argv)
    if not args.budget_factor > 0:
        raise UserError(f"--budget-factor must be positive, got {args.budget_factor:g}")
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    tasks = [REGISTRY[name] for name in args.tasks]
    report = report_head("benchmarks.search_vs_defaults", argv, args, tasks)
    report["budget_factor"] = args.budget_factor
    with tempfile.TemporaryDirectory(prefix="finetune-search-vs-defaults-") as tmp:
        for key, task in zip(args.tasks, tasks, strict=True):
            extra = [*SMOKE[task.modality], *SMOKE_STEPS] if args.smoke else []
            load = wait_for_quiet(args.max_load, args.max_wait)
            row: dict[str, Any] = {"key": key, "task": task.name, "recipe": f"finetune/configs/{task.recipe}",
                                   "data": task.data, "metric": TASKS[key], **load}  # fmt: skip
            print(f"{task.name}: load {load['load_before'][0]:.2f}, the recipe's defaults", flush=True)
            row["defaults"] = run_defaults(task, args.data, Path(tmp) / key / "defaults", extra)
            row["search"] = {}
            if not row["defaults"]["exit_status"]:
                budget = float(math.ceil(row["defaults"]["wall_s"] * args.budget_factor))
                if args.smoke:
                    budget = max(budget, SMOKE_BUDGET_S)
                print(f"{task.name}: the search, {budget:g} s", flush=True)
                row["search"] = run_search(task, args.data, Path(tmp) / key / "search", budget, extra, args.space,
                                           1 if args.smoke else None)  # fmt: skip
                more = longer(task, args.data, extra, args.budget_factor)
                print(f"{task.name}: the recipe's defaults with {' '.join(more)}", flush=True)
                row["defaults_longer"] = run_defaults(task, args.data, Path(tmp) / key / "longer", extra, more)
            row["load_after"] = [round(x, 2) for x in os.getloadavg()]
            report["tasks"].append(row)
    write_report(args.out, "search_vs_defaults", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
