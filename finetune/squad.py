"""Extractive question answering (SQuAD): the answer from a model's start/end logits, and its scores.

    from finetune.squad import answer_or_abstain, best_answer, squad_report

    best = best_answer(windows, context)   # windows: [{"start_logits", "end_logits", "offsets"}, ...] of one question
    print(squad_report([answer_or_abstain(best, 0.0)], [["Denver Broncos"]]))  # {"exact_match": 1.0, "f1": 1.0, ...}

The scores are those of the official SQuAD scripts (evaluate-v1.1.py, evaluate-v2.0.py): an answer is
normalised (lower case, no punctuation, no articles a/an/the, single spaces) before it is compared; exact
match is 1 when the normalised texts are equal; F1 is the token overlap (a bag of words) of the two; a
question counts its best gold answer. A question with no gold answer (SQuAD v2) is right only for a
prediction that is empty once normalised. The reported numbers are shares in [0, 1]; the official
scripts print 100 times them.

The answer is that of transformers' `postprocess_qa_predictions` (examples/pytorch/question-answering/
utils_qa.py): a long context is cut into overlapping windows, each window proposes spans from its
`n_best_size` best start and end tokens, and the best-scoring span (start logit + end logit) of all the
windows wins. For SQuAD v2 the null score is the CLS token's (start_logits[0] + end_logits[0]), its minimum
over the windows; `answer_or_abstain` answers "" when it beats the best span by more than a threshold,
which `tune_null_threshold` picks on validation data as evaluate-v2.0.py's `find_best_thresh` does.
`flatten_squad` reads a nested SQuAD JSON file as rows of the Hub `squad` layout, and `answer_span` gives a
training window's start/end token labels as run_qa.py's `prepare_train_features` does.

No torch here: numpy and the standard library, so the data checks and the reports import it at no cost.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """`s` as the official scripts compare it: lower case, punctuation (string.punctuation) removed, the
    articles a/an/the removed as whole words, runs of whitespace made one space, no space at the ends."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _golds(truths: Sequence[str]) -> list[str]:
    """The gold answers evaluate-v2.0.py compares with: those that do not normalise to nothing."""
    return [t for t in truths if normalize_answer(t)]


