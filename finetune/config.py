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

import contextlib
import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from finetune import checks, lora
from finetune.checks import settings
from finetune.errors import UserError
from finetune.layout import MANIFEST
from finetune.metrics import METRICS, PROBLEMS
from finetune.tasks import TASK_NAMES, TASKS, task_of

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CONFIGS_DIR = PACKAGE_DIR / "configs"
DEFAULT_RECIPE = CONFIGS_DIR / "bert_rotten_tomatoes.yaml"
# Keys that hold a local path (or a hub name): resolved against the repository or the cwd.
PATH_KEYS = ("model_name_or_path", "tokenizer_name", "image_processor_name", "train_file", "validation_file",
             "test_file", "data_dir")  # fmt: skip

TaskName = Literal[TASK_NAMES]  # type: ignore[valid-type]  # finetune/tasks/
SchedulerType = Literal["linear", "cosine", "constant"]
LogLevel = Literal["debug", "info", "warning", "error"]
AttnImplementation = Literal["eager", "sdpa"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]  # torch.compile's
# transformers' names (PretrainedConfig.problem_type): what the pipeline and the loss follow.
ProblemType = Literal[tuple(PROBLEMS)]  # type: ignore[valid-type]  # finetune/metrics.py


def setting(default: Any = None, help: str = "", *, factory: Any = None, evaluation: bool = False) -> Any:
    """A field with its one-line help, as transformers' `field(metadata={"help": ...})`; `evaluation`:
    `evaluate_checkpoint.py` may change it (how data is read and batched, how processes run)."""
    metadata = {"help": help, "evaluation": evaluation}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# --- the sections ---------------------------------------------------------------------------------


@dataclass(frozen=True)
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
        "for token-classification the tags': token_classification for IOB2, word_tagging for plain tags)",
    )
    label_names: list[str] | None = setting(
        None, "the label set and its order (default: the sorted labels of train)"
    )
    seed: int = setting(
        42, "seed of the weights' initialisation, the data order, dropout and the held-out split"
    )


