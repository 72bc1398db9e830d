"""The textbook loops the app is measured against, written the way their sources are:

- `nlp_example` (python -m benchmarks.bench): accelerate's `examples/nlp_example.py`: shuffled
  batches, dynamic padding to the longest in the batch, `AdamW(model.parameters(), lr)` with default
  arguments, `accelerator.prepare/backward`, the recipe's LR schedule, nothing else;
- `run_glue` (python -m benchmarks.time_to_accuracy): transformers'
  `examples/pytorch/text-classification/run_glue_no_trainer.py` at its documented defaults (`RUN_GLUE`).

Both take the recipe's model and data as the app builds them before its own choices
(`model_and_data`: same seed, so the same initial weights; nothing frozen; the model's default
attention kernel; the recipe's `dropout`, which `build_model` applies), batches collated by the
task's collator without a multiple (for text that is `tokenizer.pad(padding="longest")`, the
sources' own collate function), one loop (`textbook_steps`) and one evaluation (`accuracy`). The
loop calls the marks of `finetune.run.Hooks` where the app's loop does, so benchmarks/recorder.py
times both loops by one rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import get_scheduler

from benchmarks.peak import synchronize
from finetune.config import TrainConfig
from finetune.data import load_splits, prepare_splits
from finetune.models import build_model, load_preprocessor
from finetune.run import Hooks
from finetune.tasks import task_of

# run_glue_no_trainer.py's defaults.
RUN_GLUE = {"batch": 8, "learning_rate": 5e-5, "epochs": 3, "max_length": 128, "weight_decay": 0.0}


def model_and_data(cfg: TrainConfig, hooks: Hooks):
    """The recipe's model, seeded as `train()` seeds it, without the app's choices (freezing, attention
    kernel, LoRA), its preprocessor and the prepared splits; phases "data" and "build" as the app's."""
    set_seed(cfg.seed)
    task = task_of(cfg.task)
    with hooks.phase("data"):
        raw, label_names = load_splits(cfg.data_args)
    with hooks.phase("build"):
        tokenizer = load_preprocessor(cfg.model_args) if task.preprocessor_first else None
        model = build_model(cfg.model_args, label_names, vocab_size=task.vocab_size(tokenizer))
        preprocessor = tokenizer or load_preprocessor(cfg.model_args, model.config)
    hooks.mark("built", model)
    with hooks.phase("data"):
        splits = prepare_splits(cfg.data_args, raw, preprocessor, getattr(model.config, "num_channels", 3))
    return model, preprocessor, splits


def loaders(
    cfg: TrainConfig, preprocessor, splits, batch_size: int, eval_split: str, pad_to: int | None = None
):
    """Shuffled training batches and the evaluation split's batches, padded to the longest in the
    batch (`pad_to`: to that many tokens, the bench's --seq-len)."""
    collate = task_of(cfg.task).collator(preprocessor, pad_to)
    train = DataLoader(splits["train"], shuffle=True, batch_size=batch_size, collate_fn=collate)
    evaluation = DataLoader(splits[eval_split], batch_size=cfg.per_device_eval_batch_size, collate_fn=collate)
    return train, evaluation


def textbook_steps(
    accelerator: Accelerator, model, optimizer, scheduler, loader, total: int, hooks: Hooks
) -> Iterator[int]:
    """The sources' loop, over the loader's epochs until `total` optimizer steps. Yields each step's
    number after its update (the caller evaluates there, inside phase "evaluate"), then marks it."""
    if len(loader) == 0:
        raise ValueError("the training loader has no batches")
    step = 0
    model.train()
    with hooks.phase("train"):
        while step < total:
            for batch in loader:
                hooks.mark("batch", batch)
                loss = model(**batch).loss
                hooks.mark("backward")
                accelerator.backward(loss)
                hooks.mark("optimizer")
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                hooks.mark("micro-batch done")
                step += 1
                yield step
                hooks.mark("step", step)
                if step >= total:
                    return


