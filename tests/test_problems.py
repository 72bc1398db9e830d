"""Regression and multi-label (finetune/problems.py): inferred from the labels, trained through the real
entry point on a tiny BERT, evaluated with finetune.evaluate_checkpoint, loaded by transformers'
pipeline(); the loss per sample, the metrics against scikit-learn/scipy, and the bad labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import (
    ANIMALS,
    REPO,
    TINY_VIT,
    multi_label_rows,
    recipe_text_args,
    regression_rows,
    reset_accelerate,
    rotten_rows,
    tiny_text_args,
    user_error,
    write_csv,
    write_jsonl,
)
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from finetune import metrics, problems
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.evaluate_checkpoint import main as evaluate_main
from finetune.evaluation import forward
from finetune.problems import problem_of
from finetune.run import Hooks, main

# --- the loss and the metrics ----------------------------------------------------------------------


def test_per_sample_losses_average_to_transformers_losses():
    """Masked and scaled per sample by run.py, their mean is the loss transformers computes itself."""
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(6, 1, generator=g), torch.randn(6, generator=g)
    mse = problem_of(problems.REGRESSION).loss(logits, targets)
    assert mse.shape == (6,)
    assert torch.allclose(mse.mean(), torch.nn.MSELoss()(logits.squeeze(-1), targets))
    logits, hot = torch.randn(6, 4, generator=g), (torch.rand(6, 4, generator=g) > 0.5).float()
    bce = problem_of(problems.MULTI).loss(logits, hot)
    assert bce.shape == (6,)
    assert torch.allclose(bce.mean(), torch.nn.BCEWithLogitsLoss()(logits, hot))


def test_regression_report_matches_scipy_and_hand_values():
    report = metrics.regression_report([1.0, 2.0, 4.0], [1.0, 3.0, 3.0])
    assert report["mse"] == pytest.approx(2 / 3) and report["mae"] == pytest.approx(2 / 3)
    assert report["pearson"] == pytest.approx(np.corrcoef([1, 2, 4], [1, 3, 3])[0, 1])
    assert report["spearman"] == pytest.approx(0.8660254)
    assert report["r2"] == pytest.approx(1 - 2 / (8 / 3))
    # Constant predictions: no correlation is defined, and none is made up.
    flat = metrics.regression_report([2.0, 2.0], [1.0, 3.0])
    assert flat["pearson"] is None and flat["spearman"] is None and flat["mse"] == 1.0
    json.dumps(report)


def test_multi_label_report_at_a_threshold():
    names = ["a", "b", "c"]
    refs = [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    probs = [[0.9, 0.2, 0.1], [0.8, 0.45, 0.0], [0.1, 0.1, 0.3]]
    report = metrics.multi_label_report(probs, refs, names, threshold=0.5)
    # Predicted sets: {a}, {a}, {}: 2 true positives, 0 false positives, 2 false negatives.
    assert report["micro_precision"] == 1.0 and report["micro_recall"] == 0.5
    assert report["micro_f1"] == pytest.approx(2 / 3)
    assert report["per_class"]["a"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}
    assert report["macro_f1"] == pytest.approx(1 / 3) and report["subset_accuracy"] == pytest.approx(1 / 3)
    lower = metrics.multi_label_report(probs, refs, names, threshold=0.25)
    assert lower["subset_accuracy"] == 1.0 and lower["micro_f1"] == 1.0 and lower["threshold"] == 0.25


# --- which problem, and the config that follows --------------------------------------------------------


def _args(**kwargs):
    cfg = TrainConfig(model_config={"model_type": "bert"}, train_file="x.csv", **{"task": "text-classification", **kwargs})
    return cfg.data_args


@pytest.mark.parametrize(
    ("values", "feature", "expected"),
    [
        (["pos", "neg"], Value("string"), problems.SINGLE),
        ([0, 1, 2], Value("int64"), problems.SINGLE),
        ([0, 1], ClassLabel(names=["a", "b"]), problems.SINGLE),
        ([0.5, 2.0], Value("float64"), problems.REGRESSION),
        ([["a"], ["a", "b"]], Sequence(Value("string")), problems.MULTI),
    ],
)
def test_the_problem_type_is_read_from_the_labels(values, feature, expected):
    ds = Dataset.from_dict({"label": values}, features=Features({"label": feature}))
    assert problems.infer_problem_type(ds, _args()) == expected


def test_int_labels_are_a_regression_only_when_asked():
    ds = Dataset.from_dict({"label": [1, 2, 5]})
    assert problems.infer_problem_type(ds, _args(problem_type="regression")) == problems.REGRESSION
    assert problems.infer_problem_type(ds, _args()) == problems.SINGLE


def test_config_defaults_follow_the_problem_type():
    from finetune import checks
    from finetune.config import config_from_dict, resolved

    def resolve(problem: str, **settings):
        cfg = config_from_dict({"model_config": {"model_type": "bert"}, "train_file": "x.csv", **settings})
        return resolved(cfg, checks.Said(), problem_type=problem)

    cfg = config_from_dict({"model_config": {"model_type": "bert"}, "train_file": "x.csv"})
    assert (cfg.metric_for_best_model, cfg.greater_is_better) == (None, None)
    cfg = resolve("regression")
    assert (cfg.metric_for_best_model, cfg.greater_is_better) == ("mse", False)
    assert resolve("regression", metric_for_best_model="pearson").greater_is_better is True
    cfg = resolve("multi_label_classification")
    assert (cfg.metric_for_best_model, cfg.greater_is_better) == ("micro_f1", True)
    with pytest.raises(UserError, match="metric_for_best_model must be one of mse, mae, .* for regression") as raised:
        resolve("regression", metric_for_best_model="accuracy")
    assert raised.value.rule == "settings.metric_of_another_problem"


# --- the real entry points -------------------------------------------------------------------------------


def _split_files(tmp_path, rows_of, n_train=40, n_validation=16) -> dict:
    return {
        "train": write_jsonl(tmp_path / "train.jsonl", rows_of(n_train, seed=0)),
        "validation": write_jsonl(tmp_path / "validation.jsonl", rows_of(n_validation, seed=1)),
    }


def _quiet(*settings: str) -> list[str]:
    return ["per_device_train_batch_size=8", "num_train_epochs=1", "logging_steps=5", *settings]


def test_regression_trains_evaluates_and_loads_in_a_pipeline(tmp_path, capsys):
    from transformers import pipeline

    data, out = _split_files(tmp_path, regression_rows), tmp_path / "run"
    results = main(tiny_text_args(data, out, *_quiet("label_column=score", "save_steps=5")))
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["problem_type"], saved["metric_for_best_model"], saved["greater_is_better"]) == (
        "regression", "mse", False
    )  # fmt: skip
    validation = results["validation"]
    assert {"mse", "mae", "r2", "pearson", "spearman", "loss"} <= set(validation)
    assert validation["loss"] == pytest.approx(validation["mse"], rel=1e-5)
    assert results["best"]["metric"] == "mse"
    printed = capsys.readouterr().out
    assert "text-classification (regression):" in printed and "validation mse " in printed
    exported = json.loads((out / "model" / "config.json").read_text())
    assert (exported["problem_type"], exported["id2label"]) == ("regression", {"0": "score"})

    evaluated = evaluate_main([str(out / "model"), "--predictions"])
    assert evaluated["problem_type"] == "regression" and evaluated["num_samples"] == 16
    assert evaluated["mse"] == pytest.approx(validation["mse"], abs=1e-5)
    first = json.loads(
        (out / "eval" / "validation" / "predictions.jsonl").read_text().splitlines()[0]
    )
    assert first["label"] == regression_rows(16, seed=1)[0]["score"]
    assert not (out / "eval" / "validation" / "confusion_matrix.png").exists()
    assert not (out / "model" / "eval").exists()  # evaluations go beside the export, not into it
    # A training-state checkpoint evaluates the same way, rebuilt from its manifest.
    step5 = evaluate_main([str(out / "checkpoints" / "step-00000005")])
    assert step5["problem_type"] == "regression" and step5["mse"] == pytest.approx(
        validation["mse"], abs=1e-5
    )

    score = pipeline("text-classification", model=str(out / "model"), function_to_apply="none")
    [answer] = score([first["text"]])
    assert answer["label"] == "score" and answer["score"] == pytest.approx(first["prediction"], abs=1e-4)


def test_a_multi_label_runs_last_line_scores_the_exports_decisions_at_the_tuned_threshold(tmp_path, capsys):
    """With the threshold tuned on validation and no test split, the last line is validation at that
    threshold (the export's decisions, as evaluate_checkpoint.py scores it), and says so."""
    data, out = _split_files(tmp_path, multi_label_rows), tmp_path / "run"
    results = main(tiny_text_args(data, out, *_quiet("label_column=labels", "tune_threshold=global")))
    assert "test" not in results
    (last,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("validation micro F1 ")]
    assert f"micro F1 {results['validation_tuned']['micro_f1']:.4f}" in last and last.endswith(" at the tuned threshold")


def test_multi_label_trains_evaluates_and_loads_in_a_pipeline(tmp_path, capsys):
    from transformers import pipeline

    data, out = _split_files(tmp_path, multi_label_rows), tmp_path / "run"
    results = main(tiny_text_args(data, out, *_quiet("label_column=labels", "multi_label_threshold=0.4")))
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["problem_type"], saved["metric_for_best_model"]) == (
        "multi_label_classification",
        "micro_f1",
    )
    validation = results["validation"]
    assert validation["threshold"] == 0.4 and sorted(validation["per_class"]) == sorted(ANIMALS)
    assert {"micro_f1", "macro_f1", "subset_accuracy", "loss"} <= set(validation)
    assert "validation micro F1 " in capsys.readouterr().out
    exported = json.loads((out / "model" / "config.json").read_text())
    assert exported["problem_type"] == "multi_label_classification"
    assert exported["id2label"] == {"0": "bird", "1": "cat", "2": "dog"}  # sorted names

    # The same validation rows as 0/1 columns, in another column order: the same metrics.
    rows = [
        {"text": r["text"], **{a: int(a in r["labels"]) for a in ANIMALS}}
        for r in multi_label_rows(16, seed=1)
    ]
    csv_file = write_csv(tmp_path / "animals.csv", rows)
    evaluated = evaluate_main(
        [str(out / "model"), "--data", str(csv_file), "--predictions", "label_columns=cat,dog,bird"]
    )
    assert evaluated["problem_type"] == "multi_label_classification"
    for key in ("micro_f1", "macro_f1", "subset_accuracy", "loss"):
        assert evaluated[key] == pytest.approx(validation[key], abs=1e-5), key
    # The same file without label_columns: its 0/1 columns are named as the model's labels, so they are
    # labels, not data to predict without a word
    user_error(capsys, evaluate_main, [str(out / "model"), "--data", str(csv_file)],
               "has a column for each of the model's labels (bird, cat, dog)", "label_columns=[bird,cat,dog]")  # fmt: skip
    predictions = (tmp_path / "run" / "eval").glob("animals-*/predictions.jsonl")
    first = json.loads(next(predictions).read_text().splitlines()[0])
    assert first["labels"] == sorted(multi_label_rows(16, seed=1)[0]["labels"])

    classify = pipeline("text-classification", model=str(out / "model"), top_k=None)
    [answer] = classify([first["text"]])
    assert sorted(a["label"] for a in answer) == sorted(ANIMALS)  # every label's score
    for a in answer:
        assert a["score"] == pytest.approx(first["probabilities"][a["label"]], abs=1e-4)