def _token_f1(prediction_tokens: list[str], truth_tokens: list[str]) -> float:
    """evaluate-v1.1.py's `f1_score` on two non-empty token lists: the harmonic mean of the shares of
    common tokens (counted with repetition) in the prediction and in the gold answer."""
    num_same = sum((Counter(prediction_tokens) & Counter(truth_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, truths: Sequence[str]) -> float:
    """1.0 when `prediction` normalises to one of the gold answers `truths`, else 0.0. With no gold answer
    (an unanswerable SQuAD v2 question) 1.0 only for a prediction that normalises to "" ("", "the", "?")."""
    golds = _golds(truths)
    normalized = normalize_answer(prediction)
    if not golds:
        return float(normalized == "")
    return float(any(normalized == normalize_answer(t) for t in golds))


def f1(prediction: str, truths: Sequence[str]) -> float:
    """The token F1 of `prediction` with its best gold answer in `truths` (the max over them). With no gold
    answer, 1.0 for a prediction that normalises to "" and 0.0 otherwise (evaluate-v2.0.py's `compute_f1`
    when either side has no token); an empty prediction for an answerable question is 0.0."""
    golds = _golds(truths)
    tokens = normalize_answer(prediction).split()
    if not golds:
        return float(not tokens)
    if not tokens:
        return 0.0
    return max(_token_f1(tokens, normalize_answer(t).split()) for t in golds)


def squad_report(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Exact match and F1 of `predictions` (one text per question, "" to abstain) against `references` (the
    gold answers of each question; an empty list for an unanswerable one), as shares in [0, 1]: the
    official scripts print 100 times these. `num_samples` questions. When a question has no gold answer
    (SQuAD v2) also the scores and counts of the answerable and the unanswerable ones apart, as
    evaluate-v2.0.py's HasAns/NoAns: `has_answer_exact_match`, `has_answer_f1`, `num_has_answer`,
    `no_answer_exact_match`, `no_answer_f1`, `num_no_answer`. No samples: every number 0."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    em = [exact_match(p, r) for p, r in zip(predictions, references, strict=True)]
    f = [f1(p, r) for p, r in zip(predictions, references, strict=True)]

    def mean(values: list[float], keep: list[bool]) -> float:
        kept = [v for v, k in zip(values, keep, strict=True) if k]
        return sum(kept) / len(kept) if kept else 0.0

    every = [True] * len(em)
    report: dict[str, Any] = {"exact_match": mean(em, every), "f1": mean(f, every), "num_samples": len(em)}
    has_answer = [bool(r) for r in references]
    if not all(has_answer):
        no_answer = [not h for h in has_answer]
        report.update(
            has_answer_exact_match=mean(em, has_answer), has_answer_f1=mean(f, has_answer),
            num_has_answer=sum(has_answer), no_answer_exact_match=mean(em, no_answer),
            no_answer_f1=mean(f, no_answer), num_no_answer=sum(no_answer),
        )
    return report


@dataclass(frozen=True)
class Answer:
    """One question's best span over its windows: `text` (context[start:end]), its `score` (start logit +
    end logit; -inf when no window had a valid span, then text is "" and start/end None), and `null_score`,
    the lowest CLS score (start_logits[cls] + end_logits[cls]) of its windows."""

    text: str
    score: float
    null_score: float
    start: int | None = None
    end: int | None = None


def _is_context(offsets: Sequence[Any], index: int) -> bool:
    """Whether token `index` of a window is a context token: it has a (char_start, char_end) pair."""
    return index < len(offsets) and offsets[index] is not None and len(offsets[index]) >= 2


def best_answer(
    windows: Sequence[Mapping[str, Any]], context: str, n_best_size: int = 20, max_answer_length: int = 30
) -> Answer:
    """The answer to one question from all its windows, as utils_qa.py's `postprocess_qa_predictions`. Each
    window has `start_logits` and `end_logits` (1-D, one per token), `offsets` (per token a (char_start,
    char_end) pair into `context`, None for question, special and padding tokens) and optionally `cls`, the
    index of its CLS token (0 unless given), whose start and end scores are the window's null score. A window proposes every
    pair of its `n_best_size` highest start and end tokens that are both context tokens, end >= start and at
    most `max_answer_length` tokens long; the best score over all windows wins (the first on a tie)."""
    if not windows:
        raise ValueError("best_answer needs the windows of a question; got none")
    best_score, best_span, null_score = -math.inf, None, math.inf
    for window in windows:
        start_logits, end_logits = np.asarray(window["start_logits"]), np.asarray(window["end_logits"])
        offsets = window["offsets"]
        cls = window.get("cls", 0)  # the window's CLS token (last, for a tokenizer that pads left)
        null_score = min(null_score, float(start_logits[cls] + end_logits[cls]))
        starts = np.argsort(start_logits)[-1 : -n_best_size - 1 : -1].tolist()
        ends = np.argsort(end_logits)[-1 : -n_best_size - 1 : -1].tolist()
        for s in starts:
            for e in ends:
                if not (_is_context(offsets, s) and _is_context(offsets, e)):
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(start_logits[s] + end_logits[e])
                if score > best_score:
                    best_score, best_span = score, (int(offsets[s][0]), int(offsets[e][1]))
    if best_span is None:
        return Answer(text="", score=-math.inf, null_score=null_score)
    start, end = best_span
    return Answer(text=context[start:end], score=best_score, null_score=null_score, start=start, end=end)


def answer_or_abstain(best: Answer, threshold: float = 0.0) -> str:
    """SQuAD v2's prediction: "" (no answer) when `best.null_score - best.score > threshold` (utils_qa.py's
    `null_score_diff_threshold`), else the best span's text."""
    return "" if best.null_score - best.score > threshold else best.text


def tune_null_threshold(bests: Sequence[Answer], references: Sequence[Sequence[str]]) -> tuple[float, float]:
    """(threshold, F1): the threshold on `null_score - score` for `answer_or_abstain` that gives the highest
    mean F1 (a share in [0, 1]) on these validation questions, as evaluate-v2.0.py's `find_best_thresh`:
    start from abstaining everywhere, sort the questions by their diff and answer them one by one. Questions
    with equal diffs are answered together (a threshold cannot split them), and the F1 returned is the one
    `answer_or_abstain` reaches with the threshold returned. The smallest best threshold; when abstaining
    everywhere is best, one just below the smallest diff. No questions: (0.0, 0.0)."""
    if len(bests) != len(references):
        raise ValueError(f"{len(bests)} answers for {len(references)} references")
    if not bests:
        return 0.0, 0.0
    diffs = [b.null_score - b.score for b in bests]
    gains = [f1(b.text, r) - f1("", r) for b, r in zip(bests, references, strict=True)]  # answering rather than abstaining
    score = best_score = sum(f1("", r) for r in references)
    order = sorted(range(len(bests)), key=lambda i: diffs[i])
    best_threshold = math.nextafter(diffs[order[0]], -math.inf)
    for rank, i in enumerate(order):
        score += gains[i]
        if rank + 1 < len(order) and diffs[order[rank + 1]] == diffs[i]:
            continue  # the next question has the same diff: it is answered too
        if score > best_score:
            best_score, best_threshold = score, diffs[i]
    return float(best_threshold), best_score / len(bests)


def flatten_squad(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A nested SQuAD v1.1/v2.0 JSON file (`{"version", "data": [{"title", "paragraphs": [{"context", "qas":
    [{"id", "question", "answers", "is_impossible"?}]}]}]}`) as rows of the Hub `squad` layout, in file
    order: `{"id", "title", "context", "question", "answers": {"text": [...], "answer_start": [...]}}`. An
    unanswerable v2 question (`is_impossible`) has empty lists; v2's `plausible_answers` are left out."""
    rows = []
    for article in obj["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [] if qa.get("is_impossible", False) else qa.get("answers", [])
                rows.append({
                    "id": str(qa["id"]), "title": article.get("title", ""), "context": paragraph["context"],
                    "question": qa["question"],
                    "answers": {"text": [a["text"] for a in answers],
                                "answer_start": [int(a["answer_start"]) for a in answers]},
                })
    return rows


def squad_dataset(rows: list[dict[str, Any]]):
    """`flatten_squad`'s rows as a dataset, typed as datasets' JSON reader types a JSON Lines file of them: a
    field whose values are of several kinds (a number among the questions) is `Json`, which the column rules
    then name with its row (finetune/checks/columns.py, `mixed_types`), as they do for JSON Lines."""
    from datasets import Dataset, Features, Json

    try:
        return Dataset.from_list(rows)
    except (TypeError, ValueError):  # pyarrow's ArrowTypeError and ArrowInvalid: a field of several kinds
        pass
    features = {}
    for key in rows[0]:
        try:
            features[key] = Dataset.from_dict({key: [row[key] for row in rows]}).features[key]
        except (TypeError, ValueError):
            features[key] = Json()
    return Dataset.from_list(rows, features=Features(features))


def answer_span(
    answers: Mapping[str, Sequence[Any]], offsets: Sequence[Any], sequence_ids: Sequence[int | None] | None = None,
    context_id: int = 1, cls_index: int = 0,
) -> tuple[int, int]:
    """A training window's (start, end) token labels, as run_qa.py's `prepare_train_features`: the tokens of
    the FIRST gold answer of `answers` (Hub layout: {"text": [...], "answer_start": [...]}) in this window,
    or (cls_index, cls_index) when there is no answer or it is not wholly inside the window. `offsets` are
    the window's (char_start, char_end) pairs; the context tokens are those whose `sequence_ids` are
    `context_id` (1 when the context comes second), or without `sequence_ids` those whose offsets are not None."""
    if not answers["answer_start"]:
        return cls_index, cls_index
    start_char = int(answers["answer_start"][0])
    end_char = start_char + len(answers["text"][0])
    if sequence_ids is None:
        context = [i for i in range(len(offsets)) if _is_context(offsets, i)]
    else:
        context = [i for i, sid in enumerate(sequence_ids) if sid == context_id]
    if not context:
        return cls_index, cls_index
    first, last = context[0], context[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return cls_index, cls_index
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1
