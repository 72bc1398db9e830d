"""The run directory: its layout, the output-dir policy, and what kind of path a user gave.

    <output_dir>/
        config.yaml          the resolved config (what `resume_from_checkpoint` reruns)
        metrics.jsonl        one record per logged step and per evaluation
        checkpoints/step-N/  training state (finetune/checkpoint.py: the format inside)
        model/               the export: save_pretrained, with its tokenizer or image processor and card
        adapter/             a LoRA run's adapters alone, in peft's format
        training_curves.png  loss, validation metrics and learning rate against the step
        results.json         written last: a run with it is finished
        .previous-run/       the run an overwrite replaces, until the new one is finished
        .export-new/         the export being written (model/, adapter/, the curves), until it is whole
        .export-old/         an earlier export, while the new one moves into place (finetune/export.py)

The policy: a run never writes over another run or over files it did not write. A folder that
holds a run is refused unless `overwrite_output_dir=true` (the old run is set aside, renamed, and
comes back if the new one fails before its first checkpoint) or `resume_from_checkpoint` (continue
it); a folder of other files is refused unless `overwrite_output_dir=true`, and then nothing there
is deleted. The machines of a multi-node run must share the folder (`check_shared_output_dir`).

This is the only module that spells these names; the others ask `RunDir`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from finetune import checks
from finetune.checks import runs
from finetune.errors import on_failure

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
# What a run writes in its output_dir, besides Accelerate's tracker logs in <output_dir>/<its name>.
RUN_FILES = (CHECKPOINTS, MODEL, ADAPTER, METRICS_LOG, RESULTS, CONFIG, CURVES)
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

    @contextlib.contextmanager
    def in_use(self):
        """The folder held by this run's main process until the block ends (flock on the folder itself,
        released by the kernel however the process ends): a second command that would overwrite or
        resume the run while it is still going is refused instead of deleting or interleaving its files.
        A file system without flock (some network ones) runs without the guard."""
        import fcntl

        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise checks.explain(runs.IN_USE, self.root) from None
            except OSError:  # no flock here (ENOLCK, EOPNOTSUPP): no guard, as before
                pass
            yield
        finally:
            os.close(fd)

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


# --- the output-dir policy -------------------------------------------------------------------------


def resumes_here(root: Path, resume_from: str | None) -> bool:
    """Whether `resume_from_checkpoint` continues the run in `root` (latest, or one of its checkpoints),
    not another run's checkpoint continued in a new place."""
    if not resume_from:
        return False
    given, root = Path(resume_from).expanduser().resolve(), Path(root).resolve()
    return resume_from == "latest" or given == root or root in given.parents  # the run's own folder: resume
    # says what to give instead (resolve_checkpoint)


def check_output_dir(out: str | Path, overwrite: bool, resume_from: str | None, trackers: bool,
                     said: checks.Said | None = None) -> None:  # fmt: skip
    """Refuse to write over a run, or into a folder of other files, unless told to overwrite it or to
    resume it; refuse a path that cannot become a folder before anything runs; refuse a folder inside
    another run's checkpoints/ or export (`check_not_inside_a_run`); and, before an overwrite moves a
    run aside, refuse one whose folders hold files of the user's. `resume_from`: resume_from_checkpoint
    (latest, a checkpoint's path) or None. The rules: finetune/checks/runs.py, `OUTPUT_DIR`."""
    run = RunDir(out)
    check_not_inside_a_run(run.root)
    given = Path(resume_from).expanduser() if resume_from else None
    subject = runs.OutputDir(
        out, run, overwrite, resume_from, trackers,
        existing=next(p for p in (run.root, *run.root.parents) if p.exists()),
        elsewhere=given is not None and given.is_dir() and not resumes_here(run.root, resume_from),
    )  # fmt: skip
    checks.gate(runs.OUTPUT_DIR, subject, said=said if said is not None else checks.Said())


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
    return run.results.is_file() or run.metrics.is_file() or (run.config.is_file() and run.checkpoints.is_dir())


def replaced_whole_around(path: Path) -> Path | None:
    """The folder of a run that holds `path` (or is it) and that the run deletes or replaces whole (its
    checkpoints/, model/, ...: `REPLACED_WHOLE`); None if there is none."""
    path = Path(path).expanduser().resolve()
    return next((p for p in (path, *path.parents) if p.name in REPLACED_WHOLE and looks_like_a_run(p.parent)), None)


