"""finetune/evaluate_checkpoint.py (and finetune/evaluation.py): the evaluation entry point, run for
real on tiny trained runs. An export and a training-state checkpoint, 1 vs 2 CPU processes, other data,
the inputs in predictions.jsonl (texts, pairs, images), --help, user errors, and a checkpoint of a model
fine-tuned from pretrained weights (rebuilt from its config: no load report about a "newly initialized"
head, the metrics the run recorded at that step).

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_evaluate_checkpoint.py

Every expected number is counted here from predictions made directly with transformers on the same
rows, never by calling the code under test a second way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import PIL.Image
import pytest
import torch
from conftest import (
    EVALUATED_RUN,
    NAMES,
    REPO,
    drawn_images,
    file_hashes,
    free_port,
    launch,
    predicted_by_evaluate,
    recipe_text_args,
    rotten_rows,
    save_tiny_bert,
    tiny_bert_config,
    tiny_text_args,
    user_error,
    write_csv,
    write_jsonl,
)
from datasets import ClassLabel, Dataset, Features, Image, Value
from safetensors.torch import load_file
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)
from transformers.utils import logging

from finetune.config import TrainConfig
from finetune.evaluate_checkpoint import EVAL_KEYS
from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import main


def _rows(n: int, start: int) -> list[dict]:
    return [{"text": r["text"], "label": NAMES[r["label"]]} for r in rotten_rows(n, start)]


@pytest.fixture(scope="module")
def run(finished_run, tmp_path_factory):
    """37 train / 13 validation / 11 test rows (string labels: neg, pos); 5 optimizer steps, checkpoints at
    steps 2 and 4. The factory's run, copied: evaluations write into the run's eval/ folder."""
    out = finished_run.copy(tmp_path_factory.mktemp("evaluate") / "run", *EVALUATED_RUN, data="named+test")
    test = finished_run.data("named+test")["test"]  # odd, so that 2 processes x batch 4 pad
    return {"dir": out, "test": test, "checkpoint": out / "checkpoints" / "step-00000002"}


def _predict(run_dir, texts: list[str], weights=None) -> tuple[list[str], torch.Tensor]:
    """Predicted label names and probabilities, straight from transformers (`weights`: a checkpoint's)."""
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "model").eval()
    if weights is not None:
        model.load_state_dict(load_file(weights))
    with torch.no_grad():
        enc = tokenizer(texts, truncation=True, max_length=32, padding=True, return_tensors="pt")
        probabilities = model(**enc).logits.softmax(-1)
    return [model.config.id2label[i] for i in probabilities.argmax(-1).tolist()], probabilities


def _files(folder) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file() and "eval" not in p.relative_to(folder).parts
    }


def _without_runtime(path) -> dict:
    record = json.loads(path.read_text())
    record.pop("runtime")
    return record


@pytest.mark.parametrize("kind", ["export", "training-state"])
def test_evaluation_matches_a_hand_count(run, kind):
    target = run["dir"] / "model" if kind == "export" else run["checkpoint"]
    before = _files(target)
    result = evaluate([str(target), "--predictions"])

    rows = _rows(11, 200)
    labels = [r["label"] for r in rows]
    weights = run["checkpoint"] / "model.safetensors" if kind == "training-state" else None
    predicted, probabilities = _predict(run["dir"], [r["text"] for r in rows], weights)
    correct = sum(p == t for p, t in zip(predicted, labels, strict=True))

    # outside what is evaluated: the run's eval/ folder, named by the split (and the step for a checkpoint)
    name = "test" if kind == "export" else f"{target.name}-test"
    metrics_file = run["dir"] / "eval" / name / "metrics.json"
    assert result["metrics_file"] == str(metrics_file)
    record = json.loads(metrics_file.read_text())
    assert record["checkpoint_kind"] == kind and record["step"] == (5 if kind == "export" else 2)
    assert record["split"] == "test" and record["num_samples"] == 11
    assert record["accuracy"] * 11 == pytest.approx(correct)
    matrix = record["confusion_matrix"]
    assert matrix[0][0] + matrix[1][1] == correct
    assert [sum(row) for row in matrix] == [labels.count("neg"), labels.count("pos")]
    assert record["per_class"]["pos"]["support"] == labels.count("pos")
    assert record["data_sha256"] == hashlib.sha256(run["test"].read_bytes()).hexdigest()
    assert (metrics_file.parent / "confusion_matrix.png").stat().st_size > 0
    lines = [
        json.loads(line) for line in (metrics_file.parent / "predictions.jsonl").read_text().splitlines()
    ]
    assert [r["index"] for r in lines] == list(range(11))
    assert [r["text"] for r in lines] == [r["text"] for r in rows]  # the input, to read beside the output
    assert all("text_pair" not in r for r in lines)
    assert [r["label"] for r in lines] == labels
    assert [r["prediction"] for r in lines] == predicted
    got = torch.tensor([[r["probabilities"]["neg"], r["probabilities"]["pos"]] for r in lines])
    assert torch.allclose(got, probabilities, atol=1e-5)
    assert _files(target) == before  # the checkpoint's own files are untouched
    if kind == "export":  # the same numbers as the run's own final evaluation
        final = json.loads((run["dir"] / "results.json").read_text())["test"]
        assert record["confusion_matrix"] == final["confusion_matrix"]
        assert record["loss"] == pytest.approx(final["loss"], abs=1e-6)


