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
recipe (finetune/config.py). `train()` reads build -> resume -> the loop -> finish; each piece of
set-up is a named function below it. The loss of a step is `steps.step_loss`'s (the math of exact
accumulation and DDP); faults and signals are finetune/errors.py's and finetune/signals.py's.
"""

from __future__ import annotations

import os

# Before torch loads OpenMP, which reads this once: its threads sleep when they wait instead of spinning.
# On a CPU shared with another job, a spinning thread holds the core that the thread it waits for
# needs (benchmarks/README.md, "CPU threads"). A user's own policy is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __name__ == "__main__":
    import sys

    from finetune.signals import stop_while_starting

    stop_while_starting()  # Ctrl-C or SIGTERM during the imports (seconds): one line, not a traceback
    from finetune.cli import answer_early

    EARLY = answer_early(sys.argv[1:])  # --help and setting mistakes: before torch is imported; parsed once

import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from finetune import checkpoint as ckpt
from finetune import checks, steps
from finetune.card import check_hub_access, launch_command
from finetune.checks import launch, tools
from finetune.cli import Command, parse_command_line
from finetune.config import TrainConfig, resolved, save_config
from finetune.data import load_splits, prepare_splits, read_splits, train_data_fingerprint
from finetune.evaluation import evaluate_model, forward, longest_first
from finetune.exits import exit_on_user_error
from finetune.export import export_run
from finetune.layout import RunDir, read_record, step_of
from finetune.lora import apply_lora, is_lora
from finetune.metrics import (
    headline,
    never_predicted,
    summary_line,
)
from finetune.models import batchnorm_layers, build_model, freeze_batchnorm, freeze_layers
from finetune.parallel import apply_model_parallel, plan_model_parallel, process_devices
from finetune.problems import Labels, Problem, problem_of, problem_type_of
from finetune.rundir import (
    check_output_dir,
    check_shared_output_dir,
    in_use,
    resumes_here,
    set_aside_previous_run,
)
from finetune.runtime import (
    ScalerSkips,
    agreed,
    attention_kernel,
    configure_fsdp,
    data_workers,
    describe_parameters,
    end_processes,
    evaluation_attention,
    injected_fault,
    local_processes,
    main_process_first,
    make_accelerator,
    pin_memory,
    quiet_libraries,
    sequence_tokens,
)
from finetune.shapes import Shapes, check_compile, compile_model, plan_shapes, warm_up
from finetune.signals import StopOnSignal, stop_outside_the_loop, stop_with_launcher
from finetune.steps import EpochSampler, StepPlan, Stream, plan_steps, step_loss
from finetune.streams import TrainStream, samples_of
from finetune.tasks import task_for_data, task_of
from finetune.tracking import Hooks, LossWatch, MetricsLog, phase_order
from finetune.verdict import better, judge, judged_metric

# --- the loop -------------------------------------------------------------------------------------


def train(cfg: TrainConfig, hooks: Hooks | None = None, said: checks.Said | None = None) -> dict[str, Any]:
    """Build, resume, loop over epochs and batches, evaluate, export. Returns the final metrics. `said`: the
    run's warnings (a search's trials share one)."""
    with contextlib.ExitStack() as held:  # the output folder, held from its first write to the run's end
        return _train(cfg, hooks or Hooks(), held, said if said is not None else checks.Said())


def _train(cfg: TrainConfig, hooks: Hooks, held: contextlib.ExitStack, said: checks.Said) -> dict[str, Any]:
    with hooks.phase("start-up"):
        run = setup(cfg, hooks, held, said)  # the Accelerator, data, model, loaders, the step plan, optimizer, schedule
        hooks.mark("prepared", run)
        cfg = run.cfg  # what the data decided (the task, the problem type) resolved in it
        accelerator, model, optimizer, scheduler, plan = run.accelerator, run.model, run.optimizer, run.scheduler, run.plan
        processes, accumulation = accelerator.num_processes, cfg.gradient_accumulation_steps
        # Resume (weights, optimizer, scheduler, RNG; the position from the manifest) or start afresh.
        step, start_epoch, start_sample = resume(cfg, run)
        start_run(cfg, run)
    if cfg.torch_compile:  # every shape of the run compiled now, not at its first batch
        with hooks.phase("compile"):
            warm_up(model, accelerator, optimizer, functools.partial(forward, problem=run.problem), run.shapes)
    losses, evaluations = LossWatch(accelerator, cfg, run.log), Evaluations(cfg, run, hooks)
    fault, scaler_skipped = injected_fault(), ScalerSkips(accelerator.scaler)
    model.train()
    progress = tqdm(total=plan.total_steps, initial=step, disable=not accelerator.is_local_main_process,
                    desc="training", unit="step")  # fmt: skip
    with StopOnSignal(processes, cfg.ddp_timeout) as stop:  # until the export is written
        with progress, hooks.phase("train"):  # the bar ends its line on any exit
            for epoch in range(start_epoch, plan.num_epochs):
                if step >= plan.total_steps or evaluations.stale:  # also a resume from the last step's checkpoint
                    break
                start = start_sample if epoch == start_epoch else 0
                run.sampler.reset(epoch, start)
                stream = Stream(plan.samples - start, cfg.per_device_train_batch_size, processes, accumulation,
                                run.sampler.weights(run.sample_weights))  # fmt: skip
                for k, batch in enumerate(run.train_loader):
                    hooks.mark("batch", batch)
                    with accelerator.accumulate(model):
                        logits = forward(model, batch, run.problem, cfg.pipeline_chunks, run.rows("train"))
                        labels = batch["labels"].to(logits.device)
                        real = stream.real_rows(k, accelerator.process_index, len(labels), logits.device)
                        per_sample = run.problem.loss(logits, labels, run.class_weights, cfg.label_smoothing)
                        loss_sum = (per_sample * real).sum()
                        hooks.mark("backward")
                        accelerator.backward(step_loss(loss_sum, stream.window_count(k), processes, accumulation))
                        losses.add(loss_sum.detach(), run.problem.loss_weights(labels) * real)
                        hooks.mark("optimizer")
                        if accelerator.sync_gradients and cfg.max_grad_norm:
                            accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    hooks.mark("micro-batch done")
                    if not accelerator.sync_gradients:
                        continue

                    # One optimizer step is done (or skipped by fp16's scaler: then the schedule waits).
                    if not scaler_skipped() and not accelerator.optimizer_step_was_skipped:
                        scheduler.step()
                    step += 1
                    samples_in_epoch = start + stream.samples_done(k)
                    progress.update(1)
                    losses.step_done()
                    if fault:
                        fault(step, accelerator.process_index)
                    if due(cfg.logging_steps, step) or step == plan.total_steps:
                        losses.log(step, epoch, samples_in_epoch + epoch * plan.samples, scheduler.get_last_lr()[0],
                                   progress, run.checkpointer.last)  # fmt: skip
                    end_of_epoch = k == stream.batches - 1
                    if evaluated := due(cfg.eval_steps, step) or end_of_epoch or step == plan.total_steps:
                        evaluations.evaluate(step, epoch)
                    # A checkpoint at the end of an epoch points at the start of the next one.
                    position = (epoch + 1, 0) if end_of_epoch else (epoch, samples_in_epoch)
                    metrics = evaluations.last if evaluated else None
                    saves = due(cfg.save_steps, step) or (cfg.save_at_epoch_end and end_of_epoch)
                    if saves or (evaluated and cfg.load_best_model_at_end):  # then every evaluation saves
                        run.checkpointer.save(model, step, *position, metrics)
                    if stop.requested():  # every process gets the same answer
                        raise stop.stopped(run.checkpointer.save(model, step, *position, metrics), step, cfg.output_dir)
                    hooks.mark("step", step)
                    if step >= plan.total_steps or evaluations.stale:
                        break
        if evaluations.stale:
            accelerator.print(
                f"early stop at step {step}: {cfg.metric_for_best_model} did not improve for "
                f"{cfg.early_stopping_patience} evaluations"
            )
        # Finish: the final evaluation and the export (a signal now is only recorded: the run is done in
        # seconds, and an export cut short would look finished without its card).
        results = finish(cfg, run, step, evaluations, hooks)
    # The last line scores the export's own decisions: multi-label at the threshold tuned on validation.
    tuned = " at the tuned threshold" if "validation_tuned" in results else ""
    final, split = ((results["test"], "test") if "test" in results else
                    (results.get("validation_tuned") or results["validation"], "validation"))  # fmt: skip
    accelerator.print(f"model saved to {run.dir.model} ({results['exported']['why']})")
    accelerator.print(f"{split} {headline(final)}{tuned}")
    accelerator.print("seconds: " + ", ".join(f"{name} {s:.1f}" for name, s in sorted(hooks.seconds.items(), key=phase_order)))
    if cfg.torch_compile:
        compiled = results["shapes"]
        accelerator.print(f"torch_compile: {compiled['graphs_compiled_in_warm_up']} graphs compiled in the warm-up, "
                          f"{compiled['graphs_compiled_after_warm_up']} after it")  # fmt: skip
    for tracker in accelerator.trackers:  # the process group stays: main() ends it (a search runs more trials)
        tracker.finish()
    # A signal during the final evaluation or the export: they were let finish; now it ends the process.
    stop.stop_if_received(f"the run is finished ({run.dir.model}, {run.dir.results})")
    return results


def due(every: int | None, step: int) -> bool:
    """Whether a cadence of `every` optimizer steps (None: never) falls on `step`."""
    return bool(every) and step % every == 0


# --- building a run -------------------------------------------------------------------------------


@dataclass
class Run:
    """What `setup` builds and the loop uses."""

    accelerator: Accelerator
    dir: RunDir
    model: Any
    preprocessor: Any
    splits: Any
    labels: Labels  # what the outputs are, by name (finetune/problems/base.py)
    train_loader: DataLoader
    sampler: EpochSampler
    sample_weights: list[int] | None  # each training sample's count in its step's loss (None: one each)
    trivial: Any  # what a model that learned nothing predicts (Problem.trivial): the baseline
    class_weights: torch.Tensor | None  # class_weights=balanced (Problem.class_weights)
    eval_loaders: dict[str, DataLoader]
    shapes: Shapes | None  # length buckets, a compiled model's full batches (finetune/shapes.py)
    plan: StepPlan
    optimizer: torch.optim.Optimizer
    scheduler: Any
    trained: int  # weights that train
    resume_path: Path | None
    manifest: dict | None
    log: MetricsLog
    checkpointer: ckpt.Checkpointer
    held: contextlib.ExitStack | None  # what the run holds until it ends: its output folder (rundir.in_use)
    cfg: TrainConfig  # the run's config, resolved: the task and problem type the data decided
    said: checks.Said  # the run's warnings, each said once
    digests: dict[str, str]  # each data file's sha256 (results.json's data_sha256)

    @property
    def problem(self) -> Problem:
        return problem_of(self.cfg.problem_type)

    def rows(self, kind: str) -> int | None:
        """The rows every "train" or "eval" batch is filled to for a compiled model, or None."""
        if self.shapes is None:
            return None
        return self.shapes.train_rows if kind == "train" else self.shapes.eval_rows


def setup(cfg: TrainConfig, hooks: Hooks, held: contextlib.ExitStack | None = None,
          said: checks.Said | None = None) -> Run:  # fmt: skip
    """Everything the loop needs, in order: the Accelerator and the output folder's checks, data and
    model (and the config the data resolves), the layer split, loaders, what a resume continues, the step
    plan, optimizer and schedule, then Accelerate's `prepare`."""
    said = said if said is not None else checks.Said()
    accelerator = make_accelerator(cfg, said)
    out = RunDir(cfg.output_dir)
    check_output_dir(out.root, cfg.overwrite_output_dir, cfg.resume_from_checkpoint, bool(cfg.report_to), said)
    check_shared_output_dir(accelerator, out.root)  # multi-node: before anything reads or writes it
    set_seed(cfg.seed)
    built = build_model_and_data(cfg, accelerator, hooks, said)
    model, preprocessor, splits, names, cfg = built.model, built.preprocessor, built.splits, built.labels, built.cfg
    model = split_model(cfg, accelerator, model, said)
    train_loader, sampler, eval_loaders, shapes = make_loaders(cfg, accelerator, splits, preprocessor)
    if cfg.streaming:  # the training split read as the run trains (finetune/streams.py)
        train_loader = sampler = TrainStream(cfg, accelerator, preprocessor, names)
    if cfg.torch_compile:
        check_compile(accelerator)
        compile_model(model, dynamic=shapes.dynamic, mode=cfg.torch_compile_mode)
    resume_path, manifest = resume_target(cfg, out, said)
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    train_data = train_data_fingerprint(cfg, built.digests)
    moved = manifest is not None and ckpt.check_resume_compatible(
        manifest, cfg, accelerator.num_processes, names, sampler.num_samples, fsdp, train_data
    )  # before anything is written: a resume that would change the run is refused now
    plan = plan_steps(cfg, accelerator.num_processes, sampler.num_samples, manifest, moved, said)
    ckpt.check_resume_fits(manifest, resume_path, plan.total_steps, cfg)  # a max_steps short of the checkpoint
    warn_of_later_checkpoints(out, resume_path, manifest, said)
    optimizer, trained = make_optimizer(cfg, model, accelerator)
    scheduler = make_scheduler(cfg, optimizer, plan)
    if cfg.push_to_hub_model_id:
        check_hub_access(cfg.push_to_hub_model_id)  # fail now, offline, not after training
    if accelerator.distributed_type == DistributedType.FSDP:
        configure_fsdp(accelerator, model)
    model, optimizer, train_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, scheduler)
    eval_loaders = {k: accelerator.prepare(v) for k, v in eval_loaders.items()}
    assert len(train_loader) == plan.batches, (len(train_loader), plan.batches)
    log = MetricsLog(accelerator, out.metrics)
    command = (manifest or {}).get("command") or launch_command()  # a resume keeps the run's first command
    checkpointer = ckpt.Checkpointer(accelerator, cfg, out.root, names, sampler.num_samples, command, train_data,
                                     said, stream=sampler if cfg.streaming else None)  # fmt: skip
    task, train = task_of(cfg.task), splits["train"].with_format(None)  # without an image transform's decoding
    weights, train_labels = task.sample_weights(splits["train"]), train["labels"]
    problem = problem_of(cfg.problem_type)
    trivial = problem.trivial(task.sample_labels(train, train_labels), train)
    balance = problem.class_weights(train_labels, len(names), cfg.class_weights)
    return Run(accelerator, out, model, preprocessor, splits, names, train_loader, sampler, weights, trivial,
               balance, eval_loaders, shapes,
               plan, optimizer, scheduler, trained, resume_path, manifest, log, checkpointer, held, cfg, said,
               built.digests)  # fmt: skip


