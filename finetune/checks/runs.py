"""Runs: the output directory and its policy, checkpoints (their manifests, their damage, their loading),
resumes, and the writes that only the running job meets (a checkpoint or the export on a full, read-only
or failing disk). Asked by finetune/rundir.py, finetune/checkpoint.py and finetune/export.py, in this order:

    INSIDE_A_RUN     output_dir inside a folder of another run that the run deletes or replaces whole
    OUTPUT_DIR       what output_dir is and holds, against overwrite_output_dir and resume_from_checkpoint
    IN_USE           a run still going in another process holds the folder
    SET_ASIDE_FAILED an overwrite that cannot move the earlier run aside
    PROBE, SHARED    a multi-node run's output_dir, which every machine must share
    RESUMED_CONFIG   a resume whose run lost its config.yaml: the checkpoint's manifest holds one, or none does
    LATEST, NAMED    resume_from_checkpoint=latest, or a path: what it names
    PROBLEMS         what keeps a checkpoint from loading, naming the file (MANIFEST: its manifest.json)
    RESUME, PLAN     a resume that is not the run that saved the checkpoint, or that it has already passed
    LOAD, *_FAILED   loading the state: the files it needs, pickles that are not plain data, weights that
                     do not fit
    SAVE_FAILED      a checkpoint that could not be written (its process alone meets it)
    EXPORT_FAILED    the export that could not be written
    ONNX_COMMAND     finetune.onnx_export's command line
    ONNX_SOURCE      what finetune.onnx_export is pointed at: no such path, a file, a LoRA adapter alone, no export
    ONNX_OUTPUT      finetune.onnx_export's --output-dir: a file, a folder inside a model's or inside what
                     a run replaces whole (its checkpoints/), one it may not replace whole
    ONNX_WRITE_FAILED the ONNX files that cannot be written (read-only, full)

A damaged checkpoint is found by the rule that names its damage (`PROBLEMS`, whose line is the damage
alone: `checkpoint_problem`, and `latest`'s list of what it skipped); it is refused under that rule's id
with what to do after it (`damaged`).

The layout's names (checkpoints/, step-N, COMPLETE, manifest.json) are finetune/layout.py's, below this
layer; finetune/rundir.py, which asks these rules, is above it.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune import checks, layout
from finetune.checks import Rule, rule
from finetune.errors import UserError, first_line, remedy
from finetune.text import pasted

# What to do about a damaged checkpoint, after its damage.
ANOTHER = "use another checkpoint (resume_from_checkpoint=latest skips damaged ones)"
# What a resume reads from a manifest, all counts.
MANIFEST_COUNTS = ("step", "epoch", "samples_in_epoch", "world_size", "gradient_accumulation_steps",
                   "per_device_train_batch_size")  # fmt: skip


def setting_value(value: Any) -> str:
    """A setting's value as a line shows it: null, true, JSON for a mapping or a list."""
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def set_aside_note(run: layout.RunDir) -> str:
    """Said where a refusal meets a run that an overwrite set aside and never finished replacing (killed
    before it could put it back): what the folder holds, how to keep it."""
    if not run.previous.is_dir():
        return ""
    return (f"; {run.previous} holds the run an earlier overwrite set aside and did not finish replacing: to keep "
            f"that run, move the files of {layout.PREVIOUS} back into {run.root} (an overwrite is refused while it is "
            "there)")  # fmt: skip


# --- an output_dir inside another run -------------------------------------------------------------------


def _of_a_run(inner: Path) -> bool:
    return layout.looks_like_a_run(inner.parent)


@rule("runs.output_dir_in_an_eval_folder")
def output_dir_in_an_eval_folder(out: str | Path, path: Path, inner: Path) -> str | None:
    """output_dir in a run's eval/ folder: its evaluations go there, and its next overwrite sets it aside
    whole."""
    if inner.name == layout.EVAL and _of_a_run(inner):
        where = "is" if path == inner else "is inside"
        return (f"output_dir {out} {where} the eval/ folder of the run in {inner.parent}, where its evaluations go "
                f"and which its next overwrite sets aside whole; choose an output_dir outside {inner}")
    return None


@rule("runs.output_dir_in_a_checkpoint")
def output_dir_in_a_checkpoint(out: str | Path, path: Path, inner: Path) -> str | None:
    """output_dir that is, or lies inside, a checkpoint of another run: that run deletes it when it prunes or
    re-saves its checkpoints. Named as a checkpoint, with the setting that takes one (resume_from_checkpoint)."""
    if inner.name != layout.CHECKPOINTS or path == inner or not _of_a_run(inner):
        return None
    outer, step = inner.parent, path.relative_to(inner).parts[0]
    if not re.fullmatch(rf"{layout.PREFIX}\d+", step) or not (inner / step).is_dir():
        return None
    what = (f"holds files that are not a run of this app: it is checkpoint {step} of the run in {outer}"
            if path == inner / step else f"is inside checkpoint {step} of the run in {outer}")
    return (f"output_dir {out} {what}, which that run deletes when it prunes or re-saves its checkpoints; "
            f"to continue from it pass resume_from_checkpoint={pasted(inner / step)} (output_dir={pasted(outer)}, or a new "
            "folder outside that run's checkpoints/), or choose an output_dir outside it")


@rule("runs.output_dir_in_a_replaced_folder")
def output_dir_in_a_replaced_folder(out: str | Path, path: Path, inner: Path) -> str | None:
    """output_dir that is, or lies inside, a folder of another run that the run deletes or replaces whole
    (its checkpoints/, model/, adapter/, a set-aside run, the export being written): that run's retention,
    resume or next overwrite would delete it without a word."""
    if inner.name in layout.REPLACED_WHOLE and _of_a_run(inner):
        where = "is" if path == inner else "is inside"  # (a .tmp- folder: where a save in progress writes)
        return (f"output_dir {out} {where} the {layout.REPLACED_WHOLE[inner.name]} of the run in {inner.parent} "
                f"({inner}), which that run deletes or replaces whole (checkpoint retention, a resume, its next export "
                f"or overwrite); choose an output_dir outside {inner}")  # fmt: skip
    return None


# Asked of each folder from output_dir up (`inner`: output_dir or a folder above it).
INSIDE_A_RUN = [output_dir_in_an_eval_folder, output_dir_in_a_checkpoint, output_dir_in_a_replaced_folder]


# --- what output_dir is and holds -----------------------------------------------------------------------


@dataclass
class OutputDir:
    """output_dir as a run is about to write it: as given (`out`), its run directory, the nearest path at
    or above it that exists, and what the command asks (overwrite_output_dir, resume_from_checkpoint,
    trackers); `elsewhere`: the resume names a checkpoint of another run (continued here as a new run)."""

    out: str | Path
    run: layout.RunDir
    overwrite: bool
    resume_from: str | None
    trackers: bool
    existing: Path
    elsewhere: bool

    @functools.cached_property
    def held(self) -> str | None:
        """'a finished run', 'a started run' (checkpoints or a log), or None; read once the folder is known
        to be writable."""
        return self.run.holds_run() if self.run.root.is_dir() else None

    @property
    def resume(self) -> bool:
        """A resume that continues what is here (one from elsewhere replaces it, as a fresh run does)."""
        return bool(self.resume_from) and not self.elsewhere

    @property
    def fresh(self) -> bool:
        """A new run into an existing folder: neither overwrite nor resume."""
        return not (self.resume or self.overwrite) and self.run.root.exists()


