"""Multiple choice (finetune/tasks/choices.py, finetune/problems/choices.py): SWAG's layout read from the data,
a model that scores every candidate, accumulation equal to one big batch, the export evaluated as the run
evaluated it, on PyTorch and on ONNX, and the right candidate's number checked against the candidates."""

from __future__ import annotations

import json
import random

import pytest
from conftest import TINY_BERT, TOKENIZER, logged_losses, user_error, write_csv, write_jsonl
from safetensors.torch import load_file

from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import main

ACTS = [("picks up the ball", "throws it across the yard."), ("opens the oven", "takes out the bread."),
        ("starts the engine", "drives down the road."), ("opens the book", "reads the first page."),
        ("fills the glass", "drinks the water."), ("plants the seed", "waters the soil.")]  # fmt: skip


def swag_rows(n: int, endings: int = 4, seed: int = 0, header: bool = True) -> list[dict]:
    """SWAG's layout: sent1, sent2, ending0..ending{endings-1}, label (the right ending's number), and a
    column of the data's own that the model does not read."""
    rng, rows = random.Random(seed), []
    for i in range(n):
        act, right = rng.choice(ACTS)
        candidates = rng.sample([r for _, r in ACTS if r != right], endings - 1)
        label = rng.randrange(endings)
        candidates.insert(label, right)
        row = {"sent1": f"The {rng.choice(['cat', 'boy', 'chef', 'pilot'])} {act}.", "sent2": "Then it" if header else None,
               **{f"ending{k}": e for k, e in enumerate(candidates)}, "label": label, "video-id": f"v{i}"}  # fmt: skip
        rows.append({k: v for k, v in row.items() if v is not None})
    return rows


@pytest.fixture
def swag(tmp_path):
    return {split: write_jsonl(tmp_path / f"{split}.jsonl", swag_rows(n, seed=s))
            for split, n, s in (("train", 40, 0), ("validation", 12, 1), ("test", 12, 2))}  # fmt: skip


# The tiny BERT at a wider initialisation: at transformers' 0.02 its candidates' scores start equal to 1e-3, and
# the gradients are so small that AdamW's normalisation makes float noise in them a visible difference.
MODEL = TINY_BERT[:-1] + ", initializer_range: 0.2}"


def swag_args(data: dict, out, *extra: str) -> list[str]:
    files = [f"{split}_file={data.get(split, 'null')}" for split in ("train", "validation", "test")]
    return ["task=null", f"model_config={MODEL}", f"tokenizer_name={TOKENIZER}", *files, "max_length=32",
            "max_train_samples=null", "max_eval_samples=null", "label_names=null", "learning_rate=1e-3",
            "freeze_embeddings=false", "dropout=null", "logging_steps=1", f"output_dir={out}", *extra]  # fmt: skip


def test_swag_data_trains_as_multiple_choice_and_its_export_evaluates_alike_on_pytorch_and_onnx(swag, tmp_path):
    """task=null reads SWAG's columns as multiple choice: BertForMultipleChoice scores all four candidates
    of a context; the test accuracy the run prints is evaluate_checkpoint.py's on the export, and on its ONNX
    file (three dynamic axes: contexts, candidates, tokens), whose scores equal PyTorch's."""
    pytest.importorskip("onnxruntime")
    from finetune.onnx_export import main as onnx_main

    run = tmp_path / "run"
    results = main(swag_args(swag, run, "max_steps=6"))
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForMultipleChoice"]
    assert "problem_type: multiple_choice" in (run / "config.yaml").read_text()
    assert set(results["test"]) >= {"accuracy", "loss"} and "macro_f1" not in results["test"]
    assert results["label_names"] == ["0", "1", "2", "3"] and results["test"]["num_samples"] == 12
    assert [w["rule"] for w in results["warnings"]] in ([], ["tools.did_not_learn"])  # good data: no alarm
    card = (run / "model" / "README.md").read_text()
    assert "A 4-choice multiple-choice model" in card and "AutoModelForMultipleChoice" in card
    assert "candidates from `ending0`" in card

    record = evaluate([str(run / "model"), "--predictions"])
    assert record["accuracy"] == results["test"]["accuracy"]
    assert record["loss"] == pytest.approx(results["test"]["loss"], abs=1e-6)
    first = json.loads((run / "eval" / "test" / "predictions.jsonl").read_text().splitlines()[0])
    row = json.loads(swag["test"].read_text().splitlines()[0])
    assert first["context"] == row["sent1"] and first["endings"] == [row[f"ending{k}"] for k in range(4)]
    assert first["label"] == str(row["label"]) and sorted(first["probabilities"]) == ["0", "1", "2", "3"]
    assert first["video-id"] == row["video-id"]  # the data's own id column, to join on

    onnx_main([str(run), "--no-int8"])
    onnx = evaluate([str(run / "model"), "--onnx"])
    assert onnx["accuracy"] == record["accuracy"] and onnx["loss"] == pytest.approx(record["loss"], abs=1e-4)