def resume(cfg: TrainConfig, run: Run) -> tuple[int, int, int]:
    """Restore the checkpoint's weights, optimizer, scheduler and RNG; returns where the run stands:
    (optimizer step, epoch, samples consumed in that epoch), (0, 0, 0) for a fresh run."""
    if run.resume_path is None:
        return 0, 0, 0
    manifest = run.manifest
    ckpt.load_checkpoint(run.accelerator, run.resume_path, exact=not cfg.resume_allow_topology_change)
    ckpt.apply_optimizer_settings(run.optimizer, cfg)  # the checkpoint's weight decay and betas: this run's
    ckpt.apply_learning_rate(run.optimizer, run.scheduler, manifest, cfg.learning_rate, run.accelerator.print)
    run.checkpointer.resumed_from(run.resume_path, manifest, run.accelerator.print)  # says what this resume changes
    run.log.drop_after(manifest["step"])
    run.accelerator.print(
        f"resumed from {run.resume_path} at step {manifest['step']} (epoch {manifest['epoch'] + 1}, "
        f"{manifest['samples_in_epoch']} samples into it)"  # epochs counted from 1, as the console and metrics.jsonl
    )
    finished = read_record(run.dir.results).get("step")
    if finished == run.plan.total_steps > manifest["step"]:  # a finished run resumed as it was: said, not hidden
        run.accelerator.print(
            f"this run had finished (step {finished}, its export in {run.dir.model}): the resume trains steps "
            f"{manifest['step'] + 1} to {finished} again and writes the export again; to train on, raise "
            "num_train_epochs (or max_steps)"
        )
    return manifest["step"], manifest["epoch"], manifest["samples_in_epoch"]


