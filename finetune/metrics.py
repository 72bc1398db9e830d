"""Classification metrics that work offline, through the `evaluate` library's API.

    from finetune.metrics import classification_report, load_metric, plot_confusion_matrix

    metric = load_metric("classification", label_names=label_names)   # or "accuracy", "f1", ...
    for batch in eval_dataloader:
        logits = model(**batch).logits
        predictions, references = accelerator.gather_for_metrics((logits.argmax(-1), batch["labels"]))
        metric.add_batch(predictions=predictions, references=references)
    report = metric.compute()            # == classification_report(all_predictions, all_references, label_names)
    plot_confusion_matrix(report["confusion_matrix"], label_names, output_dir / "confusion_matrix.png")

Why this module exists: `evaluate.load("accuracy")` fetches a metric script from the Hugging Face Hub
at run time. With no network (or `HF_HUB_OFFLINE=1`, as in our tests) it raises `FileNotFoundError`
("... doesn't exist on the Hugging Face Hub either"), so a finished training run would crash at its
first evaluation. The Hub scripts also import scikit-learn, which is not one of our dependencies.

How it plugs into `evaluate`: each local metric is an `evaluate.Metric` subclass defined here and
instantiated directly. That keeps evaluate's API (`add`, `add_batch`, `compute`, `evaluate.combine`;
anything that takes an `EvaluationModule`) with no download, no Hub lookup and no copy into the
dynamic-modules cache. (The other route, `evaluate.load("path/to/metric.py")`, also works offline,
but evaluate copies the script into a writable `~/.cache/huggingface/modules` and imports it under a
hashed module name, so the script must be self-contained and its classes are not the ones
defined here.) Any other name, e.g. "matthews_correlation" or "evaluate-metric/accuracy" (the Hub's
own accuracy), goes to `evaluate.load` unchanged and so still works online, or offline where
evaluate has cached it before.

Conventions, shared by every function here:
- inputs are integer class ids, 1-D: lists, numpy arrays or (CPU or CUDA) torch tensors;
- a confusion matrix is indexed [true][predicted];
- zero division gives 0.0: the precision of a class that is never predicted, the recall of a class
  absent from the references, and the F1 of a class absent from both are 0.0, with no warning. This
  is scikit-learn's `zero_division=0`; it makes macro averages pessimistic rather than NaN, and keeps
  the numbers JSON- and TensorBoard-friendly.
- F1 is 2*TP / (2*TP + FP + FN), which equals 2PR/(P+R) wherever both are defined (as in sklearn).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import evaluate
import numpy as np

if not hasattr(evaluate, "Metric"):
    # `python finetune/run.py` puts finetune/ first on sys.path, where our own evaluate.py entry
    # point hides the library. Say so instead of failing later with an AttributeError.
    raise ImportError(
        f"`import evaluate` found {getattr(evaluate, '__file__', evaluate)}, not Hugging Face's evaluate "
        "library; run entry points as modules (python -m finetune.run, accelerate launch -m finetune.run)"
    )

__all__ = [
    "LOCAL_METRICS",
    "Accuracy",
    "Classification",
    "ConfusionMatrix",
    "F1",
    "MetricError",
    "Precision",
    "Recall",
    "classification_report",
    "load_metric",
    "plot_confusion_matrix",
]


class MetricError(ValueError):
    """A metric name the user asked for cannot be provided (one line, meant to be shown as is)."""


# --------------------------------------------------------------------------------------------------
# numpy core: everything is derived from one confusion matrix


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


def _as_pair(predictions: Any, references: Any) -> tuple[np.ndarray, np.ndarray]:
    predictions = _as_label_array(predictions, "predictions")
    references = _as_label_array(references, "references")
    if predictions.shape != references.shape:
        raise ValueError(
            f"predictions and references differ in length: {len(predictions)} != {len(references)}"
        )
    return predictions, references


def _label_index(values: np.ndarray, labels: np.ndarray, what: str) -> np.ndarray:
    """Position of each value in `labels` (which keeps its caller-given order)."""
    sorter = np.argsort(labels, kind="stable")
    positions = np.searchsorted(labels, values, sorter=sorter)
    positions = np.clip(positions, 0, max(len(labels) - 1, 0))
    found = labels[sorter[positions]] == values if len(labels) else np.zeros(len(values), dtype=bool)
    if not np.all(found):
        stray = np.unique(values[~found])[:5].tolist()
        raise ValueError(f"{what} contain class ids {stray} that are not among the labels {labels.tolist()}")
    return sorter[positions]


def _confusion(
    predictions: np.ndarray,
    references: np.ndarray,
    labels: np.ndarray,
    sample_weight: Any = None,
) -> np.ndarray:
    """[true][pred] counts over `labels` (int64), or summed weights (float64) given sample_weight.

    Unlike sklearn, a class id outside `labels` is an error rather than silently dropped: in this
    project it means a label mapping mismatch, which should not pass as a lower score.
    """
    n = len(labels)
    true_index = _label_index(references, labels, "references")
    pred_index = _label_index(predictions, labels, "predictions")
    weights = None
    if sample_weight is not None:
        weights = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
        if weights.shape != references.shape:
            raise ValueError(f"sample_weight has {weights.size} values for {references.size} samples")
    counts = np.bincount(true_index * n + pred_index, weights=weights, minlength=n * n)
    return counts.reshape(n, n)


def _divide(numerator: np.ndarray, denominator: np.ndarray, zero_division: float) -> np.ndarray:
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.full(np.broadcast(numerator, denominator).shape, float(zero_division))
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


def _per_class(matrix: np.ndarray, zero_division: float) -> dict[str, np.ndarray]:
    """Per-class precision, recall, F1 and support of a [true][pred] confusion matrix."""
    tp = np.diag(matrix)
    pred_sum = matrix.sum(axis=0)  # TP + FP
    true_sum = matrix.sum(axis=1)  # TP + FN
    return {
        "precision": _divide(tp, pred_sum, zero_division),
        "recall": _divide(tp, true_sum, zero_division),
        "f1": _divide(2 * tp, pred_sum + true_sum, zero_division),
        "support": true_sum,
    }


def _zero_division_value(zero_division: float | str) -> float:
    # The Hub metrics default to sklearn's "warn", which also means 0.0; accept it so that code
    # written for `evaluate.load("f1")` runs unchanged. We never warn: 0.0 is our documented rule.
    return 0.0 if zero_division == "warn" else float(zero_division)


def _precision_recall_f1(
    predictions: Any,
    references: Any,
    *,
    labels: Sequence[int] | None,
    pos_label: int,
    average: str | None,
    sample_weight: Any,
    zero_division: float | str,
) -> dict[str, float | np.ndarray]:
    """Precision, recall and F1 with scikit-learn's `average`, `labels` and `pos_label` meaning."""
    zero_division = _zero_division_value(zero_division)
    predictions, references = _as_pair(predictions, references)
    present = np.union1d(predictions, references)
    if average == "binary":
        if len(present) > 2:
            raise ValueError(
                f"average='binary' needs two classes but the data has {len(present)}; "
                "pass average='macro', 'micro', 'weighted' or None"
            )
        if len(present) == 2 and pos_label not in present:
            raise ValueError(f"pos_label={pos_label} is not one of the classes {present.tolist()}")
        # A single class in the data: the positive class may still be absent, which gives
        # `zero_division` below, as in sklearn.
        labels = present.tolist() if pos_label in present else [*present.tolist(), pos_label]
    elif average not in ("micro", "macro", "weighted", None):
        raise ValueError(f"average must be 'binary', 'micro', 'macro', 'weighted' or None, got {average!r}")
    label_array = np.asarray(present if labels is None else labels, dtype=np.int64)
    matrix = _confusion(predictions, references, label_array, sample_weight)
    scores = _per_class(matrix, zero_division)
    keys = ("precision", "recall", "f1")
    if average == "binary":
        index = int(np.flatnonzero(label_array == pos_label)[0])
        return {key: float(scores[key][index]) for key in keys}
    if average == "micro":  # pool the counts of all classes (for single-label data all three = accuracy)
        tp, pred_sum, true_sum = np.trace(matrix), matrix.sum(axis=0).sum(), matrix.sum(axis=1).sum()
        return {
            "precision": float(_divide(tp, pred_sum, zero_division)),
            "recall": float(_divide(tp, true_sum, zero_division)),
            "f1": float(_divide(2 * tp, pred_sum + true_sum, zero_division)),
        }
    if average is None:
        return {key: scores[key] for key in keys}
    if len(label_array) == 0:
        return dict.fromkeys(keys, zero_division)
    if average == "macro":
        return {key: float(scores[key].mean()) for key in keys}
    support = scores["support"].astype(np.float64)  # "weighted"
    if support.sum() == 0:
        return dict.fromkeys(keys, zero_division)
    return {key: float(np.average(scores[key], weights=support)) for key in keys}


