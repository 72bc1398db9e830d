"""Tools: the run's verdict, and the tools around a run: the search (finetune/search.py), the check of
accumulation and DDP (finetune/verify.py), the pictures (finetune/plots.py), the model card and the
upload to the Hub (finetune/card.py).

    VERDICT         whether the run learned beyond a trivial baseline (finetune/verdict.py's `judge`)
    PREDICTED       the classes or labels validation never saw predicted
    SEARCH_ARGS     --space, --budget, --trials, and a setting a search cannot take
    SPACE           a --space of which nothing, or a part named, applies to this run
    SEARCH_FOLDER   the search's output_dir: a file, another run's or the user's files, an edited best_recipe
    STUDY_CHANGED   a study continued with another space or other settings
    STUDY_FAILED    a study.db SQLite cannot read
    SEARCH_*        what a search says as it goes and at its end
    VERIFY_*        finetune.verify's batch, dropout, data, --keep and the steps it ran
    METRICS_*       the plots CLI's metrics.jsonl: not there, a folder, unreadable
    NO_RECORDS      a metrics.jsonl without a record: not a run's log, or one too young
    PICTURE         the plots CLI's picture
    GLYPHS          a title or label in a script matplotlib's font lacks
    HUB_*           the model card's upload
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.checks import rule
from finetune.errors import first_line
from finetune.layout import BEST_RECIPE, METRICS_LOG, STUDY, RunDir
from finetune.metrics import CHOICES, FEWEST_TO_JUDGE, MULTI

# --- the run's verdict -----------------------------------------------------------------------------------


@rule("tools.did_not_learn", warning=True)
def did_not_learn(learned: dict, said_before: list[str] = (), streaming: bool = False) -> str | None:
    """The best validation value of the judged metric is not clearly beyond a trivial baseline's (a model
    that predicts the same for every input; for plain tags, each word's most frequent training tag): the run
    learned nothing worth keeping. Its card says so too. Where the run said that the training texts were cut
    at max_length, the line says that the model read only their start, and how to read more (windows for
    single texts; a larger max_length for sentence pairs, which windows do not read). `learned`: the facts
    of finetune/verdict.py's `judge`."""
    if not learned.get("warn") or learned.get("verdict") is not False:
        return None
    baseline = learned["baseline"]
    line = (f"the model did not learn beyond a trivial baseline: best validation {learned['shown']} "
            f"{learned['value']:.4f}{learned['at']}, against {baseline if baseline is None else round(baseline, 4)} "
            f"for {learned['baseline_model']} (the training labels' {learned['trivial']}); ")
    if learned["spread"] > 100:
        line += (f"targets that spread over about {learned['spread']:.3g} train slowly from a head that starts near 0: "
                 "scale them (divide by their spread, or standardize) and scale the predictions back; also ")
    line += ("try more epochs or more data, a learning_rate 3-10x higher or lower, or a larger pretrained model "
             "(docs/your-own-data.md)")
    if "inputs.texts_cut" in said_before:
        line += ("; the training texts were cut at max_length (said above): the model read only their start, "
                 "raise max_length" + ("" if streaming else
                                       " or read them whole in windows (text_windows, a quarter of max_length, say)"))
    elif "inputs.pairs_cut" in said_before:
        line += ("; the training sentence pairs were cut at max_length (said above): the model read only their "
                 "start, raise max_length")
    return line


@rule("tools.too_few_to_judge", warning=True)
def too_few_to_judge(learned: dict, said_before: list[str] = (), streaming: bool = False) -> str | None:
    """A validation split too small to tell whether the model learned: under 10 samples (questions, words),
    or so few that not even a perfect score would be clearly above the baseline's (a stream holds no share out)."""
    if not learned.get("warn") or learned.get("verdict") is not None:
        return None
    n, more = learned["n"], "give a larger validation_file" + ("" if streaming else " or validation_split_percentage")
    counted = learned["counted"] if n != 1 else learned["counted"][:-1]  # 1 sample, 1 question, 1 word
    if not learned["unreachable"]:
        return f"validation has {n} {counted}, too few to tell whether the model learned (at least {FEWEST_TO_JUDGE}); {more}"
    return (f"validation has {n} {counted}, too few to tell whether the model learned: against the trivial baseline's "
            f"{learned['baseline']:.4f} (the training labels' {learned['trivial']}), not even a perfect {learned['shown']} "
            f"would be clearly above it; best validation {learned['shown']} {learned['value']:.4f}{learned['at']}; {more}")