def test_other_numbers_of_candidates_and_no_header_column(tmp_path):
    """Three candidates and no sent2: three classes, the context paired with each ending alone; a CSV file of
    the same layout (SWAG's own files are CSV) reads alike."""
    rows = swag_rows(24, endings=3, header=False)
    data = {"train": write_csv(tmp_path / "train.csv", rows[:18]), "validation": write_csv(tmp_path / "v.csv", rows[18:])}
    results = main(swag_args(data, tmp_path / "run", "max_steps=2"))
    assert results["label_names"] == ["0", "1", "2"] and results["validation"]["num_samples"] == 6


def test_accumulation_and_the_layer_split_equal_one_big_batch(swag, tmp_path):
    """Batch 8, against batch 2 accumulated 4 times, and against the layer split over two devices in two
    chunks of contexts: the same weights after two epochs (40 contexts: every epoch ends in a short window),
    the loss a context's cross-entropy over its candidates."""
    weights = {}
    split = ("model_parallel=true", "devices=cpu,cpu", "pipeline_chunks=2")
    for name, batch, acc, more in (("big", 8, 1, ()), ("acc", 2, 4, ()), ("split", 8, 1, split)):
        out = tmp_path / name
        main(swag_args(swag, out, f"per_device_train_batch_size={batch}", f"gradient_accumulation_steps={acc}",
                       "num_train_epochs=2", "max_grad_norm=null", "test_file=null", *more))  # fmt: skip
        weights[name] = load_file(out / "model" / "model.safetensors")
    # Two kinds of weight have a gradient of exactly zero in exact arithmetic, which leaves what they do
    # unchanged: the head's bias (one number added to every candidate's score) and the attention keys' biases
    # (one number added to every score of a query). Float noise is all their gradient, and AdamW scales noise
    # to a full step: they are left out, and what they would change, the scores, is compared instead.
    invariant = ("classifier.bias", "attention.self.key.bias")
    compared = [k for k in weights["big"] if not k.endswith(invariant)]
    assert len(compared) == len(weights["big"]) - 3  # the head's bias and 2 layers' key biases
    for name in ("acc", "split"):
        worst = max((weights[name][k] - weights["big"][k]).abs().max().item() for k in compared)
        assert worst < 1e-5, (name, worst)
    losses = [json.loads((tmp_path / n / "results.json").read_text())["validation"]["loss"] for n in weights]
    assert losses[1:] == pytest.approx(losses[:1] * 2, abs=1e-6)
    logged = logged_losses(tmp_path / "big")  # and the comparison means something: training moved the model
    assert min(logged.values()) < logged[1] - 0.1, logged


def test_a_right_candidate_beyond_the_candidates_is_one_line(swag, tmp_path, capsys):
    """label 4 with four endings (numbered 0-3) names the label and what is known, before anything is written."""
    rows = swag_rows(12, seed=1)
    rows[3]["label"] = 4
    data = {**swag, "validation": write_jsonl(tmp_path / "bad.jsonl", rows)}
    user_error(capsys, main, swag_args(data, tmp_path / "run"), "the validation labels '4' are not candidates' numbers",
               "0 for ending0 to 3 for ending3", rule="labels.not_a_candidate_number")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_class_weights_and_label_names_are_one_line_and_no_candidates_place_is_called_a_class_never_predicted(swag, tmp_path, capsys):
    """The candidates' places are no classes of the data: class_weights is refused before anything is written,
    and a model that never picks the last place gets no advice to weigh classes (tools.never_predicted)."""
    user_error(capsys, main, swag_args(swag, tmp_path / "run", "class_weights=balanced"),
               "multiple choice (its candidates' places are not classes)", rule="settings.class_weights_of_regression")
    assert not (tmp_path / "run").exists()
    user_error(capsys, main, [*swag_args(swag, tmp_path / "run"), "label_names=[x, y, z]"],
               "candidates' numbers) are 0, 1, 2, 3", rule="labels.outputs_named_by_the_task")
    assert not (tmp_path / "run").exists()
    from finetune.checks import Said, gate, tools

    said = Said()
    gate(tools.PREDICTED, ["3"], ["0", "1", "2", "3"], "multiple_choice", said=said)
    gate(tools.PREDICTED, ["3"], ["0", "1", "2", "3"], "single_label_classification", said=said)
    assert [rule for rule, _ in said.lines] == ["tools.never_predicted"]  # the classifier's alone


