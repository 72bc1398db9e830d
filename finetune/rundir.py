"""What happens to a run directory. The policy: a run never writes over another run or over files it did not write. A folder that
holds a run is refused unless `overwrite_output_dir=true` (the old run is set aside, renamed, and
comes back if the new one fails before its first checkpoint) or `resume_from_checkpoint` (continue
it); a folder of other files is refused unless `overwrite_output_dir=true`, and then nothing there
is deleted. The machines of a multi-node run must share the folder (`check_shared_output_dir`).
The layout's names are finetune/layout.py's; the rules asked here, finetune/checks/runs.py's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path

from finetune import checks
from finetune.checks import runs
from finetune.errors import on_failure
from finetune.layout import (
    COMPLETE,
    MANIFEST,
    PREFIX,
    PREVIOUS,
    SHARED_PROBE_PREFIX,
    RunDir,
    holds_a_config,
    list_checkpoints,
    step_of,
)


@contextlib.contextmanager
def in_use(run: RunDir):
    """The folder held by this run's main process until the block ends (flock on the folder itself,
    released by the kernel however the process ends): a second command that would overwrite or
    resume the run while it is still going is refused instead of deleting or interleaving its files.
    A file system without flock (some network ones) runs without the guard."""
    import fcntl

    fd = os.open(run.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise checks.explain(runs.IN_USE, run.root) from None
        except OSError:  # no flock here (ENOLCK, EOPNOTSUPP): no guard, as before
            pass
        yield
    finally:
        os.close(fd)


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


def check_not_inside_a_run(out: Path) -> None:
    """Refuse an output_dir that is, or lies inside, a folder of another run that the other run deletes or
    replaces whole (`REPLACED_WHOLE`: its checkpoints/, model/, ...): that run's checkpoint retention,
    resume or next overwrite would delete this one without a word (finetune/checks/runs.py, `INSIDE_A_RUN`)."""
    path = Path(out).expanduser().resolve()
    for inner in (path, *path.parents):
        checks.gate(runs.INSIDE_A_RUN, out, path, inner)


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
        moved: list[str] = []
        try:
            for name in names:
                if (run.root / name).exists() or (run.root / name).is_symlink():
                    os.replace(run.root / name, moving / name)
                    moved.append(name)
            os.replace(moving, aside)
        except OSError as e:  # a folder that cannot move (read-only, busy): what moved goes back, then the line
            raise checks.explain(runs.SET_ASIDE_FAILED, run, name, e, _move_back(run, moving, moved)) from None
    on_failure(functools.partial(restore_previous_run, run))


def _move_back(run: RunDir, moving: Path, moved: list[str]) -> list[str]:
    """An overwrite's set-aside undone: the entries moved into `moving` go back; those that cannot stay there
    (returned)."""
    left = []
    for name in reversed(moved):
        try:
            os.replace(moving / name, run.root / name)
        except OSError:
            left.append(name)
    with contextlib.suppress(OSError):
        moving.rmdir()  # unless something is left in it (or a killed overwrite's entries were already there)
    return left


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


def resumed_run_config(
    resume: str | None, output_dir: str | Path, said: checks.Said | None = None
) -> Path | None:
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
        if holds_a_config(step / MANIFEST):
            checks.gate(
                runs.RESUMED_CONFIG, run, step / MANIFEST, said=said if said is not None else checks.Said()
            )
            return step / MANIFEST
    raise checks.explain(runs.NO_CONFIG, run)