# --- bad labels: one line, exit status 2 -------------------------------------------------------------------


def _bad(tmp_path, capsys, train_rows, *settings, suffix=".jsonl", rule=None) -> str:
    path = tmp_path / f"train{suffix}"
    write_jsonl(path, train_rows) if suffix == ".jsonl" else write_csv(path, train_rows)
    data = {"train": path, "validation": path}
    return user_error(capsys, main, tiny_text_args(data, tmp_path / "out", *settings), rule=rule)


def _texts(labels: list, column: str = "label") -> list[dict]:
    return [{"text": f"sample {i}", column: value} for i, value in enumerate(labels)]


@pytest.mark.parametrize(
    ("labels", "settings", "message", "rule"),
    [
        # JSON that mixes 1 and 2.0 is one float column of whole numbers: class ids or numbers?
        ([1, 2.0, 1, 2], [], "holds whole numbers stored as floats (e.g. 1) (ambiguous): set problem_type=regression",
         "labels.floats_as_classes"),
        ([0.5, 1.5, 0.5], ["problem_type=single_label_classification"], "single_label_classification needs classes",
         "labels.floats_as_classes"),
        ([0.5, float("nan"), 1.5], [], "has 1 NaN or infinite target(s) (first at row 2: nan)",
         "labels.targets_not_finite"),
        ([0.5, 1e30, 1.5], [], "has 1 target(s) too large for the float32 loss (first at row 2: 1e+30; its square",
         "labels.targets_too_large"),
        ([1e-300, 2e-300, 0.0], [], "has 2 target(s) too small for float32 (first at row 1: 1e-300, which rounds to 0)",
         "labels.targets_too_small"),
        ([0.5, 1.5, 2.5], ["class_weights=balanced"], "class_weights=balanced weighs classes or labels; a regression",
         "settings.class_weights_of_regression"),
        ([0.5, 1.5, 2.5], ["label_smoothing=0.1"], "label_smoothing=0.1 smooths a cross-entropy over classes",
         "settings.smoothing_without_classes"),
        ([["a"], ["b"], ["a", "b"]], ["label_smoothing=0.2"], "multi_label_classification has none",
         "settings.smoothing_without_classes"),
        (["pos", "neg", "Pos", "neg"], [], "holds 'Pos' and 'pos', which differ only by letter case",
         "labels.case_twin_classes"),
        (["nan", "NaN", "neg", "neg"], [], "holds 'NaN' and 'nan', which differ only by letter case",
         "labels.case_twin_classes"),
        (["pos", "   ", "neg", "neg"], [], "has an empty (blank) label at row 2", "labels.blank_label"),
        (["0.5", "n/a", "1.5"], ["problem_type=regression"], "holds class names ('n/a' at row 2 is not a finite number)",
         "labels.not_numbers_for_regression"),
        ([["a"], [], ["b"]], [], "has an empty list at row 2; every sample needs a label", "labels.empty_list"),
        ([["a"], ["b", None], ["b"]], [], "has a null inside the list at row 2", "labels.null_in_a_list"),
        ([["a"], ["b", "c"]], ["label_names=[a,b]"], "train labels ['c'] are not in label_names (first at row 2",
         "labels.list_names_unknown"),
        (["a", "b"], ["problem_type=regression"], "holds class names (e.g. 'a'), not numbers: to predict these classes, "
         "set problem_type=single_label_classification", "labels.classes_for_regression"),
        ([["a"], ["b"]], ["problem_type=regression"], "holds lists; regression needs one number per sample",
         "labels.not_numbers_for_regression"),
        (["81%", "12%", "3.5%"], ["problem_type=regression"],  # numbers a spreadsheet dressed: write them plainly
         "holds numbers written with a unit or a separator (e.g. '81%'): regression reads plain numbers; write them "
         "plainly (81 for 81%, or 0.81; 1200 for $1,200)", "labels.dressed_numbers"),
        (["$1,200", "$950", "$2,450"], ["problem_type=regression"], "with a unit or a separator (e.g. '$1,200')",
         "labels.dressed_numbers"),
        # one reading of numbers with classification's check (problems.number_as_written): a unit of any length
        (["3.2 stars", "4 stars", "1.5 stars"], ["problem_type=regression"], "with a unit or a separator (e.g. '3.2 stars')",
         "labels.dressed_numbers"),
        (["1.000,5", "2.250,75", "3.100,0"], ["problem_type=regression"], "with a unit or a separator (e.g. '1.000,5')",
         "labels.dressed_numbers"),
        (["1.5", "n/a"], ["problem_type=regression"],  # numbers with a stray word: the cell, and how to write it
         "holds class names ('n/a' at row 2 is not a finite number); regression needs one number per sample written",
         "labels.not_numbers_for_regression"),
        (["a", "b"], ["problem_type=multi_label_classification"], "needs a label column of lists",
         "labels.multi_label_without_lists"),
        ([["a"], ["b"]], ["problem_type=single_label_classification"], "holds lists of labels, a multi-label",
         "labels.lists_for_single_label"),
        ([0.5, 1.5], ["metric_for_best_model=accuracy"], "metric_for_best_model must be one of mse, mae",
         "settings.metric_of_another_problem"),
    ],
)  # fmt: skip
def test_bad_labels_are_one_line(tmp_path, capsys, labels, settings, message, rule):
    assert message in _bad(tmp_path, capsys, _texts(labels), *settings, rule=rule)