@dataclass(frozen=True)
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
    # Convolutional models only: time goes with the square of the size; the export's processor keeps it.
    image_size: int | None = setting(
        None, "images: resize to this many pixels square instead of the image processor's size (convolutional models)"
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
    # Frozen, BatchNorm's scale and shift still train, and accumulation equals one big batch (topologies.md).
    freeze_batchnorm: bool = setting(
        False, "BatchNorm layers keep their loaded statistics: eval mode in training too (pretrained models)"
    )
    # DDP then equals one big batch; accumulation still normalises each micro-batch alone.
    sync_batchnorm: bool = setting(
        False, "DDP on GPUs: BatchNorm statistics over every process's batch (torch.nn.SyncBatchNorm)"
    )
    # Keep only each layer's input during forward and recompute the rest in backward: less activation
    # memory for more compute (transformers' activation checkpointing).
    gradient_checkpointing: bool = setting(
        False, "recompute activations in backward: less memory, more compute"
    )
    # Attention kernel. On a CPU under bf16 autocast, SDPA's fused flash-attention backward is slow: eager
    # softmax(QK^T)V trains faster up to 192 tokens a sample, SDPA past that (runtime.py, EAGER_UP_TO_TOKENS).
    # In fp32 the two are a wash; on a GPU SDPA wins. Evaluation reads with SDPA (it has no backward).
    attn_implementation: AttnImplementation | None = setting(
        None, "attention kernel: eager, sdpa (null: under bf16 on a CPU eager up to 192 tokens, else transformers' default)"
    )
    # LoRA through peft (pip install peft): low-rank adapters on the target linear layers and the head
    # train, every other weight stays frozen; the export has the adapters merged, and <output_dir>/adapter
    # holds them alone in peft's format (finetune/lora.py).
    peft: dict[str, Any] | None = setting(
        None,
        "LoRA instead of full fine-tuning: {r: 8, alpha: 16, dropout: 0.0, target_modules: [query, value]}",
    )


@dataclass(frozen=True)
class DataArgs(TaskArgs):
    """The data: where it is, which columns hold what, how it is cut and batched."""

    TITLE: ClassVar[str] = "data"

    # A hub dataset name or a builder ("imagefolder", "csv", "json", "parquet"); or give files.
    dataset_name: str | None = setting(None, "a hub dataset, or a builder (imagefolder, csv, json, parquet)")
    dataset_config_name: str | None = setting(None, "the hub dataset's configuration (e.g. sst2 of glue)")
    data_dir: str | None = setting(
        None, "an image folder: <data_dir>/train/<label>/<image> (validation/, test/ optional)"
    )
    train_file: str | None = setting(None, "training data: .csv, .tsv, .json, .jsonl, .parquet, .arrow or CoNLL")
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
    # Extractive question answering (the Hub's squad layout): a question, the context that holds its answer,
    # and the answers as {text: [...], answer_start: [...]} (character offsets into the context).
    question_column: str = setting("question", "question answering: the column of questions", evaluation=True)
    context_column: str = setting("context", "question answering: the column of contexts", evaluation=True)
    answers_column: str = setting("answers", "question answering: the answers, {text: [...], answer_start: [...]}",
                                  evaluation=True)  # fmt: skip
    doc_stride: int = setting(128, "question answering: tokens the windows of a long context overlap", evaluation=True)
    # Each window trains on its text's label; a text's prediction is the mean of its windows' logits.
    text_windows: int | None = setting(
        None, "text classification: read a long text whole, in windows of max_length overlapping by this many tokens",
        evaluation=True,
    )
    n_best_size: int = setting(20, "question answering: start and end candidates a window offers", evaluation=True)
    max_answer_length: int = setting(30, "question answering: the longest answer, in tokens", evaluation=True)
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
    # train_file (csv, tsv, json, jsonl, parquet) or the hub's train split read as it trains (docs/streaming.md).
    streaming: bool = setting(False, "text: read the training data as a stream, never whole (needs max_steps)")
    stream_buffer: int = setting(1000, "streaming: samples a process reads ahead, shuffled (and grouped) within (0: file order)")
    # Pad every text batch to the smallest of K lengths chosen from the data (finetune/shapes.py), not
    # to its own longest: the few shapes a compiled model (torch_compile) compiles once. null: per batch.
    length_buckets: int | None = setting(None, "text: pad each batch to one of this many lengths chosen from the data (for torch_compile)")
    # Off unless the recipe says its images keep their class when mirrored: a flip turns digits, text
    # and many medical images into something else.
    random_flip: bool = setting(False, "images: random horizontal flip of training images (for mirror-invariant classes)")
    # Images: training augmentation ops, seeded by (seed, epoch, sample) so a resume stays exact
    # (finetune/images.py, Augment): crop (random resized crop), color (brightness, contrast,
    # saturation), trivial (one TrivialAugment-Wide op a sample).
    augment: list[str] = setting(
        help="images: training augmentation: any of crop, color, trivial (random_flip adds the flip)", factory=list
    )
    # Worker processes that collate batches. null: the task's choice (finetune/tasks/: 2 for text on
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

    def setting_of(self, column: str) -> str:
        """The setting that names `column` (label_columns for one of those)."""
        names = ("label_column", "text_column", "text_pair_column", "tokens_column", "tags_column", "image_column",
                 "question_column", "context_column", "answers_column")  # fmt: skip
        return next((n for n in names if getattr(self, n, None) == column), "label_columns")

    @property
    def input_columns(self) -> list[str]:
        """The task's input columns ([] before the task is known)."""
        return task_of(self.task).input_columns(self) if self.task else []


@dataclass(frozen=True)
class OptimArgs:
    """Optimisation: how long, in which batches, with which optimizer and schedule."""

    TITLE: ClassVar[str] = "optimisation"

    num_train_epochs: float = setting(3.0, "passes over the training data (1.5: one and a half)")
    max_steps: int | None = setting(None, "optimizer steps to train; overrides num_train_epochs")
    per_device_train_batch_size: int = setting(32, "training samples per process per micro-batch")
    per_device_eval_batch_size: int = setting(64, "evaluation samples per process per batch", evaluation=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


SECTIONS: tuple[type, ...] = (TaskArgs, ModelArgs, DataArgs, OptimArgs, RunArgs, ParallelArgs)


def section_fields(section: type) -> list[dataclasses.Field]:
    """The fields a section declares itself (not those it inherits), in order."""
    own = section.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(section) if f.name in own]


@dataclass(frozen=True)
class TrainConfig(ParallelArgs, RunArgs, OptimArgs, DataArgs, ModelArgs):
    """Every setting of a run, section by section (the bases in reverse: dataclasses collect fields
    from the last base first, so the fields come in SECTIONS' order). Names follow transformers'
    TrainingArguments where one exists; each field's help is what `run.py --help` prints (the longer
    reasons are comments)."""

    def to_dict(self) -> dict[str, Any]:
        """Section by section, as config.yaml shows it."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def data_args(self) -> DataArgs:
        """The data section, for the data builders (`data.py`)."""
        return _view(DataArgs, self)

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


@functools.cache
def field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(TrainConfig)}


class NotOfType(Exception):
    """A value its setting's type does not take; `checks/settings.py` (WRONG_TYPE) says why, in words."""

    def __init__(self, key: str, value: Any, hint: Any):
        super().__init__(key)
        self.key, self.value, self.hint = key, value, hint


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` as the field's type takes it (strings from the command line were parsed as YAML), or NotOfType."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except NotOfType as e:
                if e.key != key:  # an item of a list: that item's own
                    raise
        raise NotOfType(key, value, hint)
    if origin is Literal:
        if isinstance(value, bool) and ("off" if value is False else "on") in args:
            value = "off" if value is False else "on"  # YAML 1.1 reads a bare off / on as a boolean
        if value in args:
            return value
    elif origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]  # "neg, pos": as a YAML list reads it
        booleans = args[0] is str and isinstance(value, list) and any(v is None or isinstance(v, bool) for v in value)
        if isinstance(value, list) and not booleans:  # [no, yes]: YAML's booleans, not names
            return [_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    elif origin is dict:
        if isinstance(value, dict):
            return value
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, str) and re.fullmatch(r"[-+]?[0-9][0-9_]*", value.strip()):  # 010, 1_000: base 10
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 5e-5 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if value is not None and not isinstance(value, (bool, dict, list)):
            return str(value)
    else:
        return value
    raise NotOfType(key, value, hint)


def _filled_in(values: dict[str, Any]) -> dict[str, Any]:
    """What a setting's value implies, written out as config.yaml saves it: transformers' `report_to=none`
    as no tracker, LoRA's defaults, and greater_is_better from the metric that picks the best checkpoint."""
    if values.get("report_to") == ["none"]:
        values["report_to"] = []
    if isinstance(values.get("peft"), dict):
        values["peft"] = lora.with_defaults(values["peft"])
    metric = values.get("metric_for_best_model")
    if metric is not None and values.get("greater_is_better") is None:
        values["greater_is_better"] = METRICS[metric].greater_is_better if metric in METRICS else True
    return values


def _known(cfg: TrainConfig) -> Callable[[checks.Rule], bool]:
    """Which rules can judge `cfg`: those whose `needs` it holds (the task, the problem type)."""
    return lambda r: all(getattr(cfg, need) is not None for need in r.needs)


def config_from_dict(raw: dict[str, Any], saved: bool = False, said: checks.Said | None = None) -> TrainConfig:
    """The config from a mapping, every value coerced to its type and the settings' rules asked (those
    that need the task or problem type once they are known: `resolved`); `saved`: a run's config.yaml or
    manifest, maybe of an older version."""
    hints = field_types()
    values = {}
    for key, value in raw.items():
        if saved and key in settings.MODE_FLAGS:
            continue
        if key not in hints:
            raise checks.explain(settings.UNKNOWN_KEY, key, list(hints), value)
        try:
            values[key] = _coerce(key, value, hints[key])
        except NotOfType as e:
            raise checks.explain(settings.WRONG_TYPE, e.key, e.value, e.hint) from None
    cfg = TrainConfig(**_filled_in(values))
    checks.gate(settings.CONFIG, cfg, said=said or checks.Said(), known=_known(cfg))
    return cfg


def resolved(cfg: TrainConfig, said: checks.Said, **decided: str) -> TrainConfig:
    """The run's config once its data has decided what the recipe left to it (`decided`: the task, then the
    problem type, with the metric that picks the best checkpoint, the problem's first, and its direction).
    The rules that waited for them are asked now, once each; the config used from here on is this one."""
    if decided.get("problem_type"):
        metric = cfg.metric_for_best_model or PROBLEMS[decided["problem_type"]].reported[0]
        decided.update(_filled_in({"metric_for_best_model": metric, "greater_is_better": cfg.greater_is_better}))
    done = dataclasses.replace(cfg, **decided)
    before, after = _known(cfg), _known(done)
    checks.gate(settings.CONFIG, done, said=said, known=lambda r: after(r) and not before(r))
    return done


def save_config(config: TrainConfig, path: str | Path) -> None:
    """A run's config.yaml: its resolved settings. resume_from_checkpoint is the command's, not the run's
    (the next resume names its own): saved null, so the file given as a new run's recipe starts it afresh."""
    Path(path).write_text(yaml.safe_dump({**config.to_dict(), "resume_from_checkpoint": None}, sort_keys=False))


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
            checks.gate(settings.FLAG_UNKNOWN, head, names)
        if name.split(".")[0] not in names:
            out.append(token)
        elif eq:
            out.append(f"{name}={value}")
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
            out.append(f"{name}={argv[i + 1]}")
            i += 1
        elif bool in (hint := field_types().get(name.split(".")[0]), *typing.get_args(hint)) or "." in name:
            out.append(f"{name}=true")
        else:  # `--output_dir` with nothing after it: not a flag
            raise checks.explain(settings.FLAG_WITHOUT_VALUE, name)
        i += 1
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` from the command line: the value read as YAML (a string where YAML fails)."""
    checks.gate(settings.OVERRIDE, item)
    key, _, text = item.partition("=")
    key = key.strip()
    try:
        return key, read_yaml(text) if text != "" else None
    except yaml.YAMLError as e:
        found = checks.first(settings.OVERRIDE_UNPARSED, key, text, e)
        if found is not None:
            raise checks.refusal(*found) from None
        return key, text


def _apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    """`key=value` into the raw mapping; `model_config.image_size=32` sets one key of a mapping."""
    name, dot, sub = key.partition(".")
    if not dot:
        raw[key] = value
        return
    hints = field_types()
    if name not in hints:
        raise checks.explain(settings.UNKNOWN_KEY, name, list(hints), None)
    checks.gate(settings.SUBKEY, key, hints[name], [k for k, h in hints.items() if "dict" in str(h)])
    current = raw.get(name)
    raw[name] = {**(current if isinstance(current, dict) else {}), sub: value}


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
DATA_KEYS = ("train_file", "data_dir", "dataset_name")


def _same_data(a: Any, b: Any) -> bool:
    """Whether two values of a data setting name the same data (a path relative or absolute, or a name)."""
    if isinstance(a, str) and isinstance(b, str) and Path(a).expanduser().exists():
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return a == b


def _command_line_over_recipe(raw: dict[str, Any], given: dict[str, Any], said: checks.Said, saved: bool) -> None:
    """What the command line's data or model replaces of the recipe, as the more specific layer whose
    meaning is not in doubt (config.yaml shows the result; both sources named are refused by the rules):

    - the data comes from files or from a folder (or the hub), not both: a command line that names one
      source (data_dir=..., or train_file=...) and no value for the other's keys drops the recipe's other
      source (`task=image-classification data_dir=imgs` over the text recipe reads imgs, not its CSVs);
    - the label_names of a recipe that names its own data were written for that data: a command line that
      names other data and no label_names drops them (a user's files bring their own labels and tags);
    - a model comes from pretrained weights or is built at random from model_config, which wins when both
      are set: a command line that names model_name_or_path and nothing of model_config drops the recipe's
      model_config (the ViT recipes' comments say `model_config=null model_name_or_path=...`).
    """
    for source, other in (("data_dir", FILE_KEYS), ("train_file", FOLDER_KEYS)):
        if given.get(source) is not None and all(given.get(key) is None for key in other):
            for key in other:
                raw.pop(key, None)
    if not saved and "label_names" not in given and any(raw.get(k) is not None for k in DATA_KEYS) and any(
            given.get(k) is not None and not _same_data(given[k], raw.get(k)) for k in DATA_KEYS):  # fmt: skip
        raw.pop("label_names", None)
    if not saved:  # a run's own config.yaml holds the user's files, not a recipe's
        for key in ("validation_file", "test_file", *settings.SAMPLE_CAPS):  # its files, its caps on them
            checks.gate(settings.RECIPE_OVER_COMMAND_LINE, raw, given, key, said=said)
    names_config = any(key == "model_config" or key.startswith("model_config.") for key in given)
    if given.get("model_name_or_path") is not None and not names_config:
        raw.pop("model_config", None)
    checks.gate(settings.MODEL_OVER_COMMAND_LINE, raw, given, said=said)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, saved: bool = False,
                said: checks.Said | None = None) -> TrainConfig:  # fmt: skip
    """Build the config from the default recipe (or `path`) plus `key=value` overrides. `saved`: `path`
    is a run's config.yaml, maybe written by an older version. `said`: the run's warnings (one of its own
    if none is given)."""
    said = said if said is not None else checks.Said()
    recipe = Path(path) if path is not None else DEFAULT_RECIPE
    checks.gate(settings.RECIPE_FILE, recipe)
    try:
        text = recipe.read_text()
        raw = _config_in_manifest(recipe, text) if saved and recipe.name == MANIFEST else read_yaml(text)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise checks.explain(settings.RECIPE_UNREAD, recipe, e, saved) from None
    checks.gate(settings.RECIPE, recipe, raw)
    # Relative data/model paths in a recipe are relative to the repository, so a recipe works
    # from any working directory; paths given on the command line are relative to the cwd.
    for key in PATH_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value.startswith(("data/", "./data/")):
            raw[key] = str(REPO_DIR / value)
    given = dict(parse_override(item) for item in overrides or [])
    _command_line_over_recipe(raw, given, said, saved)
    for item in overrides or []:
        _apply_override(raw, *parse_override(item))
    if not saved and isinstance(raw.get("task"), str) and raw["task"] in TASKS and "freeze_embeddings" not in given \
            and not task_of(raw["task"]).has_word_embeddings:  # fmt: skip
        raw["freeze_embeddings"] = False  # a text recipe's, under task=image-classification: nothing to freeze
    # Saved configs must work from any directory: local paths become absolute.
    for key in (*PATH_KEYS, "output_dir"):
        value = raw.get(key)
        checks.gate(settings.PATHS, key, value)
        # ~/data too: the card shows paths under home so, quoted (no shell expands them)
        if isinstance(value, str) and (key == "output_dir" or Path(value).expanduser().exists()):
            raw[key] = str(Path(value).expanduser().resolve())
    try:
        cfg = config_from_dict(raw, saved=saved, said=said)
    except UserError as e:  # a value of the run's own config.yaml (edited since), not of the command line
        key = re.split(r"[\s\[.=]", str(e), maxsplit=1)[0]
        named = {name.split(".")[0] for name in given if re.search(rf"\b{re.escape(name.split('.')[0])}\b", str(e))}
        if not saved or recipe.name == MANIFEST or key in given or key.split("=")[0] in given or named:
            raise  # a check that names a setting the command line gave (model_config=null): the command line's
        raise checks.explain(settings.SAVED_CONFIG, recipe, e) from None
    checks.gate(settings.GIVEN, cfg, {key.split(".")[0] for key in given})
    return cfg


def _config_in_manifest(path: Path, text: str) -> dict[str, Any]:
    """The resolved config a checkpoint's manifest.json holds: the recipe of a run whose config.yaml is
    gone (rundir.resumed_run_config gives only a manifest that holds one)."""
    import json

    return json.loads(text)["config"]