VERDICT = [did_not_learn, too_few_to_judge]


@rule("tools.never_predicted", warning=True)
def never_predicted(never: list[str], label_names: list[str], problem_type: str | None) -> str | None:
    """Classes (or multi-label labels) the validation predictions never chose: rare ones the model has not
    learned to tell. Not said of multiple choice: a place among the candidates is no class of the data."""
    if not never or problem_type == CHOICES:
        return None
    what = "labels" if problem_type == MULTI else "classes"
    shown = ", ".join(map(repr, never[:5])) + (", ..." if len(never) > 5 else "")
    return (f"{len(never)} of {len(label_names)} {what} were never predicted on validation ({shown}); rare ones "
            "need more examples, class_weights=balanced, or more training")


PREDICTED = [never_predicted]


# --- the search: its command line ------------------------------------------------------------------------


@rule("tools.unknown_space")
def unknown_space(args: Any, whole: tuple[str, ...]) -> str | None:
    """--space names a setting the search cannot search."""
    unknown = [s for s in args.space if s not in whole]
    if unknown:
        return f"--space: {', '.join(unknown)} cannot be searched; choose among {', '.join(whole)}"
    return None


@rule("tools.budget")
def budget(args: Any, whole: tuple[str, ...]) -> str | None:
    """--budget that is not a positive, finite number of seconds (nan and inf too: a search without an end)."""
    if not 0 < args.budget < float("inf"):
        return f"--budget must be a positive, finite number of seconds, got {args.budget}"
    return None


@rule("tools.trials")
def trials(args: Any, whole: tuple[str, ...]) -> str | None:
    """--trials below 1."""
    if args.trials is not None and args.trials < 1:
        return f"--trials must be at least 1, got {args.trials}"
    return None


@rule("tools.resume_in_search")
def resume_in_search(args: Any, whole: tuple[str, ...]) -> str | None:
    """resume_from_checkpoint given to a search: each trial is a run of the search's own, which it resumes
    itself; a search is continued by running the same command again."""
    resume = next((s for s in args.settings if s.partition("=")[0].strip() == "resume_from_checkpoint"), None)
    if resume is not None:
        return (f"{resume} is not a setting of a search: to continue one, run the same command again with "
                "the same output_dir (its study goes on, and a trial cut short starts again)")
    return None


SEARCH_ARGS = [unknown_space, budget, trials, resume_in_search]


@dataclass
class Space:
    """The settings a search was asked to search (`asked`), of all it can (`whole`), for this run."""

    asked: list[str]
    whole: tuple[str, ...]
    cfg: Any  # the resolved TrainConfig
    layers: int  # the model's encoder layers (0: not known)

    def applies(self) -> dict[str, bool]:
        """The settings that apply to some runs only, and whether they do to this one."""
        return {"tune_threshold": self.cfg.problem_type == MULTI,
                "freeze_layers": self.layers > 1 and self.cfg.peft is None,
                "num_train_epochs": self.cfg.max_steps is None}  # fmt: skip


@rule("tools.space_applies_to_nothing")
def space_applies_to_nothing(s: Space) -> str | None:
    """A --space of which nothing applies to this run: the search would repeat one trial until the budget
    is spent."""
    only = s.applies()
    if not any(only.get(name, True) for name in s.asked):
        return (f"--space {','.join(s.asked)}: nothing in it applies to this run (tune_threshold is for multi-label "
                "runs, freeze_layers for models of 2 or more layers without peft, num_train_epochs for runs without "
                "max_steps); add learning_rate, per_device_train_batch_size or warmup_ratio")
    return None


