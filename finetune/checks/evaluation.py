"""Evaluation: what is evaluated and on what (finetune/evaluate_checkpoint.py asks these, in this order).

    COMMAND, DATA_ARGS  the command line: argparse's refusals, a second model, --data not there, --split of a file
    PATH, NOT_A_MODEL   the path given: not there, a file, a run directory, its checkpoints/ folder, an adapter
    CHECKPOINT          a training-state checkpoint: its COMPLETE marker, manifest.json, labels, run config
    EXPORT_ALONE        an export whose run's results.json and config.yaml beside it are damaged, another's, gone;
                        a search's best model, whose run is its best trial's
    SETTINGS            the key=value evaluation settings against the model (EVAL_KEYS, label_columns, pairs)
    *_FAILED, WEIGHTS   the model that does not load: a damaged JSON file, foreign or NaN weights, FSDP shards
    SPLIT, DATA, ...    --data and --split, and the evaluated data's labels against the model's
    THRESHOLDS          config.json's multi_label_thresholds
    OUTPUT, WRITE_FAILED   the output folder of an evaluation, and a write of metrics.json that fails
    ONNX                --onnx: a model that is not a run's export, ONNX files not made yet
    ONNX_GIVEN, ONNX_EXPORT  ONNX files given as the model: a file of another precision than --onnx; no export
    ONNX_WEIGHTS        --onnx: ONNX files made from other weights than the export's (their recorded sha256)

What a rule needs comes in its subject: paths, the run's raw files (`ExportRun`), the DataArgs, a dataset.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.checks import rule
from finetune.checks.labels import number_as_written
from finetune.checks.splits import another_scale
from finetune.errors import first_line, remedy
from finetune.formats import is_list
from finetune.layout import (
    ADAPTER,
    BEST_RECIPE,
    CHECKPOINTS,
    COMPLETE,
    MANIFEST,
    MODEL,
    PREFIX,
    SEARCH_RECORD,
    STUDY,
    TRIAL_PREFIX,
    RunDir,
    is_hub_name,
    read_record,
)
from finetune.metrics import MULTI, REGRESSION, SINGLE
from finetune.text import pasted

WEIGHTS = "model.safetensors"  # what Accelerate's save_state writes for a (non-sharded) model
ANOTHER = "evaluate another checkpoint of the run, or its export (<run>/model)"

# --- the command line ---------------------------------------------------------------------------------------


@rule("evaluation.arguments")
def arguments(message: str) -> str:
    """argparse's refusal (an unknown option, a flag without its value): one line and exit status 2, like every
    other mistake, with where to look."""
    return f"{message} (see --help)"


COMMAND = [arguments]


@rule("evaluation.second_model")
def second_model(overrides: list[str]) -> str | None:
    """A second path where the `key=value` settings go: one command evaluates one model."""
    second = next((o for o in overrides if "=" not in o and Path(o).expanduser().exists()), None)
    if second is not None:
        return (f"{second} is a second model or checkpoint; one command evaluates one: run it again for "
                "each (settings after the checkpoint are key=value)")  # fmt: skip
    return None


SECOND = [second_model]


@rule("evaluation.data_not_found")
def data_not_found(data: str | None, split: str | None) -> str | None:
    """`--data` that names nothing on this machine."""
    if data is not None and not Path(data).expanduser().exists():
        return f"--data not found: {data}"
    return None


@rule("evaluation.split_of_a_file")
def split_of_a_file(data: str | None, split: str | None) -> str | None:
    """`--split` beside a `--data` file: a file is one set of data, with no splits to pick from."""
    if split is not None and data is not None and Path(data).expanduser().is_file():
        return "--split picks a split of the run's data or of a --data folder, not of a file"
    return None


DATA_ARGS = [data_not_found, split_of_a_file]

# --- what is evaluated --------------------------------------------------------------------------------------


@rule("evaluation.not_found")
def not_found(spec: str, path: Path, have_data: bool) -> str | None:
    """A path that is not there, unless it is a hub model's name given with the data to score it on."""
    if not path.exists() and (not is_hub_name(spec) or not have_data):
        return (f"checkpoint not found: {spec}; give <run>/checkpoints/step-N, <run>/model, "
                "or a hub model name with --data")
    return None


@rule("evaluation.a_file")
def a_file(spec: str, path: Path, have_data: bool) -> str | None:
    """A file given as the model: a model is a folder (or a hub name)."""
    if path.exists() and not path.is_dir():
        return (f"{spec} is a file; give a checkpoint directory (<run>/checkpoints/step-N), "
                "an export (<run>/model) or a hub model name")
    return None


PATH = [not_found, a_file]


@rule("evaluation.run_directory")
def run_directory(spec: str, path: Path, kind: str | None, newest: list[Path]) -> str | None:
    """A run's folder: it holds models (its export, its checkpoints), it is none."""
    if kind == "run":
        run = RunDir(path)
        return f"{spec} is a run directory; evaluate {run.model} (the final export) or one of {run.checkpoints}/{PREFIX}N"
    return None


@rule("evaluation.checkpoints_folder")
def checkpoints_folder(spec: str, path: Path, kind: str | None, newest: list[Path]) -> str | None:
    """A run's checkpoints/ folder (`newest`: its complete checkpoints, oldest first): which checkpoint? The
    newest is named."""
    if path.name != CHECKPOINTS or not RunDir(path.parent).holds_run():
        return None
    which = f" (the newest: {newest[-1]})" if newest else ""
    return f"{spec} is a run's folder of checkpoints; evaluate one of them{which}, or the run's export {RunDir(path.parent).model}"


