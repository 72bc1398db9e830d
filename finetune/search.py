"""A time-budgeted hyperparameter search over a recipe, with optuna (the library that transformers'
`Trainer.hyperparameter_search` uses).

    python -m finetune.search --config finetune/configs/bert_rotten_tomatoes.yaml --budget 600
    python -m finetune.search --config <recipe> --budget 1800 --space learning_rate,warmup_ratio output_dir=runs/s
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml -m finetune.search --config <recipe> --budget 900

Each trial is the real `finetune.run.train()` on the recipe with the trial's settings, in
`<output_dir>/trial-N` (so every topology works: under DDP every process runs each trial, process 0
asks optuna and tells the others). The search space (`--space` picks a part of it):

    learning_rate               log-uniform in [1e-5, 1e-3] (widened to hold the recipe's own)
    num_train_epochs            1 to 5; for a recipe of more, half to twice its own (20: 10 to 40)
    per_device_train_batch_size 8, 16, 32 or 64
    warmup_ratio                uniform in [0, 0.2] (widened to hold the recipe's own)
    freeze_layers               0 .. half the model's layers (models whose layers the app can find)
    tune_threshold              global or per_label (multi-label)

A trial evaluates on validation about four times (and at each epoch's end) and reports
metric_for_best_model to optuna; its median pruner stops a trial that falls behind the trials before
it at the same step (after the first two trials and the first evaluation). A finished trial's value is
its final validation score, with the multi-label threshold tuned on validation where `tune_threshold`
tunes one (`results["validation_tuned"]`: the decisions its export makes), else at the fixed one.

Trial 0 of a new study is the recipe as written (`the_recipes_own`: a value outside the ranges is
kept, not drawn again; for multi-label with the threshold tuned globally), run with the recipe's
evaluations: a budget that holds one run of the recipe ends with at least its model, the best trial is
never worse on validation, and the end line compares the best trial with it. Trial 1 is the same
settings with one change chosen from trial 0's curve (`the_next_step`: half the batch if it was still
improving at its last evaluation, a third of the learning rate if it was best before its end);
optuna's sampler draws the rest. The last of the budget, where it holds less than two more trials of the
median length but an epoch or more, trains on from the export of the best trial so far if that one
was still improving at its end (`_continuation`: a new schedule over the epochs that fit, at half its
batch where the space holds it, for the same reason as trial 1's); a continuation's recipe is its
first trial's settings with the epochs of both, at the continuation's batch.

The budget is wall-clock seconds from the start of the command. Each trial's wall time per epoch it
ran is measured; where the epochs are searched, a later trial gets no more epochs than the time left
holds at the median of those, and no trial starts once the time left holds no epoch (where they are
not searched: no trial as long as the median one so far). A trial that is running when they are spent
is stopped (pruned) at its next evaluation before its last step. So the search overruns the budget by
at most one evaluation interval and the start of the next evaluation; the summary line and
`search.json` say how long it took against the budget, and how many trials the budget cut.

The study lives in `<output_dir>/study.db` (SQLite): the same command again continues it, with a new
budget (`--trials N` counts this command's trials: a continued study gets up to N more); a damaged
study.db is refused, not written over. At the end, `<output_dir>/model` is the best trial's export and
`<output_dir>/best_recipe.yaml` the recipe with its settings (train with it again: `accelerate launch
finetune/run.py --config <output_dir>/best_recipe.yaml`); the other trials keep their logs, not their
weights.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as finetune/run.py, before torch loads OpenMP

import argparse
import json
import math
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

from finetune import checks
from finetune.checks import tools
from finetune.config import TrainConfig, load_config, resolved, settings_from_flags
from finetune.errors import TrainingStopped, UserError, first_line, on_failure
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.layout import BEST_RECIPE, MODEL, SEARCH_RECORD, STUDY, TRIAL_PREFIX, RunDir, read_record
from finetune.rundir import check_not_inside_a_run
from finetune.signals import stop_outside_the_loop
from finetune.tasks import task_for_data

SPACE = ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "warmup_ratio", "freeze_layers",
         "tune_threshold")  # fmt: skip
CUT = "cut_at_budget"  # a pruned trial's user attribute in the study: the budget stopped it, not the pruner
RECIPE = "recipes_own"  # the trial of the recipe's own settings (trial 0, or its run again after a signal)
RERUN_OF = "run_again_of"  # a trial that runs again the settings of one a signal stopped
GUIDED = "guided_by"  # trial 1: the recipe's settings with one change, chosen from trial 0's curve
EXTENDS = "continues"  # a trial that trains on from the export of an earlier one (its number)
IMPROVING = "improving_at_its_end"  # a finished trial whose curve was still rising (falling, for a loss)
SETTINGS = "settings"  # a trial's settings in all: for a continuation, its first trial's, with the epochs of both
STOPPED_BY_A_SIGNAL = (128 + signal.SIGINT, 128 + signal.SIGTERM)  # TrainingStopped's exit codes (errors.py)


BATCHES = [8, 16, 32, 64]
MAX_EPOCHS = 5
# An epoch at half the batch, planned as this many of the measured ones: twice the steps, each of half
# the work. Where the step is bound by the work (a CPU) it takes little longer; where it waits on the
# host (a small model on a GPU) up to twice as long, and a continuation that outruns the budget is cut.
HALF_BATCH_EPOCH = 1.15


def batches(cfg: TrainConfig) -> list[int]:
    """The batch sizes searched: these four and the recipe's own."""
    return sorted({*BATCHES, cfg.per_device_train_batch_size})