def test_the_bundled_recipe_trains_on_its_bundled_questions(tmp_path):
    """finetune/configs/bert_choices.yaml on data/squad_choices (a tiny model, a slice): four candidates a
    question, every validation question scored once."""
    results = main(["--config", "finetune/configs/bert_choices.yaml", f"model_config={MODEL}", "max_train_samples=32",
                    "max_eval_samples=16", "max_steps=2", f"output_dir={tmp_path / 'run'}"])  # fmt: skip
    assert results["label_names"] == ["0", "1", "2", "3"] and results["validation"]["num_samples"] == 16
    assert "baseline" in results["validation"]


def _with(tmp_path, name: str, rows: list[dict]):
    return write_jsonl(tmp_path / f"{name}.jsonl", rows)


@pytest.mark.parametrize(("labels", "fragment"), [
    (["A", "B", "C", "D"], "map the letters to numbers (A to 0"),
    ([1, 2, 3, 4], "the numbers count from 1 here: subtract 1"),
    (["plays a song.", "x", "y", "z"], "write the right candidate's number, not its text"),
])  # fmt: skip
def test_a_label_that_is_no_candidates_number_says_what_it_looks_like(swag, tmp_path, capsys, labels, fragment):
    rows = swag_rows(12)
    for i, row in enumerate(rows):
        row["label"] = labels[i % 4]
    data = {**swag, "train": _with(tmp_path, "bad", rows)}
    user_error(capsys, main, swag_args(data, tmp_path / "run"), "are not candidates' numbers", fragment,
               rule="labels.not_a_candidate_number")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_whole_numbers_written_as_floats_are_the_candidates_numbers(swag, tmp_path):
    """2.0 (a CSV column with a blank once, read by pandas) is candidate 2."""
    rows = swag_rows(24)
    data = {"train": write_csv(tmp_path / "train.csv", [{**r, "label": float(r["label"])} for r in rows]),
            "validation": swag["validation"]}  # fmt: skip
    assert main(swag_args(data, tmp_path / "run", "max_steps=1"))["label_names"] == ["0", "1", "2", "3"]


def test_splits_with_other_numbers_of_candidates_or_a_gap_are_one_line(swag, tmp_path, capsys):
    """Five endings in validation against train's four, three, and ending0, ending1, ending3: one line each;
    a model of four candidates given data of five, too."""
    for endings in (5, 3):
        data = {**swag, "validation": _with(tmp_path, f"v{endings}", swag_rows(8, endings=endings))}
        user_error(capsys, main, swag_args(data, tmp_path / "run"), f"the validation data has {endings} candidates",
                   "the train data 4", rule="columns.numbered_unlike_train")  # fmt: skip
    gap = [{k: v for k, v in r.items() if k != "ending2"} | {"label": r["label"] % 2} for r in swag_rows(12)]
    user_error(capsys, main, swag_args({**swag, "train": _with(tmp_path, "gap", gap)}, tmp_path / "run"),
               "but no ending2", "ending3 on would be left out", rule="columns.numbered_with_a_gap")  # fmt: skip
    assert not (tmp_path / "run").exists()
    run = tmp_path / "four"
    main(swag_args(swag, run, "max_steps=1", "test_file=null"))
    five = _with(tmp_path, "five", swag_rows(8, endings=5))
    user_error(capsys, evaluate, [str(run / "model"), "--data", str(five)], "has 5 candidates",
               "the model was trained on 4", rule="labels.candidates_unlike_the_models")  # fmt: skip


def test_data_in_another_multiple_choice_layout_names_swags(swag, tmp_path, capsys):
    """HellaSwag's `ctx` and a list of `endings`: the line names SWAG's layout to rename to, and the text task
    for data that is that."""
    rows = [{"ctx": r["sent1"], "endings": [r[f"ending{k}"] for k in range(4)], "label": r["label"]} for r in swag_rows(8)]
    data = {**swag, "train": _with(tmp_path, "hellaswag", rows)}
    user_error(capsys, main, swag_args(data, tmp_path / "run", "task=multiple-choice"), "column 'sent1' not found",
               "reads SWAG's layout", "a list of candidates into one column each", rule="columns.another_layout")  # fmt: skip