def classification_report(predictions: Any, references: Any, label_names: Sequence[str]) -> dict[str, Any]:
    """Everything we report about a classifier, in one pass over one confusion matrix.

    Class `i` is `label_names[i]`; every class is included, also one absent from the data, so that
    a run's reports always have the same keys and matrix shape. Zero division gives 0.0 (see the
    module docstring); in particular the macro averages count a class absent from the data as 0.0,
    as `sklearn.metrics.precision_recall_fscore_support(labels=range(num_labels))` does.

    Returns plain Python numbers and lists (JSON-serialisable, for `metrics.json`):
        num_samples, accuracy, macro_precision, macro_recall, macro_f1,
        per_class: {label_name: {precision, recall, f1, support}},
        confusion_matrix: [true][predicted] counts, num_labels x num_labels.
    A loss, if wanted, is added by the caller.
    """
    names = [str(name) for name in label_names]
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"label_names must be unique, got duplicates {duplicates}")
    predictions, references = _as_pair(predictions, references)
    matrix = _confusion(predictions, references, np.arange(len(names), dtype=np.int64))
    scores = _per_class(matrix, 0.0)
    num_samples = int(matrix.sum())

    def macro(key: str) -> float:
        return float(scores[key].mean()) if names else 0.0

    return {
        "num_samples": num_samples,
        "accuracy": float(_divide(np.trace(matrix), num_samples, 0.0)),
        "macro_precision": macro("precision"),
        "macro_recall": macro("recall"),
        "macro_f1": macro("f1"),
        "per_class": {
            name: {
                "precision": float(scores["precision"][i]),
                "recall": float(scores["recall"][i]),
                "f1": float(scores["f1"][i]),
                "support": int(scores["support"][i]),
            }
            for i, name in enumerate(names)
        },
        "confusion_matrix": matrix.tolist(),
    }


