"""Fine-tune a text or image classifier: one loop, every topology through Accelerate.

    accelerate launch finetune/run.py                                   # MiniLM on rotten_tomatoes
    accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml
    accelerate launch finetune/run.py --config <recipe.yaml> learning_rate=3e-5 num_train_epochs=1
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml finetune/run.py
    accelerate launch --config_file accelerate_configs/model_parallel.yaml finetune/run.py \
        model_parallel=true devices=cuda:0,cpu pipeline_chunks=4

Processes, devices and mixed precision come from the accelerate config (or `accelerate launch`
flags) and are read back from the Accelerator; hyperparameters come from the recipe.

The math of a step: the loss of an optimizer step is the sum of the per-sample losses of every
REAL sample in its window (all micro-batches, all processes) divided by the number of those
samples. Accelerate divides by the accumulation steps and DDP averages over processes, so each
micro-batch's summed loss is scaled by (processes * accumulation / real samples in window). That
makes 1 process x batch 8, accumulation, and DDP the same gradient, also for the last, partial
window and with the duplicated samples Accelerate adds to even out the last batch (masked out).

Faults: SIGTERM/SIGINT finish the optimizer step, save a checkpoint and exit 143/130 (`StopOnSignal`);
a loss that stays NaN/inf for `max_nonfinite_loss_steps` steps, or weights that turn NaN at a save,
stop the run with exit status 3 and keep the last good checkpoint; `ddp_timeout` bounds every wait
for another process. Exit statuses are listed in finetune/errors.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
    set_seed,
)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_scheduler

from finetune import checkpoint as ckpt
from finetune.card import check_hub_access, describe_data, push_to_hub, write_model_card
from finetune.config import TrainConfig, load_config, save_config
from finetune.data import (
    Collator,
    EpochSampler,
    batches_per_process,
    load_splits,
    prepare_splits,
    real_sample_mask,
    window_sample_count,
)
from finetune.errors import EXIT_DIVERGED, TrainingStopped, UserError, exit_on_user_error
from finetune.models import build_model, check_max_length, load_preprocessor
from finetune.plots import plot_training_curves

RESULTS = "results.json"


# --- the runtime ---------------------------------------------------------------------------------


def make_accelerator(cfg: TrainConfig) -> Accelerator:
    """The Accelerator, from the user's accelerate config; real DDP on CPU when several processes.

    `accelerate launch --multi_gpu --num_processes 2` on a machine without a GPU starts two
    processes that would each train alone (DistributedType.NO). Setting ACCELERATE_USE_CPU before
    the Accelerator is built makes them one DDP group over gloo.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.model_parallel and world_size > 1:
        raise UserError(
            f"model parallelism runs in one process, but {world_size} were launched; use "
            "accelerate_configs/model_parallel.yaml, or the DDP/FSDP configs without model_parallel"
        )
    if world_size > 1 and not torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step, below
        log_with=cfg.report_to or None,
        # Host-to-device copies of pinned batches overlap with compute (a no-op on CPU).
        dataloader_config=DataLoaderConfiguration(non_blocking=cfg.dataloader_pin_memory),
        project_dir=cfg.output_dir,
        # A process that waits longer than this in a collective fails instead of hanging forever.
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.ddp_timeout)),
            DistributedDataParallelKwargs(
                static_graph=cfg.ddp_static_graph, gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view
            ),
        ],
    )
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and (
        accelerator.distributed_type != DistributedType.FSDP
    ):
        raise UserError(
            f"the accelerate config asks for FSDP but the processes run {accelerator.distributed_type} "
            "(Accelerate runs FSDP on GPUs only); use a DDP config (cpu_ddp.yaml on a CPU) or run on GPUs"
        )
    if world_size > 1 and accelerator.num_processes != world_size:
        raise UserError(
            f"{world_size} processes were launched but they did not form one group "
            f"({accelerator.distributed_type}); check the accelerate config"
        )
    if accelerator.mixed_precision == "fp16" and accelerator.device.type == "cpu":
        # Accelerate has no fp16 autocast on a CPU: it would train in fp32 and report fp16.
        raise UserError(
            "mixed precision fp16 needs a GPU; on a CPU use bf16 (accelerate_configs/cpu_bf16.yaml) or no"
        )
    if accelerator.device.type == "cpu":
        torch.set_num_threads(cpu_threads(cfg.cpu_threads, accelerator.num_processes))
    return accelerator