def check_not_inside_a_run(out: Path) -> None:
    """Refuse an output_dir that is, or lies inside, a folder of another run that the other run deletes or
    replaces whole (`REPLACED_WHOLE`: its checkpoints/, model/, ...): that run's checkpoint retention,
    resume or next overwrite would delete this one without a word (finetune/checks/runs.py, `INSIDE_A_RUN`)."""
    path = Path(out).expanduser().resolve()
    for inner in (path, *path.parents):
        checks.gate(runs.INSIDE_A_RUN, out, path, inner)


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
_EVAL_ENTRY = re.compile(rf"(\.tmp-)?({re.escape(EVAL_METRICS)}|{re.escape(CONFUSION_MATRIX)}|{re.escape(PREDICTIONS)})")


def entries_not_of_a_run(run: RunDir, evaluations: bool) -> list[Path]:
    """The entries of run's checkpoints/, model/ and adapter/ (and with `evaluations`, of the evaluations'
    folders in eval/) that no run or evaluation of this app wrote there."""
    found = []
    for folder, written in ((run.checkpoints, _CHECKPOINT_NAME), (run.model, _EXPORT_ENTRY), (run.adapter, _EXPORT_ENTRY)):
        if folder.is_dir() and not folder.is_symlink():
            found += [p for p in sorted(folder.iterdir()) if not written.fullmatch(p.name)]
    if run.checkpoints.is_dir() and not run.checkpoints.is_symlink():  # inside a checkpoint: what it holds
        for step in sorted(p for p in run.checkpoints.iterdir() if _CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()):
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
                found += [p for p in sorted(entry.iterdir()) if not _EVAL_ENTRY.fullmatch(p.name) or not p.is_file()]
    return found


def evaluations_of_kept_models(run: RunDir) -> list[tuple[Path, Path]]:
    """The folders of eval/ that hold the evaluation of a model an overwrite does not replace (model/ renamed
    model_v1 to keep it, then evaluated): (the folder, the model)."""
    evals, kept = run.root / EVAL, []
    replaced = [run.checkpoints.resolve(), run.model.resolve(), run.adapter.resolve()]
    for metrics in sorted(evals.glob(f"*/{EVAL_METRICS}")) if evals.is_dir() and not evals.is_symlink() else []:
        try:
            spec = json.loads(metrics.read_text()).get("checkpoint")
        except (OSError, ValueError, AttributeError):
            continue
        model = Path(spec) if isinstance(spec, str) and spec else None
        where = model.resolve() if model is not None and model.is_dir() else None
        if where is not None and not any(where == r or r in where.parents for r in replaced):
            kept.append((metrics.parent, model))
    return kept


def _remove(root: Path, names: list[str]) -> None:
    for name in names:
        target = root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def set_aside_previous_run(run: RunDir) -> None:
    """overwrite_output_dir=true over a run: its files move to <output_dir>/.previous-run (renames, no
    copy) until this run is finished, when `finish_overwrite` deletes them. If this run fails before it
    has a checkpoint of its own (a mistake found mid-run, a full disk, a diverged loss), they come back.
    An earlier overwrite that never finished left the last finished run there: it stays, the unfinished
    run's files go. Main process only."""
    names, aside = run.replaced_files(), run.previous
    if aside.is_dir():  # check_output_dir refuses an overwrite that would delete it; here only by a race
        _remove(run.root, names)
    else:
        moving = run.root / f"{PREVIOUS}.tmp"  # a kill while moving leaves this: the next overwrite goes on
        moving.mkdir(exist_ok=True)
        for name in names:
            if (run.root / name).exists() or (run.root / name).is_symlink():
                os.replace(run.root / name, moving / name)
        os.replace(moving, aside)
    on_failure(functools.partial(restore_previous_run, run))


def restore_previous_run(run: RunDir) -> None:
    """After a failed overwrite: the run that was there comes back, unless this one left a checkpoint to
    resume from (a signal, a diverged loss after a save): then both stay, the earlier one set aside."""
    if not run.previous.is_dir() or list_checkpoints(run.root):
        return
    _remove(run.root, run.replaced_files())
    for path in run.previous.iterdir():
        os.replace(path, run.root / path.name)
    run.previous.rmdir()


def finish_overwrite(run: RunDir) -> None:
    """The run this one replaced, now replaced: deleted once this run is finished."""
    shutil.rmtree(run.previous, ignore_errors=True)


# --- a multi-node run's output_dir ----------------------------------------------------------------


