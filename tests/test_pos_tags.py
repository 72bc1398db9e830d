"""Plain tag sets (parts of speech: no B-/I- prefixes), as their own problem: the scheme the tag names decide
once, word accuracy and per-tag F1 instead of seqeval's entity scores, the per-word majority baseline, the
card's words; and named entities (IOB2), which keep entity F1 and their baseline.

    python -m pytest -q tests/test_pos_tags.py
"""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import DATA, TINY_BERT, TOKENIZER, user_error, write_jsonl
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from finetune import checks
from finetune.config import DataArgs, load_config, resolved
from finetune.data import load_splits
from finetune.evaluate_checkpoint import main as evaluate
from finetune.metrics import TOKENS, WORD_TAGS, summary_line, token_report, word_report
from finetune.problems import problem_of, problem_type_of, tag_scheme
from finetune.run import main
from finetune.tasks import task_of

UPOS = ["ADJ", "ADV", "AUX", "DET", "NOUN", "PRON", "VERB"]  # sorted by name: the ids a plain set gets


def tagged(sentences: list[list[tuple[str, str]]], names: list[str]) -> Dataset:
    """Encoded rows as finetune/data.py makes them: `tokens`, and `labels` as tag ids of `names`."""
    features = Features({"tokens": Sequence(Value("string")), "labels": Sequence(ClassLabel(names=names))})
    return Dataset.from_dict({"tokens": [[w for w, _ in s] for s in sentences],
                              "labels": [[names.index(t) for _, t in s] for s in sentences]}, features=features)  # fmt: skip


