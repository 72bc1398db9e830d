"""finetune/plots.py: the training curves, from a real tiny run (the factory's two-epoch run) and from
hand-written metrics.jsonl files.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_plots.py
"""

from __future__ import annotations

import json

import pytest
from conftest import user_error
from PIL import Image

from finetune import checks
from finetune.plots import BEST_GID, main, plot_training_curves, read_metrics, training_curves_figure

# --- plots -------------------------------------------------------------------------------------------


def test_training_curves_png_of_a_real_run(two_epoch_run):
    out, _ = two_epoch_run
    png = plot_training_curves(out / "metrics.jsonl", out / "curves" / "training_curves.png")
    assert png == out / "curves" / "training_curves.png"
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 600 and image.height > 600
    fig = training_curves_figure(out / "metrics.jsonl")
    loss_ax, metrics_ax, lr_ax = fig.axes
    labels = [line.get_label() for line in loss_ax.get_lines()]
    assert labels[:2] == ["training loss", "validation loss"]
    assert [line.get_label() for line in metrics_ax.get_lines()][:2] == [
        "validation accuracy",
        "validation macro F1",
    ]
    assert lr_ax.get_xlabel() == "optimizer step"
    steps = list(lr_ax.get_lines()[0].get_xdata())
    assert steps == list(range(1, 11))  # logging_steps=1: every optimizer step
    assert loss_ax.get_yscale() == "linear"  # the loss moved by less than 10x


def _series_lines(ax):
    """The data lines of a panel: not the best checkpoint's marks, not the epoch boundaries."""
    return [
        line for line in ax.get_lines() if line.get_gid() != BEST_GID and not line.get_label().startswith("_")
    ]


def test_every_curve_is_distinct_named_and_the_best_checkpoint_marked(two_epoch_run):
    out, results = two_epoch_run
    best = results["best"]
    assert best["metric"] == "accuracy" and best["step"] in (5, 10)
    # As the run wrote it: export_run draws before results.json exists, so the best comes from the
    # newest checkpoint's manifest; drawn again now, from results.json. Both must mark it.
    (out / "results.json").rename(out / "results.json.away")
    try:
        during = training_curves_figure(out / "metrics.jsonl")
    finally:
        (out / "results.json.away").rename(out / "results.json")
    for fig in (during, training_curves_figure(out / "metrics.jsonl")):
        loss_ax, metrics_ax, lr_ax = fig.axes
        lines = [line for ax in fig.axes for line in _series_lines(ax)]
        assert [line.get_label() for line in lines] == [
            "training loss",
            "validation loss",
            "validation accuracy",
            "validation macro F1",
            "learning rate",
        ]
        # A colour each; within a panel, also a line style and a marker each: accuracy and macro F1
        # may coincide, and must still be told apart without colour.
        assert len({line.get_color() for line in lines}) == len(lines)
        for ax in (loss_ax, metrics_ax):
            for attribute in ("get_linestyle", "get_marker"):
                styles = [getattr(line, attribute)() for line in _series_lines(ax)]
                assert len(set(styles)) == len(styles) == 2, attribute
        accuracy, macro_f1 = _series_lines(metrics_ax)
        assert macro_f1.get_markerfacecolor() == "none"  # hollow: a point beneath it stays visible
        assert accuracy.get_linewidth() > macro_f1.get_linewidth()  # wider, beneath: shows around it
        # A legend with every series of the panel, and the best checkpoint's star on accuracy.
        for ax in (loss_ax, metrics_ax):
            legend = [text.get_text() for text in ax.get_legend().get_texts()]
            assert [line.get_label() for line in _series_lines(ax)] == legend[: len(_series_lines(ax))]
        legend = [text.get_text() for text in metrics_ax.get_legend().get_texts()]
        assert legend[-1] == f"best checkpoint: step {best['step']}, accuracy {best['value']:.4g}"
        (star,) = [line for line in metrics_ax.get_lines() if line.get_marker() == "*"]
        assert star.get_gid() == BEST_GID
        assert list(star.get_xdata()) == [best["step"]] and list(star.get_ydata()) == [best["value"]]
        step_of_accuracy = dict(zip(accuracy.get_xdata(), accuracy.get_ydata(), strict=True))
        assert step_of_accuracy[best["step"]] == best["value"]  # on the curve, where it was chosen
        for ax in fig.axes:  # and a vertical line through every panel at that step
            verticals = [line for line in ax.get_lines() if line.get_gid() == BEST_GID and line is not star]
            assert [list(line.get_xdata()) for line in verticals] == [[best["step"], best["step"]]]