def test_an_infinite_csv_target_and_a_stray_label_column_value(tmp_path, capsys):
    line = _bad(tmp_path, capsys, _texts(["0.5", "inf", "1.5"]), suffix=".csv", rule="labels.targets_not_finite")
    assert "NaN or infinite target(s) (first at row 2: inf)" in line
    rows = [{"text": "x", "cat": 1, "dog": 0}, {"text": "y", "cat": 2, "dog": 1}]
    line = _bad(tmp_path, capsys, rows, "label_columns=[cat,dog]", suffix=".csv", rule="labels.not_zero_or_one")
    assert "label column 'cat' in the train data holds 2 at row 2; each of label_columns holds 0 or 1" in line
    # a word in a CSV column makes every value a string: the word is named, with its row
    rows = [{"text": "x", "cat": 1, "dog": 0}, {"text": "y", "cat": 0, "dog": 1}, {"text": "z", "cat": "yes", "dog": 0}]
    line = _bad(tmp_path, capsys, rows, "label_columns=[cat,dog]", suffix=".csv")
    assert "label column 'cat' in the train data holds 'yes' at row 3" in line


def test_no_training_data_on_a_resume_with_a_recipe_says_to_leave_the_recipe_out(tmp_path):
    from finetune.config import load_config

    recipe = REPO / "finetune/configs/bert_custom_files.yaml"
    with pytest.raises(UserError, match="a resume with --config reads that recipe, not the run's saved") as raised:
        load_config(recipe, ["resume_from_checkpoint=latest", f"output_dir={tmp_path}"])
    assert raised.value.rule == "settings.no_training_data"


