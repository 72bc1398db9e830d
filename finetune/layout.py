"""The run directory's layout: the names of what a run writes, and what kind of folder a path is.

    <output_dir>/
        config.yaml          the resolved config (what `resume_from_checkpoint` reruns)
        metrics.jsonl        one record per logged step and per evaluation
        checkpoints/step-N/  training state (finetune/checkpoint.py: the format inside)
        model/               the export: save_pretrained, with its tokenizer or image processor and card
        adapter/             a LoRA run's adapters alone, in peft's format
        onnx/                when asked (finetune/onnx_export.py): model.onnx, model_int8.onnx, config, preprocessor
        training_curves.png  loss, validation metrics and learning rate against the step
        results.json         written last: a run with it is finished
        .previous-run/       the run an overwrite replaces, until the new one is finished
        .export-new/         the export being written (model/, adapter/, the curves), until it is whole
        .export-old/         an earlier export, while the new one moves into place (finetune/export.py)

This is the only module that spells these names; the others ask `RunDir`. What happens to a folder (refused,
set aside, restored) is finetune/rundir.py's; the rules it asks are finetune/checks/runs.py's, which read
the names here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
METRICS_LOG = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
MODEL = "model"
ADAPTER = "adapter"
CURVES = "training_curves.png"
RESULTS = "results.json"
PREVIOUS = ".previous-run"
# A checkpoint: <output_dir>/checkpoints/step-00000042/ with its manifest and, once whole, its marker
# (finetune/checkpoint.py writes them).
MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
PREFIX = "step-"
# Evaluations (finetune/evaluate_checkpoint.py): <run>/eval/<name>/ with these files.
EVAL = "eval"
EVAL_METRICS = "metrics.json"
PREDICTIONS = "predictions.jsonl"
CONFUSION_MATRIX = "confusion_matrix.png"
# A search (finetune/search.py): its study, the best trial's recipe, its record, and a folder a trial.
STUDY = "study.db"
BEST_RECIPE = "best_recipe.yaml"
SEARCH_RECORD = "search.json"
TRIAL_PREFIX = "trial-"
EXPORT_STAGE, EXPORT_ASIDE = ".export-new", ".export-old"
# The ONNX files of the export (finetune/onnx_export.py): <run>/onnx/ with these, written aside first.
ONNX = "onnx"
ONNX_FILES = {"fp32": "model.onnx", "int8": "model_int8.onnx"}
ONNX_STAGE, ONNX_ASIDE = ".onnx-new", ".onnx-old"
# What a run writes in its output_dir, besides Accelerate's tracker logs in <output_dir>/<its name>.
RUN_FILES = (CHECKPOINTS, MODEL, ADAPTER, ONNX, METRICS_LOG, RESULTS, CONFIG, CURVES)
SHARED_PROBE_PREFIX = ".finetune-shared-probe-"


def read_record(path: Path) -> dict:
    """A run file's JSON object (results.json, search.json), or {} where it is missing, unreadable or not
    an object: for the readers that want one field and have a default (the damage reports of a run's
    files are `evaluate_checkpoint`'s)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    config = property(lambda self: self.root / CONFIG)
    metrics = property(lambda self: self.root / METRICS_LOG)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)
    model = property(lambda self: self.root / MODEL)
    adapter = property(lambda self: self.root / ADAPTER)
    curves = property(lambda self: self.root / CURVES)
    results = property(lambda self: self.root / RESULTS)
    previous = property(lambda self: self.root / PREVIOUS)
    export_stage = property(lambda self: self.root / EXPORT_STAGE)
    export_aside = property(lambda self: self.root / EXPORT_ASIDE)
    onnx = property(lambda self: self.root / ONNX)
    onnx_stage = property(lambda self: self.root / ONNX_STAGE)
    onnx_aside = property(lambda self: self.root / ONNX_ASIDE)

    def onnx_file(self, precision: str) -> Path:
        """<run>/onnx/model.onnx (fp32) or model_int8.onnx (int8)."""
        return self.onnx / ONNX_FILES[precision]

    def holds_run(self) -> str | None:
        """'a finished run', 'a started run' (checkpoints or a log), or None."""
        if self._finished():
            return "a finished run"
        if list_checkpoints(self.root) or self._started():
            return "a started run"
        return None

    def _finished(self) -> bool:
        """A run's results.json (a record with its step), or one damaged beside the run's config.yaml; a
        results.json of the user's in a folder of other files is not a run's (an overwrite would delete it)."""
        if not self.results.is_file():
            return False
        try:
            record = json.loads(self.results.read_text())
        except (OSError, ValueError):
            return self._config_of_a_run()
        return "step" in record if isinstance(record, dict) else self._config_of_a_run()

    def _started(self) -> bool:
        """A run's log beside its config, as a run starts them (a metrics.jsonl of the user's, or of
        another tool, is not a run's: an overwrite would set it aside and delete it)."""
        try:
            with self.metrics.open() as f:
                line = f.readline()
            first = json.loads(line) if line.strip() else {"step": None}  # stopped before its first line
        except (OSError, ValueError):
            return False
        return isinstance(first, dict) and "step" in first and self._config_of_a_run()

    def _config_of_a_run(self) -> bool:
        """config.yaml here is a run's: a mapping that names its task."""
        import yaml

        try:
            config = yaml.safe_load(self.config.read_text())
        except (OSError, ValueError, yaml.YAMLError):
            return False
        return isinstance(config, dict) and "task" in config

    def is_run(self) -> bool:
        """A run's folder: its config beside its checkpoints, or a finished run."""
        return (self.config.is_file() and self.checkpoints.is_dir()) or self._finished()

    def run_files(self) -> list[str]:
        """What a run writes here, the trackers' folder (named after the output_dir) included."""
        return [*RUN_FILES, self.root.name]

    def replaced_files(self) -> list[str]:
        """What an overwrite sets aside: the run's files, and eval/ with the replaced model's scores."""
        return [*self.run_files(), EVAL]