@rule("runs.output_dir_under_a_file")
def output_dir_under_a_file(o: OutputDir) -> str | None:
    """output_dir that is a file, or lies under one: it cannot become a folder."""
    if not o.existing.is_dir():
        return f"output_dir {o.out}: {o.existing} is a file, not a folder; choose another output_dir"
    return None


@rule("runs.output_dir_not_writable")
def output_dir_not_writable(o: OutputDir) -> str | None:
    """output_dir (or the folder it would be made in) that this user may not write into."""
    if not os.access(o.existing, os.W_OK | os.X_OK):
        return f"output_dir {o.out}: {o.existing} is not writable; choose another output_dir"
    return None


@rule("runs.resume_over_another_run")
def resume_over_another_run(o: OutputDir) -> str | None:
    """A checkpoint of one run resumed into the folder of another run: the resumed run would write over it."""
    if o.elsewhere and o.held and not o.overwrite:
        return (f"output_dir {o.out} holds {o.held} of its own, and resume_from_checkpoint={o.resume_from} is a "
                "checkpoint of another run: the resumed run would write over it; choose a new output_dir (or leave "
                "output_dir out to continue in the checkpoint's own run; overwrite_output_dir=true replaces this one)")
    return None


@rule("runs.overwrite_beside_resume", warning=True)
def overwrite_beside_resume(o: OutputDir) -> str | None:
    """overwrite_output_dir=true beside a resume of the run in output_dir: the resume continues it, so
    nothing is replaced and the overwrite is not used."""
    if o.overwrite and o.resume:
        return (f"overwrite_output_dir=true is not used: resume_from_checkpoint continues the run in {o.run.root}, "
                "nothing there is replaced (leave one of them out)")
    return None


@rule("runs.output_dir_holds_a_search")
def output_dir_holds_a_search(o: OutputDir) -> str | None:
    """A hyperparameter search's folder (finetune/search.py) given to a training run: neither a run to
    replace nor a folder to write into (its model/ is the best trial's export)."""
    if not o.resume and not o.held and (o.run.root / layout.STUDY).is_file():
        return (f"output_dir {o.run.root} holds a hyperparameter search ({layout.STUDY}, its trials, and model/: the "
                "best trial's export), not a run; choose another output_dir (to continue the search, run "
                "finetune/search.py again with this output_dir)")
    return None


@rule("runs.overwrite_over_a_set_aside_run")
def overwrite_over_a_set_aside_run(o: OutputDir) -> str | None:
    """An overwrite where an earlier overwrite set a run aside (.previous-run) and never finished replacing
    it: this overwrite would delete that run."""
    if o.overwrite and not o.resume and o.run.previous.is_dir():
        return (f"output_dir {o.out} holds {layout.PREVIOUS}: the run an earlier overwrite set aside and did not "
                f"finish replacing; to keep that run, move the files of {layout.PREVIOUS} back into {o.run.root}, or "
                f"delete {layout.PREVIOUS} to let this overwrite replace it")  # fmt: skip
    return None


@rule("runs.files_in_the_way")
def files_in_the_way(o: OutputDir) -> str | None:
    """overwrite_output_dir=true into a folder that holds no run writes into it and deletes nothing: so a file
    there with the name of one a run writes (the user's config.yaml, model/) is refused."""
    if not o.overwrite or o.resume or not o.run.root.is_dir() or o.held:
        return None
    names = o.run.run_files() if o.trackers else layout.RUN_FILES
    found = [name + ("/" if (o.run.root / name).is_dir() else "") for name in names if (o.run.root / name).exists()]
    if found:
        return (f"output_dir {o.run.root} holds {', '.join(found)}, which no run of this app wrote there; a run would "
                "write over them: move them, or choose another output_dir (overwrite_output_dir=true replaces "
                "only a run)")
    return None


def _over_a_run(o: OutputDir) -> bool:
    """An overwrite or a resume of the run here: its folders are moved aside or replaced whole."""
    return bool((o.overwrite or o.resume) and o.held)


@rule("runs.set_aside_name_taken")
def set_aside_name_taken(o: OutputDir) -> str | None:
    """A file (or link) of the user's under the name an overwrite sets the earlier run aside as."""
    for name in (layout.PREVIOUS, f"{layout.PREVIOUS}.tmp") if _over_a_run(o) else ():
        path = o.run.root / name
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            return (f"output_dir {o.run.root} holds {name}, a file no run of this app wrote; overwrite_output_dir=true "
                    f"sets the earlier run aside under that name: move or rename {path}, then run again")
    return None


@rule("runs.evaluation_of_a_kept_model")
def evaluation_of_a_kept_model(o: OutputDir) -> str | None:
    """An overwrite over a run whose eval/ holds the evaluation of a model the overwrite keeps (model/
    renamed to keep it, then evaluated): the replaced run's eval/ would take it along."""
    kept = layout.evaluations_of_kept_models(o.run) if _over_a_run(o) and not o.resume else []
    if kept:
        folder, model = kept[0]
        return (f"output_dir {o.run.root} holds {folder}, the evaluation of {model}, which the overwrite keeps "
                "(no run of this app wrote it there) but would delete with the replaced run's eval/: move "
                f"{folder} out of {o.run.root / layout.EVAL}, then run again")  # fmt: skip
    return None


@rule("runs.files_inside_a_run")
def files_inside_a_run(o: OutputDir) -> str | None:
    """An overwrite or a resume over a run whose checkpoints/, model/, adapter/ (or, for an overwrite, eval/)
    hold a file of the user's: the run replaces those folders whole and would delete it. Refused before
    anything is moved, naming one, rather than kept (a file kept among the new run's checkpoints would be
    deleted by a later overwrite all the same)."""
    found = layout.entries_not_of_a_run(o.run, evaluations=not o.resume) if _over_a_run(o) else []
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        top = found[0].relative_to(o.run.root).parts[0]
        return (f"output_dir {o.run.root} holds a run, and {found[0]}{more} inside it, which no run of this app wrote; "
                f"the run replaces {top}/ whole (an overwrite, a resume's export, checkpoint retention) "
                f"and would delete it: move it out of {found[0].parent}, then run again (or choose another output_dir)")
    return None


@rule("runs.output_dir_holds_a_run")
def output_dir_holds_a_run(o: OutputDir) -> str | None:
    """A new run into the folder of another run (finished or started): never written over unless told to
    replace it (overwrite_output_dir) or continue it (resume_from_checkpoint), which are offered."""
    if not o.fresh or not o.held:
        return None
    # An overwrite is offered only where it would not be refused (a set-aside run is in the way).
    offers = [] if o.run.previous.is_dir() else ["pass overwrite_output_dir=true to replace it"]
    offers += ["resume_from_checkpoint=latest to continue it"] if layout.list_checkpoints(o.run.root) else []
    said = ", ".join(offers) + (", or " if offers else "")
    return f"output_dir {o.out} already holds {o.held}; {said}choose another output_dir" + set_aside_note(o.run)


@rule("runs.output_dir_holds_other_files")
def output_dir_holds_other_files(o: OutputDir) -> str | None:
    """A new run into a folder of files that are no run's: written into only with overwrite_output_dir=true
    (and then nothing there is deleted)."""
    if o.fresh and not o.held and any(o.run.root.iterdir()):
        return (f"output_dir {o.out} holds files that are not a run of this app; choose an empty or new "
                "output_dir, or pass overwrite_output_dir=true to write into it (nothing there is deleted)")
    return None


OUTPUT_DIR = [output_dir_under_a_file, output_dir_not_writable, resume_over_another_run, overwrite_beside_resume,
              output_dir_holds_a_search, overwrite_over_a_set_aside_run, files_in_the_way, set_aside_name_taken,
              evaluation_of_a_kept_model, files_inside_a_run, output_dir_holds_a_run, output_dir_holds_other_files]  # fmt: skip


