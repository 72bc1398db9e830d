"""The textbook loops the app is measured against, written the way their sources are:

- `nlp_example` (python -m benchmarks.bench): accelerate's `examples/nlp_example.py`: shuffled
  batches, dynamic padding to the longest in the batch, `AdamW(model.parameters(), lr)` with default
  arguments, `accelerator.prepare/backward`, the recipe's LR schedule, nothing else;
- `run_glue` (python -m benchmarks.time_to_accuracy): transformers'
  `examples/pytorch/text-classification/run_glue_no_trainer.py` at its documented defaults (`RUN_GLUE`);
- `run_ner` (python -m benchmarks.ner_peer): transformers'
  `examples/pytorch/token-classification/run_ner_no_trainer.py` at its documented defaults
  (`RUN_NER`), scored as `evaluate`'s seqeval metric scores (`seqeval_scores`).

The first two take the recipe's model and data as the app builds them before its own choices
(`model_and_data`: same seed, so the same initial weights; nothing frozen; the model's default
attention kernel; the recipe's `dropout`, which `build_model` applies), batches collated by the
task's collator without a multiple (for text that is `tokenizer.pad(padding="longest")`, the
sources' own collate function), one loop (`textbook_steps`) and one evaluation (`accuracy`). The
loop calls the marks of `finetune.run.Hooks` where the app's loop does, so benchmarks/recorder.py
times both loops by one rule. `run_ner` takes only the recipe's files, training split and model name
and does the rest the script's own way (its label list, tokenization, truncation, model loading),
since those are what the app's token task does differently.
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
                loss = model(**textbook_inputs(batch)).loss
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


def textbook_inputs(batch: dict[str, Any], labels: bool = True) -> dict[str, Any]:
    """What the sources pass to `model(**batch)`, from a batch of the task's collator: its `meta` (the
    app's record of what a row is) left out; a span's (start, end) labels as the QA model's own
    `start_positions` and `end_positions`, as `run_qa_no_trainer.py` feeds them. `labels=False`: an
    evaluation's inputs, without them."""
    inputs = {k: v for k, v in batch.items() if k not in ("meta", "labels")}
    given = batch.get("labels")
    if not labels or given is None:
        return inputs
    if "offsets" in batch.get("meta", {}):  # spans: (start, end) token of each window
        return {**inputs, "start_positions": given[:, 0], "end_positions": given[:, 1]}
    return {**inputs, "labels": given}