@rule("evaluation.lora_adapter")
def lora_adapter(spec: str, path: Path, kind: str | None, newest: list[Path]) -> str | None:
    """A LoRA run's adapter alone: the export beside it is the whole model, the adapter merged in."""
    if path.name == ADAPTER and (path.parent / MODEL).is_dir():
        return (f"{spec} is a run's LoRA adapter, not a whole model; evaluate the export beside it, "
                f"{path.parent / MODEL} (the adapter merged into the model)")
    return None


@rule("evaluation.not_a_model")
def not_a_model(spec: str, path: Path, kind: str | None, newest: list[Path]) -> str:
    """A folder that is neither a training-state checkpoint nor an exported model."""
    return (f"{spec} is neither a training-state checkpoint (manifest.json, {COMPLETE}, {WEIGHTS}) "
            "nor an exported model (config.json and weights)")


NOT_A_MODEL = [run_directory, checkpoints_folder, lora_adapter, not_a_model]


@rule("evaluation.incomplete_checkpoint")
def incomplete_checkpoint(spec: str, path: Path) -> str | None:
    """A checkpoint without its COMPLETE marker: its save was cut short, its files may be half written."""
    if not (path / COMPLETE).is_file():
        return (f"{spec} is not a complete checkpoint (no {COMPLETE} marker); it "
                "was probably interrupted while saving: evaluate an earlier one or <run>/model")
    return None


@rule("evaluation.manifest_missing")
def manifest_missing(spec: str, path: Path) -> str | None:
    """A checkpoint saved whole, then its manifest.json lost: it cannot say what it holds."""
    if not (path / MANIFEST).is_file():
        return f"{path / MANIFEST} is missing: the checkpoint cannot say what it holds; evaluate an earlier one or <run>/model"
    return None


CHECKPOINT = [incomplete_checkpoint, manifest_missing]


@rule("evaluation.no_label_names")
def no_label_names(path: Path, manifest: dict) -> str | None:
    """A manifest without the label names: the weights hold no names, so the classes would be unknown."""
    if not manifest.get("label_names"):
        return f"{path / MANIFEST} has no label_names; it was not written by finetune.run"
    return None


LABELS = [no_label_names]


@rule("evaluation.task_contradicts")
def task_contradicts(task: str | None, trained: str, what: str) -> str | None:
    """`--task` that is not the task the run trained: a model's task is fixed with it."""
    if task is not None and task != trained:
        return f"--task {task} contradicts the {what}, a {trained} run"
    return None


TASK = [task_contradicts]


@rule("evaluation.no_run_config")
def no_run_config(raw: Any, where: str) -> str | None:
    """A manifest or config.yaml that holds no mapping of settings where the run's config should be."""
    if not isinstance(raw, dict):
        return f"{where} holds no run config; was it written by finetune.run?"
    return None


RUN_CONFIG = [no_run_config]


@rule("evaluation.run_config_fails")
def run_config_fails(where: str, error: Exception) -> str:
    """The run's config (its manifest's or config.yaml) that a settings rule refuses (an edit, another version
    of the app): said as that file's."""
    return f"the run config in {where} does not load: {error}"


RUN_CONFIG_FAILED = [run_config_fails]


# --- an export and its run's files beside it ------------------------------------------------------------------


def read_run_file(file: Path) -> tuple[dict | None, tuple[Path, str] | None]:
    """A run's results.json (JSON) or config.yaml (YAML) beside its export: its mapping, or None and
    (the file, what is wrong with it) when it does not parse (cut short, edited) or holds no mapping."""
    import yaml

    fmt = "JSON" if file.suffix == ".json" else "YAML"
    try:
        text = file.read_text()
        value = json.loads(text) if fmt == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
        return None, (file, f"not valid {fmt}: {first_line(e)}")
    if not isinstance(value, dict):
        return None, (file, f"not a {fmt} {'object' if fmt == 'JSON' else 'mapping'}: {type(value).__name__}")
    return value, None


@dataclass
class ExportRun:
    """An export (`<run>/model`) and its run one level up, as read: results.json, and config.yaml where the
    results name the export's labels (only a run whose results name this export's labels is its run: an export
    copied next to some unrelated config.yaml is evaluated alone)."""

    spec: str
    path: Path
    labels: list[str]  # config.json's, in id order
    have_data: bool
    run: RunDir
    results: dict | None = None
    config: dict | None = None  # the run's config.yaml, raw, where it is this export's run
    damaged: tuple[Path, str] | None = None  # the run's file that does not parse: (path, why)
    differ: list | None = None  # the labels the run's results name, where they are not config.json's

    @classmethod
    def read(cls, spec: str, path: Path, labels: list[str], have_data: bool) -> ExportRun:
        found = cls(spec, path, labels, have_data, RunDir(path.resolve().parent))
        if found.run.results.is_file():
            found.results, found.damaged = read_run_file(found.run.results)
        named = (found.results or {}).get("label_names")
        if found.results is not None and found.run.config.is_file():
            if named and named != labels:
                found.differ = named
            if named == labels:
                found.config, found.damaged = read_run_file(found.run.config)
        return found

    @property
    def damage(self) -> str:
        file, why = self.damaged
        return f"{file} exists but is damaged ({why})"


@rule("evaluation.run_file_damaged")
def run_file_damaged(e: ExportRun) -> str | None:
    """The run's results.json or config.yaml beside an export no longer parses (cut short, edited): said as
    such, not as missing; the export alone can still be scored on a file given with --data."""
    if e.damaged is not None and not e.have_data:
        return (f"{e.damage}, so the data and settings of {e.spec}'s run are unknown; restore it (from a "
                "backup, or train the run again), or pass --data FILE_OR_DIR (and --task if needed) to "
                "evaluate the export alone on a file")
    return None


