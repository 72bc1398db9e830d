"""Evaluate a saved model: a training-state checkpoint, a run's final export, or a hub model.

    accelerate launch finetune/evaluate_checkpoint.py runs/bert-rotten-tomatoes/checkpoints/step-00000075
    accelerate launch finetune/evaluate_checkpoint.py runs/bert-rotten-tomatoes/model --split validation
    accelerate launch finetune/evaluate_checkpoint.py runs/bert-rotten-tomatoes/model --data reviews.csv --predictions
    accelerate launch --multi_gpu --num_processes 2 finetune/evaluate_checkpoint.py <checkpoint>      # CPU DDP too
    python -m finetune.evaluate_checkpoint <hub-model-or-folder> --data test.csv [--task <task>]
    finetune-evaluate <checkpoint> --data other.csv text_column=review per_device_eval_batch_size=16

What is evaluated, and on what:
- `<run>/checkpoints/step-N` (Accelerate `save_state` + manifest.json + COMPLETE): the model is rebuilt
  from the config in the manifest (a pretrained model's architecture from its config.json, without
  its weights) and its weights read from model.safetensors (never a pickle).
- `<run>/model` (`save_pretrained`, with its tokenizer or image processor): loaded as is; the run's
  config comes from `<run>/config.yaml` one level up (trusted when `<run>/results.json` names the
  same labels).
- any other `save_pretrained` folder or a hub name: `--data` is needed, the task comes from the
  model's config (or `--task`), the columns from `key=value` (defaults: text / image, label).
With the run's config, the path alone is enough: the data is the run's own split (`test` if the run
had one, else `validation`, held out exactly as in training; `--split` picks another). `--data` is
another file, or a folder (an image folder, or files named by split), with the same columns; its
labels are matched to the model's `id2label` BY NAME, whatever their order or type.

Outputs (main process only), by default outside what is evaluated (an export is shared, and the
evaluated data is the user's): `<run>/eval/<split>/` for a run's export, `<run>/eval/step-N-<split>/`
for a training-state checkpoint, `./eval/<model>/<split>/` for any other model (for `--data`, the
split's name is `<name>-<sha256[:8]>`): metrics.json (accuracy, macro and per-class
precision/recall/F1, loss, confusion matrix [true][predicted], num_samples, the checkpoint, the data
and the sha256 of its bytes), confusion_matrix.png, and with `--predictions` predictions.jsonl (one
line per sample: index, its input -- text, and text_pair for sentence pairs, or the image's file
path or name --, label, prediction, per-class probabilities; for a regression the label and
predicted numbers, for multi-label the label names, the names predicted at the threshold and
per-label probabilities, and no confusion matrix). `--output DIR` is always a folder and holds the
same three files. A previous evaluation's outputs are replaced; any other existing file is never
touched.

Metrics come from `finetune.run.evaluate_model`, the same loop training evaluates with: batches are
sharded over the processes and `gather_for_metrics` drops the samples Accelerate duplicates to
even out the last batch, so every sample counts once whatever the number of processes. A model
trained with model_parallel=true is evaluated whole in each process.
"""

from __future__ import annotations

import os

# Before torch loads OpenMP, which reads this once: waiting threads sleep, not spin, as in finetune/run.py
# (a CPU shared with another job; README, "CPU threads"). A user's own policy is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __name__ == "__main__":
    from finetune.signals import stop_while_starting

    stop_while_starting()  # Ctrl-C or SIGTERM during the imports (seconds): one line, not a traceback

import argparse
import contextlib
import dataclasses
import functools
import json
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset as HFDataset
from datasets import DatasetDict, Value
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from transformers import AutoConfig

from finetune import checkpoint as ckpt
from finetune import checks
from finetune.checks import evaluation
from finetune.checks import labels as label_rules
from finetune.checks.evaluation import WEIGHTS
from finetune.cli import settings_help
from finetune.config import (
    EVAL_KEYS,
    DataArgs,
    ModelArgs,
    TrainConfig,
    config_from_dict,
    parse_override,
    settings_from_flags,
)
from finetune.data import check_columns, load_path, load_splits
from finetune.digests import sha256_of, weights_sha256
from finetune.errors import UserError, first_line, write_failure
from finetune.evaluation import evaluate_with_predictions, write_predictions
from finetune.exits import exit_on_user_error
from finetune.layout import (
    CHECKPOINTS,
    CONFUSION_MATRIX,
    EVAL,
    EVAL_METRICS,
    PREDICTIONS,
    RunDir,
    kind_of,
    read_record,
    replaced_whole_around,
)
from finetune.lora import apply_lora, merge_lora
from finetune.metrics import summary_line
from finetune.models import build_model, offline_hint
from finetune.onnx_export import (  # onnxruntime is imported only for --onnx
    ONNX_HELP,
    OnnxModel,
    onnx_file_of,
    onnx_given,
)
from finetune.plots import plot_confusion_matrix
from finetune.problems import infer_problem_type, problem_of, problem_type_of, problem_type_of_model, tags_in
from finetune.problems.base import Labels
from finetune.runtime import data_workers, main_process_first, make_accelerator, pin_memory, quiet_libraries
from finetune.signals import started, stop_outside_the_loop
from finetune.tasks import TASK_NAMES, task_of, task_of_model

