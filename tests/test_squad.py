"""Tests for finetune/squad.py: hand-worked cases, and the official SQuAD scripts (evaluate-v1.1.py,
evaluate-v2.0.py) and transformers' utils_qa.py loop, written out below as references, on random data.

python -m pytest tests/test_squad.py -q
"""

from __future__ import annotations

import collections
import json
import math
import random
import re
import string
import time
from pathlib import Path

import numpy as np
import pytest

from finetune.squad import (
    Answer,
    answer_or_abstain,
    answer_span,
    best_answer,
    exact_match,
    f1,
    flatten_squad,
    normalize_answer,
    squad_report,
    tune_null_threshold,
)

SQUAD_SHIFTS = Path(__file__).resolve().parents[1] / "data/squad_shifts_wiki/validation.jsonl"  # bundled


# --- The references: the official scripts' functions, as they are written there ---------------------------

def v1_normalize_answer(s):  # evaluate-v1.1.py
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def v1_f1_score(prediction, ground_truth):  # evaluate-v1.1.py
    prediction_tokens = v1_normalize_answer(prediction).split()
    ground_truth_tokens = v1_normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def v1_exact_match_score(prediction, ground_truth):  # evaluate-v1.1.py
    return v1_normalize_answer(prediction) == v1_normalize_answer(ground_truth)


def v1_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):  # evaluate-v1.1.py
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def v2_get_tokens(s):  # evaluate-v2.0.py (normalize_answer is v1.1's, with re.UNICODE)
    if not s:
        return []
    return v1_normalize_answer(s).split()


def v2_compute_exact(a_gold, a_pred):  # evaluate-v2.0.py
    return int(v1_normalize_answer(a_gold) == v1_normalize_answer(a_pred))


def v2_compute_f1(a_gold, a_pred):  # evaluate-v2.0.py
    gold_toks = v2_get_tokens(a_gold)
    pred_toks = v2_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def v2_raw_scores(answers, a_pred):  # evaluate-v2.0.py's get_raw_scores, for one question
    gold_answers = [a for a in answers if v1_normalize_answer(a)]
    if not gold_answers:
        gold_answers = [""]
    return max(v2_compute_exact(a, a_pred) for a in gold_answers), max(v2_compute_f1(a, a_pred) for a in gold_answers)


def v2_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):  # evaluate-v2.0.py
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def utils_qa_reference(windows, context, n_best_size=20, max_answer_length=30):
    """postprocess_qa_predictions' loop for one example (version_2_with_negative): (best non-null text, its
    score, the min null score); ("", None, null) when no span is valid."""
    min_null, prelim = None, []
    for w in windows:
        start_logits, end_logits, offset_mapping = w["start_logits"], w["end_logits"], w["offsets"]
        feature_null_score = start_logits[0] + end_logits[0]
        if min_null is None or min_null["score"] > feature_null_score:
            min_null = {"text": "", "score": feature_null_score}
        start_indexes = np.argsort(start_logits)[-1 : -n_best_size - 1 : -1].tolist()
        end_indexes = np.argsort(end_logits)[-1 : -n_best_size - 1 : -1].tolist()
        for start_index in start_indexes:
            for end_index in end_indexes:
                if (start_index >= len(offset_mapping) or end_index >= len(offset_mapping)
                        or offset_mapping[start_index] is None or len(offset_mapping[start_index]) < 2
                        or offset_mapping[end_index] is None or len(offset_mapping[end_index]) < 2):
                    continue
                if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                    continue
                s, e = offset_mapping[start_index][0], offset_mapping[end_index][1]
                prelim.append({"text": context[s:e], "score": start_logits[start_index] + end_logits[end_index],
                               "span": True})
    predictions = sorted(prelim, key=lambda x: x["score"], reverse=True)[:n_best_size]
    spans = [p for p in predictions if p.get("span")]
    if not spans:
        return "", None, min_null["score"]
    return spans[0]["text"], spans[0]["score"], min_null["score"]