# --------------------------------------------------------------------------------------------------
# evaluate.Metric wrappers: same names, inputs and outputs as the Hub metrics, computed with numpy


_FEATURES = datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")})

_INPUTS = """
Args:
    predictions (`list` of `int`): predicted class ids.
    references (`list` of `int`): true class ids.
"""

_PRF_KWARGS = """    labels (`list` of `int`, optional): the classes to score (and their order); default: the
        classes present in predictions or references. A class id outside `labels` is an error.
    pos_label (`int`, default 1): the positive class when average="binary".
    average (`str` or None, default "binary"): "binary", "micro", "macro", "weighted", or None for
        per-class scores (a numpy array, as the Hub metric returns).
    sample_weight (`list` of `float`, optional): one weight per sample.
    zero_division (`float` or "warn", default "warn"): the value of 0/0; "warn" means 0.0 (no warning).
"""

_ACCURACY_KWARGS = """    normalize (`bool`, default True): False gives the (weighted) count of correct predictions.
    sample_weight (`list` of `float`, optional): one weight per sample.
"""

_CONFUSION_MATRIX_KWARGS = """    labels (`list` of `int`, optional): the classes (rows and columns, in this order); default: the
        classes present in predictions or references. A class id outside `labels` is an error.
    sample_weight (`list` of `float`, optional): one weight per sample.
    normalize ("true", "pred", "all" or None): divide by row sums, column sums or the total (0/0 = 0).
"""

_CLASSIFICATION_KWARGS = """    label_names (`list` of `str`, optional): class i is label_names[i]; overrides the names given
        when the metric was loaded.
"""


class _LocalMetric(evaluate.Metric):
    """Shared `_info` of the local metrics. Subclasses set `_description`, `_inputs` and `_compute`.

    `evaluate` names an instance after its class (`Accuracy` -> "accuracy"), which is the name
    `evaluate.combine` uses to prefix colliding keys, so the class names match the Hub names.
    """

    _description = ""
    _inputs = _INPUTS

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=self._description,
            citation="",
            inputs_description=self._inputs,
            features=_FEATURES,
            homepage="",
            license="Apache-2.0",
        )


class Accuracy(_LocalMetric):
    """Fraction of predictions equal to the references (the Hub "accuracy", without sklearn)."""

    _description = "Accuracy: the fraction of correct predictions."
    _inputs = _INPUTS + _ACCURACY_KWARGS

    def _compute(
        self, predictions: Any, references: Any, normalize: bool = True, sample_weight: Any = None
    ) -> dict[str, float]:
        predictions, references = _as_pair(predictions, references)
        weights = np.ones(len(references)) if sample_weight is None else np.asarray(sample_weight, float)
        if weights.shape != references.shape:
            raise ValueError(f"sample_weight has {weights.size} values for {references.size} samples")
        correct = float(np.sum(weights * (predictions == references)))
        return {"accuracy": correct if not normalize else float(_divide(correct, weights.sum(), 0.0))}