FORMAT = "finetune.evaluate/1"  # marks a metrics.json as ours: only such a file is ever replaced
# --- what is evaluated ----------------------------------------------------------------------------


@dataclass
class Target:
    """The model to evaluate: where it is, what kind it is, and the run config that goes with it."""

    spec: str  # as the user gave it: a path or a hub name
    kind: str  # "training-state", "export" or "hub"
    cfg: TrainConfig | None  # the run's config; None when only the model is known (then --data)
    labels: Labels  # what the outputs are, by name in id order
    step: int | None = None  # optimizer steps the weights were trained for, when known

    @property
    def path(self) -> Path | None:
        return Path(self.spec).expanduser().resolve() if self.kind != "hub" else None

    @property
    def short_name(self) -> str:
        """For titles: `<run>/checkpoints/step-N`, `<run>/model`, or the name as given."""
        if self.path is None:
            return self.spec
        return "/".join(self.path.parts[-3:] if self.kind == "training-state" else self.path.parts[-2:])

    @functools.cached_property
    def weights_sha256(self) -> str | None:
        """What identifies the model (metrics.json's weights_sha256): the sha256 of its weights file (of its weight
        files' names and digests when there are several: shards, FSDP's folder); None for a hub name."""
        return weights_sha256(self.path) if self.path else None


def _run_config(raw: Any, where: str) -> TrainConfig:
    checks.gate(evaluation.RUN_CONFIG, raw, where)
    try:
        return config_from_dict(raw, saved=True)
    except UserError as e:
        raise checks.explain(evaluation.RUN_CONFIG_FAILED, where, e) from None