# --- Random data ---------------------------------------------------------------------------------------

WORDS = ["the", "The", "a", "An", "an", "THE", "cat", "Cat.", "sat", "on", "mat", "mat!", "dog's", "1,000",
         "x-y", "(b)", "an.", "theatre", "a1", "é", "Über", "-", "...", "?", "thé", "the-end", "a'", "cat"]
SPACES = [" ", "  ", "\t", "\n", " , ", ". "]


def random_text(rng: random.Random, max_words: int = 6) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(0, max_words))]
    text = "".join(w + rng.choice(SPACES) for w in words)
    return rng.choice(["", " ", "\t"]) + text.strip() if rng.random() < 0.8 else text


def random_windows(rng: np.random.Generator, context_tokens: list[tuple[int, int]], stride: int, length: int,
                   question_len: int = 3, pad_to: int | None = None) -> list[dict]:
    """Windows as run_qa cuts a context: [CLS] question [SEP] context-part [SEP] (padding), random logits."""
    windows, first = [], 0
    while True:
        part = context_tokens[first : first + length]
        offsets = [None] * (1 + question_len + 1) + list(part) + [None]
        if pad_to is not None:
            offsets += [None] * (pad_to - len(offsets))
        n = len(offsets)
        windows.append({"start_logits": rng.normal(size=n), "end_logits": rng.normal(size=n), "offsets": offsets})
        if first + length >= len(context_tokens):
            return windows
        first += stride