class _PrecisionRecallF1(_LocalMetric):
    _key = ""

    def _compute(
        self,
        predictions: Any,
        references: Any,
        labels: Sequence[int] | None = None,
        pos_label: int = 1,
        average: str | None = "binary",
        sample_weight: Any = None,
        zero_division: float | str = "warn",
    ) -> dict[str, float | np.ndarray]:
        scores = _precision_recall_f1(
            predictions,
            references,
            labels=labels,
            pos_label=pos_label,
            average=average,
            sample_weight=sample_weight,
            zero_division=zero_division,
        )
        return {self._key: scores[self._key]}


class Precision(_PrecisionRecallF1):
    """TP / (TP + FP), with the Hub "precision" metric's arguments (default average="binary")."""

    _key = "precision"
    _description = "Precision: TP / (TP + FP)."
    _inputs = _INPUTS + _PRF_KWARGS


class Recall(_PrecisionRecallF1):
    """TP / (TP + FN), with the Hub "recall" metric's arguments (default average="binary")."""

    _key = "recall"
    _description = "Recall: TP / (TP + FN)."
    _inputs = _INPUTS + _PRF_KWARGS


class F1(_PrecisionRecallF1):
    """2TP / (2TP + FP + FN), with the Hub "f1" metric's arguments (default average="binary")."""

    _key = "f1"
    _description = "F1: the harmonic mean of precision and recall, 2TP / (2TP + FP + FN)."
    _inputs = _INPUTS + _PRF_KWARGS


class ConfusionMatrix(_LocalMetric):
    """[true][pred] counts as a numpy array, like the Hub "confusion_matrix" metric."""

    _description = "Confusion matrix: entry [i][j] counts samples of true class i predicted as j."
    _inputs = _INPUTS + _CONFUSION_MATRIX_KWARGS

    def _compute(
        self,
        predictions: Any,
        references: Any,
        labels: Sequence[int] | None = None,
        sample_weight: Any = None,
        normalize: str | None = None,
    ) -> dict[str, np.ndarray]:
        predictions, references = _as_pair(predictions, references)
        label_array = np.union1d(predictions, references) if labels is None else np.asarray(labels, np.int64)
        matrix = _confusion(predictions, references, label_array, sample_weight)
        if normalize == "true":
            matrix = _divide(matrix, matrix.sum(axis=1, keepdims=True), 0.0)
        elif normalize == "pred":
            matrix = _divide(matrix, matrix.sum(axis=0, keepdims=True), 0.0)
        elif normalize == "all":
            matrix = _divide(matrix, matrix.sum(), 0.0)
        elif normalize is not None:
            raise ValueError(f"normalize must be 'true', 'pred', 'all' or None, got {normalize!r}")
        return {"confusion_matrix": matrix}


class Classification(_LocalMetric):
    """`classification_report` behind evaluate's API: every number we log, from one pass.

    `label_names` may be given when loading (`load_metric("classification", label_names=...)`) or
    to `compute`; without them, classes are 0..max id seen and named by their id.
    """

    _description = "Accuracy, macro and per-class precision/recall/F1, support and the confusion matrix."
    _inputs = _INPUTS + _CLASSIFICATION_KWARGS

    def __init__(self, label_names: Sequence[str] | None = None, **kwargs: Any) -> None:
        self.label_names = list(label_names) if label_names is not None else None
        super().__init__(**kwargs)

    def _compute(
        self, predictions: Any, references: Any, label_names: Sequence[str] | None = None
    ) -> dict[str, Any]:
        names = label_names if label_names is not None else self.label_names
        if names is None:
            predictions, references = _as_pair(predictions, references)
            num_labels = int(max(predictions.max(initial=-1), references.max(initial=-1))) + 1
            names = [str(i) for i in range(num_labels)]
        return classification_report(predictions, references, names)


LOCAL_METRICS: dict[str, type[_LocalMetric]] = {
    "accuracy": Accuracy,
    "precision": Precision,
    "recall": Recall,
    "f1": F1,
    "confusion_matrix": ConfusionMatrix,
    "classification": Classification,
}


def _offline() -> bool:
    return any(
        os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for var in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE")
    )