def build_model_and_data(cfg: TrainConfig, accelerator: Accelerator, hooks: Hooks | None = None,
                         said: checks.Said | None = None):  # fmt: skip
    """The raw splits and label names, the config they resolve (the task and problem type a recipe left
    to the data), the model (frozen layers, attention kernel, activation checkpointing, LoRA as asked),
    its preprocessor, and the prepared splits. Data preparation runs on the main process first; the
    others read its cache. Each data file is read once."""
    hooks, said = hooks or Hooks(), said if said is not None else checks.Said()
    digests: dict[str, str] = {}  # each data file's sha256, from the one pass that also checks its bytes
    with hooks.phase("data"), main_process_first(accelerator):
        read = read_splits(cfg.data_args, said, digests)
        if cfg.task is None:  # the config leaves it to the data
            cfg = resolved(cfg, said, task=task_for_data(read["train"].features, cfg.data_args))
        raw, names = load_splits(cfg.data_args, said, read)
    cfg = resolved(cfg, said, problem_type=problem_type_of(raw["train"], cfg.task))  # and the metric it implies
    task = task_of(cfg.task)
    with hooks.phase("build"):
        model, preprocessor = build_for_training(cfg, accelerator, names, said)
    hooks.mark("built", model)
    for notice in task.notices(raw, preprocessor, cfg.data_args):
        accelerator.print(notice)
    with hooks.phase("data"), main_process_first(accelerator):
        splits = prepare_splits(cfg.data_args, raw, preprocessor, getattr(model.config, "num_channels", 3), said)
    return Built(model, preprocessor, splits, names, cfg, digests)