def check_shared_output_dir(accelerator, output_dir: str | Path) -> None:
    """Refuse, before anything is written, an output_dir that the machines of a multi-node run do not
    share: one line naming every process that cannot see the main process's file there.

    Every process writes its own RNG state into each checkpoint (`random_states_<rank>.pkl`) and the
    main process marks it COMPLETE. With an output_dir local to each machine, the main machine's
    checkpoints look complete but lack the other machines' files, and a resume fails on them. So when
    the processes span several machines (torchrun's LOCAL_WORLD_SIZE below the world size), the main
    process writes a random token into a probe file in output_dir, or in the nearest existing folder
    above it when output_dir does not exist yet; every process reads the file of that name in its own
    output_dir (as it resolved it), or the same number of levels above; the answers are gathered, and
    the main process deletes the probe. On one machine this returns at once.
    """
    import socket

    from accelerate.utils import broadcast_object_list, gather_object

    world = accelerator.num_processes
    if world == 1 or int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world:
        return
    out = Path(output_dir)
    folders = (out, *out.parents)  # output_dir, then the folders above it
    # the probe's name, its levels above output_dir, its token, why it was not written
    probe, sent = _write_probe(folders) if accelerator.is_main_process else (None, [None, 0, None, None])
    try:
        name, up, token, failed = broadcast_object_list(sent, from_process=0)  # also: written before read
        checks.gate(runs.PROBE, out, failed)
        try:
            seen = up < len(folders) and (folders[up] / name).read_text() == token
        except (OSError, ValueError):  # no such file; not text
            seen = False
        machine = os.environ.get("GROUP_RANK", "?")  # torchrun: the machine's rank
        answers = gather_object([(accelerator.process_index, machine, socket.gethostname(), seen)])
    finally:
        if probe is not None:  # every process has read it (the gather) or the run is failing anyway
            probe.unlink(missing_ok=True)
    checks.gate(runs.SHARED, runs.Probe(out, name, folders[up], up, answers))


def _write_probe(folders: tuple[Path, ...]) -> tuple[Path | None, list]:
    """The main process's probe file, in the first of `folders` that exists: (its path, what it tells the
    others: [name, levels above output_dir, token, None]), or (None, [None, levels, None, (folder, why)])
    where it cannot be written."""
    import secrets

    up = next(i for i, folder in enumerate(folders) if folder.exists())
    token = secrets.token_hex(16)
    name = f"{SHARED_PROBE_PREFIX}{token[:12]}"
    try:
        with open(folders[up] / name, "x") as f:
            probe = folders[up] / name
            f.write(token)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return None, [None, up, None, (str(folders[up]), e.strerror or str(e))]
    return probe, [name, up, token, None]


# --- what a user's path is ------------------------------------------------------------------------


def resumed_run_config(resume: str | None, output_dir: str | Path, said: checks.Said | None = None) -> Path | None:
    """The saved config.yaml of the run that a resume continues, for a command that names no recipe:
    with `latest`, the run in `output_dir`; with a checkpoint directory, the run that holds it
    (<run>/checkpoints/<step>). None when there is no such run: a folder of the user's that holds some
    config.yaml but no checkpoints is no run.

    A run whose config.yaml was deleted (or never written) is not resumed with the default recipe (which
    would be refused one differing setting at a time): every checkpoint's manifest.json holds the resolved
    config, so that of the checkpoint the resume starts from (`latest`: the newest complete one whose
    manifest holds one) is the recipe, said in one `warning:` line; a run with none is one error line."""
    if not isinstance(resume, str) or not resume:
        return None
    named = None if resume == "latest" else Path(resume).expanduser().resolve()
    run = RunDir(Path(str(output_dir)).expanduser() if named is None else named.parent.parent)
    if not run.checkpoints.is_dir():
        return None
    if run.config.is_file():
        return run.config
    if not (run.metrics.is_file() or run.results.is_file()):
        return None  # checkpoints in a folder that is no run (a copy of the user's): the recipe given is used
    if named is not None and named.parent != run.checkpoints.resolve():
        return None  # not <run>/checkpoints/<step>: resolve_checkpoint says what it is
    steps = [named] if named is not None else sorted(
        (p for p in run.checkpoints.glob(f"{PREFIX}*") if step_of(p) is not None and (p / COMPLETE).is_file()),
        key=step_of, reverse=True)  # fmt: skip
    if not steps or not all(p.is_dir() for p in steps):
        return None  # no checkpoint: the resume says so
    for step in steps:
        if _holds_a_config(step / MANIFEST):
            checks.gate(runs.RESUMED_CONFIG, run, step / MANIFEST, said=said if said is not None else checks.Said())
            return step / MANIFEST
    raise checks.explain(runs.NO_CONFIG, run)


def _holds_a_config(manifest: Path) -> bool:
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
    if (path / MANIFEST).exists() or (path / COMPLETE).exists() or path.name.startswith((PREFIX, f".tmp-{PREFIX}")):
        return "checkpoint"
    if (path / "config.json").is_file():
        return "export"
    run = RunDir(path)
    if run.checkpoints.is_dir() or run.model.is_dir() or run.results.is_file():
        return "run"
    return None