@rule("tools.space_does_not_apply")
def space_does_not_apply(s: Space) -> str | None:
    """tune_threshold or freeze_layers named in --space for a run they do not apply to: dropped without a
    word otherwise."""
    only = s.applies()
    named = [name for name in s.asked if name in ("tune_threshold", "freeze_layers") and not only[name]]
    if named and sorted(s.asked) != sorted(s.whole):
        why = {"tune_threshold": "tune_threshold is for multi-label runs",
               "freeze_layers": "freeze_layers is for models of 2 or more layers without peft"}  # fmt: skip
        return (f"--space {','.join(s.asked)}: {'; '.join(why[n] for n in named)}, which this run is not; "
                f"leave {' and '.join(named)} out of --space")
    return None


SPACE = [space_applies_to_nothing, space_does_not_apply]


# --- the search: its folder and study --------------------------------------------------------------------


@dataclass
class SearchFolder:
    """A search's output_dir, and its best_recipe.yaml's sha256 as search.json recorded it and as it is."""

    out: Path
    wrote: str | None = None  # search.json's best_recipe_sha256
    found: str | None = None  # best_recipe.yaml's sha256 now; None: there is none
    recorded: bool = False  # search.json is there


@rule("tools.search_folder_is_a_file")
def search_folder_is_a_file(f: SearchFolder) -> str | None:
    """The search's output_dir is a file."""
    if f.out.exists() and not f.out.is_dir():
        return f"output_dir {f.out} is a file, not a folder; choose another output_dir"
    return None


@rule("tools.search_folder_not_a_search")
def search_folder_not_a_search(f: SearchFolder) -> str | None:
    """A search's output_dir that holds files and no study (a training run, the user's files): a search
    would write its trials and model/ there, so it is refused, not written over."""
    if f.out.is_dir() and not (f.out / STUDY).is_file() and any(f.out.iterdir()):
        what = "a training run" if RunDir(f.out).holds_run() else "files"
        return (f"output_dir {f.out} holds {what} and no search ({STUDY}); a search would write its trials and model/ "
                "there: choose an empty or new output_dir (the same output_dir again continues a search)")
    return None


@rule("tools.best_recipe_edited")
def best_recipe_edited(f: SearchFolder) -> str | None:
    """best_recipe.yaml edited since the search wrote it: continuing the search writes it again at its end,
    and the user's edits would be lost."""
    if f.found is not None and f.wrote != f.found and (f.wrote is not None or not f.recorded):
        recipe = f.out / BEST_RECIPE
        return (f"{recipe} is not the one this search wrote (edited since?), and continuing the search writes it "
                "again at its end: copy it out of the search's folder (or rename it), then run the same command")
    return None


SEARCH_FOLDER = [search_folder_is_a_file, search_folder_not_a_search, best_recipe_edited]


@dataclass
class Study:
    """A study continued: the space and the settings it was made with (None: a new one), and this run's."""

    output_dir: str
    space: list[str]
    searched: list[str] | None  # the study's space
    made: dict | None  # the study's fixed settings
    fixed: dict  # this run's (the searched ones and the housekeeping left out)
    housekeeping: tuple[str, ...]  # settings a study continues across (where and how a run reports)
    trained_on: dict | None = None  # the training data's fingerprint when the study began (None: older studies)
    data: dict | None = None  # the training data's fingerprint now


@rule("tools.study_other_space")
def study_other_space(s: Study) -> str | None:
    """A study continued with another --space: its trials' values would not be comparable."""
    if s.made is not None and s.searched is not None and sorted(s.searched) != sorted(s.space):
        return (f"output_dir {s.output_dir} holds a search over --space {','.join(s.searched)}, not "
                f"{','.join(s.space)}; continue it with --space {','.join(s.searched)}, or give a new output_dir")
    return None


@rule("tools.study_other_settings")
def study_other_settings(s: Study) -> str | None:
    """A study continued with other settings than it was made with (the searched ones aside): its trials'
    values are comparable only on the same data and recipe."""
    if s.made is None:
        return None
    keys = sorted({*s.made, *s.fixed} - set(s.housekeeping))  # older studies kept the housekeeping
    differ = [k for k in keys if s.made.get(k) != s.fixed.get(k)]
    if not differ:
        return None
    shown = "; ".join(f"{k} was {s.made.get(k)!r}, now {s.fixed.get(k)!r}" for k in differ[:3])
    return (f"output_dir {s.output_dir} holds a search made with other settings ({shown}); continue it with the "
            "same settings, or give a new output_dir")


