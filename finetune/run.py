"""Fine-tune a text or image classifier: one loop, every topology through Accelerate.

    accelerate launch finetune/run.py                                   # MiniLM on rotten_tomatoes
    accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml
    accelerate launch finetune/run.py --config <recipe.yaml> learning_rate=3e-5 num_train_epochs=1
    accelerate launch finetune/run.py --dry-run                         # the plan, without training
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml finetune/run.py
    accelerate launch --config_file accelerate_configs/model_parallel.yaml finetune/run.py \\
        model_parallel=true devices=cuda:0,cpu pipeline_chunks=4 [--plan-only]
    accelerate launch --config_file accelerate_configs/ddp_model_parallel.yaml finetune/run.py \\
        model_parallel=true                                             # DDP x layer split

Processes, devices and mixed precision come from the accelerate config (or `accelerate launch`
flags) and are read back from the Accelerator (finetune/runtime.py); hyperparameters come from the
recipe (finetune/config.py). `train()` reads build -> loop -> finish.

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

import os
import signal

# Before torch loads OpenMP, which reads this once: its threads sleep when they wait instead of spinning.
# On a CPU shared with another job, a spinning thread holds the core that the thread it waits for
# needs: beside a 2-thread job the default command took 7x its quiet time, 2x with sleeping threads,
# which cost nothing measurable on a quiet machine (README, "CPU threads"). A user's own policy is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __name__ == "__main__":  # Ctrl-C or SIGTERM during the imports (seconds): one line, not a traceback

    def _stopped_while_starting(signum, frame):
        if os.environ.get("RANK", "0") == "0":
            os.write(2, b"stopped: interrupted while starting; nothing was written\n")
        os._exit(128 + signum)

    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _stopped_while_starting)

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_scheduler

from finetune import checkpoint as ckpt
from finetune.card import check_hub_access
from finetune.config import TrainConfig, load_config, resumed_run_recipe, save_config, settings_help
from finetune.data import (
    Collator,
    EpochSampler,
    batches_per_process,
    image_sizes,
    load_splits,
    prepare_splits,
    real_sample_mask,
    resize_notice,
    window_sample_count,
)
from finetune.errors import ArgumentParser, TrainingStopped, UserError, exit_on_user_error, first_line
from finetune.evaluation import evaluate_model, forward, longest_first
from finetune.export import RESULTS, check_files_in_the_way, export_run, set_aside_previous_run
from finetune.lora import apply_lora, is_lora
from finetune.models import build_model, check_max_length, check_tokenizer, freeze_layers, load_preprocessor
from finetune.problems import SINGLE, headline, per_sample_loss, problem_type_of, summary_line
from finetune.runtime import (
    ScalerSkips,
    StopOnSignal,
    agreed,
    check_shared_output_dir,
    configure_fsdp,
    data_workers,
    describe_parameters,
    injected_fault,
    local_processes,
    main_process_first,
    make_accelerator,
    pin_memory,
    quiet_libraries,
    stop_outside_the_loop,
    stop_with_launcher,
)

# --- the loop -------------------------------------------------------------------------------------


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Build, prepare, loop over epochs and batches, evaluate, export. Returns the final metrics."""
    # Build: the Accelerator, data, model, loaders, the step plan, optimizer and schedule.
    accelerator = make_accelerator(cfg)
    check_output_dir(cfg)
    check_shared_output_dir(accelerator, cfg.output_dir)  # multi-node: before anything reads or writes it
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    model, preprocessor, splits, label_names = build_model_and_data(cfg, accelerator)
    model = split_model(cfg, accelerator, model)
    train_loader, sampler, eval_loaders = make_loaders(cfg, accelerator, splits, preprocessor)
    resume_path, manifest = resume_target(cfg, out)
    plan = plan_steps(cfg, accelerator.num_processes, len(splits["train"]), manifest, label_names)
    optimizer, trainable = make_optimizer(cfg, model, accelerator)
    scheduler = make_scheduler(cfg, optimizer, plan)
    if cfg.push_to_hub_model_id:
        check_hub_access(cfg.push_to_hub_model_id)  # fail now, offline, not after training
    if accelerator.distributed_type == DistributedType.FSDP:
        configure_fsdp(accelerator, model)
    model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
    eval_loaders = {k: accelerator.prepare(v) for k, v in eval_loaders.items()}
    assert len(train_loader) == plan.batches, (len(train_loader), plan.batches)

    # Resume (weights, optimizer, scheduler, RNG; the position from the manifest) or start afresh.
    log = MetricsLog(accelerator, out / "metrics.jsonl")
    checkpointer = ckpt.Checkpointer(accelerator, cfg, out, label_names)
    step, start_epoch, start_sample = 0, 0, 0
    if resume_path is not None:
        ckpt.load_checkpoint(accelerator, resume_path, exact=not cfg.resume_allow_topology_change)
        ckpt.apply_learning_rate(optimizer, scheduler, manifest, cfg.learning_rate, accelerator.print)
        step, start_epoch, start_sample = manifest["step"], manifest["epoch"], manifest["samples_in_epoch"]
        checkpointer.best, checkpointer.last = manifest.get("best", {}), resume_path
        log.drop_after(step)
        accelerator.print(
            f"resumed from {resume_path} at step {step} (epoch {start_epoch}, sample {start_sample})"
        )
    start_run(cfg, accelerator, out, model, splits, plan, trainable)

    def run_eval(epoch: int) -> dict:
        metrics = evaluate_split(cfg, model, eval_loaders["validation"], accelerator, label_names)
        log.log(
            {"epoch": epoch, **{f"eval_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}},
            step,
        )
        if accelerator.is_main_process:  # above the training bar
            tqdm.write(f"step {step} (epoch {epoch + 1}): validation {summary_line(metrics)}")
        return metrics

    # The loop.
    P, B, GA, N = (
        accelerator.num_processes,
        cfg.per_device_train_batch_size,
        cfg.gradient_accumulation_steps,
        plan.N,
    )
    losses = LossWatch(accelerator, cfg, log)
    fault, scaler_skipped = injected_fault(), ScalerSkips(accelerator.scaler)
    eval_metrics: dict = {}
    early_stop, stale = EarlyStop(cfg.early_stopping_patience, cfg.greater_is_better), False
    model.train()
    progress = tqdm(total=plan.total_steps, initial=step, disable=not accelerator.is_local_main_process,
                    desc="training", unit="step")  # fmt: skip
    with StopOnSignal(P, cfg.ddp_timeout) as stop:  # until the export is written (see Finish)
        with progress:  # the bar ends its line on any exit
            for epoch in range(start_epoch, plan.num_epochs):
                if step >= plan.total_steps or stale:  # also a resume from a checkpoint of the last step
                    break
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
                        per_sample = per_sample_loss(logits, labels, cfg.problem_type)  # (B,)
                        loss_sum = (per_sample * real).sum()
                        accelerator.backward(
                            loss_sum * (P * GA / window_sample_count(Ne, k // GA, GA, nbe, B, P))
                        )
                        losses.add(loss_sum.detach(), real)
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
                    losses.step_done()
                    if fault:
                        fault(step, accelerator.process_index)
                    if step % cfg.logging_steps == 0 or step == plan.total_steps:
                        losses.log(step, epoch, samples_in_epoch + epoch * N, scheduler.get_last_lr()[0], progress,
                                   checkpointer.last)  # fmt: skip
                    end_of_epoch = k == nbe - 1
                    if evaluate := due(cfg.eval_steps, step) or end_of_epoch or step == plan.total_steps:
                        eval_metrics = run_eval(epoch)
                        stale = early_stop.update(eval_metrics.get(cfg.metric_for_best_model))
                    # A checkpoint at the end of an epoch points at the start of the next one.
                    position = (epoch + 1, 0) if end_of_epoch else (epoch, samples_in_epoch)
                    saves = due(cfg.save_steps, step) or (cfg.save_at_epoch_end and end_of_epoch)
                    if saves or (evaluate and cfg.load_best_model_at_end):  # then every evaluation saves
                        checkpointer.save(model, step, *position, eval_metrics if evaluate else None)
                    signum = stop.requested()  # every process gets the same answer
                    if signum:
                        path = checkpointer.save(model, step, *position, eval_metrics if evaluate else None)
                        raise TrainingStopped(
                            f"received {signal.Signals(signum).name} during training; saved checkpoint {path} "
                            f"(optimizer step {step}); continue with resume_from_checkpoint=latest output_dir={out}",
                            128 + signum,
                        )
                    if step >= plan.total_steps or stale:
                        break
        if stale:
            accelerator.print(
                f"early stop at step {step}: {cfg.metric_for_best_model} did not improve for "
                f"{cfg.early_stopping_patience} evaluations"
            )

        # Finish: the final evaluation and the export (a signal now is only recorded: the run is done in
        # seconds, and an export cut short would look finished without its card).
        if not ckpt.all_finite(model, accelerator):
            raise ckpt.diverged("the weights became NaN or infinite", step, checkpointer.last)
        results: dict[str, Any] = {"step": step, "validation": eval_metrics or run_eval(plan.num_epochs - 1)}
        results["exported"] = choose_export(
            cfg, accelerator, model, checkpointer.best, step, results, eval_loaders["validation"], label_names
        )
        if "test" in eval_loaders:
            results["test"] = evaluate_split(cfg, model, eval_loaders["test"], accelerator, label_names)
        export_run(cfg, accelerator, model, preprocessor, results, label_names, checkpointer.best)
    final, split = results.get("test", results["validation"]), "test" if "test" in results else "validation"
    accelerator.print(f"model saved to {out / 'model'} ({results['exported']['why']})")
    accelerator.print(f"{split} {headline(final)}")
    accelerator.end_training()
    # A signal during the final evaluation or the export: they were let finish; now it ends the process.
    stop.stop_if_received(f"the run is finished ({out / 'model'}, {out / RESULTS})")
    return results


def evaluate_split(cfg: TrainConfig, model, loader, accelerator: Accelerator, label_names: list[str]) -> dict:
    """The metrics of the run's problem type on one split (finetune/evaluation.py)."""
    return evaluate_model(model, loader, accelerator, label_names, cfg.pipeline_chunks, cfg.problem_type,
                          cfg.multi_label_threshold)  # fmt: skip


def due(every: int | None, step: int) -> bool:
    """Whether a cadence of `every` optimizer steps (None: never) falls on `step`."""
    return bool(every) and step % every == 0


def choose_export(cfg, accelerator, model, best: dict, step: int, results: dict, loader, label_names) -> dict:
    """Which weights the export holds: the last step's, or with load_best_model_at_end the best
    checkpoint's, loaded here (its validation metrics replace the last step's in `results`)."""
    metric, value = best.get("metric", cfg.metric_for_best_model), best.get("value")
    if not cfg.load_best_model_at_end or not best.get("path") or best.get("step") == step:
        why = f"the last step, {step}"
        if best.get("step") == step and value is not None:
            why += f", also the best by validation {metric} {value:.4f}"
        elif value is not None:
            why += (
                f"; the best validation {metric} was {value:.4f} at step {best['step']}: "
                "load_best_model_at_end=true exports that one"
            )
        return {"step": step, "why": why}
    ckpt.load_checkpoint(accelerator, Path(best["path"]))
    results["validation"] = evaluate_split(cfg, model, loader, accelerator, label_names)
    return {
        "step": best["step"],
        "why": f"the best checkpoint, step {best['step']}, by validation {metric} {value:.4f}",
    }


# --- building a run -------------------------------------------------------------------------------


def build_model_and_data(cfg: TrainConfig, accelerator: Accelerator):
    """The raw splits and label names, the model (frozen embeddings and activation checkpointing as
    asked), its tokenizer or image processor, and the preprocessed splits. Preprocessing runs on the
    main process first; the others read its cache. Fills in `cfg.problem_type` from the labels."""
    text = cfg.task == "text-classification"
    with main_process_first(accelerator):
        raw, label_names = load_splits(cfg.data_args)
    cfg.resolve_problem(problem_type_of(raw["train"]))  # and the metric_for_best_model it implies
    tokenizer = load_preprocessor(cfg.model_args) if text else None
    model = build_model(cfg.model_args, label_names, vocab_size=len(tokenizer) if text else None)
    if text:
        check_max_length(model, cfg.max_length, cfg.pad_to_multiple_of)
        name = cfg.tokenizer_name or cfg.model_name_or_path
        check_tokenizer(tokenizer, model, name, cfg.max_length, pair=cfg.text_pair_column is not None)
    attn = attention_kernel(cfg.attn_implementation, accelerator.device, accelerator.mixed_precision)
    if attn and hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(attn)
        except (ValueError, ImportError) as e:  # a model without that kernel
            raise UserError(f"attn_implementation={attn}: {first_line(e)}") from None
    elif cfg.attn_implementation:  # transformers before set_attn_implementation: the unasked choice is skipped
        raise UserError("attn_implementation needs a newer transformers (PreTrainedModel.set_attn_implementation)")
    if cfg.freeze_embeddings:
        model.get_input_embeddings().requires_grad_(False)
    if cfg.freeze_layers:
        freeze_layers(model, cfg.freeze_layers)
    if cfg.gradient_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise UserError(f"{type(model).__name__} does not support gradient_checkpointing")
        # Non-reentrant: works under DDP and when the embeddings are frozen (inputs without grad).
        # transformers 5 renamed gradient_checkpointing_enable (deprecated there) to activation_checkpointing_enable.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.peft is not None:  # LoRA (finetune/lora.py): adapters and the head train, the rest is frozen
        if accelerator.distributed_type == DistributedType.FSDP:
            raise UserError("peft (LoRA) trains with one process or DDP, not FSDP; choose another accelerate config")
        model = apply_lora(model, cfg.peft)
    preprocessor = tokenizer if text else load_preprocessor(cfg.model_args, model.config)
    if not text and (notice := resize_notice(image_sizes(raw["train"], cfg.image_column), preprocessor)):
        accelerator.print(notice)
    with main_process_first(accelerator):
        splits = prepare_splits(cfg.data_args, raw, preprocessor, getattr(model.config, "num_channels", 3))
    return model, preprocessor, splits, label_names


def attention_kernel(asked: str | None, device: torch.device, mixed_precision: str) -> str | None:
    """The attention implementation to set, or None for the model's default: what the config asks;
    unasked, eager for reduced precision on a CPU (see TrainConfig.attn_implementation)."""
    if asked is not None:
        return asked
    if device.type == "cpu" and mixed_precision in ("bf16", "fp16"):
        return "eager"
    return None


def model_parallel_plan(cfg: TrainConfig, accelerator: Accelerator, model):
    """The layer split over this process's devices (finetune/parallel.py), printed. Under DDP each
    process splits its own replica over the devices of its local rank (`process_devices`)."""
    from finetune.parallel import plan_model_parallel, process_devices

    seq = cfg.max_length if cfg.task == "text-classification" else None  # ViT: patches + 1
    local = local_processes() if accelerator.num_processes > 1 else 1
    devices = process_devices(cfg.devices, accelerator.local_process_index, local)
    model = _inside_lora(model)  # under LoRA, the wrapped model: its layers hold the adapters
    # GPipe keeps every chunk's activations until backward: plan for the whole batch.
    plan = plan_model_parallel(model, devices, micro_batch_size=cfg.per_device_train_batch_size, seq_len=seq,
                               max_memory=cfg.max_memory, mixed_precision=accelerator.mixed_precision,
                               local_processes=local)  # fmt: skip
    if accelerator.num_processes > 1:
        accelerator.print(f"each of the {accelerator.num_processes} processes splits its replica; process 0:")
    accelerator.print(plan.format_table())
    return plan


def split_model(cfg: TrainConfig, accelerator: Accelerator, model):
    """With `model_parallel=true`, the model with its layers on consecutive devices. Under LoRA the
    model inside peft's wrapper is split, adapters and all, and the wrapper is returned."""
    if not cfg.model_parallel:
        return model
    from finetune.parallel import apply_model_parallel

    plan = model_parallel_plan(cfg, accelerator, model)
    if len(plan.stages) == 1:
        accelerator.print("warning: model parallelism with one device: training unsplit")
        return model
    apply_model_parallel(_inside_lora(model), plan)
    return model


def _inside_lora(model):
    """The transformers model that LoRA wraps (its layers, with the adapters in them, are what the split
    places; peft's wrapper calls it, so its hooks run), or the model itself without LoRA."""
    return model.get_base_model() if is_lora(model) else model


def make_loaders(cfg: TrainConfig, accelerator: Accelerator, splits, preprocessor):
    """The training loader over the epoch sampler (length groups of one optimizer step; padded to whole
    global batches under DDP) and the evaluation loaders, text read longest first."""
    P, B, GA = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    train_set = splits["train"]
    # A list: a datasets Column reads one row per index.
    grouped = cfg.group_by_length and "length" in train_set.column_names
    lengths = list(train_set["length"]) if grouped else None
    sampler = EpochSampler(
        len(train_set), cfg.seed, group_size=P * B * GA, lengths=lengths, pad_to=P * B if P > 1 else 1
    )
    tokenizer = preprocessor if cfg.task == "text-classification" else None
    collate = Collator(tokenizer, cfg.pad_to_multiple_of)
    workers, pin = data_workers(cfg, accelerator), pin_memory(cfg, accelerator)
    train_loader = DataLoader(train_set, batch_size=B, sampler=sampler, collate_fn=collate, num_workers=workers,
                              pin_memory=pin, generator=torch.Generator().manual_seed(cfg.seed))  # fmt: skip
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
            num_workers=workers,
            pin_memory=pin,
        )
        for split in ("validation", "test")
        if split in splits
    }
    return train_loader, sampler, eval_loaders


def resume_target(cfg: TrainConfig, out: Path) -> tuple[Path | None, dict | None]:
    """The checkpoint to resume from and its manifest, or (None, None)."""
    if not cfg.resume_from_checkpoint:
        return None, None
    path = ckpt.resolve_checkpoint(cfg.resume_from_checkpoint, out)
    return path, ckpt.read_manifest(path)


@dataclass
class StepPlan:
    """Optimizer steps are the unit: the schedule is planned in them, for any processes and accumulation."""

    N: int  # training samples
    batches: int  # per process, per epoch
    steps_per_epoch: int
    total_steps: int
    num_epochs: int
    warmup: int


def plan_steps(cfg: TrainConfig, P: int, N: int, manifest: dict | None, label_names: list[str]) -> StepPlan:
    B, GA = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    nb = batches_per_process(N, B, P)
    if GA > nb:
        raise UserError(
            f"gradient_accumulation_steps={GA} exceeds the {nb} batches per process in an epoch; "
            "lower gradient_accumulation_steps or per_device_train_batch_size"
        )
    steps_per_epoch = math.ceil(nb / GA)
    total_steps = cfg.max_steps or steps_per_epoch * cfg.num_train_epochs
    if (
        manifest is not None
        and ckpt.check_resume_compatible(manifest, cfg, P, label_names)
        and not cfg.max_steps
    ):
        # Another topology: the steps taken, plus the rest of the data in this run's steps.
        rest = math.ceil(batches_per_process(N - manifest["samples_in_epoch"], B, P) / GA)
        total_steps = (
            manifest["step"] + rest + (cfg.num_train_epochs - manifest["epoch"] - 1) * steps_per_epoch
        )
    num_epochs = (
        cfg.num_train_epochs if cfg.max_steps is None else math.ceil(total_steps / steps_per_epoch) + 1
    )
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * total_steps)
    if warmup > total_steps:
        raise UserError(
            f"warmup_steps={warmup} exceeds the {total_steps} optimizer steps of the run: the learning rate "
            "would never reach learning_rate; lower warmup_steps"
        )
    return StepPlan(N, nb, steps_per_epoch, total_steps, num_epochs, warmup)


def make_optimizer(cfg: TrainConfig, model, accelerator: Accelerator):
    """AdamW over the trained weights (no weight decay for biases and LayerNorm); returns it and the
    number of trained weights."""
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
    return optimizer, sum(p.numel() for _, p in trainable)


def make_scheduler(cfg: TrainConfig, optimizer, plan: StepPlan):
    name = cfg.lr_scheduler_type if cfg.lr_scheduler_type != "constant" else "constant_with_warmup"
    return get_scheduler(name, optimizer, num_warmup_steps=plan.warmup, num_training_steps=plan.total_steps)


def start_run(
    cfg: TrainConfig, accelerator: Accelerator, out: Path, model, splits, plan: StepPlan, trained: int
):
    """A fresh run clears what `overwrite_output_dir` replaces; then the resolved config, the
    trackers and the start summary."""
    with agreed(accelerator):
        if accelerator.is_main_process:
            if not cfg.resume_from_checkpoint and cfg.overwrite_output_dir and out.exists() and holds_run(out):
                # Only what a run writes, only where a run was; it comes back if this run fails early.
                set_aside_previous_run(out)
            out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, out / "config.yaml")
    if cfg.report_to:
        scalars = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(out.name, config=scalars)
    P, B, GA = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    threads = f" x {torch.get_num_threads()} threads" if accelerator.device.type == "cpu" else ""
    unwrapped = accelerator.unwrap_model(model)
    total = sum(p.numel() for p in unwrapped.parameters())  # DTensor: global
    base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped  # under LoRA
    name = type(base).__name__.removeprefix("FSDP")  # fully_shard's subclass
    problem = f" ({cfg.problem_type})" if cfg.problem_type not in (None, SINGLE) else ""
    accelerator.print(
        f"{cfg.task}{problem}: {name}, train {plan.N} / validation "
        f"{len(splits['validation'])} samples, {P} process(es) on {accelerator.device}{threads} "
        f"({accelerator.distributed_type}), precision {accelerator.mixed_precision}, global batch "
        f"{P * B * GA} ({P} x {B} x {GA} accumulation), {plan.total_steps} optimizer steps, "
        f"{trained:,} of {total:,} weights trained" + (f" (LoRA r={cfg.peft['r']} and the head)" if cfg.peft else "")
    )
    accelerator.print(describe_parameters(accelerator, model, cfg.pipeline_chunks))


