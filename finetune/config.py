"""The typed config: dataclass defaults < a YAML recipe < `key=value` on the command line.

    accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml learning_rate=3e-4

One flat recipe (transformers' TrainingArguments names), declared in sections: `TaskArgs` (what to
train), `ModelArgs`, `DataArgs`, `OptimArgs`, `RunArgs` (evaluation, output, checkpoints, faults,
processes) and `ParallelArgs` (the layer split). Each section holds its fields and the checks of
those fields; `TrainConfig` is all of them, plus the checks that read several sections. A builder
sees only its section: `cfg.data_args` is a `DataArgs`, `cfg.model_args` a `ModelArgs`. The field
list is the dataclasses' own (`dataclasses.fields(TrainConfig)`); a field's metadata holds its
one-line help and whether an evaluation may change it (`EVAL_KEYS`).

Hardware (processes, devices, mixed precision, machines) is NOT here: it belongs to the accelerate
config and is read back from the `Accelerator`. Unknown keys and wrong types are errors that name
the key and the nearest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from finetune.errors import UserError, first_line, warn
from finetune.metrics import METRICS, PROBLEMS, TOKENS
from finetune.rundir import MANIFEST
from finetune.tasks import TASK_NAMES, TASKS, task_of

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CONFIGS_DIR = PACKAGE_DIR / "configs"
DEFAULT_RECIPE = CONFIGS_DIR / "bert_rotten_tomatoes.yaml"
# Keys that hold a local path (or a hub name): resolved against the repository or the cwd.
PATH_KEYS = ("model_name_or_path", "tokenizer_name", "image_processor_name", "train_file", "validation_file",
             "test_file", "data_dir")  # fmt: skip

TaskName = Literal[TASK_NAMES]  # type: ignore[valid-type]  # finetune/tasks.py
SchedulerType = Literal["linear", "cosine", "constant"]
LogLevel = Literal["debug", "info", "warning", "error"]
AttnImplementation = Literal["eager", "sdpa"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]  # torch.compile's
# transformers' names (PretrainedConfig.problem_type): what the pipeline and the loss follow.
AUGMENT_OPS = ("crop", "color", "trivial")  # finetune/images.py, Augment
ProblemType = Literal[tuple(PROBLEMS)]  # type: ignore[valid-type]  # finetune/metrics.py


def setting(default: Any = None, help: str = "", *, factory: Any = None, evaluation: bool = False) -> Any:
    """A field with its one-line help, as transformers' `field(metadata={"help": ...})`; `evaluation`:
    `evaluate_checkpoint.py` may change it (how data is read and batched, how processes run)."""
    metadata = {"help": help, "evaluation": evaluation}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _finite(section: Any, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value is not None and not math.isfinite(value):
            raise UserError(f"{name} must be a finite number, got {value}")


def _positive(section: Any, *names: str, allow_null: bool = False) -> None:
    for name in names:
        value = getattr(section, name)
        if value is None and allow_null:
            continue
        if value <= 0:
            kind = "positive (or null)" if allow_null else "a positive integer"
            raise UserError(f"{name} must be {kind}, got {value}")


# --- the sections ---------------------------------------------------------------------------------


@dataclass
class TaskArgs:
    """What to train: read by the model and the data builders alike."""

    TITLE: ClassVar[str] = "what to train"

    # null: from the data: an image folder or an image column -> image-classification; a column of word
    # lists with a column of tag lists (tokens_column, tags_column; or a CoNLL file) -> token-classification;
    # else text-classification. The saved config holds the task resolved.
    task: TaskName | None = setting(None, "what the model predicts (null: from the data)")
    # null: from train's label column: class names or integer ids -> single_label_classification,
    # numbers with decimals -> regression, lists of names -> multi_label_classification.
    problem_type: ProblemType | None = setting(
        None,
        "single_label_classification, multi_label_classification or regression (null: from the labels; "
        "token_classification for token-classification)",
    )
    label_names: list[str] | None = setting(
        None, "the label set and its order (default: the sorted labels of train)"
    )
    seed: int = setting(
        42, "seed of the weights' initialisation, the data order, dropout and the held-out split"
    )

    def _check_task(self) -> None:
        if self.task and self.problem_type and self.problem_type not in task_of(self.task).problems:
            raise UserError(
                f"problem_type={self.problem_type} is not a problem of {self.task}, which solves "
                f"{', '.join(task_of(self.task).problems)}; set problem_type to one of those, or null"
            )
        if not 0 <= self.seed < 2**32:  # numpy's seeds; torch's and Python's take them too
            raise UserError(f"seed must be in [0, {2**32 - 1}], got {self.seed}")
        if self.label_names is not None:
            if not self.label_names:
                raise UserError(
                    "label_names is empty; list the labels, or leave it null to take them from the data"
                )
            repeated = sorted({n for n in self.label_names if self.label_names.count(n) > 1})
            if repeated:
                raise UserError(f"label_names lists {repeated[0]!r} twice; name each label once")


@dataclass
class ModelArgs(TaskArgs):
    """The model: where its weights or architecture come from, and what of it trains."""

    TITLE: ClassVar[str] = "the model"

    # A hub name or a local directory. With `model_config`, only its tokenizer/processor is used.
    model_name_or_path: str | None = setting(None, "pretrained model: a hub name or a local directory")
    # Build the model from a config instead of pretrained weights, e.g. a tiny BERT for tests:
    # {model_type: bert, hidden_size: 32, num_hidden_layers: 2, ...}.
    model_config: dict[str, Any] | None = setting(
        None,
        "build the model from this config instead of weights ({model_type: bert, ...}); keys settable as model_config.KEY=VALUE",
    )
    tokenizer_name: str | None = setting(None, "text: the tokenizer (default: model_name_or_path)")
    image_processor_name: str | None = setting(
        None, "images: the image processor (default: model_name_or_path)"
    )
    trust_remote_code: bool = setting(
        False, "run Python code shipped with a hub model: only for sources you trust"
    )
    # Pretrained weights load from safetensors only; true also allows pytorch_model.bin (a pickle).
    allow_pickle_weights: bool = setting(
        False, "also load pytorch_model.bin weights (a pickle, which can run code)"
    )
    dropout: float | None = setting(None, "set every dropout probability of the model (0 turns dropout off)")
    # Text: keep the word-embedding table as loaded (no gradient, no optimizer state). For MiniLM it
    # is half of the weights, so half of AdamW's memory traffic and no dense 30522 x 384 gradient.
    freeze_embeddings: bool = setting(
        False, "text: keep the word-embedding table as loaded (faster, less memory)"
    )
    # Freeze the embeddings and the first N encoder layers: backward stops above them (no gradient into
    # them, none through them), so a step does less work (benchmarks/README.md: `--levers-only
    # frozen_layers`).
    freeze_layers: int = setting(
        0, "freeze all the embeddings (whatever freeze_embeddings says) and the first N encoder layers"
    )
    # Keep only each layer's input during forward and recompute the rest in backward: less activation
    # memory for more compute (transformers' activation checkpointing).
    gradient_checkpointing: bool = setting(
        False, "recompute activations in backward: less memory, more compute"
    )
    # Attention kernel. On a CPU under bf16 autocast, SDPA's fused flash-attention backward is slow:
    # eager softmax(QK^T)V trains faster there (benchmarks/README.md: `--levers-only attention_kernel`).
    # In fp32 the two are a wash; on a GPU SDPA wins.
    attn_implementation: AttnImplementation | None = setting(
        None, "attention kernel: eager, sdpa (null: eager under bf16 on a CPU, else transformers' default)"
    )
    # LoRA through peft (pip install peft): low-rank adapters on the target linear layers and the head
    # train, every other weight stays frozen; the export has the adapters merged, and <output_dir>/adapter
    # holds them alone in peft's format (finetune/lora.py).
    peft: dict[str, Any] | None = setting(
        None,
        "LoRA instead of full fine-tuning: {r: 8, alpha: 16, dropout: 0.0, target_modules: [query, value]}",
    )

    def _check_model(self) -> None:
        _finite(self, "dropout")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.freeze_layers < 0:
            raise UserError(f"freeze_layers must be >= 0, got {self.freeze_layers}")
        if self.freeze_layers and self.peft is not None:
            raise UserError("freeze_layers and peft together: LoRA already freezes every weight but its adapters")
        if self.model_name_or_path is None and self.model_config is None:
            raise UserError("set model_name_or_path (a hub name or a local directory) or model_config")
        for key in ("model_name_or_path", "tokenizer_name", "image_processor_name"):
            value = getattr(self, key)
            if value and Path(value).expanduser().is_file():  # config.json, tokenizer.json: one file of the model's
                raise UserError(f"{key}={value} is a file; give the folder that holds it ({Path(value).parent}), "
                                "or a hub name")  # fmt: skip
        if self.model_config is not None and "model_type" not in self.model_config:
            given = ", ".join(f"model_config.{k}" for k in list(self.model_config)[:2])
            if self.model_name_or_path and given:  # a pretrained model's config changed key by key: not what it does
                drop = next((v for k, v in self.model_config.items() if "dropout" in k), None)
                fix = f"; its dropout is set with dropout={drop}" if drop is not None else ""
                raise UserError(f"{given} beside model_name_or_path: model_config builds a new model from random "
                                f"weights and needs a model_type; a pretrained model keeps its architecture{fix}")  # fmt: skip
            raise UserError("model_config needs a model_type, e.g. {model_type: bert, hidden_size: 32, ...}")
        for key, instead in LABEL_KEYS.items():  # the data's labels set these: a value here would be ignored
            if self.model_config is not None and key in self.model_config:
                raise UserError(f"model_config.{key} is set from the data's labels, not here; {instead}")
        if self.freeze_embeddings and self.task and not task_of(self.task).has_word_embeddings:
            raise UserError(f"freeze_embeddings is for models with a word-embedding table, not {self.task}: set "
                            "freeze_embeddings=false (the text recipes set it), or use a recipe of that task "
                            "(finetune/configs/)")
        if self.peft is not None:
            from finetune.lora import check_spec

            self.peft = check_spec(self.peft)  # with the defaults filled in, as config.yaml saves it


@dataclass
class DataArgs(TaskArgs):
    """The data: where it is, which columns hold what, how it is cut and batched."""

    TITLE: ClassVar[str] = "data"

    # A hub dataset name or a builder ("imagefolder", "csv", "json", "parquet"); or give files.
    dataset_name: str | None = setting(None, "a hub dataset, or a builder (imagefolder, csv, json, parquet)")
    dataset_config_name: str | None = setting(None, "the hub dataset's configuration (e.g. sst2 of glue)")
    data_dir: str | None = setting(
        None, "an image folder: <data_dir>/train/<label>/<image> (validation/, test/ optional)"
    )
    train_file: str | None = setting(None, "training data: .csv, .tsv, .json, .jsonl or .parquet")
    validation_file: str | None = setting(
        None, "validation data (default: a stratified share of train is held out)"
    )
    test_file: str | None = setting(None, "test data, scored once at the end")
    text_column: str = setting("text", "text: the column holding the text", evaluation=True)
    text_pair_column: str | None = setting(
        None, "text: the second sentence's column, for sentence pairs", evaluation=True
    )
    image_column: str = setting("image", "images: the column holding the image", evaluation=True)
    tokens_column: str = setting("tokens", "token classification: the column of word lists", evaluation=True)
    tags_column: str = setting(
        "ner_tags", "token classification: the column of tag lists, one tag per word", evaluation=True
    )
    # Token classification: the first subword of each word carries the word's tag, the others are ignored;
    # true also trains the others on it (a B- tag becomes I- after the first subword). Scores count each
    # word once either way (its first subword's prediction).
    label_all_tokens: bool = setting(
        False, "token classification: train every subword of a word on its tag, not only the first"
    )
    label_column: str = setting("label", "the column holding the label", evaluation=True)
    # Multi-label as several 0/1 columns, one per label (named by its column), instead of a column of lists.
    label_columns: list[str] | None = setting(
        None, "multi-label: the 0/1 columns, one per label (instead of label_column)", evaluation=True
    )
    max_length: int = setting(128, "text: tokens per sample; longer texts are truncated", evaluation=True)
    # Text batches are padded to their longest sequence, rounded up to a multiple of this (8 suits
    # tensor cores; max_length pads every batch to one fixed length). null: no rounding.
    pad_to_multiple_of: int | None = setting(
        8, "text: round each batch's padded length up to a multiple of this", evaluation=True
    )
    # When the data has no validation split: the share of train held out, stratified and seeded.
    validation_split_percentage: float = setting(
        10.0, "percent of train held out for validation when none is given"
    )
    max_train_samples: int | None = setting(None, "use only the first N training samples")
    max_eval_samples: int | None = setting(None, "use only the first N validation samples")
    max_test_samples: int | None = setting(None, "use only the first N test samples")
    group_by_length: bool = setting(False, "text: batch similar lengths together (less padding)")
    # Pad every text batch to the smallest of K lengths chosen from the data (finetune/shapes.py), not
    # to its own longest: the few shapes a compiled model (torch_compile) compiles once. null: per batch.
    length_buckets: int | None = setting(
        None, "text: pad each batch to one of this many lengths chosen from the data (for torch_compile)"
    )
    # Off unless the recipe says its images keep their class when mirrored: a flip turns digits, text
    # and many medical images into something else.
    random_flip: bool = setting(
        False, "images: random horizontal flip of training images (for mirror-invariant classes)"
    )
    # Images: training augmentation ops, seeded by (seed, epoch, sample) so a resume stays exact
    # (finetune/images.py, Augment): crop (random resized crop), color (brightness, contrast,
    # saturation), trivial (one TrivialAugment-Wide op a sample).
    augment: list[str] = setting(
        help="images: training augmentation: any of crop, color, trivial (random_flip adds the flip)", factory=list
    )
    # Worker processes that collate batches. null: the task's choice (finetune/tasks.py: 2 for text on
    # a GPU, else 0: on a CPU a worker competes for the cores).
    dataloader_num_workers: int | None = setting(
        None, "processes that collate batches (default: 2 for text on a GPU, else 0)", evaluation=True
    )
    # GPU: batches in page-locked memory, copied to the device without blocking the host (no effect on CPU).
    dataloader_pin_memory: bool = setting(
        True, "GPU: batches in page-locked memory for non-blocking copies", evaluation=True
    )

    @property
    def files(self) -> dict[str, str]:
        """The split files given, by split name."""
        named = (("train", self.train_file), ("validation", self.validation_file), ("test", self.test_file))
        return {split: path for split, path in named if path}

    @property
    def text_columns(self) -> list[str]:
        """The text column, and the pair column when there is one."""
        return [c for c in (self.text_column, self.text_pair_column) if c]

    @property
    def label_sources(self) -> list[str]:
        """The columns the labels come from: the task's (tags_column for tags), label_columns
        (multi-label 0/1 columns), else label_column."""
        if self.task:
            return task_of(self.task).label_columns(self)
        return list(self.label_columns) if self.label_columns else [self.label_column]

    @property
    def input_columns(self) -> list[str]:
        """The task's input columns ([] before the task is known)."""
        return task_of(self.task).input_columns(self) if self.task else []

    def _check_data(self) -> None:
        _finite(self, "validation_split_percentage")
        _positive(self, "max_length")
        if self.length_buckets is not None and not 1 <= self.length_buckets <= 32:
            raise UserError(f"length_buckets must be between 1 and 32 (or null), got {self.length_buckets}")
        _positive(self, "max_train_samples", "max_eval_samples", "max_test_samples", "pad_to_multiple_of",
                  allow_null=True)  # fmt: skip
        if not 0 < self.validation_split_percentage < 100:
            raise UserError(
                f"validation_split_percentage must be in (0, 100), got {self.validation_split_percentage}"
            )
        if self.dataloader_num_workers is not None and self.dataloader_num_workers < 0:
            raise UserError("dataloader_num_workers must be >= 0")
        unknown = [op for op in self.augment if op not in AUGMENT_OPS]
        if unknown:
            raise UserError(f"augment: unknown op(s) {unknown}; the ops are {', '.join(AUGMENT_OPS)}")
        if self.task and self.label_column in self.input_columns:
            modality = task_of(self.task).modality
            raise UserError(
                f"'{self.label_column}' is both the label column and a{'n' * (modality[0] in 'aeiou')} {modality} "
                f"column: the model would read the answer; set {modality}_column (or label_column) to another column"
            )
        kind = task_of(self.task) if self.task else None
        if kind is not None and kind.modality != "image" and (self.random_flip or self.augment):
            what = "random_flip=true" if self.random_flip else f"augment=[{','.join(self.augment)}]"
            raise UserError(f"{what} augments training images; a {self.task} run has none: leave it out")
        tagging = kind is not None and kind.problems == (TOKENS,)
        if tagging and self.text_pair_column is not None:
            raise UserError(f"text_pair_column pairs two texts of a sentence classifier; a {self.task} run tags "
                            "one list of words: leave text_pair_column out")
        if tagging and self.tags_column == self.tokens_column:
            raise UserError(f"tags_column is the tokens_column ('{self.tokens_column}'): the words would be read as "
                            "their own tags; set tags_column to the column of tag lists")
        inputs = set(self.input_columns) if self.task else set()
        mixed = next((c for c in self.label_columns or () if c in inputs), None)
        if mixed is not None:
            raise UserError(f"label_columns holds '{mixed}', an input column of the run (the model would read the "
                            f"answer); remove it from label_columns")
        if self.text_pair_column is not None and self.text_pair_column == self.text_column:
            raise UserError(
                "text_pair_column is the text_column: each sentence would be paired with itself; "
                "set text_pair_column to the second sentence's column, or null"
            )
        if self.label_columns is not None:
            if not self.label_columns or len(set(self.label_columns)) != len(self.label_columns):
                raise UserError(f"label_columns must name distinct columns, got {self.label_columns}")
            if self.problem_type not in (None, "multi_label_classification"):
                raise UserError(
                    f"label_columns (0/1 columns, one per label) is multi-label data, but problem_type is "
                    f"{self.problem_type}; set problem_type=multi_label_classification or null"
                )


