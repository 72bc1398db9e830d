"""What a training run costs: the Recorder (each optimizer step's phases, from the loop's named
hooks) and the RunMonitor (peak memory, and the load other processes put on the machine).

    rec = Recorder(device)
    with RunMonitor(device) as monitor:
        finetune.run.train(cfg, rec)          # or a loop of our own that calls the same marks
    rec.summary(warmup=3), monitor.report()

The Recorder is a `finetune.run.Hooks`: the app's `train()` tells it its phases and the moments of
its loop (finetune/run.py, `Hooks`), and the textbook loops of benchmarks/reference.py call the same
marks at the same places, so both loops are timed by one rule:

    data            from the previous "micro-batch done" or "step" (the loop's start: phase "train")
                    to "batch": fetching and collating the batch, and Accelerate's copy to the device
    forward + loss  "batch" -> "backward"
    backward        "backward" -> "optimizer"
    optimizer       "optimizer" -> "micro-batch done": clipping, the optimizer step, zero_grad
    other           the rest of the step, up to "step": scheduler, logging, checkpoints, device copies

Evaluation inside a step (phase "evaluate", `eval_steps`) is timed apart and left out of the step's
wall time. Throughput is over the optimizer steps after the warm-up ones, from the "step" marks.

On a GPU every mark synchronises the device by default, which the split needs; it also stops the host
from queueing the next step while the device runs this one, which a host-bound loop pays for.
`Recorder(device, warmup, split=False)` (the bench's `--no-split`) synchronises only where the
timed window starts (the warm-up's last "step") and ends (the first evaluation, or the loop's end),
and counts tokens from the attention masks only after the run: the throughput is then the loop's
own, and the phases are left out.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.flops import batch_counts, flop_model, real_flops, sequences, token_flops, tokens_per_image
from benchmarks.peak import synchronize
from finetune.tracking import PHASES, Hooks

# The phase each mark ends (the time since the previous mark); "step" ends the optimizer step.
ENDS = {"batch": "data", "backward": "forward", "optimizer": "backward", "micro-batch done": "optimizer"}


@dataclass
class Step:
    """One optimizer step: phase seconds, counts, FLOPs, and when it ended."""

    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0
    eval: float = 0.0  # evaluation that ran inside the step's wall time (eval_steps); excluded
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    flops: float = 0.0
    flops_real: float = 0.0  # at each sample's real length (text); images: as `flops`
    lengths: list = field(default_factory=list)  # split=False: the masks' row sums, read after the run
    end: float = 0.0
    cpu_end: float = 0.0  # this process's CPU time (all its threads) when the step ended
    eval_cpu: float = 0.0


class Recorder(Hooks):
    """Each optimizer step's phase seconds, samples, tokens and model FLOPs, from the marks of a loop
    (the module docstring says which mark ends which phase); the run's own phase seconds
    (`self.seconds`: start-up, data, build, train, evaluate, export) as the base class keeps them.

    On CUDA every mark synchronises the device: the split needs it, and it costs both loops alike.
    With `split=False` only the timed window's ends do (the module docstring)."""

    def __init__(self, device: torch.device, warmup: int = 0, split: bool = True):
        super().__init__()
        self.device = device
        self.split = split
        self.window_start = max(warmup, 1)  # the "step" mark whose end starts the timed window
        self.steps: list[Step] = []
        self.cur = Step()
        self.evals: list[float] = []  # seconds of each evaluation
        self.validations: list[dict[str, Any]] = []  # the app's validation evaluations: seconds, samples
        self.model: torch.nn.Module | None = None
        self.flops: dict[str, Any] | None = None
        self.tokens_per_image: int | None = None
        self.since = time.perf_counter()  # the previous mark

    def now(self, sync: bool = True) -> float:
        if sync:
            synchronize(self.device)
        return time.perf_counter()

    def _close_window(self, t: float) -> None:
        """split=False: the device's queue has just drained at `t`; nothing of a step ran since the
        last "step" mark, so the last step really ended now."""
        if not self.split and self.steps and self.cur.samples == 0:
            self.steps[-1].end = t

    def mark(self, name: str, value: Any = None) -> None:
        if name == "built":  # FLOPs are counted at the first batch, when the freezing is done
            self.model, self.flops, self.tokens_per_image = value, None, tokens_per_image(value.config)
            return
        if name == "evaluated" and self.evals:  # a validation evaluation just ended: what it scored, and in how long
            self.validations.append({"seconds": self.evals[-1], "samples": value[1].get("num_samples")})
            return
        if name not in ENDS and name != "step":
            return
        t = self.now(self.split or (name == "step" and len(self.steps) + 1 == self.window_start))
        c = self.cur
        if name == "step":
            c.end, c.cpu_end = t, time.process_time()
            self.steps.append(c)
            self.cur = Step()
        else:
            setattr(c, ENDS[name], getattr(c, ENDS[name]) + t - self.since)
        if name == "batch" and isinstance(value, Mapping):
            self._count(value)
        self.since = t

    def _count(self, batch: Mapping) -> None:
        if self.flops is None and self.model is not None:
            self.flops = flop_model(self.model, batch)
        c = self.cur
        if self.flops and "flops_per_sample" in self.flops:  # counted by torch (a convolutional model)
            b = batch["pixel_values"].shape[0]
            c.samples, c.real_tokens, c.padded_tokens = c.samples + b, c.real_tokens + b, c.padded_tokens + b
            c.flops += b * self.flops["flops_per_sample"]
            c.flops_real += b * self.flops["flops_per_sample"]
            return
        if not self.split and "attention_mask" in batch:  # int(mask.sum()) would wait for the device
            mask = sequences(batch["attention_mask"])  # a candidate of multiple choice: a sequence
            c.samples, c.padded_tokens = c.samples + batch["attention_mask"].shape[0], c.padded_tokens + mask.numel()
            c.flops += mask.numel() * token_flops(self.flops, mask.shape[1]) if self.flops else 0.0
            c.lengths.append(mask.sum(1))
            return
        b, real, padded, s = batch_counts(batch, self.tokens_per_image)
        c.samples, c.real_tokens, c.padded_tokens = (
            c.samples + b,
            c.real_tokens + real,
            c.padded_tokens + padded,
        )
        added = padded * token_flops(self.flops, s) if self.flops else 0.0
        c.flops += added
        c.flops_real += (real_flops(batch, self.flops) or added) if self.flops else 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "train":  # the loop starts: the first batch's wait is counted from here
            self.since = self.now()
        if name != "evaluate":
            with super().phase(name):
                yield
            if name == "train":
                self._close_window(self.now())
            return
        t, cpu = self.now(), time.process_time()
        self._close_window(t)
        try:
            with super().phase(name):
                yield
        finally:
            dt = self.now() - t
            self.evals.append(dt)
            self.cur.eval += dt
            self.cur.eval_cpu += time.process_time() - cpu

    def summary(self, warmup: int) -> dict[str, Any]:
        """Throughput and phase split over the steps after `warmup` (their wall time, evals excluded)."""
        if len(self.steps) < 2:
            raise RuntimeError(f"only {len(self.steps)} optimizer step(s) recorded; need 2 or more")
        w = min(max(warmup, 1), len(self.steps) - 1)
        timed = self.steps[w:]
        for step in self.steps:  # split=False: the tokens counted now, the run over
            for lengths in step.lengths:
                n = lengths.tolist()
                step.real_tokens += sum(n)
                step.flops_real += float(sum(k * token_flops(self.flops, k) for k in n)) if self.flops else 0.0
            step.lengths = []
        seconds = timed[-1].end - self.steps[w - 1].end - sum(s.eval for s in timed)
        # CPU seconds of this process over the same steps: on a shared machine a single-threaded
        # run's CPU time barely moves with other processes' load while its wall time doubles.
        cpu = timed[-1].cpu_end - self.steps[w - 1].cpu_end - sum(s.eval_cpu for s in timed)
        keys = (
            "data",
            "forward",
            "backward",
            "optimizer",
            "samples",
            "real_tokens",
            "padded_tokens",
            "flops",
            "flops_real",
        )
        total = {k: sum(getattr(s, k) for s in timed) for k in keys}
        n = len(timed)
        phases = {k: total[k] / n for k in ("data", "forward", "backward", "optimizer")}
        phases["other"] = seconds / n - sum(phases.values())
        if not self.split:  # host times of a queue that runs ahead: not a split of the step
            phases = {k: None for k in phases}
        return {
            "steps_recorded": len(self.steps),
            "steps_timed": n,
            "seconds": seconds,
            "samples": total["samples"],
            "real_tokens": total["real_tokens"],
            "padded_tokens": total["padded_tokens"],
            "samples_per_s": total["samples"] / seconds,
            "real_tokens_per_s": total["real_tokens"] / seconds,
            "padded_tokens_per_s": total["padded_tokens"] / seconds,
            "step_time_s": seconds / n,
            # the first step alone: where torch.compile compiles (its cost, left out of the throughput)
            "first_step_s": self.steps[0].forward + self.steps[0].backward + self.steps[0].optimizer,
            "cpu_s_per_step": cpu / n,
            "samples_per_cpu_s": total["samples"] / cpu if cpu > 0 else None,
            "phases_s": phases,
            "model_flops": total["flops"],
            "model_flops_per_s": total["flops"] / seconds,
            "model_flops_real_per_s": total["flops_real"] / seconds,
            "flop_model": self.flops,
            # the run's own phases (start-up, data, build, train, evaluate, export), each without those inside it
            "stages_s": dict(
                sorted(
                    self.seconds.items(),
                    key=lambda kv: PHASES.index(kv[0]) if kv[0] in PHASES else len(PHASES),
                )
            ),
            "evals_s": self.evals,
            "validation_evaluations": self.validations,
        }


