"""The question-answering peer benchmark: validation exact match and F1, and training time, of the
app's QA recipe and of transformers' `run_qa_no_trainer.py` given the same model, data and settings.

    python -m benchmarks.qa_peer --out benchmarks/results                      # the full data: long on 2 cores
    python -m benchmarks.qa_peer --out benchmarks/results --override max_train_samples=2000
    python -m benchmarks.qa_peer --match-peer --out benchmarks/results/qa_peer_matched  # the script's choices
    python -m benchmarks.qa_peer --smoke --out /tmp/qa_peer                    # tiny models: the test's run

Writes `qa_peer.json` and `qa_peer.md` into --out. Where each number comes from:

- **settings**: one config, `finetune/configs/bert_qa.yaml` with the benchmark's `--override`s (a subset
  of the training questions, `max_length`...), gives both loops the model, the files, the first
  `max_train_samples` training questions (every window they make: the script's own
  `--max_train_samples` would also cut the windows to that many, which drops some of the last questions'
  windows), the validation questions, `max_length`, `doc_stride`, `n_best_size`, `max_answer_length`, the
  epochs, the training batch, the evaluation batch, the learning rate, the weight decay, the linear
  schedule and its warm-up (the recipe's `warmup_ratio` as the script's `--num_warmup_steps`, the same
  integer the app computes) and the seed: all of them options of the script, set to the recipe's
  values (the recipe's are tuned for this model and one epoch; the script's defaults, 5e-5 and 3 epochs,
  are BERT-base's on the whole of SQuAD). What the script has no option for stays each side's own: the
  app keeps its recipe's word embeddings frozen, batches windows of similar length (`group_by_length`),
  pads to a multiple of 8, clips the gradients at norm 1, uses the fused AdamW, and leaves padding out of
  the loss's softmax; the script trains every weight, shuffles, pads each batch to its longest window,
  does not clip, uses torch's default AdamW, and its model's loss counts padded positions.
- **app**: the real `finetune.run.train(cfg, hooks)` in this process (`--precision`, default fp32, the
  script's precision). Its metrics are what it reports for the validation split (the evaluation at the
  end of its epoch; finetune/squad.py's `best_answer` and `squad_report`).
- **peer**: `run_qa_no_trainer.py` and its `utils_qa.postprocess_qa_predictions` (transformers'
  examples/pytorch/question-answering, as stored at the commits named in `PEER_SOURCE`; the script is
  the same in transformers 5.x), written below as their steps are written there (`run_peer`,
  `prepare_train_features`, `prepare_validation_features`, `postprocess_qa_predictions`), fp32.
  Differences: the data is read with `load_dataset("json", data_files=...)` without `field="data"` (the
  bundled files are JSON Lines in the Hub's layout; the script asks for a nested `.json`), no output
  folder is written, and its predictions are scored by the app's scorer.
- **scoring**: both sides' answers are scored by one function, `finetune.squad.squad_report`
  (the official SQuAD v1.1 script's normalisation, exact match and F1, the best over the gold answers;
  `tests/test_squad.py` holds it to the official functions). The script's own `evaluate.load("squad")`
  fetches the metric from the Hub, which fails offline. `agreement`: the share of validation questions
  both sides answer with the same text (the app's answers from one more evaluation after its run, off
  its clock).
- **the clock**: from the start of each run (data loading, tokenization and model building included)
  to its last optimizer step, evaluations left out (`training_s`); `evaluation_s` is the final
  validation evaluation (forward, answer extraction and scoring); `training_cpu_s` is the CPU time this
  process spent over `training_s`. Imports are not in it. The **ratio** is peer training seconds / app
  training seconds (> 1: the app trains sooner); the two runs follow each other in one process.
- **load**: the machine is shared: before each run the benchmark waits (up to `--quiet-wait` seconds)
  until the 1-minute load average is below `--quiet-load`, and records the load average at its start
  and end.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.ner_peer import Clock, wait_for_quiet
from benchmarks.recipes import RESERVED_OVERRIDES, SMOKE, check_arguments
from benchmarks.report import machine, machine_line, write_report
from benchmarks.runs import environment, reset_accelerate
from finetune.config import CONFIGS_DIR, REPO_DIR, TrainConfig, load_config
from finetune.evaluation import evaluate_model
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.run import train
from finetune.runtime import cpu_threads
from finetune.squad import squad_report

RECIPE = CONFIGS_DIR / "bert_qa.yaml"
# The peer's sources as read (transformers' repository; the script asks check_min_version("4.51.0.dev0")
# and is the one transformers 5.x ships in its examples).
PEER_SOURCE = {
    "run_qa_no_trainer.py": "examples/pytorch/question-answering/run_qa_no_trainer.py @ 015bfeb86891c5f5e450f48942260ac3e2cd2bf2",
    "utils_qa.py": "examples/pytorch/question-answering/utils_qa.py @ 31f57e9efd761882d1296f7f6ade11ee87a3900e",
}
SMOKE_SIZES = [SMOKE["text"][0], "max_train_samples=48", "max_eval_samples=16", "max_length=96", "doc_stride=32",
               "per_device_train_batch_size=8", "per_device_eval_batch_size=16"]  # fmt: skip


class TrainClock(Clock):
    """The clock of benchmarks/ner_peer.py (evaluations left out), read at the run's last optimizer step
    (`training_s`, with the process's CPU seconds so far, `training_cpu_s`). Keeps the `Run`."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_start = time.process_time()
        self.run: Any = None
        self.training_s: float | None = None
        self.training_cpu_s: float | None = None

    def trained(self) -> None:
        self.training_s, self.training_cpu_s = self.now(), time.process_time() - self.cpu_start

    def mark(self, name: str, value: Any = None) -> None:
        if name == "prepared":
            self.run = value
        elif name == "step" and value == self.run.plan.total_steps:
            self.trained()


def shown(path: str | None) -> str | None:
    """A data file's path as the report shows it: from the repository root when it lies inside it."""
    if path is None:
        return None
    p = Path(path).resolve()
    return str(p.relative_to(REPO_DIR)) if p.is_relative_to(REPO_DIR) else str(p)


def shared_settings(cfg: TrainConfig) -> dict[str, Any]:
    """What both loops take from the one config (the module docstring, **settings**)."""
    return {
        "model": cfg.model_name_or_path, "model_config": cfg.model_config, "tokenizer": cfg.tokenizer_name,
        "train_file": shown(cfg.train_file), "validation_file": shown(cfg.validation_file),
        "max_train_samples": cfg.max_train_samples, "max_eval_samples": cfg.max_eval_samples,
        "max_length": cfg.max_length, "doc_stride": cfg.doc_stride, "n_best_size": cfg.n_best_size,
        "max_answer_length": cfg.max_answer_length, "epochs": epochs(cfg),
        "batch": cfg.per_device_train_batch_size, "eval_batch": cfg.per_device_eval_batch_size,
        "learning_rate": cfg.learning_rate, "weight_decay": cfg.weight_decay, "lr_scheduler_type": cfg.lr_scheduler_type,
        "warmup_ratio": cfg.warmup_ratio, "warmup_steps": cfg.warmup_steps, "seed": cfg.seed,
    }  # fmt: skip


def epochs(cfg: TrainConfig) -> int:
    """The recipe's epochs as the script's --num_train_epochs, a whole number; a fraction or max_steps is refused."""
    if cfg.max_steps is not None or cfg.num_train_epochs != int(cfg.num_train_epochs):
        raise SystemExit("error: the peer trains whole epochs (--num_train_epochs is an int): give num_train_epochs=N, "
                         "no max_steps")
    return int(cfg.num_train_epochs)


# --- the app ------------------------------------------------------------------------------------------------


def run_app(cfg: TrainConfig, precision: str, agreement: bool = True) -> dict[str, Any]:
    """`train(cfg, hooks)` timed by `TrainClock`; with `agreement`, the validation answers from one more
    evaluation of the trained model, off the clock."""
    reset_accelerate()
    hooks = TrainClock()
    try:
        with environment({"ACCELERATE_MIXED_PRECISION": precision}):
            results = train(cfg, hooks)
            wall = time.perf_counter() - hooks.start
            answers = None
            if agreement:
                run = hooks.run
                scored = evaluate_model(run.model, run.eval_loaders["validation"], run.accelerator, run.labels,
                                        problem_type=run.cfg.problem_type, keep_predictions=True,
                                        data=run.cfg.data_args)  # fmt: skip
                answers = [p["text"] for p in scored["predictions"]]
    finally:
        reset_accelerate()
    validation = results["validation"]
    return {
        "precision": precision,
        "optimizer_steps": results["step"],
        "training_windows": len(hooks.run.splits["train"]),
        "warmup_steps": hooks.run.plan.warmup,
        "training_s": hooks.training_s,
        "training_cpu_s": hooks.training_cpu_s,
        "evaluation_s": hooks.seconds.get("evaluate"),
        "wall_s": wall,
        "phases_s": hooks.seconds,
        "exact_match": validation["exact_match"],
        "f1": validation["f1"],
        "questions": validation["num_samples"],
        "answers": answers,
        "source": "finetune.run.train(cfg, hooks) on the recipe: its validation exact match and F1",
    }


# --- the peer: run_qa_no_trainer.py and utils_qa.py ----------------------------------------------------------
# Written as transformers' examples/pytorch/question-answering/run_qa_no_trainer.py and utils_qa.py write
# them (PEER_SOURCE), without their logging, tracking, checkpointing and Hub code. Nothing of the app is
# used here but the scorer (finetune.squad.squad_report, in `run_peer`).


def postprocess_qa_predictions(examples, features, predictions, version_2_with_negative=False, n_best_size=20,
                               max_answer_length=30, null_score_diff_threshold=0.0):  # fmt: skip
    """utils_qa.py's `postprocess_qa_predictions`: the answer text of each example from the start and end
    logits of its features (the files it writes left out)."""
    all_start_logits, all_end_logits = predictions
    assert len(all_start_logits) == len(features), f"Got {len(all_start_logits)} predictions and {len(features)} features."
    example_id_to_index = {k: i for i, k in enumerate(examples["id"])}
    features_per_example = collections.defaultdict(list)
    for i, feature in enumerate(features):
        features_per_example[example_id_to_index[feature["example_id"]]].append(i)
    all_predictions = collections.OrderedDict()
    for example_index, example in enumerate(examples):
        feature_indices = features_per_example[example_index]
        min_null_prediction = None
        prelim_predictions = []
        for feature_index in feature_indices:
            start_logits = all_start_logits[feature_index]
            end_logits = all_end_logits[feature_index]
            offset_mapping = features[feature_index]["offset_mapping"]
            token_is_max_context = features[feature_index].get("token_is_max_context", None)
            feature_null_score = start_logits[0] + end_logits[0]
            if min_null_prediction is None or min_null_prediction["score"] > feature_null_score:
                min_null_prediction = {"offsets": (0, 0), "score": feature_null_score, "start_logit": start_logits[0],
                                       "end_logit": end_logits[0]}  # fmt: skip
            start_indexes = np.argsort(start_logits)[-1 : -n_best_size - 1 : -1].tolist()
            end_indexes = np.argsort(end_logits)[-1 : -n_best_size - 1 : -1].tolist()
            for start_index in start_indexes:
                for end_index in end_indexes:
                    if (
                        start_index >= len(offset_mapping)
                        or end_index >= len(offset_mapping)
                        or offset_mapping[start_index] is None
                        or offset_mapping[end_index] is None
                    ):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    if token_is_max_context is not None and not token_is_max_context.get(str(start_index), False):
                        continue
                    prelim_predictions.append({
                        "offsets": (offset_mapping[start_index][0], offset_mapping[end_index][1]),
                        "score": start_logits[start_index] + end_logits[end_index],
                        "start_logit": start_logits[start_index], "end_logit": end_logits[end_index],
                    })  # fmt: skip
        if version_2_with_negative:
            prelim_predictions.append(min_null_prediction)
            null_score = min_null_prediction["score"]
        predictions = sorted(prelim_predictions, key=lambda x: x["score"], reverse=True)[:n_best_size]
        if version_2_with_negative and not any(p["offsets"] == (0, 0) for p in predictions):
            predictions.append(min_null_prediction)
        context = example["context"]
        for pred in predictions:
            offsets = pred.pop("offsets")
            pred["text"] = context[offsets[0] : offsets[1]]
        if len(predictions) == 0 or (len(predictions) == 1 and predictions[0]["text"] == ""):
            predictions.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0})
        if not version_2_with_negative:
            all_predictions[example["id"]] = predictions[0]["text"]
        else:
            i = 0
            while predictions[i]["text"] == "":
                i += 1
            best_non_null_pred = predictions[i]
            score_diff = null_score - best_non_null_pred["start_logit"] - best_non_null_pred["end_logit"]
            all_predictions[example["id"]] = "" if score_diff > null_score_diff_threshold else best_non_null_pred["text"]
    return all_predictions