@rule("evaluation.run_file_damaged_alone", warning=True)
def run_file_damaged_alone(e: ExportRun) -> str | None:
    """The same damage with --data: the export is evaluated alone, without its run's settings."""
    if e.damaged is not None and e.have_data:
        return f"{e.damage}; evaluating {e.spec} alone, without its run's settings (columns: pass key=value)"
    return None


@rule("evaluation.labels_differ_from_run")
def labels_differ_from_run(e: ExportRun) -> str | None:
    """An export whose config.json names other labels than its run's results.json: its id2label was edited,
    or the export is another run's; the run's data would be scored under the wrong names."""
    if not e.have_data and e.differ is not None:
        return (f"{e.path / 'config.json'} names the labels {e.labels[:5]}, but its run ({e.run.results}) trained "
                f"{e.differ[:5]}: its id2label was edited, or the export is another run's; put back the run's "
                "config.json, or pass --data FILE_OR_DIR to evaluate it alone")
    return None


def _best_trial_export(search: Path) -> Path | None:
    """The best trial's export in a search folder: the trial search.json names, else the one trial that kept
    its weights (a search keeps only the best one's), where that trial is a run to evaluate."""
    best = read_record(search / SEARCH_RECORD).get("best_trial")
    trials = [search / f"{TRIAL_PREFIX}{best}"] if isinstance(best, int) and not isinstance(best, bool) else \
        [t for t in search.glob(f"{TRIAL_PREFIX}*") if RunDir(t).model.is_dir()]  # fmt: skip
    runs = [RunDir(t) for t in trials if RunDir(t).model.is_dir() and RunDir(t).results.is_file()]
    return runs[0].model if len(runs) == 1 else None


@rule("evaluation.export_of_a_search")
def export_of_a_search(e: ExportRun) -> str | None:
    """The best model of a hyperparameter search (`<search>/model`, the path the search prints at its end) and
    no --data: the search folder (study.db, best_recipe.yaml, search.json) holds no run's settings, but its best
    trial's run (`<search>/trial-N`) does, and its export evaluates on that run's data."""
    root = e.run.root
    if e.have_data or not any((root / name).exists() for name in (STUDY, BEST_RECIPE, SEARCH_RECORD)):
        return None
    export = _best_trial_export(root)
    if export is None:
        return (f"{e.spec} is the best model of the search in {root}, a copy without its run, and the best "
                f"trial's run with its export ({TRIAL_PREFIX}N/{MODEL}, N as {SEARCH_RECORD} names it) is not "
                "there; pass --data FILE_OR_DIR (and --task if needed)")
    return (f"{e.spec} is the best model of the search in {root}, a copy without its run; evaluate the best "
            f"trial's export, {export} (its run's data and settings), or pass --data FILE_OR_DIR")


@rule("evaluation.export_without_run")
def export_without_run(e: ExportRun) -> str | None:
    """A model folder without its run (results.json and config.yaml one level up, naming its labels) and no
    --data: nothing says what to score it on."""
    if e.have_data:
        return None
    gone = [f.name for f in (e.run.config, e.run.results) if not f.is_file()]
    where = (f"without its run's {' and '.join(gone)} one level up" if gone else
             f"whose run one level up ({e.run.results}) names no labels")  # fmt: skip
    return f"{e.spec} is a model folder {where}; pass --data FILE_OR_DIR (and --task if needed)"


EXPORT_ALONE = [run_file_damaged, run_file_damaged_alone, labels_differ_from_run, export_of_a_search, export_without_run]

# --- the evaluation settings --------------------------------------------------------------------------------


@rule("evaluation.not_an_eval_setting")
def not_an_eval_setting(key: str, eval_keys: tuple[str, ...]) -> str | None:
    """A training setting given to an evaluation: only the settings that do not define the model may change."""
    if key not in eval_keys:
        return f"{key} cannot be set when evaluating; evaluation settings are: {', '.join(eval_keys)}"
    return None


SETTING = [not_an_eval_setting]


@dataclass
class Settings:
    """The evaluation's raw config (the run's, with the `key=value` settings in), the keys given, and the
    text_pair_column the model trained with (None: single texts, or no run known)."""

    raw: dict[str, Any]
    given: set[str]
    trained_pair: str | None
    of_a_run: bool


@rule("evaluation.label_columns_not_multi")
def label_columns_not_multi(s: Settings) -> str | None:
    """label_columns= (0/1 columns) for a model trained for another problem than multi-label."""
    if "label_columns" in s.given and s.raw.get("label_columns") and s.raw.get("problem_type") not in (None, MULTI):
        return (f"label_columns (0/1 columns, one per label) is multi-label data, and this model was trained "
                f"for {s.raw['problem_type']}: give its labels in one column with label_column=, or leave "
                "label_columns out")  # fmt: skip
    return None


def _pairs_changed(s: Settings) -> bool:
    return "text_pair_column" in s.given and s.of_a_run and bool(s.raw.get("text_pair_column")) != bool(s.trained_pair)


@rule("evaluation.pairs_for_single_texts", warning=True)
def pairs_for_single_texts(s: Settings) -> str | None:
    """Sentence pairs for a model trained on single texts: scored, as asked, and said (it never saw a pair)."""
    if _pairs_changed(s) and s.trained_pair is None:
        return (f"text_pair_column={s.raw['text_pair_column']}: this model was trained on single texts (its run had "
                "no text_pair_column), so it never saw sentence pairs and its scores on them measure input it was "
                "not trained for; leave text_pair_column out, or evaluate a model trained on pairs")  # fmt: skip
    return None


