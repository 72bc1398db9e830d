"""The three problems a classifier head is asked to solve, and tags: their labels, loss and predictions.

    problem_type                  labels of a sample           outputs  loss per sample          metrics
    single_label_classification   one class name or id         K        cross-entropy            accuracy, macro F1
    multi_label_classification    a list of names, or 0/1      K        BCE with logits, mean    micro/macro F1, subset accuracy,
                                  columns (`label_columns`)             over the K labels        per-label F1 at a threshold
    regression                    one number                   1        squared error            mse, mae, r2, pearson, spearman
    token_classification          a tag per word               K/token  cross-entropy, summed    entity (or word) F1, word accuracy

`problem_type: null` reads it from train's label column: class names (strings, a ClassLabel) or
integer ids -> single-label; numbers with decimals -> regression; lists -> multi-label; and
`label_columns` -> multi-label. Whole numbers stored as floats (`1.0`, `2.0`) are ambiguous -- class ids or
numbers to predict? -- and refused with a line that names both fixes. A float column is never a class
column; an int column is a regression target only when problem_type says so. What a label column may
hold is checked by finetune/checks/labels.py as the labels are read and encoded here.

Labels in the `labels` column: a ClassLabel id (single-label), a float32 (regression), a float32
multi-hot vector of K (multi-label), a list of ClassLabel tag ids (tags). A regression model has one
output named after the label column (its `id2label`), so `pipeline(..., function_to_apply="none")`
returns the number under that name.

The per-sample loss is what finetune/run.py masks to real samples and scales by the window's sample
count (docs/topologies.md: the math of exact accumulation), so accumulation and DDP equal one big batch for every
problem type: transformers' BCEWithLogitsLoss and MSELoss are the mean of these per-sample values.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import ClassLabel, Sequence, Value
from datasets import Dataset as HFDataset

from finetune import checks
from finetune.checks import labels
from finetune.config import DataArgs
from finetune.formats import is_list, kind_of, plain_tags
from finetune.metrics import MULTI, REGRESSION, SINGLE, TOKENS
from finetune.tasks import task_of

# --- which problem ---------------------------------------------------------------------------------


def infer_problem_type(train: HFDataset, args: DataArgs, said: checks.Said | None = None) -> str:
    """`args.problem_type` checked against train's labels (checks/labels.py, PROBLEM), or read from them
    when it is null."""
    if task_of(args.task).problems == (TOKENS,):  # a tag per word: the task's one problem
        return TOKENS
    if args.label_columns:
        return MULTI  # a rule refuses another problem_type beside label_columns
    column = labels.Column(train, args.label_column, args.problem_type)
    checks.gate(labels.PROBLEM, column, said=said if said is not None else checks.Said())
    if column.given is not None:
        return column.given
    return {"list": MULTI, "class": SINGLE, "int": SINGLE, "float": REGRESSION}[column.kind]


def problem_type_of(ds: HFDataset) -> str:
    """The problem type of a split whose `labels` are encoded (by `encode` or data.encode_labels)."""
    feature = ds.features["labels"]
    if is_list(feature) and isinstance(getattr(feature, "feature", None), ClassLabel):
        return TOKENS  # a tag id per word
    return SINGLE if isinstance(feature, ClassLabel) else MULTI if is_list(feature) else REGRESSION


# --- labels --------------------------------------------------------------------------------------------


def label_names_for(train: HFDataset, args: DataArgs, problem: str, said: checks.Said | None = None) -> list[str]:
    """Regression: the one output's name (label_names, else the label column's name). Multi-label: the
    label columns, or `label_names`, else the sorted distinct names in train's lists. Tags: the tag set."""
    said = said if said is not None else checks.Said()
    given = list(args.label_names) if args.label_names else None
    if problem == TOKENS:
        checks.gate(labels.TAG_LISTS, train, args, "train")  # a string of tags would be read as its characters
        names = tag_names(train, args.tags_column, given)
        checks.gate(labels.TAG_SET, names, bool(given))
        return names
    if problem == REGRESSION:
        checks.gate(labels.REGRESSION_NAMES, given)
        return given or [args.label_column]
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


def _list_names(feature: Any):
    """How one item of a list label becomes its name: a ClassLabel's name, else str()."""
    inner = getattr(feature, "feature", None)
    if isinstance(inner, ClassLabel):
        return lambda v: inner.names[v]
    return str