def create_and_fill_np_array(start_or_end_logits, dataset, max_len):
    """run_qa_no_trainer.py's: the batches' logits in one (features, max_len) array, -100 beyond each batch's width."""
    step = 0
    logits_concat = np.full((len(dataset), max_len), -100, dtype=np.float64)
    for output_logit in start_or_end_logits:
        batch_size, cols = output_logit.shape[0], output_logit.shape[1]
        if step + batch_size < len(dataset):
            logits_concat[step : step + batch_size, :cols] = output_logit
        else:
            logits_concat[step:, :cols] = output_logit[: len(dataset) - step]
        step += batch_size
    return logits_concat


def peer_preprocessing(tokenizer, column_names: list[str], max_length: int, doc_stride: int, pad_to_max_length: bool):
    """run_qa_no_trainer.py's `prepare_train_features` and `prepare_validation_features` (what `main` defines
    before mapping the splits), for `tokenizer` and the raw columns `column_names`: windows of at most
    `max_length` tokens (--max_seq_length) overlapping by `doc_stride`, labelled with their answer's first and
    last token or the CLS token; validation windows keep their example's id and the context's offsets."""
    question_column_name = "question" if "question" in column_names else column_names[0]
    context_column_name = "context" if "context" in column_names else column_names[1]
    answer_column_name = "answers" if "answers" in column_names else column_names[2]
    pad_on_right = tokenizer.padding_side == "right"
    max_seq_length = min(max_length, tokenizer.model_max_length)

    def prepare_train_features(examples):
        examples[question_column_name] = [q.lstrip() for q in examples[question_column_name]]
        tokenized_examples = tokenizer(
            examples[question_column_name if pad_on_right else context_column_name],
            examples[context_column_name if pad_on_right else question_column_name],
            truncation="only_second" if pad_on_right else "only_first",
            max_length=max_seq_length,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding="max_length" if pad_to_max_length else False,
        )
        sample_mapping = tokenized_examples.pop("overflow_to_sample_mapping")
        offset_mapping = tokenized_examples.pop("offset_mapping")
        tokenized_examples["start_positions"] = []
        tokenized_examples["end_positions"] = []
        for i, offsets in enumerate(offset_mapping):
            input_ids = tokenized_examples["input_ids"][i]
            if tokenizer.cls_token_id in input_ids:
                cls_index = input_ids.index(tokenizer.cls_token_id)
            elif tokenizer.bos_token_id in input_ids:
                cls_index = input_ids.index(tokenizer.bos_token_id)
            else:
                cls_index = 0
            sequence_ids = tokenized_examples.sequence_ids(i)
            sample_index = sample_mapping[i]
            answers = examples[answer_column_name][sample_index]
            if len(answers["answer_start"]) == 0:
                tokenized_examples["start_positions"].append(cls_index)
                tokenized_examples["end_positions"].append(cls_index)
            else:
                start_char = answers["answer_start"][0]
                end_char = start_char + len(answers["text"][0])
                token_start_index = 0
                while sequence_ids[token_start_index] != (1 if pad_on_right else 0):
                    token_start_index += 1
                token_end_index = len(input_ids) - 1
                while sequence_ids[token_end_index] != (1 if pad_on_right else 0):
                    token_end_index -= 1
                if not (offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char):
                    tokenized_examples["start_positions"].append(cls_index)
                    tokenized_examples["end_positions"].append(cls_index)
                else:
                    while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
                        token_start_index += 1
                    tokenized_examples["start_positions"].append(token_start_index - 1)
                    while offsets[token_end_index][1] >= end_char:
                        token_end_index -= 1
                    tokenized_examples["end_positions"].append(token_end_index + 1)
        return tokenized_examples

    def prepare_validation_features(examples):
        examples[question_column_name] = [q.lstrip() for q in examples[question_column_name]]
        tokenized_examples = tokenizer(
            examples[question_column_name if pad_on_right else context_column_name],
            examples[context_column_name if pad_on_right else question_column_name],
            truncation="only_second" if pad_on_right else "only_first",
            max_length=max_seq_length,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding="max_length" if pad_to_max_length else False,
        )
        sample_mapping = tokenized_examples.pop("overflow_to_sample_mapping")
        tokenized_examples["example_id"] = []
        for i in range(len(tokenized_examples["input_ids"])):
            sequence_ids = tokenized_examples.sequence_ids(i)
            context_index = 1 if pad_on_right else 0
            sample_index = sample_mapping[i]
            tokenized_examples["example_id"].append(examples["id"][sample_index])
            tokenized_examples["offset_mapping"][i] = [
                (o if sequence_ids[k] == context_index else None)
                for k, o in enumerate(tokenized_examples["offset_mapping"][i])
            ]
        return tokenized_examples

    return prepare_train_features, prepare_validation_features