def test_best_checkpoint_by_loss_or_an_undrawn_metric_and_none(tmp_path):
    lines = [json.dumps({"step": s, "epoch": 0, "loss": 1.0 / s, "learning_rate": 1e-4}) for s in range(1, 7)]
    for s, accuracy, loss in ((2, 0.6, 0.5), (4, 0.7, 0.4), (6, 0.65, 0.45)):
        lines.append(json.dumps({"step": s, "epoch": 0, "eval_accuracy": accuracy, "eval_loss": loss}))
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines))

    def marks(fig):  # (panel, marker, steps) of the best checkpoint's artists
        found = []
        for panel, ax in enumerate(fig.axes):
            best = [line for line in ax.get_lines() if line.get_gid() == BEST_GID]
            found += [(panel, line.get_marker(), list(line.get_xdata())) for line in best]
        return found

    loss_best = training_curves_figure(path, best={"metric": "loss", "value": 0.4, "step": 4})
    assert (0, "*", [4]) in marks(loss_best)  # the star on the loss panel, at validation loss 0.4
    assert "best checkpoint: step 4, loss 0.4" in [
        t.get_text() for t in loss_best.axes[0].get_legend().get_texts()
    ]
    undrawn = training_curves_figure(path, best={"metric": "macro_recall", "value": 0.7, "step": 6})
    assert [m for m in marks(undrawn) if m[1] == "*"] == []  # no curve to put a star on: the line only
    assert "best checkpoint: step 6, macro recall 0.7" in [
        t.get_text() for t in undrawn.axes[0].get_legend().get_texts()
    ]
    assert marks(training_curves_figure(path)) == []  # no results.json, no checkpoint: nothing to mark
    assert marks(training_curves_figure(path, best={})) == []


def test_resumed_steps_torn_lines_and_log_scale(tmp_path):
    lines = [
        json.dumps({"step": s, "epoch": 0, "loss": 2.0 / s, "learning_rate": 1e-4}) for s in range(1, 31)
    ]
    lines.append(json.dumps({"step": 20, "epoch": 0, "loss": 0.05, "learning_rate": 1e-4}))  # resumed: wins
    lines.append(json.dumps({"step": 30, "epoch": 0, "eval_accuracy": 0.9, "eval_loss": 0.1}))
    lines.append('{"step": 31, "epo')  # killed while writing
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines))
    train, evals = read_metrics(path)
    assert [r["step"] for r in train] == list(range(1, 31)) and train[19]["loss"] == 0.05
    assert [r["step"] for r in evals] == [30]
    fig = training_curves_figure(path)
    assert fig.axes[0].get_yscale() == "log"  # 2.0 down to 0.05: more than 10x
    assert plot_training_curves(path, tmp_path / "deep" / "curves.png").is_file()


def test_no_records_is_a_clear_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match="holds no training or evaluation records"):
        plot_training_curves(path, tmp_path / "x.png")


def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path, capsys):
    """`python -m finetune.plots <file>`, documented for redrawing mid-run: a run just started (an empty
    log), a missing file, a folder, a line that is no record: one `error:` line, exit 2, nothing written."""
    empty = tmp_path / "empty" / "metrics.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    user_error(capsys, main, [str(empty)], "holds no training or evaluation records yet", untouched=tmp_path,
               rule="tools.no_records_yet")  # fmt: skip
    user_error(capsys, main, [str(tmp_path / "missing.jsonl")], "does not exist", untouched=tmp_path,
               rule="tools.metrics_not_found")  # fmt: skip
    user_error(capsys, main, [str(empty.parent)], "is a folder", "did you mean", untouched=tmp_path,
               rule="tools.metrics_is_a_folder")  # fmt: skip
    evaluation = tmp_path / "metrics.json"  # evaluate_checkpoint.py's output, given by mistake
    evaluation.write_text(json.dumps({"accuracy": 0.8, "num_samples": 10}, indent=2))
    user_error(capsys, main, [str(evaluation)], "is not a run's metrics.jsonl (it is one JSON document over many "
               "lines, such as an evaluation's metrics.json", untouched=tmp_path, rule="tools.not_a_metrics_log")  # fmt: skip
    listed = tmp_path / "list.jsonl"
    listed.write_text("[1,2]\n")
    user_error(capsys, main, [str(listed)], "is not a run's metrics.jsonl", untouched=tmp_path)
    listed.write_text(json.dumps({"step": 1, "epoch": 0, "loss": 0.5, "learning_rate": 1e-4}) + "\n")
    user_error(capsys, main, [str(listed), str(tmp_path)], "is a folder", untouched=tmp_path, rule="tools.picture_is_a_folder")
    user_error(capsys, main, [str(listed), str(tmp_path / "c.xyz")], "not a picture format", untouched=tmp_path,
               rule="tools.picture_format")  # fmt: skip
    user_error(capsys, main, [str(listed), str(listed / "c.png")], f"{listed} is a file, not a folder",
               untouched=tmp_path, rule="tools.picture_under_a_file")  # fmt: skip
    user_error(capsys, main, [], "required", untouched=tmp_path)
    main([str(listed), str(tmp_path / "c.png")])
    assert (tmp_path / "c.png").is_file()
    main([str(listed), str(tmp_path / "curves")])  # no extension: a PNG named as matplotlib names it
    assert Image.open(tmp_path / "curves.png").format == "PNG"
    main([str(listed), str(tmp_path / "c.JPG")])  # the format from the name's suffix, whatever its case
    assert Image.open(tmp_path / "c.JPG").format == "JPEG"
    assert not list(tmp_path.glob(".tmp-*"))
    for drawn in ("c.png", "c.JPG", "curves.png"):  # drawn again over its own picture: replaced
        main([str(listed), str(tmp_path / drawn)])
    photo = tmp_path / "photo.png"  # a picture of the user's: never written over
    Image.new("RGB", (4, 4)).save(photo)
    user_error(capsys, main, [str(listed), str(photo)], "exists and is not a picture drawn here", untouched=tmp_path,
               rule="tools.picture_not_ours")  # fmt: skip