def load_metric(name: str, **kwargs: Any) -> evaluate.EvaluationModule:
    """A local metric for the names in `LOCAL_METRICS`, else `evaluate.load(name, **kwargs)`.

    `kwargs` go to the metric's constructor (as `evaluate.load` passes them): `label_names` for
    "classification", or evaluate's own `cache_dir`, `experiment_id`, ... . `keep_in_memory`
    defaults to True: our loop gathers predictions with `accelerator.gather_for_metrics`, so
    evaluate's file-based cross-process rendezvous (and its arrow cache files) are not needed.
    To use the Hub's implementation of a local name, ask for "evaluate-metric/<name>".

    Raises `MetricError` (one line) when a non-local metric cannot be loaded: no network, no such
    metric on the Hub, or a missing package that the Hub script imports.
    """
    kwargs.setdefault("keep_in_memory", True)
    local = LOCAL_METRICS.get(name.strip().lower())
    if local is not None:
        return local(**kwargs)
    local_names = ", ".join(LOCAL_METRICS)
    try:
        return evaluate.load(name, **kwargs)
    except ImportError as err:  # the Hub script imports a package we do not depend on (often sklearn)
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MetricError(
            f"metric {name!r} from the Hugging Face Hub needs a package that is not installed ({first_line}); "
            f"install it, or use a local metric: {local_names}"
        ) from err
    except OSError as err:  # FileNotFoundError / ConnectionError: offline, or no such metric
        reason = (
            "HF_HUB_OFFLINE is set and it is not in evaluate's cache"
            if _offline()
            else "the Hub could not be reached or has no metric of that name"
        )
        raise MetricError(
            f"metric {name!r} needs the network: it is not a local metric and could not be loaded "
            f"from the Hugging Face Hub ({reason}); local metrics: {local_names}"
        ) from err


# --------------------------------------------------------------------------------------------------
# plot


def plot_confusion_matrix(
    matrix: Any, label_names: Sequence[str], path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Write a confusion matrix as a PNG: counts in the cells, colour = fraction of the true class.

    Colour is row-normalised (each true class sums to 1, i.e. per-class recall on the diagonal) so
    that a rare class's mistakes are as visible as a frequent one's; the cells still show counts.
    The figure grows with the number of classes and the length of the names, so names are never
    cut. Past 40 classes the cell counts are left out (they would not be legible); the colours stay.

    Uses matplotlib's object API on an Agg canvas, not pyplot: no global figure state, no backend
    switch for the rest of the process, safe without a display. Returns the path written.
    """
    # Imported here so that computing metrics does not pay for importing matplotlib.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(matrix)
    names = [str(name) for name in label_names]
    n = len(names)
    if counts.ndim != 2 or counts.shape != (n, n):
        raise ValueError(f"matrix must be {n} x {n} to match label_names, got shape {counts.shape}")
    row_sums = counts.sum(axis=1, keepdims=True)
    colour = _divide(counts, row_sums, 0.0)

    # Size: ~0.6 in per cell (more for a few classes), plus room for the names (about 0.075 in per
    # character at 9 pt; the x names are rotated 45 degrees so they need ~0.7 of that vertically).
    longest = max((len(name) for name in names), default=1)
    cell = 0.6 if n > 4 else 1.1
    grid = max(n * cell, 2.4)
    name_width = 0.075 * longest
    name_room = name_width + 0.3
    fig = Figure(figsize=(grid + name_room + 2.0, grid + 0.7 * name_room + 1.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(colour, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
    colorbar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.set_label("fraction of true class")

    if name_width > 0.9 * cell:  # names wider than a cell would overlap: slant them
        ax.set_xticks(np.arange(n), labels=names, rotation=45, ha="right", rotation_mode="anchor", fontsize=9)
    else:
        ax.set_xticks(np.arange(n), labels=names, fontsize=9)
    ax.set_yticks(np.arange(n), labels=names, fontsize=9)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    # Thin white lines between cells make large matrices easier to read along a row.
    ax.set_xticks(np.arange(n + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)

    if n <= 40:
        is_integer = np.issubdtype(counts.dtype, np.integer) or bool(np.all(counts == np.round(counts)))
        texts = [[f"{int(v)}" if is_integer else f"{v:.2g}" for v in row] for row in counts.tolist()]
        widest = max((len(text) for row in texts for text in row), default=1)
        # A cell is cell*72 pt wide; a digit is ~0.6 of the font size.
        fontsize = float(np.clip(0.8 * cell * 72 / (0.6 * max(widest, 2)), 5, 12))
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    texts[i][j],
                    ha="center",
                    va="center",
                    fontsize=fontsize,
                    color="white" if colour[i, j] > 0.5 else "black",
                )

    if title is None:
        total = counts.sum()
        accuracy = np.trace(counts) / total if total else math.nan
        title = f"Confusion matrix ({total:,.0f} samples, accuracy {accuracy:.3f})"
    ax.set_title(title)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