@rule("evaluation.single_texts_for_pairs", warning=True)
def single_texts_for_pairs(s: Settings) -> str | None:
    """Single texts (text_pair_column=null) for a model trained on sentence pairs: scored, and said."""
    if _pairs_changed(s) and s.trained_pair is not None:
        return (f"text_pair_column=null: this model was trained on sentence pairs (text_pair_column={s.trained_pair}), "
                "so its scores on single texts measure input it was not trained for; give the second sentence's "
                "column as text_pair_column")  # fmt: skip
    return None


SETTINGS = [label_columns_not_multi, pairs_for_single_texts, single_texts_for_pairs]

# --- the model that does not load ---------------------------------------------------------------------------


@dataclass
class LoadFailed:
    """A model (or its config) that did not load: as given, its local folder (None for a hub name), the
    library's error, the offline hint (`models.offline_hint`) and what was loaded."""

    spec: str
    folder: Path | None
    error: BaseException
    hint: str = ""
    base: bool = False  # the pretrained model a training-state checkpoint's architecture comes from
    task: str = ""  # for the model itself: its task; "" for its config


def _safetensor_error(e: BaseException) -> bool:
    from safetensors import SafetensorError

    return isinstance(e, SafetensorError)


@rule("evaluation.damaged_json")
def damaged_json(f: LoadFailed) -> str | None:
    """A model folder that does not load because one of its *.json files (config.json, tokenizer.json, ...)
    does not parse (a copy cut short, an edit gone wrong): the file is named with the fix. The loader's own
    error (`Expecting ',' delimiter: line 52 column 6`) names no file."""
    if f.folder is None or not f.folder.is_dir() or _safetensor_error(f.error):
        return None
    for file in sorted(f.folder.glob("*.json")):
        try:
            json.loads(file.read_bytes())
        except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
            fix = (
                "copy or download that model again"
                if f.base
                else "put back the file the run saved (a tokenizer file can be copied again from the "
                "model the run started from), or evaluate a training-state checkpoint of the run "
                "(<run>/checkpoints/step-N), or retrain"
            )
            return f"{file} is not valid JSON ({first_line(e)}): the file is damaged (cut short?); {fix}"
        except OSError:
            continue
    return None


@rule("evaluation.model_config_unloaded")
def model_config_unloaded(f: LoadFailed) -> str:
    """A model's config that transformers cannot load (no config.json, an unknown model type, a hub name
    offline)."""
    return f"could not load the model config of '{f.spec}': {first_line(f.error)}{f.hint}"


CONFIG_FAILED = [damaged_json, model_config_unloaded]


@rule("evaluation.model_weights_damaged")
def model_weights_damaged(f: LoadFailed) -> str | None:
    """An export whose model.safetensors safetensors cannot read (cut short, its header overwritten)."""
    if _safetensor_error(f.error):
        return (f"could not load the {f.task} model '{f.spec}' (its weights file is damaged: replace it): "
                f"{first_line(f.error)}{f.hint}")
    return None


@rule("evaluation.model_unloaded")
def model_unloaded(f: LoadFailed) -> str:
    """A model transformers cannot load for another reason (no weights, a hub name offline)."""
    return f"could not load the {f.task} model '{f.spec}': {first_line(f.error)}{f.hint}"


MODEL_FAILED = [damaged_json, model_weights_damaged, model_unloaded]


def head_rows(folder: Path) -> tuple[int, int] | None:
    """(the classifier's outputs in model.safetensors, the labels config.json names) where they differ."""
    from safetensors import SafetensorError, safe_open

    try:
        config = json.loads((folder / "config.json").read_text())
        labels = len(config.get("id2label") or {}) or config.get("num_labels")
        with safe_open(str(folder / WEIGHTS), "pt") as weights:
            key = next((k for k in weights.keys() if k.endswith("classifier.weight")), None)
            rows = weights.get_slice(key).get_shape()[0] if key else None
    except (OSError, ValueError, SafetensorError, AttributeError):
        return None
    return (rows, labels) if isinstance(labels, int) and rows is not None and rows != labels else None


@rule("evaluation.head_rows_differ")
def head_rows_differ(spec: str, folder: Path | None, what: str) -> str | None:
    """An export whose classifier's outputs differ from the labels its config.json names (a config.json edited by
    hand, most often: a label added to id2label): a model's labels are fixed when it is trained."""
    head = head_rows(folder) if folder is not None else None
    if head is None:
        return None
    rows, labels = head
    return (f"the config.json of '{spec}' names {labels} labels (id2label) but its model.safetensors' "
            f"classifier has {rows} outputs: one of the two files was edited or replaced (a model's labels are "
            "fixed when it is trained); put back the pair this export was saved with, or evaluate another export")


@rule("evaluation.foreign_weights")
def foreign_weights(spec: str, folder: Path | None, what: str) -> str:
    """An export whose model.safetensors does not fit its config.json (weights missing, shapes that differ):
    transformers would fill the gaps at random and score a random model."""
    what = what.split("; ")[0].replace(" For details look at the above report!", "").rstrip(".! ")
    return (f"the weights in '{spec}' do not fit its config.json (another model's model.safetensors, or a "
            f"config.json edited?): {what}; put back the files this export was saved with, or evaluate another export")


FOREIGN = [head_rows_differ, foreign_weights]