def test_the_right_candidate_always_the_same_is_one_line(swag, tmp_path, capsys):
    rows = swag_rows(16)
    for row in rows:  # the right answer written first, as some data has it
        right = row[f"ending{row['label']}"]
        row[f"ending{row['label']}"], row["ending0"], row["label"] = row["ending0"], right, 0
    data = {**swag, "train": _with(tmp_path, "first", rows)}
    user_error(capsys, main, swag_args(data, tmp_path / "run"), "every one of the 16 training labels is 0",
               "shuffle each row's candidates", rule="labels.right_candidate_always_the_same")  # fmt: skip


def test_a_long_context_is_cut_and_an_empty_header_or_a_missing_later_ending_read_as_they_mean(swag, tmp_path, capsys):
    """A context past max_length is cut (the longer side first), sent2 missing in a row is no text (not the
    word None), and a later ending missing in a row is refused as the first two are."""
    rows = swag_rows(16)
    rows[0]["sent1"] = " ".join(["the long context goes on"] * 60)
    rows[1]["sent2"] = None
    data = {**swag, "train": _with(tmp_path, "long", rows)}
    main(swag_args(data, tmp_path / "run", "max_steps=1", "test_file=null"))
    from transformers import AutoTokenizer

    from finetune.tasks import task_of

    ds = __import__("datasets").Dataset.from_list(rows[:2])
    enc = task_of("multiple-choice").prepare(ds, AutoTokenizer.from_pretrained(TOKENIZER), _data_args(data), "eval", 3)
    assert max(len(ids) for ids in enc[0]["input_ids"]) <= 32
    decoded = AutoTokenizer.from_pretrained(TOKENIZER).decode(enc[1]["input_ids"][0])
    assert "none" not in decoded.split() and rows[1]["ending0"].split()[0].lower() in decoded
    rows[2]["ending3"] = None
    user_error(capsys, main, swag_args({**swag, "train": _with(tmp_path, "none", rows)}, tmp_path / "r2"),
               "text column 'ending3'", "empty cell at row 3", rule="columns.text_missing_in_a_row")  # fmt: skip


def test_candidates_cut_at_max_length_are_said_with_the_share_lost_and_short_ones_are_not(swag, tmp_path):
    """Contexts past max_length in most training samples: one `inputs.pairs_cut` warning with the share of
    the candidates' tokens lost; the short synthetic set gets none."""
    from transformers import AutoTokenizer

    from finetune.checks import Said
    from finetune.tasks import task_of

    rows = swag_rows(16)
    for row in rows[:12]:
        row["sent1"] = " ".join(["the long context goes on"] * 20)
    tokenizer, task = AutoTokenizer.from_pretrained(TOKENIZER), task_of("multiple-choice")
    said = {name: Said() for name in ("long", "short")}
    for name, data in (("long", rows), ("short", swag_rows(16))):
        ds = __import__("datasets").Dataset.from_list(data)
        task.prepare(ds, tokenizer, _data_args(swag), "train", 3, said=said[name])
    [(rule, line)] = said["long"].lines
    assert rule == "inputs.pairs_cut" and "of the training pairs' tokens are lost at max_length=32" in line
    assert "48 of 64 training sentence pairs" in line
    assert said["short"].lines == []


def test_a_candidate_column_of_numbers_says_to_fill_the_column_not_to_set_a_text_column(swag, tmp_path, capsys):
    """The endings' names are the layout's: a column of numbers among them is told to hold the candidates'
    texts, not to set text_column, which this task does not read."""
    rows = swag_rows(16)
    for i, row in enumerate(rows):
        row["ending2"] = 100 + i
    line = user_error(capsys, main, swag_args({**swag, "train": _with(tmp_path, "numbers", rows)}, tmp_path / "run"),
                      "text column 'ending2' in the train data holds only numbers",
                      "put the texts in 'ending2' itself", rule="columns.numbers_as_texts")  # fmt: skip
    assert "text_column" not in line


def _data_args(data):
    from finetune.config import load_config

    return load_config(None, swag_args(data, "/tmp/unused")).data_args
