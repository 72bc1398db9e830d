"""Tests for finetune/metrics.py: hand-computed values, evaluate's API offline, the plot.

python -m pytest tests/test_metrics.py -q
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before evaluate/huggingface_hub read it: a download must fail loudly

import evaluate
import numpy as np
import pytest

from finetune.metrics import (
    LOCAL_METRICS,
    MetricError,
    classification_report,
    load_metric,
    plot_confusion_matrix,
)

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


def _load(name: str, tmp_path, **kwargs):
    # cache_dir keeps evaluate's (empty, keep_in_memory) metric folders out of ~/.cache.
    return load_metric(name, cache_dir=str(tmp_path), **kwargs)


def test_classification_report_matches_hand_computed_values():
    report = classification_report(PREDICTIONS, REFERENCES, NAMES)
    assert report["num_samples"] == 10
    assert report["accuracy"] == pytest.approx(ACCURACY)
    assert report["macro_precision"] == pytest.approx(MACRO_PRECISION)
    assert report["macro_recall"] == pytest.approx(MACRO_RECALL)
    assert report["macro_f1"] == pytest.approx(MACRO_F1)
    assert report["confusion_matrix"] == MATRIX
    assert list(report["per_class"]) == NAMES
    for i, name in enumerate(NAMES):
        row = report["per_class"][name]
        assert row["precision"] == pytest.approx(PRECISION[i])
        assert row["recall"] == pytest.approx(RECALL[i])
        assert row["f1"] == pytest.approx(F1[i])
        assert row["support"] == [4, 3, 3][i]


def test_classification_report_keeps_classes_absent_from_the_data():
    report = classification_report(PREDICTIONS, REFERENCES, [*NAMES, "fish"])
    assert report["confusion_matrix"] == [[*row, 0] for row in MATRIX] + [[0, 0, 0, 0]]
    assert report["per_class"]["fish"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    # fish counts as 0.0 in the macro averages: the sums above over 4 classes instead of 3
    assert report["macro_precision"] == pytest.approx(1.0 / 4)  # (0.6 + 0.4 + 0 + 0) / 4
    assert report["macro_f1"] == pytest.approx(7 / 24)  # (2/3 + 1/2 + 0 + 0) / 4


def test_classification_report_accepts_torch_and_is_json_serialisable():
    torch = pytest.importorskip("torch")
    import json

    report = classification_report(torch.tensor(PREDICTIONS), torch.tensor(REFERENCES), NAMES)
    assert json.loads(json.dumps(report)) == report


@pytest.mark.parametrize(
    ("predictions", "references", "names", "message"),
    [
        ([0, 3], [0, 1], NAMES, r"class ids \[3\]"),
        ([0, 1, 1], [0, 1], NAMES, "differ in length"),
        ([0.5, 1.0], [0, 1], NAMES, "integer class ids"),
        ([0, 1], [0, 1], ["a", "a"], "unique"),
    ],
)
def test_classification_report_rejects_bad_input(predictions, references, names, message):
    with pytest.raises(ValueError, match=message):
        classification_report(predictions, references, names)


def test_local_metrics_match_hand_computed_values(tmp_path):
    assert _load("accuracy", tmp_path).compute(predictions=PREDICTIONS, references=REFERENCES) == {
        "accuracy": pytest.approx(ACCURACY)
    }
    for name, per_class, macro in [
        ("precision", PRECISION, MACRO_PRECISION),
        ("recall", RECALL, MACRO_RECALL),
        ("f1", F1, MACRO_F1),
    ]:
        metric = _load(name, tmp_path)
        result = metric.compute(predictions=PREDICTIONS, references=REFERENCES, average="macro")
        assert result == {name: pytest.approx(macro)}
        result = metric.compute(predictions=PREDICTIONS, references=REFERENCES, average=None)
        np.testing.assert_allclose(result[name], per_class)
    matrix = _load("confusion_matrix", tmp_path).compute(predictions=PREDICTIONS, references=REFERENCES)
    np.testing.assert_array_equal(matrix["confusion_matrix"], MATRIX)
    report = _load("classification", tmp_path, label_names=NAMES).compute(
        predictions=PREDICTIONS, references=REFERENCES
    )
    assert report == classification_report(PREDICTIONS, REFERENCES, NAMES)


def test_binary_defaults_follow_the_hub_metrics(tmp_path):
    # references [0, 1, 1, 0, 1], predictions [0, 1, 0, 1, 1]: TP = 2, FP = 1, FN = 1 for class 1
    kwargs = {"predictions": [0, 1, 0, 1, 1], "references": [0, 1, 1, 0, 1]}
    assert _load("precision", tmp_path).compute(**kwargs) == {"precision": pytest.approx(2 / 3)}
    assert _load("recall", tmp_path).compute(**kwargs) == {"recall": pytest.approx(2 / 3)}
    assert _load("f1", tmp_path).compute(**kwargs) == {"f1": pytest.approx(2 / 3)}  # 4 / (4 + 1 + 1)
    with pytest.raises(ValueError, match="average='binary'"):
        _load("f1", tmp_path).compute(predictions=PREDICTIONS, references=REFERENCES)


@pytest.mark.parametrize(
    ("name", "compute_kwargs"),
    [
        ("accuracy", {}),
        ("precision", {"average": "macro"}),
        ("recall", {"average": "weighted"}),
        ("f1", {"average": "micro"}),
        ("confusion_matrix", {}),
        ("classification", {"label_names": NAMES}),
    ],
)
def test_add_batch_twice_then_compute_equals_one_shot(name, compute_kwargs, tmp_path):
    metric = _load(name, tmp_path)
    assert isinstance(metric, evaluate.Metric)
    assert metric.name == name
    metric.add_batch(predictions=PREDICTIONS[:4], references=REFERENCES[:4])
    metric.add_batch(predictions=np.array(PREDICTIONS[4:]), references=np.array(REFERENCES[4:]))
    batched = metric.compute(**compute_kwargs)
    one_shot = _load(name, tmp_path).compute(predictions=PREDICTIONS, references=REFERENCES, **compute_kwargs)
    if name == "confusion_matrix":
        np.testing.assert_array_equal(batched["confusion_matrix"], one_shot["confusion_matrix"])
    else:
        assert batched == one_shot


def test_evaluate_combine_accepts_local_metrics(tmp_path):
    # combine passes every compute kwarg to every metric (so, as with the Hub metrics, `average`
    # cannot go to accuracy and f1 at once): binary data and the defaults.
    combined = evaluate.combine([_load(name, tmp_path) for name in ["accuracy", "precision", "recall", "f1"]])
    combined.add_batch(predictions=[0, 1, 0], references=[0, 1, 1])
    combined.add_batch(predictions=[1, 1], references=[0, 1])
    # class 1: TP = 2, FP = 1, FN = 1; correct 3 of 5
    assert combined.compute() == pytest.approx(
        {"accuracy": 0.6, "precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3}
    )


def test_unknown_hub_metric_offline_is_a_one_line_metric_error(tmp_path):
    with pytest.raises(MetricError) as caught:
        _load("finetune-test-no-such-metric", tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert "network" in message
    for name in LOCAL_METRICS:
        assert name in message
    assert isinstance(caught.value, ValueError)


def test_hub_metric_missing_a_package_is_a_one_line_metric_error(monkeypatch):
    def fake_load(name, **kwargs):
        raise ImportError("To be able to use evaluate-metric/x, you need to install:\nscikit-learn\n")

    monkeypatch.setattr(evaluate, "load", fake_load)
    with pytest.raises(MetricError, match="not installed") as caught:
        load_metric("x")
    assert "\n" not in str(caught.value)


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


def test_plot_confusion_matrix_rejects_a_mismatched_matrix(tmp_path):
    with pytest.raises(ValueError, match="3 x 3"):
        plot_confusion_matrix([[1, 0], [0, 1]], NAMES, tmp_path / "cm.png")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_scikit_learn_on_random_data(seed, tmp_path):
    # scikit-learn is not a dependency; where it is installed it is an independent reference.
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    num_labels = 6  # class 5 never occurs below: absent classes must agree too
    references = rng.integers(0, 5, 300)
    predictions = np.where(rng.random(300) < 0.6, references, rng.integers(0, 5, 300))
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
    assert report["macro_precision"] == pytest.approx(precision.mean())
    assert report["macro_recall"] == pytest.approx(recall.mean())
    assert report["macro_f1"] == pytest.approx(f1.mean())

    weights = rng.random(300)
    sklearn_functions = {
        "precision": sklearn_metrics.precision_score,
        "recall": sklearn_metrics.recall_score,
        "f1": sklearn_metrics.f1_score,
    }
    for name, function in sklearn_functions.items():
        metric = _load(name, tmp_path)
        for average in ["micro", "macro", "weighted", None]:
            for sample_weight in [None, weights]:
                ours = metric.compute(
                    predictions=predictions,
                    references=references,
                    average=average,
                    sample_weight=sample_weight,
                    zero_division=0,
                )[name]
                theirs = function(
                    references,
                    predictions,
                    average=average,
                    sample_weight=sample_weight,
                    zero_division=0,
                )
                np.testing.assert_allclose(ours, theirs, err_msg=f"{name} average={average}")
        binary = predictions % 2, references % 2
        assert metric.compute(predictions=binary[0], references=binary[1])[name] == pytest.approx(
            function(binary[1], binary[0])
        )
    accuracy = _load("accuracy", tmp_path).compute(
        predictions=predictions, references=references, sample_weight=weights
    )
    assert accuracy["accuracy"] == pytest.approx(
        sklearn_metrics.accuracy_score(references, predictions, sample_weight=weights)
    )
    matrix = _load("confusion_matrix", tmp_path).compute(
        predictions=predictions, references=references, normalize="true"
    )
    np.testing.assert_allclose(
        matrix["confusion_matrix"],
        sklearn_metrics.confusion_matrix(references, predictions, normalize="true"),
    )