def run_peer(settings: dict[str, Any], pad_to_max_length: bool, hooks: Clock) -> dict[str, Any]:
    """run_qa_no_trainer.py with `settings` as its options (--max_seq_length, --doc_stride, --n_best_size,
    --max_answer_length, --num_train_epochs, --per_device_train_batch_size, --per_device_eval_batch_size,
    --learning_rate, --weight_decay, --lr_scheduler_type, --num_warmup_steps, --seed; `pad_to_max_length`:
    --pad_to_max_length), fp32, timed by `hooks` (its phases "data", "build", "train", "evaluate")."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from datasets import load_dataset
    from torch.utils.data import DataLoader
    from transformers import (
        AutoConfig,
        AutoModelForQuestionAnswering,
        AutoTokenizer,
        DataCollatorWithPadding,
        default_data_collator,
        get_scheduler,
    )

    s = settings
    accelerator = Accelerator(mixed_precision="no")
    set_seed(s["seed"])
    with hooks.phase("data"):
        data_files = {"train": str(REPO_DIR / s["train_file"]), "validation": str(REPO_DIR / s["validation_file"])}
        # (the script: load_dataset(extension, data_files=data_files, field="data"), for a nested .json file)
        raw_datasets = load_dataset("json", data_files=data_files)
    with hooks.phase("build"):
        name, spec = s["model"], dict(s["model_config"] or {})
        tokenizer = AutoTokenizer.from_pretrained(s["tokenizer"] or name, use_fast=True)
        if spec:  # the script's --model_type path, for a tiny model (--smoke)
            spec.setdefault("vocab_size", len(tokenizer))
            config = AutoConfig.for_model(spec.pop("model_type"), **spec)
            model = AutoModelForQuestionAnswering.from_config(config)
        else:
            config = AutoConfig.from_pretrained(name)
            model = AutoModelForQuestionAnswering.from_pretrained(name, config=config)
    hooks.mark("built", model)

    column_names = raw_datasets["train"].column_names
    prepare_train_features, prepare_validation_features = peer_preprocessing(
        tokenizer, column_names, s["max_length"], s["doc_stride"], pad_to_max_length
    )

    with hooks.phase("data"):
        train_dataset = raw_datasets["train"]
        if s["max_train_samples"] is not None:
            train_dataset = train_dataset.select(range(min(s["max_train_samples"], len(train_dataset))))
        # (The script then also selects the first max_train_samples windows: left out, module docstring.)
        train_dataset = train_dataset.map(prepare_train_features, batched=True, remove_columns=column_names,
                                          desc="Running tokenizer on train dataset")  # fmt: skip
        eval_examples = raw_datasets["validation"]
        if s["max_eval_samples"] is not None:
            eval_examples = eval_examples.select(range(min(s["max_eval_samples"], len(eval_examples))))
        eval_dataset = eval_examples.map(prepare_validation_features, batched=True, remove_columns=column_names,
                                         desc="Running tokenizer on validation dataset")  # fmt: skip
    if pad_to_max_length:
        data_collator = default_data_collator
    else:
        pad_to_multiple_of = 16 if accelerator.mixed_precision == "fp8" else 8 if accelerator.mixed_precision != "no" else None
        data_collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=data_collator, batch_size=s["batch"])
    eval_dataset_for_model = eval_dataset.remove_columns(["example_id", "offset_mapping"])
    eval_dataloader = DataLoader(eval_dataset_for_model, collate_fn=data_collator, batch_size=s["eval_batch"])

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": s["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=s["learning_rate"])
    max_train_steps = s["epochs"] * math.ceil(len(train_dataloader))  # gradient_accumulation_steps 1
    # --num_warmup_steps: the recipe's (warmup_steps, else warmup_ratio of the steps, rounded up, as the app counts).
    num_warmup_steps = s["warmup_steps"] if s["warmup_steps"] is not None else math.ceil(s["warmup_ratio"] * max_train_steps)
    lr_scheduler = get_scheduler(name=s["lr_scheduler_type"], optimizer=optimizer,
                                 num_warmup_steps=num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=max_train_steps)  # fmt: skip
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    completed_steps = 0
    with hooks.phase("train"):
        for _epoch in range(s["epochs"]):
            model.train()
            for batch in train_dataloader:
                with accelerator.accumulate(model):
                    outputs = model(**batch)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    completed_steps += 1
                if completed_steps >= max_train_steps:
                    break
    hooks.trained()

    with hooks.phase("evaluate"):
        all_start_logits, all_end_logits = [], []
        model.eval()
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
                start_logits, end_logits = outputs.start_logits, outputs.end_logits
                if not pad_to_max_length:
                    start_logits = accelerator.pad_across_processes(start_logits, dim=1, pad_index=-100)
                    end_logits = accelerator.pad_across_processes(end_logits, dim=1, pad_index=-100)
                all_start_logits.append(accelerator.gather_for_metrics(start_logits).cpu().numpy())
                all_end_logits.append(accelerator.gather_for_metrics(end_logits).cpu().numpy())
        max_len = max(x.shape[1] for x in all_start_logits)
        start_logits_concat = create_and_fill_np_array(all_start_logits, eval_dataset, max_len)
        end_logits_concat = create_and_fill_np_array(all_end_logits, eval_dataset, max_len)
        predictions = postprocess_qa_predictions(eval_examples, eval_dataset, (start_logits_concat, end_logits_concat),
                                                 n_best_size=s["n_best_size"], max_answer_length=s["max_answer_length"])  # fmt: skip
        # The script: metric = evaluate.load("squad"); here the app's scorer, the same for both sides.
        answers = [predictions[i] for i in eval_examples["id"]]
        answer_column_name = "answers" if "answers" in column_names else column_names[2]
        metric = squad_report(answers, [a["text"] for a in eval_examples[answer_column_name]])
    return {
        "optimizer_steps": completed_steps,
        "training_windows": len(train_dataset),
        "warmup_steps": num_warmup_steps,
        "exact_match": metric["exact_match"],
        "f1": metric["f1"],
        "questions": metric["num_samples"],
        "answers": answers,
    }


def timed_peer(settings: dict[str, Any], pad_to_max_length: bool) -> dict[str, Any]:
    reset_accelerate()
    hooks = TrainClock()
    try:
        ran = run_peer(settings, pad_to_max_length, hooks)
        wall = time.perf_counter() - hooks.start
    finally:
        reset_accelerate()
    return {
        "precision": "no",
        **{k: ran[k] for k in ("optimizer_steps", "training_windows", "warmup_steps")},
        "training_s": hooks.training_s,
        "training_cpu_s": hooks.training_cpu_s,
        "evaluation_s": hooks.seconds.get("evaluate"),
        "wall_s": wall,
        "phases_s": hooks.seconds,
        **{k: ran[k] for k in ("exact_match", "f1", "questions", "answers")},
        "padding": "to max_length (--pad_to_max_length)" if pad_to_max_length else "to their longest window (DataCollatorWithPadding)",
        "source": "run_qa_no_trainer.py and utils_qa.postprocess_qa_predictions as written in benchmarks/qa_peer.py",
    }


# The app's settings that take the script's choices (`--match-peer`): every weight trained, shuffled batches
# padded to their longest window, no clipping. The fused AdamW and the padding left out of the loss have no setting.
MATCH_PEER = ["freeze_embeddings=false", "group_by_length=false", "pad_to_multiple_of=null", "max_grad_norm=null"]


# --- report -------------------------------------------------------------------------------------------------


def summarize(report: dict[str, Any]) -> None:
    """The differences (app - peer, in points: 100 x the shares), the ratios and the agreement."""
    app, peer = report["app"], report["peer"]
    report["difference_points"] = {k: 100 * (app[k] - peer[k]) for k in ("exact_match", "f1")}
    report["within_1_point"] = all(d >= -1.0 for d in report["difference_points"].values())
    report["ratio"] = peer["training_s"] / app["training_s"]
    report["ratio_cpu"] = peer["training_cpu_s"] / app["training_cpu_s"]
    report["ratio_evaluation"] = peer["evaluation_s"] / app["evaluation_s"] if app["evaluation_s"] else None
    a, p = app.pop("answers"), peer.pop("answers")
    report["agreement"] = None if a is None else sum(x == y for x, y in zip(a, p, strict=True)) / len(p)


def fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    app, peer, s = report["app"], report["peer"], report["settings"]
    d = report["difference_points"]
    train_q = "all" if s["max_train_samples"] is None else f"the first {s['max_train_samples']:,}"
    lines = [
        machine_line(report["machine"]) + ".",
        f"Command: `{report['invocation']}`",
        "Load average (1 min) at each run's start and end: "
        + ", ".join(f"{k} {v['load_avg'][0]:.2f}" for k, v in report["load"].items()) + ".",
        "",
        f"Settings of both sides (one config: `{report['recipe']}` with {', '.join(report['overrides']) or 'no overrides'}): "
        f"{train_q} training questions of `{s['train_file']}` ({app['training_windows']:,} windows), "
        f"{app['questions']:,} validation questions of `{s['validation_file']}`, max_length {s['max_length']}, "
        f"doc_stride {s['doc_stride']}, {s['epochs']} epoch(s), batch {s['batch']} (evaluation {s['eval_batch']}), "
        f"learning rate {s['learning_rate']:g}, {s['lr_scheduler_type']} schedule with {app['warmup_steps']} warm-up steps, "
        f"weight decay {s['weight_decay']:g}, n_best_size {s['n_best_size']}, max_answer_length {s['max_answer_length']}, "
        f"seed {s['seed']}; the app {'fp32' if app['precision'] == 'no' else app['precision']}, the peer fp32.",
    ]
    if report.get("note"):
        lines += ["", report["note"]]
    lines += [
        "",
        f"Validation exact match / F1 (one scorer, finetune/squad.py): app **{100 * app['exact_match']:.2f} / "
        f"{100 * app['f1']:.2f}**, peer **{100 * peer['exact_match']:.2f} / {100 * peer['f1']:.2f}**: the app "
        f"{d['exact_match']:+.2f} / {d['f1']:+.2f} points "
        f"({'within' if report['within_1_point'] else 'NOT within'} 1 point of the peer or above). Training: the app "
        f"**{report['ratio']:.2f}x** as fast (peer seconds / app seconds; CPU seconds {report['ratio_cpu']:.2f}x).",
        "",
        "| | app: bert_qa.yaml | peer: run_qa_no_trainer.py |",
        "|---|---:|---:|",
        f"| validation exact match | {100 * app['exact_match']:.2f} | {100 * peer['exact_match']:.2f} |",
        f"| validation F1 | {100 * app['f1']:.2f} | {100 * peer['f1']:.2f} |",
        f"| questions scored | {app['questions']:,} | {peer['questions']:,} |",
        f"| training windows | {app['training_windows']:,} | {peer['training_windows']:,} |",
        f"| optimizer steps (warm-up) | {app['optimizer_steps']} ({app['warmup_steps']}) | "
        f"{peer['optimizer_steps']} ({peer['warmup_steps']}) |",
        f"| training clock: data, model, loop (s) | {fmt(app['training_s'])} | {fmt(peer['training_s'])} |",
        f"| — of which the loop (s) | {fmt(app['phases_s'].get('train'))} | {fmt(peer['phases_s'].get('train'))} |",
        f"| CPU seconds of this process over the training clock | {fmt(app['training_cpu_s'])} | "
        f"{fmt(peer['training_cpu_s'])} |",
        f"| final validation evaluation (s) | {fmt(app['evaluation_s'])} | {fmt(peer['evaluation_s'])} |",
        f"| run wall time (s) | {fmt(app['wall_s'])} | {fmt(peer['wall_s'])} |",
        "",
        f"Same answer text on {fmt(None if report['agreement'] is None else 100 * report['agreement'])}% of the "
        "validation questions. " + (
            f"The app ran with the script's choices where it has a setting for them ({', '.join(report['matched'])}): "
            f"every weight trained, on shuffled batches padded to their longest window, without clipping. What stays "
            "its own: the fused AdamW, and padding left out of the loss's softmax; the peer pads "
            f"{peer['padding']} and uses torch's default AdamW." if report.get("matched") else
            "What the script has no option for stays each side's own (the module docstring of "
            "`benchmarks/qa_peer.py`): the app's recipe freezes the word embeddings, batches windows of similar "
            "length, pads to a multiple of 8, clips gradients at norm 1, uses the fused AdamW and leaves padding out "
            f"of the loss; the peer trains every weight on shuffled batches, padded {peer['padding']}, without "
            "clipping, with torch's default AdamW."),
    ]
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.qa_peer", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/qa_peer"))
    p.add_argument("--precision", choices=["no", "bf16"], default="no", help="the app's mixed precision (the peer: fp32)")
    p.add_argument("--order", choices=["app-first", "peer-first"], default="app-first")
    p.add_argument("--peer-pad-to-max-length", action="store_true", help="the script's --pad_to_max_length")
    p.add_argument("--no-agreement", action="store_true", help="no extra app evaluation for the answers' agreement")
    p.add_argument("--match-peer", action="store_true",
                   help="the app with the script's choices where it has a setting for them (MATCH_PEER)")  # fmt: skip
    p.add_argument("--note", default=None, help="a sentence for the report (why these sizes)")
    p.add_argument("--quiet-load", type=float, default=0.8,
                   help="wait before each run until the 1-minute load average is below this")  # fmt: skip
    p.add_argument("--quiet-wait", type=float, default=900, help="seconds to wait for that at most, per run")
    p.add_argument("--smoke", action="store_true", help="a tiny model from config, a slice of the data")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of the recipe, for both sides (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    check_arguments(p, args, ["quiet_wait"], RESERVED_OVERRIDES)
    if args.smoke:
        args.quiet_load = None
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = cpu_threads(None, 1)
    torch.set_num_threads(threads)
    base = [f"cpu_threads={threads}", "report_to=[]", "overwrite_output_dir=true"]
    base += SMOKE_SIZES if args.smoke else []
    report: dict[str, Any] = {
        "invocation": "python -m benchmarks.qa_peer " + shlex.join(sys.argv[1:] if argv is None else argv),
        "recipe": str(RECIPE.relative_to(REPO_DIR)), "overrides": list(args.override), "note": args.note,
        "metric": "validation exact match and F1, finetune.squad.squad_report (official SQuAD v1.1) for both sides",
        "peer_source": PEER_SOURCE, "machine": machine(), "load": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="finetune-qa-peer-") as tmp:
        matched = MATCH_PEER if args.match_peer else []
        report["matched"] = matched
        cfg = load_config(RECIPE, [*base, f"output_dir={tmp}/app", *matched, *args.override])
        report["settings"] = settings = shared_settings(cfg)
        for side in (("app", "peer") if args.order == "app-first" else ("peer", "app")):
            start = wait_for_quiet(args.quiet_load, args.quiet_wait)
            if side == "app":
                report["app"] = run_app(cfg, args.precision, not args.no_agreement)
            else:
                report["peer"] = timed_peer(settings, args.peer_pad_to_max_length)
            report["load"][f"{side} start"] = start
            report["load"][f"{side} end"] = {"load_avg": list(os.getloadavg())}
    summarize(report)
    write_report(args.out, "qa_peer", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
