"""Token classification: a list of words in, a tag per word out (transformers' run_ner.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from finetune import checks
from finetune.checks import inputs
from finetune.formats import word_lists
from finetune.metrics import TOKENS, WORD_TAGS
from finetune.tasks.base import DataArgs, tokenized_fingerprint
from finetune.tasks.text import TextClassification

WORD_META = ("sentence", "first_word")  # what a window row says of where its words come from
WORD_TEXT = ("words", "word_tags")  # a window's words and their tags, which the model never reads: the per-word baseline's


class TokenClassification(TextClassification):
    """A tag per word (named entities, parts of speech), scored on words.

    Labelling: each word is tokenized on its own; the first subword carries the word's tag, the
    others are ignored (-100), or with `label_all_tokens` (training only) carry it too (a B- tag
    becomes its I- tag after the first subword). Evaluation reads the first subword's prediction, so
    each word is scored once whatever `label_all_tokens` says.

    A sentence longer than `max_length` is not cut: it is split at word boundaries into consecutive
    windows that each fit, without overlap, so every word is trained on and scored exactly once (the
    price: a word at a window's start sees no left context). A single word longer than a window keeps
    its first subwords. Each window row records its sentence and first word (`WORD_META`), so that
    evaluation puts the sentences back together whatever the batching and processes, and its words and
    their tags (`WORD_TEXT`), which a plain tag set's per-word baseline reads (finetune/problems/tags.py).
    """

    name = "token-classification"
    streams = False  # read whole: its data is the text task's in another shape
    auto_class = "AutoModelForTokenClassification"
    architecture_suffix = "ForTokenClassification"
    own_settings = (TextClassification.own_settings - {"text_column", "text_pair_column", "label_column", "text_windows",
                                                       "label_columns"}) | {
        "tokens_column", "tags_column", "label_all_tokens"}  # words in lists, not texts
    problems = (TOKENS, WORD_TAGS)  # entities in IOB2, or plain tags (parts of speech): the tag names decide

    def counted(self, ds) -> str:
        """Sentences, and the windows they make where a long one was split: "5 sentences (7 windows)"."""
        sentences = len(set(ds["sentence"][:]))
        return f"{sentences:,} sentences" + (f" ({len(ds):,} windows)" if len(ds) != sentences else "")

    def input_columns(self, data: DataArgs) -> list[str]:
        return [data.tokens_column]

    def label_columns(self, data: DataArgs) -> list[str]:
        return [data.tags_column]

    def holds(self, features, data: DataArgs) -> bool:
        return data.tags_column in features and word_lists(features.get(data.tokens_column))

    def prepare(self, ds, preprocessor, data: DataArgs, split: str, num_channels: int,
                said: checks.Said | None = None):
        """Sentences into windows of subwords with their labels (see the class docstring)."""
        tokenizer, column, max_length = preprocessor, data.tokens_column, data.max_length
        budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
        names = ds.features["labels"].feature.names
        # label_all_tokens: the I- tag for the later subwords of a B- word (the word's own tag otherwise)
        later = {i: names.index(f"I-{n[2:]}") for i, n in enumerate(names) if n[:2] == "B-" and f"I-{n[2:]}" in names}
        all_subwords = split == "train" and data.label_all_tokens

        def windows(batch, rows):
            flat = [w for words in batch[column] for w in words]
            sizes = iter(len(p) for p in tokenizer(flat, add_special_tokens=False)["input_ids"])
            spans = []  # (sentence, first word, end word): words that fit a window by their subword counts
            for row, words in zip(rows, batch[column], strict=True):
                counts = [next(sizes) for _ in words]
                if 0 in counts:
                    word = counts.index(0)
                    raise checks.explain(inputs.WORDS, split, words[word], row, word)
                spans += [(row, start, end) for start, end in _fitting(counts, budget)]
            out: dict[str, list] = {"labels": [], "sentence": [], "first_word": [], "length": [],
                                    "words": [], "word_tags": []}  # fmt: skip
            words_of = {row: (words, tags) for row, words, tags in zip(rows, batch[column], batch["labels"], strict=True)}
            while spans:
                encoded = tokenizer([words_of[s][0][a:b] for s, a, b in spans], is_split_into_words=True,
                                    truncation=True, max_length=max_length)  # fmt: skip
                again = []
                for i, (row, start, end) in enumerate(spans):
                    word_ids = encoded.word_ids(i)
                    kept = max((w for w in word_ids if w is not None), default=-1) + 1
                    if kept < end - start:  # its words tokenized longer together: the rest makes a window of its own
                        again.append((row, start + max(kept, 1), end))
                        end = start + max(kept, 1)
                    tags, labels, previous = words_of[row][1], [], None
                    for w in word_ids:
                        if w is None or w + start >= end:
                            labels.append(-100)
                        elif w != previous:
                            labels.append(tags[start + w])
                        else:
                            labels.append(later.get(tags[start + w], tags[start + w]) if all_subwords else -100)
                        previous = w
                    for key, value in encoded.items():
                        out.setdefault(key, []).append(value[i])
                    out["labels"].append(labels)
                    out["sentence"].append(row)
                    out["first_word"].append(start)
                    out["words"].append(words_of[row][0][start:end])
                    out["word_tags"].append(tags[start:end])
                    out["length"].append(len(labels))
                spans = again
            return out

        return ds.map(windows, batched=True, with_indices=True, remove_columns=ds.column_names, desc="tokenizing words",
                      new_fingerprint=tokenized_fingerprint(ds, windows))  # fmt: skip

    def collator(self, preprocessor, pad_to_multiple_of: int | None):
        return PadWords(preprocessor, pad_to_multiple_of)

    def sample_weights(self, ds) -> list[int] | None:
        """Each row's labelled subwords: what its summed loss adds to its optimizer step's count."""
        return [sum(label != -100 for label in labels) for labels in ds["labels"]]

    def sample_inputs(self, ds, data: DataArgs) -> list[dict[str, Any]]:
        return [{"words": words} for words in ds[data.tokens_column]]

    def usage_example(self, where: str, problem: Any, data: DataArgs) -> str:
        # Trained on first subwords only, a word's tag is its first subword's ("first"); trained on every
        # subword, adjacent subwords agree and "simple" groups them.
        strategy = "simple" if data.label_all_tokens else "first"
        return (
            f'tag = pipeline("{self.pipeline_tag}", model="{where}", aggregation_strategy="{strategy}")\n'
            f'tag("{problem.pipeline_example}")  # {problem.pipeline_returns}'
        )


def _fitting(counts: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive (first word, end word) spans of a sentence whose words' subword `counts` fit `budget`
    tokens each; a word longer than the budget is a span alone."""
    spans, start = [], 0
    while start < len(counts):
        end, used = start + 1, counts[start]
        while end < len(counts) and used + counts[end] <= budget:
            used, end = used + counts[end], end + 1
        spans.append((start, end))
        start = end
    return spans


class PadWords:
    """Pads a batch of word windows (labels with -100) through transformers' token-classification
    collator; the rows' sentence and first word go in `batch["meta"]`, which the model does not read."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8):
        from transformers import DataCollatorForTokenClassification

        self.pad = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, features: list[dict[str, Any]], length: int | None = None):
        import torch

        meta = {key: torch.tensor([f[key] for f in features]) for key in WORD_META}
        words = [{k: v for k, v in f.items() if k not in (*WORD_META, *WORD_TEXT, "length")} for f in features]
        if length is None:
            batch = self.pad(words)
        else:  # exactly `length` tokens, labels padded with -100 alike (a length bucket, finetune/shapes.py)
            pad = dataclasses.replace(self.pad, padding="max_length", max_length=length, pad_to_multiple_of=None)
            batch = pad(words)
        batch["meta"] = meta
        return batch

    def pad_to(self, features: list[dict[str, Any]], length: int):
        return self(features, length)