def encode(ds: HFDataset, args: DataArgs, problem: str, label_names: list[str], split: str, said: checks.Said,
           fixed: bool = False) -> HFDataset:  # fmt: skip
    """The labels of a regression, multi-label or tagging split into `labels`: a float32, a float32 multi-hot
    vector in `label_names` order, or a tag id a word. Single-label splits go through data.encode_labels.
    `fixed`: the labels are a trained model's (evaluation), which no setting changes."""
    if problem == REGRESSION:
        return _encode_regression(ds, args.label_column, split, said)
    if problem == TOKENS:
        return encode_tags(ds, args, label_names, split, fixed)
    if args.label_columns:  # the columns in label_names order
        checks.gate(labels.LABEL_COLUMNS_OF, label_names, list(args.label_columns))
        names = label_names or list(args.label_columns)
        checks.gate(labels.ZERO_ONE, ds, names, split)
        encoded = _replace_labels(ds, names, lambda b: [[float(v) for v in row] for row in zip(*(b[c] for c in names), strict=True)],
                                  Sequence(Value("float32"), length=len(names)), split)  # fmt: skip
    else:
        encoded = _encode_lists(ds, args.label_column, label_names, split)
    if split == "train":
        names = label_names or list(args.label_columns or [])
        if len(encoded) and names:
            positives = np.asarray(encoded["labels"], dtype=np.float32).sum(0)
            checks.gate(labels.POSITIVES, list(positives), names, len(encoded), said=said)
        if not args.label_names and not args.label_columns:
            checks.gate(labels.JOINED_ITEMS, label_names, args.label_column, said=said)
    return encoded


def _replace_labels(ds: HFDataset, columns: list[str], fn, feature, split: str) -> HFDataset:
    ds = ds.map(lambda b: {"labels": fn(b)}, batched=True, remove_columns=columns, desc=f"labels ({split})")
    return ds.cast_column("labels", feature)


def _encode_regression(ds: HFDataset, column: str, split: str, said: checks.Said) -> HFDataset:
    feature = ds.features[column]
    values = np.asarray(ds[column][:], dtype=np.float64) if kind_of(feature) in ("int", "float") else None
    checks.gate(labels.TARGETS, labels.Targets(values, column, split, feature), said=said)
    return _replace_labels(ds, [column], lambda b: [float(v) for v in b[column]], Value("float32"), split)


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

    return _replace_labels(ds, [column], multi_hot, Sequence(Value("float32"), length=len(label_names)), split)


# --- tags (token classification) ----------------------------------------------------------------------


def tag_names(train: HFDataset, column: str, given: list[str] | None) -> list[str]:
    """The tag set in id order: `label_names`; a ClassLabel's names; else train's tags, "O" first then
    sorted by entity type, B- before I- (a plain set, `formats.plain_tags`: by name). Integer tags need
    `label_names`."""
    inner = getattr(train.features[column], "feature", None)
    checks.gate(labels.TAG_COUNT, {t for row in train[column] for t in row}, column, inner)
    if given:
        return given
    if isinstance(inner, ClassLabel):
        return list(inner.names)
    if kind_of(inner) == "int":
        raise checks.explain(labels.TAG_IDS, column)
    counts = collections.Counter(str(t) for row in train[column] for t in row)
    checks.gate(labels.TAG_NAMES, counts)
    if plain_tags(counts):  # parts of speech: O (if any) first, then by name
        return sorted(counts, key=lambda t: (t != "O", t))
    return sorted(counts, key=lambda t: (t != "O", t[2:], t[:2]))


def encode_tags(ds: HFDataset, args: DataArgs, tag_set: list[str], split: str, fixed: bool = False) -> HFDataset:
    """Each row's tags into `labels`: a list of tag ids, one per word, by name (integer tags through
    `label_names`); a tag outside the tag set is refused with its row and word (`fixed`: in a model's words)."""
    checks.gate(labels.TAG_LISTS, ds, args, split)
    inner = getattr(ds.features[args.tags_column], "feature", None)
    if isinstance(inner, ClassLabel):
        def name_of(v):  # noqa: E306
            return inner.names[v]
    elif kind_of(inner) == "int":
        def name_of(v):  # noqa: E306
            return tag_set[v] if 0 <= v < len(tag_set) else None
    else:
        name_of = str
    to_id = {name: i for i, name in enumerate(tag_set)}
    for row, tags in enumerate(ds[args.tags_column][:]):
        for word, tag in enumerate(tags):
            if name_of(tag) not in to_id:
                raise checks.explain(labels.TAG_UNKNOWN, split, tag, row + 1, word + 1, tag_set, bool(args.label_names), fixed)
    return _replace_labels(ds, [args.tags_column], lambda b: [[to_id[name_of(t)] for t in tags] for tags in b[args.tags_column]],
                           Sequence(ClassLabel(names=tag_set)), split)  # fmt: skip


# --- loss and predictions ------------------------------------------------------------------------------