def test_label_columns_refuse_another_problem_type():
    from finetune.config import config_from_dict

    with pytest.raises(UserError, match="label_columns .* is multi-label data, but problem_type is regression") as e:
        config_from_dict({"model_config": {"model_type": "bert"}, "train_file": "x.csv", "label_columns": ["a"],
                          "problem_type": "regression"})  # fmt: skip
    assert e.value.rule == "settings.label_columns_not_multi_label"


def test_vit_regression_and_multi_label_from_image_paths(tmp_path):
    """Images take the same labels: a brightness to predict, and the set of colour channels lit."""
    from PIL import Image
    from transformers import pipeline

    rows = []
    for i in range(24):
        level, lit = (i * 37 % 24) / 23, [c for j, c in enumerate("rgb") if (i >> j) & 1] or ["r"]
        pixel = tuple(int(255 * level) if c in lit else 0 for c in "rgb")
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (28, 28), pixel).save(path)
        rows.append({"image": str(path), "brightness": level + 0.01, "channels": lit})
    data = write_jsonl(tmp_path / "images.jsonl", rows)
    common = [f"model_config={TINY_VIT}", "task=image-classification", f"train_file={data}",
              "validation_file=null", "test_file=null", "per_device_train_batch_size=8", "num_train_epochs=1",
              "validation_split_percentage=25", "random_flip=false", "learning_rate=1e-3", "freeze_embeddings=false",
              "label_names=null", "max_train_samples=null", "max_eval_samples=null"]  # fmt: skip
    out = tmp_path / "regression"
    results = main([*common, "label_column=brightness", f"output_dir={out}"])
    assert results["validation"]["num_samples"] == 6 and "pearson" in results["validation"]
    [answer] = pipeline("image-classification", model=str(out / "model"), function_to_apply="none")(
        str(rows[0]["image"])
    )
    assert answer["label"] == "brightness" and isinstance(answer["score"], float)
    out = tmp_path / "multi_label"
    results = main([*common, "label_column=channels", f"output_dir={out}"])
    assert sorted(results["validation"]["per_class"]) == ["b", "g", "r"]
    answer = pipeline("image-classification", model=str(out / "model"), top_k=None)(str(rows[0]["image"]))
    assert sorted(a["label"] for a in answer) == ["b", "g", "r"]