@dataclass
class Built:
    """What `build_model_and_data` makes: the model and its preprocessor, the prepared splits and their
    labels, the config the data resolved, and each data file's sha256 (by its resolved path)."""

    model: Any
    preprocessor: Any
    splits: Any
    labels: Labels  # what the outputs are, by name (finetune/problems/base.py)
    cfg: TrainConfig
    digests: dict[str, str]


def build_for_training(cfg: TrainConfig, accelerator: Accelerator, names: Labels, said: checks.Said):
    """The model as training wants it, and its preprocessor, checked against each other."""
    task = task_of(cfg.task)
    # A tokenizer's vocabulary sizes a model built from a config; an image processor follows the model's size.
    preprocessor = task.load_preprocessor(cfg.model_args) if task.preprocessor_first else None
    model = build_model(cfg.model_args, names, vocab_size=task.vocab_size(preprocessor), said=said)
    preprocessor = preprocessor or task.load_preprocessor(cfg.model_args, model.config)
    task.check_model(model, preprocessor, cfg.model_args, cfg.data_args)
    attn = attention_kernel(cfg.attn_implementation, accelerator.device, accelerator.mixed_precision,
                            sequence_tokens(task, cfg, model.config))  # fmt: skip
    # transformers before set_attn_implementation: an asked kernel is refused, the unasked choice skipped
    checks.gate(launch.ATTENTION, cfg.attn_implementation, model)
    if attn and hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(attn)
        except (ValueError, ImportError) as e:  # a model without that kernel
            raise checks.explain(launch.ATTENTION_FAILED, attn, e) from None
    if cfg.freeze_embeddings:
        model.get_input_embeddings().requires_grad_(False)
    if cfg.freeze_layers:
        freeze_layers(model, cfg.freeze_layers)
    checks.gate(launch.BATCHNORM, cfg, accelerator.device.type, batchnorm_layers(model), type(model).__name__)
    if cfg.freeze_batchnorm:  # the loaded statistics in training too: accumulation and DDP equal one big batch
        freeze_batchnorm(model)
    elif cfg.sync_batchnorm and accelerator.num_processes > 1:  # statistics over every process's batch
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # frozen weights of a model built at random; gradient checkpointing it lacks; LoRA under FSDP
    checks.gate(launch.MODEL, cfg, model, accelerator.distributed_type == DistributedType.FSDP, said=said)
    if cfg.gradient_checkpointing:
        # Non-reentrant: works under DDP and when the embeddings are frozen (inputs without grad).
        # transformers 5 renamed gradient_checkpointing_enable (deprecated there) to activation_checkpointing_enable.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.peft is not None:  # LoRA (finetune/lora.py): adapters and the head train, the rest is frozen
        model = apply_lora(model, cfg.peft)
    return model, preprocessor


