"""How an entry point ends: a user error is one line and exit status 2, a stopped run one line and its
own status, and what the run set out to undo (an overwritten run set aside) is put back first.

    @exit_on_user_error
    def main(argv=None): ...

Also the command lines' parser (`ArgumentParser`), whose usage errors are user errors too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from finetune import checks
from finetune.checks import settings
from finetune.errors import (
    ENVIRONMENT_ERRORS,
    EXIT_USER_ERROR,
    REDACTED,
    SECRET_VALUE,
    PeerFailed,
    TrainingStopped,
    UserError,
    failure_steps,
    one_line,
    write_failure,
)
from finetune.signals import masked

T = TypeVar("T")

# How long another process waits, after a mistake that every process meets, for process 0 to say it.
# When process 0 ends first (the usual case), the launcher stops the waiting ones at once.
RANK_0_SPEAKS_S = 5.0

def _undo_after_failure() -> None:
    """The registered undo steps, with SIGTERM and SIGINT masked meanwhile (finetune/signals.py); then
    this process leaves its process groups, as a run that ends well does (`runtime.end_processes`)."""
    with masked():
        while failure_steps:
            with contextlib.suppress(Exception):  # an undo that fails leaves things as they are; never a 2nd error
                failure_steps.pop()()
    _leave_process_groups()


def _leave_process_groups() -> None:
    """Destroy this process's process groups before it exits. Left to the interpreter's teardown,
    gloo's worker threads abort a process now and then ("terminate called without an active
    exception", exit -6), so that a one-line mistake under DDP ended in a crash. Local to this process,
    no collective: a failure reaches the others through `runtime.agreed` before this runs."""
    dist = sys.modules.get("torch.distributed")  # not imported: no group to leave
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _printable_anywhere() -> None:
    """A console that cannot print a character (an ASCII-only locale, a Windows code page) shows it as an
    escape (\\u00e9) instead of failing the run at its first line that names a label in another script."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "strict") == "strict":
            with contextlib.suppress(Exception):  # a stream that cannot change: left as it is
                reconfigure(errors="backslashreplace")


def exit_on_user_error(fn: Callable[..., T]) -> Callable[..., T]:
    """Run `fn`; a user error becomes `error: <message>` on stderr and exit status 2, a stopped run
    `stopped: <message>` and its own exit status; a full disk or a permission refused is a user error
    too (ENVIRONMENT_ERRORS). Whatever `fn` registered with `on_failure` runs first."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        failure_steps.clear()
        _printable_anywhere()
        rank = os.environ.get("RANK", "0")
        where = f"[rank {rank}] " if rank != "0" else ""
        try:
            return fn(*args, **kwargs)
        except TrainingStopped as e:
            _undo_after_failure()
            if rank == "0":
                print(f"stopped: {one_line(e)}", file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:  # Ctrl-C in an evaluation, or before or after a training loop (it has its own)
            _undo_after_failure()
            if rank == "0":
                print("stopped: interrupted (SIGINT); nothing more was saved", file=sys.stderr)
            sys.exit(130)
        except UserError as e:
            _undo_after_failure()
            if isinstance(e, PeerFailed):
                time.sleep(RANK_0_SPEAKS_S)  # as below: the process that failed is saying it
            elif rank == "0" or getattr(e, "local", False):  # every process hits most; one says it
                print(f"error: {where}{checks.shown_rule(e.rule)}{one_line(e)}", file=sys.stderr)
            else:  # process 0 says it: give it the time, or torchrun, which stops the other processes
                time.sleep(RANK_0_SPEAKS_S)  # when one ends, could stop it first (seen on a loaded machine)
            sys.exit(EXIT_USER_ERROR)
        except Exception as e:
            _undo_after_failure()
            failure = write_failure(e)  # a full disk, a quota, a read-only or failing one: not our bug
            if failure is None:
                raise
            path = f": {failure.filename}" if failure.filename else ""  # met by this process: it says so
            message = f"{failure.strerror or os.strerror(failure.errno)}{path}; {ENVIRONMENT_ERRORS[failure.errno]}"
            print(f"error: {where}{SECRET_VALUE.sub(REDACTED, message)}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
        finally:
            failure_steps.clear()

    return wrapper


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are user errors: one line, exit status 2, with `hint` after them; an
    option of one value given twice (`--config a.yaml --config b.yaml`) is one of them, not the last kept."""

    def __init__(self, *args, hint: str = "", **kwargs):
        super().__init__(*args, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.hint = hint

    def add_argument(self, *args, **kwargs):
        if args and args[0].startswith("-") and kwargs.get("action") in (None, "store"):
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):
        raise checks.explain(settings.USAGE, message, self.hint)


class _Once(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        checks.gate(settings.OPTION_GIVEN, option_string, getattr(namespace, self.dest, None), self.default, values)
        setattr(namespace, self.dest, values)
