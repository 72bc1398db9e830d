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

# Before torch loads OpenMP, which reads this once: its threads sleep when they wait instead of spinning.
# On a CPU shared with another job, a spinning thread holds the core that the thread it waits for
# needs: beside a 2-thread job the default command took 7x its quiet time, 2x with sleeping threads,
# which cost nothing measurable on a quiet machine (README, "CPU threads"). A user's own policy is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __name__ == "__main__":
    from finetune.signals import stop_while_starting

    stop_while_starting()  # Ctrl-C or SIGTERM during the imports (seconds): one line, not a traceback

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator
from datasets import Dataset as HFDataset
from datasets import DatasetDict, Value
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from transformers import AutoConfig

from finetune import checkpoint as ckpt
from finetune.config import (
    EVAL_KEYS,
    DataArgs,
    ModelArgs,
    TrainConfig,
    config_from_dict,
    parse_override,
    settings_from_flags,
)
from finetune import checks
from finetune.checks import labels as label_rules
from finetune.checks.labels import number_as_written
from finetune.checks.splits import another_scale
from finetune.cli import settings_help
from finetune.data import (
    check_columns,
    encode_split,
    file_sha256,
    ids_read_through_label_names,
    load_path,
    load_splits,
)
from finetune.errors import UserError, first_line, remedy, write_failure
from finetune.exits import exit_on_user_error
from finetune.evaluation import evaluate_model
from finetune.lora import apply_lora, merge_lora
from finetune.metrics import MULTI, REGRESSION, SINGLE, TOKENS, classification_report, summary_line
from finetune.formats import is_list as _is_list
from finetune.models import build_model, offline_hint
from finetune.plots import plot_confusion_matrix
from finetune.problems import (
    infer_problem_type,
    placeholder_labels,
    problem_type_of,
    scores,
)
from finetune.rundir import (
    ADAPTER,
    CHECKPOINTS,
    CONFUSION_MATRIX,
    EVAL,
    EVAL_METRICS,
    MODEL,
    PREDICTIONS,
    RunDir,
    is_hub_name,
    kind_of,
    replaced_whole_around,
)
from finetune.runtime import data_workers, main_process_first, make_accelerator, pin_memory, quiet_libraries
from finetune.signals import started
from finetune.tasks import TASK_NAMES, task_of, task_of_model

FORMAT = "finetune.evaluate/1"  # marks a metrics.json as ours: only such a file is ever replaced
WEIGHTS = "model.safetensors"  # what Accelerate's save_state writes for a (non-sharded) model
# --- what is evaluated ----------------------------------------------------------------------------


@dataclass
class Target:
    """The model to evaluate: where it is, what kind it is, and the run config that goes with it."""

    spec: str  # as the user gave it: a path or a hub name
    kind: str  # "training-state", "export" or "hub"
    cfg: TrainConfig | None  # the run's config; None when only the model is known (then --data)
    label_names: list[str]  # in id order
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


def _run_config(raw: Any, where: str) -> TrainConfig:
    if not isinstance(raw, dict):
        raise UserError(f"{where} holds no run config; was it written by finetune.run?")
    try:
        return config_from_dict(raw, saved=True)
    except UserError as e:
        raise UserError(f"the run config in {where} does not load: {e}") from None


def _read_run_file(file: Path) -> tuple[dict | None, tuple[Path, str] | None]:
    """A run's results.json (JSON) or config.yaml (YAML) beside its export: its mapping, or None and
    (the file, what is wrong with it) when it does not parse (cut short, edited) or holds no mapping."""
    fmt = "JSON" if file.suffix == ".json" else "YAML"
    try:
        text = file.read_text()
        value = json.loads(text) if fmt == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
        return None, (file, f"not valid {fmt}: {first_line(e)}")
    if not isinstance(value, dict):
        return None, (file, f"not a {fmt} {'object' if fmt == 'JSON' else 'mapping'}: {type(value).__name__}")
    return value, None


def _model_labels(config) -> list[str]:
    return [str(config.id2label[i]) for i in range(config.num_labels)]