@rule("runs.output_dir_in_use")
def output_dir_in_use(root: Path) -> str:
    """output_dir held by a run still going in another process (its lock): an overwrite would delete its
    files, a resume interleave with them."""
    return (f"output_dir {root} is in use by a run still going in another process; let it end (or stop it with "
            "Ctrl-C or SIGTERM: it saves a checkpoint), then run again, or choose another output_dir")


IN_USE = [output_dir_in_use]


@rule("runs.set_aside_failed")
def set_aside_failed(run: layout.RunDir, name: str, error: OSError, left: list[str]) -> str:
    """An overwrite that cannot move the earlier run aside (a read-only or busy folder of it): the run stays
    as it was, and the line says what could not move and why."""
    kept = ("the earlier run is as it was" if not left else
            f"{', '.join(left)} could not move back: they are in {run.root / layout.PREVIOUS}.tmp")  # fmt: skip
    return (f"overwrite_output_dir=true cannot set aside the run in {run.root}: {run.root / name} does not move "
            f"({error.strerror or error}); {kept}; make it movable (its permissions, or whatever holds it), or "
            "choose another output_dir")


SET_ASIDE_FAILED = [set_aside_failed]


# --- a multi-node run's output_dir ------------------------------------------------------------------------


@rule("runs.probe_not_written")
def probe_not_written(out: Path, failed: tuple[str, str] | None) -> str | None:
    """A multi-node run's main process that cannot write the probe file in output_dir (or the folder above
    it that exists), which tells whether every machine sees the same folder."""
    if failed:
        folder, why = failed
        return f"output_dir {out}: cannot write a probe file in {folder} ({why}); choose another output_dir"
    return None


PROBE = [probe_not_written]


@dataclass
class Probe:
    """What the processes of a multi-node run saw of the main process's probe file `name`, written in
    `folder` (`up` levels above output_dir): (process, machine, host, seen) each."""

    out: Path
    name: str
    folder: Path
    up: int
    answers: list[tuple[int, str, str, bool]]


@rule("runs.output_dir_not_shared")
def output_dir_not_shared(probe: Probe) -> str | None:
    """A multi-node run whose machines do not share output_dir: every process writes its own RNG state into
    each checkpoint, so on folders local to each machine no checkpoint is whole (or resumable)."""
    blind: dict[tuple[str, str], list[int]] = {}
    for index, machine, host, ok in probe.answers:
        if not ok:
            blind.setdefault((machine, host), []).append(index)
    if not blind:
        return None
    who = "; ".join(
        f"process{'es' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on machine {machine} ({host})"
        for (machine, host), ranks in sorted(blind.items(), key=lambda item: item[1][0])
    )
    main_host = next(host for index, _, host, _ in probe.answers if index == 0)
    where = "output_dir" if probe.up == 0 else f"{probe.folder} (output_dir does not exist yet)"
    return (f"output_dir {probe.out} is not shared by all machines: {who} cannot see the probe file {probe.name} that "
            f"process 0 on {main_host} wrote in {where}; every process writes its own RNG state into each "
            "checkpoint, so a checkpoint is only whole (and resumable) on a filesystem that every machine "
            "mounts at the same path (NFS, Lustre, GPFS...): put output_dir there")


SHARED = [output_dir_not_shared]


# --- a resume's recipe ----------------------------------------------------------------------------------


@rule("runs.config_from_a_manifest", warning=True)
def config_from_a_manifest(run: layout.RunDir, manifest: Path) -> str:
    """A resume of a run whose config.yaml is gone: the config saved in the checkpoint's manifest is the
    recipe (not the default one, which would be refused one differing setting at a time)."""
    return f"{run.config} is missing; resuming with the config saved in {manifest}"


RESUMED_CONFIG = [config_from_a_manifest]


@rule("runs.no_config_to_resume")
def no_config_to_resume(run: layout.RunDir) -> str:
    """A resume of a run whose config.yaml is gone and whose checkpoints' manifests hold no config: the recipe
    the run was started with must be given."""
    return (f"{run.config} is missing and no checkpoint's {layout.MANIFEST} in {run.checkpoints} holds the run's "
            "config; resume with --config <the recipe the run was started with> (and the key=value settings it was "
            "given)")


NO_CONFIG = [no_config_to_resume]


# --- a checkpoint's damage ------------------------------------------------------------------------------


class Checkpoint:
    """A checkpoint folder as the rules see it: its manifest.json read once (`manifest`, what the JSON
    holds; or `unread`, why it did not read), and whether its state is FSDP's shards."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.file = self.path / layout.MANIFEST

    @functools.cached_property
    def _read(self) -> tuple[Any, Exception | None]:
        try:
            return json.loads(self.file.read_text()), None
        except (OSError, ValueError) as e:
            return None, e

    @property
    def manifest(self) -> Any:
        return self._read[0]

    @property
    def unread(self) -> Exception | None:
        return self._read[1]

    @functools.cached_property
    def sharded(self) -> bool:
        """FSDP's sharded files: weights and optimizer in their own format."""
        return any(self.path.glob("pytorch_model_fsdp_*"))


@rule("runs.checkpoint_incomplete")
def checkpoint_incomplete(c: Checkpoint) -> str | None:
    """A checkpoint without its COMPLETE marker: its save was interrupted."""
    if not (c.path / layout.COMPLETE).is_file():
        return f"{c.path} has no {layout.COMPLETE} marker: it was interrupted while saving"
    return None


@rule("runs.manifest_unreadable")
def manifest_unreadable(c: Checkpoint) -> str | None:
    """A checkpoint's manifest.json that cannot be read or is not JSON (missing, cut off, empty)."""
    if c.unread is not None:
        return f"{c.file} is unreadable ({first_line(c.unread)})"
    return None


@rule("runs.manifest_not_a_mapping")
def manifest_not_a_mapping(c: Checkpoint) -> str | None:
    """A manifest.json that holds JSON, but not a mapping: not one finetune.run wrote."""
    if not isinstance(c.manifest, dict):
        return f"{c.file} is not a manifest written by finetune.run (it holds a {type(c.manifest).__name__})"
    return None


def _first_bad_count(manifest: dict) -> str | None:
    """The first count a resume reads that the manifest lacks or holds as something else than a count."""
    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    return next((key for key in MANIFEST_COUNTS if key not in manifest or not count(manifest[key])), None)


@rule("runs.manifest_lacks_a_count")
def manifest_lacks_a_count(c: Checkpoint) -> str | None:
    """A manifest without one of the counts a resume reads (step, epoch, samples in the epoch, world size,
    accumulation, batch size)."""
    key = _first_bad_count(c.manifest)
    if key is not None and key not in c.manifest:
        return f"{c.file} lacks '{key}': it is damaged or not written by finetune.run"
    return None


@rule("runs.manifest_count_not_a_count")
def manifest_count_not_a_count(c: Checkpoint) -> str | None:
    """A manifest whose step, epoch, world size (...) is not a count (a string, a negative number, a bool)."""
    key = _first_bad_count(c.manifest)
    if key is not None:
        return f"{c.file} holds {key}={c.manifest[key]!r}, not a count: it is damaged"
    return None


def _label_names(file: Path) -> Any:
    try:
        return json.loads(file.read_text()).get("label_names")
    except (OSError, ValueError, AttributeError):
        return None


