"""Single-label classification, the default behaviour of every problem (finetune/problems/__init__.py), and
what the problems share."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from datasets import ClassLabel, DatasetDict, Value
from datasets import Dataset as HFDataset

from finetune import checks
from finetune.checks import labels, splits
from finetune.config import DataArgs
from finetune.metrics import (
    METRICS,
    PROBLEMS,
    SINGLE,
    Metric,
    classification_report,
)


class Labels(list):
    """What a model's outputs are, by name in id order: the classes, the tags, the candidates' numbers, a
    regression target's name, or an answer span's start and end. A problem makes them from train
    (`Problem.labels_in`); the rest of the app passes them along and asks them for a model's head (`head`) and
    for what a checkpoint's or an export's manifest keeps (`manifest`, `of_manifest`); a saved model's are
    its config's id2label (`of_model`). The `label_names` setting gives them by hand (`given`). A list, so
    that a problem's metrics read them as names."""

    KEY = "label_names"  # the setting's name, and the manifest's key (checkpoints of every version)

    @classmethod
    def given(cls, args) -> Labels:
        """The names the `label_names` setting gives, in its order (none: empty)."""
        return cls(getattr(args, cls.KEY) or [])

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> Labels:
        return cls(str(n) for n in manifest[cls.KEY])

    @classmethod
    def of_model(cls, config) -> Labels:
        """A saved model's: its config's id2label, in id order."""
        return cls(str(config.id2label[i]) for i in range(config.num_labels))

    def manifest(self) -> dict[str, list[str]]:
        return {self.KEY: list(self)}

    def head(self) -> dict[str, Any]:
        """A model config's fields for a head of one output per name."""
        return {"num_labels": len(self), "id2label": dict(enumerate(self)), "label2id": {n: i for i, n in enumerate(self)}}


