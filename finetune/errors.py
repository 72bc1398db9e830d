"""User-facing errors: one line, a chosen exit status, no traceback.

A traceback is for our bugs. Anything the user can fix (a path, a key, a value) is found by a rule of the
checks layer (finetune/checks/), which raises `UserError` with a line that says what is wrong and what to
do; the entry points turn it into one line on stderr and exit status 2 (finetune/exits.py).

A run that stops on purpose raises `TrainingStopped`, also one line, with its own exit status:

    2    a user error (bad input, a full disk, a permission refused): nothing was written over
    3    the loss stayed NaN/inf for `max_nonfinite_loss_steps` steps; the last good checkpoint is kept
    130  SIGINT (Ctrl-C) during training: a checkpoint was written; resume_from_checkpoint=latest
    143  SIGTERM (a scheduler's preemption, `kill`) during training: likewise
    1    a Python traceback: our bug

This module imports nothing of the app: every layer may raise these.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit status 2.

    Most are found by every process alike, and only the main one prints them; `local=True` marks one
    that only the process that met it knows of (a corrupt file in its share of the data)."""

    def __init__(self, message: str, local: bool = False, rule: str | None = None):
        super().__init__(message)
        self.local = local
        self.rule = rule  # the id of the check that found it (finetune/checks/): the catalogue keys on it

    def __reduce__(self):  # whole across a process boundary (datasets' map workers): its rule and locality kept
        return type(self), (str(self), self.local, self.rule)


class PeerFailed(UserError):
    """Another process failed and says why (`runtime.main_process_first`): this one ends with exit
    status 2 and prints nothing, so that the run shows one line."""


class TrainingStopped(Exception):
    """The run stopped on purpose (a signal, a diverged loss): one line on stderr, `exit_code`."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# Undo steps for a run that fails (see `on_failure`), run by finetune/exits.py's `exit_on_user_error` before
# it exits: the entry point now running registers them, and the wrapper clears them at its start and end.
failure_steps: list = []


def on_failure(step) -> None:
    """Run `step` if the entry point now running fails (a user error, a stopped run, a traceback), before
    its one line is printed: how an overwritten run is put back (finetune/rundir.py)."""
    failure_steps.append(step)


# Values that look like credentials wherever they appear: Hugging Face, OpenAI, GitHub, AWS and Slack
# tokens, and URLs that carry a user:password. Never printed in an error line, never put in a card.
SECRET_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|://[^/\s:@]+:[^/\s@]+@"
)
REDACTED = "<redacted>"


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty): for
    messages that quote another library's error inside our own."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def one_line(e: BaseException) -> str:
    """The message of `e` on one line. A DataLoader worker re-raises an error as the same type with the
    worker's formatted traceback as its message: keep only the original message, its last line."""
    text = str(e)
    if "Original Traceback" in text:
        last = text.strip().splitlines()[-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    return SECRET_VALUE.sub(REDACTED, " ".join(text.split()))


# What the machine, not the program, got wrong: a full disk, a quota, a read-only or unreadable path.
# Wherever one is met, it is one line and exit status 2, with what to do.
ENVIRONMENT_ERRORS = {
    errno.ENOSPC: "free some space (or write elsewhere) and run again",
    errno.EDQUOT: "free some space under your quota (or write elsewhere) and run again",
    errno.EROFS: "that file system is read-only; write elsewhere",
    errno.EACCES: "check its permissions",
    errno.EPERM: "check its permissions",
    errno.EIO: "the disk failed a read or write: check it (dmesg), or write elsewhere",
}


def remedy(code: int | None, setting: str = "output_dir") -> str:
    """What to do about a failed write, by its errno, for a message that goes on with how to carry on:
    a full disk or quota wants space, a read-only one another `setting` (the folder written to), a
    failing one a look at the device. Never "free some space" for a disk that is not full."""
    if code in (errno.ENOSPC, errno.EDQUOT):
        quota = " under your disk quota" if code == errno.EDQUOT else ""
        return f"free some space{quota} (or choose another {setting})"
    if code == errno.EROFS:
        return f"that file system is read-only: choose another {setting} (or remount it read-write)"
    if code == errno.EIO:
        return f"the disk reported a device error (EIO): check it (dmesg) and choose another {setting}"
    if code in (errno.EACCES, errno.EPERM):
        return f"check the folder's permissions, or choose another {setting}"
    return f"check the disk, or choose another {setting}"


def write_failure(e: BaseException, where: str | os.PathLike | None = None) -> OSError | None:
    """The machine's error behind a failed write or read, as an OSError (ENVIRONMENT_ERRORS), or None
    for anything else. Not every library raises OSError: safetensors raises SafetensorError with
    Rust's "(os error 28)" in its message, torch's writer a RuntimeError without the cause; for
    those the errno is read from the message, or found by writing a probe file in `where`."""
    if isinstance(e, OSError) and e.errno is not None:
        return e if e.errno in ENVIRONMENT_ERRORS else None
    text = str(e)  # shutil.Error (an OSError without errno): its copies' errors, "[Errno 28] ..." each
    found = re.search(r"os error (\d+)|\[Errno (\d+)\]", text)
    code = int(found.group(1) or found.group(2)) if found else next(
        (c for c in ENVIRONMENT_ERRORS if os.strerror(c) in text), None)
    if code is None and "database or disk is full" in text:  # SQLite's own words (optuna's study.db)
        code = errno.ENOSPC
    # torch's zip writer: "PytorchStreamWriter failed writing file", "[enforce fail at inline_container.cc]
    # unexpected pos 576 vs 534" (a short write): no errno in either
    if code is None and where is not None and re.search(r"PytorchStreamWriter|file write failed|inline_container", text):
        code = _probe_write(Path(where))
    if code not in ENVIRONMENT_ERRORS:
        return None
    return OSError(code, os.strerror(code), str(where) if where is not None else None)


def _probe_write(folder: Path) -> int:
    """Why writing in `folder` fails (torch's writer does not say): the errno of writing a small file
    there, else ENOSPC when the disk has almost no room left, else EIO."""
    import shutil
    import tempfile

    folder = next((p for p in (folder, *folder.parents) if p.is_dir()), folder)
    try:
        with tempfile.NamedTemporaryFile(dir=folder) as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e.errno or errno.EIO
    return errno.ENOSPC if shutil.disk_usage(folder).free < 16 * 2**20 else errno.EIO