@rule("runs.manifest_labels_differ")
def manifest_labels_differ(c: Checkpoint) -> str | None:
    """A checkpoint's label_names that differ from its run's (the weights hold no names, so an edited list
    would swap every prediction's name): the run's results.json, else the names more than half of the run's
    checkpoints hold."""
    labels, checkpoints = c.manifest.get("label_names"), c.path.parent
    if checkpoints.name != layout.CHECKPOINTS or labels is None:
        return None
    results = layout.RunDir(checkpoints.parent).results
    authority, source = _label_names(results), results
    if authority is None:
        others = [_label_names(p / layout.MANIFEST) for p in checkpoints.glob(f"{layout.PREFIX}*") if p != c.path]
        lists = [json.dumps(n) for n in others if n is not None]
        common = max(set(lists), key=lists.count, default=None)
        if common is None or lists.count(common) * 2 <= len(lists) + 1:  # no majority of all the run's
            return None
        authority, source = json.loads(common), f"{lists.count(common)} other checkpoints of the run"
    if authority != labels:
        return (f"{c.file} names the labels {labels[:5]}, but {source} names {authority[:5]}: the manifest was "
                "edited or copied from another run")
    return None


@rule("runs.manifest_of_another_step")
def manifest_of_another_step(c: Checkpoint) -> str | None:
    """A manifest whose step is not its folder's (step-00000002 holds step 2's state): edited, or copied
    from another checkpoint."""
    named = re.fullmatch(rf"{layout.PREFIX}(\d+)", c.path.name)
    if named and int(named.group(1)) != c.manifest["step"]:
        return (f"{c.file} says step {c.manifest['step']}, but its folder is {c.path.name}: the manifest was edited or "
                "copied from another checkpoint")
    return None


# In order: each rule reads what the ones before it found sound.
MANIFEST = [manifest_unreadable, manifest_not_a_mapping, manifest_lacks_a_count, manifest_count_not_a_count,
            manifest_labels_differ, manifest_of_another_step]  # fmt: skip


def _what_is_missing(file: Path) -> str:
    return f"{file} is {'a folder, not a file' if file.exists() else 'missing'}"


@rule("runs.weights_missing")
def weights_missing(c: Checkpoint) -> str | None:
    """A checkpoint without its model.safetensors (or with a folder of that name)."""
    weights = c.path / "model.safetensors"
    return None if c.sharded or weights.is_file() else _what_is_missing(weights)


@rule("runs.weights_damaged")
def weights_damaged(c: Checkpoint) -> str | None:
    """A model.safetensors whose header does not read, or does not cover the file (cut off, overwritten)."""
    from safetensors import SafetensorError, safe_open

    if c.sharded:
        return None
    weights = c.path / "model.safetensors"
    try:
        with safe_open(str(weights), framework="pt"):
            pass
    except (SafetensorError, OSError) as e:
        return f"{weights} is damaged ({first_line(e)})"
    return None


def _first_bad_file(c: Checkpoint) -> Path | None:
    """The first of the torch files a resume reads (the scheduler, the optimizer, each process's RNG state)
    that is missing or no whole zip archive (whose directory is its last bytes: a cut-off or empty file has
    none)."""
    files = [c.path / "scheduler.bin", *([] if c.sharded else [c.path / "optimizer.bin"])]
    files += [c.path / f"random_states_{i}.pkl" for i in range(c.manifest["world_size"])]
    return next((f for f in files if not f.is_file() or not zipfile.is_zipfile(f)), None)


@rule("runs.state_file_missing")
def state_file_missing(c: Checkpoint) -> str | None:
    """A checkpoint without one of its torch files: the scheduler, the optimizer, a process's RNG state."""
    file = _first_bad_file(c)
    return _what_is_missing(file) if file is not None and not file.is_file() else None


@rule("runs.state_file_damaged")
def state_file_damaged(c: Checkpoint) -> str | None:
    """A torch file of a checkpoint that is no whole zip archive, said as what it is: empty, cut off (a zip's
    start without its end), or other bytes (overwritten, or another file)."""
    file = _first_bad_file(c)
    if file is None:
        return None
    with open(file, "rb") as f:
        start = f.read(4)
    what = "empty" if not start else "cut off: a torch file's start without its end" if start == b"PK\x03\x04" else (
        "not a torch file: overwritten, or another file")  # fmt: skip
    return f"{file} is damaged ({what})"


# What keeps a checkpoint from loading, cheaply: the marker, the manifest, the safetensors header, the end of
# each torch file; not the tensors.
PROBLEMS = [checkpoint_incomplete, *MANIFEST, weights_missing, weights_damaged, state_file_missing,
            state_file_damaged]  # fmt: skip


def damaged(found: tuple[Rule, str], path: Path | None = None) -> UserError:
    """The refusal of a damaged checkpoint, under the rule that found the damage: its line, and to use another
    checkpoint; a resume from `path` says it cannot resume from it."""
    found_by, line = found
    return checks.refusal(found_by, f"{f'cannot resume from {path}: ' if path is not None else ''}{line}; {ANOTHER}")


# --- resume_from_checkpoint=latest ----------------------------------------------------------------------


@dataclass
class Latest:
    """What resume_from_checkpoint=latest finds in output_dir's checkpoints/ (`root`): the step-N folders
    marked complete, newest first (`marked`), and each folder it passes over with why (`skipped`): one renamed
    (it cannot order it), a newer save cut short, then each damaged one, as they are tried."""

    output_dir: str | Path  # as given: the line says it so
    root: Path
    marked: list[Path]
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    @classmethod
    def find(cls, output_dir: str | Path) -> Latest:
        root = Path(output_dir) / layout.CHECKPOINTS
        step_of, prefix, complete = layout.step_of, layout.PREFIX, layout.COMPLETE
        marked = sorted((p for p in root.glob(f"{prefix}*") if step_of(p) is not None and p.is_dir()
                         and (p / complete).is_file()), key=step_of, reverse=True)  # fmt: skip
        latest = cls(output_dir, root, marked)
        if not marked:
            return latest
        named = re.compile(rf"(\.tmp-|\.old-)?{prefix}\d+")  # a checkpoint's, or one being saved or replaced
        latest.skipped = [(p, f"it is not named {prefix}<step> (renamed?); to resume from it, give its path")
                          for p in sorted(root.iterdir()) if p.is_dir() and (p / layout.MANIFEST).is_file()
                          and not named.fullmatch(p.name)]  # fmt: skip
        newest = step_of(marked[0])
        latest.skipped += [(p, f"it has no {complete} marker (a save cut short): the run saves that step again")
                           for p in sorted(root.glob(f"{prefix}*")) if p.is_dir() and (step_of(p) or 0) > newest
                           and not (p / complete).is_file()]  # fmt: skip
        return latest


@rule("runs.no_checkpoint_to_resume")
def no_checkpoint_to_resume(latest: Latest) -> str | None:
    """resume_from_checkpoint=latest where output_dir has no complete checkpoint: what to do instead (an
    overwrite where a run without checkpoints is there, else a new run)."""
    if latest.marked:
        return None
    run = layout.RunDir(latest.output_dir)
    held = run.holds_run()  # a run without checkpoints: leaving the resume out is refused too
    again = (f"to start again there, pass overwrite_output_dir=true instead ({latest.output_dir} holds {held} without "
             "a checkpoint: it is set aside, and deleted once the new run finishes)" if held else
             "to start a new run there, leave resume_from_checkpoint out")  # fmt: skip
    return (f"resume_from_checkpoint=latest: no complete checkpoint in {latest.root}; {again} (or give the "
            "output_dir of the run to continue)" + set_aside_note(run))


LATEST = [no_checkpoint_to_resume]