def holds_run(out: Path) -> str | None:
    """'a finished run', 'a started run' (checkpoints or a log), or None."""
    if (out / RESULTS).exists():
        return "a finished run"
    if ckpt.list_checkpoints(out) or (out / "metrics.jsonl").exists():
        return "a started run"
    return None


def check_output_dir(cfg: TrainConfig) -> None:
    """Refuse to write over a run, or into a folder of other files, unless told to overwrite it or to
    resume it; refuse a path that cannot become a folder before anything runs."""
    out = Path(cfg.output_dir)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"output_dir {out}: {existing} is a file, not a folder; choose another output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"output_dir {out}: {existing} is not writable; choose another output_dir")
    if cfg.overwrite_output_dir and not cfg.resume_from_checkpoint and out.is_dir() and not holds_run(out):
        check_files_in_the_way(out, trackers=bool(cfg.report_to))  # the user's config.yaml: not written over
    if cfg.resume_from_checkpoint or not out.exists() or cfg.overwrite_output_dir:
        return
    state = holds_run(out)
    if state:
        raise UserError(
            f"output_dir {out} already holds {state}; pass overwrite_output_dir=true to replace "
            "it, resume_from_checkpoint=latest to continue it, or choose another output_dir"
        )
    if any(out.iterdir()):
        raise UserError(
            f"output_dir {out} holds files that are not a run of this app; choose an empty or new "
            "output_dir, or pass overwrite_output_dir=true to write into it (nothing there is deleted)"
        )