@pytest.mark.slow
def test_one_and_two_processes_give_identical_metrics(run, tmp_path):
    one, two = tmp_path / "one" / "metrics.json", tmp_path / "two" / "metrics.json"  # --output: a folder
    evaluate([str(run["checkpoint"]), "--output", str(one.parent), "--predictions"])
    result = launch(
        [str(run["checkpoint"]), "--output", str(two.parent), "--predictions"],
        num_processes=2,
        script="finetune/evaluate_checkpoint.py",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(two.read_text())["runtime"]["num_processes"] == 2
    assert _without_runtime(two) == _without_runtime(one)
    assert _without_runtime(two)["num_samples"] == 11  # 2 x batch 4 pads the last batch: padding dropped
    assert (two.parent / "predictions.jsonl").read_text() == (one.parent / "predictions.jsonl").read_text()


def test_other_data_is_mapped_by_label_name(run, tmp_path):
    rows = _rows(9, 300)
    # A ClassLabel whose ids run the other way (0 = pos), an extra column, another column order.
    features = Features(
        {"id": Value("int64"), "label": ClassLabel(names=["pos", "neg"]), "text": Value("string")}
    )
    parquet = tmp_path / "reversed.parquet"
    Dataset.from_dict(
        {
            "id": list(range(9)),
            "label": [["pos", "neg"].index(r["label"]) for r in rows],
            "text": [r["text"] for r in rows],
        },
        features=features,
    ).to_parquet(parquet)
    # Only one class, in renamed columns: a label set read off this file would make "pos" id 0.
    positives = [r for r in _rows(40, 300) if r["label"] == "pos"][:5]
    csv = write_csv(
        tmp_path / "positives.csv", [{"sentiment": r["label"], "review": r["text"]} for r in positives]
    )

    for data, subset, extra in (
        (parquet, rows, []),
        (csv, positives, ["text_column=review", "label_column=sentiment"]),
    ):
        result = evaluate([str(run["dir"] / "model"), "--data", str(data), *extra])
        labels = [r["label"] for r in subset]
        predicted, _ = _predict(run["dir"], [r["text"] for r in subset])
        correct = sum(p == t for p, t in zip(predicted, labels, strict=True))
        assert result["num_samples"] == len(subset)
        assert result["accuracy"] * len(subset) == pytest.approx(correct)
        assert [sum(row) for row in result["confusion_matrix"]] == [labels.count("neg"), labels.count("pos")]
        digest = hashlib.sha256(data.read_bytes()).hexdigest()
        assert result["data_sha256"] == digest
        assert result["metrics_file"] == str(
            run["dir"] / "eval" / f"{data.stem}-{digest[:8]}" / "metrics.json"
        )


def test_a_pair_model_scored_on_single_texts_says_so(tmp_path, capsys, monkeypatch):
    """A model trained on sentence pairs, evaluated with text_pair_column=null: scored, as asked, with one line
    that it never read single texts."""
    from finetune.run import main as train_main

    rows = [{"premise": a["text"], "hypothesis": b["text"], "label": a["label"]}
            for a, b in zip(rotten_rows(12), rotten_rows(12, start=50), strict=True)]  # fmt: skip
    data = write_csv(tmp_path / "pairs.csv", rows)
    train_main(tiny_text_args({"train": data, "validation": data}, tmp_path / "run", "text_column=premise",
                              "text_pair_column=hypothesis", "max_steps=1"))  # fmt: skip
    capsys.readouterr()
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # `[rule.id] ` before each line
    evaluate([str(tmp_path / "run" / "model"), "--data", str(data), "--output", str(tmp_path / "eval"),
              "text_pair_column=null"])  # fmt: skip
    rule = "evaluation.single_texts_for_pairs"
    assert f"warning: [{rule}] text_pair_column=null: this model was trained on sentence pairs " \
           "(text_pair_column=hypothesis)" in capsys.readouterr().err  # fmt: skip
    assert (tmp_path / "eval" / "metrics.json").is_file()
    # the pair under other names (sentence1/sentence2 for a premise/hypothesis model): both named, in order
    other = write_csv(tmp_path / "s12.csv", [{"sentence1": r["premise"], "sentence2": r["hypothesis"],
                                              "label": r["label"]} for r in rows])  # fmt: skip
    user_error(capsys, evaluate, [str(tmp_path / "run" / "model"), "--data", str(other)],
               "if 'sentence1' and 'sentence2' are the pair, set text_column=sentence1 text_pair_column=sentence2")


def test_predictions_carry_the_text_and_its_pair(run, tmp_path, capsys, monkeypatch):
    first, second = _rows(6, 400), _rows(6, 500)
    data = write_csv(
        tmp_path / "pairs.csv",
        [
            {"premise": a["text"], "hypothesis": b["text"], "label": a["label"]}
            for a, b in zip(first, second, strict=True)
        ],
    )
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # `[rule.id] ` before each line
    evaluate(
        [str(run["dir"] / "model"), "--data", str(data), "--predictions", "--output", str(tmp_path / "eval")]
        + ["text_column=premise", "text_pair_column=hypothesis"]
    )
    # the run's model read single texts: scored on pairs, as asked, with one line that says so
    rule = "evaluation.pairs_for_single_texts"
    assert f"warning: [{rule}] text_pair_column=hypothesis: this model was trained on single texts" \
           in capsys.readouterr().err  # fmt: skip
    lines = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert [list(r)[:3] for r in lines] == [["index", "text", "text_pair"]] * 6
    assert [(r["text"], r["text_pair"]) for r in lines] == [
        (a["text"], b["text"]) for a, b in zip(first, second, strict=True)
    ]
    # The pair is what the model read: the probabilities transformers gives for (text, text_pair).
    tokenizer = AutoTokenizer.from_pretrained(run["dir"] / "model")
    model = AutoModelForSequenceClassification.from_pretrained(run["dir"] / "model").eval()
    enc = tokenizer(
        [r["text"] for r in lines],
        [r["text_pair"] for r in lines],
        truncation=True,
        max_length=32,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        expected = model(**enc).logits.softmax(-1)
    got = torch.tensor([[r["probabilities"]["neg"], r["probabilities"]["pos"]] for r in lines])
    assert torch.allclose(got, expected, atol=1e-5)


def _png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    PIL.Image.new("RGB", (30, 30), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_an_image_folder_of_one_class_folder_is_scored_by_it(tiny_vit_folder, tmp_path):
    """--data dogs/ holding dog/*.png alone (how does the model do on dogs?): datasets labels images by their
    folders only when there are two or more; a folder named as a label of the model labels its images, and they
    are scored. A folder named otherwise (batch1/) is data to predict, as before."""
    shades = [(0, 0, 200), (20, 40, 250), (0, 90, 160)]
    drawn_images(tmp_path / "dogs", {"dog": shades}, split="", size=(30, 30))
    record = json.loads(Path(evaluate([str(tiny_vit_folder), "--data", str(tmp_path / "dogs"), "--output",
                                       str(tmp_path / "dogs-eval")])["metrics_file"]).read_text())  # fmt: skip
    assert record["labelled"] is True and record["num_samples"] == 3 and "accuracy" in record
    assert sum(record["confusion_matrix"][1]) == 3 and sum(record["confusion_matrix"][0]) == 0  # all three true dogs
    drawn_images(tmp_path / "new", {"batch1": shades}, split="", size=(30, 30))
    record = json.loads(Path(evaluate([str(tiny_vit_folder), "--data", str(tmp_path / "new"), "--output",
                                       str(tmp_path / "new-eval")])["metrics_file"]).read_text())  # fmt: skip
    assert record["labelled"] is False and record["num_samples"] == 3 and "accuracy" not in record


def test_image_predictions_name_their_files(tiny_vit_folder, tmp_path):
    colors = {"cat": [(200, 0, 0), (180, 30, 10)], "dog": [(0, 0, 200), (20, 40, 250), (0, 90, 160)]}
    folder = drawn_images(tmp_path / "images", colors, split="", size=(30, 30))
    files = {str(path): path.parent.name for path in folder.rglob("*.png")}
    processor = AutoImageProcessor.from_pretrained(tiny_vit_folder)
    model = AutoModelForImageClassification.from_pretrained(tiny_vit_folder).eval()

    def probabilities(images):
        with torch.no_grad():
            return model(**processor(images=images, return_tensors="pt")).logits.softmax(-1)

    # An image folder: each line names its file, and its numbers are that file's.
    evaluate(
        [
            str(tiny_vit_folder),
            "--data",
            str(tmp_path / "images"),
            "--predictions",
            "--output",
            str(tmp_path / "folder"),  # --output is a folder
        ]
    )
    lines = [
        json.loads(line) for line in (tmp_path / "folder" / "predictions.jsonl").read_text().splitlines()
    ]
    assert [r["index"] for r in lines] == list(range(5))
    assert {r["image"]: r["label"] for r in lines} == files
    expected = probabilities([PIL.Image.open(r["image"]).convert("RGB") for r in lines])
    got = torch.tensor([[r["probabilities"]["cat"], r["probabilities"]["dog"]] for r in lines])
    assert torch.allclose(got, expected, atol=1e-5)

    # Images stored in a parquet file: the name kept with the bytes, where there is one; the row always.
    parquet = tmp_path / "images.parquet"
    Dataset.from_dict(
        {
            "image": [
                {"bytes": _png((200, 0, 0)), "path": "red.png"},
                {"bytes": _png((0, 0, 200)), "path": None},
            ],
            "label": ["cat", "dog"],
        },
        features=Features({"image": Image(), "label": Value("string")}),
    ).to_parquet(parquet)
    evaluate(
        [
            str(tiny_vit_folder),
            "--data",
            str(parquet),
            "--predictions",
            "--output",
            str(tmp_path / "parquet"),
        ]
    )
    lines = [
        json.loads(line) for line in (tmp_path / "parquet" / "predictions.jsonl").read_text().splitlines()
    ]
    assert [(r["index"], r["image"], r["label"]) for r in lines] == [(0, "red.png", "cat"), (1, None, "dog")]
    expected = probabilities([PIL.Image.new("RGB", (30, 30), c) for c in ((200, 0, 0), (0, 0, 200))])
    got = torch.tensor([[r["probabilities"]["cat"], r["probabilities"]["dog"]] for r in lines])
    assert torch.allclose(got, expected, atol=1e-5)


def test_help_lists_the_settings_an_evaluation_reads(capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    options, settings = out.split("\nevaluation settings (key=value)", 1)  # after argparse's options
    assert "--predictions" in options and "key=value" in options
    listed = re.findall(r"^  (\w+): ", settings, flags=re.MULTILINE)
    assert listed == [f.name for f in dataclasses.fields(TrainConfig) if f.name in EVAL_KEYS]
    assert set(listed) == set(EVAL_KEYS)
    assert (
        "\n  max_length: int = 128\n      text: tokens per sample; longer texts are truncated\n" in settings
    )
    assert "\n  per_device_eval_batch_size: int = 64\n      evaluation samples per process" in settings
    assert "learning_rate" not in out and "recipe" not in settings  # only what evaluation reads


def _manifest_lost(run, tmp_path):
    copy = tmp_path / "step-00000098"
    shutil.copytree(run["checkpoint"], copy, ignore=shutil.ignore_patterns("eval"))
    (copy / "manifest.json").unlink()
    return str(copy)


def _two_unnamed_files(folder):
    folder.mkdir()
    for name in ("a", "b"):
        write_csv(folder / f"{name}.csv", _rows(4, 0))
    return folder


def _one_image(path):
    PIL.Image.new("RGB", (8, 8)).save(path)
    return path


def _incomplete(run, tmp_path):
    copy = tmp_path / "step-00000099"
    shutil.copytree(run["checkpoint"], copy, ignore=shutil.ignore_patterns("eval"))
    (copy / "COMPLETE").unlink()
    return str(copy)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "checkpoint not found"),
        ("incomplete", "not a complete checkpoint"),
        ("manifest_lost", "manifest.json is missing: the checkpoint cannot say what it holds"),
        ("run_dir", "is a run directory"),
        ("checkpoints_dir", "is a run's folder of checkpoints; evaluate one of them (the newest: "),
        ("folder_without_data", "is a folder without data files (.csv, .tsv, .json"),
        ("unknown_split", "unknown split 'bogus'"),
        ("missing_data", "--data not found"),
        ("data_without_rows", "the data has no rows ("),
        ("tagging_data", "these look like token-classification data, and the model is a text-classification model"),
        ("words_to_tag", "these look like token-classification data, and the model is a text-classification model"),
        ("output_is_a_file", "is a file, not a folder; --output names a folder"),
        ("output_in_a_checkpoint", "which the run in"),
        ("hub_model_offline", "(HF_HUB_OFFLINE is set: download it while online, or give a local directory)"),
        ("foreign_output", "is not a metrics.json written by finetune.evaluate"),
        (
            "training_setting",
            "learning_rate cannot be set when evaluating; evaluation settings are: text_column",
        ),
        ("label_columns_on_single", "label_columns (0/1 columns, one per label) is multi-label data, and this model "
                                    "was trained for single_label_classification: give its labels in one column"),
        ("two_unnamed_files", "holds 2 data sets not named by split (a, b); pass --split with one of them"),
        ("classes_in_another_column", "holds the model's classes (neg, pos); to score it, pass label_column=sentiment"),
        ("one_image", "is one image; give a folder of images"),
        ("a_file", "is a file; give a checkpoint directory"),
        ("lora_adapter", "is a run's LoRA adapter, not a whole model; evaluate the export beside it"),
        ("not_a_model", "is neither a training-state checkpoint (manifest.json, COMPLETE, model.safetensors)"),
        ("split_of_a_file", "--split picks a split of the run's data or of a --data folder, not of a file"),
        ("task_contradicts", "--task image-classification contradicts the checkpoint, a text-classification run"),
        ("no_label_names", "manifest.json has no label_names; it was not written by finetune.run"),
        ("no_run_config", "manifest.json holds no run config; was it written by finetune.run?"),
        ("run_config_fails", "the run config in "),
        ("no_weights", "holds no model.safetensors and no FSDP shards (found: COMPLETE, manifest.json"),
        ("weights_unreadable", "model.safetensors is not a readable safetensors file ("),
        ("weights_do_not_fit", "do not fit the model its config builds: missing ['classifier.bias']"),
        ("output_is_the_target", "is the evaluated folder itself; name another folder"),
        ("outputs_not_ours", "predictions.jsonl exists and was not written by finetune.evaluate; choose another"),
        ("unknown_option", "unrecognized arguments: --bogus (see --help)"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(run, tmp_path, capsys, case, expected):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "metrics.json").write_text('{"accuracy": 1.0}\n')
    (tmp_path / "empty").mkdir()
    args = {
        "missing": [str(tmp_path / "nope" / "checkpoints" / "step-00000001")],
        "incomplete": [_incomplete(run, tmp_path)],
        "manifest_lost": [_manifest_lost(run, tmp_path)],
        "run_dir": [str(run["dir"])],
        "checkpoints_dir": [str(run["dir"] / "checkpoints")],
        "folder_without_data": [str(run["checkpoint"]), "--data", str(tmp_path / "empty")],  # a text model
        "unknown_split": [str(run["checkpoint"]), "--split", "bogus"],
        "missing_data": [str(run["checkpoint"]), "--data", str(tmp_path / "nope.csv")],
        "data_without_rows": [str(run["checkpoint"]), "--data", str(write_csv(tmp_path / "header.csv", [], ["text", "label"]))],
        "words_to_tag": [str(run["checkpoint"]), "--data", str(write_jsonl(tmp_path / "words.jsonl",
                         [{"tokens": ["Ada", "wrote"]}, {"tokens": ["Bob", "ran"]}]))],  # a tagger's data to predict
        "tagging_data": [str(run["checkpoint"]), "--data", str(write_jsonl(tmp_path / "ner.jsonl",
                         [{"tokens": ["Ada", "wrote"], "ner_tags": ["B-PER", "O"]}]))],  # fmt: skip
        "output_is_a_file": [str(run["checkpoint"]), "--output", str(run["dir"] / "results.json")],
        "output_in_a_checkpoint": [str(run["checkpoint"]), "--output", str(run["checkpoint"].parent / "step-00000099")],
        "hub_model_offline": ["bert-base-uncased", "--data", str(write_csv(tmp_path / "d.csv", [{"text": "a", "label": 0}],
                                                                           ["text", "label"]))],  # fmt: skip
        "foreign_output": [str(run["checkpoint"]), "--output", str(tmp_path / "foreign")],  # its metrics.json is not ours
        "training_setting": [str(run["checkpoint"]), "learning_rate=1e-3"],
        "label_columns_on_single": [str(run["dir"] / "model"), "label_columns=[a,b]"],
        "two_unnamed_files": [str(run["dir"] / "model"), "--data", str(_two_unnamed_files(tmp_path / "parts"))],
        "classes_in_another_column": [str(run["dir"] / "model"), "--data", str(write_csv(
            tmp_path / "s.csv", [{"text": r["text"], "sentiment": r["label"]} for r in _rows(6, 0)]))],  # fmt: skip
        "one_image": [str(run["dir"] / "model"), "--data", str(_one_image(tmp_path / "cat.png"))],
    }.get(case)
    made = {  # made only for its case
        "a_file": lambda: [str(run["dir"] / "results.json")],
        "lora_adapter": lambda: [str(_beside_an_export(tmp_path / "lora", "adapter"))],
        "not_a_model": lambda: [str(tmp_path / "empty")],
        "split_of_a_file": lambda: [str(run["checkpoint"]), "--data", str(write_csv(tmp_path / "d.csv", _rows(4, 0))),
                                    "--split", "test"],  # fmt: skip
        "task_contradicts": lambda: [str(run["checkpoint"]), "--task", "image-classification"],
        "no_label_names": lambda: [_edited(run, tmp_path, manifest=lambda m: m.pop("label_names"))],
        "no_run_config": lambda: [_edited(run, tmp_path, manifest=lambda m: m.update(config=None))],
        "run_config_fails": lambda: [_edited(run, tmp_path,
                                             manifest=lambda m: m["config"].update(num_train_epochs="many"))],
        "no_weights": lambda: [_edited(run, tmp_path, weights=lambda w: None)],
        "weights_unreadable": lambda: [_edited(run, tmp_path, weights=lambda w: b"\xff" * 8 + w[8:])],
        "weights_do_not_fit": lambda: [_edited(run, tmp_path, weights=_without_the_classifier_bias)],
        "output_is_the_target": lambda: [str(run["checkpoint"]), "--output", str(run["checkpoint"])],
        "outputs_not_ours": lambda: [str(run["checkpoint"]), "--output",
                                     str(_with_a_file(tmp_path / "o", "predictions.jsonl"))],
        "unknown_option": lambda: [str(run["checkpoint"]), "--bogus"],
    }
    args = made[case]() if case in made else args
    with pytest.raises(SystemExit) as exit_info:
        evaluate(args)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0]
    if case in CASE_RULES:  # the rule that refused it (finetune/checks/evaluation.py)
        assert exit_info.value.__context__.rule == CASE_RULES[case]


# The case of test_user_errors_are_one_line_and_exit_2 that each rule of the evaluation phase (and a few of
# the data's phases) refuses.
CASE_RULES = {
    "missing": "evaluation.not_found", "incomplete": "evaluation.incomplete_checkpoint",
    "manifest_lost": "evaluation.manifest_missing", "run_dir": "evaluation.run_directory",
    "checkpoints_dir": "evaluation.checkpoints_folder", "unknown_split": "evaluation.unknown_split",
    "missing_data": "evaluation.data_not_found", "output_is_a_file": "evaluation.output_a_file",
    "output_in_a_checkpoint": "evaluation.output_replaced_whole", "hub_model_offline": "evaluation.model_config_unloaded",
    "foreign_output": "evaluation.output_not_ours", "training_setting": "evaluation.not_an_eval_setting",
    "label_columns_on_single": "evaluation.label_columns_not_multi", "two_unnamed_files": "evaluation.unnamed_sets",
    "classes_in_another_column": "evaluation.labels_in_another_column", "a_file": "evaluation.a_file",
    "lora_adapter": "evaluation.lora_adapter", "not_a_model": "evaluation.not_a_model",
    "split_of_a_file": "evaluation.split_of_a_file", "task_contradicts": "evaluation.task_contradicts",
    "no_label_names": "evaluation.no_label_names", "no_run_config": "evaluation.no_run_config",
    "run_config_fails": "evaluation.run_config_fails", "no_weights": "evaluation.no_weights",
    "weights_unreadable": "evaluation.weights_unreadable", "weights_do_not_fit": "evaluation.weights_do_not_fit",
    "output_is_the_target": "evaluation.output_is_the_target", "outputs_not_ours": "evaluation.outputs_not_ours",
    "unknown_option": "evaluation.arguments",
    # another phase's rule, met by the evaluated data
    "folder_without_data": "files.no_data_files", "tagging_data": "columns.another_tasks_data",
    "words_to_tag": "columns.another_tasks_data", "one_image": "images.one_image_as_data",
}  # fmt: skip


def _edited(run, tmp_path, manifest=None, weights=None) -> str:
    """A copy of the run's step-2 checkpoint (named as its manifest's step, outside the run), its manifest
    edited by `manifest` (in place) or its model.safetensors' bytes replaced by `weights` (None: removed)."""
    copy = tmp_path / "step-00000002"
    shutil.copytree(run["checkpoint"], copy, ignore=shutil.ignore_patterns("eval"))
    if manifest is not None:
        record = json.loads((copy / "manifest.json").read_text())
        manifest(record)
        (copy / "manifest.json").write_text(json.dumps(record))
    if weights is not None:
        replaced = weights((copy / "model.safetensors").read_bytes())
        (copy / "model.safetensors").unlink()
        if replaced is not None:
            (copy / "model.safetensors").write_bytes(replaced)
    return str(copy)


def _without_the_classifier_bias(data: bytes) -> bytes:
    from safetensors.torch import load, save

    weights = load(data)
    weights.pop("classifier.bias")
    return save(weights)


def _beside_an_export(run: Path, name: str) -> Path:
    (run / "model").mkdir(parents=True)
    (run / name).mkdir()
    return run / name


def _with_a_file(folder: Path, name: str) -> Path:
    folder.mkdir()
    (folder / name).write_text("{}\n")
    return folder


def test_class_ids_are_read_as_the_models_classes_at_those_places(run, tmp_path, capsys, monkeypatch):
    """0/1 for a neg/pos model, as training reads ids through label_names: the same scores as the names,
    with one warning naming the places; for a model saved without names (transformers' LABEL_0, LABEL_1),
    the id is the name's, said in no warning."""
    rows = _rows(6, 0)
    names = write_csv(tmp_path / "names.csv", rows)
    ids = write_csv(tmp_path / "ids.csv", [{"text": r["text"], "label": ["neg", "pos"].index(r["label"])} for r in rows])
    by_name = evaluate([str(run["dir"] / "model"), "--data", str(names), "--output", str(tmp_path / "n")])
    capsys.readouterr()
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # `[rule.id] ` before each line
    by_id = evaluate([str(run["dir"] / "model"), "--data", str(ids), "--output", str(tmp_path / "i")])
    monkeypatch.delenv("FINETUNE_SHOW_RULES")
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert by_id["accuracy"] == by_name["accuracy"] and by_id["num_samples"] == by_name["num_samples"] == 6
    assert any("are class ids, read as the model's classes at those places (0 -> neg, 1 -> pos)" in w for w in warnings)
    rule = "labels.class_ids_read_as_the_models"
    assert any(w.startswith(f"warning: [{rule}] ") for w in warnings), warnings
    unnamed = tmp_path / "unnamed"
    shutil.copytree(run["dir"] / "model", unnamed)
    config = json.loads((unnamed / "config.json").read_text())
    config.pop("id2label"), config.pop("label2id")  # transformers fills in LABEL_0, LABEL_1
    (unnamed / "config.json").write_text(json.dumps(config))
    default = evaluate([str(unnamed), "--data", str(ids), "--output", str(tmp_path / "u")])
    assert default["accuracy"] == by_name["accuracy"]
    assert not [line for line in capsys.readouterr().err.splitlines() if "class ids" in line]
    with pytest.raises(SystemExit) as exit_info:  # its classes by name: the lost names are said, and the fix
        evaluate([str(unnamed), "--data", str(names), "--output", str(tmp_path / "u2")])
    assert exit_info.value.code == 2 and exit_info.value.__context__.rule == "labels.unseen_beside_default_names"
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "those are transformers' default names: the model's config.json holds no id2label" in error


def test_an_export_whose_weights_do_not_fit_its_config_is_one_line(run, tmp_path, capsys):
    """Another model's model.safetensors (a head of 3 labels) copied over a 2-label export."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(run["dir"], tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    export = tmp_path / "run" / "model"
    weights = load_file(export / "model.safetensors")
    head = [k for k in weights if k.startswith("classifier.")]
    assert head, list(weights)[-4:]
    for key in head:
        weights[key] = torch.zeros(3, *weights[key].shape[1:])
    save_file(weights, export / "model.safetensors")
    user_error(capsys, evaluate, [str(export)], "names 2 labels (id2label) but its model.safetensors' classifier has "
               "3 outputs: one of the two files was edited or replaced", rule="evaluation.head_rows_differ")  # fmt: skip
    # the right shapes, NaN values: refused, not scored
    for key in head:
        weights[key] = torch.full((2, *weights[key].shape[1:]), float("nan"))
    save_file(weights, export / "model.safetensors")
    user_error(capsys, evaluate, [str(export)], "hold NaN or infinite values (classifier.", rule="evaluation.nan_weights")
    # a weight of the encoder gone: transformers would fill it at random
    weights = load_file(export / "model.safetensors")
    weights.pop(next(k for k in weights if not k.startswith("classifier.")))
    for key in head:
        weights[key] = torch.zeros(2, *weights[key].shape[1:])
    save_file(weights, export / "model.safetensors")
    user_error(capsys, evaluate, [str(export)], "do not fit its config.json (another model's model.safetensors",
               "1 weight(s) missing", rule="evaluation.foreign_weights")  # fmt: skip
    # its weights file a folder: said as such, not as missing
    (export / "model.safetensors").unlink()
    (export / "model.safetensors").mkdir()
    user_error(capsys, evaluate, [str(export)], "model.safetensors is a folder, not a weights file",
               rule="evaluation.weights_a_folder")
    # no weights file at all, or one cut short
    (export / "model.safetensors").rmdir()
    user_error(capsys, evaluate, [str(export)], f"could not load the text-classification model '{export}': ",
               rule="evaluation.model_unloaded")
    save_file({k: v for k, v in load_file(run["dir"] / "model" / "model.safetensors").items()},
              export / "model.safetensors")
    (export / "model.safetensors").write_bytes((export / "model.safetensors").read_bytes()[:2000])
    user_error(capsys, evaluate, [str(export)], "(its weights file is damaged: replace it)",
               rule="evaluation.model_weights_damaged")
    # the export alone (out of its run), its own weights, a label added to config.json by hand: the other way
    alone = shutil.copytree(run["dir"] / "model", tmp_path / "alone")
    config = json.loads((alone / "config.json").read_text())
    config["id2label"]["2"], config["label2id"]["neutral"] = "neutral", 2
    (alone / "config.json").write_text(json.dumps(config))
    data = write_csv(tmp_path / "d.csv", _rows(6, 0))
    line = user_error(capsys, evaluate, [str(alone), "--data", str(data)], "names 3 labels (id2label) but its "
                      "model.safetensors' classifier has 2 outputs", rule="evaluation.head_rows_differ")  # fmt: skip
    assert "above report" not in line


def test_an_export_without_its_tokenizer_files_is_named_and_not_the_runs_tokenizer(run, tmp_path, capsys):
    """The export's own tokenizer is what evaluation loads: the line names the export and the fix for it,
    not the run's tokenizer_name (a setting evaluation does not take)."""
    shutil.copytree(run["dir"], tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    export = tmp_path / "run" / "model"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (export / name).unlink(missing_ok=True)
    user_error(capsys, evaluate, [str(export)], f"the tokenizer of {export} has no vocabulary, only its 5 special "
               "tokens: the folder holds no tokenizer files (vocab.txt, tokenizer.json); copy the tokenizer files "
               "of the model it was trained from into it")


def test_a_damaged_json_file_of_an_export_is_named(run, tmp_path, capsys):
    """A file of the export cut short: the line names the file that does not parse, not only the JSON
    decoder's words (which say neither which file nor what to do)."""
    shutil.copytree(run["dir"], tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "eval"))
    export = tmp_path / "run" / "model"
    for name in ("tokenizer.json", "config.json"):
        original = (export / name).read_bytes()
        (export / name).write_bytes(original[:1000] if name == "tokenizer.json" else original[:40])
        user_error(capsys, evaluate, [str(export)], f"{export / name} is not valid JSON (",
                   "put back the file the run saved", "<run>/checkpoints/step-N", rule="evaluation.damaged_json")  # fmt: skip
        (export / name).write_bytes(original)


def test_a_damaged_results_or_config_of_the_run_is_named(run, tmp_path, capsys, monkeypatch):
    """The run's results.json or config.yaml beside the export no longer parses: said as such (not as
    missing), with both fixes; with --data the export is evaluated alone, as the line offers."""
    shutil.copytree(run["dir"], tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "eval"))
    folder = tmp_path / "run"
    data = write_csv(tmp_path / "few.csv", _rows(3, 300))
    for name, damage in (("results.json", b'{"label_names": ["neg", "po'), ("config.yaml", b"task: [text\n")):
        original = (folder / name).read_bytes()
        (folder / name).write_bytes(damage)
        fmt = "JSON" if name == "results.json" else "YAML"
        user_error(capsys, evaluate, [str(folder / "model")],
                   f"{folder / name} exists but is damaged (not valid {fmt}", "restore it",
                   "or pass --data FILE_OR_DIR", rule="evaluation.run_file_damaged")  # fmt: skip
        monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # `[rule.id] ` before each line
        result = evaluate([str(folder / "model"), "--data", str(data), "--output", str(tmp_path / name)])
        monkeypatch.delenv("FINETUNE_SHOW_RULES")
        assert result["num_samples"] == 3
        rule = "evaluation.run_file_damaged_alone"
        assert f"[{rule}] {folder / name} exists but is damaged" in capsys.readouterr().err
        (folder / name).write_bytes(original)
    (folder / "results.json").write_text("[]\n")  # valid JSON, but not a run's results
    user_error(capsys, evaluate, [str(folder / "model")],
               "results.json exists but is damaged (not a JSON object")  # fmt: skip
    (folder / "results.json").unlink()  # the line names the one file that is missing, not both
    line = user_error(capsys, evaluate, [str(folder / "model")], "is a model folder without its run's results.json one "
                      "level up; pass --data FILE_OR_DIR", rule="evaluation.export_without_run")  # fmt: skip
    assert "config.yaml" not in line


def test_the_best_model_of_a_search_names_the_best_trials_export(run, tmp_path, capsys):
    """A search's `<output_dir>/model` (the path it prints at its end) is a copy of the best trial's export
    without a run one level up: the line names that trial's export, which evaluates on its run's data. The
    folder as finetune/search.py leaves it: its study, best_recipe.yaml, search.json, each trial a run, only
    the best one with its weights."""
    search = tmp_path / "search"
    shutil.copytree(run["dir"], search / "trial-0", ignore=shutil.ignore_patterns("checkpoints", "eval", "model"))
    shutil.copytree(run["dir"], search / "trial-1", ignore=shutil.ignore_patterns("checkpoints", "eval"))
    shutil.copytree(search / "trial-1" / "model", search / "model")
    (search / "study.db").write_bytes(b"SQLite format 3\x00")
    (search / "best_recipe.yaml").write_text("# The best of 2 trials of finetune.search (trial 1)\n"
                                             + (run["dir"] / "config.yaml").read_text())  # fmt: skip
    record = {"best_trial": 1, "value": 0.5, "params": {"learning_rate": 1e-3}, "trials": 2, "continues": None}
    (search / "search.json").write_text(json.dumps(record, indent=2))
    best = search / "trial-1" / "model"
    for told in ("search.json", "the one trial with its weights"):  # search.json gone: the trial that kept them
        line = user_error(capsys, evaluate, [str(search / "model")], f"{search / 'model'} is the best model of the "
                          f"search in {search}", f"evaluate the best trial's export, {best} (its run's data",
                          "or pass --data FILE_OR_DIR", untouched=search, rule="evaluation.export_of_a_search")  # fmt: skip
        assert "one level up" not in line, told
        (search / "search.json").unlink(missing_ok=True)
    result = evaluate([str(best), "--output", str(tmp_path / "best")])  # as the line says
    assert result["split"] == "test" and result["num_samples"] == 11
    shutil.rmtree(best)  # no whole best trial: --data is the one way
    line = user_error(capsys, evaluate, [str(search / "model")], "is the best model of the search",
                      "the best trial's run with its export (trial-N/model", "pass --data FILE_OR_DIR",
                      rule="evaluation.export_of_a_search")  # fmt: skip


def test_whole_numbers_stored_as_floats_are_class_ids_of_a_model_with_numbered_classes(run, tmp_path, capsys):
    """Labels written 1.0/0.0 (a CSV saved by pandas): for a model whose classes are "0", "1" they are
    those classes; for a model with named classes (neg, pos) the line says to write the names.
    problem_type, which training's line offers, is no evaluation setting."""
    shutil.copytree(run["dir"], tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "eval"))
    export = tmp_path / "run" / "model"
    rows = rotten_rows(5, 300)  # labels "0" (neg) and "1" (pos)
    floats = write_csv(tmp_path / "floats.csv",
                       [{"text": r["text"], "label": f"{r['label']}.0"} for r in rows])  # fmt: skip
    line = user_error(capsys, evaluate, [str(export), "--data", str(floats)],
                      "label column 'label' of --data",
                      "holds numbers (e.g. 1), but the model's classes are named (neg, pos)",
                      "write each row's class name", rule="evaluation.numbers_for_named_classes")  # fmt: skip
    assert "problem_type" not in line
    decimals = write_csv(tmp_path / "decimals.csv", [{"text": "fine", "label": "0.5"}])
    user_error(capsys, evaluate, [str(export), "--data", str(decimals)],
               "holds numbers with decimals (e.g. 0.5)", "write each row's class name")  # fmt: skip
    # The same model with classes named by their ids, as a run on a column of 0/1 integers names them.
    config = json.loads((export / "config.json").read_text())
    config.update(id2label={"0": "0", "1": "1"}, label2id={"0": 0, "1": 1})
    (export / "config.json").write_text(json.dumps(config))
    results = json.loads((export.parent / "results.json").read_text())
    (export.parent / "results.json").write_text(json.dumps({**results, "label_names": ["0", "1"]}))
    result = evaluate([str(export), "--data", str(floats), "--predictions"])
    labels = [r["label"] for r in rows]
    assert result["label_names"] == ["0", "1"] and result["num_samples"] == 5
    assert [sum(row) for row in result["confusion_matrix"]] == [labels.count("0"), labels.count("1")]
    written = Path(result["metrics_file"]).with_name("predictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["label"] for line in written] == labels
    half = write_csv(tmp_path / "half.csv", [{"text": "fine", "label": "1.5"}])
    user_error(capsys, evaluate, [str(export), "--data", str(half)], "holds numbers with decimals (e.g. 1.5), but the "
               "model's classes are 0, 1: write each row's class as one of them (1, not 1.0)",
               rule="evaluation.fractions_for_numbered_classes")  # fmt: skip
    two = write_csv(tmp_path / "two.csv", [{"text": "fine", "label": "2.0"}])  # no class "2": refused
    user_error(capsys, evaluate, [str(export), "--data", str(two)], "labels ['2'] were not seen in training")


@pytest.mark.slow
def test_unseen_label_from_the_command_line(run, tmp_path):
    data = write_csv(
        tmp_path / "unseen.csv", [{"text": "fine", "label": "pos"}, {"text": "odd", "label": "meh"}]
    )
    result = subprocess.run(
        [sys.executable, "finetune/evaluate_checkpoint.py", str(run["dir"] / "model"), "--data", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "['meh']" in last and "neg, pos" in last
    assert not (
        run["dir"] / "model" / "eval" / f"unseen-{hashlib.sha256(data.read_bytes()).hexdigest()[:8]}"
    ).exists()


def test_a_pretrained_config_with_a_legacy_key_builds_for_a_checkpoint(tmp_path):
    """The bundled MiniLM's config.json has `gradient_checkpointing`, which today's BertConfig does not
    know (model_config refuses such a key, a typo's symptom): the architecture of a training-state
    checkpoint is built from the keys the class knows."""
    from finetune.config import load_config
    from finetune.evaluate_checkpoint import architecture_only
    from finetune.models import build_model

    pretrained = tmp_path / "pretrained"
    tiny_bert_config().save_pretrained(pretrained)
    config = json.loads((pretrained / "config.json").read_text())
    (pretrained / "config.json").write_text(json.dumps({**config, "gradient_checkpointing": False}))
    args = load_config(None, [f"model_name_or_path={pretrained}", f"output_dir={tmp_path / 'o'}"]).model_args
    spec = architecture_only(args).model_config
    assert "gradient_checkpointing" not in spec and spec["hidden_size"] == 32
    model = build_model(architecture_only(args), ["a", "b"], vocab_size=100)
    assert model.config.num_labels == 2 and model.config.hidden_size == 32


# --- a checkpoint of a model fine-tuned from pretrained weights ----------------------------------

# What transformers' load report says of weights the checkpoint lacks or does not use.
LOAD_REPORT = ("newly initialized", "MISSING", "UNEXPECTED", "LOAD REPORT", "were not initialized")


@pytest.fixture(scope="module")
def pretrained_run(finished_run, tmp_path_factory):
    """A tiny masked-LM BERT saved as a 'pretrained' folder (no classification head, an MLM head the
    classifier does not use), fine-tuned for 2 optimizer steps: evaluated and saved at step 2 (a copy of
    the factory's run: the evaluation writes into its eval/ folder)."""
    root = tmp_path_factory.mktemp("pretrained")
    base = save_tiny_bert(root / "tiny-bert-mlm", model_class="BertForMaskedLM")
    settings = ("model_config=null", f"model_name_or_path={base}", "tokenizer_name=null", "max_steps=2",
                "save_steps=2", "per_device_train_batch_size=8")  # fmt: skip
    out = finished_run.copy(root / "run", *settings)
    return {"base": base, "checkpoint": out / "checkpoints" / "step-00000002"}


@pytest.fixture
def transformers_log(caplog):
    """What transformers logs, in caplog: its loggers do not propagate to the root logger, where caplog
    listens, and their handler holds the stderr of the moment transformers was imported."""
    logging.enable_propagation()
    caplog.set_level("WARNING", logger="transformers")  # what a user sees
    yield caplog
    logging.disable_propagation()


def test_checkpoint_loads_without_a_load_report_and_gives_the_recorded_metrics(
    pretrained_run, transformers_log, capsys
):
    transformers_log.clear()
    capsys.readouterr()
    # log_level=warning: transformers' warnings shown (the default, error, would hide a report anyway)
    result = evaluate([str(pretrained_run["checkpoint"]), "--split", "validation", "log_level=warning"])
    out, err = capsys.readouterr()
    printed = out + err + transformers_log.text
    for text in LOAD_REPORT:
        assert text not in printed, printed[-3000:]
    assert "validation: accuracy" in out

    recorded = json.loads((pretrained_run["checkpoint"] / "manifest.json").read_text())["metrics"]
    assert result["num_samples"] == recorded["num_samples"] == 13
    assert result["confusion_matrix"] == recorded["confusion_matrix"]
    assert result["accuracy"] == recorded["accuracy"] and result["macro_f1"] == recorded["macro_f1"]
    assert result["loss"] == pytest.approx(recorded["loss"], abs=1e-6)  # another batch order, same rows

    # The check can see a report: loading the pretrained folder as a classifier logs one.
    AutoModelForSequenceClassification.from_pretrained(pretrained_run["base"])
    assert "MISSING" in transformers_log.text and "newly initialized" in transformers_log.text


def test_a_multi_label_export_carries_its_tuned_thresholds(tmp_path):
    rows = [{"text": f"{'sports' if i % 2 else 'news'} item {i}", "labels": ["a"] if i % 3 else ["a", "b"]}
            for i in range(30)]  # fmt: skip
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"train": path, "validation": path}
    main(recipe_text_args(data, tmp_path / "run", "label_column=labels", "max_steps=3", "tune_threshold=per_label",
              "class_weights=balanced", "label_smoothing=0.0"))  # fmt: skip
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert len(config["multi_label_thresholds"]) == 2
    evaluate([str(tmp_path / "run" / "model"), "--data", str(path), "--output", str(tmp_path / "ev")])
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["threshold"] == config["multi_label_thresholds"]


def test_evaluations_go_outside_the_export_and_data_without_labels_is_predicted(small_text_data, tmp_path, monkeypatch):
    out = tmp_path / "run"
    main(recipe_text_args(small_text_data, out, "max_steps=2"))
    evaluate([str(out / "model")])
    assert (out / "eval" / "validation" / "metrics.json").is_file()
    assert not (out / "model" / "eval").exists()  # an export is shared: the user's data stays out of it
    unlabelled = write_csv(tmp_path / "new.csv", [{"doc_id": f"d{i}", "text": r["text"], "source": "web"}
                                                  for i, r in enumerate(rotten_rows(5, start=300))])  # fmt: skip
    monkeypatch.chdir(tmp_path)
    evaluate([str(out / "model"), "--data", str(unlabelled), "--output", "eval-0.5"])
    folder = tmp_path / "eval-0.5"  # always a folder, whatever its name looks like
    record = json.loads((folder / "metrics.json").read_text())
    assert record["labelled"] is False and record["num_samples"] == 5 and "accuracy" not in record
    lines = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert [r["text"] for r in lines] == [r["text"] for r in rotten_rows(5, start=300)]
    # the data's own ids come along, to join the predictions back by; other columns do not
    assert [r["doc_id"] for r in lines] == [f"d{i}" for i in range(5)] and not any("source" in r for r in lines)
    assert all(r["prediction"] in ("0", "1") for r in lines)
    assert not any("label" in r for r in lines)  # no gold label made up for data that has none
    # a label column kept in the header with no value in any row: predicted too, not "fill them in"
    header_only = write_csv(tmp_path / "blank.csv", [{"text": r["text"], "label": ""} for r in rotten_rows(5, start=300)])
    evaluate([str(out / "model"), "--data", str(header_only), "--output", "eval-blank"])
    assert json.loads((tmp_path / "eval-blank" / "metrics.json").read_text())["labelled"] is False


def test_two_models_of_one_name_never_share_a_default_evaluation(finished_run, tmp_path, monkeypatch, capsys):
    """Two exports each in a folder named `model`, outside a run, evaluated on one file: both default to
    ./eval/model/<data>/. The second is refused (it would have replaced the first); the first evaluated
    again replaces its own."""
    import shutil

    first = Path(shutil.copytree(finished_run() / "model", tmp_path / "a" / "model"))
    second = Path(shutil.copytree(finished_run("seed=7") / "model", tmp_path / "b" / "model"))
    data = write_csv(tmp_path / "test.csv", rotten_rows(6, start=300))
    monkeypatch.chdir(tmp_path)
    evaluate([str(first), "--data", str(data)])
    (folder,) = (tmp_path / "eval" / "model").iterdir()
    before = (folder / "metrics.json").read_bytes()
    line = user_error(capsys, evaluate, [str(second), "--data", str(data)], rule="evaluation.another_models_evaluation")
    assert f"holds the evaluation of another model of the same name ('{first}', its weights' sha256 " in line
    assert "on the same data; pass --output" in line
    assert (folder / "metrics.json").read_bytes() == before
    evaluate([str(first), "--data", str(data)])
    assert "(replaced the previous one)" in capsys.readouterr().out


def test_a_copied_run_evaluates_as_its_own_and_other_weights_in_it_are_refused(finished_run, tmp_path, capsys):
    """A finished and evaluated run copied whole (cp -r) to another place evaluates there: its eval/ holds the
    evaluation of the same weights (metrics.json's weights_sha256), recorded under the first path. The copy's
    model/ given another model's weights is another model: its evaluation is refused, the previous one kept."""
    first = finished_run.copy(tmp_path / "first")
    evaluate([str(first / "model")])
    (folder,) = (first / "eval").iterdir()
    record = json.loads((folder / "metrics.json").read_text())
    assert record["weights_sha256"] == hashlib.sha256((first / "model" / "model.safetensors").read_bytes()).hexdigest()
    copy = Path(shutil.copytree(first, tmp_path / "elsewhere" / "copy"))
    evaluate([str(copy / "model")])
    assert "(replaced the previous one)" in capsys.readouterr().out
    again = json.loads((copy / "eval" / folder.name / "metrics.json").read_text())
    assert again["checkpoint"] == str(copy / "model") and again["weights_sha256"] == record["weights_sha256"]
    assert again["accuracy"] == record["accuracy"]
    shutil.copyfile(finished_run("seed=7") / "model" / "model.safetensors", copy / "model" / "model.safetensors")
    before = file_hashes(copy / "eval")
    line = user_error(capsys, evaluate, [str(copy / "model")], rule="evaluation.another_models_evaluation")
    assert f"holds the evaluation of another model of the same name ('{copy / 'model'}', its weights' sha256 " in line
    assert file_hashes(copy / "eval") == before


def test_predictions_without_labels_use_the_tuned_thresholds(multi_label_export, tmp_path):
    text = "the cat saw a dog"
    labelled = predicted_by_evaluate(multi_label_export, [{"text": text, "labels": ["cat"]}], tmp_path / "labelled")
    assert predicted_by_evaluate(multi_label_export, [{"text": text}], tmp_path / "new") == labelled


def test_the_runs_own_split_read_from_an_edited_file_is_said(run, tmp_path, capsys, monkeypatch):
    """results.json keeps the sha256 of each data file; evaluating the run's own split from a file whose
    bytes changed since says so in one line (the scores are not the run's), and not when it is unchanged."""
    import yaml

    recorded = json.loads((run["dir"] / "results.json").read_text())["data_sha256"]
    assert recorded[str(Path(run["test"]).resolve())] == hashlib.sha256(Path(run["test"]).read_bytes()).hexdigest()
    folder = tmp_path / "run"
    shutil.copytree(run["dir"], folder, ignore=shutil.ignore_patterns("checkpoints", "eval"))
    test = tmp_path / "test.csv"
    shutil.copy(run["test"], test)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, "test_file": str(test)}))
    results = json.loads((folder / "results.json").read_text())
    results["data_sha256"] = {str(test.resolve()): hashlib.sha256(test.read_bytes()).hexdigest()}
    (folder / "results.json").write_text(json.dumps(results))
    evaluate([str(folder / "model"), "--output", str(tmp_path / "same")])
    assert "changed since the run" not in capsys.readouterr().err
    test.write_text(test.read_text().replace(",neg\n", ",pos\n", 1))
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # `[rule.id] ` before each line
    evaluate([str(folder / "model"), "--output", str(tmp_path / "edited")])
    err = capsys.readouterr().err
    rule = "evaluation.data_changed"
    assert f"warning: [{rule}] {test.resolve()} changed since the run trained on it (its sha256 differs" in err
    # the run's data gone: training's line, said as the run's data's, with the way round it
    test.unlink()
    user_error(capsys, evaluate, [str(folder / "model"), "--output", str(tmp_path / "gone")], str(test),
               "(reading the run's data; pass --data FILE_OR_DIR to evaluate other data)",
               rule="evaluation.runs_data_unread")  # fmt: skip