@rule("runs.latest_skipped", warning=True)
def latest_skipped(path: Path, why: str) -> str:
    """A checkpoint that resume_from_checkpoint=latest passed over for an older one that loads: renamed (not
    step-N: it cannot order it), a newer save cut short (no COMPLETE marker), or damaged (its file named)."""
    return f"resume_from_checkpoint=latest skipped {path}: {why}"


SKIPPED = [latest_skipped]


@rule("runs.no_checkpoint_loads")
def no_checkpoint_loads(latest: Latest) -> str:
    """resume_from_checkpoint=latest where every checkpoint is damaged: each one's damage."""
    return (f"resume_from_checkpoint=latest: no checkpoint in {latest.root} loads "
            f"({'; '.join(w for _, w in latest.skipped)}); start again without resume_from_checkpoint, or repair one")


NONE_LOADS = [no_checkpoint_loads]


# --- resume_from_checkpoint=<path> ------------------------------------------------------------------------


@rule("runs.resume_is_a_file")
def resume_is_a_file(spec: str, path: Path) -> str | None:
    """resume_from_checkpoint naming a file (a checkpoint is a folder)."""
    if path.is_file():
        return (f"resume_from_checkpoint={spec} is a file, not a checkpoint folder; give "
                f"<run>/checkpoints/{layout.PREFIX}<step>, or resume_from_checkpoint=latest with the run's output_dir")
    return None


@rule("runs.latest_misspelt")
def latest_misspelt(spec: str, path: Path) -> str | None:
    """resume_from_checkpoint=Latest (last, newest, last-checkpoint): the keyword is `latest`, lower case."""
    if not path.is_dir() and spec.strip().lower() in ("latest", "last", "newest", "last-checkpoint"):
        return f"checkpoint not found: {spec}; the newest checkpoint is resume_from_checkpoint=latest (lower case)"
    return None


@rule("runs.trainer_checkpoint_name")
def trainer_checkpoint_name(spec: str, path: Path) -> str | None:
    """A checkpoint named as transformers' Trainer names them (checkpoint-N), which is not there."""
    trainers = re.fullmatch(r"(?:.*/)?checkpoint-(\d+)/?", spec.strip())
    if not path.is_dir() and trainers:
        prefix = layout.PREFIX
        return (f"checkpoint not found: {spec}; a run's checkpoints are <output_dir>/checkpoints/{prefix}<step, 8 "
                f"digits> (Trainer's checkpoint-N): resume_from_checkpoint=<output_dir>/checkpoints/"
                f"{prefix}{int(trainers[1]):08d}, or latest")  # fmt: skip
    return None


@rule("runs.checkpoint_name_not_found")
def checkpoint_name_not_found(spec: str, path: Path) -> str | None:
    """A checkpoint's name (step-N) that is not there as given (its run's folder left out, its digits short)."""
    ours = re.fullmatch(rf"(?:.*/)?{layout.PREFIX}(\d+)/?", spec.strip())
    if not path.is_dir() and ours:
        prefix = layout.PREFIX
        return (f"checkpoint not found: {spec}; a run's checkpoints are <output_dir>/checkpoints/{prefix}<step, 8 "
                f"digits>: give the path, resume_from_checkpoint=<output_dir>/checkpoints/{prefix}{int(ours[1]):08d}, "
                "or latest")  # fmt: skip
    return None


@rule("runs.checkpoint_not_found")
def checkpoint_not_found(spec: str, path: Path) -> str | None:
    """resume_from_checkpoint naming no folder."""
    return None if path.is_dir() else f"checkpoint not found: {spec}"


@rule("runs.resume_is_an_export")
def resume_is_an_export(spec: str, path: Path) -> str | None:
    """An exported model (save_pretrained) given to resume from: it holds weights, not the training state; it
    can start a new run, and its run (where it kept a checkpoint) can be resumed."""
    if layout.kind_of(path) == "export":
        run = path.resolve().parent
        resume = (f"resume its run with resume_from_checkpoint=latest output_dir={pasted(run)} (or "
                  f"<run>/checkpoints/step-N), or " if layout.list_checkpoints(run) else "")
        return (f"{spec} is an exported model, not a training-state checkpoint: {resume}start a new run from its "
                f"weights with model_name_or_path={pasted(spec)}")
    return None


@rule("runs.resume_is_a_run")
def resume_is_a_run(spec: str, path: Path) -> str | None:
    """A run directory given to resume from: `latest` with it as output_dir, or one of its checkpoints; a new run
    where it kept none."""
    if layout.kind_of(path) != "run":
        return None
    if not layout.list_checkpoints(path):  # nothing to resume: `latest` would be refused too
        return (f"{spec} is a run directory without a checkpoint to resume from; leave resume_from_checkpoint out to "
                "start a new run" + (f" (from its weights: model_name_or_path={pasted(layout.RunDir(path).model)})"
                                     if layout.kind_of(layout.RunDir(path).model) == "export" else ""))
    return (f"{spec} is a run directory; resume it with resume_from_checkpoint=latest output_dir={pasted(spec)}, or "
            f"name one of {layout.RunDir(path).checkpoints}/{layout.PREFIX}N")


@rule("runs.resume_is_a_checkpoints_folder")
def resume_is_a_checkpoints_folder(spec: str, path: Path) -> str | None:
    """A run's checkpoints/ folder given to resume from: which of its checkpoints?"""
    prefix, complete = layout.PREFIX, layout.COMPLETE
    marked = any(p.is_dir() and (p / complete).is_file() for p in path.glob(f"{prefix}*"))
    if path.name == layout.CHECKPOINTS and marked:
        return (f"{spec} is a run's checkpoints folder; name one of its {prefix}N folders, or resume the run "
                f"with resume_from_checkpoint=latest output_dir={pasted(path.parent)}")
    return None


@rule("runs.resume_not_complete")
def resume_not_complete(spec: str, path: Path) -> str | None:
    """A checkpoint named by path without its COMPLETE marker: its save was interrupted."""
    if not (path / layout.COMPLETE).is_file():
        return (f"{spec} is not a complete checkpoint (no {layout.COMPLETE} marker); "
                "it was probably interrupted while saving — use an earlier one or 'latest'")
    return None


NAMED = [resume_is_a_file, latest_misspelt, trainer_checkpoint_name, checkpoint_name_not_found, checkpoint_not_found,
         resume_is_an_export, resume_is_a_run, resume_is_a_checkpoints_folder, resume_not_complete]  # fmt: skip


# --- a resume against the run that saved the checkpoint -------------------------------------------------


@dataclass
class Resume:
    """A resume as it starts: the checkpoint's manifest, this run's config, processes, labels, samples an epoch,
    whether it uses FSDP, its training data's fingerprint, and the settings that make a run what it is
    (`fixed`: finetune/checkpoint.py's FIXED_ON_RESUME)."""

    manifest: dict[str, Any]
    cfg: Any
    num_processes: int
    label_names: list[str]
    train_samples: int
    fsdp: bool
    train_data: dict[str, str] | None
    fixed: tuple[str, ...]

    @property
    def sharded(self) -> bool:
        return self.manifest.get("state") == "sharded"

    @property
    def saved_topology(self) -> tuple[int, int, int]:
        """(processes, accumulation, batch) of the checkpoint's run."""
        m = self.manifest
        return m["world_size"], m["gradient_accumulation_steps"], m["per_device_train_batch_size"]

    @property
    def topology(self) -> tuple[int, int, int]:
        return self.num_processes, self.cfg.gradient_accumulation_steps, self.cfg.per_device_train_batch_size