def model_parallel_plan(cfg: TrainConfig, accelerator: Accelerator, model):
    """The layer split over this process's devices (finetune/parallel.py), printed. Under DDP each
    process splits its own replica over the devices of its local rank (`process_devices`)."""
    local = local_processes() if accelerator.num_processes > 1 else 1
    devices = process_devices(cfg.devices, accelerator.local_process_index, local)
    # GPipe keeps every chunk's activations until backward: plan for the whole batch.
    plan = plan_model_parallel(_inside_lora(model), devices, micro_batch_size=cfg.per_device_train_batch_size,
                               seq_len=task_of(cfg.task).sequence_length(cfg.data_args), max_memory=cfg.max_memory,
                               mixed_precision=accelerator.mixed_precision, local_processes=local)  # fmt: skip
    if accelerator.num_processes > 1:
        accelerator.print(f"each of the {accelerator.num_processes} processes splits its replica; process 0:")
    accelerator.print(plan.format_table())
    return plan


def split_model(cfg: TrainConfig, accelerator: Accelerator, model, said: checks.Said | None = None):
    """With `model_parallel=true`, the model with its layers on consecutive devices. Under LoRA the
    model inside peft's wrapper is split, adapters and all, and the wrapper is returned."""
    if not cfg.model_parallel:
        return model

    plan = model_parallel_plan(cfg, accelerator, model)
    checks.gate(launch.ONE_DEVICE, len(plan.stages), said=said if said is not None else checks.Said())
    if len(plan.stages) == 1:
        return model
    apply_model_parallel(_inside_lora(model), plan)
    return model


def _inside_lora(model):
    """The transformers model that LoRA wraps (its layers, with the adapters in them, are what the split
    places; peft's wrapper calls it, so its hooks run), or the model itself without LoRA."""
    return model.get_base_model() if is_lora(model) else model


def make_loaders(cfg: TrainConfig, accelerator: Accelerator, splits, preprocessor):
    """The training loader over the epoch sampler (length groups of one optimizer step; padded to whole
    global batches under DDP), the evaluation loaders, longest first where samples have lengths, and
    the run's shapes (length buckets, a compiled model's full batches: finetune/shapes.py) or None."""
    processes, batch = accelerator.num_processes, cfg.per_device_train_batch_size
    task, train_set = task_of(cfg.task), splits["train"]
    lengths = task.lengths(train_set) if cfg.group_by_length else None
    sampler = EpochSampler(len(train_set), cfg.seed, group_size=processes * batch * cfg.gradient_accumulation_steps,
                           lengths=lengths, pad_to=processes * batch if processes > 1 else 1,
                           listener=task.epoch_listener(train_set))  # fmt: skip
    collate, shapes = task.collator(preprocessor, cfg.pad_to_multiple_of), None
    if cfg.length_buckets or cfg.torch_compile:  # the shapes of one epoch and the evaluations decide them
        eval_lengths = [task.lengths(splits[split]) for split in ("validation", "test") if split in splits]
        shapes, collate = plan_shapes(cfg.length_buckets, cfg.torch_compile, cfg.pad_to_multiple_of, batch,
                                      cfg.per_device_eval_batch_size, (sampler.order(0), task.lengths(train_set)),
                                      eval_lengths, collate, train_set)  # fmt: skip
    workers, pin = data_workers(cfg, accelerator), pin_memory(cfg, accelerator)
    train_loader = DataLoader(train_set, batch_size=batch, sampler=sampler, collate_fn=collate, num_workers=workers,
                              pin_memory=pin, generator=torch.Generator().manual_seed(cfg.seed))  # fmt: skip
    # Evaluation reads text longest first: each batch is padded to nearly its own length (the metrics
    # do not depend on the order): 1.32 padded tokens per real one instead of 2.21 for the default recipe.
    eval_loaders = {}
    for split in ("validation", "test"):
        if split in splits:
            lengths = task.lengths(splits[split])
            eval_loaders[split] = DataLoader(
                splits[split], batch_size=cfg.per_device_eval_batch_size, collate_fn=collate, num_workers=workers,
                sampler=longest_first(lengths) if lengths else None, pin_memory=pin,
            )  # fmt: skip
    return train_loader, sampler, eval_loaders, shapes


