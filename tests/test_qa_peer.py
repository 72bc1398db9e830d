"""The QA peer benchmark: its smoke run (a tiny BERT from config on a slice of the QA recipe's data, the
app's loop and run_qa_no_trainer's, both scored by one scorer), and its copy of utils_qa.py's
post-processing held to the app's `best_answer` on drawn logits. No timing or score figures asserted."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from benchmarks.qa_peer import create_and_fill_np_array, postprocess_qa_predictions
from finetune.squad import best_answer


@pytest.mark.slow
def test_smoke_run_trains_both_sides_on_the_same_windows_and_scores_the_same_questions(tmp_path):
    from benchmarks.qa_peer import main

    report = main(["--smoke", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "qa_peer.json").read_text()) == json.loads(json.dumps(report, default=str))
    app, peer = report["app"], report["peer"]
    for key in ("training_windows", "optimizer_steps", "warmup_steps", "questions"):
        assert app[key] == peer[key] > 0, key
    assert app["questions"] == report["settings"]["max_eval_samples"]
    for side in (app, peer):
        assert 0 <= side["exact_match"] <= side["f1"] <= 1
        assert 0 < side["training_s"] <= side["wall_s"]
    assert report["ratio"] == peer["training_s"] / app["training_s"]
    assert 0 <= report["agreement"] <= 1
    assert "validation exact match" in (tmp_path / "qa_peer.md").read_text()


def test_match_peer_gives_the_app_the_scripts_choices_where_the_recipe_differs():
    """`--match-peer`'s settings each change the QA recipe to the script's choice: every weight trained,
    shuffled batches padded to their longest window, no clipping."""
    from benchmarks.qa_peer import MATCH_PEER, RECIPE, parse_args
    from finetune.config import load_config

    recipe, matched = load_config(RECIPE), load_config(RECIPE, MATCH_PEER)
    changed = {key.split("=")[0] for key in MATCH_PEER}
    assert {k for k in changed if getattr(recipe, k) != getattr(matched, k)} == changed
    assert (matched.freeze_embeddings, matched.group_by_length, matched.pad_to_multiple_of, matched.max_grad_norm) \
        == (False, False, None, None)
    assert parse_args(["--match-peer"]).match_peer and not parse_args([]).match_peer


def _drawn_windows(rng: random.Random, width: int):
    """A context of 60 words and 1 to 3 windows over it, each `width` tokens wide: a few question tokens,
    then context tokens (their character offsets), then one special token and padding (offsets None);
    float64 logits for every position, padding's included, so ties are unlikely."""
    words = [f"w{i}" for i in range(60)]
    spans, at = [], 0
    for word in words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    windows = []
    for _ in range(rng.randrange(1, 4)):
        first, length, question = rng.randrange(0, 40), rng.randrange(8, width - 4), rng.randrange(2, 5)
        offsets = [None] * question + spans[first : first + length - question - 1] + [None]
        offsets += [None] * (width - len(offsets))
        windows.append({"offsets": offsets, "start_logits": np.array([rng.gauss(0, 3) for _ in range(width)]),
                        "end_logits": np.array([rng.gauss(0, 3) for _ in range(width)])})  # fmt: skip
    return " ".join(words), windows


@pytest.mark.parametrize(("n_best_size", "max_answer_length"), [(20, 30), (3, 4), (1, 1)])
def test_the_peer_postprocessing_picks_the_span_the_app_picks(n_best_size, max_answer_length):
    """utils_qa.py's `postprocess_qa_predictions` as benchmarks/qa_peer.py writes it and the app's
    `best_answer` choose the same text from the same logits and offsets (every window of a question,
    n_best_size, max_answer_length), so the benchmark's two sides differ by what their models output,
    not by how an answer is read from it."""
    from datasets import Dataset

    rng = random.Random(n_best_size)
    examples, features, starts, ends, expected = [], [], [], [], []
    for q in range(60):
        context, windows = _drawn_windows(rng, 48)
        examples.append({"id": str(q), "context": context})
        for w in windows:
            features.append({"example_id": str(q), "offset_mapping": w["offsets"]})
            starts.append(w["start_logits"])
            ends.append(w["end_logits"])
        expected.append(best_answer(windows, context, n_best_size, max_answer_length).text)
    logits = tuple(create_and_fill_np_array([np.stack(x)], features, 48) for x in (starts, ends))
    got = postprocess_qa_predictions(Dataset.from_list(examples), features, logits, n_best_size=n_best_size,
                                     max_answer_length=max_answer_length)  # fmt: skip
    # where no window has a valid span the peer answers "empty" and the app ""
    answers = ["" if got[x["id"]] == "empty" else got[x["id"]] for x in examples]
    assert answers == expected
    assert any(answers)  # some questions have a span to compare (n_best_size 1 leaves few)


@pytest.mark.parametrize("max_length", [256, 384])
def test_the_peer_windows_and_labels_are_the_apps(max_length, tmp_path):
    """run_qa_no_trainer.py's `prepare_train_features` and `prepare_validation_features` as
    benchmarks/qa_peer.py writes them make, on the bundled data, the windows the app's question-answering
    task makes: the same tokens, start/end labels and context offsets, window by window; so the two sides
    of the benchmark train and are scored on the same inputs."""
    from datasets import load_dataset
    from transformers import AutoTokenizer

    from benchmarks.qa_peer import RECIPE, peer_preprocessing
    from finetune.config import REPO_DIR, load_config
    from finetune.data import load_splits, prepare_splits
    from finetune.models import load_preprocessor

    cfg = load_config(RECIPE, [f"output_dir={tmp_path}", "max_train_samples=300", "max_eval_samples=150",
                               f"max_length={max_length}"])  # fmt: skip
    app = prepare_splits(cfg.data_args, load_splits(cfg.data_args)[0], load_preprocessor(cfg.model_args))
    raw = load_dataset("json", data_files={"train": str(REPO_DIR / cfg.train_file),
                                           "validation": str(REPO_DIR / cfg.validation_file)})  # fmt: skip
    train, validation = raw["train"].select(range(300)), raw["validation"].select(range(150))
    prepare_train, prepare_validation = peer_preprocessing(
        AutoTokenizer.from_pretrained(cfg.model_name_or_path, use_fast=True), train.column_names, max_length,
        cfg.doc_stride, False,
    )  # fmt: skip
    peer_train = train.map(prepare_train, batched=True, remove_columns=train.column_names)
    peer_validation = validation.map(prepare_validation, batched=True, remove_columns=validation.column_names)
    assert len(app["train"]) == len(peer_train) > 300  # some contexts make more than one window
    assert app["train"]["input_ids"][:] == peer_train["input_ids"][:]
    labels = [list(pair) for pair in zip(peer_train["start_positions"], peer_train["end_positions"], strict=True)]
    assert app["train"]["labels"][:] == labels
    assert sum(start > 0 for start, _ in labels) > 250  # most windows hold their answer
    assert app["validation"]["input_ids"][:] == peer_validation["input_ids"][:]
    app_offsets = [[o if o[0] >= 0 else None for o in window] for window in app["validation"]["offsets"][:]]
    assert app_offsets == [[list(o) if o is not None else None for o in w] for w in peer_validation["offset_mapping"][:]]
