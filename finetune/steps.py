"""Optimizer steps: the plan of a run, the order of an epoch, which rows of a batch are real, and the
loss of one step.

The unit of a run is the optimizer step (the schedule, logging, evaluation and checkpoints count
them). `plan_steps` turns samples, processes, batch and accumulation into steps per epoch, total
steps and warm-up. `EpochSampler` draws each epoch's order from (seed, epoch) and can start it at any
sample, which is what makes a mid-epoch resume exact without reading the skipped batches. `Stream`
is one epoch as the loop sees it from where it starts: which rows of a process's batch are real (not
Accelerate's padding), and how many real samples the optimizer step of a micro-batch holds, which
`step_loss` divides by: the math of exact accumulation (docs/topologies.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler

from finetune import checks
from finetune.checks import launch


def step_loss(loss_sum: torch.Tensor, window_count: int, processes: int, accumulation: int) -> torch.Tensor:
    """What one micro-batch calls backward on, so that accumulation and DDP give one big batch's gradient.

    The loss of an optimizer step is L = (1/n) * sum of l_i over every real sample i of the step's window
    (all its micro-batches, on all processes), n their number (`Stream.window_count`). `accelerator.backward`
    divides each micro-batch's loss by the accumulation steps A, and DDP averages the gradients over the
    P processes. So each micro-batch's SUM of per-sample losses (padding rows masked out) is scaled by
    P * A / n, and the gradient applied is sum over micro-batches and processes of
    (1/P) (1/A) (P A / n) grad(sum l_i) = (1/n) grad(sum over the window of l_i) = grad L,
    also for an epoch's last, partial window (its true n, not the nominal global batch)."""
    return loss_sum * (processes * accumulation / window_count)


class EpochSampler(Sampler[int]):
    """The sample order of one epoch, reproducible from (seed, epoch) and startable mid-epoch.

    `reset(epoch, start)` selects the epoch's permutation and skips its first `start` samples, so a
    resumed run continues from the exact position without reading the skipped batches. With
    `lengths`, samples are grouped by length the way transformers' LengthGroupedSampler does
    (sorted inside random mega-batches) into groups of `group_size` — the samples of one optimizer
    step, so that any split of a step into processes and accumulation sees the same samples — and
    the groups are shuffled so that long and short steps alternate; the last, partial group stays
    last so that step boundaries are those of an ungrouped epoch. Every process computes the same
    order, and Accelerate's `BatchSamplerShard` deals its batches round-robin.

    With `pad_to` = processes x per-device batch (several processes) the stream is padded to a
    whole number of global batches with the epoch's FIRST samples, whatever `start` is. Accelerate would otherwise complete the last
    global batch itself, from the first samples it happened to see — after a resume, other samples
    than in the uninterrupted run. The padding is masked out of the loss either way, but its lengths
    set the padded shape of the batch and so the dropout masks drawn for the real samples.

    Deliberately no `set_epoch`: Accelerate's DataLoaderShard calls `set_epoch(iteration)` on the
    sampler at each iteration, which would fight the explicit position set here.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        group_size: int = 1,
        lengths: list[int] | None = None,
        megabatch_mult: int = 50,
        pad_to: int = 1,
        listener=None,
    ):
        self.num_samples, self.seed, self.group_size = num_samples, seed, group_size
        self.lengths, self.megabatch_mult, self.pad_to = lengths, megabatch_mult, pad_to
        self.listener = listener  # told each epoch's number as it starts (a seeded augmentation)
        self.epoch, self.start = 0, 0

    def reset(self, epoch: int, start: int = 0) -> None:
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"start {start} outside the epoch of {self.num_samples} samples")
        self.epoch, self.start = epoch, start
        if self.listener is not None:
            self.listener(epoch)

    def order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(self.num_samples, generator=g).tolist()
        if self.lengths is None:
            return perm
        gb = self.group_size
        mega = gb * self.megabatch_mult
        grouped: list[int] = []
        for i in range(0, len(perm), mega):
            grouped += sorted(perm[i : i + mega], key=lambda j: -self.lengths[j])
        batches = [grouped[i : i + gb] for i in range(0, len(grouped), gb)]
        tail = [batches.pop()] if batches and len(batches[-1]) < gb else []
        shuffle = torch.randperm(len(batches), generator=g).tolist()
        return [j for b in [batches[i] for i in shuffle] + tail for j in b]

    def weights(self, sample_weights: list[int] | None) -> list[int] | None:
        """Each sample's weight in the order of the current epoch's stream (from its start), or None."""
        if sample_weights is None:
            return None
        return [sample_weights[i] for i in self.order(self.epoch)[self.start :]]

    def _padding(self) -> int:
        return -(self.num_samples - self.start) % self.pad_to

    def __iter__(self):
        order = self.order(self.epoch)
        return iter(order[self.start :] + order[: self._padding()])

    def __len__(self) -> int:
        return self.num_samples - self.start + self._padding()


def batches_per_process(num_samples: int, per_device_batch: int, num_processes: int) -> int:
    """Batches each process sees in an epoch: Accelerate completes the last global batch."""
    return math.ceil(num_samples / (per_device_batch * num_processes))


@dataclass(frozen=True)
class Stream:
    """One epoch's stream of samples as the loop sees it, from where it starts (`samples` left in it).

    Accelerate's BatchSamplerShard cuts the stream into batches of `batch` and deals them round-robin
    to the `processes`; the last global batch is completed with padding samples (`EpochSampler(pad_to=...)`).
    Row j of a process's k-th batch is stream position (k * processes + process index) * batch + j,
    real when that position is below `samples`."""

    samples: int
    batch: int  # per process
    processes: int
    accumulation: int
    weights: list[int] | None = None  # each stream position's count in the loss (None: one each)

    @property
    def batches(self) -> int:
        """Batches per process in this stream."""
        return batches_per_process(self.samples, self.batch, self.processes)

    def real_rows(self, k: int, process_index: int, batch_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Which rows of this process's k-th batch are real. Built on `device` (a copy from the host to a
        GPU would wait for the GPU to finish its work)."""
        first = (k * self.processes + process_index) * self.batch
        return (torch.arange(batch_len, device=device) + first) < self.samples

    def window_count(self, k: int) -> int:
        """Real samples, over all processes, in the optimizer step that micro-batch k belongs to: or with
        `weights`, the sum of their weights (a tagging step's labelled tokens)."""
        window, per_batch = k // self.accumulation, self.processes * self.batch
        first = window * self.accumulation * per_batch
        last = min((window + 1) * self.accumulation * per_batch, self.samples)  # padding is not counted
        if self.weights is None:
            return max(0, last - first)
        return sum(self.weights[first:last])

    def samples_done(self, k: int) -> int:
        """Samples of the stream consumed after micro-batch k, on all processes."""
        return min((k + 1) * self.processes * self.batch, self.samples)