def configure_fsdp(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """FSDP's units: each transformer layer (and the input embeddings, which Accelerate shards alone).

    With `fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` and no class list, Accelerate wraps every class
    in the model's `_no_split_modules` — for BERT and ViT that includes the embeddings block, and it
    then shards the input embeddings inside that block a second time, which `fully_shard` refuses.
    So the classes that hold the input embeddings are left out; a class list in the accelerate config
    (`fsdp_transformer_layer_cls_to_wrap`) is used as written.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = accelerator.state.fsdp_plugin
    if plugin is None or plugin.transformer_cls_names_to_wrap is not None:
        return
    if getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy) is not transformer_auto_wrap_policy:
        return
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    embeddings = model.get_input_embeddings()
    plugin.transformer_cls_names_to_wrap = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if type(m).__name__ in no_split and not any(x is embeddings for x in m.modules())
        }
    )


def data_workers(cfg: TrainConfig, accelerator: Accelerator) -> int:
    """`dataloader_num_workers`, or by default 2 for text on a GPU and 0 otherwise (see TrainConfig)."""
    if cfg.dataloader_num_workers is not None:
        return cfg.dataloader_num_workers
    return 2 if accelerator.device.type == "cuda" and cfg.task == "text-classification" else 0


def pin_memory(cfg: TrainConfig, accelerator: Accelerator) -> bool:
    """Page-locked batches only where they are copied to a GPU (make_accelerator makes those copies
    non-blocking); on a CPU pinning is a wasted copy."""
    return cfg.dataloader_pin_memory and accelerator.device.type == "cuda"


def cpu_threads(requested: int | None, num_processes: int) -> int:
    """Torch threads for a process training on CPU: `requested`, else this process's share of the cores.

    `accelerate launch` on a machine without a GPU sets OMP_NUM_THREADS=1 unless told
    --num_cpu_threads_per_process: the default recipe then ran on one of the two cores of the dev
    machine (86.9 s vs 53.4 s with both). So unless `cpu_threads` says otherwise, a process takes
    the cores it may use divided by the processes on its machine, whatever OMP_NUM_THREADS says.
    """
    if requested is not None:
        return requested
    local = int(os.environ.get("LOCAL_WORLD_SIZE", num_processes))  # torchrun sets it; else all local
    return max(1, available_cores() // max(local, 1))


def available_cores() -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (containers)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2, or no quota file
        pass
    return cores


def check_output_dir(cfg: TrainConfig) -> None:
    """Refuse to write over a run unless told to overwrite it or to resume it."""
    out = Path(cfg.output_dir)
    if cfg.resume_from_checkpoint or not out.exists():
        return
    finished = (out / RESULTS).exists()
    started = bool(ckpt.list_checkpoints(out)) or (out / "metrics.jsonl").exists()
    if (finished or started) and not cfg.overwrite_output_dir:
        state = "a finished run" if finished else "a started run"
        raise UserError(
            f"output_dir {out} already holds {state}; pass overwrite_output_dir=true to replace "
            "it, resume_from_checkpoint=latest to continue it, or choose another output_dir"
        )


class StopOnSignal:
    """SIGTERM or SIGINT during training: finish the optimizer step, save a checkpoint, exit 143/130.

    The handler only records the signal; the loop asks `requested()` after every optimizer step. All
    processes must stop at the same step (saving is collective), but they may receive the signal at
    different steps — torchrun forwards it to every worker, a scheduler signals each task — so under
    DDP the flags are combined every step by an all-reduce (MAX) of one CPU integer over a gloo group
    of its own: a host-side exchange that never waits on a GPU stream, also in NCCL jobs. Measured
    between 2 CPU processes on the 2-core dev machine: 0.4 ms a step, against ~70 ms for a step of
    the tests' tiny BERT (0.6%) and seconds for MiniLM. (Checking only at logging steps would save
    that but stop up to `logging_steps` steps late, past the grace period torchrun or a scheduler
    gives before SIGKILL.) A second signal ends the process at once, the default way — unless it
    comes within `SAME_REQUEST_S` of the first: Ctrl-C reaches the whole process group, and a
    launcher that forwards it (torchrun, finetune-launch) delivers that one request a second time.
    """

    SAME_REQUEST_S = 2.0

    def __init__(self, num_processes: int, timeout_s: int):
        self.signum, self.previous, self.first_at = 0, {}, 0.0
        self.group = None
        if num_processes > 1:  # every process creates the group, in the same order
            self.group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():  # Python delivers signals there only
            self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.group is not None:  # local to this process: no collective, so safe on any exit path
            torch.distributed.destroy_process_group(self.group)
            self.group = None

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if not self.signum:
            self.signum, self.first_at = signum, now
        elif now - self.first_at > self.SAME_REQUEST_S:  # a second request: no more waiting
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def requested(self) -> int:
        """The signal that every process agrees to stop on now, or 0."""
        if self.group is None:
            return self.signum
        flag = torch.tensor([self.signum])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return int(flag)


def longest_first(lengths: list[int]) -> list[int]:
    """Sample indices by decreasing length (ties in dataset order): a sampler for evaluation."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def all_finite(model, accelerator: Accelerator) -> bool:
    """Whether every parameter, on every process (FSDP shards differ), is finite. A host sync: saves only."""
    # FSDP: each process checks its own shard (a DTensor's local part).
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    flags = torch.stack([p.detach().isfinite().all().to(accelerator.device) for p in local])
    return bool(accelerator.gather(flags.all().float().reshape(1)).min().item())