@rule("evaluation.weights_do_not_fit")
def weights_do_not_fit(path: Path, missing: list[str], unexpected: list[str]) -> str | None:
    """A training-state checkpoint whose weights do not fit the model its config builds (another model's file)."""
    if missing or unexpected:
        return (f"the weights in {path} do not fit the model its config builds: missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}")
    return None


FIT = [weights_do_not_fit]


@rule("evaluation.nan_weights")
def nan_weights(spec: str, model) -> str | None:
    """Weights that hold NaN or infinite values: every prediction would be NaN, scored as if it meant something
    (a run that diverged saves none such: the file was changed or damaged)."""
    import torch

    bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
    if bad is not None:
        return (f"the weights of '{spec}' hold NaN or infinite values ({bad}); a run that diverged saves none "
                "such, so the file was changed or damaged: evaluate another checkpoint, or retrain")
    return None


FINITE = [nan_weights]


@rule("evaluation.weights_a_folder")
def weights_a_folder(spec: str, folder: Path) -> str | None:
    """A weights file that is something else (a folder of that name): said as such, not as missing."""
    weights = folder / WEIGHTS
    if weights.exists() and not weights.is_file():
        return (f"{weights} is a folder, not a weights file; put back the {WEIGHTS} file the run saved, or evaluate "
                "another checkpoint of the run, or its export (<run>/model)")
    return None


@rule("evaluation.no_weights")
def no_weights(spec: str, folder: Path) -> str:
    """A training-state checkpoint with neither model.safetensors nor FSDP shards: the folder's files are listed."""
    found = sorted(p.name for p in folder.iterdir())
    return f"{spec} holds no {WEIGHTS} and no FSDP shards (found: {', '.join(found)})"


WEIGHTS_FILE = [weights_a_folder]
NO_WEIGHTS = [weights_a_folder, no_weights]


@rule("evaluation.weights_unreadable")
def weights_unreadable(weights: Path, error: Exception) -> str:
    """A checkpoint's model.safetensors that safetensors cannot read (cut short, zero bytes, a garbled header)."""
    return f"{weights} is not a readable safetensors file ({first_line(error)}); {ANOTHER}"


WEIGHTS_UNREADABLE = [weights_unreadable]


@rule("evaluation.shards_do_not_merge")
def shards_do_not_merge(shards: Path, error: Exception) -> str:
    """An FSDP checkpoint's shards (torch.distributed.checkpoint's files) that do not merge into one model:
    a shard or the index missing or damaged."""
    failures = getattr(error, "failures", None)  # torch's CheckpointException: each rank's (error, its traceback)
    cause = next(iter(failures.values()))[0] if failures else error
    return f"the FSDP shards in {shards} do not merge: {first_line(cause)}"


SHARDS_UNMERGED = [shards_do_not_merge]

# --- the data -----------------------------------------------------------------------------------------------


@rule("evaluation.unknown_split")
def unknown_split(available: list[str], split: str | None, where: str) -> str | None:
    """`--split` that the run's data (or the --data folder) does not have: its splits are listed."""
    if split is not None and split not in available:
        return f"unknown split '{split}'; {where} has: {', '.join(available)}"
    return None


SPLIT = [unknown_split]


@rule("evaluation.runs_data_unread")
def runs_data_unread(error: Exception) -> str:
    """The run's own data that no longer reads (moved, edited): training's line, said as the run's data's, with
    the way round it (other data)."""
    return f"{error} (reading the run's data; pass --data FILE_OR_DIR to evaluate other data)"


RUNS_DATA = [runs_data_unread]


@rule("evaluation.unnamed_sets")
def unnamed_sets(data: str, path: Path, split: str | None, loaded: list[str]) -> str | None:
    """A --data folder of several files not named by split (a.csv and b.csv): two parts of one set, or two sets?
    Not the first alone."""
    if path.is_dir() and split is None and len(loaded) > 1 and not {"test", "validation"} & set(loaded):
        shown = ", ".join(loaded[:5])
        return (f"--data {data} holds {len(loaded)} data sets not named by split ({shown}); pass --split with "
                "one of them, or one file as --data (a file each time to score each)")  # fmt: skip
    return None


FOLDER = [unnamed_sets]


@rule("evaluation.no_rows")
def no_rows(what: str, rows: int) -> str | None:
    """--data whose split holds no rows."""
    if rows == 0:
        return f"{what} has no rows; check the file"
    return None


ROWS = [no_rows]


@rule("evaluation.no_samples")
def no_samples(rows: int, info: dict[str, Any]) -> str | None:
    """Data that leaves no sample to evaluate (the run's split, limited by its max_*_samples, or --data)."""
    if rows == 0:
        return f"no samples to evaluate in {info['data']} [{info['split'] or 'data'}]"
    return None


SAMPLES = [no_samples]


@rule("evaluation.label_column_twin")
def label_column_twin(ds, args, what: str) -> str | None:
    """A "Label" or "labels" column beside a model that reads "label": labels, not data to predict."""
    for column in args.label_sources:
        twin = next((c for c in ds.column_names if c.lower().rstrip("s") == column.lower().rstrip("s")), None)
        if twin is not None:
            key = "tags_column" if column == args.tags_column else "label_column"
            how = "in another case" if twin.lower() == column.lower() else "by another name"
            return (f"column '{twin}' of {what} looks like the label column '{column}' {how}; to score "
                    f"it, pass {key}={twin}; to predict without labels, rename or drop that column")
    return None


# Column names that hold a data set's targets (a regression's numbers among them).
TARGET_NAMES = ("label", "labels", "score", "scores", "target", "targets", "y", "rating", "ratings", "similarity",
                "relatedness_score", "class", "category", "sentiment", "gold_label", "value")  # fmt: skip


