"""The model card (README.md) of an export directory, and the optional upload to the Hugging Face Hub.

    from finetune.card import describe_data, push_to_hub, write_model_card

    write_model_card(out / "model", config=cfg.to_dict(), labels=labels, results=results,
                     base_model=cfg.model_name_or_path if cfg.model_config is None else None,
                     data_description=describe_data(cfg.data_args))
    check_hub_access("my-user/my-model")                  # at the start of a run that will push: fails early offline
    push_to_hub(out / "model", "my-user/my-model")        # only when the user asks; needs the network

The card is huggingface_hub's `ModelCard`: `ModelCardData` writes the YAML front matter the Hub
indexes (library_name, pipeline_tag, base_model, license, tags, datasets, metrics, and a model-index
with the validation/test accuracy and macro F1), and the Jinja template `templates/model_card.md`
lays out the Markdown a person reads: base model, data, hyperparameters, metrics, labels, how to
load it with `pipeline`, how it was trained. Nothing here touches the network.

Secrets never reach the card: config keys that look like credentials (`hub_token`, `api_key`,
`password`, ...) are left out, and values that look like tokens (`hf_...`, `sk-...`, a URL with a
password) are replaced by `<redacted>`, at any depth and in the launch command. Local paths are
shown relative to the repository (or `~`), not as the absolute paths of the machine that trained;
elsewhere by their last two parts after `.../`, which the card says to replace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

import finetune
from finetune import checks
from finetune.checks import tools
from finetune.config import REPO_DIR, DataArgs
from finetune.errors import REDACTED, SECRET_VALUE
from finetune.layout import is_hub_name
from finetune.metrics import METRICS
from finetune.problems import Problem, problem_of
from finetune.tasks import DEFAULT_TASK, TASKS, task_of

CARD = "README.md"
TEMPLATE = Path(__file__).with_name("templates") / "model_card.md"  # Jinja, rendered by ModelCard

# Config keys whose values are credentials. Matched as whole words of a snake_case name, so
# `tokenizer_name` is kept and `hub_token`, `push_to_hub_token`, `wandb_api_key` are not.
SECRET_KEY = re.compile(
    r"(^|_)(token|secret|secrets|password|passwd|credential|credentials|api_key|apikey|auth|"
    r"private_key|access_key)($|_)",
    re.IGNORECASE,
)

# dataset_name values that name a loader, not a dataset on the Hub.
BUILDERS = {"imagefolder", "audiofolder", "csv", "json", "parquet", "text", "arrow", "webdataset"}

# The hyperparameters a reader looks for first, in this order; everything is in the full config.
HYPERPARAMETERS = [
    "learning_rate",
    "lr_scheduler_type",
    "warmup_ratio",
    "warmup_steps",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "dropout",
    "freeze_embeddings",
    "peft",
    "seed",
    "max_length",
    "group_by_length",
    "max_train_samples",
]


# --- what goes into the card -------------------------------------------------------------------------


def redact(value: Any) -> Any:
    """`value` with credential-looking keys left out and credential-looking strings replaced."""
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items() if not SECRET_KEY.search(str(k))}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str) and SECRET_VALUE.search(value):
        return REDACTED
    return value


ELIDED = ".../"  # marks a path shown by its last two parts: the reader writes their own copy's there


def _display_path(value: Any) -> Any:
    """An absolute local path as the reader can use it: relative to the repository, or to ~; anywhere
    else only its last two parts after `ELIDED` (a card travels: the machine's layout is no one's
    business, and the mark says the path is to be filled in)."""
    if not isinstance(value, str) or not value.startswith("/"):
        return value
    path = Path(value)
    for root, prefix in ((REPO_DIR, ""), (Path.home(), "~/")):
        try:
            return prefix + str(path.relative_to(root))
        except ValueError:
            continue
    return ELIDED + str(Path(*path.parts[-2:])) if len(path.parts) > 2 else value


def _public_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: _display_path(v) for k, v in redact(config).items()}


def _license_of(base_model: str | None) -> str | None:
    """The licence in a local base model's own card, when it has one. Only a file on disk is read:
    `ModelCard.load` of anything else would download it."""
    card = Path(base_model).expanduser() / CARD if base_model else None
    if card is None or not card.is_file():
        return None
    try:
        value = ModelCard.load(card, ignore_metadata_errors=True).data.license
    except (ValueError, yaml.YAMLError):
        return None
    return value if isinstance(value, str) else None


def describe_data(data: DataArgs) -> str:
    """One paragraph on the training data, from the run's data settings."""
    data = DataArgs(**redact(dataclasses.asdict(data)))
    if data.train_file:
        parts = [f"{split} `{_display_path(path)}`" for split, path in data.files.items()]
        source = "files: " + ", ".join(parts)
    elif data.data_dir and data.dataset_name in (None, *BUILDERS):
        source = f"the `{data.dataset_name or 'imagefolder'}` directory `{_display_path(data.data_dir)}`"
    else:
        subset = f" (config `{data.dataset_config_name}`)" if data.dataset_config_name else ""
        source = f"the Hub dataset `{data.dataset_name}`{subset}"
    task = task_of(data.task)
    columns = task.card_columns(data)
    labels = ", ".join(f"`{c}`" for c in data.label_sources)
    problem = problem_of(data.problem_type)
    text = f"Trained on {source}; {columns}, labels from {labels}{problem.label_words}."
    if data.train_file and not data.validation_file:  # files: no validation split given
        stratified = "stratified " if problem.classes else ""
        text += (
            f" Without a validation split, a {stratified}{data.validation_split_percentage}% "
            "of the training data was held out for validation."
        )
    limits = [
        f"{split} {limit}"
        for split, limit in (
            ("train", data.max_train_samples),
            ("validation", data.max_eval_samples),
            ("test", data.max_test_samples),
        )
        if limit
    ]
    if limits:
        text += " Limited to the first samples of each split: " + ", ".join(limits) + "."
    return text


