"""Classification metrics, computed locally with scikit-learn (no download, works offline).

    from finetune.metrics import classification_report, plot_confusion_matrix

    report = classification_report(predictions, references, label_names)
    plot_confusion_matrix(report["confusion_matrix"], label_names, output_dir / "confusion_matrix.png")

Training (`finetune/run.py`) and `finetune/evaluate_checkpoint.py` gather every prediction with
`accelerator.gather_for_metrics` and call `classification_report` once. The classes are
`labels = range(len(label_names))`, class `i` named `label_names[i]`, all of them always reported,
also a class absent from the data. How each number is computed (y_true = references,
y_pred = predictions):

- accuracy: `sklearn.metrics.accuracy_score(y_true, y_pred)`, the fraction of y_pred == y_true.
- per-class precision, recall, F1, support:
  `sklearn.metrics.precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)`,
  i.e. precision = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2TP / (2TP + FP + FN) (equal to
  2PR / (P + R) wherever both are defined), support = TP + FN (the class's count in y_true).
  Zero division gives 0.0, with no warning: the precision of a class never predicted, the recall of
  a class absent from the references, the F1 of a class absent from both.
- macro precision, recall, F1: the unweighted mean of the per-class values over all `labels`,
  a class absent from the data counting as 0.0 (what `average="macro"` with `labels=labels` gives).
- confusion matrix: `sklearn.metrics.confusion_matrix(y_true, y_pred, labels=labels)`, indexed
  [true][predicted]: rows are true labels, columns predicted labels.
- num_samples: the number of predictions.

`evaluate.load("accuracy")`, `evaluate.load("f1")` and friends call these same scikit-learn
functions, but fetch their scripts from the Hugging Face Hub at run time, which fails offline.

Before scikit-learn sees them, inputs are checked: 1-D integer class ids (lists, numpy arrays,
CPU or CUDA torch tensors) of equal length, all in `labels`. A class id outside `labels` is an
error, not dropped silently as scikit-learn would: here it means a label-mapping mismatch. With no
samples (which scikit-learn rejects) every number is 0 and the matrix is all zeros.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["classification_report", "plot_confusion_matrix"]


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


def classification_report(predictions: Any, references: Any, label_names: Sequence[str]) -> dict[str, Any]:
    """Everything we report about a classifier (computed as the module docstring says).

    Returns plain Python numbers and lists (JSON-serialisable, for `metrics.json`):
        num_samples, accuracy, macro_precision, macro_recall, macro_f1,
        per_class: {label_name: {precision, recall, f1, support}},
        confusion_matrix: [true][predicted] counts, num_labels x num_labels.
    A loss, if wanted, is added by the caller.
    """
    # Imported here: scikit-learn takes ~1 s to import, and most runs that stop early never need it.
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    names = [str(name) for name in label_names]
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"label_names must be unique, got duplicates {duplicates}")
    y_pred = _as_label_array(predictions, "predictions")
    y_true = _as_label_array(references, "references")
    if y_pred.shape != y_true.shape:
        raise ValueError(f"predictions and references differ in length: {len(y_pred)} != {len(y_true)}")
    n = len(names)
    _check_labels(y_true, n, "references")
    _check_labels(y_pred, n, "predictions")

    labels = list(range(n))
    if len(y_true):
        precision, recall, f1, support = precision_recall_fscore_support(
            y_true, y_pred, labels=labels, zero_division=0
        )
        with warnings.catch_warnings():  # it warns of a 1 x 1 matrix even when that is all `labels`
            warnings.filterwarnings("ignore", "A single label was found", UserWarning)
            matrix = confusion_matrix(y_true, y_pred, labels=labels)
        accuracy = float(accuracy_score(y_true, y_pred))
    else:  # scikit-learn rejects empty input
        precision = recall = f1 = support = np.zeros(n)
        matrix = np.zeros((n, n), dtype=np.int64)
        accuracy = 0.0

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
    row_sums = counts.sum(axis=1, keepdims=True).astype(np.float64)
    colour = np.divide(counts.astype(np.float64), row_sums, out=np.zeros(counts.shape), where=row_sums != 0)

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