def test_the_trivial_prediction_of_each_problem():
    assert problem_of("single_label_classification").trivial([0, 1, 1, 2]) == 1
    assert problem_of("regression").trivial([1.0, 2.0, 6.0]) == pytest.approx(3.0)
    prior = problem_of("multi_label_classification").trivial([[1, 0], [1, 1], [1, 0], [0, 0]])
    assert prior.tolist() == pytest.approx([0.75, 0.25])
    assert problem_of("token_classification").trivial([[0, -100, 3], [0, 0]]) == 0


def test_class_weights_are_balanced_by_rarity():
    weights = problem_of("single_label_classification").class_weights([0, 0, 0, 1], 3, "balanced")
    assert weights.tolist() == pytest.approx([4 / (3 * 3), 4 / (3 * 1), 1.0])  # class 2 absent: 1
    pos = problem_of("multi_label_classification").class_weights([[1, 0], [1, 0], [1, 1], [0, 0]], 2, "balanced")
    assert pos.tolist() == pytest.approx([1 / 3, 3.0])
    assert problem_of("single_label_classification").class_weights([0, 1], 2, None) is None


class Batches(Hooks):
    """Each micro-batch's logits and labels, from the model as the loop's own forward will see it."""

    def __init__(self):
        super().__init__()
        self.logits, self.labels = [], []

    def mark(self, name, value=None):
        if name == "prepared":
            self.model = value.model
        elif name == "batch":
            with torch.no_grad():
                self.logits.append(forward(self.model, value, problem_of(None)).float())
            self.labels.append(value["labels"])


def logged_loss(out: Path, step: int) -> float:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r["loss"] for r in records if r["step"] == step and "loss" in r)


def test_label_smoothing_is_torchs_cross_entropy_with_label_smoothing(small_text_data, tmp_path):
    """A step's training loss (one micro-batch a step) is F.cross_entropy(label_smoothing=0.1) of its
    logits; the plain cross-entropy of the same logits is clearly another number (at step 4: a model
    at its random start predicts about 1/2 for each class, where smoothing changes nothing)."""
    hooks = Batches()
    main(recipe_text_args(small_text_data, tmp_path / "run", "max_steps=4", "learning_rate=5e-3", "warmup_ratio=0", "label_smoothing=0.1"),
         hooks)  # fmt: skip
    logits, labels = hooks.logits[3], hooks.labels[3]
    smoothed = F.cross_entropy(logits, labels, label_smoothing=0.1).item()
    plain = F.cross_entropy(logits, labels).item()
    assert logged_loss(tmp_path / "run", 4) == pytest.approx(smoothed, rel=1e-5)
    assert abs(smoothed - plain) > 1e-3