# --- what the loop keeps track of -----------------------------------------------------------------


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
        self.metrics_log.log(
            {"epoch": epoch, "loss": loss, "learning_rate": lr, "samples_per_second": rate}, step
        )
        progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
        self.running.zero_()
        limit = self.cfg.max_nonfinite_loss_steps
        if stats[:, 2].max().item() >= limit:
            raise ckpt.diverged(
                f"the loss was NaN or infinite for {limit} optimizer steps in a row", step, last_checkpoint
            )
        self.nonfinite[1] = 0


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


# --- the modes that do not train --------------------------------------------------------------------


def dry_run(cfg: TrainConfig) -> dict[str, Any]:
    """What a run would do, without doing it: printed on the main process and returned."""
    accelerator = make_accelerator(cfg)
    check_output_dir(cfg)
    set_seed(cfg.seed)
    model, _, splits, label_names = build_model_and_data(cfg, accelerator)
    P, B, GA = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    _, manifest = resume_target(cfg, Path(cfg.output_dir))
    plan = plan_steps(cfg, P, len(splits["train"]), manifest, label_names)
    optimizer, _ = make_optimizer(cfg, model, accelerator)
    lam = make_scheduler(cfg, optimizer, plan).lr_lambdas[0]
    summary = {
        "devices": str(accelerator.device), "processes": P, "distributed_type": str(accelerator.distributed_type),
        **({"cpu_threads_per_process": torch.get_num_threads()} if accelerator.device.type == "cpu" else {}),
        "mixed_precision": accelerator.mixed_precision, "train_samples": plan.N,
        "per_device_train_batch_size": B, "gradient_accumulation_steps": GA, "global_batch_size": P * B * GA,
        "batches_per_process_per_epoch": plan.batches, "optimizer_steps_per_epoch": plan.steps_per_epoch,
        "total_optimizer_steps": plan.total_steps, "warmup_steps": plan.warmup,
        "first_learning_rate": cfg.learning_rate * lam(0),
        "last_learning_rate": cfg.learning_rate * lam(plan.total_steps - 1),
    }  # fmt: skip
    width = max(map(len, summary))
    accelerator.print("\n".join(f"{k:<{width}}  {v}" for k, v in summary.items()))
    return summary