def _load_model_config(spec: str, trust_remote_code: bool = False, base: bool = False):
    """`base`: the pretrained model a training-state checkpoint's architecture comes from, not what is
    evaluated (an export, a model folder)."""
    try:
        return AutoConfig.from_pretrained(spec, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        failed = evaluation.LoadFailed(spec, Path(spec).expanduser(), e, offline_hint(spec), base)
        raise checks.explain(evaluation.CONFIG_FAILED, failed) from None


def resolve_target(spec: str, task: str | None, have_data: bool, said: checks.Said | None = None) -> Target:
    """Tell a training-state checkpoint, an export and a hub name apart; read their config and labels."""
    path = Path(spec).expanduser()
    checks.gate(evaluation.PATH, spec, path, have_data)
    if not path.exists():  # a hub model's name, given with --data
        return Target(spec, "hub", None, Labels.of_model(_load_model_config(spec)))
    kind = kind_of(path)
    if kind == "checkpoint":
        return _training_state(spec, path, task)
    if kind == "export":
        return _export(spec, path, task, have_data, said)
    newest = ckpt.list_checkpoints(path.parent) if path.name == CHECKPOINTS else []
    raise checks.explain(evaluation.NOT_A_MODEL, spec, path, kind, newest)


def _training_state(spec: str, path: Path, task: str | None) -> Target:
    """A training-state checkpoint: complete, and its manifest (read_manifest refuses one that does not parse
    or lacks its counts) holding its run's config and labels."""
    checks.gate(evaluation.CHECKPOINT, spec, path)
    manifest = ckpt.read_manifest(path)
    cfg = _run_config(manifest.get("config"), str(path / ckpt.MANIFEST))
    checks.gate(evaluation.TASK, task, cfg.task, "checkpoint")
    checks.gate(evaluation.LABELS, path, manifest)
    return Target(spec, "training-state", cfg, Labels.of_manifest(manifest), manifest.get("step"))


def _export(spec: str, path: Path, task: str | None, have_data: bool, said: checks.Said | None) -> Target:
    """An export: with its run's config where the run one level up names its labels, else alone (--data)."""
    labels = Labels.of_model(_load_model_config(str(path)))
    beside = evaluation.ExportRun.read(spec, path, labels, have_data)
    if beside.config is not None:
        cfg = _run_config(beside.config, str(beside.run.config))
        checks.gate(evaluation.TASK, task, cfg.task, "export")
        return Target(spec, "export", cfg, labels, beside.results.get("step"))
    checks.gate(evaluation.EXPORT_ALONE, beside, said=said if said is not None else checks.Said())
    return Target(spec, "export", None, labels)


def eval_config(target: Target, task: str | None, data: str | None, overrides: list[str],
                said: checks.Said | None = None) -> TrainConfig:  # fmt: skip
    """The run's config (or one made for a lone model), set up to evaluate: no trackers, no model
    parallelism (the whole model in each process), plus the `key=value` evaluation settings."""
    raw = target.cfg.to_dict() if target.cfg is not None else _lone_model_config(target, task, data)
    raw.update(report_to=[], model_parallel=False, pipeline_chunks=1, devices=None, max_memory=None,
               resume_from_checkpoint=None, gradient_accumulation_steps=1, **target.labels.manifest())
    given = set()
    for item in overrides:
        key, value = parse_override(item)
        checks.gate(evaluation.SETTING, key, EVAL_KEYS)
        given.add(key)
        raw[key] = value
    trained = target.cfg.text_pair_column if target.cfg is not None else None
    checks.gate(evaluation.SETTINGS, evaluation.Settings(raw, given, trained, target.cfg is not None),
                said=said if said is not None else checks.Said())  # fmt: skip
    return config_from_dict(raw, saved=True, said=said)


def _lone_model_config(target: Target, task: str | None, data: str | None) -> dict[str, Any]:
    """The settings of a model evaluated without its run: its task and problem type, the data as given."""
    config = _load_model_config(target.spec)
    model_task = task_of_model(config, target.spec, task).name
    source = {"data_dir": data} if data is not None and Path(data).is_dir() else {"train_file": data}
    problem = problem_type_of_model(config)
    return {"task": model_task, "model_name_or_path": target.spec, "problem_type": problem, **source}


# --- the model ------------------------------------------------------------------------------------


def architecture_only(args: ModelArgs) -> ModelArgs:
    """The model section with a pretrained model's config as `model_config`, so that build_model
    makes the architecture (`from_config`) without reading the pretrained weights.

    A training-state checkpoint holds every weight: loading the pretrained ones first would read them
    for nothing (a download, for a hub model not in the cache) and make transformers report the new
    classification head as "MISSING ... newly initialized", which is not what is evaluated."""
    if args.model_config is not None or args.model_name_or_path is None:
        return args
    loaded = _load_model_config(args.model_name_or_path, args.trust_remote_code, base=True)
    # Only the keys this version's config class knows: a legacy one (the bundled MiniLM's
    # `gradient_checkpointing`) was stored and ignored by transformers, and model_config refuses it.
    known = {*type(loaded)().to_dict(), "model_type"}
    spec = {
        k: v
        for k, v in loaded.to_dict().items()
        if k in known and k not in ("id2label", "label2id", "num_labels", "problem_type")
    }
    return dataclasses.replace(args, model_config=spec)


def load_model(target: Target, cfg: TrainConfig):
    """The model and its preprocessor (a tokenizer, an image processor), on CPU, in eval mode."""
    task = task_of(cfg.task)
    if target.kind == "training-state":
        model, preprocessor = _rebuilt_model(target, cfg)
    else:
        model, preprocessor = _saved_model(target, cfg)
    checks.gate(evaluation.FINITE, target.spec, model)  # every prediction would be NaN, scored as if it meant something
    # An export's own tokenizer was loaded, not the run's setting's: a fault in it is the export's.
    exported = str(target.path) if target.kind != "training-state" and target.path is not None else None
    task.check_model(model, preprocessor, cfg.model_args, cfg.data_args, exported)
    return model.eval(), preprocessor


def _rebuilt_model(target: Target, cfg: TrainConfig):
    """A training-state checkpoint: the architecture its config builds, with the checkpoint's weights."""
    task = task_of(cfg.task)
    tokenizer = task.load_preprocessor(cfg.model_args) if task.preprocessor_first else None
    model = build_model(architecture_only(cfg.model_args), target.labels, task.vocab_size(tokenizer))
    state = read_weights(target)
    if cfg.peft is not None:  # a LoRA run's state: the adapters on the model, merged once loaded
        model = apply_lora(model, cfg.peft)
    missing, unexpected = model.load_state_dict(state, strict=False)
    checks.gate(evaluation.FIT, target.path, missing, unexpected)
    model = merge_lora(model)
    return model, tokenizer if tokenizer is not None else task.load_preprocessor(cfg.model_args, model.config)


def _saved_model(target: Target, cfg: TrainConfig):
    """An export, a model folder (its safetensors weights only) or a hub model, loaded as saved."""
    task = task_of(cfg.task)
    local = target.path is not None
    source = str(target.path) if local else target.spec
    if local:  # a weights file that is a folder: said as such, not as missing
        checks.gate(evaluation.WEIGHTS_FILE, target.spec, target.path)
    try:
        model, loading = task.auto_model().from_pretrained(source, use_safetensors=True if local else None,
                                                             output_loading_info=True)  # fmt: skip
        missing = [*loading.get("missing_keys", ()), *loading.get("mismatched_keys", ())]
        if local and missing:  # transformers fills them with random weights and a log line: not this model
            raise checks.explain(evaluation.FOREIGN, target.spec, target.path,
                                 f"{len(missing)} weight(s) missing, e.g. {missing[0]}")  # fmt: skip
        return model, task.load_saved_preprocessor(source)
    except (OSError, ValueError, SafetensorError) as e:
        failed = evaluation.LoadFailed(target.spec, target.path, e, offline_hint(target.spec), task=cfg.task)
        raise checks.explain(evaluation.MODEL_FAILED, failed) from None
    except RuntimeError as e:  # transformers: weights whose shapes do not fit config.json
        if "size mismatch" not in str(e) and "ignore_mismatched_sizes" not in str(e):
            raise
        raise checks.explain(evaluation.FOREIGN, target.spec, target.path, first_line(e)) from None


def read_weights(target: Target) -> dict[str, torch.Tensor]:
    """A training-state checkpoint's weights: model.safetensors (Accelerate saves the registered, unwrapped
    module: plain names), or an FSDP checkpoint's shards merged in memory (`merged_fsdp_weights`)."""
    weights = target.path / WEIGHTS
    shards = sorted(target.path.glob("pytorch_model_fsdp_*"))
    if weights.is_file():
        try:
            return load_file(weights)
        except SafetensorError as e:
            raise checks.explain(evaluation.WEIGHTS_UNREADABLE, weights, e) from None
    if shards:
        return merged_fsdp_weights(shards[0])
    raise checks.explain(evaluation.NO_WEIGHTS, target.spec, target.path)


def merged_fsdp_weights(shards: Path) -> dict[str, torch.Tensor]:
    """An FSDP checkpoint's model state (torch.distributed.checkpoint's files, one per training process),
    merged whole into this process's memory: every process of the evaluation reads every shard itself.

    What Accelerate's `merge_fsdp_weights` reads, without its writing: that one merges on the main process
    only, into a file in the folder it is given, then waits for the others at a barrier, so with several
    processes each would have to be given one folder that all of them share (and the machines of a
    multi-node evaluation do not share /tmp). Its reader, like torch's own `dcp_to_torch_save`, is
    `_load_state_dict(no_dist=True)` with the planner that takes every key the checkpoint holds: no
    collective, whatever process group is running."""
    from torch.distributed.checkpoint import CheckpointException, FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=FileSystemReader(str(shards)), planner=_EmptyStateDictLoadPlanner(),
                         no_dist=True)  # fmt: skip
    except (OSError, RuntimeError, ValueError, CheckpointException) as e:  # a shard or the index lost or damaged
        raise checks.explain(evaluation.SHARDS_UNMERGED, shards, e) from None
    return state["model"] if len(state) == 1 else state  # Accelerate saves {"model": the state dict}