def test_balanced_class_weights_weigh_each_sample_by_its_class(tmp_path):
    """class_weights=balanced: each sample's cross-entropy times n / (K n_k) of its class (torch's
    per-sample weighted cross-entropy), summed over the batch and divided by its samples."""
    rows = rotten_rows(37)
    for row in rows[:30]:
        row["label"] = "0"  # 31 or so of class 0, a handful of class 1: weights far from 1
    data = {"train": write_csv(tmp_path / "train.csv", rows),
            "validation": write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    counts = torch.bincount(torch.tensor([int(r["label"]) for r in rows]), minlength=2).float()
    weights = len(rows) / (2 * counts)
    hooks = Batches()
    main(recipe_text_args(data, tmp_path / "run", "max_steps=1", "class_weights=balanced"), hooks)
    logits, labels = hooks.logits[0], hooks.labels[0]
    weighted = F.cross_entropy(logits, labels, weight=weights, reduction="none").mean().item()
    plain = F.cross_entropy(logits, labels).item()
    assert logged_loss(tmp_path / "run", 1) == pytest.approx(weighted, rel=1e-5)
    assert abs(weighted - plain) > 1e-3


def test_a_multi_label_label_positive_on_every_training_sample_is_one_warning(tmp_path, capsys):
    """A label on every sample (["art", "film", "music"] on each row) teaches the model to predict it always."""
    from datasets import Dataset

    from finetune import checks
    from finetune.checks import labels
    from finetune.config import load_config
    from finetune.data import load_splits

    def _warn_labels_without_positives(train, names):
        positives = list(np.asarray(train["labels"], dtype=np.float32).sum(0))
        checks.gate(labels.POSITIVES, positives, names, len(train), said=checks.Said())

    train = Dataset.from_dict({"labels": [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]})
    _warn_labels_without_positives(train, ["art", "film", "music"])
    assert capsys.readouterr().err == ("warning: 1 of the 3 labels are positive on every training sample ('art'): "
                                       "the model learns to predict them always; give them negative samples, or "
                                       "leave them out\n")  # fmt: skip
    _warn_labels_without_positives(train.select([0, 1]).map(lambda r: {"labels": [1.0, 0.0, 1.0]}), ["a", "b", "c"])
    assert "positive on every training sample ('a', 'c')" in capsys.readouterr().err
    # a data file's lists, read as a run reads them: 'art' on every row
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": f"t{i}", "labels": ["art", ["film", "music"][i % 2]]}
                                              for i in range(8)])  # fmt: skip
    said = checks.Said()
    load_splits(load_config(None, tiny_text_args({"train": path, "validation": path}, tmp_path / "r",
                                                 "label_column=labels")).data_args, said)  # fmt: skip
    assert "labels.label_always_positive" in said.rules()


def test_lists_of_exactly_one_label_train_as_multi_label_with_a_warning(tmp_path, capsys):
    """["neg"] in every row: a multi-label problem by its lists, but probably one class a sample written as
    a list; said once, and not when problem_type says multi-label."""
    rows = [{"text": r["text"], "label": ["neg" if r["label"] == "0" else "pos"]} for r in rotten_rows(24)]
    data = {"train": write_jsonl(tmp_path / "t.jsonl", rows), "validation": write_jsonl(tmp_path / "v.jsonl", rows[:6])}
    warning = "holds a list of exactly one label in every training sample: trained as multi-label"
    results = main(tiny_text_args(data, tmp_path / "run", "max_steps=1"))
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification" and warning in capsys.readouterr().err
    assert "labels.lists_of_one_label" in [w["rule"] for w in results["warnings"]]
    main(tiny_text_args(data, tmp_path / "run2", "max_steps=1", "problem_type=multi_label_classification"))
    assert warning not in capsys.readouterr().err


def test_a_label_named_twice_in_one_multi_label_list_is_warned_of(tmp_path, capsys):
    """["a", "a"]: it counts once (a set of labels), but is probably a typo for another label: said once."""
    from finetune import checks
    from finetune.config import load_config
    from finetune.data import load_splits

    rows = [{"text": f"t{i}", "labels": [["a", "a"], ["b"], ["a", "c"]][i % 3]} for i in range(12)]
    data = {"train": write_jsonl(tmp_path / "t.jsonl", rows), "validation": write_jsonl(tmp_path / "v.jsonl", rows[:3])}
    said = checks.Said()
    load_splits(load_config(None, tiny_text_args(data, tmp_path / "r", "label_column=labels", "label_names=null")),
                said)  # fmt: skip
    assert "warning: 4 training row(s) of label column 'labels' name a label twice (row 1: ['a', 'a'])" \
        in capsys.readouterr().err
    assert "labels.label_twice_in_a_list" in said.rules()
    # The same at evaluation: the evaluated file's rows are named, not dropped without a word.
    clean = [{"text": r["text"], "labels": sorted(set(r["labels"]))} for r in rows]
    data = {"train": write_jsonl(tmp_path / "t2.jsonl", clean), "validation": write_jsonl(tmp_path / "v2.jsonl", clean[:3])}
    main(tiny_text_args(data, tmp_path / "run", "label_column=labels", "label_names=null", "max_steps=1"))
    capsys.readouterr()
    evaluate_main([str(tmp_path / "run" / "model"), "--data", str(tmp_path / "t.jsonl"), "--output", str(tmp_path / "e")])
    assert "row(s) of label column 'labels' name a label twice (row 1: ['a', 'a'])" in capsys.readouterr().err