def epoch_range(cfg: TrainConfig) -> tuple[int, int]:
    """The epochs searched, around the recipe's own: 1 to 5 for a recipe of 5 or fewer, else half to twice
    the recipe's (a 20-epoch image recipe: 10 to 40; 1 to 5 would only ever train it shorter)."""
    epochs = max(1, round(float(cfg.num_train_epochs)))
    return (1, MAX_EPOCHS) if epochs <= MAX_EPOCHS else (math.ceil(epochs / 2), 2 * epochs)


def rate_range(cfg: TrainConfig) -> tuple[float, float]:
    """The learning rates searched: 1e-5 to 1e-3, widened to hold the recipe's own."""
    return min(1e-5, cfg.learning_rate), max(1e-3, cfg.learning_rate)


def suggest(trial, cfg: TrainConfig, space: list[str], layers: int, max_epochs: int = MAX_EPOCHS) -> dict[str, Any]:
    """The trial's settings, from the parts of the space asked for that apply to this run (`max_epochs`:
    as many as the time left is expected to hold). Trial 0's values are fixed (queued): they are used as
    they are, whatever the range."""
    from finetune.problems import problem_of  # torch, datasets: not for --help

    with warnings.catch_warnings():  # optuna's "Fixed parameter ... is out of range": trial 0's, kept on purpose
        warnings.filterwarnings("ignore", "Fixed parameter", UserWarning)
        return _suggest(trial, cfg, space, layers, max_epochs, problem_of)