def prepared(sentences, names, split: str, **data):
    """The rows as a run trains or evaluates on them: windows of subwords (the tiny BERT's tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    return task_of("token-classification").prepare(tagged(sentences, names), tokenizer, DataArgs(**data), split, 3)


def pos_args(data: dict, out, *extra: str) -> list[str]:
    return ["task=token-classification", f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}",
            f"train_file={data['train']}", f"validation_file={data['validation']}", "test_file=null",
            "max_train_samples=null", "max_eval_samples=null", "label_names=null", "tags_column=upos",
            "freeze_embeddings=false", "dropout=null", "max_length=32", "learning_rate=1e-3", "logging_steps=1",
            f"output_dir={out}", *extra]  # fmt: skip


def test_the_tag_names_decide_the_scheme_and_the_bundled_uner_set_is_named_entities(tmp_path):
    """No B-/I- (or other scheme) prefix in the tag set: word tagging; IOB2: token classification (entities).
    The bundled UNER English-EWT tags are IOB2 named entities, and its recipe stays on entity F1."""
    assert tag_scheme(["DET", "NOUN", "VERB", "PUNCT"]) == tag_scheme(["NN", "VBZ", "-LRB-"]) == WORD_TAGS
    assert tag_scheme(["O", "PER", "LOC"]) == WORD_TAGS  # entity types without prefixes: scored per word
    assert tag_scheme(["O", "B-PER", "I-PER"]) == tag_scheme(["O", "S-PER", "E-PER"]) == TOKENS
    uner = {t for f in ("validation", "test") for line in (DATA / "uner_english_ewt" / f"{f}.jsonl").read_text().splitlines()
            for t in json.loads(line)["ner_tags"]}  # fmt: skip
    assert uner == {"O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"} and tag_scheme(uner) == TOKENS
    cfg = load_config("finetune/configs/bert_ner.yaml", ["max_train_samples=50"])
    raw, names = load_splits(cfg.data_args, checks.Said(quiet=True))
    assert problem_type_of(raw["train"]) == TOKENS
    assert resolved(cfg, checks.Said(), problem_type=problem_type_of(raw["train"])).metric_for_best_model == "entity_f1"
    pos = tagged([[("the", "DET"), ("cat", "NOUN")]], ["DET", "NOUN"])
    assert problem_type_of(pos) == WORD_TAGS
    done = resolved(load_config(None, pos_args(_pos_data(tmp_path), tmp_path / "run")), checks.Said(),
                    problem_type=problem_type_of(pos))  # fmt: skip
    assert (done.metric_for_best_model, done.greater_is_better) == ("word_accuracy", True)


def test_parts_of_speech_are_scored_by_word_accuracy_and_each_tags_f1_not_seqeval():
    """Four words, one wrong (a VERB tagged NOUN): word accuracy 3/4; NOUN precision 2/3, recall 1, F1 0.8;
    VERB F1 0; the macro F1 over the tags 0.6. Seqeval, making each word an entity of its own tag, gives three
    equal numbers, each word accuracy again: that is what the word scores replace."""
    names = ["DET", "NOUN", "VERB"]
    gold, predicted = [[0, 1, 2], [1]], [[0, 1, 1], [1]]
    report = word_report(predicted, gold, names)
    assert report["word_accuracy"] == pytest.approx(3 / 4)
    assert report["per_class"]["NOUN"] == {"precision": pytest.approx(2 / 3), "recall": 1.0, "f1": pytest.approx(0.8),
                                           "support": 2}  # fmt: skip
    assert report["per_class"]["VERB"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert report["macro_f1"] == pytest.approx((1 + 0.8 + 0) / 3)
    assert (report["num_words"], report["num_sentences"]) == (4, 2) and "entity_f1" not in report
    seqeval = token_report(predicted, gold, [f"B-{n}" for n in names])
    assert seqeval["entity_f1"] == seqeval["entity_precision"] == seqeval["entity_recall"] == pytest.approx(3 / 4)
    assert report["macro_f1"] != pytest.approx(seqeval["entity_f1"])
    # a tag absent from both sides is listed with zeros, and left out of the macro means
    absent = word_report(predicted, gold, [*names, "X"])
    assert absent["per_class"]["X"]["support"] == 0 and absent["macro_f1"] == pytest.approx(report["macro_f1"])
    problem = problem_of(WORD_TAGS)
    assert problem.metrics.reported[0] == "word_accuracy" and problem.report(predicted, gold, names) == report
    assert summary_line({**report, "loss": 0.5}).startswith("word accuracy 0.7500, macro F1 0.6000, loss 0.5000 on 2 sentences")


TRAIN = [[("the", "DET"), ("run", "NOUN"), ("was", "AUX"), ("interminable", "ADJ")],  # 3 subwords
         [("we", "PRON"), ("run", "VERB"), ("home", "NOUN")],
         [("they", "PRON"), ("run", "VERB"), ("home", "NOUN")]]  # fmt: skip
EVALUATED = [[("the", "DET"), ("run", "NOUN"), ("was", "AUX"), ("interminable", "ADJ")],
             [("a", "DET"), ("dog", "NOUN"), ("run", "VERB")]]  # fmt: skip


@pytest.mark.parametrize("label_all_tokens", [False, True])
def test_the_trivial_baseline_of_parts_of_speech_is_each_words_most_frequent_training_tag(label_all_tokens):
    """By hand: in training "run" is VERB twice and NOUN once, so VERB; NOUN is the most frequent tag (3 of 10
    words), which an unseen word ("a", "dog") gets. On the evaluated words: the DET, run VERB (wrong), was
    AUX, interminable ADJ; a NOUN (wrong), dog NOUN, run VERB: 5 of 7. "Every word NOUN" (entity tags'
    baseline) scores 2 of 7. Windows of two subwords (max_length=4) do not change it; nor does training every
    subword (label_all_tokens), where counting subwords would make ADJ, interminable's 3, the most frequent."""
    train = prepared(TRAIN, UPOS, "train", max_length=32, label_all_tokens=label_all_tokens)
    evaluated = prepared(EVALUATED, UPOS, "eval", max_length=4)
    assert len(evaluated) == 5  # "the run", "was", "interminable" (cut to its first subwords), "a dog", "run"
    pos = problem_of(WORD_TAGS)
    by_word, unseen = pos.trivial(train["labels"], train)
    assert UPOS[by_word["run"]] == "VERB" and UPOS[by_word["the"]] == "DET" and UPOS[unseen] == "NOUN"
    gold = [[UPOS.index(t) for _, t in s] for s in EVALUATED]
    baseline = pos.baseline((by_word, unseen), gold, UPOS, dataset=evaluated)
    assert baseline["word_accuracy"] == pytest.approx(5 / 7)
    first_subwords = prepared(TRAIN, UPOS, "train", max_length=32)["labels"]
    most = problem_of(TOKENS).trivial(first_subwords)  # IOB2 tags keep theirs: every word the most frequent tag
    every = pos.report([[most] * len(s) for s in gold], gold, UPOS)
    assert UPOS[most] == "NOUN" and every["word_accuracy"] == pytest.approx(2 / 7)