def plan_only(cfg: TrainConfig) -> dict[str, Any]:
    """The model-parallel plan, printed, without training."""
    if not cfg.model_parallel:
        raise UserError("--plan-only needs model_parallel=true")
    accelerator = make_accelerator(cfg)
    model, _, _, _ = build_model_and_data(cfg, accelerator)
    return {"plan": model_parallel_plan(cfg, accelerator, model).format_table()}


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str]):
    """The config (recipe + key=value) and the mode flags."""
    hint = "options are --config PATH, --dry-run and --plan-only; settings are key=value (--help lists them)"
    usage = __doc__.split("\n\n")[0]  # the commands; the settings follow from the typed config
    parser = ArgumentParser(prog="finetune/run.py", description=usage, hint=hint, add_help=False)
    parser.add_argument(
        "-h", "--help", action="store_true", help="this help; with --config, the recipe's values"
    )
    parser.add_argument("--config", metavar="PATH", help="a recipe YAML (default: the MiniLM recipe)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (devices, steps, learning rates) and exit"
    )
    parser.add_argument("--plan-only", action="store_true", help="print the model-parallel plan and exit")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="override any setting of the recipe")
    args = parser.parse_intermixed_args(argv)  # key=value before and after the flags
    if args.help:
        print(f"{parser.format_help()}\n{settings_help(args.config)}")
        raise SystemExit(0)
    saved = resumed_run_recipe(args.settings) if args.config is None else None
    if saved is not None and os.environ.get("RANK", "0") == "0":
        print(f"resuming with the run's own recipe {saved} (--config chooses another)")
    return load_config(saved or args.config, args.settings, saved=saved is not None), args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    stop_outside_the_loop()
    cfg, args = parse_args(sys.argv[1:] if argv is None else argv)
    quiet_libraries(cfg.log_level)
    if args.plan_only:
        return plan_only(cfg)
    if args.dry_run:
        return dry_run(cfg)
    return train(cfg)


def cli() -> None:
    stop_with_launcher()
    main()


if __name__ == "__main__":
    stop_with_launcher()
    main()