def per_sample_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    problem_type: str | None,
    class_weights: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """(B,) losses in fp32: cross-entropy; squared error; BCE with logits averaged over the K labels;
    for tags, the cross-entropy SUMMED over a sample's labelled tokens (-100: not labelled), which
    `loss_weights` counts: the loop divides by the labelled tokens of the whole optimizer step.
    `class_weights` (`class_weights_of`) weigh each class's cross-entropy, or each label's positives
    in BCE (its pos_weight); `label_smoothing` is the cross-entropy's. Evaluation reports the plain loss."""
    logits = logits.float()
    weight = class_weights.to(logits.device) if class_weights is not None else None
    if problem_type == TOKENS:  # (B, T, K), (B, T)
        return F.cross_entropy(logits.transpose(1, 2), labels, weight=weight, reduction="none", ignore_index=-100,
                               label_smoothing=label_smoothing).sum(-1)  # fmt: skip
    if problem_type == REGRESSION:
        return (logits.squeeze(-1) - labels.float()) ** 2
    if problem_type == MULTI:
        return F.binary_cross_entropy_with_logits(logits, labels.float(), pos_weight=weight, reduction="none").mean(-1)
    return F.cross_entropy(logits, labels, weight=weight, reduction="none", label_smoothing=label_smoothing)


def class_weights_of(train_labels, problem: str, num_labels: int, how: str | None) -> torch.Tensor | None:
    """`class_weights=balanced`: single-label (and tags) n / (K * n_k) per class, as scikit-learn's
    class_weight="balanced" (a class absent from training: 1); multi-label (n - n_k) / n_k for each
    label's positives, BCE's pos_weight, at most 100 (a label absent from training: 1). None otherwise."""
    if how is None or problem == REGRESSION:
        return None
    rows = list(train_labels)
    if problem == MULTI:
        positives = torch.as_tensor(rows, dtype=torch.float32).sum(0)
        weights = (len(rows) - positives) / positives.clamp(min=1)
        return torch.where(positives > 0, weights.clamp(max=100.0), torch.ones_like(weights))
    ids = [t for row in rows for t in row if t != -100] if problem == TOKENS else rows
    counts = torch.bincount(torch.as_tensor(ids, dtype=torch.long), minlength=num_labels).float()
    weights = len(ids) / (num_labels * counts.clamp(min=1))
    return torch.where(counts > 0, weights, torch.ones_like(weights))


def loss_weights(labels: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """(B,) how many terms each sample's loss sums: its labelled tokens for tags, else 1."""
    if problem_type == TOKENS:
        return (labels != -100).sum(-1)
    return torch.ones(len(labels), dtype=torch.long, device=labels.device)


def predictions(logits: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """What the metrics read: class ids (B,); predicted numbers (B,); label probabilities (B, K);
    tag ids (B, T) for tags."""
    if problem_type == REGRESSION:
        return logits.float().squeeze(-1)
    if problem_type == MULTI:
        return logits.float().sigmoid()
    return logits.argmax(-1)


def scores(logits: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """What predictions.jsonl shows: softmax probabilities, sigmoid ones, or the predicted number."""
    return logits.float().softmax(-1) if problem_type in (None, SINGLE, TOKENS) else predictions(logits, problem_type)


def placeholder_labels(ds: HFDataset, args: DataArgs, problem: str, label_names: list[str]) -> HFDataset:
    """Data without labels (predictions only) given a `labels` column of the problem's type, all zero,
    so that it goes through the same preparation and evaluation loop; no metric is read from it."""
    if problem == TOKENS:
        feature, value = Sequence(ClassLabel(names=label_names)), lambda b: [[0] * len(w) for w in b[args.tokens_column]]
    elif problem == MULTI:
        feature = Sequence(Value("float32"), length=len(label_names))
        value = lambda b: [[0.0] * len(label_names)] * len(next(iter(b.values())))  # noqa: E731
    elif problem == REGRESSION:
        feature, value = Value("float32"), lambda b: [0.0] * len(next(iter(b.values())))
    else:
        feature, value = ClassLabel(names=label_names), lambda b: [0] * len(next(iter(b.values())))
    ds = ds.map(lambda b: {"labels": value(b)}, batched=True, desc="placeholder labels")
    return ds.cast_column("labels", feature)


def trivial_prediction(train_labels, problem: str):
    """What a model that learned nothing from the inputs predicts, from the training labels alone: the
    majority class (single-label), the most frequent tag (tags), the mean target (regression), each
    label's frequency as its probability (multi-label). The baseline every evaluation reports beside
    the model's metrics (finetune/metrics.py, `learned`)."""
    if problem == TOKENS:
        tags = [t for row in list(train_labels) for t in row if t != -100]
        return max(set(tags), key=lambda t: (tags.count(t), -t)) if tags else 0
    values = torch.as_tensor(list(train_labels), dtype=torch.float32)
    if problem == REGRESSION:
        return float(values.mean())
    if problem == MULTI:
        return values.mean(0)
    counts = torch.bincount(values.long())
    return int(counts.argmax())  # the first of the most frequent