def test_regression_targets_of_another_scale_in_validation_are_warned_of(tmp_path, capsys):
    """Training scores of a few points, validation scores of the same texts x100: the model is scored on a
    scale it never saw; one warning, not just the run's 'did not learn'."""
    train, validation = regression_rows(30, seed=0), regression_rows(12, seed=1)
    data = {"train": write_jsonl(tmp_path / "t.jsonl", train),
            "validation": write_jsonl(tmp_path / "v.jsonl", [{**r, "score": r["score"] * 100 + 500} for r in validation])}
    results = main(tiny_text_args(data, tmp_path / "run", "label_column=score", "max_steps=1"))
    said = capsys.readouterr().err
    assert "splits.another_scale" in [w["rule"] for w in results["warnings"]]
    low, high = min(r["score"] * 100 + 500 for r in validation), max(r["score"] * 100 + 500 for r in validation)
    assert "validation targets lie far outside the training targets' range" in said
    assert f"(they span {low:g} to {high:g}): another scale?" in said  # the data's own range, not a canned one
    data["validation"] = write_jsonl(tmp_path / "v2.jsonl", validation)
    main(tiny_text_args(data, tmp_path / "run2", "label_column=score", "max_steps=1"))
    assert "far outside" not in capsys.readouterr().err
    # the export evaluated on other data of the other scale: the same rule, against the run's training targets
    other = write_jsonl(tmp_path / "x100.jsonl", [{**r, "score": r["score"] * 100 + 500} for r in validation])
    evaluate_main([str(tmp_path / "run2" / "model"), "--data", str(other)])
    assert "targets of x100-" in capsys.readouterr().err
    evaluate_main([str(tmp_path / "run2" / "model"), "--data", str(data["validation"])])
    assert "far outside" not in capsys.readouterr().err
    evaluate_main([str(tmp_path / "run2" / "model"), "--data", str(data["train"])])  # its own training file
    assert "is the run's training file: the model trained on these samples" in capsys.readouterr().err


def test_a_regression_target_far_from_the_others_is_named_once(capsys):
    """45 typed for 4.5 on a 1-5 scale: one warning with its row; ordinary spreads say nothing."""
    from finetune.checks import labels

    def far(values):
        return labels.targets_far_from_the_rest(labels.Targets(values, "score", "train", None))

    line = far(np.array([3.0, 4.5, 2.0, 3.5, 4.0, 45.0, 1.5, 2.5, 3.0, 4.0]))
    assert "label column 'score' in the train data has 1 target(s) more than 15 robust standard deviations" in line
    assert "(first at row 6: 45)" in line
    rng = np.random.default_rng(0)
    for ordinary in (rng.normal(3, 1, 5000), rng.uniform(0, 5, 5000), rng.poisson(2, 5000).astype(float),
                     np.array([0.0] * 60 + [1.0, 2.0, 7.0])):  # a normal sample, a scale, counts, mostly zeros
        assert far(ordinary) is None