def resume_target(cfg: TrainConfig, out: RunDir, said: checks.Said) -> tuple[Path | None, dict | None]:
    """The checkpoint to resume from and its manifest, or (None, None)."""
    if not cfg.resume_from_checkpoint:
        return None, None
    path = ckpt.resolve_checkpoint(cfg.resume_from_checkpoint, out.root, said)
    return path, ckpt.read_manifest(path)


def warn_of_later_checkpoints(out: RunDir, path: Path | None, manifest: dict | None, said: checks.Said) -> None:
    """A resume before this run's later checkpoints redoes them: said once the resume's checks passed."""
    if path is None:
        return
    mine = path.parent.resolve() == out.checkpoints.resolve()  # a checkpoint of this run: what came after it is redone
    # every later step's folder, a damaged one that `latest` skipped too: the run saves those steps again
    later = sorted((p for p in out.checkpoints.iterdir() if p.is_dir() and (step_of(p) or 0) > manifest["step"]),
                   key=step_of) if mine else []  # fmt: skip
    checks.gate(launch.LATER, path, [p.name for p in later], out.model, manifest["step"], said=said)


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
    return steps.make_scheduler(cfg.lr_scheduler_type, optimizer, plan.warmup, plan.total_steps)


def start_run(cfg: TrainConfig, run: Run) -> None:
    """A fresh run sets aside what `overwrite_output_dir` replaces; then the resolved config, the
    trackers and the start summary."""
    accelerator, plan = run.accelerator, run.plan
    with agreed(accelerator):
        if accelerator.is_main_process:
            run.dir.root.mkdir(parents=True, exist_ok=True)
            if run.held is not None:  # before anything is set aside or written: not a run still going
                run.held.enter_context(in_use(run.dir))
            if cfg.overwrite_output_dir and not resumes_here(run.dir.root, cfg.resume_from_checkpoint) and run.dir.holds_run():
                # Only what a run writes, only where a run was; it comes back if this run fails early.
                set_aside_previous_run(run.dir)
            save_config(cfg, run.dir.config)
    if cfg.report_to:
        scalars = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(run.dir.root.name, config=scalars)
    processes, batch, accumulation = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    threads = f" x {torch.get_num_threads()} threads" if accelerator.device.type == "cpu" else ""
    task = task_of(cfg.task)
    unwrapped = accelerator.unwrap_model(run.model)
    total = sum(p.numel() for p in unwrapped.parameters())  # DTensor: global
    base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped  # under LoRA
    name = type(base).__name__.removeprefix("FSDP")  # fully_shard's subclass
    problem = run.problem.start_words()
    trained_on = run.sampler.describe() if cfg.streaming else task.counted(run.splits["train"])
    accelerator.print(
        f"{cfg.task}{problem}: {name}, train {trained_on} / validation "
        f"{task.counted(run.splits['validation'])}, {processes} process(es) on {accelerator.device}{threads} "
        f"({accelerator.distributed_type}), precision {accelerator.mixed_precision}, global batch "
        f"{processes * batch * accumulation} ({processes} x {batch} x {accumulation} accumulation), "
        f"{plan.total_steps} optimizer steps, {run.trained:,} of {total:,} weights trained"
        + (f" (LoRA r={cfg.peft['r']} and the head)" if cfg.peft else "")
    )
    accelerator.print(describe_parameters(accelerator, run.model, cfg.pipeline_chunks))
    if run.shapes is not None:
        accelerator.print(run.shapes.describe())


# --- what the loop keeps track of -----------------------------------------------------------------


class Evaluations:
    """The validation evaluations of a run: logged, printed, the last kept, and early stopping counted
    (evaluations without improvement of metric_for_best_model, `early_stopping_patience`)."""

    def __init__(self, cfg: TrainConfig, run: Run, hooks: Hooks):
        self.cfg, self.run, self.hooks = cfg, run, hooks
        self.last: dict = {}
        self.best: float | None = None
        self.top: tuple[int, float] | None = None  # (step, value) of the best evaluation by judged_metric
        self.without_improvement, self.stale = 0, False

    def evaluate(self, step: int, epoch: int) -> dict:
        with self.hooks.phase("evaluate"):
            self.last = evaluate_split(self.cfg, self.run, "validation")
        scalars = {f"eval_{k}": v for k, v in self.last.items() if isinstance(v, (int, float))}
        self.run.log.log({"epoch": epoch + 1, **scalars}, step)  # counted from 1, as the console does
        if self.run.accelerator.is_main_process:  # above the training bar
            tqdm.write(f"step {step} (epoch {epoch + 1}): validation {summary_line(self.last)}")
        self.hooks.mark("evaluated", (step, self.last))
        key = judged_metric(self.cfg)
        if isinstance(self.last.get(key), (int, float)) and (self.top is None or better(key, self.last[key], self.top[1])):
            self.top = (step, self.last[key])
        value = self.last.get(self.cfg.metric_for_best_model)
        if self.cfg.early_stopping_patience is not None and value is not None:
            sign = 1 if self.cfg.greater_is_better else -1
            if self.best is None or sign * (value - self.best) > 0:
                self.best, self.without_improvement = value, 0
            else:
                self.without_improvement += 1
            self.stale = self.without_improvement >= self.cfg.early_stopping_patience
        return self.last


