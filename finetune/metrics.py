"""The metric table, and how every reported number is computed (scikit-learn and scipy, offline).

    from finetune.metrics import METRICS, PROBLEMS, summary_line

    metrics = problem_of(problem_type).report(predictions, references, names, threshold)  # finetune/problems/
    print(summary_line(metrics))     # "accuracy 0.7955, macro F1 0.7950, loss 0.4433 on 1066 samples"

`METRICS` is the one table of metric names: each metric's key (in results.json, manifests and
metrics.jsonl as `eval_<key>`), the name people read, whether higher is better, whether the training
curves draw it, its type in the model card's model-index, and how `learned` tells a model from the
trivial baseline by it. `PROBLEMS` says, per problem type, which
metrics it reports (the first is the default `metric_for_best_model`), which it shows (the console, the
card's table) and which end a run's last line. The config (`metric_for_best_model`,
`greater_is_better`), the card and the plots read these two tables and nothing else.

How each number is computed (y_true = references, y_pred = predictions):

- classes (`classification_report`): from one confusion matrix over labels range(K), indexed
  [true][predicted], as scikit-learn defines them (`tests/test_metrics.py` holds it to
  `accuracy_score`, `precision_recall_fscore_support(labels=range(K), zero_division=0)` and
  `confusion_matrix(labels=range(K))` on random data): a class absent from the data counts, as 0.0,
  in the macro means. A class id outside the labels is
  an error (a label-mapping mismatch), not dropped as scikit-learn would. No samples: every number 0.
- label sets (`multi_label_report`): a label is predicted at probability >= the threshold; micro and
  macro precision/recall/F1 and per-label values over the (N, K) 0/1 matrices, subset accuracy.
- numbers (`regression_report`): mse, mae, r2 (scikit-learn), Pearson's and Spearman's r (scipy); an
  undefined correlation or r2 (constant predictions, fewer than 2 samples) is None, never made up.
- entity tags (`token_report`): seqeval's entity-level precision, recall and F1 in strict IOB2 mode (an
  entity is a B-X followed by its I-X; an I-X after O or another type starts none), micro over all
  entities and per entity type; word accuracy is the share of words whose tag is right. Each word
  of the data counts once (`num_words`), each sentence once (`num_sentences`, `num_samples`).
- word tags (`word_report`: a plain tag set, no B-/I- prefixes, parts of speech; `formats.plain_tags`):
  word accuracy, and each tag's precision, recall, F1 and support over the words
  (`precision_recall_fscore_support`, zero_division=0), their macro means over the tags that occur
  in the references or the predictions (scikit-learn's own default labels). No entities: seqeval
  would make each word an entity of its own tag, and with no O tag its micro precision, recall and F1
  are three equal numbers, word accuracy again.

`evaluate.load("accuracy")` and friends call these same scikit-learn functions, but fetch their
scripts from the Hub at run time, which fails offline.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"
TOKENS = "token_classification"  # a tag per word (finetune/tasks/tags.py); not a transformers problem_type
WORD_TAGS = "word_tagging"  # the token task's plain tags (parts of speech): scored word by word, no entities
SPANS = "question_answering"  # an answer's span in a context (extractive QA); not a transformers problem_type
CHOICES = "multiple_choice"  # the right one of a sample's candidates (SWAG); not a transformers problem_type


# How `learned` judges a metric against the trivial baseline's (its docstring states each rule).
RATE, CORRELATION, R2 = "rate", "correlation", "r2"
BASELINE_RULES = (RATE, CORRELATION, R2)


@dataclass(frozen=True)
class Metric:
    key: str  # results.json, manifests; `eval_<key>` in metrics.jsonl
    name: str  # what people read: console, card, plots
    greater_is_better: bool = True  # also metric_for_best_model's default direction
    plotted: bool = False  # drawn in training_curves.png's validation panel
    card_type: str | None = None  # its type in the card's model-index (the Hub's metric names)
    card_args: dict | None = None
    # For a greater-is-better metric: a share in [0, 1] (RATE), Pearson's or Spearman's r (CORRELATION)
    # or r2 (R2). A lower-is-better one is an error, judged by the ratio to the baseline's.
    baseline_rule: str = RATE

    def __post_init__(self):
        if self.baseline_rule not in BASELINE_RULES:
            raise ValueError(f"metric {self.key}: baseline_rule must be one of {BASELINE_RULES}")


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("accuracy", "accuracy", plotted=True, card_type="accuracy"),
        Metric("macro_f1", "macro F1", plotted=True, card_type="f1", card_args={"average": "macro"}),
        Metric("macro_precision", "macro precision"),
        Metric("macro_recall", "macro recall"),
        Metric("micro_f1", "micro F1", plotted=True, card_type="f1", card_args={"average": "micro"}),
        Metric("micro_precision", "micro precision"),
        Metric("micro_recall", "micro recall"),
        Metric("subset_accuracy", "subset accuracy"),
        Metric("mse", "mse", greater_is_better=False, card_type="mse"),
        Metric("mae", "mae", greater_is_better=False),
        Metric("r2", "r2", baseline_rule=R2),
        Metric("pearson", "pearson", plotted=True, card_type="pearsonr", baseline_rule=CORRELATION),
        Metric("spearman", "spearman", baseline_rule=CORRELATION),
        Metric("entity_f1", "entity F1", plotted=True, card_type="f1", card_args={"mode": "strict", "scheme": "IOB2"}),
        Metric("entity_precision", "entity precision", card_type="precision"),
        Metric("entity_recall", "entity recall", card_type="recall"),
        Metric("word_accuracy", "word accuracy", plotted=True, card_type="accuracy"),
        Metric("exact_match", "exact match", plotted=True, card_type="exact_match"),
        Metric("f1", "F1", plotted=True, card_type="f1"),
        Metric("loss", "loss", greater_is_better=False),
    )
}


@dataclass(frozen=True)
class ProblemMetrics:
    reported: tuple[str, ...]  # every metric of the problem; the first is the default metric_for_best_model
    shown: tuple[str, ...]  # the console's validation line, the card's table and model-index
    headline: tuple[str, ...]  # the run's last line


PROBLEMS: dict[str, ProblemMetrics] = {
    SINGLE: ProblemMetrics(
        ("accuracy", "macro_f1", "macro_precision", "macro_recall", "loss"), ("accuracy", "macro_f1"), ("accuracy",)
    ),
    MULTI: ProblemMetrics(
        ("micro_f1", "macro_f1", "subset_accuracy", "micro_precision", "micro_recall", "macro_precision",
         "macro_recall", "loss"),
        ("micro_f1", "macro_f1", "subset_accuracy"),
        ("micro_f1",),
    ),
    REGRESSION: ProblemMetrics(
        ("mse", "mae", "r2", "pearson", "spearman", "loss"), ("mse", "mae", "pearson", "spearman"), ("mse", "pearson")
    ),
    TOKENS: ProblemMetrics(
        ("entity_f1", "entity_precision", "entity_recall", "word_accuracy", "loss"),
        ("entity_f1", "entity_precision", "entity_recall", "word_accuracy"),
        ("entity_f1",),
    ),
    WORD_TAGS: ProblemMetrics(
        ("word_accuracy", "macro_f1", "macro_precision", "macro_recall", "loss"), ("word_accuracy", "macro_f1"),
        ("word_accuracy",),
    ),
    SPANS: ProblemMetrics(("f1", "exact_match", "loss"), ("exact_match", "f1"), ("exact_match", "f1")),
    CHOICES: ProblemMetrics(("accuracy", "loss"), ("accuracy",), ("accuracy",)),
}  # fmt: skip


def greater_is_better(key: str) -> bool:
    return METRICS[key].greater_is_better


def problem_of_metrics(metrics: dict[str, Any]) -> str:
    """The problem type whose metrics these are: the first whose every shown metric they hold."""
    return next((p for p, m in PROBLEMS.items() if all(k in metrics for k in m.shown)), SINGLE)


def _shown(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "n/a"


def _named(keys: tuple[str, ...], metrics: dict[str, Any]) -> str:
    return ", ".join(f"{METRICS[k].name} {_shown(metrics.get(k))}" for k in keys)


def _counted(metrics: dict[str, Any]) -> str:
    if "exact_match" in metrics:
        return f"{metrics['num_samples']} questions"
    if "num_words" in metrics:
        return f"{metrics['num_sentences']} sentences ({metrics['num_words']} words)"
    return f"{metrics['num_samples']} samples"


def summary_line(metrics: dict[str, Any]) -> str:
    """One line for the console: "accuracy 0.7955, macro F1 0.7950, loss 0.4433 on 1066 samples"."""
    problem = PROBLEMS[problem_of_metrics(metrics)]
    line = f"{_named(problem.shown, metrics)}, loss {_shown(metrics.get('loss'))} on {_counted(metrics)}"
    if metrics.get("baseline"):  # what predicting the same for every input scores, by the metric the verdict reads
        line += f" (trivial baseline: {_named(problem.reported[:1], metrics['baseline'])})"
    return line


def headline(metrics: dict[str, Any]) -> str:
    """The end of a run in a few words: "accuracy 0.7955 on 1066 samples"."""
    return f"{_named(PROBLEMS[problem_of_metrics(metrics)].headline, metrics)} on {_counted(metrics)}"


FEWEST_TO_JUDGE = 10  # validation samples (words, for word accuracy): on fewer, no verdict either way


def learned(key: str, value: float | None, baseline: float | None, n: int) -> bool | None:
    """Whether `value` of metric `key`, on `n` samples (words, for word accuracy), is clearly better than
    the trivial baseline's. The rule comes from the metric's row in `METRICS`: a lower-is-better metric
    (`greater_is_better=False`: mse, mae, loss) must be at least 10% below the baseline's; otherwise by
    its `baseline_rule`: a RATE (accuracy, F1, precision, recall) more than two standard errors of the
    baseline's rate above it, and at least 0.02 (a binomial proportion's 95% margin; None where that bar
    is 1 or more: on 23 samples of a 0.913 majority not even every one right is clearly above it); a CORRELATION
    (Pearson's or Spearman's r) above 2 / sqrt(n) (the baseline predicts a constant: r is undefined, 0
    in effect, so no baseline value is needed); R2 above 0.05. None when it cannot be told (no value,
    no baseline, fewer than FEWEST_TO_JUDGE samples: on one sample a constant predictor scores 1 or 0)."""
    metric = METRICS[key]
    rule = metric.baseline_rule if metric.greater_is_better else None
    if value is None or (baseline is None and rule != CORRELATION) or n < FEWEST_TO_JUDGE:
        return None
    if rule is None:
        return value < 0.9 * baseline
    if rule == CORRELATION:
        return value > 2 / math.sqrt(n)
    if rule == R2:
        return value > 0.05
    bar = baseline + max(0.02, 2 * math.sqrt(max(baseline, 0.01) * max(1 - baseline, 0.01) / n))
    if bar >= 1.0:  # not even a perfect score would be clearly above it: too few samples to tell
        return None
    return value > bar


# --- how each number is computed ----------------------------------------------------------------------


def _as_label_array(values: Any, what: str) -> np.ndarray:
    """Turn class ids from any of our sources (list, numpy, torch, arrow lists) into 1-D int64."""
    if hasattr(values, "detach"):  # a torch tensor, possibly on GPU; no torch import needed here
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of class ids, got shape {array.shape}")
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ValueError(f"{what} must be integer class ids, got non-integer values (logits?)")
    elif array.dtype.kind not in "iub":
        raise ValueError(f"{what} must be integer class ids, got dtype {array.dtype}")
    return array.astype(np.int64)


def _check_labels(values: np.ndarray, num_labels: int, what: str) -> None:
    stray = (values < 0) | (values >= num_labels)
    if np.any(stray):
        ids = np.unique(values[stray])[:5].tolist()
        raise ValueError(
            f"{what} contain class ids {ids} that are not among the labels {list(range(num_labels))}"
        )


def classification_report(predictions: Any, references: Any, names: Sequence[str]) -> dict[str, Any]:
    """Everything we report about a classifier (computed as the module docstring says).

    Returns plain Python numbers and lists (JSON-serialisable, for `metrics.json`):
        num_samples, accuracy, macro_precision, macro_recall, macro_f1,
        per_class: {label_name: {precision, recall, f1, support}},
        confusion_matrix: [true][predicted] counts, num_labels x num_labels.
    A loss, if wanted, is added by the caller.
    """
    names = [str(name) for name in names]
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"the label names must be unique, got duplicates {duplicates}")
    y_pred = _as_label_array(predictions, "predictions")
    y_true = _as_label_array(references, "references")
    if y_pred.shape != y_true.shape:
        raise ValueError(f"predictions and references differ in length: {len(y_pred)} != {len(y_true)}")
    n = len(names)
    _check_labels(y_true, n, "references")
    _check_labels(y_pred, n, "predictions")

    # One confusion matrix, and every figure from it: scikit-learn's precision_recall_fscore_support,
    # confusion_matrix and accuracy_score each validate and count the labels again (about 10 ms a call on
    # 2 cores, at every evaluation of a run, its baseline's too); the same definitions, zero_division=0.
    matrix = np.bincount(y_true * n + y_pred, minlength=n * n).reshape(n, n) if n else np.zeros((0, 0), np.int64)
    hits, support, chosen = np.diag(matrix), matrix.sum(axis=1), matrix.sum(axis=0)
    precision, recall = _share(hits, chosen), _share(hits, support)
    f1 = _share(2 * hits, support + chosen)  # 2PR / (P + R), 0 where both are
    accuracy = float(hits.sum() / len(y_true)) if len(y_true) else 0.0

    def macro(values: np.ndarray) -> float:
        return float(np.mean(values)) if n else 0.0

    return {
        "num_samples": len(y_true),
        "accuracy": accuracy,
        "macro_precision": macro(precision),
        "macro_recall": macro(recall),
        "macro_f1": macro(f1),
        "per_class": per_class(names, precision, recall, f1, support),
        "confusion_matrix": matrix.tolist(),
    }


def _share(part: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """part / whole, 0 where whole is 0 (scikit-learn's zero_division=0)."""
    return np.divide(part, whole, out=np.zeros(len(part)), where=whole > 0)


def per_class(names: Sequence[str], precision: Any, recall: Any, f1: Any, support: Any) -> dict[str, dict]:
    """{name: {precision, recall, f1, support}}, from per-label arrays in the order of `names`."""
    return {
        name: {
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(names)
    }


def _array(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def regression_report(predictions: Any, references: Any) -> dict[str, Any]:
    """mse, mae, r2 (scikit-learn), pearson, spearman (scipy); a correlation or r2 that is undefined
    (fewer than 2 samples, or constant predictions or references) is None."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    y_pred, y_true = _array(predictions).reshape(-1), _array(references).reshape(-1)
    if y_pred.shape != y_true.shape:
        raise ValueError(f"predictions and references differ in length: {len(y_pred)} != {len(y_true)}")
    n = len(y_true)
    varies = n >= 2 and np.ptp(y_true) > 0
    correlated = varies and np.ptp(y_pred) > 0
    return {
        "num_samples": n,
        "mse": float(mean_squared_error(y_true, y_pred)) if n else 0.0,
        "mae": float(mean_absolute_error(y_true, y_pred)) if n else 0.0,
        "r2": float(r2_score(y_true, y_pred)) if varies else None,
        "pearson": float(pearsonr(y_pred, y_true).statistic) if correlated else None,
        "spearman": float(spearmanr(y_pred, y_true).statistic) if correlated else None,
    }


def multi_label_report(
    probabilities: Any, references: Any, names: list[str], threshold: float | Sequence[float] = 0.5
) -> dict[str, Any]:
    """A label is predicted when its probability is >= `threshold`. scikit-learn on the (N, K) 0/1
    matrices: micro (every sample-label pair pooled) and macro (the mean over labels) precision,
    recall and F1, subset accuracy (the share of samples whose whole label set is right), and per
    label precision, recall, F1 and support (its count in the references). Zero division gives 0."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    k = len(names)
    y_prob = _array(probabilities).reshape(-1, k)
    y_true = (_array(references).reshape(-1, k) >= 0.5).astype(np.int64)
    y_pred = (y_prob >= np.asarray(threshold, dtype=np.float64)).astype(np.int64)  # one, or one per label
    n = len(y_true)
    if n:
        p, r, f1, support = precision_recall_fscore_support(y_true, y_pred, average=None, zero_division=0)
        micro = precision_recall_fscore_support(y_true, y_pred, average="micro", zero_division=0)[:3]
        subset = float(accuracy_score(y_true, y_pred))
    else:
        p = r = f1 = support = np.zeros(k)
        micro, subset = (0.0, 0.0, 0.0), 0.0
    return {
        "num_samples": n,
        "threshold": threshold if isinstance(threshold, (int, float)) else [float(t) for t in threshold],
        "micro_f1": float(micro[2]),
        "macro_f1": float(np.mean(f1)) if k else 0.0,
        "subset_accuracy": subset,
        "micro_precision": float(micro[0]),
        "micro_recall": float(micro[1]),
        "macro_precision": float(np.mean(p)) if k else 0.0,
        "macro_recall": float(np.mean(r)) if k else 0.0,
        "per_class": per_class(names, p, r, f1, support),
    }


def token_report(predictions: list[list[int]], references: list[list[int]], names: Sequence[str]) -> dict[str, Any]:
    """Entity-level precision, recall, F1 (seqeval, strict IOB2), micro and per entity type, and word
    accuracy, over sentences given as lists of tag ids (one per word, in `names`)."""
    from seqeval.metrics.v1 import precision_recall_fscore_support, unique_labels
    from seqeval.scheme import IOB2

    names = [str(n) for n in names]
    y_true = [[names[i] for i in sentence] for sentence in references]
    y_pred = [[names[i] for i in sentence] for sentence in predictions]
    if [len(s) for s in y_true] != [len(s) for s in y_pred]:
        raise ValueError("predictions and references differ in their sentences' lengths")
    words = sum(len(s) for s in y_true)
    right = sum(t == p for ts, ps in zip(y_true, y_pred, strict=True) for t, p in zip(ts, ps, strict=True))
    with warnings.catch_warnings():  # seqeval warns of entity types absent from the references
        warnings.simplefilter("ignore")
        micro = precision_recall_fscore_support(y_true, y_pred, average="micro", scheme=IOB2, zero_division=0)
        p, r, f1, support = precision_recall_fscore_support(y_true, y_pred, average=None, scheme=IOB2, zero_division=0)
        types = unique_labels(y_true, y_pred, IOB2)
    # Per entity type: every type of the tag set, one absent from both sides with zeros.
    scores, zero = per_class(types, p, r, f1, support), {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    kinds = sorted({n[2:] for n in names if n[:2] in ("B-", "I-")} | set(types))
    return {
        "num_samples": len(y_true),
        "num_sentences": len(y_true),
        "num_words": words,
        "entity_f1": float(micro[2]),
        "entity_precision": float(micro[0]),
        "entity_recall": float(micro[1]),
        "word_accuracy": right / words if words else 0.0,
        "per_class": {kind: scores.get(kind, zero) for kind in kinds},
    }


def word_report(predictions: list[list[int]], references: list[list[int]], names: Sequence[str]) -> dict[str, Any]:
    """Word accuracy, and each tag's precision, recall, F1 and support over the words (scikit-learn), over
    sentences given as lists of tag ids (one per word, in `names`): a plain tag set's scores. The
    macro means are over the tags in the references or the predictions (scikit-learn's default labels: a
    tag absent from both is no zero in them); `per_class` lists every tag, an absent one with zeros."""
    from sklearn.metrics import precision_recall_fscore_support

    names = [str(n) for n in names]
    if [len(s) for s in references] != [len(s) for s in predictions]:
        raise ValueError("predictions and references differ in their sentences' lengths")
    y_true = np.asarray([t for s in references for t in s], dtype=np.int64)
    y_pred = np.asarray([t for s in predictions for t in s], dtype=np.int64)
    _check_labels(y_true, len(names), "references")
    _check_labels(y_pred, len(names), "predictions")
    k, words = len(names), len(y_true)
    present = sorted(set(y_true.tolist()) | set(y_pred.tolist()))
    p = r = f1 = support = np.zeros(k)
    if words:
        p, r, f1, support = precision_recall_fscore_support(y_true, y_pred, labels=list(range(k)), zero_division=0)
    return {
        "num_samples": len(references),
        "num_sentences": len(references),
        "num_words": words,
        "word_accuracy": float((y_true == y_pred).mean()) if words else 0.0,
        "macro_f1": float(np.mean(f1[present])) if present else 0.0,
        "macro_precision": float(np.mean(p[present])) if present else 0.0,
        "macro_recall": float(np.mean(r[present])) if present else 0.0,
        "per_class": per_class(names, p, r, f1, support),
    }


def tune_thresholds(probabilities: Any, references: Any, per_label: bool) -> list[float]:
    """The multi-label decision threshold(s) that score best on these (validation) predictions, among
    0.05, 0.10, ..., 0.95: one for every label, maximizing micro F1; or each label's own, maximizing
    its F1 (ties: the one nearest 0.5). A list of one threshold per label either way."""
    from sklearn.metrics import f1_score

    y_prob, y_true = _array(probabilities), (_array(references) >= 0.5).astype(np.int64)
    k = y_prob.shape[1]
    candidates = sorted(np.round(np.arange(0.05, 0.951, 0.05), 2), key=lambda t: abs(t - 0.5))
    if not per_label:
        best = max(candidates, key=lambda t: f1_score(y_true, (y_prob >= t).astype(np.int64), average="micro",
                                                      zero_division=0))  # fmt: skip
        return [float(best)] * k
    return [
        float(max(candidates, key=lambda t: f1_score(y_true[:, j], (y_prob[:, j] >= t).astype(np.int64), zero_division=0)))
        for j in range(k)
    ]


def never_predicted(metrics: dict[str, Any], predictions: Any, names: list[str], threshold: Any) -> list[str]:
    """The classes (or labels) these predictions never chose: what a lopsided model looks like."""
    if "confusion_matrix" in metrics:
        matrix = np.asarray(metrics["confusion_matrix"])
        return [names[j] for j in range(len(names)) if matrix[:, j].sum() == 0]
    if "micro_f1" in metrics and predictions is not None:
        chosen = (_array(predictions) >= np.asarray(threshold, dtype=np.float64)).sum(0)
        return [names[j] for j in range(len(names)) if chosen[j] == 0]
    return []