def test_a_second_checkpoint_on_the_command_line_is_refused_as_such(tmp_path, capsys):
    from conftest import user_error

    model = str(REPO / "data" / "bert_minilm_l6_uncased")
    user_error(capsys, evaluate, [model, str(tmp_path)], f"{tmp_path} is a second model or checkpoint; one command",
               rule="evaluation.second_model")


@pytest.mark.parametrize("task", [None, "text-classification"])
def test_a_pretrained_base_model_is_refused_as_such(pretrained_run, task, tmp_path, capsys):
    """A masked-LM BERT (no classifier, transformers' default labels) given to the evaluation, with or
    without --task: not "pass --task ...", nor damaged weights, but what it is and what to evaluate."""
    data = write_csv(tmp_path / "test.csv", rotten_rows(6))
    base = pretrained_run["base"]
    line = user_error(capsys, evaluate, [str(base), "--data", str(data), "--output", str(tmp_path / "ev"),
                                         *(["--task", task] if task else [])])  # fmt: skip
    assert f"{base} is a pretrained base model (BertForMaskedLM), not a fine-tuned one: it has no classifier" in line
    assert not (tmp_path / "ev").exists()


def test_labels_of_another_problem_type_than_the_exports_name_the_model_not_a_setting(run, tmp_path, capsys,
                                                                                      monkeypatch):  # fmt: skip
    """A single-label export scored on multi-label lists, a regression export on class names: training's
    line offers problem_type=, which evaluation does not take (a hostile round's two misleading lines).
    The line says what the export is and what to do instead."""
    from conftest import regression_rows

    export = run["dir"] / "model"
    lists = write_jsonl(tmp_path / "lists.jsonl", [{"text": "a fine film", "label": ["neg", "pos"]},
                                                   {"text": "dull", "label": ["neg"]}])  # fmt: skip
    line = user_error(capsys, evaluate, [str(export), "--data", str(lists), "--output", str(tmp_path / "e1")],
                      "label column 'label' of --data", "holds lists of labels", "this export is a single-label "
                      "classifier", "drop that column to predict without labels",
                      rule="evaluation.labels_of_another_problem")  # fmt: skip
    assert "problem_type" not in line
    data = {"train": write_jsonl(tmp_path / "train.jsonl", regression_rows(12, seed=0)),
            "validation": write_jsonl(tmp_path / "validation.jsonl", regression_rows(6, seed=1))}
    main(tiny_text_args(data, tmp_path / "reg", "label_column=score", "max_steps=1"))
    names = write_csv(tmp_path / "names.csv", [{"text": "good", "score": "pos"}, {"text": "bad", "score": "neg"}])
    line = user_error(capsys, evaluate, [str(tmp_path / "reg" / "model"), "--data", str(names), "--output",
                                         str(tmp_path / "e2")],
                      "label column 'score' of --data", "holds class names (e.g. 'pos')", "this export is a "
                      "regression model", rule="evaluation.labels_of_another_problem")  # fmt: skip
    assert "problem_type" not in line
    # numbers with a unit keep their own line (how to write them), beside the same regression export
    units = write_csv(tmp_path / "units.csv", [{"text": "good", "score": "81%"}, {"text": "bad", "score": "12%"}])
    user_error(capsys, evaluate, [str(tmp_path / "reg" / "model"), "--data", str(units), "--output",
                                  str(tmp_path / "e3")], "written with a unit", rule="labels.dressed_numbers")  # fmt: skip
    # The same export on its own training file, and on targets of another scale: scored, and said.
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # `[rule.id] ` before each line
    evaluate([str(tmp_path / "reg" / "model"), "--data", str(data["train"]), "--output", str(tmp_path / "e4")])
    rule = "evaluation.training_data"
    assert f"warning: [{rule}] --data " in capsys.readouterr().err
    x100 = write_jsonl(tmp_path / "x100.jsonl", [{**r, "score": r["score"] * 100 + 500} for r in regression_rows(6, 2)])
    evaluate([str(tmp_path / "reg" / "model"), "--data", str(x100), "--output", str(tmp_path / "e5")])
    rule = "evaluation.another_scale"
    assert f"warning: [{rule}] 6 of the 6 targets of x100-" in capsys.readouterr().err


