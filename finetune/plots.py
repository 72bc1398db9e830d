"""The run's pictures: training curves from metrics.jsonl (loss, evaluation metrics and learning rate
vs step) and an evaluation's confusion matrix.

    python -m finetune.plots runs/bert-rotten-tomatoes/metrics.jsonl      # -> training_curves.png beside it
    python -m finetune.plots runs/x/metrics.jsonl curves.png

    from finetune.plots import plot_training_curves
    plot_training_curves(out / "metrics.jsonl", out / "training_curves.png", best=results["best"])

metrics.jsonl holds one JSON object a line, keyed by optimizer step (the unit of the schedule):
training records {"step", "epoch", "loss", "learning_rate", "samples_per_second"} every
`logging_steps`, and evaluation records {"step", "epoch", "eval_accuracy", "eval_loss",
"eval_macro_f1", ...}. A resumed run appends the steps after its checkpoint again; the last record
of a step wins, as it is the one the finished run is made of.

The best checkpoint is not in metrics.jsonl (an evaluation is not a checkpoint: the best evaluation
may fall between saves). It is what the run recorded, {"metric", "value", "step", "path"}: given
as `best`, or else read from results.json beside metrics.jsonl, or from the newest checkpoint's
manifest.json while the run is still going.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finetune import checkpoint as ckpt
from finetune import checks
from finetune.checks import tools
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.layout import METRICS_LOG, RunDir
from finetune.metrics import METRICS

# The evaluation metrics drawn in the middle panel, when present, with their legend names: those the
# metric table marks as plotted (a regression's mse is its loss; Pearson's r is in [-1, 1]).
EVAL_METRICS = {f"eval_{m.key}": m.name for m in METRICS.values() if m.plotted}
# One look per series, told apart by colour, line style AND marker (hollow where a line may lie on
# top of another: balanced binary data gives accuracy == macro F1 at every evaluation), so that they
# stay distinct in grey print and for colour-blind readers. The first of two series that may
# coincide is drawn wider, underneath, so that the second shows on top of it.
STYLES: dict[str, dict[str, Any]] = {
    "loss": {"color": "tab:blue", "marker": "o", "linewidth": 1.6},
    "eval_loss": {"color": "tab:orange", "linestyle": "--", "marker": "s", "markerfacecolor": "none"},
    "eval_accuracy": {"color": "tab:green", "marker": "o", "linewidth": 2.6, "markersize": 6},
    "eval_macro_f1": {"color": "tab:purple", "linestyle": "--", "marker": "D", "markerfacecolor": "none"},
    "eval_micro_f1": {"color": "tab:cyan", "marker": "^", "linewidth": 2.6, "markersize": 6},
    "eval_pearson": {"color": "tab:brown", "marker": "v"},
    "eval_entity_f1": {"color": "tab:olive", "marker": "P", "linewidth": 2.6, "markersize": 6},
    "eval_word_accuracy": {"color": "tab:gray", "linestyle": "--", "marker": "X", "markerfacecolor": "none"},
    "learning_rate": {"color": "tab:red", "marker": ".", "linewidth": 1.4},
}
BEST_STYLE: dict[str, Any] = {
    "marker": "*",
    "markersize": 16,
    "color": "gold",
    "markeredgecolor": "black",
    "linestyle": "none",
    "zorder": 5,
}
BEST_LABEL = "best checkpoint"
BEST_GID = "best_checkpoint"  # the id of the best checkpoint's artists (the star, the vertical lines)
# Up to this many points a curve gets a marker on each, so that a short run is not a bare line.
MARKERS_UP_TO = 40


def read_metrics(metrics_jsonl: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, evaluation records), each sorted by step, one per step (the last logged).

    A line that is not JSON (a run killed while writing it) is skipped.
    """
    train: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    for line in Path(metrics_jsonl).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        if "loss" in record:
            train[record["step"]] = record
        if any(key.startswith("eval_") for key in record):
            evals[record["step"]] = record
    return [train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)]


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _epoch_ends(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(last step of epoch e, e) for every epoch but the last: every epoch ends with an evaluation,
    so the largest step logged with epoch e is where it ended."""
    last: dict[int, int] = {}
    for r in records:
        if isinstance(r.get("epoch"), int):
            last[r["epoch"]] = max(last.get(r["epoch"], 0), r["step"])
    epochs = sorted(last)
    return [(last[e], e) for e in epochs[:-1]]


def recorded_best(run_dir: Path) -> dict[str, Any]:
    """The best checkpoint a run recorded: results.json's "best" (a finished run), else the newest
    complete checkpoint's manifest (a run still going); {} when neither names one."""
    candidates = [RunDir(run_dir).results]
    checkpoints = ckpt.list_checkpoints(run_dir)
    if checkpoints:
        candidates.append(checkpoints[-1] / ckpt.MANIFEST)
    for path in candidates:
        try:
            best = json.loads(path.read_text()).get("best")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(best, dict) and isinstance(best.get("step"), int):
            return best
    return {}


def plot_training_curves(
    metrics_jsonl: Path, out_png: Path, title: str | None = None, best: dict[str, Any] | None = None,
    said: checks.Said | None = None,
) -> Path:
    """Write a PNG of training loss (with validation loss), validation metrics and learning rate
    against the optimizer step, stacked on one shared step axis. Returns `out_png`.

    The loss axis turns logarithmic when the loss falls by more than 10x, so that the end of
    training is not a flat line at the bottom. Dotted vertical lines mark the ends of epochs; a
    star and a solid vertical line mark the best checkpoint: `best` as the run records it
    ({"metric", "value", "step"}; {} for none), by default read beside metrics.jsonl
    (`recorded_best`). `title` defaults to the run directory's name. Raises ValueError when the
    file holds no records.
    """
    fig = training_curves_figure(metrics_jsonl, title, best)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, out_png, said, dpi=110)
    return out_png


