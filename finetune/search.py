"""A time-budgeted hyperparameter search over a recipe, with optuna (the library that transformers'
`Trainer.hyperparameter_search` uses).

    python -m finetune.search --config finetune/configs/bert_rotten_tomatoes.yaml --budget 600
    python -m finetune.search --config <recipe> --budget 1800 --space learning_rate,warmup_ratio output_dir=runs/s
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml -m finetune.search --config <recipe> --budget 900

Each trial is the real `finetune.run.train()` on the recipe with the trial's settings, in
`<output_dir>/trial-N` (so every topology works: under DDP every process runs each trial, process 0
asks optuna and tells the others). The search space (`--space` picks a part of it):

    learning_rate               log-uniform in [1e-5, 1e-3]
    num_train_epochs            1, 2, 3, 4 or 5
    per_device_train_batch_size 8, 16, 32 or 64
    warmup_ratio                uniform in [0, 0.2]
    freeze_layers               0 .. half the model's layers (models whose layers the app can find)
    tune_threshold              global or per_label (multi-label)

A trial evaluates on validation about four times (and at each epoch's end) and reports
metric_for_best_model to optuna; its median pruner stops a trial that falls behind the trials before
it at the same step (after the first two trials and the first evaluation). A finished trial's value is
its final validation score, with the multi-label threshold tuned on validation where `tune_threshold`
tunes one (`results["validation_tuned"]`: the decisions its export makes), else at the fixed one.

The budget is wall-clock seconds from the start of the command: no trial starts once they are spent,
or would be by a trial as long as the median one so far; a trial that is running when they are spent
is stopped (pruned) at its next evaluation before its last step. So the search overruns the budget by
at most one evaluation interval and the start of the next evaluation; the summary line and
`search.json` say how long it took against the budget, and how many trials the budget cut.

The study lives in `<output_dir>/study.db` (SQLite): the same command again continues it, with a new
budget. At the end, `<output_dir>/model` is the best trial's export and `<output_dir>/best_recipe.yaml`
the recipe with its settings (train with it again: `accelerate launch finetune/run.py --config
<output_dir>/best_recipe.yaml`); the other trials keep their logs, not their weights.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as finetune/run.py, before torch loads OpenMP

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from finetune.config import TrainConfig, load_config, settings_from_flags
from finetune.errors import ArgumentParser, UserError, exit_on_user_error
from finetune.rundir import BEST_RECIPE, SEARCH_RECORD, STUDY, TRIAL_PREFIX, RunDir

SPACE = ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "warmup_ratio", "freeze_layers",
         "tune_threshold")  # fmt: skip
CUT = "cut_at_budget"  # a pruned trial's user attribute in the study: the budget stopped it, not the pruner


def suggest(trial, cfg: TrainConfig, space: list[str], layers: int) -> dict[str, Any]:
    """The trial's settings, from the parts of the space asked for that apply to this run."""
    from finetune.metrics import MULTI

    chosen: dict[str, Any] = {}
    if "learning_rate" in space:
        chosen["learning_rate"] = trial.suggest_float("learning_rate", 1e-5, 1e-3, log=True)
    if "num_train_epochs" in space:
        chosen["num_train_epochs"] = trial.suggest_int("num_train_epochs", 1, 5)
    if "per_device_train_batch_size" in space:
        chosen["per_device_train_batch_size"] = trial.suggest_categorical("per_device_train_batch_size", [8, 16, 32, 64])
    if "warmup_ratio" in space:
        chosen["warmup_ratio"] = trial.suggest_float("warmup_ratio", 0.0, 0.2)
    if "freeze_layers" in space and layers > 1 and cfg.peft is None:
        chosen["freeze_layers"] = trial.suggest_int("freeze_layers", 0, layers // 2)
    if "tune_threshold" in space and cfg.problem_type == MULTI:
        chosen["tune_threshold"] = trial.suggest_categorical("tune_threshold", ["global", "per_label"])
    return chosen


class Pruning:
    """The trial's reports to optuna at each evaluation, and whether to stop it there: its pruner's
    decision, or the budget spent (`deadline`, time.monotonic(), passed before the trial's last step).
    The same on every process (process 0 decides, the others hear it). Raises optuna.TrialPruned out
    of train(); `cut` says whether the budget was the reason."""

    def __init__(self, trial, metric: str, deadline: float = math.inf):
        from finetune.run import Hooks

        class Report(Hooks):
            def mark(hooks, name, value=None):  # noqa: N805 - the enclosing Pruning is `self`
                if name == "prepared":
                    self.total_steps = value.plan.total_steps
                elif name == "evaluated":
                    self.evaluated(*value)

        self.trial, self.metric, self.deadline, self.hooks = trial, metric, deadline, Report()
        self.total_steps: int | None = None
        self.cut = False

    def evaluated(self, step: int, metrics: dict) -> None:
        import optuna
        from accelerate.utils import broadcast_object_list

        value = metrics.get(self.metric)
        verdict = None  # None: go on; "pruned" or "cut"
        if self.trial is not None:
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.trial.report(value, step)
                verdict = "pruned" if self.trial.should_prune() else None
            last = self.total_steps is not None and step >= self.total_steps  # only the export is left
            if verdict is None and not last and time.monotonic() >= self.deadline:
                verdict = "cut"
        if _processes() > 1:
            verdict = broadcast_object_list([verdict], from_process=0)[0]
        if verdict is not None:
            self.cut = verdict == "cut"
            why = "the budget is spent" if self.cut else f"{self.metric} {value} fell behind"
            raise optuna.TrialPruned(f"{why} at step {step}")


def _processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _share(value: Any) -> Any:
    """Process 0's value on every process (under DDP)."""
    if _processes() == 1:
        return value
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import broadcast_object_list

    # The process group, formed once and kept for every trial; without a GPU one gloo group (as
    # finetune/runtime.py's make_accelerator forms it), not P processes that each run alone.
    PartialState(cpu=not torch.cuda.is_available())
    return broadcast_object_list([value], from_process=0)[0]


def _check_space_applies(space: list[str], cfg: TrainConfig, layers: int) -> None:
    """A space of which nothing applies to this run would repeat one trial until the budget is spent."""
    from finetune.metrics import MULTI

    only = {"tune_threshold": cfg.problem_type == MULTI, "freeze_layers": layers > 1 and cfg.peft is None}
    if not any(only.get(name, True) for name in space):
        raise UserError(
            f"--space {','.join(space)}: nothing in it applies to this run (tune_threshold is for multi-label runs, "
            "freeze_layers for models of 2 or more layers without peft); add learning_rate, num_train_epochs, "
            "per_device_train_batch_size or warmup_ratio"
        )


def search(recipe: str | None, overrides: list[str], budget: float, space: list[str], trials: int | None) -> dict:
    """Run trials until the budget or the number of trials is spent; returns the best trial's record."""
    import optuna
    from accelerate.state import AcceleratorState, GradientState

    from finetune.run import train

    started = time.monotonic()
    base, samples = _resolved(load_config(recipe, overrides))  # the problem type and its metric, from the data
    _check_space_applies(space, base, _layers(base))
    out, metric = Path(base.output_dir), base.metric_for_best_model
    study = None
    if _main_process():
        out.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        direction = "maximize" if base.greater_is_better else "minimize"
        study = optuna.create_study(
            study_name="finetune", storage=f"sqlite:///{out / STUDY}", load_if_exists=True, direction=direction,
            sampler=optuna.samplers.TPESampler(seed=base.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        )  # fmt: skip
        # A continued study draws on from where it stopped, not the same first draws again.
        study.sampler = optuna.samplers.TPESampler(seed=base.seed + len(study.trials))
    layers = _layers(base)
    durations: list[float] = []
    ran = 0
    while True:
        left = budget - (time.monotonic() - started)
        typical = sorted(durations)[len(durations) // 2] if durations else 0.0
        stop = left <= 0 or left < typical or (trials is not None and ran >= trials)
        if _share(stop):
            break
        trial = study.ask() if study is not None else None
        number = _share(trial.number if trial is not None else None)
        chosen = _share(suggest(trial, base, space, layers) if trial is not None else None)
        run_dir = out / f"{TRIAL_PREFIX}{number}"
        cfg = load_config(recipe, [*overrides, *(f"{k}={json.dumps(v)}" for k, v in chosen.items()),
                                   *_evaluations(chosen, base, samples), f"output_dir={run_dir}",
                                   "overwrite_output_dir=true", "push_to_hub_model_id=null"])  # fmt: skip
        began = time.monotonic()
        pruning = Pruning(trial, metric, deadline=started + budget)
        try:
            results = train(cfg, pruning.hooks)
            # The decisions the export makes: at the tuned multi-label threshold, where one was tuned.
            value = (results.get("validation_tuned") or results["validation"]).get(metric)
            state = "complete"
        except optuna.TrialPruned:
            results, value, state = None, None, "cut at the budget" if pruning.cut else "pruned"
        finally:
            AcceleratorState._reset_state(True)  # the next trial builds its Accelerator afresh
            GradientState._reset_state()
        durations.append(time.monotonic() - began)
        ran += 1
        if study is not None:
            if state == "complete" and isinstance(value, (int, float)) and math.isfinite(value):
                study.tell(trial, value)
            else:
                trial.set_user_attr(CUT, pruning.cut)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            print(f"trial {number}: {chosen} -> {state}" + (f", validation {metric} {value:.4f}"
                                                             if state == "complete" else ""), flush=True)  # fmt: skip
            _keep_only_the_best(out, study)
    return _finish(out, study, recipe, overrides, started, budget) if study is not None else {}


def _resolved(cfg: TrainConfig) -> tuple[TrainConfig, int]:
    """The recipe with its task and problem type read from the data (the space and the metric depend on
    them), and its training samples."""
    from finetune.data import infer_task, load_splits
    from finetune.problems import problem_type_of

    if cfg.task is None:
        cfg.resolve_task(infer_task(cfg.data_args))
    raw, _ = load_splits(cfg.data_args)
    cfg.resolve_problem(problem_type_of(raw["train"]))
    return cfg, len(raw["train"])


def _evaluations(cfg_settings: dict[str, Any], base: TrainConfig, samples: int) -> list[str]:
    """About four evaluations a trial (the pruner's reports), unless the recipe sets eval_steps."""
    if base.eval_steps is not None:
        return []
    batch = cfg_settings.get("per_device_train_batch_size", base.per_device_train_batch_size)
    epochs = cfg_settings.get("num_train_epochs", base.num_train_epochs)
    per_epoch = math.ceil(math.ceil(samples / (batch * _processes())) / base.gradient_accumulation_steps)
    total = base.max_steps or math.ceil(per_epoch * epochs)
    return [f"eval_steps={max(1, total // 4)}"]


def _layers(cfg: TrainConfig) -> int:
    """The encoder layers of the recipe's model (0: freeze_layers is not searched)."""
    spec = cfg.model_config or {}
    if spec:
        return int(spec.get("num_hidden_layers") or 0)
    try:
        from transformers import AutoConfig

        return int(getattr(AutoConfig.from_pretrained(cfg.model_name_or_path), "num_hidden_layers", 0) or 0)
    except (OSError, ValueError):
        return 0


def _keep_only_the_best(out: Path, study) -> None:
    """Every trial keeps its log and results; only the best one keeps its weights (disk: a trial's
    export and checkpoints are the model's size again and again)."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_trial.number if complete else None
    for trial_dir in out.glob(f"{TRIAL_PREFIX}*"):
        if trial_dir.name != f"{TRIAL_PREFIX}{best}":
            run = RunDir(trial_dir)
            for heavy in (run.model, run.checkpoints, run.adapter, run.previous):
                shutil.rmtree(heavy, ignore_errors=True)


def _finish(out: Path, study, recipe: str | None, overrides: list[str], started: float, budget: float) -> dict:
    import optuna

    seconds = round(time.monotonic() - started, 1)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise UserError(
            f"no trial finished within the budget ({len(study.trials)} started; wall time {seconds} s of a "
            f"{budget:g} s budget); give a larger --budget"
        )
    best = study.best_trial
    source = load_config(recipe, overrides).to_dict()
    settings = {**{k: v for k, v in source.items() if v is not None}, **best.params,
                "output_dir": str(out / "best-run")}  # fmt: skip
    (out / BEST_RECIPE).write_text(
        f"# accelerate launch finetune/run.py --config {out / BEST_RECIPE}\n"
        f"# The best of {len(study.trials)} trials of finetune.search (trial {best.number}, validation value "
        f"{best.value:.4f}): the recipe with the trial's settings.\n" + yaml.safe_dump(settings, sort_keys=False)
    )
    best_model, model = RunDir(out / f"{TRIAL_PREFIX}{best.number}").model, RunDir(out).model
    if best_model.is_dir():
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(best_model, model)
    cut = sum(bool(t.user_attrs.get(CUT)) for t in study.trials)
    record = {"best_trial": best.number, "value": best.value, "params": best.params, "trials": len(study.trials),
              "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
              "cut_at_budget": cut, "seconds": seconds, "budget_s": budget,
              "over_budget_s": round(max(0.0, seconds - budget), 1)}  # fmt: skip
    (out / SEARCH_RECORD).write_text(json.dumps(record, indent=2))
    print(f"best: trial {best.number}, validation {best.value:.4f} with {best.params}; model in {model}, "
          f"recipe {out / BEST_RECIPE} ({record['trials']} trials, {record['pruned']} pruned, {cut} of them cut "
          f"at the budget; wall time {seconds} s of a {budget:g} s budget)")
    return record


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(prog="finetune.search", description=__doc__, hint="see --help")
    parser.add_argument("--config", metavar="PATH", help="the recipe to search around (default: the MiniLM recipe)")
    parser.add_argument("--budget", type=float, required=True, help="wall-clock seconds: no trial starts after them")
    parser.add_argument("--trials", type=int, help="at most this many trials (default: as many as the budget allows)")
    parser.add_argument("--space", default=",".join(SPACE), help=f"settings to search, of {', '.join(SPACE)}")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="fixed settings of the recipe")
    args = parser.parse_intermixed_args(settings_from_flags(argv))
    args.space = [s for s in args.space.split(",") if s]
    unknown = [s for s in args.space if s not in SPACE]
    if unknown:
        raise UserError(f"--space: {', '.join(unknown)} cannot be searched; choose among {', '.join(SPACE)}")
    if not args.budget > 0 or (args.trials is not None and args.trials < 1):
        raise UserError("--budget must be positive seconds, --trials at least 1")
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict:
    from finetune.runtime import end_processes
    from finetune.signals import stop_outside_the_loop

    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_outside_the_loop()
    record = search(args.config, args.settings, args.budget, args.space, args.trials)
    end_processes()
    return record


if __name__ == "__main__":
    main()
