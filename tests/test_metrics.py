"""Tests for finetune/metrics.py: hand-computed values, scikit-learn as a reference, the metric table
(what `learned` and the config read from it), the plot.

python -m pytest tests/test_metrics.py -q
"""

import dataclasses
import json
import warnings

import numpy as np
import pytest
import sklearn.metrics as sklearn_metrics
import torch

from finetune.config import TrainConfig
from finetune.metrics import (
    BASELINE_RULES,
    CORRELATION,
    METRICS,
    MULTI,
    PROBLEMS,
    Metric,
    classification_report,
    learned,
    tune_thresholds,
)
from finetune.plots import plot_confusion_matrix
from finetune.problems import problem_of

# A fixed set worked out by hand: 10 samples, 3 classes, "bird" (2) is never predicted.
NAMES = ["cat", "dog", "bird"]
REFERENCES = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
PREDICTIONS = [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
# [true][pred]: cat -> 0,0,0,1; dog -> 1,1,0; bird -> 0,1,1
MATRIX = [[3, 1, 0], [1, 2, 0], [1, 2, 0]]
# predicted per class (column sums) = [5, 5, 0]; support (row sums) = [4, 3, 3]
ACCURACY = 0.5  # (3 + 2 + 0) / 10
PRECISION = [0.6, 0.4, 0.0]  # 3/5, 2/5, 0/0 -> 0.0 by our zero-division rule
RECALL = [0.75, 2 / 3, 0.0]  # 3/4, 2/3, 0/3
F1 = [2 / 3, 0.5, 0.0]  # 2TP/(predicted + support): 6/9, 4/8, 0/3
MACRO_PRECISION = 1 / 3  # (0.6 + 0.4 + 0) / 3
MACRO_RECALL = 17 / 36  # (3/4 + 2/3 + 0) / 3 = (17/12) / 3
MACRO_F1 = 7 / 18  # (2/3 + 1/2 + 0) / 3 = (7/6) / 3


def test_classification_report_matches_hand_computed_values():
    """Pins the report's exact keys, in order: a metric added to classification_report changes this
    list too (docs/development.md, "A metric", says so)."""
    report = classification_report(PREDICTIONS, REFERENCES, NAMES)
    assert list(report) == [
        "num_samples",
        "accuracy",
        "macro_precision",
        "macro_recall",
        "macro_f1",
        "per_class",
        "confusion_matrix",
    ]
    assert report["num_samples"] == 10
    assert report["accuracy"] == pytest.approx(ACCURACY)
    assert report["macro_precision"] == pytest.approx(MACRO_PRECISION)
    assert report["macro_recall"] == pytest.approx(MACRO_RECALL)
    assert report["macro_f1"] == pytest.approx(MACRO_F1)
    assert report["confusion_matrix"] == MATRIX
    assert list(report["per_class"]) == NAMES
    for i, name in enumerate(NAMES):
        row = report["per_class"][name]
        assert list(row) == ["precision", "recall", "f1", "support"]
        assert row["precision"] == pytest.approx(PRECISION[i])
        assert row["recall"] == pytest.approx(RECALL[i])
        assert row["f1"] == pytest.approx(F1[i])
        assert row["support"] == [4, 3, 3][i]


def test_confusion_matrix_rows_are_true_labels():
    # one cat predicted as dog, two dogs right: row = true class, column = predicted class
    report = classification_report([1, 1, 1], [0, 1, 1], ["cat", "dog"])
    assert report["confusion_matrix"] == [[0, 1], [0, 2]]
    assert report["per_class"]["cat"]["support"] == 1  # support is a row sum
    assert report["per_class"]["dog"]["precision"] == pytest.approx(2 / 3)  # a column: 2 of 3 predicted


def test_classification_report_keeps_classes_absent_from_the_data():
    report = classification_report(PREDICTIONS, REFERENCES, [*NAMES, "fish"])
    assert report["confusion_matrix"] == [[*row, 0] for row in MATRIX] + [[0, 0, 0, 0]]
    assert report["per_class"]["fish"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    # fish counts as 0.0 in the macro averages: the sums above over 4 classes instead of 3
    assert report["macro_precision"] == pytest.approx(1.0 / 4)  # (0.6 + 0.4 + 0 + 0) / 4
    assert report["macro_recall"] == pytest.approx(17 / 48)  # (3/4 + 2/3 + 0 + 0) / 4
    assert report["macro_f1"] == pytest.approx(7 / 24)  # (2/3 + 1/2 + 0 + 0) / 4
    assert report["accuracy"] == pytest.approx(ACCURACY)  # unchanged by an empty class


def test_a_class_predicted_but_absent_from_the_references_scores_zero():
    # "c" is predicted once and never true: TP = 0, FP = 1, FN = 0. Its recall is 0/0, which is 0.0
    # (not 1.0, as zero_division=1 would give), so it pulls the macro recall down.
    report = classification_report([0, 2, 1, 1], [0, 0, 1, 1], ["a", "b", "c"])
    assert report["per_class"]["a"] == {
        "precision": 1.0,
        "recall": 0.5,
        "f1": pytest.approx(2 / 3),
        "support": 2,
    }
    assert report["per_class"]["b"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}
    assert report["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert report["macro_precision"] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3
    assert report["macro_recall"] == pytest.approx(0.5)  # (0.5 + 1 + 0) / 3
    assert report["macro_f1"] == pytest.approx(5 / 9)  # (2/3 + 1 + 0) / 3
    assert report["confusion_matrix"] == [[1, 0, 1], [0, 2, 0], [0, 0, 0]]


def test_no_samples_give_zeros_and_one_class_gives_no_warning():
    report = classification_report([], [], ["a", "b"])
    assert report["num_samples"] == 0
    assert report["accuracy"] == report["macro_f1"] == 0.0
    assert report["confusion_matrix"] == [[0, 0], [0, 0]]
    assert report["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sklearn warns of a 1 x 1 confusion matrix unless silenced
        report = classification_report([0, 0], [0, 0], ["only"])
    assert report["confusion_matrix"] == [[2]]
    assert report["macro_f1"] == 1.0


def test_classification_report_accepts_torch_and_is_json_serialisable():
    torch = pytest.importorskip("torch")

    report = classification_report(torch.tensor(PREDICTIONS), torch.tensor(REFERENCES), NAMES)
    assert json.loads(json.dumps(report)) == report
    assert report == classification_report(PREDICTIONS, REFERENCES, NAMES)
    assert type(report["num_samples"]) is int and type(report["accuracy"]) is float
    assert type(report["per_class"]["cat"]["support"]) is int
    assert type(report["confusion_matrix"][0][0]) is int


@pytest.mark.parametrize(
    ("predictions", "references", "names", "message"),
    [
        ([0, 3], [0, 1], NAMES, r"predictions contain class ids \[3\]"),
        ([0, 1], [0, -1], NAMES, r"references contain class ids \[-1\]"),
        ([0, 1, 1], [0, 1], NAMES, "differ in length"),
        ([0.5, 1.0], [0, 1], NAMES, "integer class ids"),
        ([[0, 1]], [[0, 1]], NAMES, "1-D"),
        ([0, 1], [0, 1], ["a", "a"], "unique"),
    ],
)
def test_classification_report_rejects_bad_input(predictions, references, names, message):
    # sklearn would drop an id outside `labels` silently; here it is a label-mapping mismatch
    with pytest.raises(ValueError, match=message):
        classification_report(predictions, references, names)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_scikit_learn_on_random_data(seed):
    rng = np.random.default_rng(seed)
    num_labels = 6  # class 5 never occurs below: absent classes must agree too
    references = rng.integers(0, 5, 300)
    predictions = np.where(rng.random(300) < 0.6, references, rng.integers(0, 5, 300))
    predictions[predictions == 4] = 3  # and class 4 is never predicted
    names = [f"class {i}" for i in range(num_labels)]
    labels = list(range(num_labels))

    report = classification_report(predictions, references, names)
    precision, recall, f1, support = sklearn_metrics.precision_recall_fscore_support(
        references, predictions, labels=labels, zero_division=0
    )
    assert report["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(references, predictions))
    assert (
        report["confusion_matrix"]
        == sklearn_metrics.confusion_matrix(references, predictions, labels=labels).tolist()
    )
    np.testing.assert_allclose([report["per_class"][n]["precision"] for n in names], precision)
    np.testing.assert_allclose([report["per_class"][n]["recall"] for n in names], recall)
    np.testing.assert_allclose([report["per_class"][n]["f1"] for n in names], f1)
    assert [report["per_class"][n]["support"] for n in names] == support.tolist()
    for key, function in [
        ("macro_precision", sklearn_metrics.precision_score),
        ("macro_recall", sklearn_metrics.recall_score),
        ("macro_f1", sklearn_metrics.f1_score),
    ]:
        expected = function(references, predictions, labels=labels, average="macro", zero_division=0)
        assert report[key] == pytest.approx(expected)


@pytest.mark.parametrize(
    "names",
    [
        ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"]
        + ["Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
        ["negative", "positive"],
    ],
)
def test_plot_confusion_matrix_writes_a_png(names, tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    references = rng.integers(0, len(names), 500)
    predictions = np.where(rng.random(500) < 0.8, references, rng.integers(0, len(names), 500))
    matrix = classification_report(predictions, references, names)["confusion_matrix"]

    path = plot_confusion_matrix(matrix, names, tmp_path / "plots" / "confusion_matrix.png")

    assert path == tmp_path / "plots" / "confusion_matrix.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
    with image_module.open(path) as image:
        image.verify()
        assert min(image.size) > 300


def test_plot_confusion_matrix_draws_counts_coloured_by_true_class(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    figures = []
    savefig = Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda self, *a, **k: (figures.append(self), savefig(self, *a, **k))
    )
    # rows are true labels; "bird" never occurs (a zero row must colour as 0, not NaN)
    plot_confusion_matrix([[3, 1, 0], [2, 2, 0], [0, 0, 0]], NAMES, tmp_path / "cm.png")

    (ax, _colorbar) = figures[0].axes
    assert ax.get_ylabel() == "true label" and ax.get_xlabel() == "predicted label"
    assert [t.get_text() for t in ax.get_yticklabels()] == NAMES
    colour = np.asarray(ax.images[0].get_array())
    np.testing.assert_allclose(colour, [[0.75, 0.25, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    cells = {(t.get_position(), t.get_text()) for t in ax.texts}
    # text at (x, y) = (predicted, true): the 2 dogs called cats sit in row 1, column 0
    assert {((0, 0), "3"), ((1, 0), "1"), ((0, 1), "2"), ((2, 2), "0")} <= cells
    assert ax.get_title() == "Confusion matrix (8 samples, accuracy 0.625)"  # 5 / 8


def test_plot_confusion_matrix_rejects_a_mismatched_matrix(tmp_path):
    with pytest.raises(ValueError, match="3 x 3"):
        plot_confusion_matrix([[1, 0], [0, 1]], NAMES, tmp_path / "cm.png")


# --- the metric table: a new metric is one row --------------------------------------------------


def test_every_reported_metric_has_a_row_and_a_verdict():
    """Each problem's metrics are rows of METRICS, and `learned` judges each by its row alone."""
    for problem, chosen in PROBLEMS.items():
        assert set(chosen.shown) | set(chosen.headline) <= set(chosen.reported), problem
        for key in chosen.reported:
            metric = METRICS[key]
            assert metric.baseline_rule in BASELINE_RULES
            better, worse = (0.9, 0.01) if metric.greater_is_better else (0.1, 0.9)
            assert (
                learned(key, better, 0.5 if metric.baseline_rule != CORRELATION else None, 10_000) is True
            ), key
            assert learned(key, worse, 0.5, 10_000) is False, key
            assert learned(key, None, 0.5, 100) is None and learned(key, better, 0.5, 0) is None


def test_learned_reads_direction_and_rule_from_the_table(monkeypatch):
    """No metric name in `learned`: a new row is judged by its own greater_is_better and rule."""
    monkeypatch.setitem(METRICS, "toy_error", Metric("toy_error", "toy error", greater_is_better=False))
    monkeypatch.setitem(METRICS, "toy_rate", Metric("toy_rate", "toy rate"))
    monkeypatch.setitem(METRICS, "toy_r", Metric("toy_r", "toy r", baseline_rule=CORRELATION))
    assert learned("toy_error", 0.8, 1.0, 100) is True and learned("toy_error", 0.95, 1.0, 100) is False
    assert learned("toy_rate", 0.56, 0.50, 1000) is True and learned("toy_rate", 0.52, 0.50, 1000) is False
    assert learned("toy_r", 0.5, None, 100) is True and learned("toy_r", 0.1, None, 100) is False
    assert learned("toy_rate", 0.9, None, 100) is None  # a rate needs the baseline's
    # and an existing row whose direction flips is judged the other way, with no code changed
    monkeypatch.setitem(METRICS, "accuracy", Metric("accuracy", "accuracy", greater_is_better=False))
    assert learned("accuracy", 0.4, 0.5, 1000) is True
    assert not set(METRICS) & set(learned.__code__.co_consts)  # no metric's key spelled in the rule


def test_a_row_with_an_unknown_baseline_rule_is_refused():
    with pytest.raises(ValueError, match="baseline_rule must be one of"):
        Metric("toy", "toy", baseline_rule="corelation")


def test_the_greater_is_better_help_is_built_from_the_table():
    (field,) = [f for f in dataclasses.fields(TrainConfig) if f.name == "greater_is_better"]
    lower = [key for key, metric in METRICS.items() if not metric.greater_is_better]
    assert lower and f"lower is better for {', '.join(lower)})" in field.metadata["help"]


def test_learned_needs_a_margin_above_the_baseline():
    assert learned("accuracy", 0.56, 0.50, 1000) is True  # 2 standard errors: 0.032
    assert learned("accuracy", 0.52, 0.50, 1000) is False
    assert learned("accuracy", 0.60, 0.50, 30) is False  # 2 standard errors of 30 samples: 0.18
    assert learned("pearson", 0.5, None, 100) is True and learned("pearson", 0.1, None, 100) is False
    assert learned("mse", 0.8, 1.0, 100) is True and learned("mse", 0.95, 1.0, 100) is False
    assert learned("accuracy", None, 0.5, 100) is None
    # a constant predictor scores 1.0 on one sample: fewer than FEWEST_TO_JUDGE samples get no verdict
    assert learned("accuracy", 1.0, 0.0, 1) is None and learned("accuracy", 1.0, 0.0, 10) is True


def test_thresholds_are_tuned_on_predictions_global_or_per_label():
    probabilities = torch.tensor([[0.30, 0.9], [0.35, 0.1], [0.10, 0.8], [0.05, 0.2]])
    references = torch.tensor([[1, 1], [1, 0], [0, 1], [0, 0]])
    per_label = tune_thresholds(probabilities, references, per_label=True)
    assert 0.10 < per_label[0] <= 0.30 and 0.2 < per_label[1] <= 0.8
    assert len(set(tune_thresholds(probabilities, references, per_label=False))) == 1


def test_a_multi_label_baseline_is_the_best_constant_label_set():
    """Random label sets of 1-2 of 4 labels: their prior at 0.5 predicts nothing (micro F1 0), but every
    label for every sample scores about 0.55, and a model that learned nothing gets there with a tuned
    threshold. The baseline is the best constant set, metric by metric; 0.565 does not beat it."""
    rng = np.random.default_rng(0)
    references = np.zeros((400, 4), dtype=np.float32)
    for row in references:
        row[rng.choice(4, size=rng.integers(1, 3), replace=False)] = 1
    prior = torch.as_tensor(references.mean(0))
    assert prior.max() < 0.5
    baseline = problem_of(MULTI).baseline(prior, torch.as_tensor(references), list("abcd"))
    every = sklearn_metrics.f1_score(references, np.ones_like(references), average="micro")
    assert baseline["micro_f1"] == pytest.approx(max(every, baseline["micro_f1"])) and baseline["micro_f1"] >= every > 0.5
    assert baseline["micro_recall"] == 1.0  # every label: a recall no model beats
    assert learned("micro_f1", 0.565, baseline["micro_f1"], 400) is False
    assert learned("micro_f1", 0.75, baseline["micro_f1"], 400) is True