def test_a_file_without_the_models_text_column_names_the_setting(run, tmp_path, capsys):
    """The texts under another name beside a label column of words ('review' and 'stars'), and a pair
    model given one text: each line says which setting to give (a hostile round's two lines named none)."""
    export = run["dir"] / "model"
    reviews = write_csv(tmp_path / "reviews.csv", [{"review": "a long and winding film about the sea", "stars": "good"},
                                                   {"review": "dull from the first scene to the last", "stars": "bad"}])
    user_error(capsys, evaluate, [str(export), "--data", str(reviews), "--output", str(tmp_path / "e1")],
               "column 'text' not found", "if 'review' is that column, set text_column=review")  # fmt: skip
    data = {"train": write_jsonl(tmp_path / "pairs.jsonl", [{"text": f"first {i}", "s2": f"second {i % 3}",
                                                             "label": ["a", "b"][i % 2]} for i in range(16)])}
    data["validation"] = data["train"]
    main(tiny_text_args(data, tmp_path / "pair", "text_pair_column=s2", "max_steps=1"))
    one = write_csv(tmp_path / "one.csv", [{"text": "only one text"}, {"text": "and another"}])
    user_error(capsys, evaluate, [str(tmp_path / "pair" / "model"), "--data", str(one), "--output", str(tmp_path / "e2")],
               "column 's2' not found", "the model reads pairs of texts, the second in 's2'",
               "set text_pair_column=<its name>")  # fmt: skip