@torch.no_grad()
def accuracy(model, loader, accelerator: Accelerator) -> tuple[float, int]:
    """The sources' evaluation: argmax of the logits against the labels, gathered over processes
    (`gather_for_metrics` drops the samples Accelerate repeats to even out the last batch).
    Returns (accuracy, samples)."""
    model.eval()
    correct = total = 0
    for batch in loader:
        preds, refs = accelerator.gather_for_metrics((model(**batch).logits.argmax(-1), batch["labels"]))
        correct += int((preds == refs).sum())
        total += len(refs)
    model.train()
    return correct / total, total


def nlp_example(
    cfg: TrainConfig, steps: int, eval_split: str, hooks: Hooks, pad_to: int | None = None
) -> dict[str, Any]:
    """accelerate's nlp_example on the recipe's model, data, precision (Accelerate's config),
    batch size and schedule, for `steps` optimizer steps, then evaluated on `eval_split`."""
    accelerator = Accelerator()
    model, preprocessor, splits = model_and_data(cfg, hooks)
    train_dl, eval_dl = loaders(
        cfg, preprocessor, splits, cfg.per_device_train_batch_size, eval_split, pad_to
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * steps)
    name = cfg.lr_scheduler_type if cfg.lr_scheduler_type != "constant" else "constant_with_warmup"
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, scheduler
    )
    for _ in textbook_steps(accelerator, model, optimizer, scheduler, train_dl, steps, hooks):
        pass  # nothing between steps: one evaluation at the end
    with hooks.phase("evaluate"):
        share, samples = accuracy(model, eval_dl, accelerator)
    return {
        "optimizer_steps": steps,
        "eval_accuracy": share,
        "eval_samples": samples,
        "communication_s": all_reduce_seconds(accelerator, model),
    }


def run_glue(cfg: TrainConfig, epochs: int, eval_steps: int, hooks: Hooks) -> dict[str, Any]:
    """run_glue_no_trainer.py at its defaults (`RUN_GLUE`; `cfg` gives the model, data files and
    max_length): fp32, batch 8, AdamW at 5e-5 without weight decay (its two parameter groups, with
    and without decay, are then one), linear decay without warm-up over `epochs`. Evaluated on the
    test split every `eval_steps` optimizer steps and at the end, each inside phase "evaluate"."""
    accelerator = Accelerator(mixed_precision="no")
    model, tokenizer, splits = model_and_data(cfg, hooks)
    train_dl, test_dl = loaders(cfg, tokenizer, splits, RUN_GLUE["batch"], "test")
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=RUN_GLUE["learning_rate"], weight_decay=RUN_GLUE["weight_decay"]
    )
    total = epochs * len(train_dl)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=total)
    model, optimizer, train_dl, test_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, test_dl, scheduler
    )
    evaluations = []
    for step in textbook_steps(accelerator, model, optimizer, scheduler, train_dl, total, hooks):
        if step % eval_steps == 0 or step == total:
            with hooks.phase("evaluate"):
                evaluations.append({"step": step, "accuracy": accuracy(model, test_dl, accelerator)[0]})
    return {"optimizer_steps": total, "evaluations": evaluations}


def all_reduce_seconds(accelerator: Accelerator, model: torch.nn.Module, reps: int = 5) -> float:
    """Seconds to all-reduce one flat fp32 tensor the size of the gradients, the best of `reps` (0 with
    one process). DDP overlaps it with backward, so the backward phase already holds it."""
    if accelerator.num_processes == 1:
        return 0.0
    import torch.distributed as dist

    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = torch.zeros(n, device=accelerator.device)
    dist.all_reduce(flat)
    best = math.inf
    for _ in range(reps):
        synchronize(accelerator.device)
        t = time.perf_counter()
        dist.all_reduce(flat)
        synchronize(accelerator.device)
        best = min(best, time.perf_counter() - t)
    return best