def diverged(why: str, step: int, last_checkpoint: Path | None) -> TrainingStopped:
    kept = f"the last good checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was saved"
    return TrainingStopped(
        f"{why} (optimizer step {step}); {kept}; lower learning_rate or check the data, "
        "then resume from that checkpoint or start again",
        EXIT_DIVERGED,
    )


def injected_fault() -> Callable[[int, int], None] | None:
    """TEST HOOK, used by tests/test_reliability.py only; inert unless both variables are set.

    FINETUNE_TEST_FAIL_RANK=r FINETUNE_TEST_FAIL_STEP=s make process r fail right after optimizer step
    s, as FINETUNE_TEST_FAIL_MODE says: `raise` an exception (default), `exit` (os._exit(1), a crash)
    or `hang` — to show that the other processes do not wait forever.
    """
    rank, at = os.environ.get("FINETUNE_TEST_FAIL_RANK"), os.environ.get("FINETUNE_TEST_FAIL_STEP")
    if rank is None or at is None:
        return None
    mode = os.environ.get("FINETUNE_TEST_FAIL_MODE", "raise")

    def fail(step: int, process_index: int) -> None:
        if process_index != int(rank) or step != int(at):
            return
        if mode == "exit":
            os._exit(1)
        if mode == "hang":
            while True:
                time.sleep(3600)
        raise RuntimeError(f"injected failure on process {rank} after step {step} (FINETUNE_TEST_FAIL_*)")

    return fail


