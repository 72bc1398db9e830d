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
from finetune.errors import UserError, on_failure

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
                raise UserError(
                    f"output_dir {self.root} is in use by a run still going in another process; let it end (or "
                    "stop it with Ctrl-C or SIGTERM: it saves a checkpoint), then run again, or choose another "
                    "output_dir"
                ) from None
            except OSError:  # no flock here (ENOLCK, EOPNOTSUPP): no guard, as before
                pass
            yield
        finally:
            os.close(fd)

    def holds_run(self) -> str | None:
        """'a finished run', 'a started run' (checkpoints or a log), or None."""
        from finetune.checkpoint import list_checkpoints

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
    run aside, refuse one whose folders hold files of the user's (`check_only_run_entries`). `resume_from`:
    resume_from_checkpoint (latest, a checkpoint's path) or None."""
    run = RunDir(out)
    check_not_inside_a_run(run.root)
    existing = next(p for p in (run.root, *run.root.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"output_dir {out}: {existing} is a file, not a folder; choose another output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"output_dir {out}: {existing} is not writable; choose another output_dir")
    held = run.holds_run() if run.root.is_dir() else None  # 'a finished run', 'a started run', or None
    given = Path(resume_from).expanduser() if resume_from else None
    elsewhere = given is not None and given.is_dir() and not resumes_here(run.root, resume_from)
    if elsewhere and held and not overwrite:  # a checkpoint of another run continued here would write over this one
        raise UserError(
            f"output_dir {out} holds {held} of its own, and resume_from_checkpoint={resume_from} is a checkpoint of "
            "another run: the resumed run would write over it; choose a new output_dir (or leave output_dir out to "
            "continue in the checkpoint's own run; overwrite_output_dir=true replaces this one)"
        )
    resume = bool(resume_from) and not elsewhere  # from elsewhere, what is here is replaced as by a fresh run
    if overwrite and resume:  # a resume continues what is there: nothing is replaced
        (said or checks.Said()).warn(f"overwrite_output_dir=true is not used: resume_from_checkpoint continues the run in {run.root}, "
             "nothing there is replaced (leave one of them out)")
    if not resume and not held and (run.root / STUDY).is_file():
        raise UserError(_holds_a_search(run))
    if overwrite and not resume and run.previous.is_dir():  # an overwrite now would delete that run
        raise UserError(f"output_dir {out} holds {PREVIOUS}: the run an earlier overwrite set aside and did "
                        f"not finish replacing; to keep that run, move the files of {PREVIOUS} back into {run.root}, or "
                        f"delete {PREVIOUS} to let this overwrite replace it")  # fmt: skip
    if overwrite and not resume and run.root.is_dir() and not held:
        check_files_in_the_way(run, trackers)  # the user's config.yaml: not written over
    if (overwrite or resume) and held:
        check_only_run_entries(run, evaluations=not resume)  # the user's notes in model/: deleted with it
    if resume or not run.root.exists() or overwrite:
        return
    if held:
        from finetune.checkpoint import list_checkpoints

        # An overwrite is offered only where it would not be refused (a set-aside run is in the way).
        offers = [] if run.previous.is_dir() else ["pass overwrite_output_dir=true to replace it"]
        offers += ["resume_from_checkpoint=latest to continue it"] if list_checkpoints(run.root) else []
        said = ", ".join(offers) + (", or " if offers else "")
        raise UserError(f"output_dir {out} already holds {held}; {said}choose another output_dir" + set_aside_note(run))
    if any(run.root.iterdir()):
        raise UserError(
            f"output_dir {out} holds files that are not a run of this app; choose an empty or new "
            "output_dir, or pass overwrite_output_dir=true to write into it (nothing there is deleted)"
        )


def _holds_a_search(run: RunDir) -> str:
    """A search's folder (finetune/search.py) given to a training run: neither a run to replace nor a
    folder to write into (its model/ is the best trial's export)."""
    return (f"output_dir {run.root} holds a hyperparameter search ({STUDY}, its trials, and model/: the best "
            "trial's export), not a run; choose another output_dir (to continue the search, run finetune/search.py "
            "again with this output_dir)")  # fmt: skip


def check_files_in_the_way(run: RunDir, trackers: bool) -> None:
    """overwrite_output_dir=true into a folder that holds no run writes into it and deletes nothing: so a
    file there with the name of one a run writes (the user's config.yaml, model/) is refused."""
    names = run.run_files() if trackers else RUN_FILES
    found = [name + ("/" if (run.root / name).is_dir() else "") for name in names if (run.root / name).exists()]
    if found:
        raise UserError(
            f"output_dir {run.root} holds {', '.join(found)}, which no run of this app wrote there; a run would "
            "write over them: move them, or choose another output_dir (overwrite_output_dir=true replaces "
            "only a run)"
        )


# Folders of a run that a later step of that run (or of an overwrite, a resume) deletes or replaces whole:
# the checkpoints (retention, a re-save), the export and the adapter (the next export), what an overwrite
# sets aside, and the export's staging folders. No output_dir may lie inside one.
_REPLACED_WHOLE = {
    CHECKPOINTS: "checkpoints folder",
    MODEL: "export",
    ADAPTER: "LoRA adapter",
    PREVIOUS: "set-aside earlier run",
    f"{PREVIOUS}.tmp": "set-aside earlier run",
    EXPORT_STAGE: "export being written",
    EXPORT_ASIDE: "earlier export",
}
_CHECKPOINT_NAME = re.compile(rf"(\.tmp-|\.old-)?{PREFIX}\d+")


def _looks_like_a_run(path: Path) -> bool:
    """A run directory, as far as nesting goes: finished, or started (its log, or its config beside its
    checkpoints/). A project folder of the user's that has a model/ subfolder is not one."""
    run = RunDir(path)
    return run.results.is_file() or run.metrics.is_file() or (run.config.is_file() and run.checkpoints.is_dir())


def replaced_whole_around(path: Path) -> Path | None:
    """The folder of a run that holds `path` (or is it) and that the run deletes or replaces whole (its
    checkpoints/, model/, ...: `_REPLACED_WHOLE`); None if there is none."""
    path = Path(path).expanduser().resolve()
    return next((p for p in (path, *path.parents) if p.name in _REPLACED_WHOLE and _looks_like_a_run(p.parent)), None)


def check_not_inside_a_run(out: Path) -> None:
    """Refuse an output_dir that is, or lies inside, a folder of another run that the other run deletes or
    replaces whole (`_REPLACED_WHOLE`: its checkpoints/, model/, ...): that run's checkpoint retention,
    resume or next overwrite would delete this one without a word. A checkpoint is named as such, with the
    setting that takes it (resume_from_checkpoint)."""
    path = Path(out).expanduser().resolve()
    for inner in (path, *path.parents):
        outer = inner.parent
        if inner.name == EVAL and _looks_like_a_run(outer):  # evaluations' own folder: no run's output_dir
            raise UserError(
                f"output_dir {out} {'is' if path == inner else 'is inside'} the eval/ folder of the run in {outer}, "
                "where its evaluations go and which its next overwrite sets aside whole; choose an output_dir "
                f"outside {inner}"
            )
        if inner.name not in _REPLACED_WHOLE or not _looks_like_a_run(outer):
            continue
        if inner.name == CHECKPOINTS and path != inner:
            step = path.relative_to(inner).parts[0]
            if re.fullmatch(rf"{PREFIX}\d+", step) and (inner / step).is_dir():  # a checkpoint: resumable
                what = (f"holds files that are not a run of this app: it is checkpoint {step} of the run in {outer}"
                        if path == inner / step else f"is inside checkpoint {step} of the run in {outer}")
                raise UserError(
                    f"output_dir {out} {what}, which that run deletes when it prunes or re-saves its checkpoints; "
                    f"to continue from it pass resume_from_checkpoint={inner / step} (output_dir={outer}, or a new "
                    "folder outside that run's checkpoints/), or choose an output_dir outside it"
                )
        where = "is" if path == inner else "is inside"  # (a .tmp- folder: where a save in progress writes)
        raise UserError(
            f"output_dir {out} {where} the {_REPLACED_WHOLE[inner.name]} of the run in {outer} ({inner}), which "
            "that run deletes or replaces whole (checkpoint retention, a resume, its next export or overwrite); "
            f"choose an output_dir outside {inner}"
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
_EVAL_ENTRY = re.compile(rf"(\.tmp-)?({re.escape(EVAL_METRICS)}|{re.escape(CONFUSION_MATRIX)}|{re.escape(PREDICTIONS)})")


def _entries_not_of_a_run(run: RunDir, evaluations: bool) -> list[Path]:
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


def _evaluations_of_kept_models(run: RunDir) -> list[tuple[Path, Path]]:
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


def check_only_run_entries(run: RunDir, evaluations: bool = True) -> None:
    """overwrite_output_dir=true over a run moves its checkpoints/ and model/ (and adapter/, and eval/ with
    the replaced model's evaluations: `evaluations`, an overwrite, not a resume) aside whole and
    deletes them once the new run is finished: so a file or folder of the user's inside them (notes in
    model/, a backup copy of a checkpoint under another name) would be deleted with them. Refused, before
    anything is moved, naming one, rather than kept: the new run's export replaces model/ whole, and a
    file kept among the new run's checkpoints would be deleted by a later overwrite all the same."""
    for name in (PREVIOUS, f"{PREVIOUS}.tmp"):  # where an overwrite sets the run aside: a folder, or nothing
        path = run.root / name
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise UserError(
                f"output_dir {run.root} holds {name}, a file no run of this app wrote; overwrite_output_dir=true "
                f"sets the earlier run aside under that name: move or rename {path}, then run again"
            )
    kept = _evaluations_of_kept_models(run) if evaluations else []
    if kept:  # model/ renamed to keep it: its evaluations went to the run's eval/, which the overwrite replaces
        folder, model = kept[0]
        raise UserError(f"output_dir {run.root} holds {folder}, the evaluation of {model}, which the overwrite keeps "
                        "(no run of this app wrote it there) but would delete with the replaced run's eval/: move "
                        f"{folder} out of {run.root / EVAL}, then run again")  # fmt: skip
    found = _entries_not_of_a_run(run, evaluations)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        top = found[0].relative_to(run.root).parts[0]
        raise UserError(
            f"output_dir {run.root} holds a run, and {found[0]}{more} inside it, which no run of this app wrote; "
            f"the run replaces {top}/ whole (an overwrite, a resume's export, checkpoint retention) "
            f"and would delete it: move it out of {found[0].parent}, then run again (or choose another output_dir)"
        )


def _remove(root: Path, names: list[str]) -> None:
    for name in names:
        target = root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def step_of(path: Path) -> int | None:
    """The optimizer step in a checkpoint folder's name (step-00000010: 10), or None for another name
    (a copy such as step-00000002-backup is none)."""
    tail = path.name[len(PREFIX) :] if path.name.startswith(PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def set_aside_note(run: RunDir) -> str:
    """Said where a refusal meets a run that an overwrite set aside and never finished replacing (killed
    before it could put it back): what the folder holds, how to keep it."""
    if not run.previous.is_dir():
        return ""
    return (f"; {run.previous} holds the run an earlier overwrite set aside and did not finish replacing: "
            f"to keep that run, move the files of {PREVIOUS} back into {run.root} (an overwrite is refused while "
            "it is there)")  # fmt: skip


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
    from finetune.checkpoint import list_checkpoints

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
    import secrets
    import socket

    from accelerate.utils import broadcast_object_list, gather_object

    world = accelerator.num_processes
    if world == 1 or int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world:
        return
    out = Path(output_dir)
    folders = (out, *out.parents)  # output_dir, then the folders above it
    probe: Path | None = None
    sent: list = [None, 0, None, None]  # probe's name, levels above output_dir, token, why it was not written
    if accelerator.is_main_process:
        up = next(i for i, folder in enumerate(folders) if folder.exists())
        token = secrets.token_hex(16)
        name = f"{SHARED_PROBE_PREFIX}{token[:12]}"
        try:
            with open(folders[up] / name, "x") as f:
                probe = folders[up] / name
                f.write(token)
                f.flush()
                os.fsync(f.fileno())
            sent = [name, up, token, None]
        except OSError as e:
            sent = [None, up, None, f"cannot write a probe file in {folders[up]} ({e.strerror or e})"]
    try:
        name, up, token, failed = broadcast_object_list(sent, from_process=0)  # also: written before read
        if failed:
            raise UserError(f"output_dir {out}: {failed}; choose another output_dir")
        try:
            seen = up < len(folders) and (folders[up] / name).read_text() == token
        except (OSError, ValueError):  # no such file; not text
            seen = False
        machine = os.environ.get("GROUP_RANK", "?")  # torchrun: the machine's rank
        answers = gather_object([(accelerator.process_index, machine, socket.gethostname(), seen)])
    finally:
        if probe is not None:  # every process has read it (the gather) or the run is failing anyway
            probe.unlink(missing_ok=True)
    blind: dict[tuple[str, str], list[int]] = {}
    for index, machine, host, ok in answers:
        if not ok:
            blind.setdefault((machine, host), []).append(index)
    if blind:
        who = "; ".join(
            f"process{'es' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on machine {machine} ({host})"
            for (machine, host), ranks in sorted(blind.items(), key=lambda item: item[1][0])
        )
        main_host = next(host for index, _, host, _ in answers if index == 0)
        where = "output_dir" if up == 0 else f"{folders[up]} (output_dir does not exist yet)"
        raise UserError(
            f"output_dir {out} is not shared by all machines: {who} cannot see the probe file {name} that "
            f"process 0 on {main_host} wrote in {where}; every process writes its own RNG state into each "
            "checkpoint, so a checkpoint is only whole (and resumable) on a filesystem that every machine "
            "mounts at the same path (NFS, Lustre, GPFS...): put output_dir there"
        )


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
            if step / MANIFEST not in _said:
                _said.add(step / MANIFEST)
                (said or checks.Said()).warn(f"{run.config} is missing; resuming with the config saved in {step / MANIFEST}")
            return step / MANIFEST
    raise UserError(
        f"{run.config} is missing and no checkpoint's {MANIFEST} in {run.checkpoints} holds the run's config; "
        "resume with --config <the recipe the run was started with> (and the key=value settings it was given)"
    )


_said: set[Path] = set()  # the command line is read twice in one process (before torch, then by the run)


def _holds_a_config(manifest: Path) -> bool:
    import json

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