def test_a_regressions_target_under_a_targets_name_is_named():
    """A regression model that reads `score`, on a file whose numbers are in `label`: scored on nothing, it
    would only predict; the column is named, with label_column. An id column of numbers is not a target."""
    from types import SimpleNamespace

    from finetune.checks.evaluation import unread_label_column as _unread_label_column

    args = SimpleNamespace(text_column="text", text_pair_column=None, image_column="image", tokens_column="tokens",
                           label_column="score", problem_type="regression")  # fmt: skip
    ds = Dataset.from_dict({"text": ["a", "b"], "idx": [0, 1], "label": [0.5, 3.0]})
    assert _unread_label_column(ds, args, ["score"]) == ("label", "numbers, as the model's target 'score' does")
    assert _unread_label_column(ds.remove_columns("label"), args, ["score"]) is None


def test_multi_label_lists_for_a_model_of_label_columns_are_named():
    """A multi-label model trained on 0/1 columns, evaluated on a file whose `labels` holds lists of its labels:
    labels, not data to predict; the line gives both settings."""
    from types import SimpleNamespace

    from finetune.checks.evaluation import unread_label_column as _unread_label_column

    args = SimpleNamespace(text_column="text", text_pair_column=None, image_column="image", tokens_column="tokens",
                           label_column="labels", problem_type="multi_label_classification")  # fmt: skip
    names = ["action", "comedy", "drama"]
    ds = Dataset.from_dict({"text": ["a", "b"], "labels": [["comedy", "drama"], ["action"]]})
    assert _unread_label_column(ds, args, names) == ("labels", "lists of the model's labels")
    other = Dataset.from_dict({"text": ["a", "b"], "tags": [["x"], ["y"]]})
    assert _unread_label_column(other, args, names) is None