def _differing(key: str, saved: Any, now: Any) -> tuple[str, Any, Any] | None:
    """A fixed setting's checkpoint value against this run's, or None where they agree."""
    if key == "problem_type" and saved is None:
        saved = "single_label_classification"
    if key in ("tokenizer_name", "image_processor_name") and saved and now and Path(saved).is_dir() \
            and Path(now).is_dir() and Path(saved).resolve() == Path(now).resolve():
        return None  # one folder, by another path (relative, absolute)
    if saved != now and isinstance(saved, dict) and isinstance(now, dict):  # model_config, peft: the sub-key
        sub = next(k for k in sorted({*saved, *now}, key=str) if saved.get(k) != now.get(k))
        key, saved, now = f"{key}.{sub}", saved.get(sub), now.get(sub)
    return (key, saved, now) if saved != now else None


@rule("runs.resume_changes_a_fixed_setting")
def resume_changes_a_fixed_setting(r: Resume) -> str | None:
    """A resume with another value of a setting that makes the run what it is (the data order, what a sample
    is, the model, the weights that train, the loss and labels, what "best" means): named, with the
    checkpoint's value. A manifest of an older version without the setting had its default then."""
    m = r.manifest
    # The manifest's own top-level task and seed (written since the first version) over its config copy.
    saved_config = {**(m.get("config") or {}), **{k: m[k] for k in ("task", "seed") if k in m}}
    for key in (k for k in r.fixed if k in saved_config):
        found = _differing(key, saved_config.get(key), getattr(r.cfg, key))
        if found is not None:
            key, saved, now = found
            return (f"the checkpoint was trained with {key}={setting_value(saved)}, this run has "
                    f"{key}={setting_value(now)}; resume with {key}={setting_value(saved)}, or start a new run "
                    "without resume_from_checkpoint")
    return None


@rule("runs.resume_on_other_labels")
def resume_on_other_labels(r: Resume) -> str | None:
    """A resume whose data has other labels than the checkpoint was trained on; the same labels in another
    order (label_names left out, or written otherwise) are named in the checkpoint's order, to set."""
    saved = r.manifest.get("label_names")
    if saved == r.label_names:
        return None
    if isinstance(saved, list) and sorted(map(str, saved)) == sorted(map(str, r.label_names)):
        return (f"the checkpoint was trained on the labels {saved} in this order, this run's are {r.label_names}; "
                f"resume with label_names=[{', '.join(map(str, saved))}]")
    return (f"the checkpoint was trained on the labels {saved}, this run's data has {r.label_names}; resume it "
            "with its own data, or set label_names to match")


@rule("runs.training_data_changed")
def training_data_changed(r: Resume) -> str | None:
    """A resume on training data whose bytes changed since the checkpoint (a file edited in place)."""
    saved = r.manifest.get("train_data")
    if isinstance(saved, dict) and r.train_data and set(saved) == set(r.train_data) and saved != r.train_data:
        where = r.cfg.train_file if "train_file" in r.train_data else f"the image files under {r.cfg.data_dir}"
        return (f"the training data changed since the checkpoint was saved ({where} differs from the bytes it "
                "trained on); resume with the data it was trained on, or start a new run without resume_from_checkpoint")
    return None


@rule("runs.other_sample_count")
def other_sample_count(r: Resume) -> str | None:
    """A resume whose epoch has another number of samples (max_train_samples, other data, a validation_file
    given or left out: a run without one holds out a share of the training data)."""
    if r.manifest.get("train_samples") in (None, r.train_samples):
        return None
    old = r.manifest.get("config") or {}
    was, now = old.get("validation_file"), r.cfg.validation_file
    windows = [f"{k}={old[k]} (now {getattr(r.cfg, k)})" for k in ("max_length", "doc_stride") if k in old and old[k] != getattr(r.cfg, k, old[k])]
    why = ("another max_train_samples, or other training data" if was == now else
           f"the run had validation_file={was or 'null'}, this run has {now or 'null'}: a run without "
           "one holds out a share of the training data")  # fmt: skip
    if windows and was == now:  # long texts read in windows: another window size makes another number of them
        why = f"the run's windows came from {', '.join(windows)}: other windows make another number of samples"
    return (f"the checkpoint's run trained on {r.manifest['train_samples']} samples an epoch, this run has "
            f"{r.train_samples} ({why}); resume with the run's own data and settings")


def stream_rows_trained(r: Resume) -> int:
    """The rows of the current pass over a streamed run's data that its checkpoint had read up to (its last
    trained sample's row, from 1): each process's position (finetune/streams.py: whole blocks of stream_buffer
    samples, rounded up to whole batches, then the block's samples trained on); process p reads rows p, p + P, ...
    of the data (datasets' split of one file among P processes)."""
    m = r.manifest
    world, batch = m["world_size"], m["per_device_train_batch_size"]
    buffer = (m.get("config") or {}).get("stream_buffer", r.cfg.stream_buffer)
    block = math.ceil(max(buffer, 1) / batch) * batch
    read = [at["block"] * block + at["skip"] for at in m.get("stream") or []]
    return max([(n - 1) * world + p + 1 for p, n in enumerate(read) if n] or [0])


@rule("runs.stream_past_max_train_samples")
def stream_past_max_train_samples(r: Resume) -> str | None:
    """A streamed run resumed with a max_train_samples smaller than the rows its checkpoint had already trained
    past in the pass it stands in: the stream's position would lie beyond the data, and the resume would go on
    from another place than where the run stopped."""
    limit = r.cfg.max_train_samples
    if not r.cfg.streaming or limit is None or not r.manifest.get("stream"):
        return None
    if r.manifest["world_size"] > 1 and not r.cfg.train_file:  # a hub's shards split among processes: rows unknown
        return None
    trained = stream_rows_trained(r)
    if limit >= trained:
        return None
    at = r.manifest["stream"][0]["pass"] + 1
    return (f"the checkpoint's run had trained on the stream's first {trained:,} rows of its pass {at} over the data, "
            f"and max_train_samples={limit} keeps fewer: resume with max_train_samples={trained} or more (or as the "
            "run had it), or start a new run")


@rule("runs.other_state_layout")
def other_state_layout(r: Resume) -> str | None:
    """A checkpoint of FSDP's shards resumed without FSDP, or a whole one with it."""
    if r.sharded == r.fsdp:
        return None
    world = r.manifest["world_size"]
    how = f"sharded by FSDP over {world} processes" if r.sharded else "whole (one process or DDP)"
    config = "the FSDP accelerate config (accelerate_configs/fsdp.yaml)" if r.sharded else \
        "a non-FSDP accelerate config"  # fmt: skip
    return (f"the checkpoint holds its state {how}; this run {'uses FSDP' if r.fsdp else 'does not use FSDP'}: resume "
            f"it with {config} and {world} process(es), or start a new run")


@rule("runs.other_topology")
def other_topology(r: Resume) -> str | None:
    """A resume with other processes x batch x accumulation, unless resume_allow_topology_change (never for
    sharded state, nor a stream, whose processes each resume their own share): the data would be split another
    way."""
    saved, now = r.saved_topology, r.topology
    if saved == now or (r.cfg.resume_allow_topology_change and not r.sharded):
        return None
    allow = "" if r.sharded or r.cfg.streaming else (", or pass resume_allow_topology_change=true to continue "
                                                     "without repeating consumed samples")  # fmt: skip
    return (f"the checkpoint was saved with processes x batch x accumulation = {saved[0]} x {saved[2]} x "
            f"{saved[1]}, this run has {now[0]} x {now[2]} x {now[1]}; resume with the same settings{allow}")


