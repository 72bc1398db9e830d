"""A user's own data: the trivial baseline and the warning when a model did not beat it, multi-label
thresholds, class weights, predictions for data without labels, where evaluations go, the search,
and the command-line habits of transformers' scripts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_BERT, TOKENIZER, rotten_rows, write_csv

from finetune.evaluate_checkpoint import main as evaluate
from finetune.metrics import learned, tune_thresholds
from finetune.problems import class_weights_of, trivial_prediction
from finetune.run import main


def tiny(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "task=text-classification", f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}",
        f"train_file={data['train']}", f"validation_file={data['validation']}", "test_file=null",
        "max_train_samples=null", "max_eval_samples=null", "max_length=32", "label_names=null",
        "freeze_embeddings=false", "dropout=null", "logging_steps=1", "per_device_train_batch_size=8",
        f"output_dir={out}", *extra,
    ]  # fmt: skip


@pytest.fixture
def text(tmp_path) -> dict[str, Path]:
    return {"train": write_csv(tmp_path / "train.csv", rotten_rows(37)),
            "validation": write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip


# --- the baseline ---------------------------------------------------------------------------------------


def test_the_trivial_prediction_of_each_problem():
    assert trivial_prediction([0, 1, 1, 2], "single_label_classification") == 1
    assert trivial_prediction([1.0, 2.0, 6.0], "regression") == pytest.approx(3.0)
    prior = trivial_prediction([[1, 0], [1, 1], [1, 0], [0, 0]], "multi_label_classification")
    assert prior.tolist() == pytest.approx([0.75, 0.25])
    assert trivial_prediction([[0, -100, 3], [0, 0]], "token_classification") == 0


def test_learned_needs_a_margin_above_the_baseline():
    assert learned("accuracy", 0.56, 0.50, 1000) is True  # 2 standard errors: 0.032
    assert learned("accuracy", 0.52, 0.50, 1000) is False
    assert learned("accuracy", 0.60, 0.50, 30) is False  # 2 standard errors of 30 samples: 0.18
    assert learned("pearson", 0.5, None, 100) is True and learned("pearson", 0.1, None, 100) is False
    assert learned("mse", 0.8, 1.0, 100) is True and learned("mse", 0.95, 1.0, 100) is False
    assert learned("accuracy", None, 0.5, 100) is None


def test_a_run_that_learned_nothing_says_so_and_its_card_too(text, tmp_path, capsys):
    out = tmp_path / "run"
    results = main(tiny(text, out, "learning_rate=1e-9", "max_steps=2"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert any("did not learn beyond a trivial baseline" in line for line in lines), lines
    assert results["learned"]["verdict"] is False and "accuracy" in results["validation"]["baseline"]
    assert "**Warning:** the model did not learn beyond a trivial baseline" in (out / "model" / "README.md").read_text()


def test_the_validation_line_shows_the_baseline(text, tmp_path, capsys):
    main(tiny(text, tmp_path / "run", "max_steps=2"))
    assert "(trivial baseline: accuracy " in capsys.readouterr().out


# --- multi-label thresholds and class weights ------------------------------------------------------------


def test_thresholds_are_tuned_on_predictions_global_or_per_label():
    probabilities = torch.tensor([[0.30, 0.9], [0.35, 0.1], [0.10, 0.8], [0.05, 0.2]])
    references = torch.tensor([[1, 1], [1, 0], [0, 1], [0, 0]])
    per_label = tune_thresholds(probabilities, references, per_label=True)
    assert 0.10 < per_label[0] <= 0.30 and 0.2 < per_label[1] <= 0.8
    assert len(set(tune_thresholds(probabilities, references, per_label=False))) == 1


def test_class_weights_are_balanced_by_rarity():
    weights = class_weights_of([0, 0, 0, 1], "single_label_classification", 3, "balanced")
    assert weights.tolist() == pytest.approx([4 / (3 * 3), 4 / (3 * 1), 1.0])  # class 2 absent: 1
    pos = class_weights_of([[1, 0], [1, 0], [1, 1], [0, 0]], "multi_label_classification", 2, "balanced")
    assert pos.tolist() == pytest.approx([1 / 3, 3.0])
    assert class_weights_of([0, 1], "single_label_classification", 2, None) is None


def test_a_multi_label_export_carries_its_tuned_thresholds(tmp_path):
    rows = [{"text": f"{'sports' if i % 2 else 'news'} item {i}", "labels": ["a"] if i % 3 else ["a", "b"]}
            for i in range(30)]  # fmt: skip
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"train": path, "validation": path}
    main(tiny(data, tmp_path / "run", "label_column=labels", "max_steps=3", "tune_threshold=per_label",
              "class_weights=balanced", "label_smoothing=0.0"))  # fmt: skip
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert len(config["multi_label_thresholds"]) == 2
    evaluate([str(tmp_path / "run" / "model"), "--data", str(path), "--output", str(tmp_path / "ev")])
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["threshold"] == config["multi_label_thresholds"]


# --- evaluation: where, and data without labels ------------------------------------------------------------


def test_evaluations_go_outside_the_export_and_data_without_labels_is_predicted(text, tmp_path, monkeypatch):
    out = tmp_path / "run"
    main(tiny(text, out, "max_steps=2"))
    evaluate([str(out / "model")])
    assert (out / "eval" / "validation" / "metrics.json").is_file()
    assert not (out / "model" / "eval").exists()  # an export is shared: the user's data stays out of it
    unlabelled = write_csv(tmp_path / "new.csv", [{"text": r["text"]} for r in rotten_rows(5, start=300)])
    monkeypatch.chdir(tmp_path)
    evaluate([str(out / "model"), "--data", str(unlabelled), "--output", "eval-0.5"])
    folder = tmp_path / "eval-0.5"  # always a folder, whatever its name looks like
    record = json.loads((folder / "metrics.json").read_text())
    assert record["labelled"] is False and record["num_samples"] == 5 and "accuracy" not in record
    lines = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert [r["text"] for r in lines] == [r["text"] for r in rotten_rows(5, start=300)]
    assert all(r["prediction"] in ("0", "1") for r in lines)


# --- the command line -----------------------------------------------------------------------------------


def test_transformers_style_flags_and_fractional_epochs(text, tmp_path):
    out = tmp_path / "run"
    results = main([*tiny(text, out), "--num_train_epochs", "1.5", "--per_device_train_batch_size=8"])
    assert results["step"] == 8  # 37 samples in batches of 8: 5 steps an epoch, 1.5 epochs: 8
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["num_train_epochs"] == 1.5
    epochs = {json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert epochs == {1, 2}  # counted from 1, as the console counts them


# --- the search -----------------------------------------------------------------------------------------


def test_the_search_runs_trials_continues_its_study_and_keeps_the_best(text, tmp_path):
    from finetune.search import main as search

    out = tmp_path / "search"
    args = ["--budget", "300", *tiny(text, out)[:-1], f"output_dir={out}", "max_steps=4"]
    record = search([*args, "--trials", "3", "--space", "learning_rate,warmup_ratio"])
    assert record["trials"] == 3 and (out / "model" / "config.json").is_file()
    best = yaml.safe_load((out / "best_recipe.yaml").read_text())
    assert best["learning_rate"] == pytest.approx(record["params"]["learning_rate"])
    assert sum((d / "model").is_dir() for d in out.glob("trial-*")) == 1  # only the best keeps its weights
    again = search([*args, "--trials", "1", "--space", "learning_rate,warmup_ratio"])
    assert again["trials"] == 4  # the study continued