def test_multi_label_items_that_join_several_labels_are_named_once(tmp_path, capsys):
    """["acting,plot"]: a label of its own beside 'acting' and 'plot,acting'; said in one warning with the
    lists to write. Decimal-looking names and a run that lists its label_names say nothing."""
    rows = [{"text": f"sample {i}", "labels": [["acting,plot"], ["plot"], ["plot,acting"], ["acting"]][i % 4]}
            for i in range(12)]  # fmt: skip
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    data = {"train": path, "validation": path}
    results = main(tiny_text_args(data, tmp_path / "run", "label_column=labels", "max_steps=1"))
    assert "labels.joined_in_one_item" in [w["rule"] for w in results["warnings"]]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "joined in one item" in ln]
    assert lines == ["warning: label column 'labels' has 2 label(s) such as 'acting,plot': several labels joined in "
                     'one item? give each its own item (["acting", "plot"]), or list the labels in label_names to keep '
                     "them as they are"]  # fmt: skip
    reset_accelerate()
    main(tiny_text_args(data, tmp_path / "kept", "label_column=labels", "max_steps=1",
                        "label_names=[acting,plot,'acting,plot','plot,acting']"))  # fmt: skip
    assert "joined in one item" not in capsys.readouterr().err
    from finetune.checks import labels

    assert labels.joined_in_one_item(["3,5", "4,5", "n/a", "and/or"], "labels") is None
    assert '(["visuals", "music"])' in labels.joined_in_one_item(["music", "visuals / music"], "labels")  # " / "


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (["0", "1", "1", "0", "0", "1", "1", "0", "1", "-1"] * 3,
         "label column 'label' holds '-1' (3 of 30 samples) beside the classes 0, 1: the Hub's value for a sample "
         "without a label, trained as a class of its own; drop those rows"),
        (["entailment", "neutral", "contradiction", "entailment", "-"] * 6,
         "label column 'label' holds '-' (6 of 30 samples) beside the classes contradiction, entailment, neutral: "
         "SNLI's mark for no gold label"),
        (["-1", "0", "1"] * 10, None),  # a third of the samples: a class (negative, neutral, positive)
        (["pos", "neg", "pos", "neg", "nan"] * 6,  # pandas' astype(str) of an empty cell
         "label column 'label' holds 'nan' (6 of 30 samples) beside the classes neg, pos: an empty cell written as "
         "text"),
        (["pos", "neg", "none"] * 10, None),  # "none" is a class name people give
        (["0", "1", "1", "0", "0", "1", "1", "0", "1", "?"] * 3,  # a UCI file's missing value
         "label column 'label' holds '?' (3 of 30 samples) beside the classes 0, 1: the UCI repository's (and "
         "Kaggle's) mark for a missing value"),
    ],
)  # fmt: skip
def test_a_no_label_mark_among_the_classes_is_named(labels, said, tmp_path, capsys):
    rows = [{"text": f"sample {i}", "label": v} for i, v in enumerate(labels)]
    data = {"train": write_csv(tmp_path / "train.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows)}
    results = main(tiny_text_args(data, tmp_path / "run", "max_steps=1"))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "trained as a class of its own" in ln]
    assert len(lines) == (1 if said else 0) and all(said in line for line in lines)
    assert ("labels.no_label_mark" in [w["rule"] for w in results["warnings"]]) == bool(said)


def test_a_pair_data_sets_second_sentence_left_unread_is_said(tmp_path, capsys):
    """sentence1/sentence2 trained with text_column=sentence1 alone: one warning naming text_pair_column;
    with it set, none."""
    rows = [{"sentence1": f"a man sleeps {i}", "sentence2": f"a person rests {i}", "label": ["yes", "no"][i % 2]}
            for i in range(12)]  # fmt: skip
    data = {"train": write_csv(tmp_path / "train.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows)}
    results = main(tiny_text_args(data, tmp_path / "one", "text_column=sentence1", "max_steps=1"))
    assert "columns.pair_unread" in [w["rule"] for w in results["warnings"]]
    assert ("warning: column 'sentence2' is not read: the model sees 'sentence1' alone; for sentence pairs set "
            "text_pair_column=sentence2") in capsys.readouterr().err.splitlines()
    reset_accelerate()
    main(tiny_text_args(data, tmp_path / "two", "text_column=sentence2", "max_steps=1"))  # the second alone
    assert ("warning: column 'sentence1' is not read: the model sees 'sentence2' alone; for sentence pairs set "
            "text_column=sentence1 text_pair_column=sentence2") in capsys.readouterr().err.splitlines()
    reset_accelerate()
    main(tiny_text_args(data, tmp_path / "pair", "text_column=sentence1", "text_pair_column=sentence2", "max_steps=1"))
    assert "is not read" not in capsys.readouterr().err


@pytest.mark.parametrize("multi", [False, True])
def test_class_ids_beside_label_names_are_read_as_those_names(multi, tmp_path, capsys):
    """The Hub's habit: ids 0, 1 in the data, the names in label_names. Each id is the name at its place, in
    every split, with one warning; the model's labels are the names."""
    rows = [{"text": f"sample {i}", "label": [i % 3] if multi else i % 3} for i in range(18)]
    data = {"train": write_jsonl(tmp_path / "t.jsonl", rows), "validation": write_jsonl(tmp_path / "v.jsonl", rows)}
    results = main(tiny_text_args(data, tmp_path / "run", "label_names=[neg,neutral,pos]", "max_steps=1",
                                  *(["problem_type=multi_label_classification"] if multi else [])))  # fmt: skip
    assert "labels.class_ids_read_as_names" in [w["rule"] for w in results["warnings"]]
    said = [ln for ln in capsys.readouterr().err.splitlines() if "class ids" in ln]
    assert said == ["warning: label column 'label' holds class ids, read as the names at their places in label_names "
                    "(0 -> neg, 1 -> neutral, 2 -> pos); if label_names lists them in another order, fix its order"]
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "neutral", "2": "pos"}


@pytest.mark.slow
def test_a_regression_that_did_not_learn_on_large_targets_says_to_scale_them(tmp_path, capsys):
    """House prices (hundreds of thousands): a head that starts near 0 needs many steps to reach them; the
    'did not learn' warning says to scale the targets, and not for targets of a few points."""
    rows = regression_rows(40, seed=0)
    for scale, said in ((1e5, True), (1, False)):
        data = {split: write_jsonl(tmp_path / f"{split}{scale:g}.jsonl", [{**r, "score": r["score"] * scale}
                                                                          for r in rows[i::2]])
                for i, split in enumerate(("train", "validation"))}  # fmt: skip
        main(tiny_text_args(data, tmp_path / f"run{scale:g}", "label_column=score", "problem_type=regression",
                            "max_steps=1"))  # fmt: skip
        err = "".join(capsys.readouterr())  # a verdict that learned is the run's own line (stdout), a warning stderr
        if said:
            assert "the model did not learn beyond a trivial baseline" in err
        assert ("train slowly from a head that starts near 0: scale them" in err) == said