def clear_output_dir(out: Path) -> None:
    # out.name: Accelerate's tracker logs (tensorboard) go to <output_dir>/<run name>.
    for name in (
        ckpt.CHECKPOINTS,
        "model",
        "metrics.jsonl",
        RESULTS,
        "config.yaml",
        "training_curves.png",
        out.name,
    ):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def forward(model, batch: dict[str, torch.Tensor], chunks: int = 1) -> torch.Tensor:
    """Logits of a batch; with `chunks` > 1, GPipe-style micro-batches through model-parallel stages."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if chunks > 1:
        from finetune.parallel import pipelined_forward

        return pipelined_forward(model, inputs, chunks)
    return model(**inputs).logits


@torch.no_grad()
def evaluate_model(model, loader, accelerator: Accelerator, label_names: list[str], chunks: int = 1) -> dict:
    """Accuracy, per-class metrics and loss over exactly the dataset: `gather_for_metrics` drops the
    samples Accelerate duplicated to even out the last batch, and the count is asserted."""
    from finetune.metrics import classification_report

    model.eval()
    preds, refs, losses = [], [], []
    for batch in loader:
        logits = forward(model, batch, chunks)
        labels = batch["labels"].to(logits.device)
        loss = F.cross_entropy(logits.float(), labels, reduction="none")
        p, r, lo = accelerator.gather_for_metrics((logits.argmax(-1), labels, loss))
        preds.append(p.cpu())
        refs.append(r.cpu())
        losses.append(lo.float().cpu())
    model.train()
    preds_t, refs_t = torch.cat(preds), torch.cat(refs)
    expected = len(loader.dataset)
    if len(refs_t) != expected:
        raise RuntimeError(f"evaluated {len(refs_t)} samples, the dataset has {expected}")
    report = classification_report(preds_t.tolist(), refs_t.tolist(), label_names)
    report["loss"] = torch.cat(losses).mean().item()
    return report


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


# --- the loop -------------------------------------------------------------------------------------


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Build, prepare, loop over epochs and batches, evaluate, save. Returns the final metrics."""
    accelerator = make_accelerator(cfg)
    check_output_dir(cfg)
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    P, B, GA = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps

    # Data and model. Tokenization runs on the main process first; the others read its cache.
    with accelerator.main_process_first():
        raw, label_names = load_splits(cfg)
    tokenizer = load_preprocessor(cfg) if cfg.task == "text-classification" else None
    model = build_model(cfg, label_names, vocab_size=len(tokenizer) if tokenizer is not None else None)
    check_max_length(cfg, model)
    if cfg.freeze_embeddings:
        model.get_input_embeddings().requires_grad_(False)
    if cfg.gradient_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise UserError(f"{type(model).__name__} does not support gradient_checkpointing")
        # Non-reentrant: works under DDP and when the embeddings are frozen (inputs without grad).
        # transformers 5 renamed gradient_checkpointing_enable (deprecated there) to activation_checkpointing_enable.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    preprocessor = tokenizer if tokenizer is not None else load_preprocessor(cfg, model.config)
    with accelerator.main_process_first():
        splits = prepare_splits(cfg, raw, preprocessor, model.config)

    plan = None
    if cfg.model_parallel:
        from finetune.parallel import apply_model_parallel, parse_devices, plan_model_parallel

        devices = parse_devices(cfg.devices)
        seq = cfg.max_length if cfg.task == "text-classification" else None  # ViT: patches + 1
        # GPipe keeps every chunk's activations until backward: plan for the whole batch.
        plan = plan_model_parallel(
            model,
            devices,
            micro_batch_size=B,
            seq_len=seq,
            max_memory=cfg.max_memory,
            mixed_precision=accelerator.mixed_precision,
        )
        accelerator.print(plan.format_table())
        if cfg.plan_only:
            return {"plan": plan.format_table()}
        if len(plan.stages) == 1:
            accelerator.print("warning: model parallelism with one device: training unsplit")
        else:
            model = apply_model_parallel(model, plan)
    elif cfg.plan_only:
        raise UserError("plan_only needs model_parallel=true")

    train_set = splits["train"]
    N = len(train_set)
    # A list: a datasets Column reads one row per index.
    lengths = (
        list(train_set["length"]) if cfg.group_by_length and "length" in train_set.column_names else None
    )
    sampler = EpochSampler(N, cfg.seed, group_size=P * B * GA, lengths=lengths, pad_to=P * B if P > 1 else 1)
    collate = Collator(tokenizer, cfg.pad_to_multiple_of)
    pin = pin_memory(cfg, accelerator)
    train_loader = DataLoader(
        train_set,
        batch_size=B,
        sampler=sampler,
        collate_fn=collate,
        num_workers=data_workers(cfg, accelerator),
        pin_memory=pin,
        generator=torch.Generator().manual_seed(cfg.seed),
    )  # keeps the global RNG untouched
    # Evaluation reads text longest first: each batch is padded to nearly its own length (the
    # metrics do not depend on the order). The default recipe's 1,566 evaluation sentences in
    # batches of 128: 1.32 padded tokens per real one instead of 2.21.
    eval_loaders = {
        split: DataLoader(
            splits[split],
            batch_size=cfg.per_device_eval_batch_size,
            sampler=longest_first(list(splits[split]["length"]))
            if "length" in splits[split].column_names
            else None,
            collate_fn=collate,
            num_workers=data_workers(cfg, accelerator),
            pin_memory=pin,
        )
        for split in ("validation", "test")
        if split in splits
    }

    # Optimizer steps are the unit: the schedule is planned in them, for any P and accumulation.
    nb = batches_per_process(N, B, P)
    if GA > nb:
        raise UserError(
            f"gradient_accumulation_steps={GA} exceeds the {nb} batches per process in an epoch; "
            "lower gradient_accumulation_steps or per_device_train_batch_size"
        )
    steps_per_epoch = math.ceil(nb / GA)
    total_steps = cfg.max_steps or steps_per_epoch * cfg.num_train_epochs
    resume_path, manifest = None, None
    if cfg.resume_from_checkpoint:
        resume_path = ckpt.resolve_checkpoint(cfg.resume_from_checkpoint, out)
        manifest = ckpt.read_manifest(resume_path)
        if check_resume_compatible(manifest, cfg, P, label_names) and cfg.max_steps is None:
            # Another topology: the steps taken, plus the rest of the data in this run's steps.
            rest = math.ceil(batches_per_process(N - manifest["samples_in_epoch"], B, P) / GA)
            total_steps = (
                manifest["step"] + rest + (cfg.num_train_epochs - manifest["epoch"] - 1) * steps_per_epoch
            )
    num_epochs = (
        cfg.num_train_epochs if cfg.max_steps is None else math.ceil(total_steps / steps_per_epoch) + 1
    )
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * total_steps)
    if cfg.push_to_hub_model_id:
        check_hub_access(cfg.push_to_hub_model_id)  # fail now, offline, not after training

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if p.ndim >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in trainable if not (p.ndim >= 2 and "LayerNorm" not in n)]
    # The fused kernel: one pass over all parameters instead of a Python loop over ~100 tensors
    # (0.02 s vs 1.6 s a step for MiniLM on 2 CPU cores). CPU and CUDA have it.
    fused = accelerator.device.type in ("cpu", "cuda") or None
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        fused=fused,
    )
    scheduler = get_scheduler(
        cfg.lr_scheduler_type if cfg.lr_scheduler_type != "constant" else "constant_with_warmup",
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total_steps,
    )
    if cfg.dry_run:
        return dry_run_plan(cfg, accelerator, N, nb, steps_per_epoch, total_steps, warmup, scheduler)
    if accelerator.distributed_type == DistributedType.FSDP:
        configure_fsdp(accelerator, model)
    model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
    eval_loaders = {k: accelerator.prepare(v) for k, v in eval_loaders.items()}
    assert len(train_loader) == nb, (len(train_loader), nb)

    # Resume: restore weights, optimizer, scheduler and RNG; the position comes from the manifest.
    step, start_epoch, start_sample = 0, 0, 0
    best: dict[str, Any] = {}
    last_checkpoint: Path | None = None
    log = MetricsLog(accelerator, out / "metrics.jsonl")
    if resume_path is not None and manifest is not None:
        path = resume_path
        ckpt.load_checkpoint(accelerator, path, exact=not cfg.resume_allow_topology_change)
        step, start_epoch, start_sample = manifest["step"], manifest["epoch"], manifest["samples_in_epoch"]
        best, last_checkpoint = manifest.get("best", {}), path
        log.drop_after(step)
        accelerator.print(f"resumed from {path} at step {step} (epoch {start_epoch}, sample {start_sample})")
    elif accelerator.is_main_process and cfg.overwrite_output_dir and out.exists():
        clear_output_dir(out)

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    accelerator.wait_for_everyone()
    if cfg.report_to:
        accelerator.init_trackers(
            out.name,
            config={k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))},
        )
    accelerator.print(
        f"{cfg.task}: {type(accelerator.unwrap_model(model)).__name__}, train {N} / validation "
        f"{len(splits['validation'])} samples, {P} process(es) on {accelerator.device}"
        f"{f' x {torch.get_num_threads()} threads' if accelerator.device.type == 'cpu' else ''} "
        f"({accelerator.distributed_type}), precision {accelerator.mixed_precision}, global batch "
        f"{P * B * GA} ({P} x {B} x {GA} accumulation), {total_steps} optimizer steps, "
        f"{sum(p.numel() for _, p in trainable):,} of "
        f"{sum(p.numel() for p in accelerator.unwrap_model(model).parameters()):,} weights trained"
    )

    def save(epoch: int, samples_in_epoch: int, metrics: dict | None = None) -> Path:
        nonlocal best, last_checkpoint
        if last_checkpoint is not None and last_checkpoint.name == f"{ckpt.PREFIX}{step:08d}":
            return last_checkpoint  # saved at this step already
        if not all_finite(model, accelerator):  # NaN weights never recover: keep the last good checkpoint
            raise diverged("the weights became NaN or infinite", step, last_checkpoint)
        value = (metrics or {}).get(cfg.metric_for_best_model)
        if isinstance(value, (int, float)) and (
            not best or (value > best["value"] if cfg.greater_is_better else value < best["value"])
        ):
            best = {
                "metric": cfg.metric_for_best_model,
                "value": value,
                "step": step,
                "path": str(out / ckpt.CHECKPOINTS / f"{ckpt.PREFIX}{step:08d}"),
            }
        manifest = {
            "step": step,
            "epoch": epoch,
            "samples_in_epoch": samples_in_epoch,
            "seed": cfg.seed,
            "world_size": P,
            "gradient_accumulation_steps": GA,
            "per_device_train_batch_size": B,
            "mixed_precision": accelerator.mixed_precision,
            "task": cfg.task,
            "label_names": label_names,
            "metrics": metrics or {},
            "best": best,
            "versions": ckpt.package_versions(),
            "config": cfg.to_dict(),
        }
        path = last_checkpoint = ckpt.save_checkpoint(accelerator, out, step, manifest)
        if accelerator.is_main_process:
            ckpt.prune_checkpoints(
                out, cfg.save_total_limit, Path(best["path"]) if best.get("path") else None
            )
        accelerator.print(f"saved checkpoint {path}")
        return path

    def run_eval(epoch: int) -> dict:
        metrics = evaluate_model(
            model, eval_loaders["validation"], accelerator, label_names, cfg.pipeline_chunks
        )
        log.log(
            {"epoch": epoch, **{f"eval_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}},
            step,
        )
        return metrics

    running = torch.zeros(2, device=accelerator.device)  # (sum of per-sample losses, samples)
    # NaN/inf losses are counted on the device, without a host sync, and read at logging steps:
    # (optimizer steps in a row with a non-finite loss, the longest such run since the last log).
    nonfinite = torch.zeros(2, device=accelerator.device)
    window_nonfinite = torch.zeros((), dtype=torch.bool, device=accelerator.device)
    fault = injected_fault()  # None unless a test asks for one
    scaler_skipped = ScalerSkips(accelerator.scaler)
    last_log_time, last_log_samples = time.perf_counter(), 0
    eval_metrics: dict = {}
    early_stop, stale = EarlyStop(cfg.early_stopping_patience, cfg.greater_is_better), False
    model.train()
    progress = tqdm(
        total=total_steps,
        initial=step,
        disable=not accelerator.is_local_main_process,
        desc="training",
        unit="step",
    )
    with StopOnSignal(P, cfg.ddp_timeout) as stop, progress:  # the bar ends its line on any exit
        for epoch in range(start_epoch, num_epochs):
            start = start_sample if epoch == start_epoch else 0
            sampler.reset(epoch, start)
            Ne = N - start  # samples in this (possibly resumed) epoch's stream
            nbe = batches_per_process(Ne, B, P)
            for k, batch in enumerate(train_loader):
                with accelerator.accumulate(model):
                    logits = forward(model, batch, cfg.pipeline_chunks)
                    labels = batch["labels"].to(logits.device)
                    real = real_sample_mask(
                        Ne, k, B, P, accelerator.process_index, len(labels), logits.device
                    )
                    window_real = window_sample_count(Ne, k // GA, GA, nbe, B, P)
                    per_sample = F.cross_entropy(logits.float(), labels, reduction="none")
                    loss_sum = (per_sample * real).sum()
                    accelerator.backward(loss_sum * (P * GA / window_real))
                    running += torch.stack([loss_sum.detach().float(), real.sum().float()]).to(running.device)
                    window_nonfinite |= ~torch.isfinite(loss_sum.detach()).to(window_nonfinite.device)
                    if accelerator.sync_gradients and cfg.max_grad_norm:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                if not accelerator.sync_gradients:
                    continue

                # One optimizer step is done (or skipped by fp16's scaler: then the schedule waits).
                if not scaler_skipped() and not accelerator.optimizer_step_was_skipped:
                    scheduler.step()
                step += 1
                samples_in_epoch = min(start + (k + 1) * P * B, N)
                progress.update(1)
                nonfinite[0] = (nonfinite[0] + 1) * window_nonfinite
                nonfinite[1] = torch.maximum(nonfinite[1], nonfinite[0])
                window_nonfinite.zero_()
                if fault:
                    fault(step, accelerator.process_index)
                if step % cfg.logging_steps == 0 or step == total_steps:
                    # The only sync point per log: (P, 3) = every process's loss sum, samples, NaN run.
                    stats = accelerator.gather(torch.cat([running, nonfinite[1:]]).reshape(1, 3))
                    now = time.perf_counter()
                    samples_seen_now = samples_in_epoch + epoch * N
                    rate = (samples_seen_now - last_log_samples) / max(now - last_log_time, 1e-9)
                    last_log_time, last_log_samples = now, samples_seen_now
                    loss = (stats[:, 0].sum() / stats[:, 1].sum().clamp(min=1)).item()
                    lr = scheduler.get_last_lr()[0]
                    log.log(
                        {"epoch": epoch, "loss": loss, "learning_rate": lr, "samples_per_second": rate}, step
                    )
                    progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
                    running.zero_()
                    if stats[:, 2].max().item() >= cfg.max_nonfinite_loss_steps:
                        raise diverged(
                            f"the loss was NaN or infinite for {cfg.max_nonfinite_loss_steps} "
                            "optimizer steps in a row",
                            step,
                            last_checkpoint,
                        )
                    nonfinite[1] = 0
                end_of_epoch = k == nbe - 1
                if (cfg.eval_steps and step % cfg.eval_steps == 0) or end_of_epoch or step == total_steps:
                    eval_metrics = run_eval(epoch)
                    stale = early_stop.update(eval_metrics.get(cfg.metric_for_best_model))
                # A checkpoint at the end of an epoch points at the start of the next one.
                position = (epoch + 1, 0) if end_of_epoch else (epoch, samples_in_epoch)
                if (cfg.save_steps and step % cfg.save_steps == 0) or (
                    cfg.save_at_epoch_end and end_of_epoch
                ):
                    save(*position, eval_metrics)
                signum = stop.requested()  # every process gets the same answer
                if signum:
                    path = save(*position, eval_metrics)
                    raise TrainingStopped(
                        f"received {signal.Signals(signum).name} during training; saved checkpoint {path} "
                        f"(optimizer step {step}); continue with resume_from_checkpoint=latest",
                        128 + signum,
                    )
                if step >= total_steps or stale:
                    break
            if step >= total_steps or stale:
                break
    if stale:
        accelerator.print(
            f"early stop at step {step}: {cfg.metric_for_best_model} did not improve for "
            f"{cfg.early_stopping_patience} evaluations"
        )

    # Final evaluation and export.
    if not all_finite(model, accelerator):
        raise diverged("the weights became NaN or infinite", step, last_checkpoint)
    results: dict[str, Any] = {"step": step, "validation": eval_metrics or run_eval(num_epochs - 1)}
    if "test" in eval_loaders:
        results["test"] = evaluate_model(
            model, eval_loaders["test"], accelerator, label_names, cfg.pipeline_chunks
        )
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # every process: gathers shards under FSDP
    if accelerator.is_main_process:
        export = out / "model"
        unwrapped = accelerator.unwrap_model(model)
        # Model parallel: transformers reads "cpu" in hf_device_map as offloading and warns at save;
        # the state dict is complete here, and the export is an ordinary one-device model.
        device_map = unwrapped.__dict__.pop("hf_device_map", None)
        try:
            unwrapped.save_pretrained(export, state_dict=state_dict, safe_serialization=True)
        finally:
            if device_map is not None:
                unwrapped.hf_device_map = device_map
        preprocessor.save_pretrained(export)
        results.update(
            {
                "model_dir": str(export),
                "label_names": label_names,
                "best": best,
                "versions": ckpt.package_versions(),
            }
        )
        (out / RESULTS).write_text(json.dumps(results, indent=2))
        plot_training_curves(out / "metrics.jsonl", out / "training_curves.png")
        write_model_card(
            export,
            config=cfg.to_dict(),
            label_names=label_names,
            results=results,
            base_model=cfg.model_name_or_path if cfg.model_config is None else None,
            data_description=describe_data(cfg.to_dict()),
            num_processes=P,
            mixed_precision=accelerator.mixed_precision,
            repo_id=cfg.push_to_hub_model_id,
        )
        if cfg.push_to_hub_model_id:
            accelerator.print(f"pushed to {push_to_hub(export, cfg.push_to_hub_model_id)}")
    accelerator.wait_for_everyone()
    final = results.get("test", results["validation"])
    split = "test" if "test" in results else "validation"
    accelerator.print(f"model saved to {out / 'model'}")
    accelerator.print(f"{split} accuracy {final['accuracy']:.4f} on {final['num_samples']} samples")
    accelerator.end_training()
    return results


class ScalerSkips:
    """fp16: whether the gradient scaler skipped the last optimizer step (inf/NaN gradients).

    Accelerate's `optimizer_step_was_skipped` notices a skip by the optimizer's `step()` not being
    called, but the scaler calls a fused optimizer's `step()` every time (the fused kernel skips
    itself on inf), so with `AdamW(fused=True)` it always reads False. The scale only goes down on a
    skipped step, so a lower scale than after the last step is a skip. One host sync per optimizer
    step, only with a scaler (fp16).
    """

    def __init__(self, scaler):
        self.scaler = scaler
        self.scale = scaler.get_scale() if scaler is not None else None

    def __call__(self) -> bool:
        if self.scaler is None:
            return False
        before, self.scale = self.scale, self.scaler.get_scale()
        return self.scale < before


class EarlyStop:
    """Counts evaluations without improvement of the chosen metric; `update` says when to stop."""

    def __init__(self, patience: int | None, greater_is_better: bool):
        self.patience, self.sign = patience, 1 if greater_is_better else -1
        self.best: float | None = None
        self.stale = 0

    def update(self, value: float | None) -> bool:
        if self.patience is None or value is None:
            return False
        if self.best is None or self.sign * (value - self.best) > 0:
            self.best, self.stale = value, 0
        else:
            self.stale += 1
        return self.stale >= self.patience


def dry_run_plan(
    cfg: TrainConfig,
    accelerator: Accelerator,
    num_samples: int,
    batches: int,
    steps_per_epoch: int,
    total_steps: int,
    warmup: int,
    scheduler,
) -> dict[str, Any]:
    """What a run would do, without doing it: printed on the main process and returned."""
    base = cfg.learning_rate
    lam = scheduler.lr_lambdas[0]
    P, B, GA = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    plan = {
        "devices": str(accelerator.device), "processes": P, "distributed_type": str(accelerator.distributed_type),
        **({"cpu_threads_per_process": torch.get_num_threads()} if accelerator.device.type == "cpu" else {}),
        "mixed_precision": accelerator.mixed_precision, "train_samples": num_samples,
        "per_device_train_batch_size": B, "gradient_accumulation_steps": GA, "global_batch_size": P * B * GA,
        "batches_per_process_per_epoch": batches, "optimizer_steps_per_epoch": steps_per_epoch,
        "total_optimizer_steps": total_steps, "warmup_steps": warmup,
        "first_learning_rate": base * lam(0), "last_learning_rate": base * lam(total_steps - 1),
    }  # fmt: skip
    width = max(map(len, plan))
    accelerator.print("\n".join(f"{k:<{width}}  {v}" for k, v in plan.items()))
    return plan


def check_resume_compatible(
    manifest: dict[str, Any], cfg: TrainConfig, num_processes: int, label_names: list[str] | None = None
) -> bool:
    """A resumed run must split the data the way the saved one did, or the order and LR change;
    returns whether the topology changed (allowed only with resume_allow_topology_change)."""
    saved = (
        manifest["world_size"],
        manifest["gradient_accumulation_steps"],
        manifest["per_device_train_batch_size"],
    )
    now = (num_processes, cfg.gradient_accumulation_steps, cfg.per_device_train_batch_size)
    if saved != now and not cfg.resume_allow_topology_change:
        raise UserError(
            f"the checkpoint was saved with processes x batch x accumulation = {saved[0]} x {saved[2]} x "
            f"{saved[1]}, this run has {now[0]} x {now[2]} x {now[1]}; resume with the same settings, "
            "or pass resume_allow_topology_change=true to continue without repeating consumed samples"
        )
    if manifest.get("task") != cfg.task or manifest.get("label_names") is None:
        raise UserError(
            f"the checkpoint is from a {manifest.get('task')} run, this one is {cfg.task}; "
            "resume it with its own recipe, or start this run without resume_from_checkpoint"
        )
    if label_names is not None and manifest["label_names"] != label_names:
        raise UserError(
            f"the checkpoint was trained on the labels {manifest['label_names']}, this run's data "
            f"has {label_names}; resume it with its own data, or set label_names to match"
        )
    frozen = bool(manifest.get("config", {}).get("freeze_embeddings", False))
    if frozen != cfg.freeze_embeddings:  # the optimizer state holds other parameters
        raise UserError(
            f"the checkpoint was trained with freeze_embeddings={str(frozen).lower()}; resume it with "
            "the same setting"
        )
    return saved != now


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> TrainConfig:
    config_path = None
    overrides: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        if arg == "--config":
            if not args:
                raise UserError("--config needs a path to a recipe YAML")
            config_path = args.pop(0)
        elif arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        elif arg == "--plan-only":
            overrides.append("plan_only=true")
        elif arg == "--dry-run":
            overrides.append("dry_run=true")
        elif arg.startswith("--"):
            raise UserError(
                f"unknown option {arg}; options are --config PATH, --dry-run and --plan-only; settings are key=value"
            )
        else:
            overrides.append(arg)
    return load_config(config_path, overrides)


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


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    return train(cfg)


def cli() -> None:
    stop_with_launcher()
    main()


if __name__ == "__main__":
    stop_with_launcher()
    main()