def _suggest(trial, cfg: TrainConfig, space: list[str], layers: int, max_epochs: int, problem_of) -> dict[str, Any]:
    chosen: dict[str, Any] = {}
    if "learning_rate" in space:
        chosen["learning_rate"] = trial.suggest_float("learning_rate", *rate_range(cfg), log=True)
    if "num_train_epochs" in space:
        low, high = epoch_range(cfg)
        high = max(1, min(high, max_epochs))
        chosen["num_train_epochs"] = trial.suggest_int("num_train_epochs", min(low, high), high)
    if "per_device_train_batch_size" in space:
        chosen["per_device_train_batch_size"] = trial.suggest_categorical("per_device_train_batch_size", batches(cfg))
    if "warmup_ratio" in space:
        chosen["warmup_ratio"] = trial.suggest_float("warmup_ratio", 0.0, max(0.2, cfg.warmup_ratio))
    if "freeze_layers" in space and layers > 1 and cfg.peft is None:
        chosen["freeze_layers"] = trial.suggest_int("freeze_layers", 0, layers // 2)
    if "tune_threshold" in space and problem_of(cfg.problem_type).lists:  # per-label thresholds (Space.applies)
        chosen["tune_threshold"] = trial.suggest_categorical("tune_threshold", ["global", "per_label"])
    return chosen


def the_recipes_own(cfg: TrainConfig, space: list[str], layers: int) -> dict[str, Any]:
    """Trial 0's settings: the recipe's own values of the searched settings, so that a search whose budget
    holds one run of the recipe ends with at least the recipe's model. Multi-label: the threshold tuned
    globally on validation (it costs no training, and a fixed 0.5 is what leaves rare labels unpredicted).
    Each value is kept as written, also outside the range the later trials draw from (20 epochs, a learning
    rate of 1e-2); only one the space cannot hold (1.35 epochs, warmup_steps instead of a ratio) is drawn."""
    from finetune.problems import problem_of  # torch, datasets: not for --help

    own: dict[str, Any] = {"learning_rate": cfg.learning_rate,
                           "per_device_train_batch_size": cfg.per_device_train_batch_size}  # fmt: skip
    epochs = cfg.num_train_epochs
    if cfg.max_steps is None and float(epochs).is_integer() and 1 <= epochs:
        own["num_train_epochs"] = int(epochs)
    if cfg.warmup_steps is None and 0.0 <= cfg.warmup_ratio < 1.0:
        own["warmup_ratio"] = cfg.warmup_ratio
    if 0 <= cfg.freeze_layers <= layers // 2:
        own["freeze_layers"] = cfg.freeze_layers
    if problem_of(cfg.problem_type).lists:
        own["tune_threshold"] = cfg.tune_threshold if cfg.tune_threshold != "off" else "global"
    return {k: v for k, v in own.items() if k in space}


def the_next_step(own: dict[str, Any], curve: list[float], greater_is_better: bool) -> tuple[dict[str, Any], str] | None:
    """Trial 1's change to trial 0's settings (the recipe's own), from trial 0's curve: still improving at
    its last evaluation, it needs more updates than it had, so half the batch (twice the optimizer steps
    in about the same time); best before its end, it learned too fast, so a third of the learning rate.
    None where the curve tells nothing (fewer than two evaluations, or a flat end: its last evaluation no
    better and no worse than the best before it) or the setting is not searched or at
    the end of its range. With few trials in a budget, one guided step is worth more than a random draw;
    optuna draws the trials after it."""
    if len(curve) < 2:
        return None
    if improving(curve, greater_is_better):
        batch = own.get("per_device_train_batch_size")
        if batch is None or batch % 2 or batch // 2 not in BATCHES:  # a value the space holds
            return None
        return ({"per_device_train_batch_size": batch // 2},
                f"trial 0 was still improving at its last evaluation: its settings at half the batch, {batch // 2}")
    rate = own.get("learning_rate")
    earlier = max(curve[:-1]) if greater_is_better else min(curve[:-1])
    if rate is None or rate / 3 < 1e-5 or earlier == curve[-1]:  # a flat end tells neither: optuna draws
        return None
    return {"learning_rate": rate / 3}, "trial 0 was best before its end: its settings at a third of the learning rate"


def say_what_trial_0_draws(cfg: TrainConfig, space: list[str], own: dict[str, Any], said: checks.Said) -> None:
    """One warning line for the searched settings whose value (the recipe's, or the command line's) the
    space cannot hold, which trial 0 draws instead: else the user's value is dropped without a word."""
    checks.gate(tools.SEARCH_TRIAL_0, cfg, space, own, said=said)


class Pruning:
    """The trial's reports to optuna at each evaluation, and whether to stop it there: its pruner's
    decision, or the budget spent (`deadline`, time.monotonic(), passed before the trial's last step).
    The same on every process (process 0 decides, the others hear it). Raises optuna.TrialPruned out
    of train(); `cut` says whether the budget was the reason."""

    def __init__(self, trial, metric: str, deadline: float = math.inf):
        from finetune.run import Hooks  # torch: only when a search runs, not for --help

        class Report(Hooks):
            verdicts = False  # a trial's value is on its own line; the search's end says whether the best learned

            def mark(hooks, name, value=None):  # noqa: N805 - the enclosing Pruning is `self`
                if name == "prepared":
                    self.total_steps = value.plan.total_steps
                elif name == "evaluated":
                    self.evaluated(*value)

        self.trial, self.metric, self.deadline, self.hooks = trial, metric, deadline, Report()
        self.total_steps: int | None = None
        self.step = 0  # the last evaluated step
        self.curve: list[float] = []  # the metric at each evaluation (process 0's)
        self.cut = False

    def fraction_done(self) -> float:
        """How much of its training the trial ran (its last evaluation's step of its total)."""
        return min(1.0, self.step / self.total_steps) if self.total_steps else 0.0

    def evaluated(self, step: int, metrics: dict) -> None:
        import optuna
        from accelerate.utils import broadcast_object_list

        self.step = step
        value = metrics.get(self.metric)
        verdict = None  # None: go on; "pruned" or "cut"
        if self.trial is not None:
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.curve.append(float(value))
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
    """A space of which nothing applies to this run would repeat one trial until the budget is spent; a
    setting named that does not apply would be dropped without a word."""
    checks.gate(tools.SPACE, tools.Space(space, SPACE, cfg, layers))


# Settings that change where and how a run reports, not what its trials score: a study continues across them.
HOUSEKEEPING = ("output_dir", "overwrite_output_dir", "resume_from_checkpoint", "logging_steps", "log_level",
                "report_to", "save_total_limit", "cpu_threads", "push_to_hub_model_id")  # fmt: skip


def _other_settings(study, base: TrainConfig, space: list[str]) -> UserError | None:
    """A study is continued only with the settings it was made with (the searched ones aside): its trials'
    values are comparable only on the same data and recipe. A new study records them. The refusal, or None."""
    from finetune.data import train_data_fingerprint  # (datasets: only when a search runs)

    fixed = {k: v for k, v in base.to_dict().items() if k not in (*space, *HOUSEKEEPING)}
    fixed = json.loads(json.dumps(fixed, default=str))
    data = train_data_fingerprint(base.data_args)  # the bytes of the training file (or a folder's listing)
    made, searched = study.user_attrs.get("settings"), study.user_attrs.get("space")
    if made is None and not study.trials:
        study.set_user_attr("settings", fixed)
        study.set_user_attr("space", list(space))
        study.set_user_attr("train_data", data)
    found = checks.first(tools.STUDY_CHANGED, tools.Study(base.output_dir, space, searched, made, fixed, HOUSEKEEPING,
                                                          study.user_attrs.get("train_data"), data))  # fmt: skip
    return checks.refusal(*found) if found else None


def _search_folder_problem(out: Path) -> UserError | None:
    """A search writes trial-N/, model/, best_recipe.yaml and search.json into its output_dir, and continues
    the study of a folder that holds one: any other folder with files in it (a training run, the user's
    files) is refused, not written over. The refusal, or None."""
    try:
        check_not_inside_a_run(out)
    except UserError as e:
        return e
    folder = tools.SearchFolder(out)
    recipe = out / BEST_RECIPE
    if recipe.is_file():  # the search writes it again at its end: one the user edited would be lost
        from finetune.digests import sha256_of

        folder.wrote = read_record(out / SEARCH_RECORD).get("best_recipe_sha256")
        folder.found, folder.recorded = sha256_of(recipe), (out / SEARCH_RECORD).is_file()
    found = checks.first(tools.SEARCH_FOLDER, folder)
    return checks.refusal(*found) if found else None


def _remove_what_failed(out: Path, made: bool, new: bool) -> None:
    """After a search that failed (a full disk while SQLite made its study): a study.db it created and
    that holds nothing, and the output folder it created, if that is all there is."""
    study = out / STUDY
    if new and study.is_file() and study.stat().st_size == 0:
        study.unlink()
    if made and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _open_study(base: TrainConfig, space: list[str], said: checks.Said) -> tuple[Any, UserError | None]:
    """Process 0's study in `<output_dir>/study.db`, made or continued, or the refusal of its folder or of
    the study: (study, None) or (None, the refusal)."""
    import optuna
    import sqlalchemy.exc

    out = Path(base.output_dir)
    refusal = _search_folder_problem(out)
    if refusal is not None:
        return None, refusal
    made, new = not out.exists(), not (out / STUDY).exists()
    # a search never deletes its study: it continues it
    checks.gate(tools.SEARCH_OVERWRITE, base.overwrite_output_dir, new, out / STUDY, said=said)
    out.mkdir(parents=True, exist_ok=True)
    on_failure(lambda: _remove_what_failed(out, made, new))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    direction = "maximize" if base.greater_is_better else "minimize"
    try:
        study = optuna.create_study(
            study_name="finetune", storage=f"sqlite:///{out / STUDY}", load_if_exists=True,
            direction=direction, sampler=optuna.samplers.TPESampler(seed=base.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
        )  # fmt: skip
        refusal = _other_settings(study, base, space)
        # A continued study draws on from where it stopped, not the same first draws again.
        study.sampler = optuna.samplers.TPESampler(seed=base.seed + len(study.trials))
    except sqlalchemy.exc.DatabaseError as e:  # else a traceback; the file is left as it is
        found = checks.first(tools.STUDY_FAILED, out / STUDY, e)
        if found is None:
            raise
        return None, checks.refusal(*found)
    return study, refusal


def search(recipe: str | None, overrides: list[str], budget: float, space: list[str], trials: int | None,
           said: checks.Said | None = None) -> dict:  # fmt: skip
    """Run trials until the budget or the number of trials is spent; returns the best trial's record."""
    started = time.monotonic()
    said = said if said is not None else checks.Said()  # the trials read the same data: each warning said once
    base, samples, space, study = _set_up(recipe, overrides, space, said)
    out, metric, layers = Path(base.output_dir), base.metric_for_best_model, _layers(base)
    by_epochs = "num_train_epochs" in space and base.max_steps is None  # trials fitted to the time left
    most = epoch_range(base)[1]
    durations: list[float] = []
    epoch_seconds: list[float] = []  # each trial's wall time per epoch it ran (its start-up included)
    ran, extension = 0, None
    while True:
        slower = extension[3] if extension is not None else 1.0  # a continuation at half the batch
        fits = epochs_that_fit(budget - (time.monotonic() - started), durations, epoch_seconds, by_epochs, slower, most)
        if _share(fits == 0 or (trials is not None and ran >= trials)):
            break
        # Process 0's (the clocks of the others differ); the continuation: (the trial, its settings, its epochs) or None
        fits, extension = _share((fits, extension))
        trial, chosen, continues = _next_trial(study, extension, fits, base, space, layers, out)
        number = _share(trial.number if trial is not None else None)
        run_dir = out / f"{TRIAL_PREFIX}{number}"
        recipes = _share(bool(trial.user_attrs.get(RECIPE)) if trial is not None else None)  # the same evaluations
        evaluations = [] if recipes else _evaluations(chosen, base, samples)
        cfg = load_config(recipe, [*overrides, *(f"{k}={json.dumps(v)}" for k, v in chosen.items()), *continues,
                                   *evaluations, f"output_dir={run_dir}",
                                   "overwrite_output_dir=true", "push_to_hub_model_id=null"], said=said)  # fmt: skip
        began = time.monotonic()
        again = (f"trial {number}'s settings run again from the start" if extension is None else
                 f"whether to continue trial {extension[0]} is decided again")  # fmt: skip
        pruning = Pruning(trial, metric, deadline=started + budget)
        value, state = _run_trial(cfg, pruning, said, study, f"trial {number}", out / STUDY, again)
        durations.append(time.monotonic() - began)
        done = 1.0 if state == "complete" else pruning.fraction_done()
        if done > 0:
            epoch_seconds.append(durations[-1] / (done * float(cfg.num_train_epochs)))
        ran += 1
        if study is not None:
            _tell(study, trial, state, value, pruning, chosen, extension, fits, base.greater_is_better)
            _keep_only_the_best(out, study)
            left = budget - (time.monotonic() - started)
            fits_next = epochs_that_fit(left, durations, epoch_seconds, by_epochs, most=most)
            halved = epochs_that_fit(left, durations, epoch_seconds, by_epochs, HALF_BATCH_EPOCH, most)
            extension = _continuation(study, out, left, durations, fits_next, halved) if by_epochs else None
            if extension is None and state == "complete" and trial.user_attrs.get(RECIPE):
                _guide_trial_1(study, chosen, pruning.curve, base.greater_is_better, fits_next)
        else:
            extension = None
    return _finish(out, study, recipe, overrides, started, budget, said) if study is not None else {}


def _set_up(recipe: str | None, overrides: list[str], space: list[str],
            said: checks.Said) -> tuple[TrainConfig, int, list[str], Any]:  # fmt: skip
    """The recipe resolved from its data, its training samples, the space that applies to it, and process 0's
    study (None on the others) with trial 0 queued in a new one and what a signal stopped queued again."""
    base, samples = _resolved(load_config(recipe, overrides, said=said), said)  # the problem type and its metric, from the data
    _check_space_applies(space, base, _layers(base))
    if _main_process():  # max_steps decides the length: the default space's epochs too are said, not dropped
        checks.gate(tools.SEARCH_EPOCHS, base.max_steps, space, base.streaming, said=said)
    if base.max_steps is not None:
        space = [name for name in space if name != "num_train_epochs"]
    study, refusal = _open_study(base, space, said) if _main_process() else (None, None)
    refusal = _share(refusal)  # process 0 decides, and every process stops on its refusal (no hang)
    if refusal is not None:
        raise refusal
    if study is not None and not study.trials:  # trial 0: the recipe's own settings, run as the recipe runs
        own = the_recipes_own(base, space, _layers(base))
        say_what_trial_0_draws(base, space, own, said)
        study.enqueue_trial(own, user_attrs={RECIPE: True})
    if study is not None:
        _run_again_what_was_stopped(study)
    return base, samples, space, study


def _run_trial(cfg: TrainConfig, pruning: Pruning, said: checks.Said, study, which: str, kept: Path,
               again: str) -> tuple[Any, str]:  # fmt: skip
    """One trial: `finetune.run.train` with the pruner's hooks. (Its value, "complete"), or (None, "pruned" or
    "cut at the budget"). A signal keeps the study (`kept`): the trial is failed, to run again (`again` says
    how) when the same command continues the search."""
    import optuna
    from accelerate.state import AcceleratorState, GradientState

    from finetune.run import train  # torch: only when a search runs, not for --help
    from finetune.runtime import quiet_libraries

    quiet_libraries(cfg.log_level)  # as finetune/run.py's main: no library bars (an export's shard bar)
    try:
        results = train(cfg, pruning.hooks, said)
        # The decisions the export makes: at the tuned multi-label threshold, where one was tuned.
        return (results.get("validation_tuned") or results["validation"]).get(pruning.metric), "complete"
    except TrainingStopped as e:  # a signal: the study is kept, this trial runs again when it continues
        if study is not None:
            study.tell(pruning.trial, state=optuna.trial.TrialState.FAIL)
        if e.exit_code not in STOPPED_BY_A_SIGNAL:
            raise
        raise TrainingStopped(
            f"{first_line(e).split(';')[0]} ({which}); the study is kept in {kept}: run the same "
            f"search command again to continue it ({again})",
            e.exit_code,
        ) from None
    except optuna.TrialPruned:
        return None, "cut at the budget" if pruning.cut else "pruned"
    finally:
        AcceleratorState._reset_state(True)  # the next trial builds its Accelerator afresh
        GradientState._reset_state()


def _next_trial(study, extension: tuple | None, fits: int, base: TrainConfig, space: list[str], layers: int,
                out: Path) -> tuple[Any, dict[str, Any], list[str]]:
    """The next trial (process 0's; None on the others), its settings (every process's) and the settings
    that make it a continuation: with `extension`, no draw, the continued trial's settings on from its
    export; else the queued or drawn ones."""
    trial = study.ask() if study is not None else None
    if extension is None:
        return trial, _share(suggest(trial, base, space, layers, fits) if trial is not None else None), []
    if trial is not None:
        trial.set_user_attr(EXTENDS, extension[0])
    export = out / f"{TRIAL_PREFIX}{extension[0]}" / MODEL
    return trial, {**extension[1], "num_train_epochs": fits}, [f"model_name_or_path={export}", "model_config=null"]


def _tell(study, trial, state: str, value, pruning: Pruning, chosen: dict[str, Any], extension: tuple | None,
          fits: int, greater_is_better: bool) -> None:
    """The trial's end told to the study (a finished one with its curve's shape and its settings in all),
    and said in one line."""
    import optuna

    if state == "complete" and isinstance(value, (int, float)) and math.isfinite(value):
        trial.set_user_attr(IMPROVING, improving(pruning.curve, greater_is_better))
        trial.set_user_attr(SETTINGS, chosen if extension is None else
                            {**extension[1], "num_train_epochs": extension[2] + fits})  # fmt: skip
        study.tell(trial, value)
    else:
        trial.set_user_attr(CUT, pruning.cut)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    again, guided = trial.user_attrs.get(RERUN_OF), trial.user_attrs.get(GUIDED)
    half = f" at half its batch, {chosen.get('per_device_train_batch_size')}" if extension and extension[3] > 1 else ""
    shown = f"trial {trial.number}" + (f" (trial {again}'s settings again)" if again is not None else
                                       f" ({guided})" if guided else
                                       f" (trial {extension[0]} was still improving at its end: {fits} more "
                                       f"epoch(s) from its export{half})" if extension is not None else "")  # fmt: skip
    print(f"{shown}: {chosen} -> {state}" + (f", validation {pruning.metric} {value:.4f}"
                                             if state == "complete" else ""), flush=True)  # fmt: skip


def improving(curve: list[float], greater_is_better: bool) -> bool:
    """Whether a trial's curve was still improving at its end: its last evaluation better than every one
    before it (of two or more; a flat curve is not improving)."""
    if len(curve) < 2:
        return False
    return curve[-1] > max(curve[:-1]) if greater_is_better else curve[-1] < min(curve[:-1])


def _continuation(study, out: Path, left: float, durations: list[float], fits: int, halved: int = 0) -> tuple | None:
    """The last of the budget, where it holds less than two more trials of the median length but one epoch
    or more: spent training on the best trial so far, from its export (a new schedule over `fits` epochs),
    if it was still improving at its end; a new trial there would be shorter than the ones before it, and
    the best one asks for more training. At half its batch (twice the updates an epoch, as trial 1 after
    an improving trial 0) where the batch is searched, the space holds half of it and `halved` (the
    epochs that fit at half the batch) is one or more. (The trial, its settings, its epochs in all, the
    planned cost of its epoch against the measured ones), or None."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete or fits == 0 or not durations or left >= 2 * sorted(durations)[len(durations) // 2]:
        return None
    if any(t.state == optuna.trial.TrialState.WAITING for t in study.trials):  # a queued trial runs first
        return None
    best = study.best_trial
    settings = best.user_attrs.get(SETTINGS)
    if not best.user_attrs.get(IMPROVING) or not settings or not (out / f"{TRIAL_PREFIX}{best.number}" / MODEL).is_dir():
        return None
    ended = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    if any(t.user_attrs.get(EXTENDS) == best.number and t.state in ended for t in study.trials):
        return None  # continued once already, and that did not beat it: the same again would not either
    kept = {k: v for k, v in settings.items() if k != "num_train_epochs"}
    batch = kept.get("per_device_train_batch_size")
    if halved > 0 and batch is not None and batch % 2 == 0 and batch // 2 in BATCHES:
        return best.number, {**kept, "per_device_train_batch_size": batch // 2}, settings.get("num_train_epochs", 0), \
            HALF_BATCH_EPOCH
    return best.number, kept, settings.get("num_train_epochs", 0), 1.0


def _guide_trial_1(study, own: dict[str, Any], curve: list[float], greater_is_better: bool, fits: int) -> None:
    """After the recipe's own trial: the next trial is its settings with the change its curve points to
    (`the_next_step`), with no more epochs than the time left holds; once in a study."""
    step = None if fits == 0 else the_next_step(own, curve, greater_is_better)
    if step is None or any(t.user_attrs.get(GUIDED) for t in study.trials):
        return
    settings = {**own, **step[0]}
    if "num_train_epochs" in settings:
        settings["num_train_epochs"] = min(settings["num_train_epochs"], fits)
    study.enqueue_trial(settings, user_attrs={GUIDED: step[1]})


def _run_again_what_was_stopped(study) -> None:
    """Trials that a signal stopped (FAIL), or that a killed process left running: each runs again, once,
    with its settings (the recipe's own trial as the recipe runs), so that a continued search still ends
    with at least the recipe's model. A trial left running is closed as failed first."""
    import optuna

    again = {t.user_attrs.get(RERUN_OF) for t in study.trials}
    for t in study.trials:
        if t.state not in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL) or t.number in again:
            continue
        if t.user_attrs.get(EXTENDS) is not None:  # a continuation: decided again from the trials' state
            if t.state == optuna.trial.TrialState.RUNNING:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            continue
        if t.state == optuna.trial.TrialState.RUNNING:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={**{k: v for k, v in t.user_attrs.items() if k == RECIPE},
                                                  RERUN_OF: t.number})  # fmt: skip


def epochs_that_fit(left: float, durations: list[float], epoch_seconds: list[float], by_epochs: bool,
                    slower: float = 1.0, most: int = MAX_EPOCHS) -> int:
    """How many epochs the next trial may have (0: start none). No trial starts that is expected to
    outrun the time left: where the epochs are searched, one of more epochs than the time left holds at
    the median wall time per epoch of the trials so far (times `slower`, for a continuation at half the
    batch); else one as long as the median trial."""
    if left <= 0:
        return 0
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    if by_epochs and epoch_seconds:
        return min(most, int(left // (median(epoch_seconds) * slower)))
    return most if not durations or left >= median(durations) else 0


def _resolved(cfg: TrainConfig, said: checks.Said) -> tuple[TrainConfig, int]:
    """The recipe with its task and problem type read from the data (the space and the metric depend on
    them), and its training samples."""
    from finetune.data import load_splits, read_splits  # datasets, torch: not for --help
    from finetune.problems import problem_type_of

    read = read_splits(cfg.data_args, said)
    if cfg.task is None:
        cfg = resolved(cfg, said, task=task_for_data(read["train"].features, cfg.data_args))
    raw, _ = load_splits(cfg.data_args, said, read)
    return resolved(cfg, said, problem_type=problem_type_of(raw["train"], cfg.task)), len(raw["train"])


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


def _finish(out: Path, study, recipe: str | None, overrides: list[str], started: float, budget: float,
            said: checks.Said) -> dict:  # fmt: skip
    import optuna

    from finetune.digests import sha256_of

    seconds = round(time.monotonic() - started, 1)
    ran = [t for t in study.trials if t.state != optuna.trial.TrialState.WAITING]  # not the queued next one
    complete = [t for t in ran if t.state == optuna.trial.TrialState.COMPLETE]
    checks.gate(tools.SEARCH_END, len(complete), len(ran), seconds, budget)
    best = study.best_trial
    params = best.user_attrs.get(SETTINGS) or best.params  # a continuation's: its first trial's, all its epochs
    source = load_config(recipe, overrides, said=said).to_dict()
    settings = {**{k: v for k, v in source.items() if v is not None}, **params, "output_dir": str(out / "best-run")}
    continued = best.user_attrs.get(EXTENDS)
    note = ""
    if continued is not None:
        first = study.trials[continued].user_attrs.get(SETTINGS) or {}
        key = "per_device_train_batch_size"
        changed = (f" at batch {params.get(key)} (trial {continued}'s was {first.get(key)})"
                   if first.get(key) != params.get(key) else "")  # fmt: skip
        note = (f"# Trial {best.number} trained on from trial {continued}'s export, a new schedule over its epochs"
                f"{changed}; this recipe trains all of them in one schedule at the continuation's settings.\n")
    (out / BEST_RECIPE).write_text(
        f"# accelerate launch finetune/run.py --config {out / BEST_RECIPE}\n"
        f"# The best of {len(ran)} trials of finetune.search (trial {best.number}, validation value "
        f"{best.value:.4f}): the recipe with the trial's settings.\n" + note + yaml.safe_dump(settings, sort_keys=False)
    )  # its sha256 goes into search.json: a continued search refuses to write over one edited since
    best_model, model = RunDir(out / f"{TRIAL_PREFIX}{best.number}").model, RunDir(out).model
    if best_model.is_dir():  # copied whole beside it first: a full disk leaves the earlier model/, no half copy
        staged = out / f".{MODEL}-new"
        shutil.rmtree(staged, ignore_errors=True)
        on_failure(lambda: shutil.rmtree(staged, ignore_errors=True))
        shutil.copytree(best_model, staged)
        shutil.rmtree(model, ignore_errors=True)
        os.replace(staged, model)
    cut = sum(bool(t.user_attrs.get(CUT)) for t in study.trials)
    record = {"best_trial": best.number, "value": best.value, "params": params, "trials": len(ran),
              "continues": continued,
              "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
              "cut_at_budget": cut, "seconds": seconds, "budget_s": budget,
              "over_budget_s": round(max(0.0, seconds - budget), 1),
              "best_recipe_sha256": sha256_of(out / BEST_RECIPE)}  # fmt: skip
    (out / SEARCH_RECORD).write_text(json.dumps(record, indent=2))
    print(f"best: trial {best.number}, validation {best.value:.4f} with {params}; model in {model}, "
          f"recipe {out / BEST_RECIPE} ({record['trials']} trials, {record['pruned']} pruned, {cut} of them cut "
          f"at the budget; wall time {seconds} s of a {budget:g} s budget)")
    print(against_the_recipe(study, best))
    learned = read_record(RunDir(out / f"{TRIAL_PREFIX}{best.number}").results).get("learned") or {}
    base_steps = source.get("max_steps") is not None  # the trials' length, which epochs do not change
    checks.gate(tools.SEARCH_VERDICT, learned, base_steps, said=said)  # every trial at the baseline: no model either
    return record


def against_the_recipe(study, best) -> str:
    """The end line's comparison of the best trial with the recipe as written (trial 0, or its run again)."""
    import optuna

    own = [t for t in study.trials if t.user_attrs.get(RECIPE) and t.state == optuna.trial.TrialState.COMPLETE]
    if not own:
        return "the recipe as written (trial 0) did not finish: the best trial is not compared with it"
    recipe = own[-1]
    if recipe.number == best.number:
        return f"the recipe as written (trial {recipe.number}) is the best trial: validation {recipe.value:.4f}"
    return (f"against the recipe as written (trial {recipe.number}, validation {recipe.value:.4f}): the best trial "
            f"{best.value - recipe.value:+.4f}")


def duration(text: str) -> float:
    """--budget: seconds, or a number with s, m or h after it (30m, 1.5h)."""
    import re

    found = re.fullmatch(r"\s*([-+]?(?:(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|inf|nan))\s*(s|m|min|h)?\s*", text, re.I)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give seconds (1800) or 30m, 2h")
    return float(found[1]) * {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}[(found[2] or "").lower() or None]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(prog="finetune.search", description=__doc__, hint="see --help")
    parser.add_argument("--config", metavar="PATH", help="the recipe to search around (default: the MiniLM recipe)")
    parser.add_argument("--budget", type=duration, required=True,
                        help="wall-clock seconds (1800), or minutes or hours (30m, 2h): no trial starts after them")
    parser.add_argument("--trials", type=int, metavar="N",
                        help="at most N trials in this command: a continued search adds up to N more to its study "
                        "(default: as many as the budget allows)")  # fmt: skip
    parser.add_argument("--space", default=",".join(SPACE), help=f"settings to search, of {', '.join(SPACE)}")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="fixed settings of the recipe")
    args = parser.parse_intermixed_args(settings_from_flags(argv))
    args.space = [s.strip() for s in args.space.split(",") if s.strip()]  # "learning_rate, warmup_ratio," too
    checks.gate(tools.SEARCH_ARGS, args, SPACE)
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict:
    from finetune.runtime import end_processes  # torch: only once the command line parsed

    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_outside_the_loop()
    record = search(args.config, args.settings, args.budget, args.space, args.trials)
    end_processes()
    return record


if __name__ == "__main__":
    main()