def training_curves_figure(metrics_jsonl: Path, title: str | None = None, best: dict[str, Any] | None = None):
    """The figure `plot_training_curves` saves: a matplotlib Figure on an Agg canvas (the object API,
    no pyplot global state, no display needed), panels top to bottom: loss, validation, learning rate."""
    # Imported here so that importing the package does not pay for matplotlib.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics_jsonl = Path(metrics_jsonl)
    train, evals = read_metrics(metrics_jsonl)
    if not train and not evals:
        raise ValueError(f"{metrics_jsonl} holds no training or evaluation records")
    eval_keys = [k for k in EVAL_METRICS if _series(evals, k)[0]]
    if best is None:
        best = recorded_best(metrics_jsonl.parent)

    panels = ["loss"] + (["metrics"] if eval_keys else []) + ["learning_rate"]
    height = 2.6 * len(panels) + 0.6
    fig = Figure(figsize=(8, height))
    FigureCanvasAgg(fig)
    # Margins in inches, set once: a layout engine ("constrained", "tight") lays the figure out again at
    # every draw, about 0.2 s of each run's export on 2 cores (0.55 s against 0.39 s for this picture).
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"left": 1.0 / 8, "right": 1 - 0.2 / 8, "top": 1 - 0.55 / height,
                                     "bottom": 0.55 / height, "hspace": 0.18})[:, 0]  # fmt: skip
    ax_of = dict(zip(panels, axes, strict=True))
    fig.suptitle(title if title is not None else f"training curves: {metrics_jsonl.parent.name}")
    _loss_panel(ax_of["loss"], train, evals)
    if eval_keys:
        _metrics_panel(ax_of["metrics"], evals, eval_keys)
    _learning_rate_panel(ax_of["learning_rate"], train)
    mark_best(ax_of, axes, best, evals)
    _epochs(axes, ax_of["learning_rate"], train, evals)
    axes[-1].set_xlim(left=0)
    return fig


def _draw(ax, steps: list[int], values: list[float], label: str, key: str) -> None:
    """One series in its look (STYLES), with a marker on each point of a short run."""
    style = {"markersize": 5, **STYLES.get(key, {"marker": "o"})}  # a metric without a style: matplotlib's colours
    if len(steps) > MARKERS_UP_TO:  # a marker on every point of a long run is a thick smear
        style["marker"] = None
    ax.plot(steps, values, label=label, **style)


