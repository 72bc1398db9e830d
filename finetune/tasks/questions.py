"""Extractive question answering: a question and a context in, the answer's span out (transformers' run_qa.py)."""

from __future__ import annotations

from typing import Any

from finetune import checks
from finetune.checks import inputs
from finetune.metrics import SPANS
from finetune.squad import answer_span
from finetune.tasks.base import DataArgs, tokenized_fingerprint
from finetune.tasks.text import TextClassification


class QuestionAnswering(TextClassification):
    """Extractive question answering (SQuAD): a question and a context in, the answer's span in the
    context out (transformers' run_qa.py).

    The question and the context are tokenized as a pair; a context longer than `max_length` is not cut
    but split into windows that overlap by `doc_stride` tokens (`return_overflowing_tokens`), so every
    answer lies whole in some window. A window is labelled with its answer's first and last token, or
    with its CLS token (0, 0) when the answer is not whole inside it (or the question has none). Each
    window row keeps its question's index (`example`), each token's character span in the context
    (`offsets`; -1 for the question's and the special tokens), the context and the gold answers, so that
    evaluation picks each question's best span from all its windows (finetune/problems/spans.py).
    """

    name = "question-answering"
    streams = False  # read whole: its data is the text task's in another shape
    auto_class = "AutoModelForQuestionAnswering"
    architecture_suffix = "ForQuestionAnswering"
    own_settings = (TextClassification.own_settings - {"text_column", "text_pair_column", "label_column", "label_columns"}
                    - {"text_windows"}) | {"question_column", "context_column", "answers_column", "doc_stride", "n_best_size",
                         "max_answer_length"}  # fmt: skip
    problems = (SPANS,)

    def counted(self, ds) -> str:
        """Questions, and the windows their contexts make: "1,050 questions (1,118 windows)"."""
        questions = len(set(ds["example"][:]))
        return f"{questions:,} questions" + (f" ({len(ds):,} windows)" if len(ds) != questions else "")

    def input_columns(self, data: DataArgs) -> list[str]:
        return [data.question_column, data.context_column]

    def label_columns(self, data: DataArgs) -> list[str]:
        return [data.answers_column]

    def holds(self, features, data: DataArgs) -> bool:
        """The question, context and answers columns, or a column of SQuAD's answers under another name (the
        column rules then name the settings to set)."""
        named = all(c in features for c in (data.question_column, data.context_column, data.answers_column))
        return named or any(isinstance(f, dict) and {"text", "answer_start"} <= set(f) for f in features.values())

    def prepare(self, ds, preprocessor, data: DataArgs, split: str, num_channels: int,
                said: checks.Said | None = None):
        """Question-context pairs into overlapping windows with their answers' token spans (the class docstring)."""
        tokenizer, question, context = preprocessor, data.question_column, data.context_column
        first = tokenizer.padding_side == "right"  # the question first, as the model was trained (run_qa.py)
        questions = [str(q or "").lstrip() for q in ds[question][:]]
        checks.gate(inputs.QUESTIONS, questions, tokenizer, data.max_length, data.doc_stride, split)

        def windows(batch, rows):
            questions = [q.lstrip() for q in batch[question]]  # leading spaces only waste the window
            pair = (questions, batch[context]) if first else (batch[context], questions)
            enc = tokenizer(*pair, truncation="only_second" if first else "only_first", max_length=data.max_length,
                            stride=data.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True)  # fmt: skip
            of_sample, spans = enc.pop("overflow_to_sample_mapping"), enc.pop("offset_mapping")
            out: dict[str, list] = {key: list(value) for key, value in enc.items()}
            for key in ("labels", "example", "offsets", "cls", "length", "context", "answers", "id"):
                out[key] = []
            for i, j in enumerate(of_sample):
                in_context = 1 if first else 0
                offsets = [list(o) if s == in_context else [-1, -1] for o, s in zip(spans[i], enc.sequence_ids(i), strict=True)]
                answers, ids = batch["labels"][j], enc["input_ids"][i]
                cls = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else 0  # last for XLNet
                out["labels"].append(list(answer_span(answers, [o if o[0] >= 0 else None for o in offsets], cls_index=cls)))
                out["cls"].append(cls)
                out["example"].append(rows[j])
                out["offsets"].append(offsets)
                out["length"].append(len(offsets))
                out["context"].append(batch[context][j])
                out["answers"].append(list(answers["text"]))
                out["id"].append(str(batch["id"][j]) if "id" in batch else str(rows[j]))
            return out

        return ds.map(windows, batched=True, with_indices=True, remove_columns=ds.column_names, desc="tokenizing questions",
                      new_fingerprint=tokenized_fingerprint(ds, windows))  # fmt: skip

    def collator(self, preprocessor, pad_to_multiple_of: int | None):
        return PadSpans(preprocessor, pad_to_multiple_of)

    def sample_inputs(self, ds, data: DataArgs) -> list[dict[str, Any]]:
        ids = ds["id"] if "id" in ds.column_names else [str(i) for i in range(len(ds))]
        return [{"id": i, "question": q} for i, q in zip(ids, ds[data.question_column], strict=True)]

    def usage_example(self, where: str, problem: Any, data: DataArgs) -> str:
        # transformers 5 has no question-answering pipeline (its MIGRATION_GUIDE_V5): the model and its
        # tokenizer answer in five lines; evaluate_checkpoint.py --predictions reads long contexts in windows.
        return (
            "from transformers import AutoModelForQuestionAnswering, AutoTokenizer\n\n"
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")\n'
            f'model = AutoModelForQuestionAnswering.from_pretrained("{where}")\n'
            'inputs = tokenizer("Where was Ada Lovelace born?", "Ada Lovelace was born in London in 1815.", return_tensors="pt")\n'
            "output = model(**inputs)\n"
            "start, end = int(output.start_logits.argmax()), int(output.end_logits.argmax())\n"
            'tokenizer.decode(inputs["input_ids"][0, start : end + 1])  # the answer'
        )


class PadSpans:
    """Pads a batch of question windows on the right; each row's question index, token offsets (padded with
    -1) and CLS token's index go in `batch["meta"]`, which the model does not read; the labels are the (start, end) tokens."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8):
        self.tokenizer, self.pad_to_multiple_of = tokenizer, pad_to_multiple_of

    def __call__(self, features: list[dict[str, Any]], length: int | None = None):
        import torch

        inputs = [{k: v for k, v in f.items() if k in ("input_ids", "attention_mask", "token_type_ids")} for f in features]
        # Padded on the right whatever the tokenizer's side, so token i of a window is offset i and its labels'
        if length is None:
            batch = self.tokenizer.pad(inputs, padding=True, pad_to_multiple_of=self.pad_to_multiple_of,
                                       padding_side="right", return_tensors="pt")  # fmt: skip
        else:
            batch = self.tokenizer.pad(inputs, padding="max_length", max_length=length, padding_side="right",
                                       return_tensors="pt")  # fmt: skip
        width = batch["input_ids"].shape[1]
        offsets = torch.full((len(features), width, 2), -1, dtype=torch.long)
        for i, f in enumerate(features):
            offsets[i, : len(f["offsets"])] = torch.tensor(f["offsets"], dtype=torch.long)
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)
        batch["meta"] = {"example": torch.tensor([f["example"] for f in features]), "offsets": offsets,
                         "cls": torch.tensor([f.get("cls", 0) for f in features])}  # fmt: skip
        return batch

    def pad_to(self, features: list[dict[str, Any]], length: int):
        return self(features, length)