def test_a_split_the_runs_files_lack_is_refused_before_the_data_is_read(tmp_path, monkeypatch):
    """--split test for a run given no test_file: the one line comes before the run's data is loaded, so no
    warning about that data (its labels read as ids, say) is printed first."""
    from finetune import evaluate_checkpoint as ec
    from finetune.config import DataArgs
    from finetune.errors import UserError

    def read(_args):
        raise AssertionError("the run's data was read before the split was checked")

    monkeypatch.setattr(ec, "load_splits", read)
    args = DataArgs(train_file=str(write_csv(tmp_path / "train.csv", _rows(4, 0))))
    with pytest.raises(UserError, match=r"^unknown split 'test'; the run's data has: train, validation$") as e:
        ec.run_split(args, "test")
    assert e.value.rule == "evaluation.unknown_split"


def test_a_folder_of_class_folders_is_named_without_a_split_it_does_not_have(tiny_vit_folder, tmp_path, capsys):
    """An image folder without split folders (its class folders at the top) is one set of data: a line about
    it names the folder, not a "[train]" split the user never made."""
    birds = tmp_path / "birds"
    drawn_images(birds, {"bird": [(0, 200, 0)], "cat": [(200, 0, 0)]}, split="", size=(30, 30))
    line = user_error(capsys, evaluate, [str(tiny_vit_folder), "--data", str(birds), "--output", str(tmp_path / "o")],
                      f"--data {birds} labels ['bird'] were not seen in training")  # fmt: skip
    assert "[train]" not in line