# --- the data -------------------------------------------------------------------------------------


def _run_of(target: Target) -> RunDir:
    return RunDir(target.path.parent if target.kind == "export" else target.path.parent.parent)


def _recorded_digests(target: Target) -> dict[str, str]:
    """The sha256 of each data file the run read, by its resolved path (results.json's data_sha256); {} for a
    model without its run, or a run that did not finish."""
    if target.path is None:
        return {}
    return read_record(_run_of(target).results).get("data_sha256") or {}


def _pick_split(available: list[str], split: str | None, where: str) -> str:
    checks.gate(evaluation.SPLIT, available, split, where)
    return split if split is not None else next((s for s in ("test", "validation") if s in available), available[0])


def run_split(args: DataArgs, split: str | None, said: checks.Said | None = None) -> tuple[HFDataset, str, dict[str, Any]]:
    """The split as the run saw it: `load_splits` again, so a held-out validation split and the
    max_*_samples limits come out as in training. Labels are the checkpoint's, in its order. A streamed run's train
    split is read whole as the loaded path reads it (up to max_train_samples, as the stream took them), not only
    the first rows its checks read."""
    args = dataclasses.replace(args, streaming=False) if args.streaming and split == "train" else args
    if split is not None and args.train_file:  # files: their splits are known before any is read (or warned of)
        _pick_split(["train", "validation"] + (["test"] if args.test_file else []), split, "the run's data")
    try:
        raw, _ = load_splits(args, said)
    except UserError as e:
        raise checks.explain(evaluation.RUNS_DATA, e) from None
    name = _pick_split(list(raw), split, "the run's data")
    info: dict[str, Any] = {"split": name}
    if args.train_file:  # files: the split's own, or train for a held-out validation split
        source = {"train": args.train_file, "test": args.test_file}.get(
            name, args.validation_file or args.train_file
        )
    elif args.data_dir and args.dataset_name in (None, "imagefolder"):
        source = args.data_dir
    else:
        source = None
    if source is not None:
        info.update(data=str(Path(source).resolve()), data_sha256=sha256_of(Path(source)))
    else:  # a hub dataset: no files of ours to hash; datasets' fingerprint identifies its content
        info.update(
            data=args.dataset_name + (f" ({args.dataset_config_name})" if args.dataset_config_name else ""),
            data_sha256=None,
            data_fingerprint=raw[name]._fingerprint,
        )
    if name == "validation" and not args.validation_file and args.train_file:
        info["held_out_from_train"] = {
            "validation_split_percentage": args.validation_split_percentage,
            "seed": args.seed,
        }
    return raw[name], name, info