def step_of(path: Path) -> int | None:
    """The optimizer step in a checkpoint folder's name (step-00000010: 10), or None for another name
    (a copy such as step-00000002-backup is none)."""
    tail = path.name[len(PREFIX) :] if path.name.startswith(PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def is_complete(path: Path) -> bool:
    """A checkpoint marked whole (its COMPLETE marker, written last) beside its manifest."""
    return (path / COMPLETE).is_file() and (path / MANIFEST).is_file()


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """The complete checkpoints of the run in `output_dir`, oldest first."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and p.is_dir() and is_complete(p)]
    return sorted(found, key=step_of)


def as_umask_allows(folder: Path) -> None:
    """safetensors writes its files readable by their owner alone (0600); a run's checkpoints and export
    are for sharing, so their files get the modes the user's umask gives any new file (0644 under 022)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


# Folders of a run that a later step of that run (or of an overwrite, a resume) deletes or replaces whole:
# the checkpoints (retention, a re-save), the export and the adapter (the next export), what an overwrite
# sets aside, and the export's staging folders. No output_dir may lie inside one.
REPLACED_WHOLE = {
    CHECKPOINTS: "checkpoints folder",
    MODEL: "export",
    ADAPTER: "LoRA adapter",
    PREVIOUS: "set-aside earlier run",
    f"{PREVIOUS}.tmp": "set-aside earlier run",
    EXPORT_STAGE: "export being written",
    EXPORT_ASIDE: "earlier export",
}
_CHECKPOINT_NAME = re.compile(rf"(\.tmp-|\.old-)?{PREFIX}\d+")


def looks_like_a_run(path: Path) -> bool:
    """A run directory, as far as nesting goes: finished, or started (its log, or its config beside its
    checkpoints/). A project folder of the user's that has a model/ subfolder is not one."""
    run = RunDir(path)
    return (
        run.results.is_file() or run.metrics.is_file() or (run.config.is_file() and run.checkpoints.is_dir())
    )


def replaced_whole_around(path: Path) -> Path | None:
    """The folder of a run that holds `path` (or is it) and that the run deletes or replaces whole (its
    checkpoints/, model/, ...: `REPLACED_WHOLE`); None if there is none."""
    path = Path(path).expanduser().resolve()
    return next(
        (p for p in (path, *path.parents) if p.name in REPLACED_WHOLE and looks_like_a_run(p.parent)), None
    )


# What a run writes inside model/ and adapter/ (save_pretrained: weights, config, tokenizer or image
# processor files; peft's adapter files; the card; and `eval/`, where an older evaluate_checkpoint.py put
# its results) and inside checkpoints/ (step-N, and the hidden .tmp-/.old- folders of a save).
_EXPORT_ENTRY = re.compile(
    r"README\.md|eval|[\w.-]*config\.json|(model|adapter_model)(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json"
    r"|(pytorch_model|adapter_model)(-\d+-of-\d+)?\.bin|pytorch_model\.bin\.index\.json"
    r"|tokenizer[\w.-]*|vocab[\w.-]*|merges\.txt|special_tokens_map\.json|added_tokens\.json|[\w.-]*\.model"
    r"|[\w.-]*\.tiktoken|chat_template\.(jinja|json)|additional_chat_templates"
)


# What an evaluation writes in <run>/eval/<name>/ (and its .tmp- files while it writes).
_EVAL_ENTRY = re.compile(
    rf"(\.tmp-)?({re.escape(EVAL_METRICS)}|{re.escape(CONFUSION_MATRIX)}|{re.escape(PREDICTIONS)})"
)


def entries_not_of_a_run(run: RunDir, evaluations: bool) -> list[Path]:
    """The entries of run's checkpoints/, model/ and adapter/ (and with `evaluations`, of the evaluations'
    folders in eval/) that no run or evaluation of this app wrote there."""
    found = []
    for folder, written in (
        (run.checkpoints, _CHECKPOINT_NAME),
        (run.model, _EXPORT_ENTRY),
        (run.adapter, _EXPORT_ENTRY),
    ):
        if folder.is_dir() and not folder.is_symlink():
            found += [p for p in sorted(folder.iterdir()) if not written.fullmatch(p.name)]
    if run.checkpoints.is_dir() and not run.checkpoints.is_symlink():  # inside a checkpoint: what it holds
        for step in sorted(
            p for p in run.checkpoints.iterdir() if _CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()
        ):
            try:
                own = json.loads((step / MANIFEST).read_text()).get("files")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(own, list):  # a checkpoint saved since the manifest names its files
                found += [p for p in sorted(step.iterdir()) if p.name not in own]
    evals = run.root / EVAL
    if evaluations and evals.is_dir() and not evals.is_symlink():
        for entry in sorted(evals.iterdir()):
            if not entry.is_dir() or entry.is_symlink():
                found.append(entry)
            else:
                found += [
                    p for p in sorted(entry.iterdir()) if not _EVAL_ENTRY.fullmatch(p.name) or not p.is_file()
                ]
    return found


def evaluations_of_kept_models(run: RunDir) -> list[tuple[Path, Path]]:
    """The folders of eval/ that hold the evaluation of a model an overwrite does not replace (model/ renamed
    model_v1 to keep it, then evaluated): (the folder, the model)."""
    evals, kept = run.root / EVAL, []
    replaced = [run.checkpoints.resolve(), run.model.resolve(), run.adapter.resolve()]
    for metrics in (
        sorted(evals.glob(f"*/{EVAL_METRICS}")) if evals.is_dir() and not evals.is_symlink() else []
    ):
        try:
            spec = json.loads(metrics.read_text()).get("checkpoint")
        except (OSError, ValueError, AttributeError):
            continue
        model = Path(spec) if isinstance(spec, str) and spec else None
        where = model.resolve() if model is not None and model.is_dir() else None
        if where is not None and not any(where == r or r in where.parents for r in replaced):
            kept.append((metrics.parent, model))
    return kept


def holds_a_config(manifest: Path) -> bool:
    """A checkpoint's manifest that holds the run's resolved config."""
    try:
        return isinstance(json.loads(manifest.read_text()).get("config"), dict)
    except (OSError, ValueError, AttributeError):
        return False


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def is_hub_name(spec: str | None) -> bool:
    """A hub repo id ("bert-base-uncased", "org/name") and not a local path: at most one slash, no
    leading ".", "/" or "~", nothing that exists on disk."""
    return bool(spec) and not Path(spec).expanduser().exists() and bool(_HUB_ID.fullmatch(spec))


def kind_of(path: Path) -> str | None:
    """What an existing folder is: "checkpoint" (training state), "export" (a save_pretrained model),
    "run" (a run directory), or None."""
    if not path.is_dir():
        return None
    if (
        (path / MANIFEST).exists()
        or (path / COMPLETE).exists()
        or path.name.startswith((PREFIX, f".tmp-{PREFIX}"))
    ):
        return "checkpoint"
    if (path / "config.json").is_file():
        return "export"
    run = RunDir(path)
    if run.checkpoints.is_dir() or run.model.is_dir() or run.results.is_file():
        return "run"
    return None