class Problem:
    """The interface every problem fills in; single-label classification is the default behaviour."""

    name = SINGLE
    hf_problem_type: str | None = SINGLE  # the model config's problem_type: what the pipeline applies to the outputs
    classes = True  # one class per sample: a held-out split keeps each class's share, a confusion matrix
    lists = False  # a sample's labels are a list (multi-label)
    ids_as_names = True  # class ids beside `label_names` that are names are read through them
    thresholded = False  # a threshold turns probabilities into labels, tunable on validation
    numbers = False  # the labels are numbers on a scale (regression)
    per_word = False  # a tag per word: scored per sentence, its windows put back together
    windowed = False  # a sample is read in windows (tags, spans): scored per sample from its windows (`assemble`)
    pad_value: float = -100  # what pads a window's predictions to one length across processes
    also_judged_by: str | None = None  # a metric that must beat its baseline too for "learned"
    trivial_words = "most frequent answer"  # what the trivial baseline predicts, in the run's verdict
    counted = "samples"  # what validation counts, in the run's verdict ("validation has 8 samples")
    baseline_model = "a model that predicts the same for every input"  # the trivial baseline, in the verdict and card
    pipeline_arguments = ""  # the card's pipeline call
    pipeline_returns = "the most likely label and its probability"
    label_words = ""  # the card's "labels from `label`" goes on with them

    @property
    def metrics(self):
        """Which metrics it reports, shows and ends a run with (finetune/metrics.py's PROBLEMS)."""
        return PROBLEMS[self.name]

    def describe(self, modality: str, names: list[str]) -> str:
        """The card's first words: "A 2-class text classifier"."""
        return f"A {len(names)}-class {modality} classifier"

    def start_words(self) -> str:
        """What the start line says of the problem after the task (nothing for single-label)."""
        return "" if self.classes else f" ({self.name})"

    def card_metrics(self, names: list[str]) -> list[Metric]:
        """The metrics the card's table shows."""
        return [METRICS[key] for key in self.metrics.shown]

    def usage(self, example: str, model_json: dict, public: dict[str, Any]) -> str:
        """The task's `pipeline()` example (`Task.usage_example`) as the card shows it for this problem."""
        return example

    # --- labels ----------------------------------------------------------------------------------------
    def labels_in(self, train: HFDataset, args: DataArgs, said: checks.Said) -> Labels:
        """What this problem's labels are in train, in id order (`label_names` below)."""
        return Labels(self.label_names(train, args, said))

    def label_names(self, train: HFDataset, args: DataArgs, said: checks.Said) -> list[str]:
        """Label names in id order: `label_names` as given, a ClassLabel's names, else the sorted distinct
        values of train; what the classes are is checked (checks/labels.py, CLASSES)."""
        column = args.label_column
        checks.gate(labels.JOINED_TAGS, train.select_columns([column])[:200][column], column, "train")
        return resolve_label_names(train, column, args.label_names, said)

    def encode(self, ds: HFDataset, args: DataArgs, names: list[str], split: str, said: checks.Said,
               fixed: bool = False) -> HFDataset:  # fmt: skip
        """One split's labels into `labels`, by name, in `names` order; a label the names do not know is
        refused. `fixed`: the names are a trained model's (evaluation), which no setting changes."""
        return encode_labels(ds, args.label_column, names, split)

    def check_encoded(self, raw: DatasetDict, said: checks.Said) -> None:
        """The encoded splits, before a validation split is held out."""

    def check_trained(self, train: HFDataset, names: list[str], args: DataArgs, said: checks.Said) -> None:
        """Train's labels once a held-out split was drawn from it (before it is taken out)."""
        trained = labels.Trained(names, Counter(train["labels"][:]), args, len(train))
        checks.gate(labels.TRAINED_AS, trained, said=said)

    def check_splits(self, raw: DatasetDict, names: list[str], args: DataArgs, said: checks.Said) -> None:
        """The splits as a run trains and evaluates on them (after max_*_samples)."""
        if args.max_train_samples is not None:
            kept = set(raw["train"]["labels"][:])
            checks.gate(splits.KEPT, args.max_train_samples, len(kept), names[raw["train"][0]["labels"]])
        if "validation" in raw:
            checks.gate(splits.VALIDATION_CLASSES, set(raw["validation"]["labels"][:]), names, len(raw["validation"]),
                        said=said)  # fmt: skip

    def check_read(self, ds: HFDataset, what: str, said: checks.Said) -> None:
        """One encoded split, as read (training's splits, evaluation's --data)."""

    def placeholder(self, ds: HFDataset, args: DataArgs, names: list[str]) -> HFDataset:
        """Data without labels (predictions only) given a `labels` column of the problem's type, all zero,
        so that it goes through the same preparation and evaluation loop; no metric is read from it."""
        return with_labels(ds, ClassLabel(names=names), lambda b: [0] * rows_of(b))

    # --- outputs, loss, predictions -----------------------------------------------------------------------
    def outputs(self, output, inputs: dict[str, Any]) -> torch.Tensor:
        """What the loss and the predictions read of a model's output (`inputs`: the batch it read)."""
        return output.logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:  # fmt: skip
        """(B,) losses in fp32 (cross-entropy here). `class_weights` (`class_weights`) weigh each class's
        cross-entropy, or each label's positives in BCE (its pos_weight); `label_smoothing` is the
        cross-entropy's. Evaluation reports the plain loss."""
        return F.cross_entropy(logits.float(), labels, weight=on_device(class_weights, logits), reduction="none",
                               label_smoothing=label_smoothing)  # fmt: skip

    def loss_weights(self, labels: torch.Tensor) -> torch.Tensor:
        """(B,) how many terms each sample's loss sums (1 here): the loop divides by the step's sum."""
        return torch.ones(len(labels), dtype=torch.long, device=labels.device)

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """What the metrics read: class ids (B,) here."""
        return logits.argmax(-1)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """What predictions.jsonl shows: softmax probabilities here."""
        return logits.float().softmax(-1)

    def class_weights(self, train_labels, num_labels: int, how: str | None) -> torch.Tensor | None:
        """`class_weights=balanced`: n / (K * n_k) per class, as scikit-learn's class_weight="balanced" (a
        class absent from training: 1). None otherwise."""
        return None if how is None else balanced(list(train_labels), num_labels)

    def trivial(self, train_labels, train: HFDataset | None = None):
        """What a model that learned nothing from the inputs predicts, from the training labels alone (the
        majority class here, the first of the most frequent): the baseline every evaluation reports
        beside the model's metrics (finetune/metrics.py, `learned`). `train`: the prepared training split,
        for a baseline that reads more of it than its labels (plain tags: each word's most frequent tag)."""
        return int(torch.bincount(torch.as_tensor(list(train_labels), dtype=torch.float32).long()).argmax())

    def baseline(self, constant, references, names: list[str], threshold: float = 0.5,
                 dataset: HFDataset | None = None) -> dict:  # fmt: skip
        """The metrics of predicting `constant` (`trivial`) for every sample of `references`: the numbers a
        model must beat. `dataset`: the evaluated split as prepared (a windowed problem's; plain tags read
        its words)."""
        return metrics_only(self.report(torch.full((len(references),), constant), references, names, threshold))

    def report(self, predictions, references, names: list[str], threshold: float | list[float] = 0.5) -> dict[str, Any]:
        """The metrics (without the loss, which the caller adds)."""
        as_list = [v.tolist() if hasattr(v, "tolist") else v for v in (predictions, references)]
        return classification_report(*as_list, names)

    def default_threshold(self, cfg):
        """The threshold `report` takes when none was tuned (multi-label's multi_label_threshold)."""
        return cfg.multi_label_threshold

    def may_tune(self, validation) -> bool:
        """Whether the validation split (as prepared) can tune a threshold: worth an evaluation that keeps
        its predictions."""
        return self.thresholded

    def tune(self, predictions, references, cfg):
        """A thresholded problem's threshold tuned on validation's kept predictions, or None (none tuned)."""
        return None

    def store_threshold(self, config, threshold) -> None:
        """Keep a tuned threshold in the export's config.json (evaluation reads it back: `stored_threshold`)."""

    def stored_threshold(self, config):
        """The threshold a problem of its own keeps in a model's config (None: the shared path reads it)."""
        return None

    def assemble(self, windows: list[tuple[dict, Any, Any]], dataset: HFDataset, data: DataArgs | None) -> tuple[list, list]:
        """A windowed problem's predictions and references per sample, in the data's order, from every
        window's meta, predictions and labels (gathered from all processes)."""
        raise NotImplementedError

    def record(self, scored, label, names: list[str], per_label: list[float]) -> dict[str, Any]:
        """What predictions.jsonl says of one sample beside its input: here its label, the predicted class
        and every class's probability."""
        prediction = max(range(len(scored)), key=scored.__getitem__)
        return {"label": names[label], "prediction": names[prediction], "probabilities": dict(zip(names, scored, strict=True))}

    # --- reading class ids through label_names ------------------------------------------------------------
    def read_ids_as_names(self, raw: DatasetDict, args: DataArgs, said: checks.Said | None = None,
                          rules: list[checks.Rule] = labels.IDS_AS_NAMES, what: str = "") -> DatasetDict:  # fmt: skip
        """Class ids (0, 1, ...) in the label column beside `label_names` that are names (the Hub's habit: the
        ids in the data, the names in its card): each id is read as the name at its place in label_names, in
        every split, with one warning (`rules`: training's, or evaluation's for a model's classes). Classes
        and lists of labels; a ClassLabel column names its ids itself; a missing label stays missing."""
        names, column = list(args.label_names or []), args.label_column
        if not self.ids_as_names or not names or args.label_columns:
            return raw
        if any(isinstance(d.features.get(column), ClassLabel) or column not in d.column_names for d in raw.values()):
            return raw
        lists = self.lists

        def values(ds: HFDataset) -> list:
            rows = [v for v in ds[column][:] if v is not None]
            return [v for row in rows for v in row] if lists else rows

        ids = {as_id(v) for d in raw.values() for v in values(d)}
        if not ids or None in ids or not all(0 <= i < len(names) for i in ids) or {str(i) for i in ids} & set(names):
            return raw

        def named(batch):
            if lists:
                return {column: [None if row is None else [names[as_id(v)] for v in row] for row in batch[column]]}
            return {column: [None if v is None else names[as_id(v)] for v in batch[column]]}

        pairs = ", ".join(f"{i} -> {names[i]}" for i in sorted(ids)[:4]) + (", ..." if len(ids) > 4 else "")
        checks.gate(rules, column, pairs, names, what, said=said if said is not None else checks.Said())
        raw = DatasetDict({s: d.cast_column(column, Value("string")) if self.classes and d.features[column] !=
                           Value("string") else d for s, d in raw.items()})  # fmt: skip
        return DatasetDict({s: d.map(named, batched=True, desc=f"labels ({s})") for s, d in raw.items()})