def evaluate_split(cfg: TrainConfig, run: Run, split: str, threshold=None, keep_predictions: bool = False) -> dict:
    """The metrics of the run's problem type on one split (finetune/evaluation.py); multi-label at
    `threshold` (default multi_label_threshold: one, or one per label)."""
    threshold = run.problem.default_threshold(cfg) if threshold is None else threshold
    with evaluation_attention(cfg, run.accelerator, run.model):
        return evaluate_model(run.model, run.eval_loaders[split], run.accelerator, run.labels, cfg.pipeline_chunks,
                              cfg.problem_type, threshold, keep_predictions, trivial=run.trivial,
                              rows=run.rows("eval"), data=cfg.data_args)  # fmt: skip


def finish(cfg: TrainConfig, run: Run, step: int, evaluations: Evaluations, hooks: Hooks) -> dict[str, Any]:
    """The weights checked, the last evaluation (or one now), the weights to export chosen, the test
    split scored, the export written."""
    if not ckpt.all_finite(run.model, run.accelerator):
        raise ckpt.diverged("the weights became NaN or infinite", step, run.checkpointer.last)
    results: dict[str, Any] = {"step": step, "command": run.checkpointer.command,
                               "validation": evaluations.last or evaluations.evaluate(step, run.plan.num_epochs - 1)}  # fmt: skip
    if run.checkpointer.resumed_with:  # the settings resumes changed: config.yaml holds only the last values
        results["resumed_with"] = run.checkpointer.resumed_with
    with hooks.phase("evaluate"):
        results["exported"] = choose_export(cfg, run, step, results)
        threshold, never = tune_on_validation(cfg, run, results)
        if "test" in run.eval_loaders:
            results["test"] = evaluate_split(cfg, run, "test", threshold)
    if run.shapes is not None:
        results["shapes"] = run.shapes.record()
    results["learned"] = judge(cfg, results["validation"], run.checkpointer.best, results.get("validation_tuned"),
                               evaluations.top)
    if results["learned"]["verdict"] and hooks.verdicts:
        run.accelerator.print(f"learned: {results['learned']['said']}")
    if hooks.verdicts:  # a search's trials: the search's end says whether its best learned
        checks.gate(tools.VERDICT, results["learned"], run.said.rules(), cfg.streaming, said=run.said)
        verdicts = {rule.id for rule in tools.VERDICT}  # the card says what the verdict's rule said
        results["learned"]["said"] = next((line for rule, line in run.said.lines if rule in verdicts), results["learned"]["said"])
        checks.gate(tools.PREDICTED, never, run.labels, cfg.problem_type, said=run.said)
    with hooks.phase("export"):
        export_run(cfg, run.accelerator, run.model, run.preprocessor, results, run.labels, run.checkpointer.best,
                   seconds=hooks.so_far, digests=run.digests, said=run.said)  # fmt: skip
    return results


def tune_on_validation(cfg: TrainConfig, run: Run, results: dict) -> tuple[Any, list[str]]:
    """A thresholded problem's threshold tuned on validation (`Problem.tune`: multi-label's with
    tune_threshold, question answering's null score where validation has unanswerable questions); the test
    split and the export use it (config.json: `Problem.store_threshold`); and the classes or labels the
    validation predictions never chose (said by `tools.never_predicted`)."""
    problem = run.problem
    threshold, validation, predictions = problem.default_threshold(cfg), results["validation"], None
    if problem.thresholded:  # a threshold the starting model's config kept from its own tuning is not this model's
        problem.store_threshold(run.accelerator.unwrap_model(run.model).config, None)
    if problem.thresholded and problem.may_tune(run.splits["validation"]):
        scored = evaluate_split(cfg, run, "validation", keep_predictions=True)
        predictions = scored.pop("predictions")
        tuned = problem.tune(predictions, scored.pop("references", None), cfg)
        if tuned is not None:
            threshold = tuned
            results["validation_tuned"] = validation = evaluate_split(cfg, run, "validation", threshold)
            problem.store_threshold(run.accelerator.unwrap_model(run.model).config, threshold)
    never = never_predicted(validation, predictions if problem.lists else None, run.labels, threshold)
    return threshold, never