def test_an_export_that_is_not_its_runs_or_a_file_of_labels_by_another_name_is_named(run, tmp_path, capsys):
    """An export whose config.json names other labels than its run trained (id2label edited), and --data whose
    label column is the model's in another case ('Label'): each said as such, with the fix."""
    shutil.copytree(run["dir"], tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "eval"))
    export = tmp_path / "run" / "model"
    data = write_csv(tmp_path / "Label.csv", [{"text": r["text"], "Label": r["label"]} for r in _rows(6, 0)])
    user_error(capsys, evaluate, [str(export), "--data", str(data), "--output", str(tmp_path / "e")],
               "column 'Label' of", "looks like the label column 'label' in another case; to score it, pass "
               "label_column=Label", rule="evaluation.label_column_twin")  # fmt: skip
    config = json.loads((export / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "pos", "1": "neg"}, {"pos": 0, "neg": 1}
    (export / "config.json").write_text(json.dumps(config))
    user_error(capsys, evaluate, [str(export)], "config.json names the labels ['pos', 'neg'], but its run",
               "id2label was edited", rule="evaluation.labels_differ_from_run")  # fmt: skip


def test_a_multi_label_export_names_columns_of_its_labels_and_thresholds_edited_by_hand(multi_label_export,
                                                                                         tmp_path, capsys):  # fmt: skip
    """0/1 columns named as a multi-label model's labels, given without label_columns: labels, not inputs; and
    config.json's multi_label_thresholds edited to a value outside [0, 1]."""
    from conftest import ANIMALS, multi_label_rows

    rows = [{"text": r["text"], **{a: int(a in r["labels"]) for a in ANIMALS}} for r in multi_label_rows(6, seed=3)]
    columns = write_csv(tmp_path / "animals.csv", rows)
    user_error(capsys, evaluate, [str(multi_label_export), "--data", str(columns), "--output", str(tmp_path / "e")],
               "has a column for each of the model's labels (bird, cat, dog)", "label_columns=[bird,cat,dog]",
               rule="evaluation.a_column_per_label")  # fmt: skip
    export = shutil.copytree(multi_label_export, tmp_path / "model")
    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "multi_label_thresholds": 1.5}))
    data = write_jsonl(tmp_path / "lists.jsonl", multi_label_rows(6, seed=3))
    user_error(capsys, evaluate, [str(export), "--data", str(data), "--output", str(tmp_path / "e2"), "label_column=labels"],
               "config.json has multi_label_thresholds=1.5: it must be one number or one for each of its 3 labels",
               rule="evaluation.thresholds")  # fmt: skip