@rule("tools.study_other_training_data")
def study_other_training_data(s: Study) -> str | None:
    """A study continued on a training file edited in place since it began (same name, other bytes): its
    trials so far trained on other data, so their values are no longer comparable with the next ones."""
    if s.trained_on is None or s.data is None or s.trained_on == s.data:
        return None
    where = s.fixed.get("train_file") or s.fixed.get("data_dir")
    return (f"output_dir {s.output_dir} holds a search whose trials trained on other bytes of {where} (it changed "
            "since the study began); put the file back as it was to continue the search, or give a new output_dir "
            "for a search on the data as it is now")


STUDY_CHANGED = [study_other_space, study_other_settings, study_other_training_data]


@rule("tools.study_damaged")
def study_damaged(path: Path, error: Exception) -> str | None:
    """A study.db that is no database SQLite can read (cut short, overwritten, not SQLite at all): refused,
    and left as it is. Not another database error (a locked or unreadable file, a full disk)."""
    import sqlite3

    cause = getattr(error, "orig", None)
    name = getattr(cause, "sqlite_errorname", "") if isinstance(cause, sqlite3.DatabaseError) else ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return (f"{path} is damaged, not a readable optuna study ({cause}); restore it from a "
                "copy, or give a new output_dir (the trials' logs stay in this one's trial-N folders)")
    return None


STUDY_FAILED = [study_damaged]


# --- the search: as it goes, and its end -----------------------------------------------------------------


@rule("tools.epochs_not_searched", warning=True)
def epochs_not_searched(max_steps: int | None, space: list[str], streaming: bool = False) -> str | None:
    """num_train_epochs in the space of a recipe with max_steps: max_steps decides each trial's length, so
    the epochs would change nothing (said, not dropped). A streamed run needs max_steps: its epochs are not
    searched at all."""
    if max_steps is not None and "num_train_epochs" in space:
        how = ("a streamed run needs it, so leave num_train_epochs out of the space" if streaming else
               "to search it, set max_steps=null")  # fmt: skip
        return f"max_steps={max_steps} decides each trial's length, so num_train_epochs is not searched; {how}"
    return None


SEARCH_EPOCHS = [epochs_not_searched]


@rule("tools.overwrite_continues_study", warning=True)
def overwrite_continues_study(overwrite: bool, new: bool, path: Path) -> str | None:
    """overwrite_output_dir=true on a search's folder that holds a study: a search never deletes its study,
    it continues it."""
    if overwrite and not new:
        return (f"overwrite_output_dir=true does not start a search over: this one continues the study in "
                f"{path}; to start over, give another output_dir (or move that study away)")
    return None


SEARCH_OVERWRITE = [overwrite_continues_study]


@rule("tools.outside_the_space", warning=True)
def outside_the_space(cfg: Any, space: list[str], own: dict[str, Any]) -> str | None:
    """A searched setting whose value (the recipe's, or the command line's) the space cannot hold: trial 0,
    the recipe's own settings, draws it instead, else the user's value would be dropped without a word."""
    outside = [name for name in space if name not in own and name != "tune_threshold"]
    if outside:
        shown = ", ".join(f"{name}={getattr(cfg, name)}" for name in outside)
        return (f"{shown}: outside what the search draws from (--help: its ranges), so trial 0, the recipe's own "
                f"settings, draws {'it' if len(outside) == 1 else 'them'} instead; to keep a value fixed, leave it "
                "out of --space")
    return None


SEARCH_TRIAL_0 = [outside_the_space]


@rule("tools.no_trial_finished")
def no_trial_finished(complete: int, ran: int, seconds: float, budget: float) -> str | None:
    """A search whose budget ended before any trial finished: there is no best trial to keep."""
    if not complete:
        return (f"no trial finished within the budget ({ran} started; wall time {seconds} s of a "
                f"{budget:g} s budget); give a larger --budget")
    return None


SEARCH_END = [no_trial_finished]