@dataclass
class StepPlan:
    """Optimizer steps are the unit: the schedule is planned in them, for any processes and accumulation."""

    samples: int  # training samples in an epoch
    batches: int  # per process, per epoch
    steps_per_epoch: int
    total_steps: int
    num_epochs: int
    warmup: int


def plan_steps(cfg, processes: int, samples: int, manifest: dict | None = None, moved: bool = False,
               said: checks.Said | None = None) -> StepPlan:  # fmt: skip
    """The run's steps: per epoch, in all, and warm-up; a resume onto another topology (`moved`, allowed
    by resume_allow_topology_change) takes the steps done plus the rest of the data in this run's steps."""
    batch, accumulation = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    batches = batches_per_process(samples, batch, processes)
    checks.gate(launch.ACCUMULATION, accumulation, batches)
    steps_per_epoch = math.ceil(batches / accumulation)
    total_steps = cfg.max_steps or math.ceil(steps_per_epoch * cfg.num_train_epochs - 1e-9)  # 1.5 epochs: half the 2nd
    if manifest is not None and moved and not cfg.max_steps:
        rest = math.ceil(batches_per_process(samples - manifest["samples_in_epoch"], batch, processes) / accumulation)
        later = max(0.0, cfg.num_train_epochs - manifest["epoch"] - 1)  # whole or part epochs after this one
        total_steps = manifest["step"] + rest + math.ceil(later * steps_per_epoch - 1e-9)
    num_epochs = (
        math.ceil(cfg.num_train_epochs) if cfg.max_steps is None else math.ceil(total_steps / steps_per_epoch) + 1
    )
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * total_steps)
    # the first step's rate is 0: a warm-up over every step never reaches learning_rate
    checks.gate(launch.WARMUP, cfg, warmup, total_steps, manifest, said=said if said is not None else checks.Said())
    return StepPlan(samples, batches, steps_per_epoch, total_steps, num_epochs, warmup)


def make_scheduler(name: str, optimizer, warmup: int, total: int):
    """The learning-rate schedule over optimizer steps: a linear warm-up over `warmup` steps, then
    linear decay to 0 at `total`, a cosine half-wave to 0, or constant. The formulas of transformers'
    get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup / get_constant_schedule_with_warmup,
    written here because importing transformers.optimization imports peft (3.5 s of every start)."""
    from torch.optim.lr_scheduler import LambdaLR

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        if name == "linear":
            return max(0.0, (total - step) / max(1, total - warmup))
        if name == "cosine":
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        return 1.0  # constant after warm-up

    return LambdaLR(optimizer, factor)