# --- helpers ----------------------------------------------------------------------------------------------


def on_device(weights: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor | None:
    return weights.to(logits.device) if weights is not None else None


def balanced(ids: list[int], num_labels: int) -> torch.Tensor:
    counts = torch.bincount(torch.as_tensor(ids, dtype=torch.long), minlength=num_labels).float()
    weights = len(ids) / (num_labels * counts.clamp(min=1))
    return torch.where(counts > 0, weights, torch.ones_like(weights))


def metrics_only(reported: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reported.items() if k in METRICS}


def rows_of(batch: dict) -> int:
    return len(next(iter(batch.values())))


def with_labels(ds: HFDataset, feature, value) -> HFDataset:
    ds = ds.map(lambda b: {"labels": value(b)}, batched=True, desc="placeholder labels")
    return ds.cast_column("labels", feature)


def as_id(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int) or (isinstance(v, str) and re.fullmatch(r"\d+", v.strip())):
        return int(v)
    return None


# --- reading and encoding labels -------------------------------------------------------------------------


def _label_values(ds: HFDataset, column: str) -> list[Any]:
    feature = ds.features[column]
    if isinstance(feature, ClassLabel):
        return [feature.names[i] for i in sorted(set(ds[column][:]))]
    return sorted(set(ds[column][:]), key=lambda v: (str(type(v)), v))


def resolve_label_names(train: HFDataset, column: str, label_names: list[str] | None,
                        said: checks.Said | None = None) -> list[str]:  # fmt: skip
    """Label names in id order: `label_names` as given, a ClassLabel's names, else the sorted distinct values
    of train; what the classes are is checked (checks/labels.py, CLASSES)."""
    feature = train.features[column]
    if label_names:
        names = list(label_names)
    elif isinstance(feature, ClassLabel):
        names = list(feature.names)
    else:
        names = [str(v) for v in _label_values(train, column)]
    present = {str(v) for v in _label_values(train, column)}
    checks.gate(labels.CLASSES, labels.Classes(train, column, present, label_names, names),
                said=said if said is not None else checks.Said())  # fmt: skip
    return names


def encode_labels(ds: HFDataset, column: str, label_names: list[str], split: str) -> HFDataset:
    """Map the label column to ids by NAME into `labels` (a ClassLabel), whatever its type was."""
    feature = ds.features[column]
    to_id = {name: i for i, name in enumerate(label_names)}
    name_of = (lambda v: feature.names[v]) if isinstance(feature, ClassLabel) else str
    seen = {name_of(v) for v in set(ds[column][:])}
    unseen = sorted(seen - set(to_id))
    if unseen:
        raise checks.explain(labels.UNSEEN, labels.Unseen(split, unseen, label_names, seen))
    ds = ds.map(lambda b: {"labels": [to_id[name_of(v)] for v in b[column]]}, batched=True, desc=f"labels ({split})")
    if column != "labels":
        ds = ds.remove_columns(column)
    return ds.cast_column("labels", ClassLabel(names=label_names))


def replace_labels(ds: HFDataset, columns: list[str], fn, feature, split: str) -> HFDataset:
    ds = ds.map(lambda b: {"labels": fn(b)}, batched=True, remove_columns=columns, desc=f"labels ({split})")
    return ds.cast_column("labels", feature)