RESUME = [resume_changes_a_fixed_setting, resume_on_other_labels, training_data_changed, other_sample_count,
          stream_past_max_train_samples, other_state_layout, other_topology]  # fmt: skip


@rule("runs.checkpoint_past_the_plan")
def checkpoint_past_the_plan(manifest: dict[str, Any] | None, path: Path | None, total_steps: int,
                             cfg: Any) -> str | None:  # fmt: skip
    """A resume planned shorter (max_steps, num_train_epochs) than the checkpoint's step: it would export the
    checkpoint's weights under settings that say otherwise."""
    if manifest is None or manifest["step"] <= total_steps:
        return None
    plan = f"max_steps={cfg.max_steps}" if cfg.max_steps else f"num_train_epochs={cfg.num_train_epochs:g}"
    return (f"the checkpoint is at optimizer step {manifest['step']}, past the {total_steps} steps of this run ({plan}); "
            f"resume with max_steps={manifest['step']} or more (or more num_train_epochs), or evaluate the checkpoint "
            f"as it is: finetune/evaluate_checkpoint.py {pasted(path)}")


PLAN = [checkpoint_past_the_plan]


@rule("runs.best_checkpoint_missing", warning=True)
def best_checkpoint_missing(best: dict[str, Any], checkpoints: Path) -> str | None:
    """A resumed run whose best checkpoint so far is not in its checkpoints/ (deleted by hand, a copy made
    without it): the best is chosen again among the checkpoints saved from there on."""
    here = checkpoints / f"{layout.PREFIX}{best['step']:08d}"
    if layout.is_complete(here):
        return None
    return (f"the best checkpoint so far (step {best['step']}, validation {best.get('metric')} {best.get('value')}) is "
            f"not in {checkpoints}; the best is chosen again among the checkpoints this run saves from here on")


BEST = [best_checkpoint_missing]


# --- loading a checkpoint ---------------------------------------------------------------------------------


@rule("runs.no_model_weights")
def no_model_weights(path: Path, rng: Path, fsdp: bool, exact: bool) -> str | None:
    """A checkpoint without model.safetensors (not FSDP's shards): not one finetune.run wrote."""
    if not fsdp and not (path / "model.safetensors").is_file():
        return f"{path} has no model.safetensors; resume only from checkpoints written by finetune.run"
    return None


@rule("runs.rng_state_missing")
def rng_state_missing(path: Path, rng: Path, fsdp: bool, exact: bool) -> str | None:
    """A checkpoint without this process's RNG state: saved by fewer processes (a resume onto another
    topology, resume_allow_topology_change, goes on without it)."""
    if not rng.is_file() and exact:
        return f"{path} has no {rng.name}: it was saved by fewer processes; resume with the same number of processes"
    return None


LOAD = [no_model_weights, rng_state_missing]

_HOLDS_CODE = "it is damaged or holds code; resume only from checkpoints written by finetune.run"


@rule("runs.rng_state_not_plain_data")
def rng_state_not_plain_data(rng: Path, error: Exception) -> str:
    """An RNG state file that torch does not load as plain data (weights_only): damaged, or a pickle that
    would run code. Read before Accelerate's load, which would swallow its failure."""
    return f"{rng} does not load as plain data ({first_line(error)}): {_HOLDS_CODE}"


RNG_FAILED = [rng_state_not_plain_data]


@rule("runs.state_not_plain_data")
def state_not_plain_data(path: Path, error: Exception) -> str | None:
    """A checkpoint's optimizer, scheduler or weights that do not load as plain data (weights_only): damaged,
    or a pickle that would run code."""
    import pickle

    from safetensors import SafetensorError

    if isinstance(error, (pickle.UnpicklingError, EOFError, SafetensorError, OSError)):
        return f"{path} does not load as plain data ({first_line(error)}): {_HOLDS_CODE}"
    return None


def _state_dict_mismatch(message: str) -> str:
    """torch's (or safetensors') load_state_dict error, one clause per kind: its first key and how many."""
    said = []
    for kind in ("Missing key(s)", "Unexpected key(s)"):
        found = re.search(rf"{re.escape(kind)} in state_dict: ([^\n]*)", message)
        keys = re.findall(r'"([^"]+)"', found.group(1)) if found else []
        if keys:
            said.append(f"{kind.split()[0].lower()} {len(keys)}, e.g. {keys[0]}")
    sizes = re.findall(r"size mismatch for ([^:]+):", message)
    if sizes:
        said.append(f"{len(sizes)} of other shapes, e.g. {sizes[0]}")
    return "; ".join(said) or "other names or shapes"


@rule("runs.weights_do_not_fit")
def weights_do_not_fit(path: Path, error: Exception) -> str | None:
    """A checkpoint's weights that do not fit the model this run builds (other names or shapes): another
    model or settings, or a replaced file."""
    if "Error(s) in loading state_dict" in str(error):
        return (f"{path / 'model.safetensors'} holds weights that do not fit the model this run builds "
                f"({_state_dict_mismatch(str(error))}): resume with the model and settings that saved it, or, if that "
                f"file was replaced, {ANOTHER}")
    return None


@rule("runs.state_does_not_fit")
def state_does_not_fit(path: Path, error: Exception) -> str:
    """A checkpoint's state that does not fit this model or optimizer (parameter groups, keys)."""
    return (f"{path} does not fit this model or optimizer: {first_line(error)}; resume with "
            "the model and settings that saved it")


LOAD_FAILED = [state_not_plain_data, weights_do_not_fit, state_does_not_fit]


# --- writes that fail as the run goes -------------------------------------------------------------------


def _save_failed(error: OSError, step: int, kept: str) -> str:
    file = f" ({error.filename})" if error.filename else ""
    return (f"could not save the checkpoint of step {step}: {error.strerror or first_line(error)}{file}; the "
            f"partial save was removed and {kept}")


@rule("runs.save_failed_on_a_lost_disk", local=True)
def save_failed_on_a_lost_disk(error: OSError, step: int, last: Path | None) -> str | None:
    """A checkpoint that could not be written on a read-only or failing disk, after an earlier one: this
    output_dir is no place to go on in, so the run continues from that checkpoint in another folder."""
    if last and error.errno in (errno.EROFS, errno.EIO):
        return _save_failed(error, step, f"the last checkpoint, {last}, is intact; {remedy(error.errno)}, then continue "
                                         f"from it there: resume_from_checkpoint={last} output_dir=<the other folder>")
    return None


@rule("runs.save_failed", local=True)
def save_failed(error: OSError, step: int, last: Path | None) -> str | None:
    """A checkpoint that could not be written (a full disk, a quota), after an earlier one: the partial save is
    removed, and the run continues from the last checkpoint once there is room."""
    if last:
        return _save_failed(error, step, f"the last checkpoint, {last}, is intact; {remedy(error.errno)}, then "
                                         "continue with resume_from_checkpoint=latest")
    return None


@rule("runs.save_failed_before_any_checkpoint", local=True)
def save_failed_before_any_checkpoint(error: OSError, step: int, last: Path | None) -> str:
    """The run's first checkpoint that could not be written: nothing to continue from."""
    return _save_failed(error, step, f"no checkpoint was saved before; {remedy(error.errno)}, and run again")


SAVE_FAILED = [save_failed_on_a_lost_disk, save_failed, save_failed_before_any_checkpoint]


def _export_failed(failure: OSError, root: Path, then: str) -> str:
    file = f" ({failure.filename})" if failure.filename else ""
    return (f"could not write the export in {root}: {failure.strerror}{file}; nothing of it was left there and the "
            f"run is not finished; {remedy(failure.errno)}, {then}")


