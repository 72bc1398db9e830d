"""Spans: an answer's span in a context (extractive question answering), scored as the official SQuAD
v1.1 script scores it (finetune/squad.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset as HFDataset
from datasets import Sequence, Value

from finetune import checks
from finetune.checks import labels
from finetune.config import DataArgs
from finetune.metrics import SPANS
from finetune.problems.base import Problem, with_labels
from finetune.squad import Answer, best_answer, squad_report, tune_null_threshold

ANSWERS = {"text": Sequence(Value("string")), "answer_start": Sequence(Value("int32"))}
OUTPUTS = ["start", "end"]  # the head's two outputs: each token's score as the answer's first and last


class Spans(Problem):
    """The model gives each token of a window a start and an end score (`outputs`: (B, T, 2)); a window is
    trained on its answer's first and last token (finetune/tasks/questions.py), the loss is the
    mean of the two cross-entropies, as transformers' QA models compute it. A question's answer is the
    best span over all its windows (`assemble`)."""

    name, hf_problem_type = SPANS, None
    classes, ids_as_names, windowed, thresholded = False, False, True, True
    trivial_words = "typical answer length, taken as each context's first words (or no answer, where that scores more)"
    counted = "questions"
    pad_value = -1e4  # a padded token's score: never a start or an end

    def describe(self, modality: str, names: list[str]) -> str:
        return "An extractive question-answering model"

    def start_words(self) -> str:
        return ""

    def label_names(self, train: HFDataset, args: DataArgs, said: checks.Said) -> list[str]:
        checks.gate(labels.FIXED_NAMES, args.label_names, list(OUTPUTS), "question answering's outputs")
        return list(OUTPUTS)

    def encode(self, ds, args, names, split, said, fixed=False):
        """The answers checked against their contexts (checks/labels.py, ANSWERS) into `labels`."""
        checks.gate(labels.ANSWERS, ds, args.answers_column, args.context_column, split)
        ds = ds.rename_column(args.answers_column, "labels") if args.answers_column != "labels" else ds
        return ds.cast_column("labels", ANSWERS)

    def check_trained(self, train, names, args, said) -> None:
        pass

    def check_splits(self, raw, names, args, said) -> None:
        pass

    def placeholder(self, ds, args, names):
        return with_labels(ds, ANSWERS, lambda b: [{"text": [], "answer_start": []}] * len(b[args.question_column]))

    def outputs(self, output, inputs: dict[str, Any]) -> torch.Tensor:
        """(B, T, 2): each token's start and end scores, padding's at -1e4: a window's softmax over its own
        tokens, however far the batch pads it (transformers' QA loss counts the padding too, which makes
        the loss depend on the batching)."""
        scores = torch.stack([output.start_logits, output.end_logits], dim=-1)
        mask = inputs.get("attention_mask")
        return scores if mask is None else scores.masked_fill(mask[..., None] == 0, self.pad_value)

    def loss(self, logits, labels, class_weights=None, label_smoothing=0.0):
        """(B,): the mean of the start's and the end's cross-entropy over the window's tokens. Label smoothing
        spreads its share over the window's own tokens, not the batch's padding (torch's would count each
        padded position as a class, so a window's loss would change with what it is batched with)."""
        logits = logits.float()
        start, end = (self._cross_entropy(logits[..., i], labels[:, i], label_smoothing) for i in (0, 1))
        return (start + end) / 2

    def _cross_entropy(self, scores, target, smoothing: float):
        """(B,): cross-entropy of (B, T) token scores; smoothed, (1 - e) * nll + e * mean(-log p) over real tokens."""
        if not smoothing:
            return F.cross_entropy(scores, target, reduction="none")
        logp = scores.log_softmax(-1)
        nll = -logp.gather(-1, target[:, None])[:, 0]
        real = scores > self.pad_value / 2
        uniform = -(logp * real).sum(-1) / real.sum(-1)
        return (1 - smoothing) * nll + smoothing * uniform

    def predictions(self, logits):
        """Each token's start and end scores (B, T, 2): a window's answer is chosen with its question's others."""
        return logits.float()

    def scores(self, logits):
        return self.predictions(logits)

    def class_weights(self, train_labels, num_labels, how):
        return None

    def trivial(self, train_labels, train=None):
        """How many tokens a training answer spans (the median, over windows that hold one): a model that
        learned nothing of the question answers with the context's first that many words."""
        lengths = sorted(int(end) - int(start) + 1 for start, end in train_labels if int(start) > 0)
        return lengths[len(lengths) // 2] if lengths else 1

    def baseline(self, constant, references, names, threshold=0.5, dataset=None):
        """The scores of answering every question with its context's first `constant` words, or, where some
        questions have no answer (SQuAD v2) and that scores more, of answering none."""
        first = [" ".join(r["context"].split()[:constant]) for r in references]
        guesses = [first] + ([[""] * len(references)] if any(not r["answers"] for r in references) else [])
        reports = [self.report(guess, references, names) for guess in guesses]
        best = max(reports, key=lambda r: r["f1"])
        return {k: v for k, v in best.items() if k in ("exact_match", "f1")}

    def report(self, predictions, references, names, threshold=None):
        """Exact match and F1 (finetune/squad.py) of each question's answer (`assemble`: its text and scores)
        against its gold answers. With a null-score threshold (`tune`: {"null_score": t}, SQuAD v2), a question
        whose best span scores more than t below its windows' [CLS] is answered with nothing, and its
        prediction says it abstained."""
        null = threshold.get("null_score") if isinstance(threshold, dict) else None
        texts = []
        for p in predictions:
            if isinstance(p, dict) and null is not None:
                p["abstained"] = p["null_score"] - p["score"] > null
            texts.append("" if isinstance(p, dict) and p.get("abstained") else p["text"] if isinstance(p, dict) else p)
        report = squad_report(texts, [r["answers"] for r in references])
        return {**report, "null_score_threshold": null} if null is not None else report

    def default_threshold(self, cfg):
        """None: answer every question (SQuAD v1.1) until `tune` finds one that abstaining pays on."""
        return None

    def may_tune(self, validation) -> bool:
        """Only validation questions without an answer (SQuAD v2) tune a null threshold."""
        return any(not answers for answers in validation["answers"][:])

    def tune(self, predictions, references, cfg):
        """SQuAD v2: where some validation questions have no answer, the null-score threshold that scores the
        best F1 on them (evaluate-v2.0.py's best_f1_thresh); None when every question has one."""
        if all(r["answers"] for r in references):
            return None
        bests = [Answer(p["text"], p["score"], p["null_score"]) for p in predictions]
        return {"null_score": tune_null_threshold(bests, [r["answers"] for r in references])[0]}

    def store_threshold(self, config, threshold) -> None:
        config.null_score_threshold = None if threshold is None else threshold["null_score"]

    def stored_threshold(self, config):
        value = getattr(config, "null_score_threshold", None)
        return None if value is None else {"null_score": float(value)}

    def assemble(self, windows: list[tuple[dict, Any, Any]], dataset: HFDataset, data: DataArgs) -> tuple[list, list]:
        """Each question's best answer from all its windows (`windows`: each window's meta, scores and
        label, gathered from every process), and its gold answers; in the data's order."""
        of_question: dict[int, list[dict]] = {}
        for meta, scored, _ in windows:
            offsets = [tuple(o) if o[0] >= 0 else None for o in meta["offsets"].tolist()]
            of_question.setdefault(int(meta["example"]), []).append(
                {"start_logits": scored[:, 0].numpy(), "end_logits": scored[:, 1].numpy(), "offsets": offsets,
                 "cls": int(meta["cls"])})  # fmt: skip
        rows = dataset.select_columns(["example", "context", "answers"])
        first = {}
        for example, context, answers in zip(rows["example"], rows["context"], rows["answers"], strict=True):
            first.setdefault(example, (context, answers))
        if sorted(of_question) != sorted(first):
            raise RuntimeError("the evaluated windows do not cover every question once")
        predicted, gold = [], []
        for example in sorted(first):
            context, answers = first[example]
            best = best_answer(of_question[example], context, data.n_best_size, data.max_answer_length)
            predicted.append({"text": best.text, "score": best.score, "null_score": best.null_score})
            gold.append({"answers": list(answers), "context": context})
        return predicted, gold

    def record(self, scored, label, names, per_label):
        """The gold answers, the answer and its score (and, at a tuned null-score threshold, whether it abstained)."""
        abstained = {"abstained": scored["abstained"]} if "abstained" in scored else {}
        return {"answers": list(label["text"]), "prediction": "" if abstained.get("abstained") else scored["text"],
                "score": scored["score"], **abstained}  # fmt: skip