@dataclass
class OptimArgs:
    """Optimisation: how long, in which batches, with which optimizer and schedule."""

    TITLE: ClassVar[str] = "optimisation"

    num_train_epochs: float = setting(3.0, "passes over the training data (1.5: one and a half)")
    max_steps: int | None = setting(None, "optimizer steps to train; overrides num_train_epochs")
    per_device_train_batch_size: int = setting(32, "training samples per process per micro-batch")
    per_device_eval_batch_size: int = setting(
        64, "evaluation samples per process per batch", evaluation=True
    )
    gradient_accumulation_steps: int = setting(1, "micro-batches per optimizer step")
    learning_rate: float = setting(5e-5, "AdamW's peak learning rate")
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay (not on biases and LayerNorm)")
    adam_beta1: float = setting(0.9, "AdamW's beta1")
    adam_beta2: float = setting(0.999, "AdamW's beta2")
    adam_epsilon: float = setting(1e-8, "AdamW's epsilon")
    lr_scheduler_type: SchedulerType = setting("linear", "the learning-rate schedule after warm-up")
    warmup_ratio: float = setting(0.0, "share of the optimizer steps spent warming up")
    warmup_steps: int | None = setting(None, "optimizer steps spent warming up; overrides warmup_ratio")
    max_grad_norm: float | None = setting(1.0, "clip the gradients' global norm to this (null: no clipping)")
    # Single-label: the cross-entropy's label smoothing (transformers' label_smoothing_factor).
    label_smoothing: float = setting(0.0, "single-label: label smoothing of the cross-entropy, in [0, 1)")
    # Rare classes weigh more: balanced is n / (K * n_k) per class (scikit-learn's class_weight="balanced")
    # for single-label, and (n - n_k) / n_k (at most 100) as BCE's pos_weight for multi-label.
    class_weights: Literal["balanced"] | None = setting(
        None, "balanced: weigh each class (single-label) or label's positives (multi-label) by its rarity"
    )

    def _check_optim(self) -> None:
        _finite(self, "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                "max_grad_norm", "warmup_ratio")  # fmt: skip
        _positive(self, "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
        _finite(self, "num_train_epochs")
        if not self.num_train_epochs > 0:
            raise UserError(f"num_train_epochs must be positive, got {self.num_train_epochs}")
        _positive(self, "max_steps", allow_null=True)
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.adam_epsilon > 0:  # 0: 0/0 for a weight whose gradients have all been 0
            raise UserError(f"adam_epsilon must be > 0, got {self.adam_epsilon}")
        if not self.weight_decay >= 0:
            raise UserError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm >= 0:  # negative: flips the gradients
            raise UserError(f"max_grad_norm must be >= 0 (0 or null: no clipping), got {self.max_grad_norm}")
        if not self.learning_rate > 0:
            raise UserError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        _finite(self, "label_smoothing")
        if not 0 <= self.label_smoothing < 1:
            raise UserError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise UserError(f"warmup_steps must be positive (or null), got {self.warmup_steps}")
        if self.warmup_steps is not None and self.max_steps is not None and self.warmup_steps > self.max_steps:
            raise UserError(
                f"warmup_steps={self.warmup_steps} exceeds max_steps={self.max_steps}: the learning rate would "
                "never reach learning_rate; lower warmup_steps"
            )


@dataclass
class RunArgs:
    """The run around the loop: evaluation and logging, the output, checkpoints and resume, faults,
    and how the processes work together."""

    TITLE: ClassVar[str] = "the run: evaluation, output, checkpoints, faults, processes"

    output_dir: str = setting(
        "runs/bert-rotten-tomatoes", "where checkpoints, metrics and the exported model go"
    )
    overwrite_output_dir: bool = setting(
        False, "replace a finished run in output_dir (kept until the new run saves)"
    )
    # The libraries' own console output (transformers' load report, datasets' "Generating split" and
    # map bars, accelerate's notices): shown from this level up; "info" also shows their progress bars.
    log_level: LogLevel = setting(
        "error", "what transformers, datasets and accelerate print (info: everything)", evaluation=True
    )
    logging_steps: int = setting(10, "optimizer steps between logged losses")
    eval_steps: int | None = setting(
        None, "optimizer steps between evaluations, besides the one at each epoch's end (null: that one only)"
    )
    report_to: list[str] = setting(
        help="trackers beside metrics.jsonl (tensorboard, wandb, ...)", factory=list
    )
    multi_label_threshold: float = setting(
        0.5, "multi-label: a label is predicted when its probability is at least this", evaluation=True
    )
    # Multi-label: after training, the threshold that maximizes validation micro F1 (global), or each
    # label's that maximizes its F1 (per_label), replaces multi_label_threshold for the test split, the
    # export (config.json's multi_label_thresholds) and its evaluations.
    tune_threshold: Literal["off", "global", "per_label"] = setting(
        "global", "multi-label: tune the threshold on validation after training (off, global, per_label)"
    )
    save_steps: int | None = setting(None, "optimizer steps between training-state checkpoints")
    save_at_epoch_end: bool = setting(False, "also write a checkpoint at each epoch's end")
    save_total_limit: int | None = setting(2, "keep the last K checkpoints (the best is kept too; null: all)")
    metric_for_best_model: str | None = setting(
        None,
        "the validation metric that picks the best checkpoint (null: the first of its problem type's): "
        + "; ".join(f"{problem}: {', '.join(m.reported)}" for problem, m in PROBLEMS.items()),
    )
    greater_is_better: bool | None = setting(
        None,
        "whether a larger metric_for_best_model is better (null: as the metric says; lower is better for "
        + ", ".join(key for key, m in METRICS.items() if not m.greater_is_better)
        + ")",
    )
    # A checkpoint at every evaluation, and at the end the best one's weights are evaluated and exported
    # (transformers' name); false: the export is the last step's weights, and the end says which was best.
    load_best_model_at_end: bool = setting(
        False, "export the best checkpoint by metric_for_best_model, not the last step"
    )
    resume_from_checkpoint: str | None = setting(None, '"latest" or a checkpoint directory to continue from')
    # Resume with other processes / batch / accumulation than the checkpoint's: the samples already
    # consumed are not repeated, the schedule is re-planned for the rest (not bit-exact).
    resume_allow_topology_change: bool = setting(
        False, "resume with other processes, batch or accumulation (not bit-exact)"
    )
    # Stop when metric_for_best_model has not improved for this many evaluations (None: never).
    early_stopping_patience: int | None = setting(
        None, "stop after this many evaluations without improvement"
    )
    push_to_hub_model_id: str | None = setting(
        None, "after training, upload the export to this hub repo (needs the network)"
    )
    # Stop (exit status 3) when the loss is NaN or infinite for this many optimizer steps in a row;
    # checked at logging steps. Single fp16 overflow steps, which the gradient scaler skips, are fine.
    max_nonfinite_loss_steps: int = setting(
        5, "stop (exit 3) after this many optimizer steps of NaN/inf loss in a row"
    )
    # Seconds a process waits in a collective (all-reduce, barrier) for the others before the job
    # fails instead of hanging. Raise it when the main process alone does long work (tokenizing).
    ddp_timeout: int = setting(
        1800, "seconds a process waits for the others before the job fails", evaluation=True
    )
    # DDP options of torch's DistributedDataParallel, passed through Accelerate's kwargs handler:
    # static_graph (the same parameters get gradients every step) and gradient_as_bucket_view (the
    # gradients are views of the all-reduce buckets: one copy fewer, less memory).
    ddp_static_graph: bool = setting(False, "DDP: the same parameters get gradients every step")
    ddp_gradient_as_bucket_view: bool = setting(
        False, "DDP: gradients are views of the all-reduce buckets (less memory)"
    )
    # Torch threads per process when training on CPU. None: the cores this process may use (affinity,
    # container quota), divided by the processes on this machine, whatever OMP_NUM_THREADS says
    # (`accelerate launch` sets it to 1 unless told otherwise: a GPU default that idles a CPU's cores).
    cpu_threads: int | None = setting(
        None, "CPU: torch threads per process (default: this machine's cores / processes)", evaluation=True
    )
    # torch.compile (inductor) of the whole model, in place, warmed once per shape before the first
    # step (finetune/shapes.py): static shapes with length_buckets, dynamic ones without. One process or
    # DDP; not FSDP or the layer split. The compile counts go into the run's summary and results.json.
    torch_compile: bool = setting(False, "compile the model with torch.compile (with length_buckets: static shapes)")
    # torch.compile's mode: reduce-overhead replays the compiled model as CUDA graphs on a GPU (one
    # launch for its kernels; needs static shapes: length_buckets); max-autotune also times matmul
    # kernels at compile time (minutes). A CPU has no CUDA graphs: reduce-overhead compiles as default there.
    torch_compile_mode: CompileMode = setting(
        "default", "torch_compile: default, reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs"
    )

    def _check_run(self) -> None:
        _positive(self, "logging_steps", "max_nonfinite_loss_steps", "ddp_timeout")
        _positive(self, "eval_steps", "save_steps", "save_total_limit", "early_stopping_patience", "cpu_threads",
                  allow_null=True)  # fmt: skip
        if self.ddp_timeout > 7 * 24 * 3600:  # past a week: the timeouts of torch's backends overflow
            raise UserError(f"ddp_timeout must be at most 604800 seconds (a week), got {self.ddp_timeout}")
        most_threads = max(1024, os.cpu_count() or 1)  # not this machine's count: saved configs travel
        if self.cpu_threads is not None and self.cpu_threads > most_threads:  # OpenMP crashes at 100000
            raise UserError(
                f"cpu_threads={self.cpu_threads} is more threads than any machine has cores (this one has "
                f"{os.cpu_count()}); use at most {most_threads}, or null for this process's share of the cores"
            )
        if not 0 < self.multi_label_threshold < 1:
            raise UserError(f"multi_label_threshold must be in (0, 1), got {self.multi_label_threshold}")
        if list(self.report_to) == ["none"]:  # transformers' way of saying no tracker
            self.report_to = []
        if not self.report_to:
            return
        from accelerate.utils import LoggerType  # accelerate imports torch: only when trackers are named

        trackers = {t.value for t in LoggerType}
        for name in self.report_to:
            if name not in trackers:
                raise UserError(
                    f"report_to: unknown tracker {name!r}; Accelerate's trackers are {', '.join(sorted(trackers))} "
                    "(none, or [], for no tracker)"
                )


@dataclass
class ParallelArgs:
    """The layer split: one process, consecutive layers on consecutive devices (finetune/parallel.py)."""

    TITLE: ClassVar[str] = "model parallelism (one process, consecutive layers on consecutive devices)"

    model_parallel: bool = setting(False, "split the model's layers over devices, in one process")
    devices: str | None = setting(
        None, 'model_parallel: the devices in order, e.g. "cuda:0,cuda:1" (default: every GPU)'
    )
    max_memory: dict[str, str] | None = setting(
        None, 'model_parallel: a cap per device, e.g. {"cuda:0": "2GiB"}'
    )
    pipeline_chunks: int = setting(
        1, "model_parallel: >1 pipelines this many micro-batches through the stages"
    )

    def _check_parallel(self) -> None:
        _positive(self, "pipeline_chunks")
        if self.pipeline_chunks > 1 and not self.model_parallel:
            raise UserError("pipeline_chunks needs model_parallel=true")
        if self.devices and not self.model_parallel:
            raise UserError(
                "devices is for model_parallel=true; for data parallelism choose devices in the "
                "accelerate config (accelerate launch --gpu_ids ...)"
            )
        if self.max_memory and not self.model_parallel:
            raise UserError(
                "max_memory caps each device of the layer split and needs model_parallel=true; without it the "
                "model is not split (leave max_memory out)"
            )


SECTIONS: tuple[type, ...] = (TaskArgs, ModelArgs, DataArgs, OptimArgs, RunArgs, ParallelArgs)


def section_fields(section: type) -> list[dataclasses.Field]:
    """The fields a section declares itself (not those it inherits), in order."""
    own = section.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(section) if f.name in own]


@dataclass
class TrainConfig(ParallelArgs, RunArgs, OptimArgs, DataArgs, ModelArgs):
    """Every setting of a run, section by section (the bases in reverse: dataclasses collect fields
    from the last base first, so the fields come in SECTIONS' order). Names follow transformers'
    TrainingArguments where one exists; each field's help is what `run.py --help` prints (the longer
    reasons are comments)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Each section's checks, then the checks that read several sections."""
        self._check_task()
        self._check_optim()
        self._check_run()
        self._check_parallel()
        self._check_model()
        self._check_data()
        if self.torch_compile and self.model_parallel:
            raise UserError("torch_compile does not work with model_parallel=true (stages move tensors between devices)")
        if self.torch_compile_mode != "default" and not self.torch_compile:
            raise UserError(f"torch_compile_mode={self.torch_compile_mode} needs torch_compile=true; add it, or leave "
                            "torch_compile_mode out")  # fmt: skip
        if self.dataset_name is None and self.train_file is None and self.data_dir is None:
            resuming = (
                "; a resume with --config reads that recipe, not the run's saved config.yaml: leave --config "
                "out (resume_from_checkpoint=latest output_dir=<run> alone resumes with the run's own recipe)"
                if self.resume_from_checkpoint
                else ""
            )
            raise UserError(f"no training data: set train_file, data_dir or dataset_name{resuming}")
        if self.train_file and self.data_dir and self.dataset_name in (None, "imagefolder"):  # one would be unread
            raise UserError(f"train_file={self.train_file} and data_dir={self.data_dir} both name the training data; "
                            "give one: train_file= for a data file (data_dir=null), data_dir= for an image folder "
                            "(train_file=null)")  # fmt: skip
        if self.data_dir and self.output_dir and not self.train_file:
            data, out = Path(self.data_dir).expanduser().resolve(), Path(self.output_dir).expanduser().resolve()
            from finetune.tasks import SPLIT_FOLDERS

            inside = out.relative_to(data).parts if out == data or data in out.parents else None
            split_folders = data.is_dir() and any(p.is_dir() and p.name in SPLIT_FOLDERS for p in data.iterdir())
            if inside is not None and (not inside or inside[0] in SPLIT_FOLDERS or not split_folders):
                # where the loader looks for images: the run's pictures would be read as a class next time
                raise UserError(f"output_dir {self.output_dir} is inside data_dir {self.data_dir}, where the image "
                                "folder loader reads: the run's files would be read as data by the next run; choose "
                                "an output_dir outside it")
        self._validate_problem()

    def _validate_problem(self) -> None:
        """The problem type's settings: the metric is one this problem reports; greater_is_better."""
        problem = self.problem_type
        if self.metric_for_best_model is not None and self.greater_is_better is None:
            metric = METRICS.get(self.metric_for_best_model)
            self.greater_is_better = metric.greater_is_better if metric else True
        metrics = PROBLEMS[problem].reported if problem else tuple(
            dict.fromkeys(m for p in PROBLEMS.values() for m in p.reported)
        )
        if self.metric_for_best_model is not None and self.metric_for_best_model not in metrics:
            given, name = self.metric_for_best_model, self.metric_for_best_model.removeprefix("eval_")
            if name != given and name in metrics:
                raise UserError(f"metric_for_best_model={given}: the metric is named without the Trainer's eval_ "
                                f"prefix here: metric_for_best_model={name}")  # fmt: skip
            if problem is None:  # read from the data later: each problem type's own, and the names it may mean
                near = [f"{m} ({p})" for p, spec in PROBLEMS.items() for m in spec.reported
                        if name in m.split("_") and m != "loss"]  # "f1": macro_f1, micro_f1, entity_f1
                raise UserError(
                    f"metric_for_best_model must be a metric of the run's problem type, got {given!r}"
                    + (f"; the ones it may mean: {', '.join(near)}" if near else "; each problem type's: " + "; ".join(
                        f"{p}: {', '.join(spec.reported)}" for p, spec in PROBLEMS.items()))
                )
            raise UserError(
                f"metric_for_best_model must be one of {', '.join(metrics)}"
                f"{f' for {problem}' if problem else ''}, got {self.metric_for_best_model!r}"
            )
        if problem in ("regression", "multi_label_classification") and self.label_smoothing:
            raise UserError(
                f"label_smoothing={self.label_smoothing:g} smooths a cross-entropy over classes (single-label and "
                f"tagging); {problem} has none: leave label_smoothing at 0"
            )
        if problem == "regression" and self.class_weights is not None:  # a number has no class to weigh
            raise UserError(
                f"class_weights={self.class_weights} weighs classes or labels; a regression has none: leave "
                "class_weights unset (null)"
            )
        if problem and problem != "multi_label_classification" and self.multi_label_threshold != 0.5:
            raise UserError(
                f"multi_label_threshold={self.multi_label_threshold:g} decides a multi-label run's labels; {problem} "
                "has none (its prediction is the most probable class): leave multi_label_threshold out"
            )
        if problem and problem != "multi_label_classification" and self.tune_threshold == "per_label":
            raise UserError(  # (the default, global, is simply unused outside multi-label)
                f"tune_threshold=per_label tunes each label's decision threshold of a multi-label run; {problem} "
                "has none: leave tune_threshold out"
            )

    def resolve_task(self, task: str) -> None:
        """Once the data is read: the task it holds (when the config left it null), checked."""
        self.task = task  # type: ignore[assignment]
        self.validate()

    def resolve_problem(self, problem_type: str) -> None:
        """Once the labels are read: the problem type, and the defaults that follow from it
        (metric_for_best_model, greater_is_better), checked; the saved config holds them resolved."""
        self.problem_type = problem_type  # type: ignore[assignment]
        if self.metric_for_best_model is None:
            self.metric_for_best_model = PROBLEMS[problem_type].reported[0]
        self._validate_problem()  # and greater_is_better, from that metric when it is null
        if problem_type == "multi_label_classification" and self.multi_label_threshold != 0.5 and \
                self.tune_threshold != "off":  # fmt: skip
            warn(f"multi_label_threshold={self.multi_label_threshold:g} decides the labels while training; after it, "
                 f"tune_threshold={self.tune_threshold} replaces it with the threshold tuned on validation (the "
                 "test split, the export): set tune_threshold=off to keep yours")

    def to_dict(self) -> dict[str, Any]:
        """Section by section, as config.yaml shows it."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def data_args(self) -> DataArgs:
        """The data section, for the data builders (`data.py`); `label_names_recipe`: the recipe whose
        label_names came with data given on the command line (`load_config`), else None."""
        view = _view(DataArgs, self)
        object.__setattr__(view, "label_names_recipe", getattr(self, "label_names_recipe", None))
        return view

    @property
    def model_args(self) -> ModelArgs:
        """The model section, for the model builders (`models.py`)."""
        return _view(ModelArgs, self)


def _plain(value: Any) -> Any:
    """A copy of a value of the config: lists and mappings are not shared with it."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _view(section: type, cfg: TrainConfig):
    """`section` holding cfg's values (not checked again: they were, as a whole config)."""
    view = object.__new__(section)
    for f in dataclasses.fields(section):
        object.__setattr__(view, f.name, getattr(cfg, f.name))
    return view


# What `key=value` may change at evaluation time (finetune/evaluate_checkpoint.py).
EVAL_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["evaluation"])