def launch_command() -> str | None:
    """The command of this process, when it is the training entry point (local paths shown as the
    card shows them)."""
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if script not in ("run.py", "finetune-train"):
        return None

    def shown(arg: str) -> str:
        key, eq, value = arg.partition("=")
        return f"{key}={_display_path(value)}" if eq and "/" not in key else _display_path(arg)

    return " ".join(["accelerate launch finetune/run.py", *(shlex.quote(shown(a)) for a in sys.argv[1:])]).strip()


def _number(value: Any) -> str:
    """Metrics to 4 decimals; anything else (ids, counts, names) as it is."""
    return f"{value:.4f}" if isinstance(value, float) else ("" if value is None else str(value))


def _setting(value: Any) -> str:
    """A hyperparameter as the user would type it: 1e-08, 0.001, cosine, true."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cells(rows: list[list[Any]]) -> list[list[str]]:
    """A table's cells as Markdown: numbers to 4 decimals; a `|` or a line break in a value (a class named
    "a|b") escaped, so that it stays in its cell and its row."""
    cell = str.maketrans({"|": "\\|", "\n": "\\n", "\r": "\\r"})
    return [[_number(v).translate(cell) for v in row] for row in rows]


def _learned_line(learned: dict | None, problem: Problem) -> str | None:
    """The run's verdict against the trivial baseline (a model that predicts the same for every input; for
    plain tags, each word's most frequent training tag: `Problem.baseline_model`)."""
    if not learned or learned.get("value") is None or learned.get("baseline") is None:
        return None
    shown = METRICS[learned["metric"]].name
    if learned.get("warn", learned["verdict"] is False):  # (a run before "warn" was recorded: a False verdict)
        return f"**Warning:** {learned['said']}."
    return (
        f"Against a trivial baseline ({problem.baseline_model}, from the training labels alone): "
        f"validation {shown} {learned['value']:.4f} vs {learned['baseline']:.4f}."
    )


