"""Extractive question answering (finetune/tasks/questions.py, finetune/problems/spans.py): windows
over long contexts, each question scored once from all its windows (exact match and F1 as SQuAD's script,
finetune/squad.py), an exact resume, the export and evaluate_checkpoint.py, and the rules for answers that do
not fit their contexts. Accumulation and DDP equal to one big batch: tests/test_ddp_equivalence.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import (
    DATA,
    DROPOUT_BERT,
    TINY_BERT,
    TOKENIZER,
    logged_losses,
    user_error,
    write_jsonl,
)
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.evaluate_checkpoint import main as evaluate_main
from finetune.run import main
from finetune.squad import normalize_answer

SQUAD = DATA / "squad_shifts_wiki"


def _rows(split: str, n: int) -> list[dict]:
    with (SQUAD / f"{split}.jsonl").open() as f:
        return [json.loads(next(f)) for _ in range(n)]


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory) -> dict[str, Path]:
    """23 training and 11 validation questions of the bundled set: their contexts (hundreds of tokens) make
    several windows each at max_length=64, and 11 is uneven over 2 processes."""
    root = tmp_path_factory.mktemp("qa")
    return {"train": write_jsonl(root / "train.jsonl", _rows("train", 23)),
            "validation": write_jsonl(root / "validation.jsonl", _rows("validation", 11))}  # fmt: skip


def qa_args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["task=question-answering", f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}",
            f"train_file={data['train']}", f"validation_file={data['validation']}", "test_file=null", "max_length=64",
            "doc_stride=16",
            "per_device_train_batch_size=8", "per_device_eval_batch_size=16", "num_train_epochs=1", "learning_rate=1e-3",
            "warmup_ratio=0.2", "logging_steps=1", "seed=0", "freeze_embeddings=false", "freeze_layers=0", "dropout=null", "group_by_length=false", f"output_dir={out}", "overwrite_output_dir=true",
            "report_to=[]", *extra]  # fmt: skip


def _weights(out: Path) -> dict:
    return load_file(out / "model" / "model.safetensors")


# Weights that add the same to every token's start (or end) score: a softmax over a window's tokens ignores
# them, so their gradient is 0 in exact arithmetic, and AdamW, which divides a gradient by its own size, turns
# the float noise there into steps that differ with the batching. Nothing the model answers depends on them.
SHIFTS = {"qa_outputs.bias", "bert.encoder.layer.1.output.LayerNorm.bias"}


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and SHIFTS <= a.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a if k not in SHIFTS)


def test_a_window_is_labelled_with_its_answers_tokens_or_its_cls(qa_data):
    """Every window whose label is not the CLS decodes to its question's first answer; a question's windows
    overlap; some windows of a long context hold no answer and are labelled (0, 0)."""
    from transformers import AutoTokenizer

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.tasks import task_of

    cfg = load_config(None, qa_args(qa_data, Path("/tmp/unused")))
    raw, names = load_splits(cfg.data_args)
    assert names == ["start", "end"]
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    windows = task_of("question-answering").prepare(raw["train"], tokenizer, cfg.data_args, "train", 3)
    assert len(windows) > 2 * len(raw["train"])  # long contexts: several windows a question
    cls = 0
    for row in windows:
        start, end = row["labels"]
        if (start, end) == (0, 0):
            cls += 1
            continue
        answer, offsets = row["answers"][0], row["offsets"]
        span = row["context"][offsets[start][0] : offsets[end][1]]  # whole tokens: an answer may end inside one
        assert answer in span and len(span) - len(answer) < 12, (span, answer)
        assert normalize_answer(answer)[:4] in normalize_answer(tokenizer.decode(row["input_ids"][start : end + 1]))
    assert 0 < cls < len(windows)


def test_a_tokenizer_that_pads_left_gets_its_windows_padded_right_with_their_offsets(qa_data):
    """A tokenizer whose padding side is left (the context first, as run_qa.py pairs them): the collator
    pads on the right all the same, so a window's labels and offsets still point at its answer's tokens,
    and its CLS token's index travels in the batch's meta."""
    from transformers import AutoTokenizer

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.tasks import PadSpans, task_of

    cfg = load_config(None, qa_args(qa_data, Path("/tmp/unused")))
    raw, _ = load_splits(cfg.data_args)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.padding_side = "left"
    windows = task_of("question-answering").prepare(raw["train"].select(range(4)), tokenizer, cfg.data_args, "train", 3)
    rows = [windows[i] for i in range(len(windows))]
    assert len({len(r["input_ids"]) for r in rows}) > 1  # the batch pads some of them
    batch = PadSpans(tokenizer)(rows)
    answered = 0
    for i, row in enumerate(rows):
        start, end = batch["labels"][i].tolist()
        assert batch["input_ids"][i, : len(row["input_ids"])].tolist() == row["input_ids"]  # padding after the window
        cls = int(batch["meta"]["cls"][i])
        assert batch["input_ids"][i, cls] == tokenizer.cls_token_id
        if (start, end) != (cls, cls):
            answered += 1
            offsets = batch["meta"]["offsets"][i]
            assert row["answers"][0] in row["context"][int(offsets[start][0]) : int(offsets[end][1])]
    assert answered


def test_label_smoothing_counts_a_windows_own_tokens_not_the_batchs_padding():
    """A window's smoothed loss is the same however far its batch pads it, and 0 smoothing is the plain
    cross-entropy."""
    import torch
    import torch.nn.functional as F

    from finetune.problems import problem_of

    spans = problem_of("question_answering")
    torch.manual_seed(0)
    scores, labels = torch.randn(2, 7, 2), torch.tensor([[1, 3], [0, 0]])
    padded = torch.cat([scores, torch.full((2, 9, 2), spans.pad_value)], dim=1)
    for smoothing in (0.0, 0.1):
        assert torch.allclose(spans.loss(scores, labels, label_smoothing=smoothing),
                              spans.loss(padded, labels, label_smoothing=smoothing), atol=1e-6)  # fmt: skip
    plain = (F.cross_entropy(scores[..., 0], labels[:, 0], reduction="none", label_smoothing=0.1)
             + F.cross_entropy(scores[..., 1], labels[:, 1], reduction="none", label_smoothing=0.1)) / 2  # fmt: skip
    assert torch.allclose(spans.loss(scores, labels, label_smoothing=0.1), plain, atol=1e-6)


def test_the_squad_v2_baseline_abstains_where_answering_nothing_scores_more():
    from finetune.problems import problem_of

    spans = problem_of("question_answering")
    none = {"answers": [], "context": "The river runs north to the sea."}
    one = {"answers": ["north"], "context": "The river runs north to the sea."}
    assert spans.baseline(2, [none, none, one], [])["f1"] == pytest.approx(2 / 3)  # two of three right, by abstaining
    assert spans.baseline(2, [one], [])["f1"] == 0.0  # v1.1: the first words, as before


def test_a_resume_mid_epoch_ends_as_the_uninterrupted_run(qa_data, tmp_path):
    args = ("per_device_train_batch_size=4", "num_train_epochs=2", "save_steps=3", "save_total_limit=null",
            "max_train_samples=6", f"model_config={DROPOUT_BERT}")  # fmt: skip
    main(qa_args(qa_data, tmp_path / "full", *args))
    first = ckpt.list_checkpoints(tmp_path / "full")[0]
    assert 0 < ckpt.read_manifest(first)["samples_in_epoch"]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    main(qa_args(qa_data, resumed, *args, "resume_from_checkpoint=latest"))
    full, again = _weights(tmp_path / "full"), _weights(resumed)
    assert max((full[k] - again[k]).abs().max().item() for k in full) <= 1e-6  # every weight: the same steps
    losses, resumed_losses = logged_losses(tmp_path / "full"), logged_losses(resumed)
    assert resumed_losses and all(resumed_losses[step] == pytest.approx(losses[step], abs=1e-6) for step in resumed_losses)


def test_an_overfit_model_answers_and_its_export_evaluates_the_same(tmp_path):
    """Trained on its validation questions, a tiny model finds their answers; evaluate_checkpoint.py scores
    the export as training did, and writes each question's id, answer and score; the export loads as a
    transformers question-answering model and the card shows how to ask it."""
    rows = _rows("validation", 3)
    data = {"train": write_jsonl(tmp_path / "three.jsonl", rows), "validation": tmp_path / "three.jsonl"}
    out = tmp_path / "run"
    results = main(qa_args(data, out, "num_train_epochs=15", "per_device_train_batch_size=4", "learning_rate=3e-3",
                           "warmup_ratio=0.05", "logging_steps=20"))  # fmt: skip
    validation = results["validation"]
    assert validation["f1"] > 0.6 and validation["f1"] > validation["baseline"]["f1"] + 0.3, validation
    evaluated = evaluate_main([str(out / "model"), "--data", str(data["train"]), "--predictions"])
    assert evaluated["f1"] == pytest.approx(validation["f1"]) and evaluated["num_samples"] == 3
    [written] = (out / "eval").rglob("predictions.jsonl")
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    assert lines[0]["question"] == rows[0]["question"]
    assert [line["id"] for line in lines] == [r["id"] for r in rows]
    assert all(isinstance(line["prediction"], str) and isinstance(line["score"], float) for line in lines)
    assert lines[0]["answers"] == rows[0]["answers"]["text"]
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(out / "model")
    assert model.config.num_labels == 2
    assert "AutoModelForQuestionAnswering.from_pretrained" in (out / "model" / "README.md").read_text()


def test_answers_in_another_layout_or_off_their_context_are_one_line(qa_data, tmp_path, capsys):
    rows = _rows("train", 6)
    flat = write_jsonl(tmp_path / "flat.jsonl", [{**r, "answers": r["answers"]["text"][0]} for r in rows])
    user_error(capsys, main, qa_args(qa_data, tmp_path / "a", f"train_file={flat}"), "answer_start",
               rule="labels.answers_not_squad")
    moved = [{**r, "answers": {"text": r["answers"]["text"], "answer_start": [s + 1 for s in r["answers"]["answer_start"]]}}
             for r in rows]  # fmt: skip
    shifted = write_jsonl(tmp_path / "shifted.jsonl", moved)
    user_error(capsys, main, qa_args(qa_data, tmp_path / "b", f"train_file={shifted}"), "row 1 of the train data",
               rule="labels.answer_not_in_context")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_squads_own_nested_file_reads_as_the_hub_rows(qa_data, tmp_path):
    """A SQuAD v1.1 / v2.0 file (articles of paragraphs of questions) is read as the Hub's squad rows, in file
    order; a v2 question without an answer has empty answer lists."""
    from finetune.config import load_config
    from finetune.data import load_splits

    rows = _rows("train", 23)
    articles: dict[str, dict[str, list]] = {}
    for r in rows:
        articles.setdefault(r["title"], {}).setdefault(r["context"], []).append(
            {"id": r["id"], "question": r["question"],
             "answers": [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"], strict=True)]})  # fmt: skip
    nested = {"version": "v2.0", "data": [{"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
                                          for title, paragraphs in articles.items()]}  # fmt: skip
    nested["data"][0]["paragraphs"][0]["qas"].append({"id": "impossible", "question": "Who?", "answers": [], "is_impossible": True})
    path = tmp_path / "train-v2.0.json"
    path.write_text(json.dumps(nested))
    raw, _ = load_splits(load_config(None, qa_args({**qa_data, "train": path}, tmp_path / "out")).data_args)
    read = {r["id"]: r for r in raw["train"]}
    assert len(read) == 24 and read["impossible"]["labels"] == {"text": [], "answer_start": []}
    for r in rows:
        assert (read[r["id"]]["question"], read[r["id"]]["context"]) == (r["question"], r["context"])
        assert read[r["id"]]["labels"] == r["answers"]


def test_the_recipe_scores_every_question_of_its_validation_file_once(tmp_path, capsys):
    """The bundled recipe, with a tiny model for two steps: the task read from the data (task=null), every
    one of the 1,050 validation questions scored once from its windows."""
    results = main(["--config", "finetune/configs/bert_qa.yaml", "task=null", f"model_config={TINY_BERT.replace('128', '512')}",
                    f"tokenizer_name={TOKENIZER}", "max_steps=2", "max_train_samples=32", "freeze_embeddings=false",
                    f"output_dir={tmp_path / 'run'}"])  # fmt: skip
    out = capsys.readouterr().out
    assert "question-answering: BertForQuestionAnswering, train 32 questions" in out
    assert "validation 1,050 questions (" in out and "windows)" in out
    assert results["validation"]["num_samples"] == 1050
    assert "on 1050 questions" in out.splitlines()[-2]


def _squad_rows(n: int = 6) -> list[dict]:
    return _rows("train", n)


BAD = {  # name: (rows of the training file or a writer, the settings beside, the rule, a fragment of its line)
    "answers as scalars": (lambda rows: [{**r, "answers": {"text": r["answers"]["text"][0], "answer_start": r["answers"]["answer_start"][0]}} for r in rows],
                           (), "labels.answers_not_squad", "an answer that is not a list"),
    "starts as strings": (lambda rows: [{**r, "answers": {"text": r["answers"]["text"], "answer_start": [str(s) for s in r["answers"]["answer_start"]]}}
                                        for r in rows], (), "labels.answers_not_squad", "whole numbers from 0"),
    "an empty answer text": (lambda rows: [{**r, "answers": {"text": [""], "answer_start": [0]}} if i == 2 else r for i, r in enumerate(rows)],
                             (), "labels.answer_not_in_context", "row 3 of the train data has an empty answer text"),
    "no answer at all": (lambda rows: [{**r, "answers": {"text": [], "answer_start": []}} for r in rows],
                         (), "labels.no_answer_to_learn", "no question of the training data has an answer"),
    "columns named otherwise": (lambda rows: [{"q": r["question"] + "?", "passage": r["context"], "ans": r["answers"]} for r in rows],
                                (), "columns.question_answering_columns", "set question_column=q, context_column=passage, answers_column=ans"),
    "columns named otherwise, the task left to the data": (
        lambda rows: [{"q": r["question"] + "?", "passage": r["context"], "ans": r["answers"]} for r in rows],
        ("task=null",), "columns.question_answering_columns", "set question_column=q, context_column=passage, answers_column=ans"),
    "flat answer columns": (lambda rows: [{"question": r["question"], "context": r["context"], "answer_text": r["answers"]["text"][0],
                                           "answer_start": r["answers"]["answer_start"][0]} for r in rows],
                            (), "columns.question_answering_columns", "not as separate columns"),
    "a question longer than a window": (lambda rows: [{**r, "question": " ".join(["why"] * 80)} if i == 1 else r for i, r in enumerate(rows)],
                                        (), "inputs.question_leaves_no_room", "the question of row 2 of the train data is 80 tokens long"),
    "doc_stride as long as the window": (lambda rows: rows, ("doc_stride=64",), "inputs.question_leaves_no_room", "lower doc_stride"),
    "no candidate span": (lambda rows: rows, ("n_best_size=0",), "settings.positive", "n_best_size must be a positive integer"),
    "a negative doc_stride": (lambda rows: rows, ("doc_stride=-5",), "settings.out_of_range", "doc_stride must be >= 0"),
    "class weights": (lambda rows: rows, ("class_weights=balanced",), "settings.class_weights_of_regression", "question answering"),
    "label names": (lambda rows: rows, ("label_names=[end, start]",), "labels.outputs_named_by_the_task",
                    "question answering's outputs are start, end"),
    "questions of numbers": (lambda rows: [{**r, "question": 100 + i} for i, r in enumerate(rows)],
                             (), "columns.numbers_as_texts", "set question_column to the column of texts"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_question_answering_input_is_one_line(case, qa_data, tmp_path, capsys):
    make, settings, rule, fragment = BAD[case]
    train = write_jsonl(tmp_path / "train.jsonl", make(_squad_rows()))
    user_error(capsys, main, qa_args(qa_data, tmp_path / "run", f"train_file={train}", *settings), fragment, rule=rule)
    assert not (tmp_path / "run").exists()


def test_a_csv_of_answers_as_text_and_a_broken_squad_file_are_one_line(qa_data, tmp_path, capsys):
    rows = _squad_rows()
    csv = tmp_path / "train.csv"
    csv.write_text("id,question,context,answers\n" + "".join(
        f'{r["id"]},"{r["question"]}","{r["context"].replace(chr(34), chr(39))}","{json.dumps(r["answers"]).replace(chr(34), chr(34) * 2)}"\n'
        for r in rows))  # fmt: skip
    user_error(capsys, main, qa_args(qa_data, tmp_path / "a", f"train_file={csv}"), "write the data as JSON Lines",
               rule="labels.answers_not_squad")
    broken = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": rows[0]["context"], "qas": [
        {"id": "1", "question": "why?", "answers": [{"text": rows[0]["answers"]["text"][0]}]}]}]}]}
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(broken))
    user_error(capsys, main, qa_args(qa_data, tmp_path / "b", f"train_file={path}"), "'answer_start'",
               rule="files.squad_file_malformed")
    # a nested file whose fields are of several kinds (one question a number, one context a list) is named as a
    # JSON Lines file of them is, with the question's row
    for field, value, row in (("question", 123, 3), ("context", ["a", "list"], 2)):
        paragraphs = [{"context": r["context"], "qas": [{"id": r["id"], "question": r["question"], "answers": [
            {"text": r["answers"]["text"][0], "answer_start": r["answers"]["answer_start"][0]}]}]} for r in rows]
        (paragraphs[row - 1] if field == "context" else paragraphs[row - 1]["qas"][0])[field] = value
        path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
        user_error(capsys, main, qa_args(qa_data, tmp_path / "c", f"train_file={path}"),
                   f"column '{field}' in the train data holds values of mixed types: row {row}", rule="columns.mixed_types")


def test_a_resume_with_other_windows_names_doc_stride(qa_data, tmp_path, capsys):
    out = tmp_path / "run"
    main(qa_args(qa_data, out, "max_train_samples=6", "max_steps=2", "save_steps=1"))
    user_error(capsys, main, qa_args(qa_data, out, "max_train_samples=6", "max_steps=4", "save_steps=1", "doc_stride=8",
                                     "resume_from_checkpoint=latest", "overwrite_output_dir=false"),
               "trained with doc_stride=16, this run has doc_stride=8", rule="runs.resume_changes_a_fixed_setting",
               untouched=out)  # fmt: skip


def test_lora_trains_the_question_answering_head(qa_data, tmp_path, capsys):
    main(qa_args(qa_data, tmp_path / "run", "max_train_samples=6", "max_steps=2", "peft={r: 4, alpha: 8, target_modules: [query, value]}"))
    line = next(line for line in capsys.readouterr().out.splitlines() if "weights trained" in line)
    assert "1,090 of" in line, line  # the adapters (2 layers x 2 modules x 256) and the head (32 x 2 + 2)


def test_squad_v2_tunes_a_null_threshold_on_validation_and_the_export_keeps_it(tmp_path):
    """Questions without an answer (SQuAD v2): trained on the [CLS] token; after training the null-score
    threshold that scores the best validation F1 is tuned, scored (`validation_tuned`), kept in the export's
    config.json, and read back by evaluate_checkpoint.py, whose predictions say which questions it abstained on."""
    answered = _rows("validation", 3)
    unanswerable = [{**r, "id": f"none-{i}", "question": q, "answers": {"text": [], "answer_start": []}}
                    for i, (r, q) in enumerate(zip(answered, ("Who painted the ceiling?", "When did the moon land?"), strict=False))]  # fmt: skip
    path = write_jsonl(tmp_path / "v2.jsonl", answered + unanswerable)
    out = tmp_path / "run"
    results = main(qa_args({"train": path, "validation": path}, out, "num_train_epochs=15", "per_device_train_batch_size=4",
                           "learning_rate=3e-3", "warmup_ratio=0.05", "logging_steps=20"))  # fmt: skip
    tuned = results["validation_tuned"]
    assert tuned["f1"] >= results["validation"]["f1"] and tuned["f1"] > 0.6, (tuned, results["validation"])
    assert results["validation"]["no_answer_f1"] == 0.0  # untuned: every question answered with a span
    threshold = json.loads((out / "model" / "config.json").read_text())["null_score_threshold"]
    assert tuned["null_score_threshold"] == pytest.approx(threshold)
    evaluated = evaluate_main([str(out / "model"), "--data", str(path), "--predictions"])
    assert evaluated["f1"] == pytest.approx(tuned["f1"]) and evaluated["null_score_threshold"] == pytest.approx(threshold)
    [written] = (out / "eval").rglob("predictions.jsonl")
    lines = {line["id"]: line for line in map(json.loads, written.read_text().splitlines())}
    assert all("abstained" in line for line in lines.values())
    assert [lines[f"none-{i}"]["prediction"] == "" for i in range(2)] == [lines[f"none-{i}"]["abstained"] for i in range(2)]
    # fine-tuned again on questions that all have answers, the new export keeps no threshold of the old one's
    again = tmp_path / "again"
    answered_only = write_jsonl(tmp_path / "v1.jsonl", answered)
    main([*qa_args({"train": answered_only, "validation": answered_only}, again), f"model_name_or_path={out / 'model'}",
          "model_config=null"])  # fmt: skip
    assert json.loads((again / "model" / "config.json").read_text()).get("null_score_threshold") is None


@pytest.mark.slow  # as the text and tagging layer-split tests: the default run keeps QA's DDP and accumulation
def test_the_layer_split_with_pipeline_chunks_equals_one_unsplit_process(qa_data, tmp_path):
    """The model's layers over two (CPU) devices, each batch in two GPipe chunks whose span scores are masked and
    put back together: the same weights as one unsplit process, every question scored once."""
    common = ("max_grad_norm=null", "per_device_train_batch_size=4", "gradient_accumulation_steps=2", "adam_epsilon=1e-6")
    main(qa_args(qa_data, tmp_path / "plain", *common))
    results = main(qa_args(qa_data, tmp_path / "split", *common, "model_parallel=true", "devices=cpu,cpu", "pipeline_chunks=2"))
    assert _worst(_weights(tmp_path / "split"), _weights(tmp_path / "plain")) < 1e-5
    assert results["validation"]["num_samples"] == 11


def test_a_search_of_a_question_answering_run_draws_no_per_label_threshold():
    """tune_threshold is multi-label's (one threshold per label); a QA run's null threshold is tuned on its own."""
    import optuna

    from finetune.config import TrainConfig
    from finetune.search import SPACE, suggest, the_recipes_own

    cfg = TrainConfig(task="question-answering", problem_type="question_answering")
    assert "tune_threshold" not in the_recipes_own(cfg, list(SPACE), layers=2)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    assert "tune_threshold" not in suggest(trial, cfg, list(SPACE), layers=2)