@rule("tools.best_trial_did_not_learn", warning=True)
def best_trial_did_not_learn(learned: dict, by_steps: bool) -> str | None:
    """Every trial at the trivial baseline: the best of them is no model either (the trials' own verdicts
    are not said; the search's end says this one)."""
    if learned.get("verdict") is not False:
        return None
    value, base = (learned.get(k) for k in ("value", "baseline"))
    shown = " against ".join(f"{v:.4f}" if isinstance(v, (int, float)) else "none" for v in (value, base))
    return (f"the best trial did not learn beyond the trivial baseline (validation {learned.get('metric')} {shown}); "
            f"a longer --budget, other settings (a learning_rate the space does not hold, more "
            f"{'steps: max_steps' if by_steps else 'epochs'}) or more data may; see docs/your-own-data.md")


SEARCH_VERDICT = [best_trial_did_not_learn]


# --- finetune.verify -------------------------------------------------------------------------------------


@rule("tools.verify_batch_of_one")
def verify_batch_of_one(split: int) -> str | None:
    """finetune.verify on a global batch of 1: it cannot be split into accumulation or processes, so there
    is nothing to compare."""
    if split == 1:
        return ("a global batch of 1 cannot be split into accumulation or processes, so there is "
                "nothing to compare; run with per_device_train_batch_size=8 (or any size above 1)")
    return None


VERIFY_BATCH = [verify_batch_of_one]


@rule("tools.verify_needs_dropout_off")
def verify_needs_dropout_off(cfg: Any, keys: set[str]) -> str | None:
    """finetune.verify of a pretrained model where the config has no `dropout` key: dropout draws differ
    between the variants, and this version can turn it off only in a model built from model_config."""
    if "dropout" not in keys and cfg.model_config is None:
        return (f"verify needs dropout off, and this version can only turn it off for a model built from "
                f"model_config, not for the pretrained '{cfg.model_name_or_path}' (it needs the `dropout` config "
                "key); verify the same architecture from a config instead, e.g. model_config={model_type: bert, ...}")
    return None


VERIFY_DROPOUT = [verify_needs_dropout_off]


@rule("tools.verify_data_too_small")
def verify_data_too_small(error: Exception) -> str | None:
    """finetune.verify's accumulation variant takes more batches a step than an epoch of the training data
    holds (launch.accumulation_over_epoch, said in the check's words)."""
    if getattr(error, "rule", None) == "launch.accumulation_over_epoch":
        return ("the training data is too small for finetune.verify: its accumulation variant takes "
                f"{str(error).split(' exceeds')[0]} batches a step, more than an epoch holds; give more training data "
                "(or a smaller per_device_train_batch_size)")
    return None


VERIFY_VARIANT_FAILED = [verify_data_too_small]


@rule("tools.verify_keep_is_a_file")
def verify_keep_is_a_file(keep: str | None) -> str | None:
    """--keep names a file: the runs are kept in a folder."""
    if keep is not None and Path(keep).exists() and not Path(keep).is_dir():
        return f"--keep {keep} is a file; give a folder for the runs"
    return None


@rule("tools.verify_keep_not_empty")
def verify_keep_not_empty(keep: str | None) -> str | None:
    """--keep names a folder that already holds something (an earlier verify's runs, a training run, the
    user's own files): verify writes its runs there (one_big_batch/, accumulation/, DDP/) and would replace
    or mix into what is there, so only an empty or new folder is taken, before anything runs."""
    if keep is None or not Path(keep).is_dir():
        return None
    try:
        held = sorted(Path(keep).iterdir())
    except OSError as e:  # a folder it cannot list it cannot write into either
        return f"--keep {keep} cannot be read ({e.strerror or e}); give an empty or new folder for the runs"
    if not held:
        return None
    named = ", ".join(f"{p.name}/" if p.is_dir() else p.name for p in held[:3])
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return (f"--keep {keep} already holds {named}{more}, which verify's runs would replace or mix with; "
            "give an empty or new folder (e.g. a new name beside it)")


VERIFY_KEEP = [verify_keep_is_a_file, verify_keep_not_empty]