def _eval_results(task: str, source: str, config_name: str | None, splits: dict, metrics: list) -> list:
    """The model-index entries: each split's value of each metric (finetune/metrics.py), where recorded."""
    return [
        EvalResult(
            task_type=task,
            dataset_type=source,
            dataset_name=source,
            dataset_split=split,
            dataset_config=config_name,
            metric_type=metric.card_type,
            metric_name=metric.name,
            metric_args=metric.card_args,
            metric_value=float(values[metric.key]),
        )
        for split, values in splits.items()
        for metric in metrics
        if values.get(metric.key) is not None
    ]


# --- the card ----------------------------------------------------------------------------------------


def write_model_card(
    export_dir: Path,
    *,
    config: dict[str, Any],
    labels: list[str],
    results: dict[str, Any],
    base_model: str | None,
    data_description: str,
    license: str | None = None,
    command: str | None = None,
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    repo_id: str | None = None,
) -> Path:
    """Write `<export_dir>/README.md`, the Hub model card. Returns its path.

    config: the resolved config (`cfg.to_dict()`); shown with secrets removed.
    labels: what the outputs are, by name in id order (a `Labels`).
    results: what `train` returns: {"step", "validation": {...}, "test": {...}, "versions", ...}.
    base_model: the pretrained model fine-tuned (a Hub id or a local directory); None for a model
        built from a config. Only a Hub id goes into the front matter, where the Hub links it.
    license: defaults to the licence in a local base model's README, else left out.
    command: how the run was launched; defaults to this process's command line when it is run.py.
    num_processes, mixed_precision: the Accelerate topology, read back from the Accelerator.
    repo_id: where the model will be pushed; used in the loading example instead of the path.
    """
    export_dir = Path(export_dir)
    public = _public_config(config)
    task = public.get("task", DEFAULT_TASK)
    hub_base = base_model if is_hub_name(base_model) else None
    model_json = _model_json(export_dir)
    splits = {s: m for s in ("validation", "test") if isinstance(m := results.get(s), dict)}
    problem = problem_of(public.get("problem_type"))
    shown = problem.card_metrics(labels)  # the card's table; those with a type: model-index
    name = repo_id.split("/")[-1] if repo_id else export_dir.parent.name
    data = _card_data(public, task, splits, shown, name, hub_base, license or _license_of(base_model),
                      model_json.get("model_type"))  # fmt: skip
    # The config to train it again from: a resume's `resume_from_checkpoint` would look for checkpoints there.
    config_yaml = yaml.safe_dump({**public, "resume_from_checkpoint": None}, sort_keys=False).strip()
    card = ModelCard.from_template(
        data,
        template_path=str(TEMPLATE),
        model_name=name,
        what=problem.describe(task_of(task).modality, labels),
        local_base=None if hub_base else _display_path(base_model),
        model_type=model_json.get("model_type"),
        model_config_yaml=yaml.safe_dump(public.get("model_config") or {}, sort_keys=False).strip(),
        data_description=data_description,
        hyperparameters=_cells(_hyperparameters(public, task, results, num_processes, mixed_precision)),
        config_yaml=config_yaml,
        **_metrics_table(shown, splits),
        usage=_usage_of(public, task, problem, model_json, repo_id or export_dir),
        **_verdicts(results, problem),
        **_label_tables(problem, labels, results, splits),
        **_provenance(results, command or launch_command(), f"{config_yaml} {data_description}"),
    )
    path = export_dir / CARD
    path.write_text(f"{card}\n")
    return path


def _metrics_table(shown: list, splits: dict) -> dict[str, Any]:
    """The card's metrics table: a row a split, a column a metric the problem shows, then loss and samples."""
    return {
        "metrics_header": ["split", *(m.name for m in shown), "loss", "samples"],
        "metrics": _cells(
            [[s, *(r.get(m.key) for m in shown), r.get("loss"), r.get("num_samples")] for s, r in splits.items()]
        ),
    }


def _usage_of(public: dict[str, Any], task: str, problem: Problem, model_json: dict, where: str | Path) -> str:
    """The card's loading example: from the Hub repo, or from the export's path as the run's parent folder
    and its own name say (run/model)."""
    if isinstance(where, Path):
        where = _display_path(str(where)).removeprefix(ELIDED)
    data_args = DataArgs(**{f.name: public.get(f.name, f.default) for f in dataclasses.fields(DataArgs)})
    return problem.usage(task_of(task).usage_example(where, problem, data_args), model_json, public)