def data_split(args: DataArgs, data: str, split: str | None,
               said: checks.Said | None = None) -> tuple[HFDataset, str, dict[str, Any]]:  # fmt: skip
    """A file, or a folder (an image folder, or data files named by split), with the run's columns."""
    path = Path(data).expanduser()  # it exists: checked with the other arguments
    said = said if said is not None else checks.Said()
    digests: dict[str, str] = {}
    loaded = load_path(path, args, said, digests)  # training's own loader: the same formats, the same one-line errors
    checks.gate(evaluation.FOLDER, data, path, split, list(loaded))
    name = "data" if path.is_file() else _pick_split(list(loaded), split, f"--data {data}")
    what = f"--data {data}" + (f" [{name}]" if path.is_dir() and len(loaded) > 1 else "")  # a split among others
    ds, labelled = _columns_checked(loaded[name], args, what, said)
    ds = _labels_encoded(ds, args, what, said) if labelled else problem_of(
        args.problem_type or task_of(args.task).problems[0]).placeholder(ds, args, Labels.given(args))  # fmt: skip
    if labelled:  # IOB1, stray I- tags: scored as training scores them
        problem_of(problem_type_of(ds, args.task)).check_read(ds, what, said)
    info = {
        "split": None if path.is_file() else name,
        "data": str(path.resolve()),
        "data_sha256": digests.get(str(path.resolve())) or sha256_of(path),
        "labelled": labelled,
    }
    stem = path.stem if path.is_file() or len(loaded) == 1 else f"{path.name}-{name}"
    return ds, f"{stem}-{info['data_sha256'][:8]}", info


def _columns_checked(ds: HFDataset, args: DataArgs, what: str, said: checks.Said) -> tuple[HFDataset, bool]:
    """The data's columns, checked as training's are: (the data, whether it holds labels to score). No label
    column at all, or one with no value in any row (a CSV's header kept): data to predict."""
    checks.gate(evaluation.ROWS, what, len(ds))
    empty = [c for c in args.label_sources if c in ds.column_names and all(v is None for v in ds[c][:])]
    if empty:
        ds = ds.remove_columns(empty)
    labelled = any(column in ds.column_names for column in args.label_sources)
    if not labelled:  # the model's labels under another name ("Label", "sentiment"): labels, not data to predict
        checks.gate(evaluation.UNLABELLED, ds, args, what)
    check_columns(ds, what, args, labelled, model_task=True, said=said)
    return ds, labelled


def _labels_encoded(ds: HFDataset, args: DataArgs, what: str, said: checks.Said) -> HFDataset:
    """The labels matched to the model's by name, whatever the file's order or type; a label the model does
    not know is refused. Training's line offers problem_type=, which evaluation does not take (the model's is
    fixed): labels of another problem type are said of the model (evaluation.ANOTHER_PROBLEM)."""
    checks.gate(evaluation.TAGS, ds, args, what, said=said)
    ds = _float_class_ids(ds, args, what)
    model = problem_of(args.problem_type) if args.problem_type else None
    if model is not None and model.classes:  # a run trained on ids scores its own test file so
        ds = model.read_ids_as_names(DatasetDict({what: ds}), args, said, label_rules.MODEL_IDS_AS_NAMES, what)[what]
    if model is not None and model.lists and not args.label_columns and args.label_column in ds.column_names:
        checks.gate(label_rules.REPEATED, ds[args.label_column], args.label_column, what, said=said)
    try:
        problem = infer_problem_type(ds, args, said)
    except UserError:
        found = checks.first(evaluation.ANOTHER_PROBLEM, ds, args, what)
        if found is None:  # numbers with a unit, a stray cell: training's own line holds
            raise
        raise checks.refusal(*found) from None
    return problem_of(problem).encode(ds, args, Labels.given(args), what, said, fixed=True)


def _float_class_ids(ds: HFDataset, args: DataArgs, what: str) -> HFDataset:
    """A classifier's labels written as floats (`1.0`: a CSV saved by pandas, a column with a gap once).
    Training refuses them and offers problem_type=regression, which is no evaluation setting: here a
    whole number is the model's class of that name when its classes are named "0", "1", ... (1.0 is
    class "1"); other floats are refused with the fix that fits the model (evaluation.FLOATS)."""
    names = Labels.given(args)
    column = args.label_column
    single = problem_of(args.problem_type).classes if args.problem_type else len(names) >= 2
    tags = tags_in(args.task)
    if args.label_columns or tags or not single or column not in ds.column_names:
        return ds
    feature = ds.features[column]
    dtype = feature.dtype if isinstance(feature, Value) else ""
    if not (dtype.startswith("float") or dtype == "double"):
        return ds
    values = [v for v in ds[column][:] if v is not None]  # a missing label is check_columns' to refuse
    checks.gate(evaluation.FLOATS, evaluation.Floats(column, values, names, what))
    return ds.cast_column(column, Value("int64"))  # then matched by name as "0", "1", ...


def _thresholds(value: Any, names: list[str] | None) -> float | list[float] | None:
    """config.json's `multi_label_thresholds` (tuned on validation at training's end), checked: one number,
    or one per label, each a probability in [0, 1] (evaluation.thresholds)."""
    if value is None or names is None:
        return value
    checks.gate(evaluation.THRESHOLDS, value, names)
    return [float(v) for v in value] if isinstance(value, list) else float(value)


