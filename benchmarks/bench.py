"""Benchmark the app's training loop against the hardware's matmul peak and a textbook loop.

    python -m benchmarks.bench                                  # BERT recipe, the recipe's steps
    python -m benchmarks.bench --recipe both --out runs/bench   # BERT and ViT
    python -m benchmarks.bench --steps 40 --levers              # plus each speed lever on/off
    python -m benchmarks.bench --precision bf16 --steps 4       # bf16 autocast (slow on CPUs without bf16)
    python -m benchmarks.bench --smoke --out /tmp/b             # tiny models, a few steps: the test's run
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 -m benchmarks.bench --steps 20

Writes `bench.json` and `bench.md` into --out. Where each number comes from:

- **app**: the real `finetune.run.train(cfg)` on the recipe plus `output_dir=<temp> max_steps=N`,
  not a copy of its loop. Phase times come from timestamps taken by thin wrappers around the
  building blocks that loop calls: the DataLoader iterator's `__next__` (data: fetch + collate),
  `finetune.run.forward` up to `Accelerator.backward` (forward + loss), `Accelerator.backward`
  (backward), from there to the torch optimizer's step post-hook (clip + optimizer), and what is
  left of the step (zero_grad, scheduler, logging, device copies: "other"). Throughput is over the
  optimizer steps after `--warmup`, from the step post-hook's timestamps. Eval accuracy is what
  `train()` returned for the test split (the validation split when the recipe has no test split).
- **reference**: a textbook loop written here the way accelerate's `nlp_example.py` is: shuffled
  batches, dynamic padding (`tokenizer.pad`, no multiple), `AdamW(model.parameters(), lr)` with
  default arguments, `accelerator.prepare/backward`, the recipe's LR schedule, nothing else. Same
  process, model (same seed, so same initial weights), tokenized data, precision, batch size and
  number of optimizer steps; evaluated on the same split.
- **MFU**: model FLOPs per second / the matmul peak measured in this run. Training FLOPs of a
  batch of B sequences padded to S tokens (padding is computed, so padded tokens count):
  `B*S * (6*N + 12*L*H*S)`, N = parameters outside the embedding tables (word, position and token
  type embeddings, ViT's position embedding and [CLS]; the ViT patch projection is a matmul and
  counts), L layers, H hidden size; 6*N is forward + backward of every weight matmul, 12*L*H*S the
  attention scores and weighted sums (QK^T and AV: 2 * 2*S*H per token per layer forward, x3).
  The pooler and classifier see one token per sequence, so 6*N overcounts them slightly (<2% here).
  Frozen weights count forward only (2 per weight, and attention x1 in a frozen layer): the app
  freezes the lowest layers (`freeze_layers`), below which backward does not go. Counted when the
  first step starts, after the freezing.
  The peak is the best of `--gemm-reps` square GEMMs of `--gemm-size` in the training dtype,
  in the best of the layouts a training step uses (A@B, A@B^T, A^T@B), measured before, between
  and after the runs (the machine may be shared: the best is the hardware's limit).
- **memory**: peak process RSS during the run (CPU; the kernel's high-water mark, reset when the run
  starts), `max_memory_allocated` (GPU).
- **communication** (several processes): all-reduce of one flat fp32 tensor the size of the
  gradients, timed alone in the reference's process group; DDP overlaps it with backward, so the
  backward phase already contains it.

Between runs the Accelerate singletons are reset, so each run builds its Accelerator afresh.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import set_seed
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, default_collate
from transformers import get_scheduler

import finetune.run as app
import finetune.runtime as runtime
from finetune.config import CONFIGS_DIR, REPO_DIR, TrainConfig, load_config
from finetune.data import load_splits, prepare_splits
from finetune.errors import ArgumentParser, UserError, exit_on_user_error
from finetune.models import build_model, load_preprocessor

RECIPES = {
    "bert": CONFIGS_DIR / "bert_rotten_tomatoes.yaml",
    "bert_full": CONFIGS_DIR / "bert_rotten_tomatoes_full.yaml",
    "vit": CONFIGS_DIR / "vit_fashion_mnist.yaml",
}
# --smoke: tiny models built from config on a slice of the bundled data (the test's run).
SMOKE = {
    "bert": [
        "model_config={model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
        "intermediate_size: 37, max_position_embeddings: 128}",
        "max_train_samples=64", "max_eval_samples=16", "max_test_samples=32", "max_length=32",
        "per_device_train_batch_size=8", "per_device_eval_batch_size=32",
    ],
    "vit": [
        "model_config={model_type: vit, image_size: 28, patch_size: 7, num_channels: 3, hidden_size: 32, "
        "num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 37}",
        "max_train_samples=64", "max_eval_samples=16", "max_test_samples=32",
        "per_device_train_batch_size=8", "per_device_eval_batch_size=32",
    ],
}  # fmt: skip
PEAK_DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# --- the hardware's limit --------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(dtype: torch.dtype, size: int, reps: int, device: torch.device, budget_s: float = 20.0) -> dict:
    """FLOP/s of the best of `reps` square GEMMs, in the fastest layout a training step uses.

    A linear layer's forward is x @ W^T, its backward dX = dY @ W and dW = dY^T @ X: three layouts,
    which BLAS libraries may serve at very different speeds (CPUs without native bf16 do: torch
    falls back to its own loops, fast only where it can use a vectorised dot product; with AMX,
    oneDNN ran 2048^3 bf16 A@B at 2.3 TFLOP/s and A^T@B at 1.0). Each layout is timed at `size`
    (all recorded) and the best is the peak; a layout slow enough to blow `budget_s` stops after
    one repetition. (Choosing the layout by a probe at 512 picked A^T@B on some runs and halved
    the peak.)
    """
    g = torch.Generator(device="cpu").manual_seed(0)

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))

    layouts: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "A@B": lambda a, b: a @ b,
        "A@B^T": lambda a, b: a @ b.t(),
        "A^T@B": lambda a, b: a.t() @ b,
    }

    def best_rate(fn, n: int, k: int) -> float:
        a, b = operands(n)
        best, spent = math.inf, 0.0
        for i in range(k + 1):  # the first call is a warm-up
            _sync(device)
            t = time.perf_counter()
            fn(a, b)
            _sync(device)
            dt = time.perf_counter() - t
            spent += dt
            if i > 0 or k == 0:
                best = min(best, dt)
            if spent > budget_s and best < math.inf:
                break
        return 2 * n**3 / best

    rates = {name: best_rate(fn, size, reps) for name, fn in layouts.items()}
    layout = max(rates, key=rates.get)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "size": size,
        "layout": layout,
        "flops_per_s": rates[layout],
        "layouts_flops_per_s": rates,
    }


# --- counting ----------------------------------------------------------------------------------------


def flop_model(model: torch.nn.Module) -> dict[str, Any]:
    """N, L, H of the FLOP count (see `token_flops`): parameters outside the embedding tables,
    layers, hidden size; and how many of them are frozen (read when training starts)."""
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    excluded = {"position_embeddings", "cls_token", "mask_token"}
    counted = [
        p
        for name, p in model.named_parameters()
        if id(p) not in embedding and name.rsplit(".", 1)[-1] not in excluded
    ]
    cfg = model.config
    try:
        from finetune.parallel import find_blocks

        _, layers, _ = find_blocks(model)
        frozen_layers = sum(
            not any(p.requires_grad for p in model.get_submodule(name).parameters()) for name in layers
        )
    except ValueError:  # a model the layer split does not know: no frozen layers counted
        frozen_layers = 0
    return {
        "non_embedding_params": sum(p.numel() for p in counted),
        "frozen_non_embedding_params": sum(p.numel() for p in counted if not p.requires_grad),
        "layers": cfg.num_hidden_layers,
        "frozen_layers": frozen_layers,
        "hidden": cfg.hidden_size,
        "params": sum(p.numel() for p in model.parameters()),
    }


def token_flops(f: dict[str, Any], s: int) -> float:
    """Training FLOPs per (padded) token at length s: 6 per trained weight (forward + two backward
    matmuls), 2 per frozen one (the app freezes the lowest layers: backward stops above them), and
    attention's QK^T and AV, 4*S*H a layer forward, x3 where the layer trains."""
    n, frozen = f["non_embedding_params"], f["frozen_non_embedding_params"]
    layers, frozen_layers = f["layers"], f["frozen_layers"]
    return 6 * (n - frozen) + 2 * frozen + 4 * f["hidden"] * s * (3 * (layers - frozen_layers) + frozen_layers)