def _loss_panel(ax, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    """Loss: training (mean over each logging interval) and validation, on one scale; logarithmic when it
    falls by more than 10x."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    train_steps, train_loss = _series(train, "loss")
    eval_steps, eval_loss = _series(evals, "eval_loss")
    if train_steps:
        _draw(ax, train_steps, train_loss, "training loss", "loss")
    if eval_steps:
        _draw(ax, eval_steps, eval_loss, "validation loss", "eval_loss")
    positive = [v for v in train_loss + eval_loss if math.isfinite(v) and v > 0]
    if positive and max(positive) / min(positive) > 10:
        ax.set_yscale("log")
        # Plain numbers at 1, 2, 5 x 10^k read better than bare powers of ten.
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("loss (log scale)")
    else:
        ax.set_ylabel("loss")


def _metrics_panel(ax, evals: list[dict[str, Any]], eval_keys: list[str]) -> None:
    """Validation accuracy and F1: fractions, so the axis stays within [0, 1] ([-1, 1] for a negative r)."""
    lowest = 0.0
    for key in eval_keys:
        steps, values = _series(evals, key)
        _draw(ax, steps, values, f"validation {EVAL_METRICS[key]}", key)
        lowest = min(lowest, *values)
    low, high = ax.get_ylim()
    if high - low < 0.1:  # one evaluation, or flat ones: show at least 0.1 around them, not 1e-5
        middle = (high + low) / 2
        low, high = middle - 0.05, middle + 0.05
    ax.set_ylim(max(low, 0.0 if lowest >= 0 else -1.01), min(high, 1.01))  # markers at 1.0 stay whole
    ax.set_ylabel("validation")


def _learning_rate_panel(ax, train: list[dict[str, Any]]) -> None:
    """Learning rate: the schedule as it was applied, one value per logged step; the shared step axis."""
    from matplotlib.ticker import MaxNLocator

    lr_steps, lrs = _series(train, "learning_rate")
    if lr_steps:
        _draw(ax, lr_steps, lrs, "learning rate", "learning_rate")
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _epochs(axes, lr_ax, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    """Grids, legends (not the learning rate's), dotted lines at the ends of epochs and, for a dozen or
    fewer, the epochs named along the top between their boundaries."""
    ends = _epoch_ends(train + evals)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if len(ends) <= 30:
            for step, _ in ends:
                ax.axvline(step, color="0.6", linestyle=":", linewidth=1)
        if ax.get_legend_handles_labels()[0] and ax is not lr_ax:
            ax.legend(loc="best", fontsize=9)
    if ends and len(ends) <= 12:
        top = axes[0]
        last = max(_series(train, "loss")[0] + _series(evals, "eval_loss")[0] + _series(train, "learning_rate")[0])
        bounds = [0] + [s for s, _ in ends] + [last]
        for e, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
            top.text((a + b) / 2, 1.0, f"epoch {e + 1}", transform=top.get_xaxis_transform(), ha="center",
                     va="bottom", fontsize=8, color="0.4")  # fmt: skip


def mark_best(ax_of: dict[str, Any], axes, best: dict[str, Any], evals: list[dict[str, Any]]) -> None:
    """A solid vertical line through every panel at the best checkpoint's step and, when the metric
    that chose it is drawn (validation loss, accuracy or macro F1), a star on its curve there; the
    legend gives the step and the value."""
    step = best.get("step") if best else None
    if not isinstance(step, int):
        return
    metric = str(best.get("metric", ""))
    value = best.get("value")
    if not isinstance(value, (int, float)):  # a best without its value: the logged evaluation's
        value = next((r.get(f"eval_{metric}") for r in evals if r["step"] == step), None)
    label = f"{BEST_LABEL}: step {step}" + (
        f", {METRICS[metric].name if metric in METRICS else metric.replace('_', ' ')} {value:.4g}"
        if isinstance(value, (int, float))
        else ""
    )
    # A regression's mse is its validation loss, drawn in the loss panel.
    drawn_on = {
        "loss": "loss",
        "mse": "loss",
        **{k.removeprefix("eval_"): "metrics" for k in EVAL_METRICS},
    }.get(metric)
    ax = ax_of.get(drawn_on) if drawn_on else None
    if ax is not None and isinstance(value, (int, float)):
        ax.plot([step], [value], label=label, gid=BEST_GID, **BEST_STYLE)
        label = "_nolegend_"
    for each in axes:  # the legend names it once: on the star, else on the top panel's line
        each.axvline(
            step, color="darkgoldenrod", linewidth=1.2, alpha=0.8, zorder=1, label=label, gid=BEST_GID
        )
        label = "_nolegend_"



def plot_confusion_matrix(
    matrix: Any, names: Sequence[str], path: str | os.PathLike[str], title: str | None = None,
    said: checks.Said | None = None,
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
    names = [str(name) for name in names]
    n = len(names)
    if counts.ndim != 2 or counts.shape != (n, n):
        raise ValueError(f"matrix must be {n} x {n} to match the names, got shape {counts.shape}")
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

    _name_the_cells(ax, names, slanted=name_width > 0.9 * cell)  # names wider than a cell would overlap
    if n <= 40:
        _cell_counts(ax, counts, colour, cell)

    if title is None:
        total = counts.sum()
        accuracy = np.trace(counts) / total if total else math.nan
        title = f"Confusion matrix ({total:,.0f} samples, accuracy {accuracy:.3f})"
    ax.set_title(title)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, path, said, dpi=120, bbox_inches="tight")
    return path


def _name_the_cells(ax, names: list[str], slanted: bool) -> None:
    """A confusion matrix's class names along both axes (slanted where they would overlap), and thin white
    lines between its cells, which make a large matrix easier to read along a row."""
    n = len(names)
    if slanted:
        ax.set_xticks(np.arange(n), labels=names, rotation=45, ha="right", rotation_mode="anchor", fontsize=9)
    else:
        ax.set_xticks(np.arange(n), labels=names, fontsize=9)
    ax.set_yticks(np.arange(n), labels=names, fontsize=9)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    ax.set_xticks(np.arange(n + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)


def _cell_counts(ax, counts: np.ndarray, colour: np.ndarray, cell: float) -> None:
    """The count in each cell of a confusion matrix, in a size that fits the cell, white on dark cells."""
    n = len(counts)
    is_integer = np.issubdtype(counts.dtype, np.integer) or bool(np.all(counts == np.round(counts)))
    texts = [[f"{int(v)}" if is_integer else f"{v:.2g}" for v in row] for row in counts.tolist()]
    widest = max((len(text) for row in texts for text in row), default=1)
    # A cell is cell*72 pt wide; a digit is ~0.6 of the font size.
    fontsize = float(np.clip(0.8 * cell * 72 / (0.6 * max(widest, 2)), 5, 12))
    for i in range(n):
        for j in range(n):
            ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=fontsize,
                    color="white" if colour[i, j] > 0.5 else "black")  # fmt: skip


def _save(fig, path: Path, said: checks.Said | None = None, **kwargs: Any) -> None:
    """fig.savefig, with matplotlib's one warning per missing glyph (a run or class name in a script its
    font lacks: CJK, emoji) said as one line."""
    path = Path(path)
    # Written under a temporary name, then renamed: a full disk leaves no empty or half picture behind.
    staged = path if path.name.startswith(".tmp-") else path.with_name(f".tmp-{path.name}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # The format from the picture's own name: the staged name's suffix is not read (with none,
            # matplotlib would add ".png" to the staged name and the rename would miss it).
            kind = kwargs.pop("format", None) or path.suffix[1:].lower() or "png"
            if kind in ("jpg", "jpeg"):  # a JPEG names no drawing program: a comment, for tools.picture_not_ours
                kwargs.setdefault("pil_kwargs", {"comment": b"drawn with matplotlib"})
            fig.savefig(staged, format=kind, **kwargs)
            os.replace(staged, path)
        except OSError as e:
            staged.unlink(missing_ok=True)
            if e.filename is None:  # a failed write() names no file: the line names the picture
                e.filename = str(path)
            raise
    missing = [w for w in caught if "missing from font" in str(w.message)]
    for w in caught:
        if w not in missing:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    name = Path(path).name.removeprefix(".tmp-")  # written under a temporary name, then renamed
    checks.gate(tools.GLYPHS, name, len(missing), said=said if said is not None else checks.Said())


def _check_metrics_file(metrics: Path) -> None:
    """What `python -m finetune.plots` is given must be a metrics.jsonl with records: else one line."""
    checks.gate(tools.METRICS_FILE, metrics)
    try:
        train, evals = read_metrics(metrics)
    except (UnicodeDecodeError, OSError) as e:
        raise checks.explain(tools.METRICS_UNREADABLE, metrics, e) from None
    if not train and not evals:  # not a run's log at all, or one without a record yet
        raise checks.explain(tools.NO_RECORDS, metrics)


def _check_png(out: Path) -> None:
    """The picture's path: not a folder, not under a file, a format matplotlib writes, not in a folder a run
    replaces, not a file of the user's."""
    checks.gate(tools.PICTURE, out)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    """`python -m finetune.plots <metrics.jsonl> [<out.png>]`: a mistake is one `error:` line, exit 2."""
    parser = ArgumentParser(prog="python -m finetune.plots", description=__doc__, hint="python -m finetune.plots --help")
    parser.add_argument("metrics", metavar=METRICS_LOG, help=f"a run's {METRICS_LOG} (also while it runs)")
    parser.add_argument("out", metavar="out.png", nargs="?", help="the picture (default: training_curves.png beside it)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    metrics = Path(args.metrics).expanduser()
    out = Path(args.out).expanduser() if args.out else RunDir(metrics.parent).curves
    if not out.suffix and not out.is_dir():  # as matplotlib names it: a PNG with its extension
        out = out.with_name(out.name + ".png")
    _check_metrics_file(metrics)
    _check_png(out)
    print(plot_training_curves(metrics, out))


if __name__ == "__main__":
    main()