# Columns that name a sample (carried into predictions.jsonl, beside the `index` of its row).
ID_COLUMN = re.compile(r"(?i)(.+[_-])?(id|idx|guid|uuid|uid)|key")  # "key" alone: not an api_key


# --- outputs --------------------------------------------------------------------------------------


def output_paths(metrics_file: Path) -> tuple[Path, Path]:
    """The confusion-matrix PNG and predictions.jsonl beside metrics.json."""
    return metrics_file.with_name(CONFUSION_MATRIX), metrics_file.with_name(PREDICTIONS)


def check_output(metrics_file: Path, target: Target, chosen: bool = False) -> None:
    """Write only into the eval outputs we own: never over a checkpoint's or anyone else's files, nor,
    in the default folder (not `chosen` with --output), over another model's evaluation (evaluation.OUTPUT)."""
    mine = str(target.path) if target.path is not None else target.spec
    inner = replaced_whole_around(metrics_file.parent)  # a run's checkpoints/ or export: deleted whole by that run
    checks.gate(evaluation.OUTPUT, evaluation.Output(metrics_file, output_paths(metrics_file), target.path, mine, chosen,
                                                     inner, FORMAT, target.weights_sha256))  # fmt: skip


# --- the evaluation -------------------------------------------------------------------------------


def evaluate_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Resolve, load, evaluate over every process, write (main process). Returns metrics.json's record."""
    checks.gate(evaluation.DATA_ARGS, args.data, args.split)
    said = checks.Said()
    target = resolve_target(args.checkpoint, args.task, have_data=args.data is not None, said=said)
    cfg = eval_config(target, args.task, args.data, args.overrides, said)
    quiet_libraries(cfg.log_level)
    accelerator = make_accelerator(cfg, said)
    started = time.perf_counter()

    model, preprocessor = load_model(target, cfg)
    onnx_file = onnx_file_of(args.onnx, target.kind, target.spec, target.path, target.weights_sha256,
                             args.onnx_file)  # --onnx: checked before the data
    task = task_of(cfg.task)
    with main_process_first(accelerator):  # the main process fills datasets' cache, the others read it
        ds, name, info = _evaluated_data(args, cfg, target, said)
        # As split "eval", never "train": that would add the training-time augmentation.
        prepared = task.prepare(ds, preprocessor, cfg.data_args, "eval", getattr(model.config, "num_channels", 3), said)
    if onnx_file is not None:  # beside the PyTorch evaluation of the same data, not over it
        name, model = f"{name}-onnx-{args.onnx}", OnnxModel(onnx_file, model.config)
    metrics_file = metrics_path(args.output, target, name)
    check_output(metrics_file, target, chosen=args.output is not None)

    loader = DataLoader(
        prepared,
        batch_size=cfg.per_device_eval_batch_size,
        collate_fn=task.collator(preprocessor, cfg.pad_to_multiple_of),
        num_workers=data_workers(cfg, accelerator),
        pin_memory=pin_memory(cfg, accelerator),
    )
    # evaluation_mode: mixed precision (from the accelerate config) but no DDP wrapper, no gradients.
    model = accelerator.prepare_model(model, evaluation_mode=True)
    loader = accelerator.prepare_data_loader(loader)
    problem, labelled = problem_type_of(ds, cfg.task), info.get("labelled", True)
    keep = args.predictions or not labelled  # data without labels: predictions are the output
    threshold = _threshold(args.overrides, cfg, accelerator.unwrap_model(model), target, problem)
    if args.data is not None and labelled and accelerator.is_main_process:
        _warn_of_other_data(target, info, ds, name, problem, said)
    report, predictions = evaluate_with_predictions(model, loader, accelerator, target.labels, problem, keep,
                                                    threshold, cfg.data_args)  # fmt: skip
    if not labelled:  # the placeholder labels score nothing: only what was predicted, and how much
        report = {k: v for k, v in report.items() if k in ("num_samples", "num_sentences", "num_words", "threshold")}
    record = _record(target, cfg, problem, info, report, output_paths(metrics_file)[1].name if keep else None,
                     accelerator, started)  # fmt: skip
    record = {**record, "onnx": str(onnx_file)} if onnx_file is not None else record
    replaced = False
    if accelerator.is_main_process:
        replaced = write_outputs(metrics_file, record, predictions, ds, cfg, target, name, said)
    summary = summary_line(report) if labelled else f"predictions for {report['num_samples']} samples (no labels to score)"
    accelerator.print(f"{name}: {summary} -> {metrics_file.parent}" + (" (replaced the previous one)" if replaced else ""))
    accelerator.end_training()
    return {**record, "metrics_file": str(metrics_file)}