def test_a_picture_inside_a_runs_checkpoints_or_export_is_refused(finished_run, tmp_path, capsys):
    """checkpoints/step-N/curves.png: checkpoint retention deletes the folder whole, the picture with it."""
    run = finished_run.copy(tmp_path / "run", "save_steps=1")
    step = sorted((run / "checkpoints").iterdir())[-1]
    for inside in (step / "curves.png", run / "model" / "curves.png"):
        user_error(capsys, main, [str(run / "metrics.jsonl"), str(inside)], "which the run replaces or deletes whole",
                   untouched=run, rule="tools.picture_inside_a_run")  # fmt: skip


def test_a_title_the_font_cannot_draw_is_one_warning_line(tmp_path, capsys):
    """matplotlib warns once per missing glyph (a run named in CJK or with an emoji): one line instead."""
    import warnings

    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps({"step": s, "epoch": 0, "loss": 1.0 / s, "learning_rate": 1e-4})
                              for s in range(1, 4)))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = checks.Said()
        plot_training_curves(path, tmp_path / "curves.png", title="運行 ❤ ü", said=said)
    assert not [w for w in caught if "missing from font" in str(w.message)]
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "no glyph for some characters" in warned[0]
    assert said.rules() == ["tools.missing_glyphs"]


@pytest.mark.parametrize("text, why", [
    ("text,label\ngood film,pos\n", "its first line is not a JSON record"),
    ("\n[1, 2]\n", "its first line is not a JSON record"),
    ('{"text": "good film", "label": "pos"}\n', 'its first record has no "step"'),
])  # fmt: skip
def test_a_file_that_is_no_metrics_log_is_not_told_to_wait(text, why, tmp_path, capsys):
    """A data file given for a run's log: waiting would never help, so the line says what it is not; a
    young log (empty, or its first line torn mid-write) is still "no records yet"."""
    given = tmp_path / "train.csv"
    given.write_text(text)
    line = user_error(capsys, main, [str(given)], f"{given} is not a run's metrics.jsonl ({why}",
                      "give a run's metrics.jsonl (<output_dir>/metrics.jsonl)", untouched=tmp_path,
                      rule="tools.not_a_metrics_log")  # fmt: skip
    assert "again later" not in line
    torn = tmp_path / "metrics.jsonl"
    for young in ("", "\n", '{"step": 1, "lo'):
        torn.write_text(young)
        user_error(capsys, main, [str(torn)], "holds no training or evaluation records yet", "draw it again later",
                   rule="tools.no_records_yet")  # fmt: skip


def test_a_metrics_file_that_cannot_be_read_is_one_line(tmp_path, capsys, monkeypatch):
    """Not text (a picture given for the log), or a read that fails (a failing disk): one line each."""
    import errno

    from finetune import plots

    binary = tmp_path / "metrics.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x80")
    user_error(capsys, main, [str(binary)], "is not a text file", rule="tools.metrics_not_text")

    def fail(path):
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(plots, "read_metrics", fail)
    user_error(capsys, main, [str(binary)], f"cannot read {binary}: Input/output error", rule="tools.metrics_unreadable")