def _load_model_config(spec: str, trust_remote_code: bool = False, base: bool = False):
    """`base`: the pretrained model a training-state checkpoint's architecture comes from, not what is
    evaluated (an export, a model folder)."""
    try:
        return AutoConfig.from_pretrained(spec, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        damaged = _damaged_json(Path(spec).expanduser(), base)
        if damaged is not None:
            raise damaged from None
        first = first_line(e)
        raise UserError(f"could not load the model config of '{spec}': {first}{offline_hint(spec)}") from None


def _damaged_json(folder: Path, base: bool = False) -> UserError | None:
    """For a model folder that does not load: the first of its *.json files (config.json, tokenizer.json,
    ...) that does not parse (a copy cut short, an edit gone wrong), named with the fix; None if all do.
    The loader's own error (`Expecting ',' delimiter: line 52 column 6`) names no file."""
    if not folder.is_dir():
        return None
    for file in sorted(folder.glob("*.json")):
        try:
            json.loads(file.read_bytes())
        except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
            fix = (
                "copy or download that model again"
                if base
                else "put back the file the run saved (a tokenizer file can be copied again from the "
                "model the run started from), or evaluate a training-state checkpoint of the run "
                "(<run>/checkpoints/step-N), or retrain"
            )
            why = first_line(e)
            return UserError(f"{file} is not valid JSON ({why}): the file is damaged (cut short?); {fix}")
        except OSError:
            continue
    return None


def resolve_target(spec: str, task: str | None, have_data: bool, said: checks.Said | None = None) -> Target:
    """Tell a training-state checkpoint, an export and a hub name apart; read their config and labels."""
    path = Path(spec).expanduser()
    if not path.exists():
        if not is_hub_name(spec) or not have_data:
            raise UserError(
                f"checkpoint not found: {spec}; give <run>/checkpoints/step-N, <run>/model, "
                "or a hub model name with --data"
            )
        config = _load_model_config(spec)
        return Target(spec, "hub", None, _model_labels(config))
    if not path.is_dir():
        raise UserError(
            f"{spec} is a file; give a checkpoint directory (<run>/checkpoints/step-N), "
            "an export (<run>/model) or a hub model name"
        )

    kind = kind_of(path)
    if kind == "checkpoint":
        if not (path / ckpt.COMPLETE).is_file():
            raise UserError(
                f"{spec} is not a complete checkpoint (no {ckpt.COMPLETE} marker); it "
                "was probably interrupted while saving: evaluate an earlier one or <run>/model"
            )
        if not (path / ckpt.MANIFEST).is_file():  # saved whole, then a file of it lost
            raise UserError(f"{path / ckpt.MANIFEST} is missing: the checkpoint cannot say what it holds; evaluate "
                            "an earlier one or <run>/model")  # fmt: skip
        try:
            manifest = ckpt.read_manifest(path)
        except ValueError as e:
            raise UserError(f"{path / ckpt.MANIFEST} is not valid JSON: {e}") from None
        cfg = _run_config(manifest.get("config"), str(path / ckpt.MANIFEST))
        if task is not None and task != cfg.task:
            raise UserError(f"--task {task} contradicts the checkpoint, a {cfg.task} run")
        labels = manifest.get("label_names")
        if not labels:
            raise UserError(f"{path / ckpt.MANIFEST} has no label_names; it was not written by finetune.run")
        return Target(spec, "training-state", cfg, [str(n) for n in labels], manifest.get("step"))

    if kind == "export":
        config = _load_model_config(str(path))
        labels = _model_labels(config)
        run = RunDir(path.resolve().parent)
        results_file, config_file = run.results, run.config
        differ = None  # the run beside it names other labels than its config.json
        damaged = None  # the run's file beside it that does not parse: (path, why)
        results = None
        if results_file.is_file():
            results, damaged = _read_run_file(results_file)
        if results is not None and config_file.is_file():
            # Only a run whose results name this export's labels is its run: an export copied
            # next to some unrelated config.yaml is evaluated alone.
            if results.get("label_names") and results.get("label_names") != labels:
                differ = results["label_names"]
            if results.get("label_names") == labels:
                raw, damaged = _read_run_file(config_file)
                if raw is not None:
                    cfg = _run_config(raw, str(config_file))
                    if task is not None and task != cfg.task:
                        raise UserError(f"--task {task} contradicts the export, a {cfg.task} run")
                    return Target(spec, "export", cfg, labels, results.get("step"))
        if damaged is not None:
            file, why = damaged
            said_of_it = f"{file} exists but is damaged ({why})"
            if not have_data:
                raise UserError(
                    f"{said_of_it}, so the data and settings of {spec}'s run are unknown; restore it (from a "
                    "backup, or train the run again), or pass --data FILE_OR_DIR (and --task if needed) to "
                    "evaluate the export alone on a file"
                )
            (said or checks.Said()).warn(f"{said_of_it}; evaluating {spec} alone, without its run's settings (columns: pass key=value)")
        if not have_data and differ is not None:
            raise UserError(
                f"{path / 'config.json'} names the labels {labels[:5]}, but its run ({results_file}) trained "
                f"{differ[:5]}: its id2label was edited, or the export is another run's; put back the run's "
                "config.json, or pass --data FILE_OR_DIR to evaluate it alone"
            )
        if not have_data:
            gone = [f.name for f in (config_file, results_file) if not f.is_file()]
            where = (f"without its run's {' and '.join(gone)} one level up" if gone else
                     f"whose run one level up ({results_file}) names no labels")
            raise UserError(f"{spec} is a model folder {where}; pass --data FILE_OR_DIR (and --task if needed)")
        return Target(spec, "export", None, labels)

    if kind == "run":
        run = RunDir(path)
        raise UserError(
            f"{spec} is a run directory; evaluate {run.model} (the final export) or one of "
            f"{run.checkpoints}/{ckpt.PREFIX}N"
        )
    outer = path.parent
    if path.name == CHECKPOINTS and RunDir(outer).holds_run():  # a run's checkpoints/ folder: which one?
        newest = ckpt.list_checkpoints(outer)
        which = f" (the newest: {newest[-1]})" if newest else ""
        raise UserError(f"{spec} is a run's folder of checkpoints; evaluate one of them{which}, or the run's "
                        f"export {RunDir(outer).model}")  # fmt: skip
    if path.name == ADAPTER and (outer / MODEL).is_dir():  # LoRA's adapter alone: the export beside it is whole
        raise UserError(f"{spec} is a run's LoRA adapter, not a whole model; evaluate the export beside it, "
                        f"{outer / MODEL} (the adapter merged into the model)")  # fmt: skip
    raise UserError(
        f"{spec} is neither a training-state checkpoint (manifest.json, {ckpt.COMPLETE}, {WEIGHTS}) "
        "nor an exported model (config.json and weights)"
    )


def eval_config(target: Target, task: str | None, data: str | None, overrides: list[str],
                said: checks.Said | None = None) -> TrainConfig:  # fmt: skip
    """The run's config (or one made for a lone model), set up to evaluate: no trackers, no model
    parallelism (the whole model in each process), plus the `key=value` evaluation settings."""
    if target.cfg is not None:
        raw = target.cfg.to_dict()
    else:
        config = _load_model_config(target.spec)
        model_task = task_of_model(config, target.spec, task).name
        source = {"data_dir": data} if data is not None and Path(data).is_dir() else {"train_file": data}
        # The model's problem type (transformers' reading: one output is a regression); null: from the data.
        problem = getattr(config, "problem_type", None) or ("regression" if config.num_labels == 1 else None)
        raw = {"task": model_task, "model_name_or_path": target.spec, "problem_type": problem, **source}
    raw.update(
        report_to=[],
        model_parallel=False,
        pipeline_chunks=1,
        devices=None,
        max_memory=None,
        resume_from_checkpoint=None,
        gradient_accumulation_steps=1,
        label_names=target.label_names,
    )
    given = set()
    for item in overrides:
        key, value = parse_override(item)
        given.add(key)
        if key not in EVAL_KEYS:
            raise UserError(
                f"{key} cannot be set when evaluating; evaluation settings are: {', '.join(EVAL_KEYS)}"
            )
        raw[key] = value
    if "label_columns" in given and raw.get("label_columns") and raw.get("problem_type") not in (None, MULTI):
        raise UserError(f"label_columns (0/1 columns, one per label) is multi-label data, and this model was trained "
                        f"for {raw['problem_type']}: give its labels in one column with label_column=, or leave "
                        "label_columns out")  # fmt: skip
    trained = target.cfg.text_pair_column if target.cfg is not None else None
    if "text_pair_column" in given and target.cfg is not None and bool(raw.get("text_pair_column")) != bool(trained):
        # sentence pairs for a model of single texts, or single texts for a model of pairs: scored, and said
        if trained is None:
            (said or checks.Said()).warn(f"text_pair_column={raw['text_pair_column']}: this model was trained on single texts (its run had "
                 "no text_pair_column), so it never saw sentence pairs and its scores on them measure input it was "
                 "not trained for; leave text_pair_column out, or evaluate a model trained on pairs")  # fmt: skip
        else:
            (said or checks.Said()).warn(f"text_pair_column=null: this model was trained on sentence pairs (text_pair_column={trained}), so "
                 "its scores on single texts measure input it was not trained for; give the second sentence's "
                 "column as text_pair_column")  # fmt: skip
    return config_from_dict(raw, saved=True, said=said)


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
        tokenizer = task.load_preprocessor(cfg.model_args) if task.preprocessor_first else None
        model = build_model(architecture_only(cfg.model_args), target.label_names, task.vocab_size(tokenizer))
        state = read_weights(target)
        if cfg.peft is not None:  # a LoRA run's state: the adapters on the model, merged once loaded
            model = apply_lora(model, cfg.peft)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise UserError(
                f"the weights in {target.path} do not fit the model its config builds: missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}"
            )
        model = merge_lora(model)
        preprocessor = tokenizer if tokenizer is not None else task.load_preprocessor(cfg.model_args, model.config)
    else:
        source = str(target.path) if target.path is not None else target.spec
        local = target.path is not None
        if local:
            _weights_must_be_a_file(target.path)
        try:
            model, loading = task.auto_model().from_pretrained(source, use_safetensors=True if local else None,
                                                                 output_loading_info=True)  # fmt: skip
            missing = [*loading.get("missing_keys", ()), *loading.get("mismatched_keys", ())]
            if local and missing:  # transformers fills them with random weights and a log line: not this model
                raise _foreign_weights(target, f"{len(missing)} weight(s) missing, e.g. {missing[0]}")
            preprocessor = task.load_saved_preprocessor(source)
        except (OSError, ValueError, SafetensorError) as e:
            damaged = _damaged_json(target.path) if local and not isinstance(e, SafetensorError) else None
            if damaged is not None:
                raise damaged from None
            first = first_line(e)
            damaged = " (its weights file is damaged: replace it)" if isinstance(e, SafetensorError) else ""
            raise UserError(f"could not load the {cfg.task} model '{target.spec}'{damaged}: {first}"
                            f"{offline_hint(target.spec)}") from None
        except RuntimeError as e:  # transformers: weights whose shapes do not fit config.json
            if "size mismatch" not in str(e) and "ignore_mismatched_sizes" not in str(e):
                raise
            raise _foreign_weights(target, first_line(e)) from None
    bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
    if bad is not None:  # every prediction would be NaN, scored as if it meant something
        raise UserError(
            f"the weights of '{target.spec}' hold NaN or infinite values ({bad}); a run that diverged saves none "
            "such, so the file was changed or damaged: evaluate another checkpoint, or retrain"
        )
    # An export's own tokenizer was loaded, not the run's setting's: a fault in it is the export's.
    exported = str(target.path) if target.kind != "training-state" and target.path is not None else None
    task.check_model(model, preprocessor, cfg.model_args, cfg.data_args, exported)
    return model.eval(), preprocessor


def _foreign_weights(target: Target, what: str) -> UserError:
    """An export whose model.safetensors does not fit its config.json: `what` differs. Where the classifier's
    outputs differ from the labels config.json names, that is said (a config.json edited by hand, most
    often: a label added to id2label)."""
    head = _head_rows(target.path) if target.path is not None else None
    if head is not None:
        rows, labels = head
        return UserError(
            f"the config.json of '{target.spec}' names {labels} labels (id2label) but its model.safetensors' "
            f"classifier has {rows} outputs: one of the two files was edited or replaced (a model's labels are "
            "fixed when it is trained); put back the pair this export was saved with, or evaluate another export"
        )
    what = what.split("; ")[0].replace(" For details look at the above report!", "").rstrip(".! ")
    return UserError(
        f"the weights in '{target.spec}' do not fit its config.json (another model's model.safetensors, or a "
        f"config.json edited?): {what}; put back the files this export was saved with, or evaluate another export"
    )


def _head_rows(folder: Path) -> tuple[int, int] | None:
    """(the classifier's outputs in model.safetensors, the labels config.json names) where they differ."""
    try:
        config = json.loads((folder / "config.json").read_text())
        labels = len(config.get("id2label") or {}) or config.get("num_labels")
        with safe_open(str(folder / WEIGHTS), "pt") as weights:
            key = next((k for k in weights.keys() if k.endswith("classifier.weight")), None)
            rows = weights.get_slice(key).get_shape()[0] if key else None
    except (OSError, ValueError, SafetensorError, AttributeError):
        return None
    return (rows, labels) if isinstance(labels, int) and rows is not None and rows != labels else None


def _weights_must_be_a_file(folder: Path) -> None:
    """A weights file that is something else (a folder of that name) is said as such, not as missing."""
    weights = folder / WEIGHTS
    if weights.exists() and not weights.is_file():
        raise UserError(
            f"{weights} is a folder, not a weights file; put back the {WEIGHTS} file the run saved, or evaluate "
            "another checkpoint of the run, or its export (<run>/model)"
        )


def read_weights(target: Target) -> dict[str, torch.Tensor]:
    """A training-state checkpoint's weights: model.safetensors (Accelerate saves the registered, unwrapped
    module: plain names), or an FSDP checkpoint's shards merged on the fly with Accelerate's own
    `merge_fsdp_weights` (into a temporary folder, deleted after)."""
    import tempfile

    weights = target.path / WEIGHTS
    shards = sorted(target.path.glob("pytorch_model_fsdp_*"))
    try:
        if weights.is_file():
            return load_file(weights)
        if shards:
            from accelerate.utils import merge_fsdp_weights

            with tempfile.TemporaryDirectory(prefix="finetune-merge-") as merged:
                merge_fsdp_weights(str(shards[0]), merged, safe_serialization=True)
                return load_file(Path(merged) / WEIGHTS)
    except SafetensorError as e:
        raise UserError(
            f"{weights} is not a readable safetensors file ({first_line(e)}); evaluate another checkpoint of the run, "
            "or its export (<run>/model)"
        ) from None
    except (OSError, RuntimeError, ValueError) as e:  # torch.distributed.checkpoint on damaged shards
        raise UserError(f"the FSDP shards in {shards[0]} do not merge: {first_line(e)}") from None
    _weights_must_be_a_file(target.path)
    found = sorted(p.name for p in target.path.iterdir())
    raise UserError(f"{target.spec} holds no {WEIGHTS} and no FSDP shards (found: {', '.join(found)})")


# --- the data -------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    """A file: the sha256 of its bytes (what `sha256sum` prints). A folder: of its files' relative
    paths and bytes, in sorted order, each framed by its length so that no two layouts collide."""
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for file in sorted(
        (p for p in path.rglob("*") if p.is_file()), key=lambda p: p.relative_to(path).as_posix()
    ):
        name = file.relative_to(path).as_posix().encode()
        h.update(len(name).to_bytes(8, "little") + name + file.stat().st_size.to_bytes(8, "little"))
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _say_if_changed_since_the_run(target: Target, info: dict[str, Any], said: checks.Said) -> None:
    """The run's own split, read from a file whose bytes differ from those the run trained and scored on
    (results.json's data_sha256): said in one line, since these scores are not the run's."""
    if target.path is None or info.get("data_sha256") is None:
        return
    recorded = _recorded_digests(target).get(info["data"])
    if recorded is not None and recorded != info["data_sha256"]:
        said.warn(f"{info['data']} changed since the run trained on it (its sha256 differs from the one in "
             f"{_run_of(target).results}): these are scores on the file as it is now, not the run's")


def _run_of(target: Target) -> RunDir:
    return RunDir(target.path.parent if target.kind == "export" else target.path.parent.parent)


def _recorded_digests(target: Target) -> dict[str, str]:
    """The sha256 of each data file the run read, by its resolved path (results.json's data_sha256); {} for a
    model without its run, or a run that did not finish."""
    if target.path is None:
        return {}
    run = _run_of(target)
    results, _ = _read_run_file(run.results) if run.results.is_file() else (None, None)
    return (results or {}).get("data_sha256") or {}


def _pick_split(available: list[str], split: str | None, where: str) -> str:
    if split is None:
        return next((s for s in ("test", "validation") if s in available), available[0])
    if split not in available:
        raise UserError(f"unknown split '{split}'; {where} has: {', '.join(available)}")
    return split


def run_split(args: DataArgs, split: str | None, said: checks.Said | None = None) -> tuple[HFDataset, str, dict[str, Any]]:
    """The split as the run saw it: `load_splits` again, so a held-out validation split and the
    max_*_samples limits come out as in training. Labels are the checkpoint's, in its order."""
    if split is not None and args.train_file:  # files: their splits are known before any is read (or warned of)
        _pick_split(["train", "validation"] + (["test"] if args.test_file else []), split, "the run's data")
    try:
        raw, _ = load_splits(args, said)
    except UserError as e:
        raise UserError(
            f"{e} (reading the run's data; pass --data FILE_OR_DIR to evaluate other data)"
        ) from None
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
    if path.is_dir() and split is None and len(loaded) > 1 and not {"test", "validation"} & set(loaded):
        shown = ", ".join(list(loaded)[:5])  # a.csv and b.csv: two parts of one set, or two sets? not the first alone
        raise UserError(f"--data {data} holds {len(loaded)} data sets not named by split ({shown}); pass --split with "
                        "one of them, or one file as --data (a file each time to score each)")  # fmt: skip
    name = "data" if path.is_file() else _pick_split(list(loaded), split, f"--data {data}")
    what = f"--data {data}" + (f" [{name}]" if path.is_dir() and len(loaded) > 1 else "")  # a split among others
    ds = loaded[name]
    if len(ds) == 0:
        raise UserError(f"{what} has no rows; check the file")
    # No label column at all, or one with no value in any row (a CSV's header kept): data to predict.
    empty = [c for c in args.label_sources if c in ds.column_names and all(v is None for v in ds[c])]
    if empty:
        ds = ds.remove_columns(empty)
    labelled = any(column in ds.column_names for column in args.label_sources)
    if not labelled:  # a "Label" or "labels" column beside a model that reads "label": labels, not data to predict
        for column in args.label_sources:
            twin = next((c for c in ds.column_names if c.lower().rstrip("s") == column.lower().rstrip("s")), None)
            if twin is not None:
                key = "tags_column" if column == args.tags_column else "label_column"
                how = "in another case" if twin.lower() == column.lower() else "by another name"
                raise UserError(
                    f"column '{twin}' of {what} looks like the label column '{column}' {how}; to score "
                    f"it, pass {key}={twin}; to predict without labels, rename or drop that column"
                )
        names = list(args.label_names or [])
        unread = _unread_label_column(ds, args, names)
        if unread is not None:  # the model's labels under another column name: labels, not data to predict
            column, holds = unread
            fix = f"label_column={column}" + (" label_columns=null" if args.label_columns else "")
            raise UserError(f"column '{column}' of {what} holds {holds}; to score it, pass {fix}; to predict without "
                            "labels, rename or drop that column")  # fmt: skip
        if args.problem_type == MULTI and not args.label_columns and names and set(names) <= set(ds.column_names):
            listed = ",".join(names)  # a 0/1 column a label, named as the model's labels: labels, not inputs
            raise UserError(
                f"{what} has a column for each of the model's labels ({', '.join(names)}): labels, one column "
                f"each; to score them, pass label_columns=[{listed}]; to predict without labels, drop those columns"
            )
    check_columns(ds, what, args, labelled, model_task=True, said=said)
    if labelled:  # by name, whatever the file's order or type; a label the model does not know is a UserError
        inner = getattr(ds.features.get(args.tags_column), "feature", None)
        if args.tags_column in ds.column_names and getattr(inner, "dtype", "").startswith("int") and args.label_names:
            shown = ", ".join(f"{i}={t}" for i, t in enumerate(args.label_names[:5]))
            said.warn(f"the tags of {what} are numbers, read as the model's tags at those places ({shown}, ...); if the "
                 "data numbers its tags in another order, the scores are wrong: write the tags as names")  # fmt: skip
        ds = _float_class_ids(ds, args, what)
        if args.problem_type == SINGLE:  # a run trained on ids scores its own test file so
            ds = ids_read_through_label_names(DatasetDict({what: ds}), args, SINGLE, said, label_rules.MODEL_IDS_AS_NAMES,
                                              what)[what]  # fmt: skip
        if args.problem_type == MULTI and not args.label_columns and args.label_column in ds.column_names:
            checks.gate(label_rules.REPEATED, ds[args.label_column], args.label_column, what, said=said)
        try:
            problem = infer_problem_type(ds, args, said)
        except UserError as e:  # training's fix (problem_type=) is no evaluation setting: the model's is fixed
            raise UserError(_labels_of_another_problem(ds, args, what) or first_line(e)) from None
        ds = encode_split(ds, args, problem, list(args.label_names or []), what, said, fixed=True)
    else:
        problem = args.problem_type or task_of(args.task).problems[0]
        ds = placeholder_labels(ds, args, problem, list(args.label_names or []))
    info = {
        "split": None if path.is_file() else name,
        "data": str(path.resolve()),
        "data_sha256": digests.get(str(path.resolve())) or sha256_of(path),
        "labelled": labelled,
    }
    stem = path.stem if path.is_file() or len(loaded) == 1 else f"{path.name}-{name}"
    return ds, f"{stem}-{info['data_sha256'][:8]}", info


def _thresholds(value: Any, label_names: list[str] | None) -> float | list[float] | None:
    """config.json's `multi_label_thresholds` (tuned on validation at training's end) checked: one number,
    or one per label, each a probability in [0, 1]. A list of another length, or a value outside [0, 1]
    (a label never or always predicted), is a hand edit gone wrong: refused in one line."""
    if value is None or label_names is None:
        return value
    def number(v: Any) -> float | None:  # noqa: E306
        if isinstance(v, bool):
            return None
        try:
            v = float(v)
        except (TypeError, ValueError):
            return None
        return v if 0.0 <= v <= 1.0 else None

    values = value if isinstance(value, list) else [value]
    read = [number(v) for v in values]
    fits = len(values) in (1, len(label_names)) if isinstance(value, list) else True
    if not values or None in read or not fits:
        raise UserError(
            f"the export's config.json has multi_label_thresholds={json.dumps(value)}: it must be one number or "
            f"one for each of its {len(label_names)} labels ({', '.join(label_names[:5])}"
            f"{', ...' if len(label_names) > 5 else ''}), each between 0 and 1; restore it, or delete the key to "
            "evaluate at multi_label_threshold (0.5, or as given)"
        )
    return read if isinstance(value, list) else read[0]


def _labels_of_another_problem(ds: HFDataset, args: DataArgs, what: str) -> str | None:
    """The line for labels of another kind than the export's problem type asks for: class names beside a
    regression model, lists beside a single-label one, names beside a multi-label one. Training's own
    line offers problem_type=, which evaluation does not take (the model's is fixed); None for the other
    refusals (numbers with a unit, a stray cell), whose own line holds."""
    column = args.label_column
    if args.problem_type not in (SINGLE, MULTI, REGRESSION) or args.label_columns or column not in ds.column_names:
        return None
    feature = ds.features[column]
    values = [v for v in ds[column][:1000] if v is not None]
    if _is_list(feature):
        holds = "lists of labels (a multi-label data set's)"
    elif values and all(isinstance(v, str) for v in values) and not any(number_as_written(v) for v in values):
        holds = f"class names (e.g. {values[0]!r})"
    else:
        return None
    if args.problem_type == (MULTI if holds.startswith("lists") else SINGLE):  # the kind the model reads
        return None
    needs = {REGRESSION: "a regression model (it predicts one number per sample)",
             SINGLE: "a single-label classifier (one class per sample)",
             MULTI: "a multi-label classifier (a list of its labels per sample)"}[args.problem_type]  # fmt: skip
    return (f"label column '{column}' of {what} holds {holds}, but this export is {needs}, as its config.json "
            "says: score it on data labelled as it was trained, or drop that column to predict without labels")


# Columns that name a sample (carried into predictions.jsonl, beside the `index` of its row).
ID_COLUMN = re.compile(r"(?i)(.+[_-])?(id|idx|guid|uuid|uid)|key")  # "key" alone: not an api_key

# Column names that hold a data set's targets (a regression's numbers among them).
TARGET_NAMES = ("label", "labels", "score", "scores", "target", "targets", "y", "rating", "ratings", "similarity",
                "relatedness_score", "class", "category", "sentiment", "gold_label", "value")  # fmt: skip


def _unread_label_column(ds: HFDataset, args: DataArgs, names: list[str]) -> tuple[str, str] | None:
    """A column the model's label column is not, that holds its labels: single-label classes that are all
    the model's (`sentiment` holding neg/pos), or a regression's numbers under a target's name (`label`
    beside a model that reads `score`). (The column, what it holds), or None."""
    inputs = {c for c in (args.text_column, args.text_pair_column, args.image_column, args.tokens_column) if c}
    for column in (c for c in ds.column_names if c not in inputs):
        values = [v for v in ds[column] if v is not None]
        if not values:
            continue
        if args.problem_type == REGRESSION:
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            if numbers and column.lower() in TARGET_NAMES:
                return column, f"numbers, as the model's target '{args.label_column}' does"
        elif args.problem_type == MULTI and names:  # lists of the model's labels (a model of 0/1 columns)
            lists = all(isinstance(v, list) for v in values) and any(values)
            if lists and {str(x) for v in values for x in v} <= set(names):
                return column, "lists of the model's labels"
        elif args.problem_type in (None, SINGLE) and names and len(names) > 1:
            plain = all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values)
            shown = {str(v).strip() for v in values}
            if plain and len(shown) > 1 and shown <= set(names):
                return column, f"the model's classes ({', '.join(sorted(shown)[:5])})"
    return None


def _float_class_ids(ds: HFDataset, args: DataArgs, what: str) -> HFDataset:
    """A classifier's labels written as floats (`1.0`: a CSV saved by pandas, a column with a gap once).
    Training refuses them and offers problem_type=regression, which is no evaluation setting: here a
    whole number is the model's class of that name when its classes are named "0", "1", ... (1.0 is
    class "1"); other floats are refused with the fix that fits the model (its class names)."""
    names = list(args.label_names or [])
    column = args.label_column
    single = args.problem_type == SINGLE or (args.problem_type is None and len(names) >= 2)
    tags = TOKENS in task_of(args.task).problems
    if args.label_columns or tags or not single or column not in ds.column_names:
        return ds
    feature = ds.features[column]
    dtype = feature.dtype if isinstance(feature, Value) else ""
    if not (dtype.startswith("float") or dtype == "double"):
        return ds
    values = [v for v in ds[column] if v is not None]  # a missing label is check_columns' to refuse
    fraction = next((v for v in values if not (math.isfinite(v) and v == round(v))), None)
    numbered = all(re.fullmatch(r"-?\d+", n) and str(int(n)) == n for n in names)
    if fraction is None and numbered:
        return ds.cast_column(column, Value("int64"))  # then matched by name as "0", "1", ...
    example = fraction if fraction is not None else next((v for v in values if v), values[0])
    held = "numbers with decimals" if fraction is not None else "numbers"
    listed = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    if numbered:
        but = f"the model's classes are {listed}: write each row's class as one of them (1, not 1.0)"
    else:
        but = (
            f"the model's classes are named ({listed}) and labels are matched by name: write each row's "
            "class name instead"
        )
    raise UserError(f"label column '{column}' of {what} holds {held} (e.g. {example:g}), but {but}")


# --- outputs --------------------------------------------------------------------------------------


def output_paths(metrics_file: Path) -> tuple[Path, Path]:
    """The confusion-matrix PNG and predictions.jsonl beside metrics.json."""
    return metrics_file.with_name(CONFUSION_MATRIX), metrics_file.with_name(PREDICTIONS)


def _is_ours(metrics_file: Path) -> bool:
    try:
        return json.loads(metrics_file.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _evaluated_there(metrics_file: Path) -> str | None:
    """The model whose evaluation a metrics.json of ours holds."""
    try:
        return json.loads(metrics_file.read_text()).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return None


def check_output(metrics_file: Path, target: Target, chosen: bool = False) -> None:
    """Write only into the eval outputs we own: never over a checkpoint's or anyone else's files, nor,
    in the default folder (not `chosen` with --output), over another model's evaluation."""
    folder = metrics_file.parent
    for above in (folder, *folder.parents):
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                raise UserError(f"--output {folder}: {above} is a file, not a folder; --output names a folder")
            break
    if target.path is not None and metrics_file.parent.resolve() == target.path:
        raise UserError(
            f"--output {metrics_file.parent} is the evaluated folder itself; name another folder for the "
            "evaluation (or leave --output out: it goes beside the run)"
        )
    inner = replaced_whole_around(folder)
    if inner is not None:  # a run's checkpoints/ or export: deleted whole by that run (retention, an overwrite)
        raise UserError(
            f"--output {folder} is inside {inner}, which the run in {inner.parent} deletes or replaces whole "
            "(checkpoint retention, its next export or overwrite); choose a folder outside it (or leave --output "
            "out: the evaluation goes in the run's eval/)"
        )
    ours = _is_ours(metrics_file)
    if metrics_file.exists() and not ours:
        raise UserError(
            f"{metrics_file} exists and is not a metrics.json written by finetune.evaluate; "
            "choose another --output"
        )
    other = _evaluated_there(metrics_file) if ours and not chosen else None
    mine = str(target.path) if target.path is not None else target.spec
    if other is not None and other != mine:  # two models of one name (both `model/`) on the same data
        raise UserError(
            f"{folder} holds the evaluation of another model of the same name ({other}) on the same data; pass "
            "--output DIR for this one (or move that evaluation away)"
        )
    for other in output_paths(metrics_file):
        if other.exists() and not ours:
            raise UserError(
                f"{other} exists{' beside ' + metrics_file.name if metrics_file.exists() else ''} and was not written "
                "by finetune.evaluate; "
                "choose another --output"
            )


class RecordProbabilities(torch.nn.Module):
    """The model, also keeping every batch's class probabilities (or predicted numbers) for
    predictions.jsonl.

    Called by `evaluate_model` inside its loop over the prepared loader, where Accelerate still
    knows which rows of the last batch are padding: `gather_for_metrics` here drops exactly the rows
    that evaluate_model's own gather drops, so the kept rows are the dataset's, in order, once each.
    """

    def __init__(self, model: torch.nn.Module, accelerator: Accelerator, problem_type: str = SINGLE):
        super().__init__()
        self.model, self.accelerator, self.problem_type = model, accelerator, problem_type
        self.probabilities: list[torch.Tensor] = []

    def forward(self, **inputs):
        output = self.model(**inputs)
        probabilities = scores(output.logits, self.problem_type)
        self.probabilities.append(self.accelerator.gather_for_metrics(probabilities).cpu())
        return output


def write_predictions(
    path: Path,
    probabilities: torch.Tensor | list,
    labels: list,
    names: list[str],
    inputs: list[dict[str, Any]] | None = None,
    problem_type: str = SINGLE,
    threshold: float | list[float] = 0.5,
    labelled: bool = True,
) -> None:
    """One line per sample, in dataset order: index, its input (`sample_inputs`), then
    single-label: label, prediction, per-class probabilities; regression: label, prediction (numbers);
    multi-label: labels, predictions (the names at or above `threshold`), per-label probabilities;
    tags: one line per sentence, its words, their gold tags (`labels`) and predicted tags (`predictions`).
    Data without labels (`labelled=False`): no `label`/`labels`, which would be the loader's placeholders."""
    inputs = inputs if inputs is not None else [{} for _ in labels]
    rows = probabilities.tolist() if isinstance(probabilities, torch.Tensor) else probabilities
    per_label = threshold if isinstance(threshold, list) else [threshold] * len(names)
    with path.open("w") as f:
        for i, (p, label, given) in enumerate(zip(rows, labels, inputs, strict=True)):
            record: dict[str, Any] = {"index": i, **given}
            if problem_type == TOKENS:
                record.update(labels=[names[t] for t in label], predictions=[names[t] for t in p])
            elif problem_type == REGRESSION:
                record.update(label=label, prediction=p)
            elif problem_type == MULTI:
                record.update(
                    labels=[n for n, y in zip(names, label, strict=True) if y >= 0.5],
                    predictions=[n for n, q, t in zip(names, p, per_label, strict=True) if q >= t],
                    probabilities=dict(zip(names, p, strict=True)),
                )
            else:
                prediction = max(range(len(p)), key=p.__getitem__)
                record.update(
                    label=names[label],
                    prediction=names[prediction],
                    probabilities=dict(zip(names, p, strict=True)),
                )
            if not labelled:
                record.pop("label", None), record.pop("labels", None)
            f.write(json.dumps(record) + "\n")


# --- the evaluation -------------------------------------------------------------------------------


def evaluate_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Resolve, load, evaluate over every process, write (main process). Returns metrics.json's record."""
    if args.data is not None and not Path(args.data).expanduser().exists():
        raise UserError(f"--data not found: {args.data}")
    if args.split is not None and args.data is not None and Path(args.data).expanduser().is_file():
        raise UserError("--split picks a split of the run's data or of a --data folder, not of a file")
    said = checks.Said()
    target = resolve_target(args.checkpoint, args.task, have_data=args.data is not None, said=said)
    cfg = eval_config(target, args.task, args.data, args.overrides, said)
    quiet_libraries(cfg.log_level)
    accelerator = make_accelerator(cfg)
    started = time.perf_counter()

    model, preprocessor = load_model(target, cfg)
    task = task_of(cfg.task)
    with main_process_first(accelerator):  # the main process fills datasets' cache, the others read it
        if args.data is None:
            ds, name, info = run_split(cfg.data_args, args.split, said)
        else:
            ds, name, info = data_split(cfg.data_args, args.data, args.split, said)
        if len(ds) == 0:
            raise UserError(f"no samples to evaluate in {info['data']} [{info['split'] or 'data'}]")
        if args.data is None:
            _say_if_changed_since_the_run(target, info, said)
        # As split "eval", never "train": that would add the training-time augmentation.
        prepared = task.prepare(ds, preprocessor, cfg.data_args, "eval", getattr(model.config, "num_channels", 3), said)
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
    problem = problem_type_of(ds)
    labelled = info.get("labelled", True)
    keep = args.predictions or not labelled  # data without labels: predictions are the output
    # The thresholds tuned on the run's validation split (the export's config.json), unless asked otherwise.
    tuned = _thresholds(getattr(accelerator.unwrap_model(model).config, "multi_label_thresholds", None),
                        target.label_names if problem == MULTI else None)  # fmt: skip
    asked = any(parse_override(item)[0] == "multi_label_threshold" for item in args.overrides)
    threshold = tuned if tuned and not asked else cfg.multi_label_threshold
    if args.data is not None and labelled and accelerator.is_main_process:
        _warn_training_data(target, info, said)
    if problem == REGRESSION and labelled and args.data is not None and accelerator.is_main_process:
        _warn_another_scale(target, ds["labels"], name, said)
    report, predictions = evaluate_with_predictions(model, loader, accelerator, target, problem, keep, threshold)
    if not labelled:  # the placeholder labels score nothing: only what was predicted, and how much
        report = {k: v for k, v in report.items() if k in ("num_samples", "num_sentences", "num_words", "threshold")}

    record: dict[str, Any] = {
        "format": FORMAT,
        "checkpoint": str(target.path) if target.path is not None else target.spec,
        "checkpoint_kind": target.kind,
        "step": target.step,
        "task": cfg.task,
        "problem_type": problem,
        **info,
        "label_names": target.label_names,
        **report,
        "predictions": output_paths(metrics_file)[1].name if keep else None,
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
    replaced = False
    if accelerator.is_main_process:
        replaced = write_outputs(metrics_file, record, predictions, ds, cfg, target, name, said)
    said = summary_line(report) if labelled else f"predictions for {report['num_samples']} samples (no labels to score)"
    accelerator.print(f"{name}: {said} -> {metrics_file.parent}" + (" (replaced the previous one)" if replaced else ""))
    accelerator.end_training()
    return {**record, "metrics_file": str(metrics_file)}


def _warn_training_data(target: Target, info: dict[str, Any], said: checks.Said) -> None:
    """--data that is the run's own training file (its bytes): scores on it say how well the model fits what it
    trained on, not how it does on data it never saw."""
    train = Path(target.cfg.train_file).expanduser() if target.cfg is not None and target.cfg.train_file else None
    if train is None or info.get("data_sha256") is None:
        return
    # the bytes it trained on (results.json), else (a run not finished) the file as it is
    trained = _recorded_digests(target).get(str(train.resolve())) or (sha256_of(train) if train.is_file() else None)
    if info["data_sha256"] == trained:
        said.warn(f"--data {info['data']} is the run's training file: the model trained on these samples, so its scores "
             "here are higher than on data it never saw; evaluate the test or validation file for those")  # fmt: skip


def _warn_another_scale(target: Target, targets: list, name: str, said: checks.Said) -> None:
    """Regression targets mostly far outside the range of the run's training targets (trained on 0-5,
    scored on 0-500): another scale, on which the scores say nothing. Training's own rule
    (data.another_scale); said where the run and its training data are at hand."""
    if target.cfg is None or not target.cfg.train_file:
        return
    try:
        raw, _ = load_splits(target.cfg.data_args, checks.Said(quiet=True))  # its warnings were said by its run
    except (UserError, OSError):  # the run's data moved or changed: nothing to compare with
        return
    scale = another_scale(raw["train"]["labels"], targets, f"targets of {name}")
    if scale:
        said.warn(f"{scale} the model predicts on the training scale; put the targets on it")


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


def evaluate_with_predictions(model, loader, accelerator, target: Target, problem: str, keep: bool, threshold):
    """The metrics, and with `keep` what predictions.jsonl needs: per sample, the gathered probabilities
    (or numbers); per sentence, the predicted tag ids."""
    if problem == TOKENS:
        report = evaluate_model(model, loader, accelerator, target.label_names, problem_type=problem, keep_predictions=keep)
        return report, report.pop("predictions", None)
    recorder = RecordProbabilities(model, accelerator, problem) if keep else None
    report = evaluate_model(
        recorder if recorder is not None else model, loader, accelerator, target.label_names,
        problem_type=problem, threshold=threshold,
    )  # fmt: skip
    if recorder is None:
        return report, None
    probabilities = torch.cat(recorder.probabilities)
    agrees = len(probabilities) == len(loader.dataset)
    if problem == SINGLE:
        labels = list(loader.dataset["labels"])
        check = classification_report(probabilities.argmax(-1).tolist(), labels, target.label_names)
        agrees = check["confusion_matrix"] == report["confusion_matrix"]
    if not agrees:  # our bug, not the user's
        raise RuntimeError("the gathered predictions disagree with the gathered metrics")
    return report, probabilities


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
        if problem == SINGLE and "confusion_matrix" in record:  # a confusion matrix is for classes, with labels
            title = f"{target.short_name} on {name}\naccuracy {record['accuracy']:.3f}, {record['num_samples']:,} samples"
            plot_confusion_matrix(record["confusion_matrix"], target.label_names, temporary(png), title=title, said=said)
        if predictions is not None:
            inputs = task_of(cfg.task).sample_inputs(ds, cfg.data_args)
            ids = [c for c in ds.column_names if ID_COLUMN.fullmatch(c) and c not in ("index", *inputs[0])] if inputs else []
            if ids:  # the data's own ids, to join the predictions back by: "id", "doc_id", "guid" ...
                inputs = [{**dict(zip(ids, row, strict=True)), **given}
                          for row, given in zip(zip(*(ds[c] for c in ids), strict=True), inputs, strict=True)]  # fmt: skip
            write_predictions(temporary(jsonl), predictions, list(ds["labels"]), target.label_names, inputs, problem,
                              record.get("threshold", cfg.multi_label_threshold), record.get("labelled", True))  # fmt: skip
        for tmp in written.values():
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())  # a failing disk says so now (EIO), not after the files look whole
    except Exception as e:
        for tmp in written.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        if created is not None:  # the folders this evaluation made, now empty
            with contextlib.suppress(OSError):
                for made in (folder, *folder.parents):
                    made.rmdir()
                    if made == created:
                        break
        failure = write_failure(e, folder)
        if failure is None:
            raise
        file = f" ({failure.filename})" if failure.filename else ""
        raise UserError(
            f"cannot write the evaluation to {folder}: {failure.strerror}{file}; nothing of it was left there; "
            f"{remedy(failure.errno, '--output')}"
        ) from None
    for final, tmp in written.items():
        os.replace(tmp, final)
    if replaced:  # a previous evaluation's files that this one does not write, now stale
        for stale in (png, jsonl):
            if stale not in written:
                stale.unlink(missing_ok=True)
    return replaced


# --- command line ---------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit status 2, like every other user error
        raise UserError(f"{message} (see --help)")


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
        "checkpoint", help="<run>/checkpoints/step-N, <run>/model, a model folder or a hub name"
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
    parser.add_argument("--task", choices=TASK_NAMES, help="the task of a model evaluated without its run")
    args = parser.parse_intermixed_args(settings_from_flags(argv, EVAL_KEYS))
    second = next((o for o in args.overrides if "=" not in o and Path(o).expanduser().exists()), None)
    if second is not None:  # a second checkpoint where settings go
        raise UserError(f"{second} is a second model or checkpoint; one command evaluates one: run it again for "
                        "each (settings after the checkpoint are key=value)")  # fmt: skip
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    started()  # a later Ctrl-C is not "while starting"
    return evaluate_checkpoint(parse_args(sys.argv[1:] if argv is None else argv))


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
