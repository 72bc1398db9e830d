"""User-facing errors: one line, exit status 2, no traceback.

A traceback is for our bugs. Anything the user can fix (a path, a key, a value) raises `UserError`
with a message that says what is wrong and what to do; the entry points turn it into one line on
stderr and exit status 2 via `exit_on_user_error`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit status 2."""


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [UserError]
    # Sibling modules define their own user-error types (ValueError subclasses); import lazily so
    # that a failure in one of them cannot hide the original error.
    for module, name in (("finetune.parallel", "ParallelError"), ("finetune.metrics", "MetricError")):
        try:
            mod = __import__(module, fromlist=[name])
            types.append(getattr(mod, name))
        except (ImportError, AttributeError):
            pass
    return tuple(types)


def exit_on_user_error(fn: Callable[..., T]) -> Callable[..., T]:
    """Run `fn`; a user error becomes `error: <message>` on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _user_error_types() as e:
            message = " ".join(str(e).split())  # one line, whatever the message held
            if os.environ.get("RANK", "0") == "0":  # every process hits it; one says it
                print(f"error: {message}", file=sys.stderr)
            sys.exit(2)

    return wrapper