def _pos_data(tmp_path) -> dict:
    """"home" is NOUN in 12 training sentences and ADV in 3; NOUN is the most frequent tag, which the unseen
    "bird" gets. Validation, 50 sentences: "the cat ran home" (home ADV, so the baseline's NOUN is wrong once
    in 4 words) and "a bird sat ." (all right): a per-word baseline of 7/8, where "every word NOUN" is 2/8."""
    train = ([[("the", "DET"), ("cat", "NOUN"), ("sat", "VERB"), (".", "PUNCT")]] * 6
             + [[("a", "DET"), ("dog", "NOUN"), ("ran", "VERB"), ("home", "NOUN")]] * 12
             + [[("they", "PRON"), ("ran", "VERB"), ("home", "ADV")]] * 3)  # fmt: skip
    validation = ([[("the", "DET"), ("cat", "NOUN"), ("ran", "VERB"), ("home", "ADV")]]
                  + [[("a", "DET"), ("bird", "NOUN"), ("sat", "VERB"), (".", "PUNCT")]]) * 25  # fmt: skip
    rows = lambda sentences: [{"tokens": [w for w, _ in s], "upos": [t for _, t in s]} for s in sentences]  # noqa: E731
    return {"train": write_jsonl(tmp_path / "train.jsonl", rows(train)),
            "validation": write_jsonl(tmp_path / "validation.jsonl", rows(validation))}  # fmt: skip


def test_a_pos_run_judges_keeps_and_cards_word_accuracy_against_the_per_word_baseline(tmp_path):
    """A run on parts of speech: word accuracy and macro F1 (no entity scores) in every evaluation, the best
    checkpoint and the verdict by word accuracy, against the per-word baseline (7/8 by hand); the card names
    word accuracy, tags and a sentence to tag; evaluate_checkpoint.py scores the export the same way."""
    data, out = _pos_data(tmp_path), tmp_path / "run"
    results = main(pos_args(data, out, "max_steps=2"))
    validation = results["validation"]
    assert "entity_f1" not in validation and set(validation["per_class"]) == {"ADV", "DET", "NOUN", "PRON", "PUNCT", "VERB"}
    assert validation["num_words"] == 200 and validation["baseline"]["word_accuracy"] == pytest.approx(7 / 8)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["problem_type"], saved["metric_for_best_model"]) == (WORD_TAGS, "word_accuracy")
    learned = results["learned"]
    assert (learned["metric"], learned["baseline"]) == ("word_accuracy", pytest.approx(7 / 8))
    assert learned["verdict"] is False  # two steps of a tiny model tag worse than the per-word baseline
    assert "a tagger that gives each word its most frequent training tag" in learned["said"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_word_accuracy" in r for r in metrics) and not any("eval_entity_f1" in r for r in metrics)
    card = (out / "model" / "README.md").read_text()
    assert "| split | word accuracy | macro F1 | loss | samples |" in card and "name: word accuracy" in card
    assert "tags without B-/I- prefixes, such as parts of speech; scored by word accuracy" in card
    assert "Tags, with their validation metrics over the words" in card
    assert 'tag("The old man sat by the river.")' in card and "Ada Lovelace" not in card
    assert "entity" not in card.lower()
    scored = evaluate([str(out / "model"), "--data", str(data["validation"]), "--output", str(tmp_path / "eval")])
    assert scored["problem_type"] == WORD_TAGS and "entity_f1" not in scored
    assert scored["word_accuracy"] == pytest.approx(validation["word_accuracy"])


def test_the_search_takes_word_accuracy_for_parts_of_speech(tmp_path):
    """The search reads the problem type and its metric from the data as a run does."""
    from finetune.search import _resolved

    cfg = load_config(None, pos_args(_pos_data(tmp_path), tmp_path / "run"))
    resolved_cfg, samples = _resolved(cfg, checks.Said(quiet=True))
    assert (resolved_cfg.problem_type, resolved_cfg.metric_for_best_model, samples) == (WORD_TAGS, "word_accuracy", 21)


def test_a_problem_type_of_the_other_scheme_is_refused(tmp_path, capsys):
    """problem_type=token_classification beside parts of speech would score them as entities: refused, the
    tags decide it."""
    out = tmp_path / "run"
    user_error(capsys, main, pos_args(_pos_data(tmp_path), out, "problem_type=token_classification"),
               "problem_type=token_classification does not fit these tags (ADV, DET, NOUN", "leave problem_type out",
               rule="labels.tags_of_another_problem")  # fmt: skip
    assert not out.exists()