@rule("runs.export_failed")
def export_failed(failure: OSError, root: Path) -> str | None:
    """The export that could not be written (a full or read-only disk, a device error), in a run with
    checkpoints: nothing of it is left, and a resume from the last checkpoint only evaluates and exports."""
    if layout.list_checkpoints(root):
        return _export_failed(failure, root, "then run again with resume_from_checkpoint=latest (a resume from the "
                              "last step only evaluates and exports; in another output_dir: "
                              "resume_from_checkpoint=<its last checkpoint>)")
    return None


@rule("runs.export_failed_before_any_checkpoint")
def export_failed_before_any_checkpoint(failure: OSError, root: Path) -> str:
    """The export that could not be written, in a run that saved no checkpoint: it runs again, over its own
    started run (so with overwrite_output_dir=true)."""
    return _export_failed(failure, root, "then run again with overwrite_output_dir=true (it replaces this started "
                          "run, which saved no checkpoint)")


EXPORT_FAILED = [export_failed, export_failed_before_any_checkpoint]


# --- the ONNX files of an export (finetune/onnx_export.py) ---------------------------------------------------


@rule("runs.onnx_arguments")
def onnx_arguments(message: str) -> str:
    """argparse's refusal of python -m finetune.onnx_export's arguments: one line and exit status 2."""
    return f"{message} (see python -m finetune.onnx_export --help)"


ONNX_COMMAND = [onnx_arguments]


@rule("runs.onnx_path_not_found")
def onnx_path_not_found(path: Path, run: Path) -> str | None:
    """The run (or export) to make ONNX files of is not there."""
    if not path.exists():
        return f"{path} does not exist; give a finished run's folder (its output_dir) or its model/ folder"
    return None


@rule("runs.onnx_path_a_file")
def onnx_path_a_file(path: Path, run: Path) -> str | None:
    """A file named for the run (its model.safetensors, config.json, an ONNX file): ONNX files are made from
    an export's folder, which a file is not (it was said to be a run that saved no checkpoint)."""
    if path.is_file():
        return (f"{path} is a file; give a finished run's folder (its output_dir) or its model/ folder "
                f"(python -m finetune.onnx_export {pasted(run_of_file(path))})")
    return None


def run_of_file(path: Path) -> Path:
    """The run a file inside it belongs to: the folder above its model/, onnx/ or a checkpoint, else its folder."""
    folder = path.parent
    if folder.name in (layout.MODEL, layout.ONNX) or folder.parent.name == layout.CHECKPOINTS:
        return folder.parent.parent if folder.parent.name == layout.CHECKPOINTS else folder.parent
    return folder


@rule("runs.onnx_of_an_adapter")
def onnx_of_an_adapter(path: Path, run: Path) -> str | None:
    """A LoRA run's adapter folder (adapter_config.json): the adapter alone is not a model; the run's export
    already holds it merged into the weights, and that is what is exported."""
    if (path / "adapter_config.json").is_file():
        return (f"{path} is a LoRA adapter alone, not a model; export the run instead "
                f"(python -m finetune.onnx_export {pasted(run)}): its model/ holds the adapter merged into the weights")
    return None


@rule("runs.onnx_without_export")
def onnx_without_export(path: Path, run: Path) -> str | None:
    """A folder without an export (a run not finished, a checkpoint, another folder): ONNX files are made from
    the export's weights and config, which a finished run writes last."""
    model = layout.RunDir(run).model
    if not (model / "config.json").is_file() or not (model / "model.safetensors").is_file():
        resume = (f"a run cut short exports when resumed (resume_from_checkpoint=latest output_dir={pasted(run)})"
                  if layout.list_checkpoints(run) else "this one saved no checkpoint to resume from: train it again")
        return (f"no export in {path} (no {model} with config.json and model.safetensors): give a finished run; "
                f"{resume}")
    return None


ONNX_SOURCE = [onnx_path_not_found, onnx_path_a_file, onnx_of_an_adapter, onnx_without_export]


@rule("runs.onnx_output_a_file")
def onnx_output_a_file(out: Path, given: bool) -> str | None:
    """--output-dir naming a file (model.onnx itself, a data file), or a file where the default <run>/onnx goes:
    the ONNX files go in a folder."""
    if out.is_file():
        return (f"{_onnx_output(out, given)} is a file; name a folder for the ONNX files (a new or empty one, or an "
                "earlier export's)" + ("" if given else " with --output-dir, or move the file away"))
    return None


def _onnx_output(out: Path, given: bool) -> str:
    """The ONNX folder as a line names it: the --output-dir given, or the default one."""
    return f"--output-dir {out}" if given else f"{out} (the default folder of the ONNX files)"


@rule("runs.onnx_output_inside_a_model")
def onnx_output_inside_a_model(out: Path, given: bool) -> str | None:
    """--output-dir inside a model's folder (a run's export, a checkpoint, an earlier ONNX export's folder): the
    files would be mixed into what pipeline() or the hub loads from it, and lost when it is replaced whole."""
    for parent in out.expanduser().resolve().parents:
        weights = any(parent.glob("*.safetensors")) or any(parent.glob("*.onnx"))
        if (parent / layout.MANIFEST).is_file() or ((parent / "config.json").is_file() and weights):
            return (f"--output-dir {out} is inside {parent}, a model's folder, which is loaded and replaced whole; "
                    "name a folder outside it (the default, <run>/onnx, is beside the export)")
    return None


@rule("runs.onnx_output_not_ours")
def onnx_output_not_ours(out: Path, given: bool) -> str | None:
    """--output-dir naming a folder that holds files but no ONNX export (a run, the user's own), or such a
    folder where the default <run>/onnx goes: the export replaces its folder whole, so it is never written over."""
    if out.is_dir() and any(out.iterdir()) and not (out / layout.ONNX_FILES["fp32"]).is_file():
        return (f"{_onnx_output(out, given)} holds files that are not the ONNX files of an export (no "
                f"{layout.ONNX_FILES['fp32']}), which the export would replace whole; name a new or empty folder"
                + ("" if given else " with --output-dir, or move those files away"))
    return None


@rule("runs.onnx_output_replaced_by_its_run")
def onnx_output_replaced_by_its_run(out: Path, given: bool) -> str | None:
    """--output-dir inside a folder of a run that the run deletes or replaces whole (its checkpoints/, whose
    rotation deletes what it does not know, its model/ or adapter/, an overwrite's set-aside run): the ONNX
    files would be lost with it, or be taken for the run's own."""
    inner = layout.replaced_whole_around(out)
    if inner is not None:
        what = layout.REPLACED_WHOLE[inner.name]
        return (f"--output-dir {out} is inside {inner}, the {what} of the run {inner.parent}, which the run "
                f"deletes or replaces whole; name a folder outside it (the default, {inner.parent / layout.ONNX})")
    return None


ONNX_OUTPUT = [onnx_output_a_file, onnx_output_inside_a_model, onnx_output_replaced_by_its_run, onnx_output_not_ours]


@rule("runs.onnx_write_failed")
def onnx_write_failed(out: Path, failure: OSError) -> str:
    """ONNX files that cannot be written (a read-only run folder or disk, a full one): nothing of them is left;
    --output-dir writes them elsewhere."""
    file = f" ({failure.filename})" if failure.filename else ""
    return (f"cannot write the ONNX files to {out}: {failure.strerror}{file}; nothing of them was left there; "
            f"{remedy(failure.errno, '--output-dir')}")


ONNX_WRITE_FAILED = [onnx_write_failed]