def batch_counts(batch: dict[str, torch.Tensor], tokens_per_image: int | None) -> tuple[int, int, int, int]:
    """(samples, real tokens, padded tokens, padded length) of a collated CPU batch."""
    if "attention_mask" in batch:
        mask = batch["attention_mask"]
        return mask.shape[0], int(mask.sum()), mask.numel(), mask.shape[1]
    if "input_ids" in batch:
        ids = batch["input_ids"]
        return ids.shape[0], ids.numel(), ids.numel(), ids.shape[1]
    b = batch["pixel_values"].shape[0]
    t = tokens_per_image or 1
    return b, b * t, b * t, t


def tokens_per_image(config) -> int | None:
    if getattr(config, "image_size", None) and getattr(config, "patch_size", None):
        return (config.image_size // config.patch_size) ** 2 + 1  # patches + [CLS]
    return None


# --- the recorder ------------------------------------------------------------------------------------


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
    end: float = 0.0
    cpu_end: float = 0.0  # this process's CPU time (all its threads) when the step ended
    eval_cpu: float = 0.0


class Recorder:
    """Timestamps of a training loop's phases, fed by the wrappers in `instrument`.

    Accelerate's DataLoaderShard fetches one batch ahead, so fetched batches wait in a queue and are
    attributed to the step whose forward consumes them. On CUDA every mark synchronises the device
    (the phase split needs it; it costs both loops alike)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.steps: list[Step] = []
        self.cur = Step()
        self.pending: deque[tuple[float, tuple[int, int, int, int]]] = deque()
        self.stages: dict[str, float] = {}
        self.evals: list[dict[str, float]] = []
        self.in_eval = False
        self.t_forward = self.t_backward_end = 0.0
        self.flops: dict[str, Any] | None = None
        self.model: torch.nn.Module | None = None
        self.tokens_per_image: int | None = None
        self.start = time.perf_counter()

    def now(self) -> float:
        _sync(self.device)
        return time.perf_counter()

    def set_model(self, model: torch.nn.Module) -> None:
        self.model, self.flops = model, None  # counted at the first step: after freezing
        self.tokens_per_image = tokens_per_image(model.config)

    def fetched(self, seconds: float, batch: Any) -> None:
        if not self.in_eval and isinstance(batch, Mapping):
            self.pending.append((seconds, batch_counts(batch, self.tokens_per_image)))

    def forward_start(self) -> None:
        self.t_forward = self.now()
        if self.pending:
            seconds, (b, real, padded, s) = self.pending.popleft()
            if self.flops is None and self.model is not None:
                self.flops = flop_model(self.model)
            c = self.cur
            c.data += seconds
            c.samples, c.real_tokens, c.padded_tokens = (
                c.samples + b,
                c.real_tokens + real,
                c.padded_tokens + padded,
            )
            c.flops += padded * token_flops(self.flops, s) if self.flops else 0.0

    def backward_start(self) -> None:
        t = self.now()
        self.cur.forward += t - self.t_forward
        self.t_backward = t

    def backward_end(self) -> None:
        self.t_backward_end = self.now()
        self.cur.backward += self.t_backward_end - self.t_backward

    def optimizer_end(self) -> None:
        t = self.now()
        self.cur.optimizer += t - self.t_backward_end
        self.cur.end, self.cur.cpu_end = t, time.process_time()
        self.steps.append(self.cur)
        self.cur = Step()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - t

    @contextlib.contextmanager
    def evaluating(self, samples: int) -> Iterator[None]:
        t, cpu, self.in_eval = time.perf_counter(), time.process_time(), True
        try:
            yield
        finally:
            self.in_eval = False
            dt = time.perf_counter() - t
            self.evals.append({"samples": samples, "seconds": dt})
            self.cur.eval += dt
            self.cur.eval_cpu += time.process_time() - cpu

    def summary(self, warmup: int) -> dict[str, Any]:
        """Throughput and phase split over the steps after `warmup` (their wall time, evals excluded)."""
        if len(self.steps) < 2:
            raise RuntimeError(f"only {len(self.steps)} optimizer step(s) recorded; need 2 or more")
        w = min(max(warmup, 1), len(self.steps) - 1)
        timed = self.steps[w:]
        seconds = timed[-1].end - self.steps[w - 1].end - sum(s.eval for s in timed)
        # CPU seconds of this process over the same steps: on a shared machine a single-threaded
        # run's CPU time barely moves with other processes' load while its wall time doubles.
        cpu = timed[-1].cpu_end - self.steps[w - 1].cpu_end - sum(s.eval_cpu for s in timed)
        total = {
            k: sum(getattr(s, k) for s in timed)
            for k in (
                "data",
                "forward",
                "backward",
                "optimizer",
                "samples",
                "real_tokens",
                "padded_tokens",
                "flops",
            )
        }
        n = len(timed)
        phases = {k: total[k] / n for k in ("data", "forward", "backward", "optimizer")}
        phases["other"] = seconds / n - sum(phases.values())
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
            "flop_model": self.flops,
            "stages_s": dict(self.stages),
            "evals": self.evals,
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


# --- instrumenting the app's own loop ------------------------------------------------------------------


@contextlib.contextmanager
def patched(target: Any, name: str, make: Callable[[Any], Any], missing: list[str]) -> Iterator[None]:
    """Replace `target.name` by `make(original)` for the block; note it when the app has no such name."""
    original = getattr(target, name, None)
    if original is None:
        missing.append(f"{getattr(target, '__name__', target)}.{name}")
        yield
        return
    setattr(target, name, make(original))
    try:
        yield
    finally:
        setattr(target, name, original)


@contextlib.contextmanager
def instrument(rec: Recorder, app_side: bool, missing: list[str]) -> Iterator[None]:
    """Wrap the building blocks a training loop calls, to timestamp its phases.

    The app's `train()` runs unchanged: only the module-level names it looks up at call time
    (`finetune.run.forward`, `.load_splits`, ...) and two class attributes (`Accelerator.backward`,
    the DataLoader iterator's `__next__`) are wrapped, plus torch's global optimizer step hook."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    def timed_next(orig):
        def wrapper(self):
            t = time.perf_counter()
            batch = orig(self)
            rec.fetched(time.perf_counter() - t, batch)
            return batch

        return wrapper

    def timed_backward(orig):
        def wrapper(self, loss, **kwargs):
            rec.backward_start()
            try:
                return orig(self, loss, **kwargs)
            finally:
                rec.backward_end()

        return wrapper

    def timed_forward(orig):
        def wrapper(model, *args, **kwargs):
            if model.training and not rec.in_eval:
                rec.forward_start()
            return orig(model, *args, **kwargs)

        return wrapper

    def timed_eval(orig):
        def wrapper(model, loader, *args, **kwargs):
            with rec.evaluating(len(loader.dataset)):
                return orig(model, loader, *args, **kwargs)

        return wrapper

    def staged(name: str, keep_model: bool = False):
        def make(orig):
            def wrapper(*args, **kwargs):
                with rec.stage(name):
                    out = orig(*args, **kwargs)
                if keep_model:
                    rec.set_model(out)
                return out

            return wrapper

        return make

    hook = register_optimizer_step_post_hook(lambda *a: rec.optimizer_end())
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(_BaseDataLoaderIter, "__next__", timed_next, missing))
        stack.enter_context(patched(Accelerator, "backward", timed_backward, missing))
        if app_side:
            stack.enter_context(patched(app, "forward", timed_forward, missing))
            stack.enter_context(patched(app, "evaluate_model", timed_eval, missing))
            stack.enter_context(patched(app, "load_splits", staged("load_data"), missing))
            stack.enter_context(patched(app, "prepare_splits", staged("preprocess"), missing))
            stack.enter_context(patched(app, "build_model", staged("build_model", keep_model=True), missing))
        try:
            yield
        finally:
            hook.remove()


def reset_accelerate() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


# --- the two loops ---------------------------------------------------------------------------------------


def eval_split_of(results: dict[str, Any]) -> str:
    return "test" if "test" in results else "validation"


def run_app(cfg: TrainConfig, warmup: int, device: torch.device) -> dict[str, Any]:
    """The app's real `train(cfg)`, instrumented."""
    rec, missing = Recorder(device), []
    reset_accelerate()
    load = os.getloadavg()
    with RunMonitor(device) as mem, instrument(rec, app_side=True, missing=missing):
        t = time.perf_counter()
        results = app.train(cfg)
        wall = time.perf_counter() - t
    reset_accelerate()
    split = eval_split_of(results)
    out = rec.summary(warmup)
    out.update(mem.report())
    out.update({
        "source": "finetune.run.train(cfg): the app's own loop; phases from wrappers around the blocks it calls",
        "optimizer_steps": results["step"],
        "train_wall_s": wall,
        "eval_split": split,
        "eval_accuracy": results[split]["accuracy"],
        "eval_samples": results[split]["num_samples"],
        "load_avg_before": load,
        "load_avg_after": os.getloadavg(),
        "instrumentation_missing": missing,
    })  # fmt: skip
    return out


def pad_batch(tokenizer, fixed_length: int | None = None):
    """nlp_example's collate_fn: pad to the longest in the batch (no multiple in fp32); with
    `fixed_length` (the bench's --seq-len), every batch to that length, as the app is then."""

    def collate(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if "pixel_values" in examples[0]:
            return default_collate(examples)
        if fixed_length:
            return tokenizer.pad(examples, padding="max_length", max_length=fixed_length, return_tensors="pt")
        return tokenizer.pad(examples, padding="longest", return_tensors="pt")

    return collate


def run_reference(
    cfg: TrainConfig, steps: int, eval_split: str, warmup: int, device: torch.device, comm_reps: int = 5
) -> dict[str, Any]:
    """The textbook loop (accelerate's nlp_example), on the app's data, model and schedule."""
    rec, missing = Recorder(device), []
    reset_accelerate()
    load = os.getloadavg()
    with RunMonitor(device) as mem, instrument(rec, app_side=False, missing=missing):
        t0 = time.perf_counter()
        accelerator = Accelerator()
        set_seed(cfg.seed)  # as train() does before building: the same initial weights
        with rec.stage("load_data"):
            raw, label_names = load_splits(cfg.data_args)
        text = cfg.task == "text-classification"
        tokenizer = load_preprocessor(cfg.model_args) if text else None
        with rec.stage("build_model"):
            model = build_model(cfg.model_args, label_names, vocab_size=len(tokenizer) if text else None)
        rec.set_model(model)
        with rec.stage("preprocess"):
            preprocessor = tokenizer if text else load_preprocessor(cfg.model_args, model.config)
            splits = prepare_splits(cfg.data_args, raw, preprocessor, getattr(model.config, "num_channels", 3))
        drop = [c for c in ("length",) if c in splits["train"].column_names]
        train_set, eval_set = splits["train"].remove_columns(drop), splits[eval_split].remove_columns(drop)
        fixed = cfg.max_length if cfg.pad_to_multiple_of == cfg.max_length else None  # --seq-len
        collate = pad_batch(tokenizer, fixed)
        train_dl = DataLoader(
            train_set, shuffle=True, batch_size=cfg.per_device_train_batch_size, collate_fn=collate
        )
        eval_dl = DataLoader(eval_set, batch_size=cfg.per_device_eval_batch_size, collate_fn=collate)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
        warm = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * steps)
        scheduler = get_scheduler(
            cfg.lr_scheduler_type if cfg.lr_scheduler_type != "constant" else "constant_with_warmup",
            optimizer,
            num_warmup_steps=warm,
            num_training_steps=steps,
        )
        model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
            model, optimizer, train_dl, eval_dl, scheduler
        )
        model.train()
        step = 0
        while step < steps:
            for batch in train_dl:
                rec.forward_start()
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                step += 1
                if step >= steps:
                    break
        train_s = time.perf_counter() - t0
        model.eval()
        correct = total = 0
        with rec.evaluating(len(eval_set)):
            for batch in eval_dl:
                with torch.no_grad():
                    logits = model(**batch).logits
                preds, refs = accelerator.gather_for_metrics((logits.argmax(-1), batch["labels"]))
                correct += int((preds == refs).sum())
                total += len(refs)
        comm = all_reduce_seconds(accelerator, model, comm_reps)
    reset_accelerate()
    out = rec.summary(warmup)
    out.update(mem.report())
    out["phases_s"]["communication"] = comm
    out.update({
        "source": "the textbook loop in benchmarks/bench.py (nlp_example: shuffle, pad to longest, "
                  "default AdamW, accelerator.backward)",
        "optimizer_steps": step,
        "train_wall_s": train_s,
        "eval_split": eval_split,
        "eval_accuracy": correct / total,
        "eval_samples": total,
        "load_avg_before": load,
        "load_avg_after": os.getloadavg(),
        "instrumentation_missing": missing,
    })  # fmt: skip
    return out