def unread_label_column(ds, args, names: list[str]) -> tuple[str, str] | None:
    """A column the model's label column is not, that holds its labels: single-label classes that are all
    the model's (`sentiment` holding neg/pos), or a regression's numbers under a target's name (`label`
    beside a model that reads `score`). (The column, what it holds), or None."""
    inputs = {c for c in (args.text_column, args.text_pair_column, args.image_column, args.tokens_column) if c}
    for column in (c for c in ds.column_names if c not in inputs):
        values = [v for v in ds[column][:] if v is not None]
        if not values:
            continue
        if args.problem_type == REGRESSION:
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            if numbers and column.lower() in TARGET_NAMES:
                return column, f"numbers, as the model's target '{args.label_column}' does"
        elif args.problem_type == MULTI and names:  # lists of the model's labels (a model of 0/1 columns)
            lists = all(isinstance(v, list) for v in values) and any(values)
            if lists and {str(x) for v in values for x in v} <= set(names):
                return column, "lists of the model's labels"
        elif args.problem_type in (None, SINGLE) and names and len(names) > 1:
            plain = all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values)
            shown = {str(v).strip() for v in values}
            if plain and len(shown) > 1 and shown <= set(names):
                return column, f"the model's classes ({', '.join(sorted(shown)[:5])})"
    return None


@rule("evaluation.labels_in_another_column")
def labels_in_another_column(ds, args, what: str) -> str | None:
    """The model's labels under another column name (`sentiment` holding neg/pos beside a model that reads
    `label`): labels, not data to predict."""
    unread = unread_label_column(ds, args, list(args.label_names or []))
    if unread is None:
        return None
    column, holds = unread
    fix = f"label_column={column}" + (" label_columns=null" if args.label_columns else "")
    return (f"column '{column}' of {what} holds {holds}; to score it, pass {fix}; to predict without "
            "labels, rename or drop that column")  # fmt: skip


@rule("evaluation.a_column_per_label")
def a_column_per_label(ds, args, what: str) -> str | None:
    """A 0/1 column for each of a multi-label model's labels, named as its labels: labels, not inputs."""
    names = list(args.label_names or [])
    if args.problem_type == MULTI and not args.label_columns and names and set(names) <= set(ds.column_names):
        return (f"{what} has a column for each of the model's labels ({', '.join(names)}): labels, one column "
                f"each; to score them, pass label_columns=[{','.join(names)}]; to predict without labels, drop those "
                "columns")
    return None


UNLABELLED = [label_column_twin, labels_in_another_column, a_column_per_label]


@rule("evaluation.numbered_tags", warning=True)
def numbered_tags(ds, args, what: str) -> str | None:
    """Tags written as numbers: read as the model's tags at those places, which is right only if the data numbers
    them in the model's order."""
    inner = getattr(ds.features.get(args.tags_column), "feature", None)
    if args.tags_column in ds.column_names and getattr(inner, "dtype", "").startswith("int") and args.label_names:
        shown = ", ".join(f"{i}={t}" for i, t in enumerate(args.label_names[:5]))
        return (f"the tags of {what} are numbers, read as the model's tags at those places ({shown}, ...); if the "
                "data numbers its tags in another order, the scores are wrong: write the tags as names")  # fmt: skip
    return None


TAGS = [numbered_tags]


class Floats:
    """A classifier's label column written as floats (`1.0`: a CSV saved by pandas), against its class names."""

    def __init__(self, column: str, values: list[float], names: list[str], what: str):
        self.column, self.names, self.what = column, names, what
        self.fraction = next((v for v in values if not (math.isfinite(v) and v == round(v))), None)
        self.numbered = all(re.fullmatch(r"-?\d+", n) and str(int(n)) == n for n in names)
        self.values = values
        self.listed = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")

    def line(self, but: str) -> str:
        held = "numbers with decimals" if self.fraction is not None else "numbers"
        example = self.fraction if self.fraction is not None else next((v for v in self.values if v), self.values[0])
        return f"label column '{self.column}' of {self.what} holds {held} (e.g. {example:g}), but {but}"


@rule("evaluation.fractions_for_numbered_classes")
def fractions_for_numbered_classes(f: Floats) -> str | None:
    """Numbers with decimals for a model whose classes are named "0", "1", ...: no class of that name.
    (Whole numbers written 1.0 are those classes.) Training's fix, problem_type=regression, is no evaluation
    setting."""
    if f.numbered and f.fraction is not None:
        return f.line(f"the model's classes are {f.listed}: write each row's class as one of them (1, not 1.0)")
    return None


@rule("evaluation.numbers_for_named_classes")
def numbers_for_named_classes(f: Floats) -> str | None:
    """Numbers for a model whose classes are named (neg, pos): labels are matched by name."""
    if not f.numbered:
        return f.line(f"the model's classes are named ({f.listed}) and labels are matched by name: write each row's "
                      "class name instead")
    return None


FLOATS = [fractions_for_numbered_classes, numbers_for_named_classes]