def word_offsets(context: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", context)]


# --- normalize_answer, exact_match, f1 --------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("The Cat", "cat"),
    ("a cat and an apple", "cat and apple"),
    ("theatre anthem", "theatre anthem"),       # articles only as whole words
    ("Denver Broncos.", "denver broncos"),
    ("  New\tYork \n City ", "new york city"),
    ("the-end", "theend"),                     # punctuation goes first: "the-end" is one word then
    ("(the) answer!", "answer"),
    ("U.S.A.", "usa"),
    ("THE", ""),
    ("", ""),
    ("1,000 km²", "1000 km²"),
    ("«the» cat", "« » cat"),                  # not ASCII punctuation: kept; "the" is still a whole word
    ("l'an", "lan"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected
    assert v1_normalize_answer(text) == expected


def test_exact_match_and_f1_by_hand():
    assert exact_match("the Denver Broncos!", ["Denver Broncos"]) == 1.0
    assert exact_match("Broncos", ["Denver Broncos"]) == 0.0
    assert exact_match("Broncos", ["Denver Broncos", "broncos."]) == 1.0  # the best of the golds
    # pred "denver broncos won" (3 tokens), gold "denver broncos" (2): 2 common; P 2/3, R 1, F1 = 2*(2/3)/(5/3) = 0.8
    assert f1("Denver Broncos won", ["Denver Broncos"]) == pytest.approx(0.8)
    # gold 2 "broncos won super bowl" (4 tokens): 2 common; P 2/3, R 1/2, F1 = 2*(1/3)/(7/6) = 4/7;
    # gold 1 gives 0.8: the max is 0.8. Alone, gold 2 gives 4/7.
    assert f1("Denver Broncos won", ["Broncos won Super Bowl"]) == pytest.approx(4 / 7)
    assert f1("Denver Broncos won", ["Broncos won Super Bowl", "the Denver Broncos"]) == pytest.approx(0.8)
    # repeated tokens count with repetition (Counter &): pred "cat cat cat", gold "cat dog": 1 common;
    # P 1/3, R 1/2, F1 = 2*(1/6)/(5/6) = 0.4
    assert f1("cat cat cat", ["cat dog"]) == pytest.approx(0.4)
    assert f1("dog", ["cat"]) == 0.0
    assert f1("", ["cat"]) == 0.0 and exact_match("", ["cat"]) == 0.0


def test_no_answer_questions_as_squad_v2():
    for empty in ["", " ", "the", "?!"]:  # all normalise to ""
        assert exact_match(empty, []) == 1.0 and f1(empty, []) == 1.0
    assert exact_match("cat", []) == 0.0 and f1("cat", []) == 0.0
    # evaluate-v2.0.py drops golds that normalise to "": ["the", "cat"] is ["cat"], [""] is no answer
    assert exact_match("a", ["the", "cat"]) == 0.0
    assert exact_match("", [""]) == 1.0 and f1("", [""]) == 1.0


def test_scores_match_the_official_scripts_on_random_strings():
    rng = random.Random(1234)
    compared_v1 = 0
    for _ in range(600):
        prediction = random_text(rng)
        golds = [random_text(rng) for _ in range(rng.randint(0, 4))]
        em, f = exact_match(prediction, golds), f1(prediction, golds)
        assert (em, f) == pytest.approx(v2_raw_scores(golds, prediction)), (prediction, golds)
        if golds and all(v1_normalize_answer(g) for g in golds):  # where v1.1 and v2.0 agree (see squad.py)
            compared_v1 += 1
            assert em == float(v1_metric_max_over_ground_truths(v1_exact_match_score, prediction, golds))
            assert f == pytest.approx(v1_metric_max_over_ground_truths(v1_f1_score, prediction, golds))
    assert compared_v1 > 200


# --- squad_report -------------------------------------------------------------------------------------

def test_squad_report_v1():
    report = squad_report(["Denver Broncos", "Broncos won", "nope"], [["Denver Broncos"], ["Broncos"], ["yes"]])
    # EM: 1, 0, 0 -> 1/3; F1: 1, 2*(1/2)*1/(3/2) = 2/3, 0 -> (5/3)/3 = 5/9
    assert report == {"exact_match": pytest.approx(1 / 3), "f1": pytest.approx(5 / 9), "num_samples": 3}


def test_squad_report_v2_splits_answerable_and_not():
    report = squad_report(["Denver Broncos", "", "cat", ""], [["Denver Broncos"], ["Broncos"], [], []])
    assert report["num_samples"] == 4
    assert report["exact_match"] == pytest.approx(2 / 4) and report["f1"] == pytest.approx(2 / 4)
    assert report["num_has_answer"] == 2 and report["num_no_answer"] == 2
    assert report["has_answer_exact_match"] == 0.5 and report["has_answer_f1"] == 0.5
    assert report["no_answer_exact_match"] == 0.5 and report["no_answer_f1"] == 0.5
    only_no = squad_report([""], [[]])
    assert only_no["num_has_answer"] == 0 and only_no["has_answer_f1"] == 0.0 and only_no["no_answer_f1"] == 1.0


def test_squad_report_empty_and_mismatch():
    assert squad_report([], []) == {"exact_match": 0.0, "f1": 0.0, "num_samples": 0}
    with pytest.raises(ValueError):
        squad_report(["a"], [])


# --- best_answer, answer_or_abstain -------------------------------------------------------------------

CONTEXT = "The cat sat on the mat while a dog barked at the door"
TOKENS = word_offsets(CONTEXT)  # 13 words


def window(first: int, last: int, start: dict[int, float], end: dict[int, float], pad: int = 0) -> dict:
    """[CLS] q q [SEP] words first..last [SEP] (pads), logits -5 except at the given positions of the window."""
    offsets = [None] * 4 + TOKENS[first : last + 1] + [None] * (1 + pad)
    s, e = np.full(len(offsets), -5.0), np.full(len(offsets), -5.0)
    for i, v in start.items():
        s[i] = v
    for i, v in end.items():
        e[i] = v
    return {"start_logits": s, "end_logits": e, "offsets": offsets}


def test_best_answer_takes_the_best_span_of_all_windows():
    w1 = window(0, 7, {0: 1.0, 5: 2.0}, {0: 1.0, 6: 2.0})     # "cat sat" (words 1..2) scores 4.0
    w2 = window(4, 12, {0: 0.5, 8: 3.0}, {0: 0.0, 9: 3.0})    # words 8..9 of the context: "dog barked", 6.0
    best = best_answer([w1, w2], CONTEXT)
    assert best.text == "dog barked" and best.score == pytest.approx(6.0)
    assert (best.start, best.end) == (CONTEXT.index("dog"), CONTEXT.index("dog") + len("dog barked"))
    assert best.null_score == pytest.approx(0.5)  # min(1 + 1, 0.5 + 0)
    assert best_answer([w2, w1], CONTEXT).null_score == pytest.approx(0.5)
    assert answer_or_abstain(best, 0.0) == "dog barked"
    assert answer_or_abstain(Answer("x", score=1.0, null_score=3.0), 1.9) == ""
    assert answer_or_abstain(Answer("x", score=1.0, null_score=3.0), 2.0) == "x"  # not more than the threshold


def test_best_answer_skips_invalid_spans():
    # window token i is word i - 4. The highest pair is start 5 .. end 13 (9 words) > max_answer_length 4:
    # skipped; the next is 5 .. 7 (9 + 2), not 6 .. 7 (2 + 2)
    w = window(0, 12, {5: 9.0, 6: 2.0}, {13: 9.0, 7: 2.0})
    assert best_answer([w], CONTEXT, max_answer_length=4).text == "cat sat on"
    assert best_answer([w], CONTEXT, max_answer_length=9).text == "cat sat on the mat while a dog barked"
    # end before start: start 8, end 5 are the best logits; skipped, the best valid is 5 .. 5 (3 + 9)
    w = window(0, 12, {8: 9.0, 5: 3.0}, {5: 9.0, 6: 1.0})
    best = best_answer([w], CONTEXT)
    assert (best.text, best.score) == ("cat", pytest.approx(12.0))
    w = window(0, 12, {8: 9.0}, {5: 9.0, 9: 1.0})
    assert best_answer([w], CONTEXT).text == "the mat"  # 8 .. 9 (9 + 1); 8 .. 5 is skipped
    # tokens outside the context (question, [SEP], padding) are never a start or an end
    w = window(0, 3, {1: 9.0, 2: 9.0, 4: 1.0}, {9: 9.0, 10: 9.0, 3: 9.0, 5: 1.0}, pad=2)
    best = best_answer([w], CONTEXT)
    assert best.text == "The cat" and best.score == pytest.approx(2.0)


def test_best_answer_with_no_valid_span():
    w = window(0, 3, {0: 4.0}, {0: 4.0})
    best = best_answer([w], CONTEXT, n_best_size=1)  # only the CLS token proposed
    assert (best.text, best.score, best.null_score, best.start) == ("", -math.inf, 8.0, None)
    assert answer_or_abstain(best, 1e9) == ""
    with pytest.raises(ValueError):
        best_answer([], CONTEXT)


def test_best_answer_matches_utils_qa_on_random_windows():
    rng = np.random.default_rng(7)
    context = " ".join(f"w{i}" for i in range(60))
    tokens = word_offsets(context)
    for trial in range(60):
        windows = random_windows(rng, tokens, stride=int(rng.integers(5, 20)), length=int(rng.integers(20, 40)),
                                 pad_to=50 if trial % 2 else None)
        n_best, max_len = int(rng.integers(1, 25)), int(rng.integers(1, 15))
        text, score, null = utils_qa_reference(windows, context, n_best, max_len)
        best = best_answer(windows, context, n_best, max_len)
        assert best.text == text and best.null_score == pytest.approx(null)
        assert best.score == (-math.inf if score is None else pytest.approx(score))


# --- tune_null_threshold ------------------------------------------------------------------------------

def test_tune_null_threshold_by_hand():
    bests = [Answer("cat", score=5.0, null_score=1.0),    # diff -4, right (F1 1)
             Answer("dog", score=2.0, null_score=1.0),    # diff -1, a no-answer question: answering costs 1
             Answer("mat", score=1.0, null_score=2.0),    # diff 1, right
             Answer("hat", score=0.0, null_score=3.0)]    # diff 3, a no-answer question
    refs = [["cat"], [], ["mat"], []]
    # abstain all: 2/4; answer diff<=-4: 3/4; <=-1: 2/4; <=1: 3/4; <=3: 2/4 -> best 3/4 at the smallest, -4
    threshold, best_f1 = tune_null_threshold(bests, refs)
    assert threshold == -4.0 and best_f1 == pytest.approx(0.75)
    assert squad_report([answer_or_abstain(b, threshold) for b in bests], refs)["f1"] == pytest.approx(0.75)
    # abstaining everywhere is best: a threshold just under the smallest diff
    threshold, best_f1 = tune_null_threshold(bests[1::2], refs[1::2])
    assert threshold < -1.0 and best_f1 == 1.0
    assert [answer_or_abstain(b, threshold) for b in bests[1::2]] == ["", ""]
    assert tune_null_threshold([], []) == (0.0, 0.0)


def test_tune_null_threshold_answers_equal_diffs_together():
    # evaluate-v2.0.py would report 2/2 at threshold 0 (after the first only), which no threshold reaches
    bests = [Answer("cat", score=1.0, null_score=1.0), Answer("dog", score=1.0, null_score=1.0)]
    threshold, best_f1 = tune_null_threshold(bests, [["cat"], []])
    assert best_f1 == pytest.approx(0.5) and threshold < 0.0


def test_tune_null_threshold_matches_find_best_thresh():
    rng = random.Random(99)
    for _ in range(40):
        n = rng.randint(1, 30)
        bests = [Answer(rng.choice(["cat", "dog", "the mat", "cat sat"]), score=rng.gauss(0, 2),
                        null_score=rng.gauss(0, 2)) for _ in range(n)]
        refs = [rng.choice([[], ["cat"], ["cat sat", "a cat"], ["mat"]]) for _ in range(n)]
        threshold, best_f1 = tune_null_threshold(bests, refs)
        qids = [str(i) for i in range(n)]
        preds = {q: b.text for q, b in zip(qids, bests, strict=True)}
        scores = {q: v2_raw_scores(r, b.text)[1] for q, b, r in zip(qids, bests, refs, strict=True)}
        na_probs = {q: b.null_score - b.score for q, b in zip(qids, bests, strict=True)}
        has_ans = {q: bool(r) for q, r in zip(qids, refs, strict=True)}
        official, official_thresh = v2_find_best_thresh(preds, scores, na_probs, has_ans)
        assert best_f1 == pytest.approx(official / 100)
        if best_f1 > sum(not r for r in refs) / n:  # not "abstain everywhere", where the official says 0.0
            assert threshold == official_thresh
        reached = squad_report([answer_or_abstain(b, threshold) for b in bests], refs)["f1"]
        assert reached == pytest.approx(best_f1)


# --- flatten_squad ------------------------------------------------------------------------------------

def test_flatten_squad_v2():
    nested = {"version": "v2.0", "data": [
        {"title": "Cats", "paragraphs": [
            {"context": "The cat sat.", "qas": [
                {"id": "q1", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0},
                                                                 {"text": "cat", "answer_start": 4}],
                 "is_impossible": False},
                {"id": "q2", "question": "Who stood?", "answers": [],
                 "plausible_answers": [{"text": "cat", "answer_start": 4}], "is_impossible": True}]},
            {"context": "Dogs bark.", "qas": [
                {"id": "q3", "question": "What barks?", "answers": [{"text": "Dogs", "answer_start": 0}]}]}]},
        {"title": "Empty", "paragraphs": []}]}
    rows = flatten_squad(nested)
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
    assert rows[0] == {"id": "q1", "title": "Cats", "context": "The cat sat.", "question": "Who sat?",
                       "answers": {"text": ["The cat", "cat"], "answer_start": [0, 4]}}
    assert rows[1]["answers"] == {"text": [], "answer_start": []}
    assert rows[2]["context"] == "Dogs bark." and rows[2]["answers"]["text"] == ["Dogs"]
    assert flatten_squad({"version": "1.1", "data": []}) == []
    # is_impossible wins over answers a file may still carry
    odd = {"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [
        {"id": 7, "question": "q", "answers": [{"text": "c", "answer_start": 0}], "is_impossible": True}]}]}]}
    assert flatten_squad(odd) == [{"id": "7", "title": "T", "context": "c", "question": "q",
                                   "answers": {"text": [], "answer_start": []}}]