def all_reduce_seconds(accelerator: Accelerator, model: torch.nn.Module, reps: int) -> float:
    """Seconds to all-reduce a flat fp32 tensor the size of the gradients (0 with one process)."""
    if accelerator.num_processes == 1:
        return 0.0
    import torch.distributed as dist

    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = torch.zeros(n, device=accelerator.device)
    dist.all_reduce(flat)
    best = math.inf
    for _ in range(reps):
        _sync(accelerator.device)
        t = time.perf_counter()
        dist.all_reduce(flat)
        _sync(accelerator.device)
        best = min(best, time.perf_counter() - t)
    return best


# --- the benchmark ----------------------------------------------------------------------------------------


def recipe_config(recipe: str, args: argparse.Namespace, out: Path, extra: list[str] = ()) -> TrainConfig:
    overrides = [f"output_dir={out}", "overwrite_output_dir=true", "report_to=[]"]
    if args.smoke:
        overrides += SMOKE[recipe.removesuffix("_full")]
    if args.steps:
        overrides.append(f"max_steps={args.steps}")
    if args.seq_len and recipe.startswith("bert"):
        overrides += [f"max_length={args.seq_len}", f"pad_to_multiple_of={args.seq_len}"]
    return load_config(RECIPES[recipe], overrides + list(args.override) + list(extra))


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["samples_per_s"])[(len(runs) - 1) // 2]


def bench_recipe(
    recipe: str, args: argparse.Namespace, peak: Callable[[], float], tmp: Path, device: torch.device
) -> dict[str, Any]:
    """App and reference alternately, `--reps` times each, with the matmul peak measured between."""
    cfg = recipe_config(recipe, args, tmp / f"{recipe}-app")
    peaks = [peak()]
    apps, refs = [], []
    for _ in range(args.reps):
        apps.append(run_app(cfg, args.warmup, device))
        peaks.append(peak())
        refs.append(
            run_reference(cfg, apps[-1]["optimizer_steps"], apps[-1]["eval_split"], args.warmup, device)
        )
        peaks.append(peak())
    best = max(peaks)
    for r in apps + refs:
        r["mfu"] = r["model_flops_per_s"] / best
    app_r, ref_r = median_run(apps), median_run(refs)
    return {
        "recipe": str(RECIPES[recipe].relative_to(REPO_DIR)),
        "overrides": cfg_overrides(recipe, args),
        "peak_flops_per_s_measured": peaks,
        "app": app_r,
        "reference": ref_r,
        "app_runs": apps,
        "reference_runs": refs,
        "app_over_reference": {
            "samples_per_s": ratio(app_r["samples_per_s"], ref_r["samples_per_s"]),
            "samples_per_s_per_rep": [
                ratio(a["samples_per_s"], b["samples_per_s"]) for a, b in zip(apps, refs, strict=True)
            ],
            "padded_tokens_per_s": ratio(app_r["padded_tokens_per_s"], ref_r["padded_tokens_per_s"]),
            "model_flops_per_s": ratio(app_r["model_flops_per_s"], ref_r["model_flops_per_s"]),
            "eval_accuracy_difference": app_r["eval_accuracy"] - ref_r["eval_accuracy"],
        },
    }


def cfg_overrides(recipe: str, args: argparse.Namespace) -> list[str]:
    extra = SMOKE[recipe.removesuffix("_full")] if args.smoke else []
    if args.seq_len and recipe.startswith("bert"):
        extra = [*extra, f"max_length={args.seq_len}", f"pad_to_multiple_of={args.seq_len}"]
    return extra + ([f"max_steps={args.steps}"] if args.steps else []) + list(args.override)


# --- levers: the app's loop with one thing changed ----------------------------------------------------------


def _adamw(**forced):
    original = torch.optim.AdamW

    def make(*a, **kw):
        return original(*a, **{**kw, **forced})

    return make


LEVERS: dict[str, dict[str, Any]] = {
    # name: what "on" is (the app's default) and how "off" differs
    "group_by_length": {
        "on": "batches of similar length (recipe)",
        "off": "random batches",
        "overrides": ["group_by_length=false"],
        "text": True,
    },
    "frozen_embeddings": {
        "on": "freeze_embeddings=true (recipe)",
        "off": "word embeddings trained",
        "overrides": ["freeze_embeddings=false"],
        "text": True,
    },
    "no_dropout": {
        "on": "dropout=0 (recipe)",
        "off": "the model's dropout (0.1)",
        "overrides": ["dropout=null"],
        "text": True,
    },
    "batch_32": {
        "on": "per_device_train_batch_size=32, learning_rate=2e-4 (recipe)",
        "off": "batch 16, learning_rate=1e-4 (the same samples in twice the steps)",
        "overrides": ["per_device_train_batch_size=16", "learning_rate=1e-4"],
        "text": True,
        "steps_scale": 2,
        "recipes": ["bert"],
    },
    "batch_64": {
        "on": "per_device_train_batch_size=64, learning_rate=2e-4 (recipe)",
        "off": "batch 32, learning_rate=1e-4 (the same samples in twice the steps)",
        "overrides": ["per_device_train_batch_size=32", "learning_rate=1e-4"],
        "text": True,
        "steps_scale": 2,
        "recipes": ["bert_full"],
    },
    "frozen_layers": {
        "on": "freeze_layers=2 (recipe): backward stops at layer 2",
        "off": "freeze_layers=0: only the word embeddings frozen",
        "overrides": ["freeze_layers=0"],
        "recipes": ["bert_full"],
    },
    "no_gradient_checkpointing": {
        "on": "activations kept for backward (gradient_checkpointing=false)",
        "off": "gradient_checkpointing=true: recomputed in backward, less memory",
        "overrides": ["gradient_checkpointing=true"],
    },
    "no_host_sync_per_step": {
        "on": "loss read back every logging_steps (10)",
        "off": "read back and logged every step",
        "overrides": ["logging_steps=1"],
    },
    "attention_kernel": {
        "on": "attn_implementation=null: eager under bf16/fp16 on a CPU, else SDPA",
        "off": "the other kernel",
        # the one the app does not choose (its choice: finetune.run.attention_kernel; None is SDPA)
        "overrides": lambda chosen: ["attn_implementation=" + ("sdpa" if chosen == "eager" else "eager")],
    },
    "fused_adamw": {
        "on": "AdamW(fused=True)",
        "off": "AdamW(foreach=True)",
        "patch": (torch.optim, "AdamW", lambda orig: _adamw(fused=False, foreach=True)),
    },
    "fused_adamw_vs_default": {
        "on": "AdamW(fused=True)",
        "off": "AdamW() default (for-loop on CPU)",
        "patch": (torch.optim, "AdamW", lambda orig: _adamw(fused=None, foreach=None)),
    },
    "in_process_data": {
        "on": "dataloader_num_workers=null (0 on a CPU)",
        "off": "dataloader_num_workers=1",
        "overrides": ["dataloader_num_workers=1"],
    },
    "fp32": {
        "on": "mixed_precision=no",
        "off": "mixed_precision=bf16 (autocast)",
        "env": {"ACCELERATE_MIXED_PRECISION": "bf16"},
    },
    "ddp_no_static_graph": {
        "on": "ddp_static_graph=false",
        "off": "ddp_static_graph=true",
        "overrides": ["ddp_static_graph=true"],
        "ddp": True,
    },
    "ddp_no_bucket_view": {
        "on": "ddp_gradient_as_bucket_view=false",
        "off": "ddp_gradient_as_bucket_view=true",
        "overrides": ["ddp_gradient_as_bucket_view=true"],
        "ddp": True,
    },
    "cpu_threads": {
        "on": "cpu_threads=null: this process's share of the cores",
        "off": "cpu_threads=1 (what `accelerate launch` leaves a CPU process)",
        "overrides": ["cpu_threads=1"],
        "cpu": True,
    },
    "eager_mode": {
        "on": "no torch.compile",
        "off": "torch.compile (ACCELERATE_DYNAMO_BACKEND=INDUCTOR)",
        "env": {"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"},
        "optional": True,
    },
}


def lever_overrides(spec: dict[str, Any], device: torch.device) -> list[str]:
    """The overrides that turn a lever off; a callable one is given the attention kernel the app
    chooses unasked on this device and precision (the attention kernel's case)."""
    overrides = spec.get("overrides", [])
    if callable(overrides):
        precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        return overrides(app.attention_kernel(None, device, precision))
    return overrides


@contextlib.contextmanager
def lever_off(spec: dict[str, Any]) -> Iterator[None]:
    missing: list[str] = []
    saved_env = {k: os.environ.get(k) for k in spec.get("env", {})}
    with contextlib.ExitStack() as stack:
        if "patch" in spec:
            target, name, make = spec["patch"]
            stack.enter_context(patched(target, name, make, missing))
        os.environ.update(spec.get("env", {}))
        try:
            yield
        finally:
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def lever_skipped(
    spec: dict[str, Any], recipe: str, args: argparse.Namespace, device: torch.device, processes: int
) -> str | None:
    """Why a lever does not apply to this recipe and setup, or None."""
    if spec.get("optional") and not args.compile:
        return "it needs --compile"
    if (spec.get("text") and not recipe.startswith("bert")) or recipe not in spec.get("recipes", RECIPES):
        return f"it is not a lever of --recipe {recipe}"
    if spec.get("cpu") and device.type != "cpu":
        return "it is a CPU lever"
    if spec.get("ddp") and processes < 2:
        return "it needs several processes"
    return None


def bench_levers(
    recipe: str, args: argparse.Namespace, tmp: Path, device: torch.device, processes: int
) -> list[dict]:
    """Each lever off vs the app as shipped, interleaved (base, off, base, off, ...) on short runs, so
    that a shared machine's changing load hits both sides alike. Ratio = app default / lever off."""
    rows = []
    short = ["max_eval_samples=64", "test_file=null"]
    for name, spec in LEVERS.items():
        if lever_skipped(spec, recipe, args, device, processes):
            continue
        if args.levers_only and name not in args.levers_only:
            continue
        steps = spec.get("steps", args.lever_steps)
        base_cfg = recipe_config(recipe, args, tmp / f"lever-{name}", short + [f"max_steps={steps}"])
        off_steps = steps * spec.get("steps_scale", 1)  # the same samples when the batch differs
        off_cfg = recipe_config(
            recipe,
            args,
            tmp / f"lever-{name}",
            short + [f"max_steps={off_steps}"] + lever_overrides(spec, device),
        )
        on_runs, off_runs = [], []
        for _ in range(args.lever_reps):
            on_runs.append(run_app(base_cfg, args.warmup, device))
            with lever_off(spec):
                off_runs.append(run_app(off_cfg, args.warmup, device))

        def med(runs, key):
            values = sorted(r[key] for r in runs)
            return values[len(values) // 2]

        row = {
            "lever": name, "on": spec["on"], "off": spec["off"], "steps": steps,
            "on_samples_per_s": [r["samples_per_s"] for r in on_runs],
            "off_samples_per_s": [r["samples_per_s"] for r in off_runs],
            "on_padded_tokens": med(on_runs, "padded_tokens"), "off_padded_tokens": med(off_runs, "padded_tokens"),
            "on_phases_s": on_runs[-1]["phases_s"], "off_phases_s": off_runs[-1]["phases_s"],
            "on_first_step_s": [r["first_step_s"] for r in on_runs],
            "off_first_step_s": [r["first_step_s"] for r in off_runs],
            "on_preprocess_s": on_runs[-1]["stages_s"].get("preprocess"),
            "off_preprocess_s": off_runs[-1]["stages_s"].get("preprocess"),
            "ratio_per_rep": [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(on_runs, off_runs, strict=True)],
            "cpu_ratio_per_rep": [ratio(a["samples_per_cpu_s"], b["samples_per_cpu_s"]) for a, b in
                                  zip(on_runs, off_runs, strict=True)],
            "other_processes_cpu_cores": [r["other_processes_cpu_cores"] for r in on_runs + off_runs],
            "load_avg": [r["load_avg_before"][0] for r in on_runs + off_runs],
        }  # fmt: skip
        row["ratio"] = geomean(row["ratio_per_rep"])
        row["cpu_ratio"] = geomean([x for x in row["cpu_ratio_per_rep"] if x])
        rows.append(row)
        print(
            f"lever {name}: on/off = {row['ratio']:.2f}x wall, {row['cpu_ratio'] or 0:.2f}x CPU; first step "
            f"{max(row['on_first_step_s']):.1f} s on, {max(row['off_first_step_s']):.1f} s off",
            flush=True,
        )
    return rows


def tokenize_cache(recipe: str, args: argparse.Namespace) -> dict[str, float]:
    """Seconds to tokenize the recipe's splits with datasets' cache warm vs with caching off."""
    import datasets

    cfg = recipe_config(recipe, args, Path(tempfile.mkdtemp()))
    raw, names = load_splits(cfg.data_args)
    tok = load_preprocessor(cfg.model_args)
    out = {}
    for label, enabled in (("cached", True), ("uncached", False), ("cached_again", True)):
        (datasets.enable_caching if enabled else datasets.disable_caching)()
        t = time.perf_counter()
        prepare_splits(cfg.data_args, raw, tok)
        out[label + "_s"] = time.perf_counter() - t
    datasets.enable_caching()
    return out


# --- report -------------------------------------------------------------------------------------------------


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import the app's entry point (what every launch pays)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import finetune.run"], check=True, capture_output=True)
    return time.perf_counter() - t


def machine() -> dict[str, Any]:
    import accelerate
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "accelerate": accelerate.__version__,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
    }  # fmt: skip


def _fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{unit}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads"
        + (f", GPU {m['gpu']}" if m["gpu"] else "")
        + f"; torch {m['torch']}, transformers {m['transformers']}, accelerate {m['accelerate']}; "
        f"precision {report['precision']}; {report['processes']} process(es).",
        f"Load average (1 min) at start / end: {report['load_avg_start'][0]:.2f} / {report['load_avg_end'][0]:.2f}.",
        f"Command: `{report['command']}`",
        "",
    ]
    p = report["peak"]
    lines.append(
        f"Matmul peak ({p['dtype']}, {p['size']}^3, {p['layout']}): best {p['flops_per_s'] / 1e9:.1f} "
        f"GFLOP/s; each layout: "
        + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in p["layouts_flops_per_s"].items())
        + " GFLOP/s."
    )
    for name, r in report["recipes"].items():
        a, b, q = r["app"], r["reference"], r["app_over_reference"]
        lines += [
            "",
            f"### {name}: `{r['recipe']}` {' '.join(r['overrides'])}",
            "",
            f"{a['optimizer_steps']} optimizer steps each, {a['steps_timed']} timed (after warm-up); "
            f"peak measured in this run: "
            + ", ".join(f"{x / 1e9:.1f}" for x in r["peak_flops_per_s_measured"])
            + " GFLOP/s (MFU uses the best).",
            "",
            f"{len(r['app_runs'])} app/reference pair(s), run alternately; the table shows the median run of "
            "each; app/reference samples/s per pair: "
            + ", ".join(f"{x:.2f}x" for x in q["samples_per_s_per_rep"])
            + ".",
            "",
            "| | app (`finetune.run.train`) | reference (textbook loop) | app / reference |",
            "|---|---:|---:|---:|",
        ]
        rows = [
            ("samples/s", "samples_per_s", "", 1),
            ("real tokens/s", "real_tokens_per_s", "", 0),
            ("padded tokens/s", "padded_tokens_per_s", "", 0),
            ("padded / real tokens", None, "", 2),
            ("step time (ms)", "step_time_s", "ms", 0),
            ("CPU time of this process per step (ms)", "cpu_s_per_step", "ms", 0),
            ("— data (ms)", "data", "ms", 0),
            ("— forward + loss (ms)", "forward", "ms", 0),
            ("— backward (ms)", "backward", "ms", 0),
            ("— optimizer (ms)", "optimizer", "ms", 0),
            ("— other (ms)", "other", "ms", 0),
            ("— communication (ms, inside backward)", "communication", "ms", 1),
            ("model GFLOP/s", "model_flops_per_s", "G", 1),
            ("MFU", "mfu", "", 3),
            ("peak RSS (MiB)", "peak_rss_mib", "", 0),
            ("peak GPU allocated (MiB)", "peak_gpu_allocated_mib", "", 0),
            ("eval accuracy", "eval_accuracy", "", 4),
            ("CPU cores used by other processes meanwhile", "other_processes_cpu_cores", "", 2),
        ]
        for label, key, unit, d in rows:

            def get(x, key=key, unit=unit):
                if key is None:
                    return x["padded_tokens"] / max(x["real_tokens"], 1)
                v = x["phases_s"].get(key) if key in x["phases_s"] else x.get(key)
                if v is None:
                    return None
                return v * 1e3 if unit == "ms" else v / 1e9 if unit == "G" else v

            va, vb = get(a), get(b)
            rr = "–" if va is None or not vb else f"{va / vb:.2f}x"
            if key == "eval_accuracy":
                rr = f"{q['eval_accuracy_difference'] * 100:+.2f} points"
            lines.append(f"| {label} | {_fmt(va, '', d)} | {_fmt(vb, '', d)} | {rr} |")
        lines.append(
            f"| eval split (samples) | {a['eval_split']} ({a['eval_samples']}) | "
            f"{b['eval_split']} ({b['eval_samples']}) | |"
        )
        stages = a["stages_s"]
        lines += [
            "",
            "App `train()` wall: "
            + f"{a['train_wall_s']:.1f} s = "
            + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
            + f", {a['steps_recorded']} steps {a['steps_recorded'] * a['step_time_s']:.1f} (est.), "
            + ", ".join(f"eval of {e['samples']} {e['seconds']:.1f}" for e in a["evals"])
            + " s"
            + (
                f"; imports before it (fresh interpreter) {report['import_seconds']:.1f} s"
                if report["import_seconds"]
                else ""
            )
            + ".",
        ]
    if report.get("levers"):
        lines += [
            "",
            "### Levers (the app's loop as shipped vs one thing changed; short runs, interleaved)",
            "",
            "on / off = the shipped setting's samples/s over the changed one's (> 1: the shipped one is "
            "faster), geometric mean over the pairs; by wall time, and by this process's CPU time "
            "(robust to other processes' load for a 1-thread run; not comparable when threads or "
            "worker processes differ).",
            "",
            "| lever | as shipped (on) | changed to (off) | steps | on / off, wall | per pair | on / off, CPU | "
            "per pair | padded tokens on / off |",
            "|---|---|---|---:|---:|---|---:|---|---:|",
        ]
        for row in report["levers"]:
            cpu = row.get("cpu_ratio")
            lines.append(
                f"| {row['lever']} | {row['on']} | {row['off']} | {row['steps']} | {row['ratio']:.2f}x | "
                + ", ".join(f"{x:.2f}" for x in row["ratio_per_rep"])
                + f" | {_fmt(cpu, 'x', 2)} | "
                + ", ".join(f"{x:.2f}" for x in row.get("cpu_ratio_per_rep", []) if x)
                + f" | {row['on_padded_tokens']:,} / {row['off_padded_tokens']:,} |"
            )
    if report.get("tokenize_cache"):
        t = report["tokenize_cache"]
        lines += [
            "",
            "Tokenization (`prepare_splits`, BERT recipe's splits): "
            + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in t.items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


# Keys a benchmark sets itself, and why: its runs train in a temporary directory, only the report goes to --out.
RESERVED_OVERRIDES = dict.fromkeys(
    ("output_dir", "overwrite_output_dir", "resume_from_checkpoint"),
    "the benchmark trains in a temporary directory; --out says where its report goes",
)


def check_arguments(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    positive: list[str],
    reserved: Mapping[str, str] = RESERVED_OVERRIDES,
) -> None:
    """Mistakes in a benchmark's arguments, found before any run: `positive` options must be > 0,
    `--override` may not set a `reserved` key (each with why), and --out must be a directory this
    user can write."""
    for name in positive:
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    for override in args.override:
        key = override.split("=", 1)[0].strip()
        if key in reserved:
            p.error(f"--override {key}: {reserved[key]}")
    out = args.out
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file; give a directory for the report")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--out {out}: cannot create it ({e.strerror})")
    if not os.access(out, os.W_OK):
        p.error(f"--out {out}: not writable")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=[*RECIPES, "both"], default="bert", help="both: bert and vit")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    p.add_argument(
        "--reps", type=int, default=1, help="app/reference pairs, run alternately; medians reported"
    )
    p.add_argument("--warmup", type=int, default=3, help="optimizer steps left out of the timing")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument(
        "--precision",
        choices=["no", "bf16", "fp16"],
        default=None,
        help="mixed precision for both loops (default: the accelerate config's, else no)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="text: pad every batch of both loops to this many tokens (max_length and pad_to_multiple_of)",
    )
    p.add_argument("--gemm-size", type=int, default=2048)
    p.add_argument("--gemm-reps", type=int, default=5)
    p.add_argument("--levers", action="store_true", help="also measure each lever on/off")
    p.add_argument("--levers-only", nargs="*", default=None, help="run only these levers (none named: all)")
    p.add_argument("--lever-steps", type=int, default=30)
    p.add_argument("--lever-reps", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="include the torch.compile lever (slow to compile)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the whole bench")
    p.add_argument("--smoke", action="store_true", help="tiny models from config, a slice of the data")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra recipe override for both loops (repeatable)",
    )
    args = p.parse_args(argv)
    if args.seq_len is not None and args.seq_len <= 0:
        p.error(f"--seq-len must be a positive number of tokens, got {args.seq_len}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.steps is not None and not args.smoke and args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} leaves none of --steps {args.steps} to time; give more steps")
    if unknown := [name for name in args.levers_only or [] if name not in LEVERS]:
        p.error(f"--levers-only: no lever named {', '.join(unknown)}; the levers: {', '.join(LEVERS)}")
    args.levers = args.levers or args.levers_only is not None  # naming levers asks for them
    check_arguments(p, args, ["steps", "reps", "gemm_size", "gemm_reps", "lever_steps", "lever_reps", "threads"])
    if args.smoke:
        args.steps = args.steps or 4
        args.warmup = min(args.warmup, 1)
        args.gemm_size, args.gemm_reps = min(args.gemm_size, 256), min(args.gemm_reps, 2)
        args.lever_steps, args.lever_reps = min(args.lever_steps, 3), 1
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.precision:
        os.environ["ACCELERATE_MIXED_PRECISION"] = args.precision
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    load_start = os.getloadavg()
    probe = Accelerator()  # the device and process layout, as the runs will see them
    device, processes, is_main = probe.device, probe.num_processes, probe.is_main_process
    reset_accelerate()
    if processes > 1:
        # train() ends with accelerator.end_training(), which destroys the process group; the next
        # run in this process would build it again from the same store, and that can hang. One group
        # serves every run here, destroyed at the end.
        Accelerator.end_training = lambda self: [tracker.finish() for tracker in self.trackers] and None
    if device.type == "cpu":  # both loops with the threads the app takes (train() sets them too)
        threads = runtime.cpu_threads(args.threads, processes)
        torch.set_num_threads(threads)
        args.override = [f"cpu_threads={threads}", *args.override]
    peaks: list[dict] = []

    def peak() -> float:
        peaks.append(gemm_peak(PEAK_DTYPES[precision], args.gemm_size, args.gemm_reps, device))
        return peaks[-1]["flops_per_s"]

    recipes = ["bert", "vit"] if args.recipe == "both" else [args.recipe]
    for name in args.levers_only or []:  # a named lever that would be skipped: say so before any run
        if why := lever_skipped(LEVERS[name], recipes[0], args, device, processes):
            raise UserError(f"--levers-only {name}: {why}")
    report: dict[str, Any] = {
        "command": "python -m benchmarks.bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(), "precision": precision, "processes": processes,
        "import_seconds": None if args.smoke else import_seconds(), "load_avg_start": load_start, "recipes": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="finetune-bench-") as tmp:
        for recipe in recipes:
            report["recipes"][recipe] = bench_recipe(recipe, args, peak, Path(tmp), device)
        if args.levers:
            report["levers"] = bench_levers(recipes[0], args, Path(tmp), device, processes)
            if recipes[0] == "bert":
                report["tokenize_cache"] = tokenize_cache("bert", args)
    if processes > 1:
        torch.distributed.destroy_process_group()
    best = max(peaks, key=lambda p: p["flops_per_s"])
    report["peak"] = {**best, "all_flops_per_s": [p["flops_per_s"] for p in peaks]}
    report["load_avg_end"] = os.getloadavg()
    if is_main:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        table = markdown(report)
        (args.out / "bench.md").write_text(table)
        print(table)
    return report


if __name__ == "__main__":
    main()