def test_an_evaluation_that_cannot_be_written_leaves_nothing(run, tmp_path, monkeypatch, capsys):
    """A full disk while the outputs are written: one line with what to do, and no folder left behind."""
    import errno

    from finetune import evaluate_checkpoint as ec

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ec, "plot_confusion_matrix", full)
    out = tmp_path / "new" / "eval"
    user_error(capsys, evaluate, [str(run["checkpoint"]), "--output", str(out)], f"cannot write the evaluation to {out}: "
               "No space left on device; nothing of it was left there; free some space", rule="evaluation.write_failed")
    assert not (tmp_path / "new").exists()


def test_tags_written_as_numbers_are_said_and_guards_of_empty_data_answer():
    """Rules asked directly: numbered tags (a warning: read as the model's tags at those places), and the guards
    of data that leaves nothing to score, which the loaders' own rules (files.no_rows) meet first today."""
    from types import SimpleNamespace

    from finetune import checks
    from finetune.checks import evaluation

    ds = Dataset.from_dict({"tokens": [["Ada", "ran"]], "ner_tags": [[1, 0]]})
    said = checks.Said(quiet=True)
    checks.gate(evaluation.TAGS, ds, SimpleNamespace(tags_column="ner_tags", label_names=["O", "B-PER"]), "--data x",
                said=said)  # fmt: skip
    assert said.rules() == ["evaluation.numbered_tags"] and "(0=O, 1=B-PER, ...)" in said.lines[0][1]
    assert checks.first(evaluation.ROWS, "--data x", 0)[0].id == "evaluation.no_rows"
    assert checks.first(evaluation.SAMPLES, 0, {"data": "x.csv", "split": None})[0].id == "evaluation.no_samples"
    assert checks.first(evaluation.ROWS, "--data x", 3) is None


# --- an FSDP checkpoint, by 1 and 2 processes ---------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_checkpoint(tmp_path_factory) -> Path:
    """A tiny BERT trained for 2 steps by 2 CPU processes under accelerate_configs/fsdp.yaml, with the test
    hook of tests/test_fsdp.py (FINETUNE_TEST_FSDP_ON_CPU=1: Accelerate's real FSDP2 path over gloo): its
    step-2 checkpoint holds the model as torch.distributed.checkpoint's shards, one per process. finetune/run.py
    itself is launched (one run: tests/multi_run_worker.py's several in one launch are not needed)."""
    root = tmp_path_factory.mktemp("fsdp")
    data = {"train": write_csv(root / "train.csv", rotten_rows(37)),
            "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    argv = tiny_text_args(data, root / "run", "max_steps=2", "save_steps=2", "per_device_train_batch_size=4")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs/fsdp.yaml"),
           "--num_processes", "2", "--main_process_port", str(free_port()), str(REPO / "finetune/run.py"), *argv]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FINETUNE_TEST_FSDP_ON_CPU": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return root / "run" / "checkpoints" / "step-00000002"


@pytest.mark.slow  # an FSDP launch and a 2-process evaluation: ~1 min on 2 cores
def test_an_fsdp_checkpoint_gives_identical_metrics_with_one_and_two_processes(fsdp_checkpoint, tmp_path, capsys):
    """Every process of the evaluation merges the shards itself, in memory: with 2 processes the merge wrote its
    file on the main process only, into that process's own temporary folder, and the other process failed
    (exit 1, a gloo traceback). The merged weights are the run's: the export saved at the same step."""
    assert (fsdp_checkpoint / "pytorch_model_fsdp_0").is_dir() and not (fsdp_checkpoint / "model.safetensors").exists()
    one, two = tmp_path / "one" / "metrics.json", tmp_path / "two" / "metrics.json"
    evaluate([str(fsdp_checkpoint), "--output", str(one.parent), "--predictions"])
    result = launch([str(fsdp_checkpoint), "--output", str(two.parent), "--predictions"], num_processes=2,
                    script="finetune/evaluate_checkpoint.py")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(two.read_text())["runtime"]["num_processes"] == 2
    assert _without_runtime(two) == _without_runtime(one)
    assert _without_runtime(two)["num_samples"] == 13  # 2 x batch 4 pads the last batch: padding dropped
    assert (two.parent / "predictions.jsonl").read_text() == (one.parent / "predictions.jsonl").read_text()
    export = evaluate([str(fsdp_checkpoint.parent.parent / "model"), "--output", str(tmp_path / "export")])
    assert export["confusion_matrix"] == _without_runtime(one)["confusion_matrix"]
    assert export["loss"] == pytest.approx(_without_runtime(one)["loss"], abs=1e-6)
    # shards that do not merge (the index lost): one line naming them
    copy = shutil.copytree(fsdp_checkpoint, tmp_path / "step-00000002", ignore=shutil.ignore_patterns("eval"))
    (copy / "pytorch_model_fsdp_0" / ".metadata").unlink()
    user_error(capsys, evaluate, [str(copy)], f"the FSDP shards in {copy / 'pytorch_model_fsdp_0'} do not merge: ",
               ".metadata", rule="evaluation.shards_do_not_merge")  # fmt: skip
    shutil.rmtree(copy)
    copy = shutil.copytree(fsdp_checkpoint, tmp_path / "step-00000002", ignore=shutil.ignore_patterns("eval"))
    shard = copy / "pytorch_model_fsdp_0" / "__1_0.distcp"  # the second process's shard, cut short
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    user_error(capsys, evaluate, [str(copy)], f"the FSDP shards in {copy / 'pytorch_model_fsdp_0'} do not merge: ",
               rule="evaluation.shards_do_not_merge")