# --- answer_span --------------------------------------------------------------------------------------

def test_answer_span():
    # window: [CLS] q q [SEP] words 2..7 ("sat on the mat while a") [SEP] pad
    offsets = [None] * 4 + TOKENS[2:8] + [None, None]
    answer = {"text": ["the mat"], "answer_start": [CONTEXT.index("the mat")]}
    assert answer_span(answer, offsets) == (6, 7)
    straddling = {"text": ["a dog"], "answer_start": [CONTEXT.index("a dog")]}  # "dog" is past the window
    assert answer_span(straddling, offsets) == (0, 0)
    before = {"text": ["The cat"], "answer_start": [0]}
    assert answer_span(before, offsets) == (0, 0)
    after = {"text": ["door"], "answer_start": [CONTEXT.index("door")]}
    assert answer_span(after, offsets) == (0, 0)
    assert answer_span({"text": [], "answer_start": []}, offsets) == (0, 0)
    # only the first gold answer counts
    assert answer_span({"text": ["sat", "the mat"], "answer_start": [8, CONTEXT.index("the mat")]}, offsets) == (4, 4)
    # the first and the last context tokens; part of a token ("at" of "mat") is that token
    assert CONTEXT[8:11] == "sat"
    assert answer_span({"text": ["sat on"], "answer_start": [8]}, offsets) == (4, 5)
    assert answer_span({"text": ["a"], "answer_start": [CONTEXT.index(" a ") + 1]}, offsets) == (9, 9)
    assert answer_span({"text": ["at"], "answer_start": [CONTEXT.index("mat") + 1]}, offsets) == (7, 7)