def argmax_hits(output, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sources' evaluation at its simplest, for any head: the argmax of the logits against the
    labels, where a label is given (not -100: a tagger's padding and later subwords). A QA window is a
    hit where both its start and end tokens are right. Returns (hits, counted), one per labelled place."""
    if hasattr(output, "start_logits"):
        hits = (output.start_logits.argmax(-1) == labels[:, 0]) & (output.end_logits.argmax(-1) == labels[:, 1])
        return hits, torch.ones_like(hits)
    return output.logits.argmax(-1) == labels, labels != -100


@torch.no_grad()
def accuracy(model, loader, accelerator: Accelerator) -> tuple[float, int]:
    """The sources' evaluation: argmax of the logits against the labels (`argmax_hits`: a token for a
    tagger, start and end for a QA window), gathered over processes (`gather_for_metrics` drops the
    samples Accelerate repeats to even out the last batch). Returns (accuracy, samples)."""
    model.eval()
    correct = counted = samples = 0
    for batch in loader:
        output = model(**textbook_inputs(batch, labels=False))
        hits, labelled = argmax_hits(output, batch["labels"])
        if hits.dim() > 1:  # a tagger's sentences: as long as the longest on any process
            hits, labelled = accelerator.pad_across_processes((hits, labelled), dim=1)
        hits, labelled = accelerator.gather_for_metrics((hits, labelled))
        correct += int((hits & labelled.bool()).sum())
        counted += int(labelled.sum())
        samples += len(hits)
    model.train()
    return correct / max(counted, 1), samples


@torch.no_grad()
def plain_evaluation(model, loader) -> dict[str, Any]:
    """A plain `model.eval()` loop over one process's batches: the forward passes and nothing else (no
    gather, no metric), timed: what an evaluation costs at the least with this batch size."""
    model.eval()
    synchronize(next(model.parameters()).device)
    rows, t = 0, time.perf_counter()
    for batch in loader:
        output = model(**textbook_inputs(batch, labels=False))
        rows += len(output[0])
    synchronize(next(model.parameters()).device)
    seconds = time.perf_counter() - t
    model.train()
    return {"seconds": seconds, "rows": rows, "batches": len(loader)}


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
    # the validation split, as the app's evaluations read it, by a plain loop with the app's eval batch
    validation = loaders(cfg, preprocessor, splits, cfg.per_device_eval_batch_size, "validation", pad_to)[1]
    return {
        "optimizer_steps": steps,
        "eval_accuracy": share,
        "eval_samples": samples,
        "communication_s": all_reduce_seconds(accelerator, model),
        "plain_validation": plain_evaluation(model, accelerator.prepare(validation)),
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


# --- token classification: run_ner_no_trainer.py --------------------------------------------------------

# run_ner_no_trainer.py's defaults (examples/pytorch/token-classification): batch 8 for training and
# evaluation, AdamW at 5e-5 without weight decay, linear decay without warm-up, 3 epochs, truncation
# at 128 subwords, no `--label_all_tokens` (first subwords labelled, the rest -100).
RUN_NER = {
    "batch": 8, "eval_batch": 8, "learning_rate": 5e-5, "epochs": 3, "max_length": 128,
    "weight_decay": 0.0, "num_warmup_steps": 0, "label_all_tokens": False,
}  # fmt: skip


def seqeval_scores(predictions: list[list[str]], references: list[list[str]]) -> dict[str, float]:
    """What `evaluate.load("seqeval").compute(predictions, references)` returns overall, at its default
    config (no scheme, no mode: seqeval's conlleval-style default, where an I-X after O still starts
    an entity; zero_division "warn", which scores 0), computed with seqeval directly: `evaluate`
    fetches its metric scripts from the Hub at run time, which fails offline."""
    import warnings

    from seqeval.metrics import accuracy_score, classification_report

    with warnings.catch_warnings():  # "warn" warns of a zero division and scores it 0
        warnings.simplefilter("ignore")
        report = classification_report(
            y_true=references, y_pred=predictions, suffix=False, output_dict=True, scheme=None, mode=None,
            sample_weight=None, zero_division="warn",
        )  # fmt: skip
    overall = report["micro avg"]
    return {
        "overall_precision": float(overall["precision"]),
        "overall_recall": float(overall["recall"]),
        "overall_f1": float(overall["f1-score"]),
        "overall_accuracy": float(accuracy_score(y_true=references, y_pred=predictions)),
    }


def run_ner(cfg: TrainConfig, epochs: int, eval_steps: int, hooks: Hooks) -> dict[str, Any]:
    """run_ner_no_trainer.py at its defaults (`RUN_NER`) on the recipe's model and data: the training
    split is the app's (`load_splits`: the recipe's files, its seeded held-out share removed), the
    test split is scored. Its own steps, as the script takes them: label list sorted from the training
    tags, `AutoModelForTokenClassification.from_pretrained` with the model's own dropout and attention
    kernel, every sentence tokenized whole and truncated at 128 subwords, first subwords labelled,
    `DataCollatorForTokenClassification` without a multiple (fp32), shuffled batches of 8, AdamW at
    5e-5 (its two parameter groups both without decay), linear decay without warm-up, fp32.
    Evaluated on the test split every `eval_steps` optimizer steps and at the end, each inside phase
    "evaluate"; each evaluation keeps the word-level tag names of every sentence (labels other than
    -100, as the script's `get_labels`)."""
    from transformers import (
        AutoConfig,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
    )

    accelerator = Accelerator(mixed_precision="no")
    set_seed(cfg.seed)
    column = cfg.tokens_column
    with hooks.phase("data"):
        raw, names = load_splits(cfg.data_args)
        raw = {split: raw[split].map(lambda row: {"tags": [names[i] for i in row["labels"]]}, remove_columns=["labels"])
               for split in ("train", "test")}  # fmt: skip
        label_list = sorted({tag for tags in raw["train"]["tags"] for tag in tags})  # get_label_list
        label_to_id = {label: i for i, label in enumerate(label_list)}
    with hooks.phase("build"):
        name, spec = cfg.model_name_or_path, dict(cfg.model_config or {})
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_name or name, use_fast=True)
        if spec:  # the script's --model_type path, for a tiny model (--smoke)
            spec.setdefault("vocab_size", len(tokenizer))
            config = AutoConfig.for_model(spec.pop("model_type"), **spec, num_labels=len(label_list))
            model = AutoModelForTokenClassification.from_config(config)
        else:
            config = AutoConfig.from_pretrained(name, num_labels=len(label_list))
            model = AutoModelForTokenClassification.from_pretrained(name, config=config)
        model.config.label2id = dict(label_to_id)
        model.config.id2label = dict(enumerate(label_list))
    hooks.mark("built", model)

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(examples[column], max_length=RUN_NER["max_length"], padding=False,
                              truncation=True, is_split_into_words=True)  # fmt: skip
        labels = []
        for i, tags in enumerate(examples["tags"]):
            previous, ids = None, []
            for word in tokenized.word_ids(batch_index=i):
                ids.append(-100 if word is None or word == previous else label_to_id[tags[word]])
                previous = word
            labels.append(ids)
        tokenized["labels"] = labels
        return tokenized

    with hooks.phase("data"):
        processed = {split: raw[split].map(tokenize_and_align_labels, batched=True,
                                           remove_columns=raw[split].column_names, desc="tokenizing")
                     for split in ("train", "test")}  # fmt: skip
    collate = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=None)
    train_dl = DataLoader(processed["train"], shuffle=True, collate_fn=collate, batch_size=RUN_NER["batch"])
    test_dl = DataLoader(processed["test"], collate_fn=collate, batch_size=RUN_NER["eval_batch"])
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": RUN_NER["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(groups, lr=RUN_NER["learning_rate"])
    total = epochs * len(train_dl)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=RUN_NER["num_warmup_steps"], num_training_steps=total)
    model, optimizer, train_dl, test_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, test_dl, scheduler)
    evaluations = []
    for step in textbook_steps(accelerator, model, optimizer, scheduler, train_dl, total, hooks):
        if step % eval_steps == 0 or step == total:
            with hooks.phase("evaluate"):
                predicted, gold = tag_names(model, test_dl, accelerator, label_list)
            evaluations.append({"step": step, "predictions": predicted, "references": gold})
    return {"optimizer_steps": total, "label_list": label_list, "evaluations": evaluations}


@torch.no_grad()
def tag_names(model, loader, accelerator: Accelerator, label_list: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """run_ner_no_trainer.py's evaluation: argmax per subword, predictions and labels padded across
    processes and gathered, then per sentence the tag names where the label is not -100."""
    model.eval()
    predicted, gold = [], []
    for batch in loader:
        predictions = model(**batch).logits.argmax(dim=-1)
        predictions = accelerator.pad_across_processes(predictions, dim=1, pad_index=-100)
        labels = accelerator.pad_across_processes(batch["labels"], dim=1, pad_index=-100)
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        for pred, ref in zip(predictions.tolist(), labels.tolist(), strict=True):
            predicted.append([label_list[p] for p, r in zip(pred, ref, strict=True) if r != -100])
            gold.append([label_list[r] for r in ref if r != -100])
    model.train()
    return predicted, gold