@rule("tools.verify_fewer_steps", warning=True)
def verify_fewer_steps(ran: int, steps: int, samples: int) -> str | None:
    """The training data gave fewer samples than finetune.verify takes (after a held-out share): the last
    step's short window was not checked."""
    if ran < steps:
        return (f"the training data gave fewer than the check's {samples} samples: each variant ran {ran} "
                f"optimizer step(s), not {steps}, so the last step's short window was not checked; give more "
                f"training data, or --steps {ran}")
    return None


VERIFY_STEPS = [verify_fewer_steps]


# --- the plots CLI ---------------------------------------------------------------------------------------


@rule("tools.metrics_not_found")
def metrics_not_found(metrics: Path) -> str | None:
    """The metrics.jsonl given to `python -m finetune.plots` is not there."""
    if not metrics.exists():
        return f"{metrics} does not exist; give a run's {METRICS_LOG} (<output_dir>/{METRICS_LOG})"
    return None


@rule("tools.metrics_is_a_folder")
def metrics_is_a_folder(metrics: Path) -> str | None:
    """A folder given as metrics.jsonl (the run's folder: the line names its metrics.jsonl)."""
    if metrics.is_dir():
        hint = f": did you mean {RunDir(metrics).metrics}?" if RunDir(metrics).metrics.is_file() else ""
        return f"{metrics} is a folder, not a {METRICS_LOG} file{hint}"
    return None


METRICS_FILE = [metrics_not_found, metrics_is_a_folder]


@rule("tools.metrics_not_text")
def metrics_not_text(metrics: Path, error: Exception) -> str | None:
    """A metrics.jsonl that is not text (a picture, a checkpoint's weights)."""
    if isinstance(error, UnicodeDecodeError):
        return f"{metrics} is not a text file; give a run's {METRICS_LOG} (one JSON record a line)"
    return None


@rule("tools.metrics_unreadable")
def metrics_unreadable(metrics: Path, error: Exception) -> str | None:
    """A metrics.jsonl the process cannot read (permissions, a failing disk). Always answers."""
    return f"cannot read {metrics}: {getattr(error, 'strerror', None) or error}"


METRICS_UNREADABLE = [metrics_not_text, metrics_unreadable]