def test_answer_span_with_sequence_ids():
    # offsets as a fast tokenizer gives them for training: (0, 0) for special tokens, question offsets too
    offsets = [(0, 0), (0, 3), (4, 7), (0, 0)] + TOKENS[2:8] + [(0, 0), (0, 0)]
    sequence_ids = [None, 0, 0, None] + [1] * 6 + [None, None]
    answer = {"text": ["the mat"], "answer_start": [CONTEXT.index("the mat")]}
    assert answer_span(answer, offsets, sequence_ids) == (6, 7)
    last = {"text": ["a"], "answer_start": [CONTEXT.index(" a ") + 1]}  # the window's last context token
    assert answer_span(last, offsets, sequence_ids) == (9, 9)
    assert answer_span({"text": ["cat"], "answer_start": [4]}, offsets, sequence_ids, cls_index=0) == (0, 0)
    # the context first (pad on the left): context_id 0
    offsets = [(0, 0)] + TOKENS[0:3] + [(0, 0), (0, 5), (0, 0)]
    sequence_ids = [None, 0, 0, 0, None, 1, None]
    assert answer_span({"text": ["cat sat"], "answer_start": [4]}, offsets, sequence_ids, context_id=0) == (2, 3)


# --- real data ----------------------------------------------------------------------------------------

def test_first_gold_answer_scores_full_marks_on_squad_shifts():
    rows = [json.loads(line) for line in SQUAD_SHIFTS.read_text(encoding="utf-8").splitlines()]
    began = time.perf_counter()
    references = [r["answers"]["text"] for r in rows]
    report = squad_report([golds[0] for golds in references], references)
    assert report == {"exact_match": 1.0, "f1": 1.0, "num_samples": 1050}
    assert time.perf_counter() - began < 2.0
    # and each answer's start points at its text in the context (the layout answer_span reads)
    spans = [(r["context"], t, s) for r in rows for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"], strict=True)]
    assert all(context[s : s + len(t)] == t for context, t, s in spans)
