"""A user's own data: the trivial baseline and the warning when a model did not beat it, multi-label
thresholds, class weights, predictions for data without labels, where evaluations go, the search,
and the command-line habits of transformers' scripts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import TINY_BERT, TOKENIZER, multi_label_rows, rotten_rows, write_csv, write_jsonl

from finetune.evaluate_checkpoint import main as evaluate
from finetune.evaluation import forward
from finetune.metrics import learned, tune_thresholds
from finetune.problems import class_weights_of, trivial_prediction
from finetune.run import Hooks, main


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


# --- the loss: label smoothing and class weights, as torch computes them ----------------------------------


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
                self.logits.append(forward(self.model, value).float())
            self.labels.append(value["labels"])


def logged_loss(out: Path, step: int) -> float:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r["loss"] for r in records if r["step"] == step and "loss" in r)


def test_label_smoothing_is_torchs_cross_entropy_with_label_smoothing(text, tmp_path):
    """A step's training loss (one micro-batch a step) is F.cross_entropy(label_smoothing=0.1) of its
    logits; the plain cross-entropy of the same logits is clearly another number (at step 4: a model
    at its random start predicts about 1/2 for each class, where smoothing changes nothing)."""
    hooks = Batches()
    main(tiny(text, tmp_path / "run", "max_steps=4", "learning_rate=5e-3", "warmup_ratio=0", "label_smoothing=0.1"),
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
    main(tiny(data, tmp_path / "run", "max_steps=1", "class_weights=balanced"), hooks)
    logits, labels = hooks.logits[0], hooks.labels[0]
    weighted = F.cross_entropy(logits, labels, weight=weights, reduction="none").mean().item()
    plain = F.cross_entropy(logits, labels).item()
    assert logged_loss(tmp_path / "run", 1) == pytest.approx(weighted, rel=1e-5)
    assert abs(weighted - plain) > 1e-3


# --- the never-predicted line, and the verdict at the tuned threshold --------------------------------------


def test_labels_never_predicted_on_validation_are_named_in_one_warning_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "train.jsonl", multi_label_rows(24))
    data = {"train": path, "validation": path}
    main(tiny(data, tmp_path / "run", "label_column=labels", "max_steps=1", "tune_threshold=off",
              "multi_label_threshold=0.99"))  # fmt: skip  -- nothing reaches 0.99 after one step
    lines = [line for line in capsys.readouterr().out.splitlines() if "never predicted" in line]
    assert lines == [
        "warning: 3 of 3 labels were never predicted on validation ('bird', 'cat', 'dog'); rare ones need more "
        "examples, class_weights=balanced, or more training"
    ]


def test_the_verdict_reads_the_tuned_validation_when_there_is_one():
    from types import SimpleNamespace

    from finetune.run import judge

    cfg = SimpleNamespace(problem_type="multi_label_classification", metric_for_best_model="micro_f1")
    fixed = {"micro_f1": 0.10, "num_samples": 400, "baseline": {"micro_f1": 0.40}}
    tuned = {"micro_f1": 0.80, "num_samples": 400, "baseline": {"micro_f1": 0.45}}
    best = {"metric": "micro_f1", "value": 0.12}
    assert judge(cfg, fixed, best)["verdict"] is False  # at 0.5 nothing is predicted: below the prior
    verdict = judge(cfg, fixed, best, tuned)
    assert verdict["verdict"] is True and verdict["value"] == 0.80 and verdict["baseline"] == 0.45


@pytest.fixture
def multi_label_export(tmp_path) -> Path:
    """A tiny multi-label export with thresholds tuned per label (3 steps: probabilities near 1/2, so
    the tuned thresholds, not 0.5, decide)."""
    path = write_jsonl(tmp_path / "train.jsonl", multi_label_rows(32))
    data = {"train": path, "validation": write_jsonl(tmp_path / "validation.jsonl", multi_label_rows(16, seed=1))}
    main(tiny(data, tmp_path / "run", "label_column=labels", "max_steps=3", "tune_threshold=per_label"))
    return tmp_path / "run" / "model"


def predicted_by_evaluate(export: Path, rows: list[dict], out: Path) -> list[str]:
    data = write_jsonl(out.with_suffix(".jsonl"), rows)
    evaluate([str(export), "--data", str(data), "--output", str(out), "--predictions"])
    (line,) = (out / "predictions.jsonl").read_text().splitlines()
    return sorted(json.loads(line)["predictions"])


def test_the_cards_multi_label_example_applies_the_tuned_thresholds(multi_label_export, monkeypatch):
    """A pipeline() applies no threshold; the card's example applies config.multi_label_thresholds, and
    its labels are the ones finetune/evaluate_checkpoint.py predicts."""
    card = (multi_label_export / "README.md").read_text()
    code = card.split("## How to use", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "config.multi_label_thresholds" in code
    text = "the cat saw a dog"
    code = code.replace('"a text like those of the `text` column"', repr(text))
    monkeypatch.chdir(multi_label_export.parent.parent)  # the card names an export outside the repository "run/model"
    namespace: dict = {}
    exec(code, namespace)
    thresholds = json.loads((multi_label_export / "config.json").read_text())["multi_label_thresholds"]
    assert thresholds != [0.5] * 3  # else the example's thresholds could not be told from a pipeline's 0.5
    expected = predicted_by_evaluate(multi_label_export, [{"text": text, "labels": ["cat"]}], multi_label_export.parent / "ev")
    assert sorted(namespace["labels"]) == expected


def test_predictions_without_labels_use_the_tuned_thresholds(multi_label_export):
    text = "the cat saw a dog"
    labelled = predicted_by_evaluate(multi_label_export, [{"text": text, "labels": ["cat"]}],
                                     multi_label_export.parent / "labelled")  # fmt: skip
    assert predicted_by_evaluate(multi_label_export, [{"text": text}], multi_label_export.parent / "new") == labelled
