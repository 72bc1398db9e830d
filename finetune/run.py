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
"""

from __future__ import annotations

import sys
from pathlib import Path

# Launched by path (`accelerate launch finetune/run.py`), Python puts finetune/ first on sys.path,
# where our evaluate.py would shadow the `evaluate` library: import the installed package instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import json
import math
import os
import shutil
import time
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_scheduler

from finetune import checkpoint as ckpt
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
from finetune.errors import UserError, exit_on_user_error
from finetune.models import build_model, check_max_length, load_preprocessor

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
        project_dir=cfg.output_dir,
    )
    if world_size > 1 and accelerator.num_processes != world_size:
        raise UserError(f"{world_size} processes were launched but they did not form one group "
                        f"({accelerator.distributed_type}); check the accelerate config")
    return accelerator


def check_output_dir(cfg: TrainConfig) -> None:
    """Refuse to write over a run unless told to overwrite it or to resume it."""
    out = Path(cfg.output_dir)
    if cfg.resume_from_checkpoint or not out.exists():
        return
    finished = (out / RESULTS).exists()
    started = bool(ckpt.list_checkpoints(out)) or (out / "metrics.jsonl").exists()
    if (finished or started) and not cfg.overwrite_output_dir:
        state = "a finished run" if finished else "a started run"
        raise UserError(f"output_dir {out} already holds {state}; pass overwrite_output_dir=true to replace "
                        "it, resume_from_checkpoint=latest to continue it, or choose another output_dir")


def clear_output_dir(out: Path) -> None:
    for name in (ckpt.CHECKPOINTS, "model", "metrics.jsonl", RESULTS, "config.yaml"):
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
    preprocessor = tokenizer if tokenizer is not None else load_preprocessor(cfg, model.config)
    with accelerator.main_process_first():
        splits = prepare_splits(cfg, raw, preprocessor, model.config)

    plan = None
    if cfg.model_parallel:
        from finetune.parallel import apply_model_parallel, parse_devices, plan_model_parallel

        devices = parse_devices(cfg.devices)
        seq = cfg.max_length if cfg.task == "text-classification" else None  # ViT: patches + 1
        # GPipe keeps every chunk's activations until backward: plan for the whole batch.
        plan = plan_model_parallel(model, devices, micro_batch_size=B, seq_len=seq, max_memory=cfg.max_memory,
                                   mixed_precision=accelerator.mixed_precision)
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
    lengths = train_set["length"] if cfg.group_by_length and "length" in train_set.column_names else None
    sampler = EpochSampler(N, cfg.seed, group_size=P * B * GA, lengths=lengths, pad_to=P * B if P > 1 else 1)
    collate = Collator(tokenizer)
    train_loader = DataLoader(train_set, batch_size=B, sampler=sampler, collate_fn=collate,
                              num_workers=cfg.dataloader_num_workers,
                              generator=torch.Generator().manual_seed(cfg.seed))  # keeps the global RNG untouched
    eval_loaders = {
        split: DataLoader(splits[split], batch_size=cfg.per_device_eval_batch_size, collate_fn=collate,
                          num_workers=cfg.dataloader_num_workers)
        for split in ("validation", "test") if split in splits
    }

    # Optimizer steps are the unit: the schedule is planned in them, for any P and accumulation.
    nb = batches_per_process(N, B, P)
    if GA > nb:
        raise UserError(f"gradient_accumulation_steps={GA} exceeds the {nb} batches per process in an epoch")
    steps_per_epoch = math.ceil(nb / GA)
    total_steps = cfg.max_steps or steps_per_epoch * cfg.num_train_epochs
    num_epochs = math.ceil(total_steps / steps_per_epoch)
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * total_steps)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "LayerNorm" not in n)]
    # The fused kernel: one pass over all parameters instead of a Python loop over ~100 tensors
    # (0.02 s vs 1.6 s a step for MiniLM on 2 CPU cores). CPU and CUDA have it.
    fused = accelerator.device.type in ("cpu", "cuda") or None
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon, fused=fused,
    )
    scheduler = get_scheduler(cfg.lr_scheduler_type if cfg.lr_scheduler_type != "constant" else
                              "constant_with_warmup", optimizer, num_warmup_steps=warmup,
                              num_training_steps=total_steps)
    model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
    eval_loaders = {k: accelerator.prepare(v) for k, v in eval_loaders.items()}
    assert len(train_loader) == nb, (len(train_loader), nb)

    # Resume: restore weights, optimizer, scheduler and RNG; the position comes from the manifest.
    step, start_epoch, start_sample = 0, 0, 0
    best: dict[str, Any] = {}
    if cfg.resume_from_checkpoint:
        path = ckpt.resolve_checkpoint(cfg.resume_from_checkpoint, out)
        manifest = ckpt.read_manifest(path)
        check_resume_compatible(manifest, cfg, P)
        accelerator.load_state(str(path))
        step, start_epoch, start_sample = manifest["step"], manifest["epoch"], manifest["samples_in_epoch"]
        best = manifest.get("best", {})
        accelerator.print(f"resumed from {path} at step {step} (epoch {start_epoch}, sample {start_sample})")
    elif accelerator.is_main_process and cfg.overwrite_output_dir and out.exists():
        clear_output_dir(out)

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    accelerator.wait_for_everyone()
    log = MetricsLog(accelerator, out / "metrics.jsonl")
    if cfg.report_to:
        accelerator.init_trackers(out.name, config={k: v for k, v in cfg.to_dict().items()
                                                    if isinstance(v, (int, float, str, bool))})
    accelerator.print(
        f"{cfg.task}: {type(accelerator.unwrap_model(model)).__name__}, train {N} / validation "
        f"{len(splits['validation'])} samples, {P} process(es) on {accelerator.device} "
        f"({accelerator.distributed_type}), precision {accelerator.mixed_precision}, global batch "
        f"{P * B * GA} ({P} x {B} x {GA} accumulation), {total_steps} optimizer steps"
    )

    def save(epoch: int, samples_in_epoch: int, metrics: dict | None = None) -> None:
        nonlocal best
        value = (metrics or {}).get(cfg.metric_for_best_model)
        if isinstance(value, (int, float)) and (
            not best or (value > best["value"] if cfg.greater_is_better else value < best["value"])
        ):
            best = {"metric": cfg.metric_for_best_model, "value": value, "step": step,
                    "path": str(out / ckpt.CHECKPOINTS / f"{ckpt.PREFIX}{step:08d}")}
        manifest = {
            "step": step, "epoch": epoch, "samples_in_epoch": samples_in_epoch, "seed": cfg.seed,
            "world_size": P, "gradient_accumulation_steps": GA, "per_device_train_batch_size": B,
            "mixed_precision": accelerator.mixed_precision, "task": cfg.task, "label_names": label_names,
            "metrics": metrics or {}, "best": best, "versions": ckpt.package_versions(),
            "config": cfg.to_dict(),
        }
        path = ckpt.save_checkpoint(accelerator, out, step, manifest)
        if accelerator.is_main_process:
            ckpt.prune_checkpoints(out, cfg.save_total_limit, Path(best["path"]) if best.get("path") else None)
        accelerator.print(f"saved checkpoint {path}")

    def run_eval(epoch: int) -> dict:
        metrics = evaluate_model(model, eval_loaders["validation"], accelerator, label_names, cfg.pipeline_chunks)
        log.log({"epoch": epoch, **{f"eval_{k}": v for k, v in metrics.items()
                                    if isinstance(v, (int, float))}}, step)
        return metrics

    progress = tqdm(total=total_steps, initial=step, disable=not accelerator.is_local_main_process,
                    desc="training", unit="step")
    running = torch.zeros(2, device=accelerator.device)  # (sum of per-sample losses, samples)
    last_log_time, last_log_samples = time.perf_counter(), 0
    eval_metrics: dict = {}
    model.train()
    for epoch in range(start_epoch, num_epochs):
        start = start_sample if epoch == start_epoch else 0
        sampler.reset(epoch, start)
        Ne = N - start  # samples in this (possibly resumed) epoch's stream
        nbe = batches_per_process(Ne, B, P)
        for k, batch in enumerate(train_loader):
            with accelerator.accumulate(model):
                logits = forward(model, batch, cfg.pipeline_chunks)
                labels = batch["labels"].to(logits.device)
                real = real_sample_mask(Ne, k, B, P, accelerator.process_index, len(labels)).to(logits.device)
                window_real = window_sample_count(Ne, k // GA, GA, nbe, B, P)
                per_sample = F.cross_entropy(logits.float(), labels, reduction="none")
                loss_sum = (per_sample * real).sum()
                accelerator.backward(loss_sum * (P * GA / window_real))
                running += torch.stack([loss_sum.detach().float(), real.sum().float()]).to(running.device)
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if not accelerator.sync_gradients:
                continue

            # One optimizer step is done.
            if not accelerator.optimizer_step_was_skipped:
                scheduler.step()
            step += 1
            samples_in_epoch = min(start + (k + 1) * P * B, N)
            progress.update(1)
            if step % cfg.logging_steps == 0 or step == total_steps:
                totals = accelerator.reduce(running, reduction="sum")  # the only sync point per log
                now = time.perf_counter()
                samples_seen_now = samples_in_epoch + epoch * N
                rate = (samples_seen_now - last_log_samples) / max(now - last_log_time, 1e-9)
                last_log_time, last_log_samples = now, samples_seen_now
                loss = (totals[0] / totals[1].clamp(min=1)).item()
                lr = scheduler.get_last_lr()[0]
                log.log({"epoch": epoch, "loss": loss, "learning_rate": lr, "samples_per_second": rate}, step)
                progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
                running.zero_()
            end_of_epoch = k == nbe - 1
            if (cfg.eval_steps and step % cfg.eval_steps == 0) or end_of_epoch or step == total_steps:
                eval_metrics = run_eval(epoch)
            if (cfg.save_steps and step % cfg.save_steps == 0) or (cfg.save_at_epoch_end and end_of_epoch):
                # A checkpoint at the end of an epoch points at the start of the next one.
                save(epoch + 1 if end_of_epoch else epoch, 0 if end_of_epoch else samples_in_epoch,
                     eval_metrics)
            if step >= total_steps:
                break
        if step >= total_steps:
            break
    progress.close()

    # Final evaluation and export.
    results: dict[str, Any] = {"step": step, "validation": eval_metrics or run_eval(num_epochs - 1)}
    if "test" in eval_loaders:
        results["test"] = evaluate_model(model, eval_loaders["test"], accelerator, label_names,
                                         cfg.pipeline_chunks)
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # every process: gathers shards under FSDP
    if accelerator.is_main_process:
        export = out / "model"
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(export, state_dict=state_dict, safe_serialization=True)
        preprocessor.save_pretrained(export)
        results.update({"model_dir": str(export), "label_names": label_names, "best": best,
                        "versions": ckpt.package_versions()})
        (out / RESULTS).write_text(json.dumps(results, indent=2))
    accelerator.wait_for_everyone()
    final = results.get("test", results["validation"])
    split = "test" if "test" in results else "validation"
    accelerator.print(f"model saved to {out / 'model'}")
    accelerator.print(f"{split} accuracy {final['accuracy']:.4f} on {final['num_samples']} samples")
    accelerator.end_training()
    return results


def check_resume_compatible(manifest: dict[str, Any], cfg: TrainConfig, num_processes: int) -> None:
    """A resumed run must split the data the way the saved one did, or the order and LR change."""
    saved = (manifest["world_size"], manifest["gradient_accumulation_steps"], manifest["per_device_train_batch_size"])
    now = (num_processes, cfg.gradient_accumulation_steps, cfg.per_device_train_batch_size)
    if saved != now:
        raise UserError(
            f"the checkpoint was saved with processes x batch x accumulation = {saved[0]} x {saved[2]} x "
            f"{saved[1]}, this run has {now[0]} x {now[2]} x {now[1]}; resume with the same settings"
        )
    if manifest.get("task") != cfg.task or manifest.get("label_names") is None:
        raise UserError(f"the checkpoint is from a {manifest.get('task')} run, this one is {cfg.task}")


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
        elif arg.startswith("--"):
            raise UserError(f"unknown option {arg}; options are --config PATH and --plan-only, "
                            "settings are key=value")
        else:
            overrides.append(arg)
    return load_config(config_path, overrides)


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    return train(cfg)


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
