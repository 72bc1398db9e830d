"""What the loop keeps track of, and what a tool sees of it: the phases' times and the moments of a run
(`Hooks`), metrics.jsonl and the trackers (`MetricsLog`), the training loss and its NaN/inf runs
(`LossWatch`). finetune/run.py's `train()` holds one of each."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from finetune import checkpoint as ckpt
from finetune.config import TrainConfig

PHASES = ("start-up", "data", "build", "compile", "train", "evaluate", "export")


def phase_order(item: tuple[str, float]) -> int:
    return PHASES.index(item[0]) if item[0] in PHASES else len(PHASES)


class Hooks:
    """What a tool (benchmarks/, a profiler) sees of `train()`: named moments. Pass a subclass as
    `train(cfg, hooks)`; the app's own timing of its phases is this class.

    phase(name)      a context around a phase: "start-up" (imports excluded), "data", "build", "train",
                     "evaluate", "export"; `seconds` holds each one's own time (a phase inside another
                     is not counted in the outer one), and results.json and the run's last line show them
    mark(name, x)    a moment of the run: "built" (x: the model, before Accelerate wraps it),
                     "prepared" (x: the `Run`: the Accelerator, the prepared model, loaders...),
                     "batch" (x: a micro-batch, just fetched), "backward" (forward and loss done),
                     "optimizer" (backward done), "micro-batch done" (optimizer step and zero_grad
                     done, or skipped while accumulating), "step" (x: the optimizer step just done,
                     with its logging, evaluation and checkpoint), "evaluated" (x: (step, the
                     validation metrics), after each evaluation)
    """

    verdicts = True  # the run's last lines on whether it learned; a search's trials (finetune/search.py) keep
    # them in results.json and their cards, and say their value on the trial's own line

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[list] = []  # [name, started, seconds of the phases inside it]

    @contextlib.contextmanager
    def phase(self, name: str):
        frame = [name, time.perf_counter(), 0.0]
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.pop()
            took = time.perf_counter() - frame[1]
            self.seconds[name] = self.seconds.get(name, 0.0) + took - frame[2]
            if self._open:  # the enclosing phase's own time excludes this one
                self._open[-1][2] += took

    def so_far(self) -> dict[str, float]:
        """Each phase's own seconds until now, the open ones included."""
        now, seconds = time.perf_counter(), dict(self.seconds)
        for i, (name, started, inside) in enumerate(self._open):
            inner = now - self._open[i + 1][1] if i + 1 < len(self._open) else 0.0
            seconds[name] = seconds.get(name, 0.0) + now - started - inside - inner
        return seconds

    def mark(self, name: str, value: Any = None) -> None:
        pass


class MetricsLog:
    """metrics.jsonl on the main process, and the trackers of `report_to` through Accelerate."""

    def __init__(self, accelerator: Accelerator, path: Path):
        self.accelerator, self.path = accelerator, path

    def drop_after(self, step: int) -> None:
        """On resume: forget what an interrupted attempt logged after the checkpoint it resumes from."""
        if not self.accelerator.is_main_process or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except ValueError:  # a line torn by a kill
                pass
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def log(self, record: dict[str, Any], step: int) -> None:
        if not self.accelerator.is_main_process:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **record}) + "\n")
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float))}
        if self.accelerator.trackers:
            self.accelerator.log(scalars, step=step)


class LossWatch:
    """The training loss and its NaN/inf runs, kept on the device and read only at logging steps (the
    one host sync of the loop): (sum of per-sample losses, samples) since the last log, and (optimizer
    steps in a row with a non-finite loss, the longest such run since the last log)."""

    def __init__(self, accelerator: Accelerator, cfg: TrainConfig, log: MetricsLog):
        self.accelerator, self.cfg, self.metrics_log = accelerator, cfg, log
        device = accelerator.device
        self.running = torch.zeros(2, device=device)
        self.nonfinite = torch.zeros(2, device=device)
        self.window_nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        self.last_time, self.last_samples = time.perf_counter(), 0

    def add(self, loss_sum: torch.Tensor, real: torch.Tensor) -> None:
        self.running += torch.stack([loss_sum.float(), real.sum().float()]).to(self.running.device)
        self.window_nonfinite |= ~torch.isfinite(loss_sum).to(self.window_nonfinite.device)

    def step_done(self) -> None:
        self.nonfinite[0] = (self.nonfinite[0] + 1) * self.window_nonfinite
        self.nonfinite[1] = torch.maximum(self.nonfinite[1], self.nonfinite[0])
        self.window_nonfinite.zero_()

    def log(self, step: int, epoch: int, samples_seen: int, lr: float, progress, last_checkpoint) -> None:
        # (P, 3) = every process's loss sum, samples, NaN run.
        stats = self.accelerator.gather(torch.cat([self.running, self.nonfinite[1:]]).reshape(1, 3))
        now = time.perf_counter()
        rate = (samples_seen - self.last_samples) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_samples = now, samples_seen
        loss = (stats[:, 0].sum() / stats[:, 1].sum().clamp(min=1)).item()
        self.metrics_log.log(  # the epoch counted from 1, as the console does
            {"epoch": epoch + 1, "loss": loss, "learning_rate": lr, "samples_per_second": rate}, step
        )
        progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
        self.running.zero_()
        limit = self.cfg.max_nonfinite_loss_steps
        if stats[:, 2].max().item() >= limit:
            raise ckpt.diverged(
                f"the loss was NaN or infinite for {limit} optimizer steps in a row", step, last_checkpoint
            )
        self.nonfinite[1] = 0