@rule("evaluation.labels_of_another_problem")
def labels_of_another_problem(ds, args, what: str) -> str | None:
    """Labels of another kind than the export's problem type asks for (class names beside a regression model,
    lists beside a single-label one, names beside a multi-label one), said of the model: training's own line
    offers problem_type=, which evaluation does not take (the model's is fixed). Other refusals (numbers with a
    unit, a stray cell) keep training's line."""
    column = args.label_column
    if args.problem_type not in (SINGLE, MULTI, REGRESSION) or args.label_columns or column not in ds.column_names:
        return None
    values = [v for v in ds[column][:1000] if v is not None]
    if is_list(ds.features[column]):
        holds = "lists of labels (a multi-label data set's)"
    elif values and all(isinstance(v, str) for v in values) and not any(number_as_written(v) for v in values):
        holds = f"class names (e.g. {values[0]!r})"
    else:
        return None
    if args.problem_type == (MULTI if holds.startswith("lists") else SINGLE):  # the kind the model reads
        return None
    needs = {REGRESSION: "a regression model (it predicts one number per sample)",
             SINGLE: "a single-label classifier (one class per sample)",
             MULTI: "a multi-label classifier (a list of its labels per sample)"}[args.problem_type]  # fmt: skip
    return (f"label column '{column}' of {what} holds {holds}, but this export is {needs}, as its config.json "
            "says: score it on data labelled as it was trained, or drop that column to predict without labels")


ANOTHER_PROBLEM = [labels_of_another_problem]


@rule("evaluation.data_changed", warning=True)
def data_changed(info: dict[str, Any], recorded: str | None, results: Path) -> str | None:
    """The run's own split, read from a file whose bytes differ from those the run trained and scored on
    (results.json's data_sha256): these scores are not the run's."""
    if recorded is not None and recorded != info["data_sha256"]:
        return (f"{info['data']} changed since the run trained on it (its sha256 differs from the one in "
                f"{results}): these are scores on the file as it is now, not the run's")
    return None


CHANGED = [data_changed]


@rule("evaluation.training_data", warning=True)
def training_data(info: dict[str, Any], trained: str | None) -> str | None:
    """--data that is the run's own training file (its bytes): scores on it say how well the model fits what it
    trained on, not how it does on data it never saw."""
    if info["data_sha256"] == trained:
        return (f"--data {info['data']} is the run's training file: the model trained on these samples, so its scores "
                "here are higher than on data it never saw; evaluate the test or validation file for those")  # fmt: skip
    return None


TRAINING_DATA = [training_data]


@rule("evaluation.another_scale", warning=True)
def another_scale_rule(trained, targets, name: str) -> str | None:
    """Regression targets mostly far outside the range of the run's training targets (trained on 0-5, scored on
    0-500): another scale, on which the scores say nothing (training's reading, splits.another_scale)."""
    scale = another_scale(trained, targets, f"targets of {name}")
    return f"{scale} the model predicts on the training scale; put the targets on it" if scale else None


SCALE = [another_scale_rule]