# --- loading -------------------------------------------------------------------------------------


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check `value` against the field's type; strings from the command line are parsed as YAML."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except UserError as e:
                errors.append(str(e))
        if type(None) in args and isinstance(value, str) and value.strip() in ("None", "NONE", "Nil", "nil"):
            raise UserError(f"{key}={value.strip()} is the text {value.strip()!r}; to leave {key} unset write "
                            f"{key}=null (YAML's none)")  # fmt: skip
        raise UserError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is Literal:
        if isinstance(value, bool) and ("off" if value is False else "on") in args:
            value = "off" if value is False else "on"  # YAML 1.1 reads a bare off / on as a boolean
        if value not in args:
            raise UserError(f"{key} must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]  # "neg, pos": as a YAML list reads it
        if not isinstance(value, list):
            raise UserError(f"{key} must be a list, got {value!r}")
        if args[0] is str and any(v is None or isinstance(v, bool) for v in value):  # [no, yes]: YAML's booleans
            words = ", ".join(repr({True: "yes", False: "no", None: "null"}.get(v, v) if v is None or isinstance(v, bool)
                                   else str(v)) for v in value)  # fmt: skip
            raise UserError(f"{key} must hold strings, but YAML read some as booleans or null ({value!r}): put them in "
                            f"quotes ({key}=\"[{words}]\" on the command line, or the same quotes in a recipe)")  # fmt: skip
        return [_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            example = MAPPING_EXAMPLES.get(key, "{key: value}")
            raise UserError(f"{key} must be a mapping like {example}, got {value!r}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, str) and re.fullmatch(r"[-+]?[0-9][0-9_]*", value.strip()):  # 010, 1_000: base 10
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            share = {"warmup_steps": "warmup_ratio", "eval_steps": None, "save_steps": None, "logging_steps": None}
            if key in share and isinstance(value, float) and 0 < value < 1:  # Trainer reads a float < 1 as a share
                fix = f"set {share[key]}={value:g}" if share[key] else "give a count of optimizer steps"
                raise UserError(f"{key}={value:g} is a count of optimizer steps here, not a share of the training "
                                f"(as transformers' Trainer reads a number below 1): {fix}")  # fmt: skip
            raise UserError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 5e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if value is None and key == "output_dir":  # `output_dir=` with nothing after it
            raise UserError("output_dir is empty; give the folder the run writes to (output_dir=runs/my-run)")
        if value is None:  # null to unset a setting that has no unset: leave it out
            raise UserError(f"{key} cannot be null: leave it out (its default), or give a value (the word null as a "
                            f"value goes in quotes: '{key}=\"null\"')")  # fmt: skip
        if key == "resume_from_checkpoint" and value is True:  # Trainer's resume_from_checkpoint=True
            raise UserError("resume_from_checkpoint=true: the newest checkpoint of output_dir is "
                            "resume_from_checkpoint=latest; or give a checkpoint's folder")  # fmt: skip
        if isinstance(value, bool):  # YAML 1.1: yes, no, on, off... (null is answered above; a list's items by its check)
            read, how = f"the boolean {str(value).lower()}", f"'{key}=\"yes\"' on the command line"
            raise UserError(f"{key} must be a string, but YAML read it as {read}: put it in quotes ({how}, "
                            "or the same quotes in a recipe)")
        if isinstance(value, list) and key == "text_column" and len(value) == 2:  # a pair as one setting
            raise UserError(f"text_column is one column, got {value!r}; for sentence pairs set "
                            f"text_column={value[0]} text_pair_column={value[1]}")  # fmt: skip
        if isinstance(value, (dict, list)):
            raise UserError(f"{key} must be a string, got {value!r}")
        return str(value)
    return value


# model_config keys the app sets from the data (finetune/models.py build_model), and what to set instead.
LABEL_KEYS = {
    "num_labels": "the labels found in the data decide it (label_names fixes the set and its order)",
    "id2label": "set label_names=[...] (the names in id order)",
    "label2id": "set label_names=[...] (the names in id order)",
    "problem_type": "set problem_type= (a setting of its own)",
}


# Command-line modes that older versions kept as settings (and saved in config.yaml and manifests):
# dropped when a saved config is read, pointed to their flag when given as key=value.
MODE_FLAGS = {"dry_run": "--dry-run", "plan_only": "--plan-only"}


MAPPING_EXAMPLES = {"peft": "{r: 8, alpha: 16}", "model_config": "{model_type: bert, hidden_size: 128}"}


# transformers' TrainingArguments that are not settings here, and what does their work.
PRECISION = ("the precision is accelerate's: launch with --mixed_precision {} (or an accelerate config such as "
             "accelerate_configs/cpu_bf16.yaml, single_gpu_bf16.yaml, single_gpu_fp16.yaml)")
EVALUATION = "validation runs at each epoch's end, and every eval_steps optimizer steps when set"
OTHER_TOOLS = {
    "fp16": PRECISION.format("fp16"),
    "bf16": PRECISION.format("bf16"),
    "evaluation_strategy": EVALUATION,
    "eval_strategy": EVALUATION,
    "save_strategy": "checkpoints are saved every save_steps optimizer steps, and at each epoch's end with "
                     "save_at_epoch_end=true",
    "logging_strategy": "the loss is logged every logging_steps optimizer steps",
    "logging_dir": "the logs are written into output_dir: metrics.jsonl, and with report_to=tensorboard the "
                   "tracker's files under <output_dir>/<run name>/",
    "task_name": "run_glue's GLUE task is a data set here: dataset_name=glue dataset_config_name=<task> (e.g. mnli)",
    "pad_to_max_length": "each batch is padded to its longest sample; to pad to fixed lengths set length_buckets "
                         "(or pad_to_multiple_of)",
    "do_train": "a run always trains; test_file=... adds the test evaluation",
    "do_eval": "a run evaluates on validation_file (or a held-out share of the training data) as it trains",
    "do_predict": "predictions on a file come from finetune/evaluate_checkpoint.py <export> --data <file>",
    "max_seq_length": "the tokenizer's limit is max_length",
    "optim": "the optimizer is AdamW (fused where the device has one); set learning_rate, weight_decay, adam_beta1, "
             "adam_beta2 and adam_epsilon",
}
# Keys other tools' configs use to build on another file (mmengine's _base_, ...; Hydra's defaults: below).
INCLUDE = ("a recipe does not include another; give the base recipe to --config and your settings after it as "
           "key=value, or copy the base recipe and edit the copy")  # fmt: skip
OTHER_TOOLS.update(dict.fromkeys(("include", "includes", "_include_", "_base_", "base", "extends",
                                  "inherit", "inherits", "import", "imports"), INCLUDE))  # fmt: skip


# Short names other tools and papers use for settings here (too far from the name for difflib).
SHORT_NAMES = {
    "lr": "learning_rate", "epochs": "num_train_epochs", "num_epochs": "num_train_epochs",
    "n_epochs": "num_train_epochs", "max_epochs": "num_train_epochs", "batch_size": "per_device_train_batch_size",
    "bs": "per_device_train_batch_size", "train_batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size", "model": "model_name_or_path", "model_name": "model_name_or_path",
    "model_id": "model_name_or_path", "base_model": "model_name_or_path",
    "checkpoint": "model_name_or_path (to start from a model) or resume_from_checkpoint (to continue a run)",
    "warmup": "warmup_ratio (or warmup_steps)", "grad_accum": "gradient_accumulation_steps",
    "gradient_accumulation": "gradient_accumulation_steps", "accumulation_steps": "gradient_accumulation_steps",
    "model_type": "model_config.model_type (a model built from a config; a pretrained one: model_name_or_path)",
    "max_len": "max_length", "seq_len": "max_length", "wd": "weight_decay", "out_dir": "output_dir",
}  # fmt: skip


def _unknown_key(key: str, known: list[str], value: Any = None) -> UserError:
    if key in MODE_FLAGS:
        return UserError(f"{key} is not a setting; pass the flag {MODE_FLAGS[key]}")
    head, dot, sub = key.partition(".")
    if dot and head in known:  # model_config.hidden_size written in a recipe: the command line's form
        return UserError(f"unknown config key '{key}': in a recipe write {head}: {{{sub}: ...}} (KEY.SUBKEY=value "
                         "is the command line's form)")  # fmt: skip
    if key in ("architectures", "_name_or_path", "transformers_version"):  # a model's config.json
        return UserError(f"unknown config key '{key}': that file is a model's config.json, not a recipe; give the model "
                         "as model_name_or_path=<its folder>, and a recipe (finetune/configs/) to --config")  # fmt: skip
    if key in ("compute_environment", "distributed_type"):  # an accelerate config given as a recipe
        return UserError(f"unknown config key '{key}': that file is an accelerate config; pass it to accelerate "
                         "launch --config_file, and a recipe (finetune/configs/) to --config")  # fmt: skip
    inside = sorted(k for k in value if k in known) if isinstance(value, dict) else []
    if inside:  # a `training_args:` block holding settings (another tool's layout): a recipe is flat
        shown = ", ".join(inside[:3]) + (", ..." if len(inside) > 3 else "")
        return UserError(f"unknown config key '{key}': a recipe is flat: move the settings under it ({shown}) "
                         f"to the top level and drop '{key}:'")  # fmt: skip
    if key in OTHER_TOOLS:  # TrainingArguments' habits
        return UserError(f"unknown config key '{key}': {OTHER_TOOLS[key]}")
    if key.lower() in SHORT_NAMES:
        return UserError(f"unknown config key '{key}': the setting is {SHORT_NAMES[key.lower()]}")
    if key == "defaults" and isinstance(value, list):  # Hydra's defaults list
        return UserError("unknown config key 'defaults': a recipe is one flat YAML file, not a Hydra config; write the "
                         "settings themselves in it (one recipe's: --config <file>, then key=value to change some)")  # fmt: skip
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.52)  # not defaults -> peft (0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    return UserError(f"unknown config key '{key}'{hint}")


def settings_from_flags(argv: list[str], keys: typing.Collection[str] | None = None) -> list[str]:
    """transformers' habit beside ours: `--num_train_epochs 2` and `--num_train_epochs=2` become
    `num_train_epochs=2` (a bare `--group_by_length`: `=true`), for the setting names in `keys`
    (default: every setting); anything else is left as it is."""
    names = set(keys if keys is not None else (f.name for f in dataclasses.fields(TrainConfig)))
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        head = name.split(".")[0]
        if name and head not in names and head.replace("-", "_") in names:  # --max-steps: HfArgumentParser's too
            name = name.replace("-", "_", head.count("-"))
        elif name and head not in names:  # an option of the command (--config), or a setting mistyped
            close = difflib.get_close_matches(head.replace("-", "_").lower(), sorted(names), n=1, cutoff=0.8)
            short = SHORT_NAMES.get(head.replace("-", "_").lower())
            if short is not None and short.split()[0] in names:
                raise UserError(f"unknown setting --{head}: the setting is {short} ({short.split()[0]}=VALUE)")
            if close:
                raise UserError(f"unknown setting --{head}; did you mean --{close[0]} ({close[0]}=VALUE)?")
        if name.split(".")[0] not in names:
            out.append(token)
        elif eq:
            out.append(f"{name}={value}")
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
            out.append(f"{name}={argv[i + 1]}")
            i += 1
        elif bool in (hint := _field_types().get(name.split(".")[0]), *typing.get_args(hint)) or "." in name:
            out.append(f"{name}=true")
        else:  # `--output_dir` with nothing after it: not a flag
            raise UserError(f"--{name} needs a value: --{name} VALUE, --{name}=VALUE or {name}=VALUE")
        i += 1
    return out


DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"  # hyphen, non-breaking hyphen, figure, en and em dash, bar, minus


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` from the command line: the value read as YAML (a string where YAML fails)."""
    key, sep, text = item.partition("=")
    if item and item[0] in DASHES:  # "–-config": a dash a web page or a word processor made of "-"
        raise UserError(f"'{item}' starts with '{item[0]}' (U+{ord(item[0]):04X}), a dash that is not '-': "
                        "type the option's dashes again")  # fmt: skip
    if not sep and "\uff1d" in item:  # "max_steps＝2": a full-width equals sign
        raise UserError(f"'{item}' has '\uff1d' (U+FF1D, a full-width equals sign), not '='; type it again")
    if not sep and Path(item).expanduser().is_file() and Path(item).suffix.lower() in (".yaml", ".yml"):
        raise UserError(f"'{item}' is a file given without its option: a recipe goes after --config ({item})")
    if not sep and Path(item).expanduser().is_file():  # a data file on its own: which split is it?
        raise UserError(f"'{item}' is a file given without a key: name its split, train_file={item} (or "
                        "validation_file=, test_file=)")  # fmt: skip
    if not sep:
        raise UserError(f"expected key=value, got '{item}' (no spaces around '=': learning_rate=3e-5)")
    if not key.strip():
        raise UserError(f"expected key=value, got '{item}': the key before '=' is empty")
    if re.search(r"(^|\s)#", text) and not re.search("[\"']", text):  # unquoted: YAML would read the rest as a
        # comment, a value cut short (or null)
        fix = ("remove the comment (a list or a mapping cannot be one quoted string)" if text.lstrip()[:1] in "[{"
               else f"quote it: {key.strip()}='\"{text.strip()}\"'")  # fmt: skip
        raise UserError(f"{key.strip()}={text}: YAML reads '#' at the start of a value or after a space as a "
                        f"comment, which would cut the value; {fix}")  # fmt: skip
    try:
        return key.strip(), read_yaml(text) if text != "" else None
    except DuplicateKey as e:
        raise UserError(f"{key.strip()}={text}: {e.problem}") from None
    except yaml.YAMLError as e:
        opened = text.lstrip()[:1]
        if opened in ("[", "{"):  # meant as a list or a mapping: read as a string, it would mean something else
            closing = "]" if opened == "[" else "}"
            if closing not in text:  # label_names=[a, b] unquoted: the shell split it at the space
                raise UserError(f"{key.strip()}={text}: the value opens a YAML {'list' if opened == '[' else 'mapping'} "
                                f"with '{opened}' and never closes it: the shell splits a value at its spaces; quote "
                                f"it ({key.strip()}='{text.strip()} ...{closing}') or leave out the spaces") from None  # fmt: skip
            raise UserError(f"{key.strip()}={text}: the value opens a YAML {'list' if opened == '[' else 'mapping'} "
                            f"with '{opened}' that does not parse ({getattr(e, 'problem', None) or 'not valid YAML'}); "
                            f"check the closing '{closing}' and the commas") from None  # fmt: skip
        return key.strip(), text


def _apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    """`key=value` into the raw mapping; `model_config.image_size=32` sets one key of a mapping."""
    name, dot, sub = key.partition(".")
    if not dot:
        raw[key] = value
        return
    hint = _field_types().get(name)
    if hint is None:
        raise _unknown_key(name, list(_field_types()))
    if not sub.strip():
        raise UserError(f"{key}: the key after the dot is empty; KEY.SUBKEY=value sets one key of a mapping "
                        f"({name}.hidden_size=32)")  # fmt: skip
    if dict not in (typing.get_origin(hint), *map(typing.get_origin, typing.get_args(hint))):
        mappings = [k for k, h in _field_types().items() if "dict" in str(h)]
        raise UserError(f"{key}: {name} is not a mapping; KEY.SUBKEY=value works for {', '.join(mappings)}")
    current = raw.get(name)
    raw[name] = {**(current if isinstance(current, dict) else {}), sub: value}


def resumed_run_recipe(overrides: list[str]) -> Path | None:
    """The saved config.yaml of the run that `overrides` resume (`resume_from_checkpoint=latest`, in
    output_dir or the default recipe's; or a checkpoint directory), for a command that names no recipe."""
    from finetune.rundir import resumed_run_config

    given = dict(parse_override(item) for item in overrides)
    default = (yaml.safe_load(DEFAULT_RECIPE.read_text()) or {}).get("output_dir", "")
    return resumed_run_config(given.get("resume_from_checkpoint"), given.get("output_dir") or default)


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping that sets one key twice: YAML forbids it, PyYAML keeps the last value without a word."""


class RecipeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key set twice in one mapping (`max_steps: 4` ... `max_steps: 6`), at
    any depth, naming the key and both lines; merge keys (`<<: *defaults`) may still be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    break
                if first is not None:
                    where = f"twice on line {line}" if first == line else f"twice, on line {first} and line {line}"
                    raise DuplicateKey(None, None, f"{key} is set {where}: keep one", key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


    def construct_yaml_int(self, node):
        """YAML 1.1 reads 010 as octal 8, 0x1f as 31, 1_000 as 1000 and 1:30 as 90: an integer written so is
        kept as its text, which a string setting takes as written (label_names=[01, 1] are two names)
        and an integer setting reads in base 10."""
        text = self.construct_scalar(node)
        return super().construct_yaml_int(node) if PLAIN_INTEGER.fullmatch(text) else text


PLAIN_INTEGER = re.compile(r"[-+]?(0|[1-9][0-9]*)")
RecipeLoader.add_constructor("tag:yaml.org,2002:int", RecipeLoader.construct_yaml_int)


def read_yaml(text: str) -> Any:
    """YAML as a recipe is read: safe, and a key set twice in one mapping is an error (DuplicateKey)."""
    return yaml.load(text, Loader=RecipeLoader)  # noqa: S506 - RecipeLoader is a SafeLoader


FILE_KEYS, FOLDER_KEYS = ("train_file", "validation_file", "test_file"), ("data_dir", "dataset_name", "dataset_config_name")


def _data_source_from_command_line(raw: dict[str, Any], given: dict[str, Any], saved: bool = False) -> None:
    """The data comes from files or from a folder (or the hub), not both: the loader reads the files when
    there are any and ignores data_dir, and an imagefolder or hub dataset_name ignores the files. So a
    command line that names one source (data_dir=..., or train_file=...) and no value for the other's keys
    replaces the recipe's other source: `task=image-classification data_dir=imgs` over the default
    (text) recipe reads imgs, not the recipe's CSV files. Chosen over a refusal because the command line
    is the more specific layer and its meaning is not in doubt; config.yaml shows the result. Both named
    (train_file and an image folder's data_dir) are refused by `TrainConfig.validate`."""
    for source, other in (("data_dir", FILE_KEYS), ("train_file", FOLDER_KEYS)):
        if given.get(source) is not None and all(given.get(key) is None for key in other):
            for key in other:
                raw.pop(key, None)
    if not saved:  # a run's own config.yaml holds the user's files, not a recipe's
        _warn_of_the_recipe_s_evaluation_files(raw, given)
    _model_from_command_line(raw, given)


def _model_from_command_line(raw: dict[str, Any], given: dict[str, Any]) -> None:
    """A model comes from pretrained weights (model_name_or_path) or is built at random from model_config,
    and model_config wins when both are set (finetune/models.py: the name then only supplies the tokenizer
    or image processor). So `model_name_or_path=<weights>` on the command line over a recipe that has a
    model_config (the ViT recipes) would train a random model and ignore the weights without a word: a
    command line that names model_name_or_path and says nothing of model_config drops the recipe's
    model_config, as `_data_source_from_command_line` drops the recipe's other data source. Chosen over a
    refusal because the command line is the more specific layer and what it asks for is not in doubt
    (the recipes' own comments say `model_config=null model_name_or_path=...`); config.yaml shows the
    result. Naming both (model_config=... or model_config.KEY=...) keeps both, as before."""
    names_config = any(key == "model_config" or key.startswith("model_config.") for key in given)
    name = given.get("model_name_or_path")
    if name is not None and not names_config:
        raw.pop("model_config", None)
    elif name is not None and raw.get("model_config") is not None and os.environ.get("RANK", "0") == "0" \
            and f"both:{name}" not in _warned:  # both asked for: the weights would be left unread without a word  # fmt: skip
        _warned.add(f"both:{name}")
        use = "is not used (tokenizer_name gives the tokenizer)" if raw.get("tokenizer_name") else \
            "gives only the tokenizer, not its weights"  # fmt: skip
        print(f"warning: model_config builds the model at random, so model_name_or_path={name} {use}; to fine-tune "
              f"{name}, set model_config=null", file=sys.stderr)  # fmt: skip


_warned: set[str] = set()  # the command line is parsed twice in one process (before torch, then by the run)


def _warn_of_the_recipe_s_evaluation_files(raw: dict[str, Any], given: dict[str, Any]) -> None:
    """A train_file of the user's own beside the recipe's validation_file or test_file from another folder
    (`--config finetune/configs/bert_ner.yaml train_file=mine.jsonl` keeps the bundled test set) is
    kept, since a bigger training file of the same data is a fair use, but said in one line with the fix:
    scoring one data set's model on another's test set is rarely what was meant."""
    train = given.get("train_file")
    if not isinstance(train, str) or os.environ.get("RANK", "0") != "0":
        return
    for key in ("validation_file", "test_file"):
        theirs = raw.get(key)
        if key in given or not isinstance(theirs, str) or theirs in _warned:
            continue
        if Path(theirs).expanduser().resolve().parent != Path(train).expanduser().resolve().parent:
            _warned.add(theirs)
            print(f"warning: train_file is yours but {key} is the recipe's ({theirs}); set {key}=<your file>, "
                  f"or {key}=null to leave it out", file=sys.stderr)  # fmt: skip


# What a recipe file's YAML error means, and its fix.
YAML_FIXES = {
    "could not determine a constructor": "; a recipe holds plain values: remove the tag (a !!python/... tag is "
                                         "never run)",
    "another document": "; a recipe is one YAML document: remove the '---' line and what follows it, or merge them",
    "'\\t' that cannot start any token": "; indent with spaces: YAML allows no tabs there",
}


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, saved: bool = False
) -> TrainConfig:
    """Build the config from the default recipe (or `path`) plus `key=value` overrides. `saved`:
    `path` is a run's config.yaml, maybe written by an older version."""
    recipe = Path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        what = "is a folder, not a recipe file" if recipe.is_dir() else "not found"
        raise UserError(f"config file {what}: {recipe}")
    try:
        text = recipe.read_text()
        raw = _config_in_manifest(recipe, text) if saved and recipe.name == MANIFEST else read_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = str(getattr(e, "problem", e))
        fix = next((fix for sign, fix in YAML_FIXES.items() if sign in problem), "")
        if saved:  # the run's own config.yaml, edited or damaged since the run wrote it
            fix += f"; repair it, or delete it: a resume then reads the config saved in its checkpoint's {MANIFEST}"
        raise UserError(f"{recipe} is not valid YAML{where}: {problem}{fix}") from None
    except UnicodeDecodeError:
        raise UserError(f"{recipe} is not a text file (UTF-8); a recipe is a YAML file of settings") from None
    if raw is None:
        raise UserError(
            f"{recipe} is empty; a recipe is a YAML mapping of settings (finetune/configs/ has examples)"
        )
    if not isinstance(raw, dict):
        raise UserError(f"{recipe} must hold a mapping of config keys, got {type(raw).__name__}")

    # Relative data/model paths in a recipe are relative to the repository, so a recipe works
    # from any working directory; paths given on the command line are relative to the cwd.
    for key in PATH_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value.startswith(("data/", "./data/")):
            raw[key] = str(REPO_DIR / value)

    given = dict(parse_override(item) for item in overrides or [])
    # The recipe's label_names over data the command line names: they were written for the recipe's own data
    # (finetune/problems.py says so when they decode integer tag ids, which nothing could check).
    names_of_recipe = (not saved and raw.get("label_names") and "label_names" not in given
                       and any(given.get(key) is not None for key in ("train_file", "data_dir", "dataset_name")))  # fmt: skip
    _data_source_from_command_line(raw, given, saved)
    for item in overrides or []:
        _apply_override(raw, *parse_override(item))
    if not saved and isinstance(raw.get("task"), str) and raw["task"] in TASKS and "freeze_embeddings" not in given \
            and not task_of(raw["task"]).has_word_embeddings:  # fmt: skip
        raw["freeze_embeddings"] = False  # a text recipe's, under task=image-classification: nothing to freeze
    # Saved configs must work from any directory: local paths become absolute.
    for key in (*PATH_KEYS, "output_dir"):
        value = raw.get(key)
        if isinstance(value, str) and re.search(r"\$(\{\w+\}|[A-Za-z_]\w*)", value):  # read as it is written
            raise UserError(f"{key}={value}: environment variables are not expanded in settings; write the path out "
                            f"(on the command line the shell expands it: {key}=$HOME/...)")  # fmt: skip
        # ~/data too: the card shows paths under home so, quoted (no shell expands them)
        if isinstance(value, str) and (key == "output_dir" or Path(value).expanduser().exists()):
            raw[key] = str(Path(value).expanduser().resolve())
    try:
        cfg = config_from_dict(raw, saved=saved)
    except UserError as e:  # a value of the run's own config.yaml (edited since), not of the command line
        key = re.split(r"[\s\[.=]", str(e), maxsplit=1)[0]
        named = {name.split(".")[0] for name in given if re.search(rf"\b{re.escape(name.split('.')[0])}\b", str(e))}
        if not saved or recipe.name == MANIFEST or key in given or key.split("=")[0] in given or named:
            raise  # a check that names a setting the command line gave (model_config=null): the command line's
        raise UserError(f"{recipe}, the run's saved config: {e}; repair it there, or delete it: a resume then reads "
                        f"the config saved in its checkpoint's {MANIFEST}") from None
    _check_other_tasks_settings(cfg, {key.split(".")[0] for key in given})
    object.__setattr__(cfg, "label_names_recipe", str(recipe) if names_of_recipe else None)
    return cfg


def _check_other_tasks_settings(cfg: TrainConfig, given: set[str]) -> None:
    """Settings that only another task reads (label_all_tokens on a sentence classifier, group_by_length
    on images), given on the command line: ignored without a word otherwise. A recipe's own are left
    alone (`task=image-classification data_dir=imgs` over the default text recipe reads the images);
    random_flip and augment on text have their own line, in the data checks."""
    if not cfg.task:
        return
    own = task_of(cfg.task).own_settings
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cfg) if f.init}  # fmt: skip
    foreign = {name for t in TASKS.values() for name in t.own_settings} - own - {"random_flip", "augment"}
    named = [name for name in sorted(foreign & given) if getattr(cfg, name) != defaults[name]]
    if named:
        owners = sorted({t.name for t in TASKS.values() for name in named if name in t.own_settings})
        shown = ", ".join(f"{n}={str(v).lower() if isinstance(v := getattr(cfg, n), bool) else v}" for n in named)
        raise UserError(
            f"{shown} {'is a setting' if len(named) == 1 else 'are settings'} of {' and '.join(owners)} runs, which "
            f"a{'n' * (cfg.task[0] in 'aeiou')} {cfg.task} run does not read: leave {'it' if len(named) == 1 else 'them'} "
            "out (or, if the task is wrong, set task=)"
        )


def _config_in_manifest(path: Path, text: str) -> dict[str, Any]:
    """The resolved config a checkpoint's manifest.json holds: the recipe of a run whose config.yaml is
    gone (rundir.resumed_run_config)."""
    import json

    try:
        config = json.loads(text).get("config")
    except (ValueError, AttributeError):
        config = None
    if not isinstance(config, dict):
        raise UserError(f"{path} holds no config of its run; resume with --config <the run's recipe>")
    return config


def config_from_dict(raw: dict[str, Any], saved: bool = False) -> TrainConfig:
    """The config from a mapping; `saved`: a run's config.yaml or manifest, maybe of an older version."""
    hints = _field_types()
    values = {}
    for key, value in raw.items():
        if saved and key in MODE_FLAGS:
            continue
        if key not in hints:
            raise _unknown_key(key, list(hints), value)
        values[key] = _coerce(key, value, hints[key])
    return TrainConfig(**values)


def save_config(config: TrainConfig, path: str | Path) -> None:
    """A run's config.yaml: its resolved settings. resume_from_checkpoint is the command's, not the run's
    (the next resume names its own): saved null, so the file given as a new run's recipe starts it afresh."""
    Path(path).write_text(yaml.safe_dump({**config.to_dict(), "resume_from_checkpoint": None}, sort_keys=False))


# --- --help -------------------------------------------------------------------------------------

def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args if a is not type(None)) + " | null"
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_help(recipe: str | Path | None = None, names: typing.Collection[str] | None = None) -> str:
    """Every setting (or those in `names`), grouped as in TrainConfig: `name: type = default`, its
    help, and the value the recipe sets where it differs from the default."""
    path = Path(recipe) if recipe is not None else DEFAULT_RECIPE
    unread = None
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:  # the help still prints, with the defaults; the first line says why
        values, unread = {}, "not found" if isinstance(e, FileNotFoundError) else f"not read ({first_line(e)})"
    values = values if isinstance(values, dict) else {}
    hints = _field_types()
    lines = [f"settings (key=value, or in a recipe; 'recipe:' is what {path.name} sets):" if unread is None else
             f"settings (key=value, or in a recipe; the recipe {path} is {unread}: the defaults are shown):"]
    if unread is not None:
        warn(f"--config {path} is {unread}; the help shows the defaults")
    for section in SECTIONS:
        if names is None:
            lines += ["", f"{section.TITLE}:"]
        for f in section_fields(section):
            if names is not None and f.name not in names:
                continue
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            line = f"  {f.name}: {_type_name(hints[f.name])} = {_shown(default)}"
            if f.name in values and values[f.name] != default:
                line += f"    (recipe: {_shown(values[f.name])})"
            lines += [line, f"      {f.metadata['help']}"]
    return "\n".join(lines)