def choose_export(cfg: TrainConfig, run: Run, step: int, results: dict) -> dict:
    """Which weights the export holds: the last step's, or with load_best_model_at_end the best
    checkpoint's, loaded here (its validation metrics replace the last step's in `results`)."""
    best = run.checkpointer.best
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
    ckpt.load_checkpoint(run.accelerator, Path(best["path"]))
    results["validation"] = evaluate_split(cfg, run, "validation")
    return {"step": best["step"], "why": f"the best checkpoint, step {best['step']}, by validation {metric} {value:.4f}"}


# --- the modes that do not train --------------------------------------------------------------------


def dry_run(cfg: TrainConfig, said: checks.Said) -> dict[str, Any]:
    """What a run would do, without doing it: printed on the main process and returned."""
    accelerator = make_accelerator(cfg, said)
    out = RunDir(cfg.output_dir)
    check_output_dir(out.root, cfg.overwrite_output_dir, cfg.resume_from_checkpoint, bool(cfg.report_to), said)
    set_seed(cfg.seed)
    built = build_model_and_data(cfg, accelerator, said=said)
    model, splits, names, cfg = built.model, built.splits, built.labels, built.cfg
    processes, batch, accumulation = accelerator.num_processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    resume_path, manifest = resume_target(cfg, out, said)
    moved = manifest is not None and ckpt.check_resume_compatible(
        manifest, cfg, processes, names, samples_of(cfg, splits["train"]),
        accelerator.distributed_type == DistributedType.FSDP, train_data_fingerprint(cfg, built.digests),
    )
    plan = plan_steps(cfg, processes, samples_of(cfg, splits["train"]), manifest, moved, said)
    ckpt.check_resume_fits(manifest, resume_path, plan.total_steps, cfg)
    warn_of_later_checkpoints(out, resume_path, manifest, said)
    optimizer, _ = make_optimizer(cfg, model, accelerator)
    lam = make_scheduler(cfg, optimizer, plan).lr_lambdas[0]
    summary = {
        "devices": str(accelerator.device), "processes": processes, "distributed_type": str(accelerator.distributed_type),
        **({"cpu_threads_per_process": torch.get_num_threads()} if accelerator.device.type == "cpu" else {}),
        "mixed_precision": accelerator.mixed_precision, "train_samples": plan.samples,
        "per_device_train_batch_size": batch, "gradient_accumulation_steps": accumulation,
        "global_batch_size": processes * batch * accumulation,
        "batches_per_process_per_epoch": plan.batches, "optimizer_steps_per_epoch": plan.steps_per_epoch,
        "total_optimizer_steps": plan.total_steps, "warmup_steps": plan.warmup,
        "first_learning_rate": cfg.learning_rate * lam(0),
        "last_learning_rate": cfg.learning_rate * lam(plan.total_steps - 1),
    }  # fmt: skip
    if cfg.streaming:  # one unbounded epoch: its length is the stream's, unknown until read
        summary.update(train_samples=f"a stream ({plan.total_steps * processes * batch * accumulation:,} samples in "
                       f"max_steps={plan.total_steps})", batches_per_process_per_epoch="-", optimizer_steps_per_epoch="-")
    width = max(map(len, summary))
    accelerator.print("\n".join(f"{k:<{width}}  {v}" for k, v in summary.items()))
    return summary


def plan_only(cfg: TrainConfig, said: checks.Said) -> dict[str, Any]:
    """The model-parallel plan, printed, without training."""
    checks.gate(launch.PLAN_ONLY, cfg)
    accelerator = make_accelerator(cfg, said)
    built = build_model_and_data(cfg, accelerator, said=said)
    return {"plan": model_parallel_plan(built.cfg, accelerator, built.model).format_table()}


# --- command line ---------------------------------------------------------------------------------


@exit_on_user_error
def main(argv: list[str] | None = None, hooks: Hooks | None = None, command: Command | None = None,
         said: checks.Said | None = None) -> dict[str, Any]:  # fmt: skip
    """The entry point: `argv` as the command line gives it (or the `command` finetune/cli.py parsed from
    it); `hooks` for a tool that observes the run; `said`: warnings several runs share (finetune.verify's)."""
    stop_outside_the_loop()
    command = command or parse_command_line(sys.argv[1:] if argv is None else argv, said)
    cfg = command.cfg
    if command.saved is not None and os.environ.get("RANK", "0") == "0":
        print(f"resuming with the run's own recipe {command.saved} (--config chooses another)")
    quiet_libraries(cfg.log_level)
    if command.plan_only:
        return plan_only(cfg, command.said)
    if command.dry_run:
        return dry_run(cfg, command.said)
    results = train(cfg, hooks, command.said)
    end_processes()
    return results


def cli(command: Command | None = None) -> None:
    stop_with_launcher()
    main(command=command)


if __name__ == "__main__":
    stop_with_launcher()
    main(command=EARLY)
