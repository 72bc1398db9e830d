"""The typed config: dataclass defaults < a YAML recipe < `key=value` on the command line.

    accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml learning_rate=3e-4

Hardware (processes, devices, mixed precision, machines) is NOT here: it belongs to the accelerate
config and is read back from the `Accelerator`. Unknown keys and wrong types are errors that name
the key and the nearest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from finetune.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
CONFIGS_DIR = PACKAGE_DIR / "configs"
DEFAULT_RECIPE = CONFIGS_DIR / "bert_rotten_tomatoes.yaml"
# Keys that hold a local path (or a hub name): resolved against the repository or the cwd.
PATH_KEYS = ("model_name_or_path", "tokenizer_name", "image_processor_name", "train_file", "validation_file",
             "test_file", "data_dir")  # fmt: skip

Task = Literal["text-classification", "image-classification"]
SchedulerType = Literal["linear", "cosine", "constant"]


@dataclass
class TrainConfig:
    """Every setting of a run. Names follow transformers' TrainingArguments where one exists."""

    # --- what to train --------------------------------------------------------------------------
    task: Task = "text-classification"
    # A hub name or a local directory. With `model_config`, only its tokenizer/processor is used.
    model_name_or_path: str | None = None
    # Build the model from a config instead of pretrained weights, e.g. a tiny BERT for tests:
    # {model_type: bert, hidden_size: 32, num_hidden_layers: 2, ...}.
    model_config: dict[str, Any] | None = None
    tokenizer_name: str | None = None  # text: defaults to model_name_or_path
    image_processor_name: str | None = None  # image: defaults to model_name_or_path
    trust_remote_code: bool = False  # run Python code shipped with a hub model: only for sources you trust
    # Pretrained weights load from safetensors only; true also allows pytorch_model.bin (a pickle).
    allow_pickle_weights: bool = False

    # --- data -------------------------------------------------------------------------------------
    # A hub dataset name or a builder ("imagefolder", "csv", "json", "parquet"); or give files.
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    data_dir: str | None = None  # for "imagefolder" (or a hub dataset's data_dir)
    train_file: str | None = None  # .csv, .json, .jsonl or .parquet
    validation_file: str | None = None
    test_file: str | None = None
    text_column: str = "text"
    text_pair_column: str | None = None  # sentence pairs: the second sentence's column
    image_column: str = "image"
    label_column: str = "label"
    max_length: int = 128  # tokens; longer texts are truncated
    # Text batches are padded to their longest sequence, rounded up to a multiple of this (8 suits
    # tensor cores; max_length pads every batch to one fixed length). null: no rounding.
    pad_to_multiple_of: int | None = 8
    # When the data has no validation split: the share of train held out, stratified and seeded.
    validation_split_percentage: float = 10.0
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_test_samples: int | None = None
    group_by_length: bool = False  # text: batch similar lengths together (less padding)
    random_flip: bool = True  # images: random horizontal flip of training images
    # Worker processes that collate batches. null: 2 for text on a GPU (collating BERT-base batches of
    # 128 in the training process took 17-21 ms of a 72 ms step on an H100), else 0 (on a CPU a worker
    # competes for the cores; image workers would draw random flips from seeds a resume cannot restore).
    dataloader_num_workers: int | None = None
    # GPU: batches in page-locked memory, copied to the device without blocking the host (no effect on CPU).
    dataloader_pin_memory: bool = True
    # Torch threads per process when training on CPU. None: the cores this process may use (affinity,
    # container quota), divided by the processes on this machine, whatever OMP_NUM_THREADS says
    # (`accelerate launch` sets it to 1 unless told otherwise: a GPU default that idles a CPU's cores).
    cpu_threads: int | None = None

    # --- optimisation -----------------------------------------------------------------------------
    seed: int = 42
    num_train_epochs: int = 3
    max_steps: int | None = None  # optimizer steps; overrides num_train_epochs when set
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    lr_scheduler_type: SchedulerType = "linear"
    warmup_ratio: float = 0.0  # share of the optimizer steps spent warming up
    warmup_steps: int | None = None  # overrides warmup_ratio when set
    max_grad_norm: float | None = 1.0
    dropout: float | None = None  # set every dropout probability of the model (0 turns dropout off)
    # Text: keep the word-embedding table as loaded (no gradient, no optimizer state). For MiniLM it
    # is half of the weights, so half of AdamW's memory traffic and no dense 30522 x 384 gradient.
    freeze_embeddings: bool = False
    # Keep only each layer's input during forward and recompute the rest in backward: less activation
    # memory for more compute (transformers' activation checkpointing; MiniLM, batch 32: 1.35x slower).
    gradient_checkpointing: bool = False

    # --- evaluation, logging, output --------------------------------------------------------------
    output_dir: str = "runs/bert-rotten-tomatoes"
    overwrite_output_dir: bool = False
    logging_steps: int = 10  # optimizer steps between logged losses
    eval_steps: int | None = None  # optimizer steps between evaluations; None: at epoch ends
    report_to: list[str] = field(default_factory=list)  # trackers beside metrics.jsonl
    label_names: list[str] | None = None  # fix the label set and order explicitly

    # --- checkpoints ------------------------------------------------------------------------------
    save_steps: int | None = None  # optimizer steps between training-state checkpoints
    save_at_epoch_end: bool = False
    save_total_limit: int | None = 2  # keep the last K (the best is always kept too)
    metric_for_best_model: str = "accuracy"
    # null: inferred as in transformers' Trainer, lower is better for a metric that ends in "loss".
    greater_is_better: bool | None = None
    resume_from_checkpoint: str | None = None  # "latest" or a checkpoint directory
    # Resume with other processes / batch / accumulation than the checkpoint's: the samples already
    # consumed are not repeated, the schedule is re-planned for the rest (not bit-exact).
    resume_allow_topology_change: bool = False
    # Stop when metric_for_best_model has not improved for this many evaluations (None: never).
    early_stopping_patience: int | None = None
    push_to_hub_model_id: str | None = None  # after training, upload the export there (needs the network)

    # --- faults -------------------------------------------------------------------------------------
    # Stop (exit status 3) when the loss is NaN or infinite for this many optimizer steps in a row;
    # checked at logging steps. Single fp16 overflow steps, which the gradient scaler skips, are fine.
    max_nonfinite_loss_steps: int = 5
    # Seconds a process waits in a collective (all-reduce, barrier) for the others before the job
    # fails instead of hanging. Raise it when the main process alone does long work (tokenizing).
    ddp_timeout: int = 1800
    # DDP options of torch's DistributedDataParallel, passed through Accelerate's kwargs handler:
    # static_graph (the same parameters get gradients every step) and gradient_as_bucket_view (the
    # gradients are views of the all-reduce buckets: one copy fewer, less memory).
    ddp_static_graph: bool = False
    ddp_gradient_as_bucket_view: bool = False

    # --- model parallelism (one process, consecutive layers on consecutive devices) -----------------
    model_parallel: bool = False
    devices: str | None = None  # "cuda:0,cuda:1", "cuda:0,cpu"; default: every visible GPU
    max_memory: dict[str, str] | None = None  # per-device cap, e.g. {"cuda:0": "2GiB"}
    pipeline_chunks: int = 1  # >1: GPipe-style micro-batches through the stages

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Cross-field checks, next to the fields they guard."""
        import math
        import os

        for name in ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
                     "warmup_ratio", "validation_split_percentage", "dropout"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise UserError(f"{name} must be a finite number, got {value}")
        if not 0 <= self.seed < 2**32:  # numpy's seeds; torch's and Python's take them too
            raise UserError(f"seed must be in [0, {2**32 - 1}], got {self.seed}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.adam_epsilon > 0:  # 0: 0/0 for a weight whose gradients have all been 0
            raise UserError(f"adam_epsilon must be > 0, got {self.adam_epsilon}")
        if not self.weight_decay >= 0:
            raise UserError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm >= 0:  # negative: flips the gradients
            raise UserError(f"max_grad_norm must be >= 0 (0 or null: no clipping), got {self.max_grad_norm}")
        if self.ddp_timeout > 7 * 24 * 3600:  # past a week: the timeouts of torch's backends overflow
            raise UserError(f"ddp_timeout must be at most 604800 seconds (a week), got {self.ddp_timeout}")
        most_threads = max(1024, os.cpu_count() or 1)  # not this machine's count: saved configs travel
        if self.cpu_threads is not None and self.cpu_threads > most_threads:  # OpenMP crashes at 100000
            raise UserError(
                f"cpu_threads={self.cpu_threads} is more threads than any machine has cores (this one has "
                f"{os.cpu_count()}); use at most {most_threads}, or null for this process's share of the cores"
            )
        if self.label_names is not None:
            if not self.label_names:
                raise UserError(
                    "label_names is empty; list the labels, or leave it null to take them from the data"
                )
            repeated = sorted({n for n in self.label_names if self.label_names.count(n) > 1})
            if repeated:
                raise UserError(f"label_names lists {repeated[0]!r} twice; name each label once")
        if (
            self.warmup_steps is not None
            and self.max_steps is not None
            and self.warmup_steps > self.max_steps
        ):
            raise UserError(
                f"warmup_steps={self.warmup_steps} exceeds max_steps={self.max_steps}: the learning rate would "
                "never reach learning_rate; lower warmup_steps"
            )
        texts = (
            [c for c in (self.text_column, self.text_pair_column) if c]
            if self.task == "text-classification"
            else []
        )
        if self.label_column in texts:
            raise UserError(
                f"'{self.label_column}' is both the label column and a text column: the model would read "
                "the answer; set text_column (or label_column) to another column"
            )
        if self.text_pair_column is not None and self.text_pair_column == self.text_column:
            raise UserError(
                "text_pair_column is the text_column: each sentence would be paired with itself; "
                "set text_pair_column to the second sentence's column, or null"
            )
        if self.greater_is_better is None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "num_train_epochs",
            "logging_steps",
            "max_length",
            "pipeline_chunks",
            "max_nonfinite_loss_steps",
            "ddp_timeout",
        ):
            if getattr(self, name) <= 0:
                raise UserError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in (
            "max_steps",
            "eval_steps",
            "save_steps",
            "max_train_samples",
            "max_eval_samples",
            "max_test_samples",
            "save_total_limit",
            "warmup_steps",
            "pad_to_multiple_of",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0 and not (name == "warmup_steps" and value == 0):
                raise UserError(f"{name} must be positive (or null), got {value}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.early_stopping_patience is not None and self.early_stopping_patience <= 0:
            raise UserError(
                f"early_stopping_patience must be positive (or null), got {self.early_stopping_patience}"
            )
        if not self.learning_rate > 0:
            raise UserError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 < self.validation_split_percentage < 100:
            raise UserError(
                f"validation_split_percentage must be in (0, 100), got {self.validation_split_percentage}"
            )
        if self.cpu_threads is not None and self.cpu_threads <= 0:
            raise UserError(f"cpu_threads must be positive (or null), got {self.cpu_threads}")
        if self.dataloader_num_workers is not None and self.dataloader_num_workers < 0:
            raise UserError("dataloader_num_workers must be >= 0")
        metrics = ("accuracy", "macro_f1", "macro_precision", "macro_recall", "loss")  # of every evaluation
        if self.metric_for_best_model not in metrics:
            raise UserError(
                f"metric_for_best_model must be one of {', '.join(metrics)}, got {self.metric_for_best_model!r}"
            )
        from accelerate.utils import LoggerType

        trackers = {t.value for t in LoggerType}
        for name in self.report_to:
            if name not in trackers:
                raise UserError(
                    f"report_to: unknown tracker {name!r}; Accelerate's trackers are {', '.join(sorted(trackers))}"
                )
        if self.model_name_or_path is None and self.model_config is None:
            raise UserError("set model_name_or_path (a hub name or a local directory) or model_config")
        if self.model_config is not None and "model_type" not in self.model_config:
            raise UserError("model_config needs a model_type, e.g. {model_type: bert, hidden_size: 32, ...}")
        if self.dataset_name is None and self.train_file is None and self.data_dir is None:
            raise UserError("no training data: set train_file, data_dir or dataset_name")
        if self.freeze_embeddings and self.task != "text-classification":
            raise UserError("freeze_embeddings is for text-classification (the word-embedding table)")
        if self.pipeline_chunks > 1 and not self.model_parallel:
            raise UserError("pipeline_chunks needs model_parallel=true")
        if self.devices and not self.model_parallel:
            raise UserError(
                "devices is for model_parallel=true; for data parallelism choose devices in the "
                "accelerate config (accelerate launch --gpu_ids ...)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
        raise UserError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is Literal:
        if value not in args:
            raise UserError(f"{key} must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise UserError(f"{key} must be a list, got {value!r}")
        return [_coerce(key, v, args[0]) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{key} must be a mapping like {{a: 1}}, got {value!r}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
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
        if isinstance(value, (dict, list)) or value is None:
            raise UserError(f"{key} must be a string, got {value!r}")
        return str(value)
    return value


# Command-line modes that older versions kept as settings (and saved in config.yaml and manifests):
# dropped when a saved config is read, pointed to their flag when given as key=value.
MODE_FLAGS = {"dry_run": "--dry-run", "plan_only": "--plan-only"}


def _unknown_key(key: str, known: list[str]) -> UserError:
    if key in MODE_FLAGS:
        return UserError(f"{key} is not a setting; pass the flag {MODE_FLAGS[key]}")
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    return UserError(f"unknown config key '{key}'{hint}")


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` from the command line: the value read as YAML (a string where YAML fails)."""
    key, sep, text = item.partition("=")
    if not sep:
        raise UserError(f"expected key=value, got '{item}'")
    try:
        return key.strip(), yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return key.strip(), text


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Build the config from the default recipe (or `path`) plus `key=value` overrides."""
    recipe = Path(path) if path is not None else DEFAULT_RECIPE
    if not recipe.is_file():
        what = "is a folder, not a recipe file" if recipe.is_dir() else "not found"
        raise UserError(f"config file {what}: {recipe}")
    try:
        raw = yaml.safe_load(recipe.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{recipe} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{recipe} must hold a mapping of config keys, got {type(raw).__name__}")

    # Relative data/model paths in a recipe are relative to the repository, so a recipe works
    # from any working directory; paths given on the command line are relative to the cwd.
    for key in PATH_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value.startswith(("data/", "./data/")):
            raw[key] = str(REPO_DIR / value)

    for item in overrides or []:
        key, value = parse_override(item)
        raw[key] = value
    # Saved configs must work from any directory: local paths become absolute.
    for key in (*PATH_KEYS, "output_dir"):
        value = raw.get(key)
        if isinstance(value, str) and (key == "output_dir" or Path(value).exists()):
            raw[key] = str(Path(value).expanduser().resolve())
    return config_from_dict(raw)


def config_from_dict(raw: dict[str, Any], saved: bool = False) -> TrainConfig:
    """The config from a mapping; `saved`: a run's config.yaml or manifest, maybe of an older version."""
    hints = _field_types()
    values = {}
    for key, value in raw.items():
        if saved and key in MODE_FLAGS:
            continue
        if key not in hints:
            raise _unknown_key(key, list(hints))
        values[key] = _coerce(key, value, hints[key])
    return TrainConfig(**values)


def save_config(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