def _probability(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if 0.0 <= v <= 1.0 else None


@rule("evaluation.thresholds")
def thresholds(value: Any, label_names: list[str]) -> str | None:
    """config.json's `multi_label_thresholds` (tuned on validation at training's end) that is not one number or
    one per label, each a probability in [0, 1]: a hand edit gone wrong (a label never or always predicted)."""
    values = value if isinstance(value, list) else [value]
    fits = len(values) in (1, len(label_names)) if isinstance(value, list) else True
    if values and fits and None not in [_probability(v) for v in values]:
        return None
    return (f"the export's config.json has multi_label_thresholds={json.dumps(value)}: it must be one number or "
            f"one for each of its {len(label_names)} labels ({', '.join(label_names[:5])}"
            f"{', ...' if len(label_names) > 5 else ''}), each between 0 and 1; restore it, or delete the key to "
            "evaluate at multi_label_threshold (0.5, or as given)")


THRESHOLDS = [thresholds]

# --- the output folder --------------------------------------------------------------------------------------


def _field(metrics_file: Path, key: str) -> Any:
    try:
        return json.loads(metrics_file.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class Output:
    """Where an evaluation writes: metrics.json and the files beside it, the evaluated model's folder (None for a
    hub name) and name as recorded, whether --output chose the folder, the folder around it that a run replaces
    whole (`layout.replaced_whole_around`), the format that marks a metrics.json as an evaluation's, and the
    sha256 of the evaluated weights (metrics.json's weights_sha256; None for a hub name)."""

    metrics_file: Path
    beside: tuple[Path, ...]  # the confusion matrix and predictions.jsonl
    target: Path | None
    mine: str
    chosen: bool
    inner: Path | None
    format: str
    weights: str | None = None

    @property
    def folder(self) -> Path:
        return self.metrics_file.parent

    @property
    def ours(self) -> bool:
        return _field(self.metrics_file, "format") == self.format


@rule("evaluation.output_a_file")
def output_a_file(o: Output) -> str | None:
    """--output (or a folder above it) that is a file: --output names a folder."""
    for above in (o.folder, *o.folder.parents):
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                return f"--output {o.folder}: {above} is a file, not a folder; --output names a folder"
            return None
    return None


@rule("evaluation.output_is_the_target")
def output_is_the_target(o: Output) -> str | None:
    """--output that is the evaluated folder itself: the evaluation would write into the model."""
    if o.target is not None and o.folder.resolve() == o.target:
        return (f"--output {o.folder} is the evaluated folder itself; name another folder for the "
                "evaluation (or leave --output out: it goes beside the run)")
    return None


@rule("evaluation.output_replaced_whole")
def output_replaced_whole(o: Output) -> str | None:
    """--output inside a run's checkpoints/ or export, which that run deletes or replaces whole (retention, an
    overwrite): the evaluation would be lost with it."""
    if o.inner is not None:
        return (f"--output {o.folder} is inside {o.inner}, which the run in {o.inner.parent} deletes or replaces whole "
                "(checkpoint retention, its next export or overwrite); choose a folder outside it (or leave --output "
                "out: the evaluation goes in the run's eval/)")
    return None


@rule("evaluation.output_not_ours")
def output_not_ours(o: Output) -> str | None:
    """A metrics.json there that no evaluation wrote: never written over."""
    if o.metrics_file.exists() and not o.ours:
        return f"{o.metrics_file} exists and is not a metrics.json written by finetune.evaluate; choose another --output"
    return None


@rule("evaluation.another_models_evaluation")
def another_models_evaluation(o: Output) -> str | None:
    """The default folder holding another model's evaluation on the same data (two models both named `model/`,
    or a run's model/ whose weights were replaced by another's): it would be replaced. A model is known by its
    weights (metrics.json's weights_sha256), so a copy of a run (cp -r) evaluates as the run it was copied from;
    by its path where an older evaluation recorded no weights."""
    if not o.ours or o.chosen:
        return None
    other, theirs = _field(o.metrics_file, "checkpoint"), _field(o.metrics_file, "weights_sha256")
    if theirs is not None and o.weights is not None:
        if theirs == o.weights:
            return None
        return (f"{o.folder} holds the evaluation of another model of the same name ('{other}', its weights' sha256 "
                f"{theirs[:12]}, not {o.weights[:12]}) on the same data; pass --output DIR for this one (or move that "
                "evaluation away)")
    if other is not None and other != o.mine:
        return (f"{o.folder} holds the evaluation of another model of the same name ('{other}') on the same data; pass "
                "--output DIR for this one (or move that evaluation away)")
    return None


@rule("evaluation.outputs_not_ours")
def outputs_not_ours(o: Output) -> str | None:
    """A confusion_matrix.png or predictions.jsonl there that no evaluation wrote: never written over."""
    for other in o.beside:
        if other.exists() and not o.ours:
            return (f"{other} exists{' beside ' + o.metrics_file.name if o.metrics_file.exists() else ''} and was not "
                    "written by finetune.evaluate; choose another --output")
    return None


OUTPUT = [output_a_file, output_is_the_target, output_replaced_whole, output_not_ours, another_models_evaluation,
          outputs_not_ours]  # fmt: skip


@rule("evaluation.write_failed")
def write_failed(folder: Path, failure: OSError) -> str:
    """The evaluation's files that cannot be written (a full or read-only disk, a device error): nothing of them
    is left there."""
    file = f" ({failure.filename})" if failure.filename else ""
    return (f"cannot write the evaluation to {folder}: {failure.strerror}{file}; nothing of it was left there; "
            f"{remedy(failure.errno, '--output')}")


WRITE_FAILED = [write_failed]


# --- --onnx: the run's ONNX files instead of its PyTorch weights ------------------------------------------------


@rule("evaluation.onnx_not_an_export")
def onnx_not_an_export(kind: str, spec: str, file: Path, run: Path) -> str | None:
    """--onnx with a training-state checkpoint or a hub model: the ONNX files are made from a run's export, and
    --onnx evaluates those (<run>/onnx/)."""
    if kind != "export":
        return (f"--onnx evaluates the ONNX files beside a run's export (<run>/onnx/), and {spec} is a {kind} "
                "model; give the run's model/ folder")
    return None


@rule("evaluation.onnx_file_missing")
def onnx_file_missing(kind: str, spec: str, file: Path, run: Path) -> str | None:
    """--onnx before the ONNX files were made: nothing to evaluate."""
    if not file.is_file():
        return f"no {file}: make the run's ONNX files first with python -m finetune.onnx_export {pasted(run)}"
    return None


ONNX = [onnx_not_an_export, onnx_file_missing]


@rule("evaluation.onnx_file_of_another_precision")
def onnx_file_of_another_precision(file: Path, asked: str | None, named: str | None) -> str | None:
    """An ONNX file given as the model with --onnx naming the other precision (model.onnx with --onnx int8): the
    file given is what is scored, and its outputs are named by its precision."""
    if asked is not None and named is not None and asked != named:
        return (f"{file} is the {named} file, and --onnx asks for {asked}: give its folder {pasted(file.parent)} "
                f"with --onnx {asked}, or the file alone")
    return None


ONNX_GIVEN = [onnx_file_of_another_precision]


@rule("evaluation.onnx_without_its_export")
def onnx_without_its_export(folder: Path, export: Path | None, recorded: str | None) -> str | None:
    """ONNX files given as the model (their folder or a file) whose export is not there: neither a run's model/
    beside <run>/onnx/, nor the folder each file records it was made from. An ONNX evaluation reads the run's
    config, labels and data through its export, and holds the files to the export's weights."""
    if export is None:
        where = (f"the export they were made from ({recorded}) is not there" if recorded else
                 "no run's model/ is beside them, and they record no export (they were made before files recorded it)")
        return (f"{folder} holds ONNX files, and {where}; make them again from the run's export "
                "(python -m finetune.onnx_export <run>), then evaluate <run>/model --onnx")
    return None


ONNX_EXPORT = [onnx_without_its_export]


@rule("evaluation.onnx_of_other_weights")
def onnx_of_other_weights(file: Path, made_from: str | None, weights: str | None, run: Path) -> str | None:
    """--onnx with ONNX files made from other weights than the export's, by the sha256 each file records (the
    export changed since: a resumed run exports anew, its weights were replaced; or another run's files were
    written there with --output-dir): their scores would be recorded as the export's. Files made before the
    sha256 was recorded are not judged."""
    if made_from is not None and weights is not None and made_from != weights:
        return (f"{file} was made from other weights than {run / MODEL}'s (the export changed since, or the files "
                f"are another model's); make them again with python -m finetune.onnx_export {pasted(run)}")
    return None


ONNX_WEIGHTS = [onnx_of_other_weights]
