"""Signals: what SIGTERM and SIGINT (Ctrl-C) do at each moment of a run, and the launcher's death.

    while importing (seconds)      one `stopped:` line, exit 128+signal, nothing written   stop_while_starting
    building, loading, preparing   one `stopped:` line; what the start set aside comes back stop_outside_the_loop
    an evaluation                  one `stopped:` line, exit 130/143                      stop_outside_the_loop
    the training loop, the export  finish the optimizer step, save a checkpoint, exit 143/130 StopOnSignal
    undoing after a failure        ignored until the undo is done                          masked
    the launcher dies              the training process gets SIGTERM (Linux)               stop_with_launcher
    finetune-launch gets one       passed to the training processes                        forwarded_to_children

Nothing heavy is imported at module level: `stop_while_starting` runs before torch is loaded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from datetime import timedelta

from finetune.errors import TrainingStopped

STOPS = (signal.SIGTERM, signal.SIGINT)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # Python delivers signals there only


def stop_while_starting() -> None:
    """Ctrl-C or SIGTERM while the entry point imports its libraries: one line, not a traceback."""

    def stopped(signum, frame):
        if os.environ.get("RANK", "0") == "0":
            os.write(2, b"stopped: interrupted while starting; nothing was written\n")
        os._exit(128 + signum)

    for sig in STOPS:
        signal.signal(sig, stopped)


def started() -> None:
    """The imports are done (`stop_while_starting`'s end): Ctrl-C is a KeyboardInterrupt again, which the
    entry point says in one `stopped:` line (finetune/errors.py), and SIGTERM ends the process."""
    if _in_main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_outside_the_loop(where: str = "outside the training loop") -> None:
    """SIGTERM outside the training loop (loading, building, before the first step), or in an evaluation
    (`where`: "during the evaluation"; a scheduler's, or torchrun's once another process stopped), ends the
    process as Ctrl-C does there: one `stopped:` line, exit 143, and what the start registered to undo on a
    failure (an earlier run set aside by overwrite_output_dir) is put back. The loop and the export
    install their own handler (`StopOnSignal`), which saves instead, and restore this one after."""

    def _raise(signum, frame):
        raise TrainingStopped(f"received SIGTERM {where}; nothing more was saved", 128 + signum)

    if _in_main_thread():
        signal.signal(signal.SIGTERM, _raise)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt (run.py's start: exit)


@contextlib.contextmanager
def masked():
    """SIGTERM and SIGINT ignored in the block (an undo cut short would lose what it restores); after
    it, Python's defaults: the process is ending, and a SIGTERM now (torchrun stopping the other
    processes while they give process 0 time to speak) ends it silently."""
    if _in_main_thread():
        for sig in STOPS:
            signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        started()  # Python's own: SIGTERM ends the process, SIGINT is a KeyboardInterrupt


class StopOnSignal:
    """SIGTERM or SIGINT during training: finish the optimizer step, save a checkpoint, exit 143/130.

    The handler only records the signal; the loop asks `requested()` after every optimizer step. All
    processes must stop at the same step (saving is collective), but they may receive the signal at
    different steps — torchrun forwards it to every worker, a scheduler signals each task — so under
    DDP the flags are combined every step by an all-reduce (MAX) of one CPU integer over a gloo group
    of its own: a host-side exchange that never waits on a GPU stream, also in NCCL jobs (about 0.4 ms
    a step between 2 CPU processes). Checking only at logging steps would stop up to `logging_steps`
    steps late, past the grace period torchrun or a scheduler gives before SIGKILL. A second signal
    ends the process at once, the default way — unless it comes within `SAME_REQUEST_S` of the first:
    Ctrl-C reaches the whole process group, and a launcher that forwards it (torchrun,
    finetune-launch) delivers that one request a second time.
    """

    SAME_REQUEST_S = 2.0

    def __init__(self, num_processes: int, timeout_s: int):
        self.signum, self.previous, self.first_at = 0, {}, 0.0
        self.group = None
        if num_processes > 1:  # every process creates the group, in the same order
            import torch

            self.group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def __enter__(self) -> StopOnSignal:
        if _in_main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in STOPS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.group is not None:  # local to this process: no collective, so safe on any exit path
            import torch

            torch.distributed.destroy_process_group(self.group)
            self.group = None

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if not self.signum:
            self.signum, self.first_at = signum, now
        elif now - self.first_at > self.SAME_REQUEST_S:  # a second request: no more waiting
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def stop_if_received(self, finished: str) -> None:
        """After the block: a signal that came when the loop was over (in the final evaluation or the
        export, which were let finish) still ends the process with its status, 130/143, saying `finished`."""
        if self.signum:
            raise TrainingStopped(
                f"received {signal.Signals(self.signum).name} after training, during the final evaluation "
                f"or export, which were completed: {finished}",
                128 + self.signum,
            )

    def requested(self) -> int:
        """The signal that every process agrees to stop on now, or 0."""
        if self.group is None:
            return self.signum
        import torch

        flag = torch.tensor([self.signum])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return int(flag)

    def stopped(self, path, step: int, output_dir) -> TrainingStopped:
        """The stop after saving checkpoint `path` at `step`."""
        return TrainingStopped(
            f"received {signal.Signals(self.signum).name} during training; saved checkpoint {path} "
            f"(optimizer step {step}); continue with resume_from_checkpoint=latest output_dir={output_dir}",
            128 + self.signum,
        )


def stop_with_launcher() -> None:
    """Ask Linux for SIGTERM when the launcher that started this process dies.

    `accelerate launch` with one process does not forward SIGTERM: killed, it exits and leaves the
    training process running with nobody waiting for it. With PR_SET_PDEATHSIG the process then gets
    SIGTERM, which `StopOnSignal` turns into a checkpoint and exit 143. Only under a launcher
    (accelerate's sets ACCELERATE_MIXED_PRECISION, torchrun TORCHELASTIC_RUN_ID), on Linux.
    """
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
    if not (launched and sys.platform.startswith("linux")):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    # (A launcher killed in the second before this line leaves the process to run on: its parent is
    # then init, which cannot be told from a launcher that is itself PID 1 in a container.)
    with contextlib.suppress(OSError, AttributeError):  # no prctl: keep the default
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


@contextlib.contextmanager
def forwarded_to_children():
    """finetune-launch: SIGTERM and SIGINT to the launcher go to the launched processes (accelerate's
    one-process launcher waits on its child, and Python resumes that wait after a handler); before
    there is one, they stop the launch."""
    import psutil  # accelerate's own dependency

    def forward(signum: int, frame) -> None:
        children = psutil.Process().children()
        if not children:
            raise SystemExit(128 + signum)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOPS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