def _evaluated_data(args: argparse.Namespace, cfg: TrainConfig, target: Target,
                    said: checks.Said) -> tuple[HFDataset, str, dict[str, Any]]:  # fmt: skip
    """The run's own split, or --data; (the data, its name for the output folder, what metrics.json says of it)."""
    if args.data is None:
        ds, name, info = run_split(cfg.data_args, args.split, said)
    else:
        ds, name, info = data_split(cfg.data_args, args.data, args.split, said)
    checks.gate(evaluation.SAMPLES, len(ds), info)
    if args.data is None and target.path is not None and info.get("data_sha256") is not None:
        # the run's own split, from a file whose bytes differ from those the run trained and scored on
        checks.gate(evaluation.CHANGED, info, _recorded_digests(target).get(info["data"]), _run_of(target).results,
                    said=said)  # fmt: skip
    return ds, name, info


def _threshold(overrides: list[str], cfg: TrainConfig, model, target: Target, problem: str) -> float | list[float]:
    """The thresholds tuned on the run's validation split (the export's config.json), unless asked otherwise."""
    own = problem_of(problem).stored_threshold(model.config)  # a problem that keeps its own (question answering's)
    if own is not None or not problem_of(problem).lists:
        return own if own is not None else problem_of(problem).default_threshold(cfg)
    tuned = _thresholds(getattr(model.config, "multi_label_thresholds", None),
                        target.labels)  # fmt: skip
    asked = any(parse_override(item)[0] == "multi_label_threshold" for item in overrides)
    return tuned if tuned and not asked else cfg.multi_label_threshold


def _warn_of_other_data(target: Target, info: dict[str, Any], ds: HFDataset, name: str, problem: str,
                        said: checks.Said) -> None:  # fmt: skip
    """--data beside the run's own: its training file (scores on what the model trained on), or regression
    targets on another scale than the run's training targets (training's rule, said where the run and its
    training data are at hand)."""
    train = Path(target.cfg.train_file).expanduser() if target.cfg is not None and target.cfg.train_file else None
    if train is not None and info.get("data_sha256") is not None:
        # the bytes it trained on (results.json), else (a run not finished) the file as it is
        trained = _recorded_digests(target).get(str(train.resolve())) or (sha256_of(train) if train.is_file() else None)
        checks.gate(evaluation.TRAINING_DATA, info, trained, said=said)
    if not problem_of(problem).numbers or train is None:
        return
    try:
        raw, _ = load_splits(target.cfg.data_args, checks.Said(quiet=True))  # its warnings were said by its run
    except (UserError, OSError):  # the run's data moved or changed: nothing to compare with
        return
    checks.gate(evaluation.SCALE, raw["train"]["labels"][:], ds["labels"][:], name, said=said)


def _record(target: Target, cfg: TrainConfig, problem: str, info: dict[str, Any], report: dict[str, Any],
            predictions: str | None, accelerator, started: float) -> dict[str, Any]:  # fmt: skip
    """metrics.json's record: what was evaluated, on what, its metrics, and how it ran."""
    return {
        "format": FORMAT,
        "checkpoint": str(target.path) if target.path is not None else target.spec,
        "checkpoint_kind": target.kind,
        "weights_sha256": target.weights_sha256,  # the model's identity: a copy of its run is the same model
        "step": target.step,
        "task": cfg.task,
        "problem_type": problem,
        **info,
        **target.labels.manifest(),
        **report,
        "predictions": predictions,
        "runtime": {
            "num_processes": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "mixed_precision": accelerator.mixed_precision,
            "per_device_eval_batch_size": cfg.per_device_eval_batch_size,
            "seconds": round(time.perf_counter() - started, 3),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": ckpt.package_versions(),
        },
    }


def metrics_path(output: str | None, target: Target, name: str) -> Path:
    """Where metrics.json goes: in the folder `--output`, else outside what is evaluated (an export is
    shared; the evaluated data, in predictions.jsonl, is the user's): the run's `eval/` folder for an
    export or a checkpoint of a run, else ./eval/<the model's name>/."""
    if output is not None:
        return Path(output).expanduser() / EVAL_METRICS
    if target.kind == "training-state":  # <run>/checkpoints/step-N
        return target.path.parent.parent / EVAL / f"{target.path.name}-{name}" / EVAL_METRICS
    if target.kind == "export" and target.cfg is not None:  # <run>/model
        return target.path.parent / EVAL / name / EVAL_METRICS
    model = target.path.name if target.path is not None else target.spec.replace("/", "__")
    return Path(EVAL) / model / name / EVAL_METRICS


