"""Multiple choice: a context and its candidate endings in, the right ending out (transformers' run_swag.py).

The data is in SWAG's layout, as the Hub's `swag` and run_swag.py have it: `sent1` (the context), `sent2`
(the start of every ending, optional), `ending0` ... `endingN` (two or more candidates, numbered from 0) and
`label` (the right ending's number). Each candidate is tokenized as a pair with its context (`sent1`, then
`sent2` and the ending), cut at `max_length` from the longer side first; the model scores every candidate and
the loss is the cross-entropy over them (finetune/problems/choices.py), so one sample is one context with all
its candidates, however many there are.
"""

from __future__ import annotations

from typing import Any

from finetune import checks
from finetune.checks import inputs
from finetune.metrics import CHOICES
from finetune.tasks.base import DataArgs, column_numbers, tokenized_fingerprint
from finetune.tasks.text import TextClassification

CONTEXT, HEADER, ENDING = "sent1", "sent2", "ending"  # SWAG's column names (run_swag.py's)


def ending_columns(columns) -> list[str]:
    """The candidates' columns of a split: ending0, ending1, ... up to the first number missing."""
    numbered = set(column_numbers(columns, ENDING))
    count = next(i for i in range(len(numbered) + 1) if i not in numbered)
    return [f"{ENDING}{i}" for i in range(count)]


class MultipleChoice(TextClassification):
    name = "multiple-choice"
    streams = False  # read whole: its samples are the text task's in another shape
    auto_class = "AutoModelForMultipleChoice"
    architecture_suffix = "ForMultipleChoice"
    own_settings = TextClassification.own_settings - {"text_column", "text_pair_column", "label_columns", "text_windows"}
    problems = (CHOICES,)
    numbered = ENDING
    layout = (f"SWAG's layout: {CONTEXT} (the context), {HEADER} (optional), {ENDING}0, {ENDING}1, ... (the "
              "candidates) and label (the right one's number from 0; docs/multiple-choice.md): rename the columns to "
              "it, a list of candidates into one column each, letters into numbers")  # fmt: skip

    def input_columns(self, data: DataArgs) -> list[str]:
        """The context and the first two candidates: the columns every split must have (more are read too)."""
        return [CONTEXT, f"{ENDING}0", f"{ENDING}1"]

    def label_columns(self, data: DataArgs) -> list[str]:
        return [data.label_column]

    def holds(self, features, data: DataArgs) -> bool:
        return CONTEXT in features and len(ending_columns(features)) >= 2

    def prepare(self, ds, preprocessor, data: DataArgs, split: str, num_channels: int, said=None):
        """Each sample's candidates tokenized as pairs with its context (`input_ids`: a list per candidate);
        `length`: its longest candidate's tokens, for grouping."""
        endings, header = ending_columns(ds.column_names), HEADER in ds.column_names

        def pairs(batch) -> tuple[list, list]:  # (the context, then sent2 and the ending) for each candidate
            firsts = [context for context in batch[CONTEXT] for _ in endings]
            starts = batch[HEADER] if header else [None] * len(batch[CONTEXT])  # optional, in a row too
            return firsts, [f"{start or ''} {batch[e][i]}".strip() for i, start in enumerate(starts) for e in endings]

        def choices(batch):
            # cut at max_length from the longer side first, the context too (run_swag.py's truncation)
            enc = preprocessor(*pairs(batch), truncation=True, max_length=data.max_length)
            out = {k: [v[i : i + len(endings)] for i in range(0, len(v), len(endings))] for k, v in enc.items()}
            out["length"] = [max(len(ids) for ids in sample) for sample in out["input_ids"]]
            return out

        drop = [c for c in ds.column_names if c != "labels"]
        tokenized = ds.map(choices, batched=True, remove_columns=drop, desc="tokenizing choices",
                           new_fingerprint=tokenized_fingerprint(ds, choices))  # fmt: skip
        if split == "train":  # what the model reads of the first 500 samples' candidates, as the text task says it
            (firsts, seconds), ids = pairs(ds[:500]), [c for sample in tokenized[:500]["input_ids"] for c in sample]
            checks.gate(inputs.TOKENIZED, firsts, ids, [len(c) for c in ids], data.max_length, preprocessor, seconds,
                        said=said or checks.Said())  # fmt: skip
        return tokenized

    def sample_columns(self, columns: list[str], data: DataArgs) -> list[str]:
        """The context and every candidate, in order (sent2, optional, is no text a row must have)."""
        return [CONTEXT, *ending_columns(columns)]

    def card_columns(self, data: DataArgs) -> str:
        return f"contexts from `{CONTEXT}` (with `{HEADER}`, where the data has it), candidates from `{ENDING}0`, `{ENDING}1`, ..."

    def collator(self, preprocessor, pad_to_multiple_of: int | None):
        return PadChoices(preprocessor, pad_to_multiple_of)

    def sample_inputs(self, ds, data: DataArgs) -> list[dict[str, Any]]:
        columns = [ds[c][:] for c in ending_columns(ds.column_names)]  # each column read once, not row by row
        return [{"context": context, "endings": list(row)} for context, *row in zip(ds[CONTEXT][:], *columns, strict=True)]

    def export_inputs(self, model, preprocessor) -> dict[str, Any]:
        """Two contexts of two candidates each (the candidates of two lengths: padded)."""
        import inspect

        enc = preprocessor(["A man sits down.", "A man sits down."] * 2, ["He reads.", "He reads a long book."] * 2,
                           padding=True, return_tensors="pt")  # fmt: skip
        accepted = inspect.signature(model.forward).parameters
        return {k: v.view(2, 2, -1) for k, v in enc.items() if k in accepted}

    def export_axes(self, sample: dict[str, Any]) -> dict[str, dict[int, str]]:
        return {k: {0: "batch", 1: "choices", 2: "sequence"} for k in sample}

    def usage_example(self, where: str, problem: Any, data: DataArgs) -> str:
        # transformers has no multiple-choice pipeline: the model and its tokenizer score the candidates.
        return (
            "from transformers import AutoModelForMultipleChoice, AutoTokenizer\n\n"
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")\n'
            f'model = AutoModelForMultipleChoice.from_pretrained("{where}")\n'
            'context, endings = "She opens the umbrella.", ["It is raining.", "The sun is hot.", "She eats soup."]\n'
            'inputs = tokenizer([context] * len(endings), endings, padding=True, return_tensors="pt")\n'
            "scores = model(**{k: v.unsqueeze(0) for k, v in inputs.items()}).logits[0]\n"
            "endings[int(scores.argmax())]  # the most likely ending"
        )


class PadChoices:
    """Pads every candidate of a batch to one length (transformers' multiple-choice collator): inputs of
    (samples, candidates, tokens); the labels are the right candidates' numbers."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8):
        from transformers import DataCollatorForMultipleChoice

        self.pad = DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, features: list[dict[str, Any]], length: int | None = None):
        import dataclasses

        rows = [{k: v for k, v in f.items() if k != "length"} for f in features]
        if length is None:
            return self.pad(rows)
        # exactly `length` tokens (a length bucket, finetune/shapes.py)
        return dataclasses.replace(self.pad, padding="max_length", max_length=length, pad_to_multiple_of=None)(rows)

    def pad_to(self, features: list[dict[str, Any]], length: int):
        return self(features, length)
