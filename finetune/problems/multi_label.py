"""Multi-label classification: a list of labels per sample, or 0/1 label columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import ClassLabel, DatasetDict, Sequence, Value
from datasets import Dataset as HFDataset

from finetune import checks
from finetune.checks import labels
from finetune.config import DataArgs
from finetune.metrics import (
    METRICS,
    MULTI,
    multi_label_report,
    tune_thresholds,
)
from finetune.problems.base import (
    Problem,
    on_device,
    replace_labels,
    rows_of,
    with_labels,
)


class MultiLabel(Problem):
    name = hf_problem_type = MULTI
    classes, lists, thresholded = False, True, True
    trivial_words = "frequency of each label, as its probability"
    pipeline_arguments = ", top_k=None"
    pipeline_returns = "every label with its probability"
    label_words = " (multi-label)"

    def describe(self, modality: str, names: list[str]) -> str:
        return f"A {len(names)}-label multi-label {modality} classifier"

    def usage(self, example: str, model_json: dict, public: dict[str, Any]) -> str:
        """With the model's decision rule after it: a pipeline returns every label's probability and applies
        no threshold, so the example applies the thresholds tuned on validation (config.json's
        `multi_label_thresholds`, what evaluation uses) or, without them, the run's fixed
        `multi_label_threshold`."""
        # `classify(x)  # ...` -> `[scores] = classify([x])`: with top_k=None a pipeline gives one list per
        # input, and for a single text transformers 5 nests it in another list (an image's it does not).
        *first, call = example.splitlines()
        code, _, comment = call.partition("  # ")
        function, _, argument = code.partition("(")
        lines = [*first, f"[scores] = {function}([{argument.removesuffix(')')}])  # {comment}".rstrip(" #")]
        if model_json.get("multi_label_thresholds") is not None:
            lines += [
                "# A label is predicted at or above its threshold, tuned on validation and kept in config.json",
                "config = classify.model.config",
                "labels = [s[\"label\"] for s in scores if s[\"score\"] >= config.multi_label_thresholds[config.label2id[s[\"label\"]]]]",
            ]
        else:
            fixed = public.get("multi_label_threshold", 0.5)
            if isinstance(fixed, list):  # one per label, in id order
                lines += [
                    f"thresholds = {fixed}  # the run's multi_label_threshold, one per label id",
                    "labels = [s[\"label\"] for s in scores if s[\"score\"] >= thresholds[classify.model.config.label2id[s[\"label\"]]]]",
                ]
            else:
                lines += [f"labels = [s[\"label\"] for s in scores if s[\"score\"] >= {fixed}]  # the run's multi_label_threshold"]
        return "\n".join(lines)

    def label_names(self, train: HFDataset, args: DataArgs, said: checks.Said) -> list[str]:
        """The label columns, or `label_names`, else the sorted distinct names in train's lists."""
        given = list(args.label_names) if args.label_names else None
        if args.label_columns:  # label_names may only order them (an evaluation gives the model's order)
            checks.gate(labels.LABEL_COLUMNS_NAMES, given, list(args.label_columns))
            return given or list(args.label_columns)
        lists = train[args.label_column]
        checks.gate(labels.REPEATED, lists, args.label_column, "training", said=said)
        checks.gate(labels.LIST_TEXTS, lists, args.label_column)
        if given:
            return given
        checks.gate(labels.NULLS_IN_LISTS, lists, args.label_column, "train")
        name_of = _list_names(train.features[args.label_column])
        names = sorted({name_of(v) for row in lists for v in row})
        checks.gate(labels.LIST_NAMES, names, args.label_column)
        return names

    def encode(self, ds: HFDataset, args: DataArgs, names: list[str], split: str, said: checks.Said,
               fixed: bool = False) -> HFDataset:  # fmt: skip
        """A float32 multi-hot vector in `names` order, from the 0/1 label columns or a column of lists."""
        if args.label_columns:  # the columns in label_names order
            checks.gate(labels.LABEL_COLUMNS_OF, names, list(args.label_columns))
            columns = names or list(args.label_columns)
            checks.gate(labels.ZERO_ONE, ds, columns, split)
            encoded = replace_labels(ds, columns, lambda b: [[float(v) for v in row] for row in zip(*(b[c] for c in columns), strict=True)],
                                      Sequence(Value("float32"), length=len(columns)), split)  # fmt: skip
        else:
            encoded = _encode_lists(ds, args.label_column, names, split)
        if split == "train":
            columns = names or list(args.label_columns or [])
            if len(encoded) and columns:
                positives = np.asarray(encoded["labels"], dtype=np.float32).sum(0)
                checks.gate(labels.POSITIVES, list(positives), columns, len(encoded), said=said)
            if not args.label_names and not args.label_columns:
                checks.gate(labels.JOINED_ITEMS, names, args.label_column, said=said)
        return encoded

    def check_trained(self, train: HFDataset, names: list[str], args: DataArgs, said: checks.Said) -> None:
        pass

    def check_splits(self, raw: DatasetDict, names: list[str], args: DataArgs, said: checks.Said) -> None:
        pass

    def placeholder(self, ds: HFDataset, args: DataArgs, names: list[str]) -> HFDataset:
        return with_labels(ds, Sequence(Value("float32"), length=len(names)), lambda b: [[0.0] * len(names)] * rows_of(b))

    def tune(self, predictions, references, cfg):
        """The threshold(s) that score best on validation (tune_threshold: global or per_label; off: None)."""
        if cfg.tune_threshold == "off":
            return None
        return tune_thresholds(predictions, references, cfg.tune_threshold == "per_label")

    def store_threshold(self, config, threshold) -> None:
        config.multi_label_thresholds = threshold

    def loss(self, logits, labels, class_weights=None, label_smoothing=0.0):
        """BCE with logits averaged over the K labels."""
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), pos_weight=on_device(class_weights, logits),
                                                  reduction="none").mean(-1)  # fmt: skip

    def predictions(self, logits):
        """Label probabilities (B, K)."""
        return logits.float().sigmoid()

    def scores(self, logits):
        return self.predictions(logits)

    def class_weights(self, train_labels, num_labels, how):
        """(n - n_k) / n_k for each label's positives, BCE's pos_weight, at most 100 (a label absent from
        training: 1)."""
        if how is None:
            return None
        rows = list(train_labels)
        positives = torch.as_tensor(rows, dtype=torch.float32).sum(0)
        weights = (len(rows) - positives) / positives.clamp(min=1)
        return torch.where(positives > 0, weights.clamp(max=100.0), torch.ones_like(weights))

    def trivial(self, train_labels, train=None):
        """Each label's frequency as its probability."""
        return torch.as_tensor(list(train_labels), dtype=torch.float32).mean(0)

    def baseline(self, constant, references, names, threshold=0.5, dataset=None):
        """A model that learned nothing gives every sample the same probabilities, and a tuned threshold
        turns them into the same label set: none, the most frequent label, the two most frequent, ... all.
        Each metric's baseline is the best such a set scores (predicting every label scores a micro F1 of
        about twice the labels' share, where the prior at 0.5 predicts nothing and scores 0)."""
        order = torch.as_tensor(constant).argsort(descending=True).tolist()
        sizes = sorted({*range(min(len(order), 10) + 1), *(round(len(order) ** (i / 8)) for i in range(9))})
        best: dict[str, float] = {}
        for size in sizes:  # every size up to 10 labels, then 9 steps to all of them
            chosen = torch.zeros(len(order))
            chosen[order[:size]] = 1.0
            reported = self.report(chosen.expand(len(references), -1), references, names, 0.5)
            for key, value in reported.items():
                if key in METRICS and isinstance(value, (int, float)):
                    keep = max if METRICS[key].greater_is_better else min
                    best[key] = keep(best[key], value) if key in best else value
        return best

    def report(self, predictions, references, names, threshold=0.5):
        return multi_label_report(predictions, references, names, threshold)

    def record(self, scored, label, names, per_label):
        """Its labels, the names at or above their threshold, every label's probability."""
        return {"labels": [n for n, y in zip(names, label, strict=True) if y >= 0.5],
                "predictions": [n for n, q, t in zip(names, scored, per_label, strict=True) if q >= t],
                "probabilities": dict(zip(names, scored, strict=True))}  # fmt: skip


def _list_names(feature: Any):
    """How one item of a list label becomes its name: a ClassLabel's name, else str()."""
    inner = getattr(feature, "feature", None)
    if isinstance(inner, ClassLabel):
        return lambda v: inner.names[v]
    return str


def _encode_lists(ds: HFDataset, column: str, label_names: list[str], split: str) -> HFDataset:
    checks.gate(labels.LISTS_IN_SPLIT, ds, column, split)
    lists = ds[column]
    checks.gate(labels.NULLS_IN_LISTS, lists, column, split)
    name_of, to_id = _list_names(ds.features[column]), {name: i for i, name in enumerate(label_names)}
    checks.gate(labels.LIST_VALUES, lists, column, split, label_names, name_of)

    def multi_hot(b):
        rows = [[0.0] * len(label_names) for _ in b[column]]
        for row, names in zip(rows, b[column], strict=True):
            for v in names:
                row[to_id[name_of(v)]] = 1.0
        return rows

    return replace_labels(ds, [column], multi_hot, Sequence(Value("float32"), length=len(label_names)), split)