def write_outputs(metrics_file: Path, record: dict, predictions, ds, cfg: TrainConfig, target: Target, name: str,
                  said: checks.Said | None = None) -> bool:  # fmt: skip
    """metrics.json, the confusion matrix (classes) and predictions.jsonl (when asked), whole or not at
    all: each is written under a hidden temporary name and flushed, then all are renamed into place (a
    previous evaluation's files there replaced, its now stale ones removed). A write that fails (a full or
    read-only disk, a device error) removes the temporary files and leaves the folder as it was.
    Returns whether it replaced an evaluation."""
    folder = metrics_file.parent
    png, jsonl = output_paths(metrics_file)
    replaced, problem = metrics_file.exists(), record["problem_type"]
    created = next((p for p in reversed((folder, *folder.parents)) if not p.exists()), None)  # the first made
    written: dict[Path, Path] = {}  # final path: its temporary file

    def temporary(final: Path) -> Path:  # the suffix kept: matplotlib reads the format from it
        written[final] = final.with_name(f".tmp-{final.name}")
        return written[final]

    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary(metrics_file).write_text(json.dumps(record, indent=2) + "\n")
        if problem_of(problem).classes and "confusion_matrix" in record:  # a confusion matrix is for classes, with labels
            title = f"{target.short_name} on {name}\naccuracy {record['accuracy']:.3f}, {record['num_samples']:,} samples"
            plot_confusion_matrix(record["confusion_matrix"], target.labels, temporary(png), title=title, said=said)
        if predictions is not None:
            write_predictions(temporary(jsonl), predictions, ds["labels"][:], target.labels,
                              _sample_inputs(ds, cfg), problem, record.get("threshold", cfg.multi_label_threshold),
                              record.get("labelled", True))  # fmt: skip
        for tmp in written.values():
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())  # a failing disk says so now (EIO), not after the files look whole
    except Exception as e:
        _remove_partial(written.values(), folder, created)
        failure = write_failure(e, folder)
        if failure is None:
            raise
        raise checks.explain(evaluation.WRITE_FAILED, folder, failure) from None
    for final, tmp in written.items():
        os.replace(tmp, final)
    if replaced:  # a previous evaluation's files that this one does not write, now stale
        for stale in (png, jsonl):
            if stale not in written:
                stale.unlink(missing_ok=True)
    return replaced


def _sample_inputs(ds: HFDataset, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Each sample's input for predictions.jsonl (the task's `sample_inputs`), after the data's own ids, to join
    the predictions back by: "id", "doc_id", "guid" ..."""
    inputs = task_of(cfg.task).sample_inputs(ds, cfg.data_args)
    ids = [c for c in ds.column_names if ID_COLUMN.fullmatch(c) and c not in ("index", *inputs[0])] if inputs else []
    if not ids:
        return inputs
    return [{**dict(zip(ids, row, strict=True)), **given}
            for row, given in zip(zip(*(ds[c] for c in ids), strict=True), inputs, strict=True)]  # fmt: skip


def _remove_partial(temporary, folder: Path, created: Path | None) -> None:
    """A write that failed: its temporary files, and the folders this evaluation made, now empty."""
    for tmp in temporary:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    if created is not None:
        with contextlib.suppress(OSError):
            for made in (folder, *folder.parents):
                made.rmdir()
                if made == created:
                    break


# --- command line ---------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit status 2, like every other user error
        raise checks.explain(evaluation.COMMAND, message)


def eval_settings_help() -> str:
    """The settings `key=value` may change here, as `run.py --help` lists its own: type, default,
    one line of help, from TrainConfig's fields."""
    # os.devnull as the recipe: no recipe's values beside the defaults; the run's config is the
    # default here, and --help reads no checkpoint. Its header speaks of recipes: ours replaces it.
    lines = settings_help(os.devnull, names=EVAL_KEYS).splitlines()
    listed = "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("  ")) :])
    return (
        "evaluation settings (key=value), the only settings an evaluation reads that do not define\n"
        "the model; each defaults to the run's own value (or, for a model evaluated without its run,\n"
        f"to the default shown):\n{listed}"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(
        prog="finetune/evaluate_checkpoint.py",
        description=__doc__,
        epilog=eval_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "checkpoint", help="<run>/checkpoints/step-N, <run>/model, a model folder, a hub name, or ONNX files (<run>/onnx)"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="evaluation settings, listed below the options"
    )
    parser.add_argument("--data", help="a .csv/.json/.jsonl/.parquet file or a folder with the run's columns")
    parser.add_argument(
        "--split", help="a split of the run's data (default: test, else validation) or of --data"
    )
    parser.add_argument(
        "--output",
        help="the folder for the outputs (default: <run>/eval/<split>/, or ./eval/<model>/<data>/)",
    )
    parser.add_argument("--predictions", action="store_true", help="also write predictions.jsonl")
    parser.add_argument("--onnx", nargs="?", const="fp32", choices=("fp32", "int8"), help=ONNX_HELP)
    parser.add_argument("--task", choices=TASK_NAMES, help="the task of a model evaluated without its run")
    args = parser.parse_intermixed_args(settings_from_flags(argv, EVAL_KEYS))
    checks.gate(evaluation.SECOND, args.overrides)  # a second checkpoint where settings go
    return onnx_given(args)  # ONNX files given as the model: their export, with --onnx on them


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    started()  # a later Ctrl-C is not "while starting"
    stop_outside_the_loop("during the evaluation")  # SIGTERM too: one line, not a silent exit 143
    return evaluate_checkpoint(parse_args(sys.argv[1:] if argv is None else argv))


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