def _verdicts(results: dict[str, Any], problem: Problem) -> dict[str, Any]:
    """The template's best checkpoint, which weights were exported and why, and whether the run learned."""
    best = results.get("best") or {}
    return {
        "best": {**best, "value": _number(best.get("value"))} if best.get("metric") is not None else None,
        "exported": (results.get("exported") or {}).get("why"),
        "learned": _learned_line(results.get("learned"), problem),
    }


def _provenance(results: dict[str, Any], command: str | None, shown: str) -> dict[str, Any]:
    """How the model was made: this app's and the libraries' versions, the launch command (secrets
    redacted), and whether a path in the card (`shown`: its config and data) was elided."""
    return {
        "finetune_version": finetune.__version__,
        "versions": ", ".join(f"{k} {v}" for k, v in (results.get("versions") or {}).items()),
        "command": SECRET_VALUE.sub(REDACTED, command) if command else None,
        "elided": ELIDED in f"{command} {shown}",
    }


def _model_json(export_dir: Path) -> dict[str, Any]:
    """The export's config.json ({} where there is none, or it does not parse)."""
    try:
        model_json = json.loads((export_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return model_json if isinstance(model_json, dict) else {}


def _card_data(public: dict[str, Any], task: str, splits: dict, shown: list, name: str, hub_base: str | None,
               license: str | None, model_type: str | None) -> ModelCardData:  # fmt: skip
    """The card's YAML front matter, which the Hub indexes: its model-index holds each split's metrics."""
    dataset = public.get("dataset_name")
    hub_dataset = dataset if dataset not in BUILDERS and is_hub_name(dataset) else None
    # model-index wants a dataset type: the Hub id, else the loader (imagefolder, csv, ...).
    source = dataset or Path(public.get("train_file") or "").suffix.lstrip(".") or "local"
    evals = _eval_results(task, source, public.get("dataset_config_name"), splits, [m for m in shown if m.card_type])
    return ModelCardData(
        model_name=name if evals else None,  # the model-index's name; no key of its own
        library_name="transformers",
        pipeline_tag=task,
        base_model=hub_base,
        license=license,
        tags=[t for t in ("finetune", task, model_type) if t],
        datasets=[hub_dataset] if hub_dataset else None,
        metrics=sorted({m.card_type for m in shown if m.card_type}),
        eval_results=evals or None,
    )


def _hyperparameters(public: dict[str, Any], task: str, results: dict[str, Any], num_processes: int | None,
                     mixed_precision: str | None) -> list[list[Any]]:  # fmt: skip
    """The card's hyperparameter rows: those a reader looks for first (not another task's own settings),
    then the topology and the optimizer steps run."""
    rows = [[k, _setting(public[k])] for k in HYPERPARAMETERS if public.get(k) is not None]
    others = {name for t in TASKS.values() if t.name != task for name in t.own_settings}
    rows = [r for r in rows if r[0] not in others - task_of(task).own_settings]
    batch, accumulation = public.get("per_device_train_batch_size"), public.get("gradient_accumulation_steps")
    if num_processes is not None and batch and accumulation:
        rows += [["processes", num_processes], ["global batch size", num_processes * batch * accumulation]]
    if mixed_precision is not None:
        rows += [["mixed_precision", mixed_precision]]
    if results.get("step") is not None:
        rows += [["optimizer steps", results["step"]]]
    return rows


def _label_tables(problem: Problem, names: list[str], results: dict[str, Any], splits: dict) -> dict[str, Any]:
    """The template's labels table (with each class's scores, on test where there is one, else validation)
    and, for a tagger, its entities table: a tagger's metrics are per entity type (PER, LOC), not per tag
    (B-PER, I-PER, O)."""
    per_class_split = "test" if "test" in splits else "validation"
    per_class = (results.get(per_class_split) or {}).get("per_class") or {}
    stats = ("precision", "recall", "f1", "support") if per_class else ()
    tokens = problem.per_word
    return {
        "per_class_split": per_class_split if per_class and not tokens else None,
        "labels": _cells(
            [[i, f"`{n}`"] for i, n in enumerate(names)]
            if tokens
            else [[i, f"`{n}`", *(per_class.get(n, {}).get(k) for k in stats)] for i, n in enumerate(names)]
        ),
        "entity_split": per_class_split if per_class and tokens else None,
        "word_by_word": tokens and not problem.entities,
        "entities": _cells([[f"`{t}`", *(v.get(k) for k in stats)] for t, v in per_class.items()]) if tokens else None,
    }


# --- the Hub -----------------------------------------------------------------------------------------


def _offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(
        f and f.strip().lower() in ("1", "true", "yes", "on") for f in flags
    )


def check_hub_access(repo_id: str, export_dir: Path | str = "<output_dir>/model") -> None:
    """Refuse, before any network access, to push when the Hub is switched off (HF_HUB_OFFLINE).

    Call it when the run starts, so that a user who asked for an upload learns it cannot happen
    before training, not after.
    """
    checks.gate(tools.HUB_ACCESS, repo_id, export_dir, _offline())


def push_to_hub(export_dir: Path, repo_id: str, token: str | None = None, private: bool = True) -> str:
    """Create the model repo `repo_id` on the Hub if needed (private by default) and upload the
    export directory to it. Returns the repo URL. Only called when the user asks for it.

    The token is `token`, else the one `hf auth login` stored or HF_TOKEN. With HF_HUB_OFFLINE set
    it refuses before any network access, with a message that says how to upload later.
    """
    export_dir = Path(export_dir)
    checks.gate(tools.HUB_EXPORT, export_dir)
    check_hub_access(repo_id, export_dir)

    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError

    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        api.upload_folder(
            repo_id=getattr(url, "repo_id", repo_id),
            folder_path=export_dir,
            repo_type="model",
            commit_message="Upload a model fine-tuned with finetune",
        )
    except (LocalTokenNotFoundError, HFValidationError, HfHubHTTPError, ConnectionError) as e:
        raise checks.explain(tools.HUB_PUSH_FAILED, repo_id, e) from None
    return str(url)


def write_onnx_card(folder: Path, inputs: list[str], outputs: list[str], written: list[str]) -> Path:
    """`<run>/onnx/README.md` (finetune/onnx_export.py): what each file is and how to run it on onnxruntime."""
    files = {"fp32": ("model.onnx", "fp32, the export's outputs within 1e-4"),
             "int8": ("model_int8.onnx", "dynamic int8 (onnxruntime's quantize_dynamic): int8 weights, smaller and "
                                         "faster on a CPU, a little less accurate (python -m "
                                         "finetune.evaluate_checkpoint <run>/model --onnx int8 measures it)")}  # fmt: skip
    rows = "\n".join(f"| `{files[p][0]}` | {files[p][1]} |" for p in written)
    feeds = ", ".join(f'"{name}": batch["{name}"]' for name in inputs)
    text = f"""---
library_name: onnx
tags:
- onnx
- finetune
---

# ONNX files of `../model`

| file | what it is |
|---|---|
{rows}
| `config.json` | the model's config: `id2label` names the outputs' classes |
| tokenizer or preprocessor files | what makes the inputs, as for `../model` |

Inputs: {", ".join(f"`{n}`" for n in inputs)} (batch and sequence axes of any size). Outputs:
{", ".join(f"`{n}`" for n in outputs)}, as the PyTorch model's.

```python
import numpy as np
import onnxruntime as ort
from transformers import AutoConfig, AutoProcessor

session = ort.InferenceSession("{files[written[-1]][0]}", providers=["CPUExecutionProvider"])
processor = AutoProcessor.from_pretrained(".")  # the tokenizer, or the image processor
batch = processor(...,  return_tensors="np")  # texts (padding=True) or images, as for the PyTorch model
({", ".join(outputs)},) = session.run(None, {{{feeds}}})
id2label = AutoConfig.from_pretrained(".").id2label
```
"""
    path = folder / CARD
    path.write_text(text)
    return path