class RunMonitor:
    """Peak RSS of this process while the block runs, peak GPU memory, and how many CPU cores other
    processes used meanwhile.

    On Linux the kernel keeps the peak (VmHWM), reset at the start through /proc/self/clear_refs: no
    sampling thread, which cost 5% of the MiniLM step on 2 cores when it woke every 20 ms (both
    cores are busy with torch threads). Elsewhere RSS is sampled every `interval` seconds.
    """

    def __init__(self, device: torch.device, interval: float = 0.02):
        self.device, self.interval, self.peak_rss = device, interval, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _reset_kernel_peak() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # "reset the peak resident set size to the current RSS" (proc(5))
            return RunMonitor._kernel_peak() is not None
        except OSError:
            return False

    @staticmethod
    def _kernel_peak() -> int | None:
        with contextlib.suppress(OSError), open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return None

    def _rss(self) -> int:
        try:
            import psutil

            return psutil.Process().memory_info().rss
        except ImportError:  # Linux without psutil
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_rss = max(self.peak_rss, self._rss())

    @staticmethod
    def _cpu_ticks() -> tuple[int, int]:
        """(busy ticks of the whole machine, ticks of this process), from /proc; (0, 0) elsewhere."""
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                mine = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0, 0
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # minus idle, iowait
        return busy, int(mine[11]) + int(mine[12])  # utime + stime

    def __enter__(self) -> RunMonitor:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start_rss = self.peak_rss = self._rss()
        self.t0, self.ticks0 = time.perf_counter(), self._cpu_ticks()
        if not self._reset_kernel_peak():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        else:
            self.peak_rss = max(self.peak_rss, self._kernel_peak() or 0)
        self.peak_rss = max(self.peak_rss, self._rss())
        busy, mine = (b - a for a, b in zip(self.ticks0, self._cpu_ticks(), strict=True))
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        wall = time.perf_counter() - self.t0
        # CPU cores other processes kept busy, on average, during the block: on a shared machine
        # this is what the numbers of this run competed with.
        self.others_cores = max(0.0, (busy - mine) / hz / wall) if busy else None

    def report(self) -> dict[str, float | None]:
        gpu = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else None
        return {
            "peak_rss_mib": self.peak_rss / 2**20,
            "rss_before_mib": self.start_rss / 2**20,
            "peak_gpu_allocated_mib": gpu,
            "other_processes_cpu_cores": self.others_cores,
        }