def _not_a_metrics_log(metrics: Path) -> str | None:
    """Why a file without records is not a run's log at all (a data CSV, a dataset's JSON Lines), or None
    for a log a run has not written a record to yet. A run writes `{"step": ...}` first on every line: its
    first line is such a record, or one torn by a kill (it starts with `{`), or the file is still empty."""
    with metrics.open() as f:
        first = next((line.strip() for line in f if line.strip()), None)
    if first is None:
        return None
    if first == "{" and metrics.stat().st_size < 2**24:  # a JSON document over many lines: an evaluation's metrics.json?
        try:
            whole = json.loads(metrics.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            whole = None
        if isinstance(whole, dict):
            return "it is one JSON document over many lines, such as an evaluation's metrics.json, not a record a line"
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return None if first.startswith("{") else "its first line is not a JSON record"
    if not isinstance(record, dict):
        return "its first line is not a JSON record"
    if "step" not in record:
        return 'its first record has no "step": a run writes one on every line'
    return None


@rule("tools.not_a_metrics_log")
def not_a_metrics_log(metrics: Path) -> str | None:
    """A file without records that is not a run's log at all: a data CSV, a dataset's JSON Lines, an
    evaluation's metrics.json."""
    why = _not_a_metrics_log(metrics)
    if why:
        return f"{metrics} is not a run's {METRICS_LOG} ({why}); give a run's {METRICS_LOG} (<output_dir>/{METRICS_LOG})"
    return None


@rule("tools.no_records_yet")
def no_records_yet(metrics: Path) -> str | None:
    """A run's metrics.jsonl without a record yet (a run writes its first at its first logging step).
    Always answers."""
    return (f"{metrics} holds no training or evaluation records yet (one JSON object a line, with its step): a run "
            "writes its first at its first logging step; draw it again later")


NO_RECORDS = [not_a_metrics_log, no_records_yet]


@rule("tools.picture_is_a_folder")
def picture_is_a_folder(out: Path) -> str | None:
    """The picture's path is a folder."""
    if out.is_dir():
        return f"{out} is a folder; give the picture's file name ({RunDir(out).curves})"
    return None


@rule("tools.picture_under_a_file")
def picture_under_a_file(out: Path) -> str | None:
    """The picture's path goes through a file, as if it were a folder."""
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        return f"cannot write {out}: {above} is a file, not a folder"
    return None


@rule("tools.picture_format")
def picture_format(out: Path) -> str | None:
    """The picture's suffix is not a format matplotlib writes."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if out.suffix and out.suffix[1:].lower() not in formats:
        return f"cannot write {out}: '{out.suffix}' is not a picture format; use .png (or {', '.join(sorted(formats))})"
    return None


@rule("tools.picture_inside_a_run")
def picture_inside_a_run(out: Path) -> str | None:
    """The picture inside a run's checkpoints/, model/ or adapter/, which the run replaces or deletes whole
    (checkpoint retention, an export, an overwrite)."""
    for folder in out.resolve().parents:
        run = RunDir(folder.parent)
        if folder in (run.checkpoints, run.model, run.adapter) and run.is_run():
            return (f"cannot write {out}: it is inside {folder}, which the run replaces or deletes whole "
                    f"(checkpoint retention, an export, an overwrite); write it beside the run ({run.curves})")
    return None


def _drawn_by_matplotlib(path: Path) -> bool:
    """Whether a picture file was drawn by matplotlib (this app's curves, or another plot): its PNG Software
    text, its PDF producer, its SVG comment name it in the first 64 KiB. A photo or a user's file does not."""
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return b"matplotlib" in head.lower()


@rule("tools.picture_not_ours")
def picture_not_ours(out: Path) -> str | None:
    """A file at the picture's path that matplotlib did not draw (a photo, the user's own file): left as it
    is."""
    if out.is_file() and not _drawn_by_matplotlib(out):
        return (f"{out} exists and is not a picture drawn here (matplotlib's); it is left as it is: give "
                "another file name, or move it away first")
    return None


PICTURE = [picture_is_a_folder, picture_under_a_file, picture_format, picture_inside_a_run, picture_not_ours]


@rule("tools.missing_glyphs", warning=True)
def missing_glyphs(name: str, missing: int) -> str | None:
    """A run or class name in a script matplotlib's font lacks (CJK, emoji): those characters show as boxes
    in the picture. One line for matplotlib's warning per glyph."""
    if missing:
        return f"matplotlib's font has no glyph for some characters of a title or label; they show as boxes in {name}"
    return None


GLYPHS = [missing_glyphs]


# --- the Hub ---------------------------------------------------------------------------------------------


@rule("tools.hub_offline")
def hub_offline(repo_id: str, export_dir: Path | str, offline: bool) -> str | None:
    """A push to the Hub asked for with the Hub switched off (HF_HUB_OFFLINE): refused when the run starts,
    before any network access, not after training."""
    if offline:
        return (f"cannot push to the Hub repo '{repo_id}': HF_HUB_OFFLINE is set, so there is no network "
                f"access; unset it and run again, or upload later with `hf upload {repo_id} {export_dir}`")
    return None


HUB_ACCESS = [hub_offline]


@rule("tools.not_an_export")
def not_an_export(export_dir: Path) -> str | None:
    """A folder to push that is not an exported model (no config.json)."""
    if not (export_dir / "config.json").is_file():
        return f"{export_dir} is not an exported model (no config.json); nothing to push"
    return None


HUB_EXPORT = [not_an_export]


@rule("tools.hub_not_logged_in")
def hub_not_logged_in(repo_id: str, error: Exception) -> str | None:
    """A push without a Hub token (no `hf auth login`, no HF_TOKEN)."""
    from huggingface_hub.errors import LocalTokenNotFoundError

    if isinstance(error, LocalTokenNotFoundError):
        return f"cannot push to '{repo_id}': not logged in to the Hub; run `hf auth login` or set HF_TOKEN"
    return None


@rule("tools.hub_push_failed")
def hub_push_failed(repo_id: str, error: Exception) -> str | None:
    """The Hub refused the push (a repo name it does not take, no write access) or could not be reached:
    its reason, on one line. Always answers."""
    return f"cannot push to the Hub repo '{repo_id}': {first_line(error)}"


HUB_PUSH_FAILED = [hub_not_logged_in, hub_push_failed]
