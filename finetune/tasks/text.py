"""Text classification: a text, or a pair, in; a label per text out (transformers' run_glue.py)."""

from __future__ import annotations

from typing import Any

from finetune import checks
from finetune.checks import inputs
from finetune.checks import models as model_rules
from finetune.tasks.base import DataArgs, ModelArgs, Task, tokenized_fingerprint

PAIRS = {"premise": "hypothesis", "text_a": "text_b", "sentence_a": "sentence_b", "text": "text_pair"}


def pair_partner(column: str, columns: list[str]) -> str | None:
    """The column that a pair data set keeps beside `column`: sentence1 -> sentence2, question1 -> question2,
    premise -> hypothesis, text_a -> text_b."""
    partner = PAIRS.get(column) or (column[:-1] + "2" if column.endswith("1") else None)
    return partner if partner in columns else None


def pair_first(column: str, columns: list[str]) -> str | None:
    """The pair's first column when `column` is its second: sentence2 -> sentence1, hypothesis -> premise."""
    first = {b: a for a, b in PAIRS.items()}.get(column) or (column[:-1] + "1" if column.endswith("2") else None)
    return first if first in columns else None


class TextClassification(Task):
    name = "text-classification"
    modality = "text"
    auto_class = "AutoModelForSequenceClassification"
    architecture_suffix = "ForSequenceClassification"
    own_settings = frozenset({"max_length", "group_by_length", "freeze_embeddings", "pad_to_multiple_of", "tokenizer_name",
                              "length_buckets", "text_column", "text_pair_column", "label_column",
                              "label_columns", "text_windows"})  # fmt: skip
    has_word_embeddings = True
    preprocessor_first = True
    streams = True
    model_checks = tuple(model_rules.TEXT_MODEL)

    def input_columns(self, data: DataArgs) -> list[str]:
        return data.text_columns

    def counted(self, ds) -> str:
        """Texts, and the windows they make when read whole (text_windows): "1,066 samples (3,208 windows)"."""
        if "example" not in ds.column_names:
            return super().counted(ds)
        texts = len(set(ds["example"][:]))
        return f"{texts:,} samples" + (f" ({len(ds):,} windows)" if len(ds) != texts else "")

    def prepare(self, ds, preprocessor, data: DataArgs, split: str, num_channels: int,
                said: checks.Said | None = None):
        """Tokenized once (datasets caches it), without padding (the collator pads each batch); `length`
        kept for grouping. With text_windows, a text longer than max_length becomes overlapping windows,
        each a training sample with its text's label and its text's index (`example`): evaluation scores
        each text once, from the mean of its windows' logits (finetune/evaluation.py)."""
        columns, max_length, overlap = self.input_columns(data), data.max_length, data.text_windows
        if overlap is not None:
            checks.gate(inputs.WINDOWS, preprocessor, max_length, overlap, data.text_pair_column,
                        said=said or checks.Said(quiet=True))  # its warning is the training run's

        def tokenize(batch):
            return self.tokenize(batch, preprocessor, data)

        def windows(batch, rows):
            enc = preprocessor(batch[columns[0]], truncation=True, max_length=max_length, stride=overlap,
                               return_overflowing_tokens=True)  # fmt: skip
            of_text = enc.pop("overflow_to_sample_mapping")
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            enc["example"] = [rows[j] for j in of_text]
            enc["labels"] = [batch["labels"][j] for j in of_text]
            return enc

        make, more = (tokenize, {}) if overlap is None else (windows, {"with_indices": True})
        drop = ds.column_names if overlap is not None else [c for c in ds.column_names if c != "labels"]
        tokenized = ds.map(make, batched=True, remove_columns=drop, desc="tokenizing",
                           new_fingerprint=tokenized_fingerprint(ds, make), **more)  # fmt: skip
        if split == "train":
            texts, ids = ds[columns[0]][:2000], tokenized[:2000]["input_ids"]
            pairs = ds[columns[1]][:2000] if len(columns) > 1 else None
            checks.gate(inputs.TOKENIZED if overlap is None else inputs.READ_WHOLE, texts, ids, tokenized["length"],
                        max_length, preprocessor, pairs, data.streaming, said=said or checks.Said())  # fmt: skip
        return tokenized

    def tokenize(self, batch: dict[str, list], preprocessor, data: DataArgs):
        """Rows (a column's values by name) tokenized, cut at max_length, `length` kept: `prepare`'s, and a
        streamed block's (finetune/streams.py), which datasets' map would cost more than the tokenizer."""
        enc = preprocessor(*[batch[c] for c in self.input_columns(data)], truncation=True, max_length=data.max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    def collator(self, preprocessor, pad_to_multiple_of: int | None):
        return PadText(preprocessor, pad_to_multiple_of)

    def default_workers(self, device_type: str) -> int:
        # Collating BERT-base batches of 128 in the training process took 17-21 ms of a 72 ms step on
        # an H100; on a CPU a worker competes with training for the cores.
        return 2 if device_type == "cuda" else 0

    def sample_inputs(self, ds, data: DataArgs) -> list[dict[str, Any]]:
        columns = {"text": data.text_column, "text_pair": data.text_pair_column}
        values = {key: ds[column] for key, column in columns.items() if column}
        return [dict(zip(values, row, strict=True)) for row in zip(*values.values(), strict=True)]

    def load_preprocessor(self, args: ModelArgs, model_config=None):
        from transformers import AutoTokenizer

        name = args.tokenizer_name or args.model_name_or_path
        checks.gate(model_rules.TOKENIZER_SOURCE, name)
        try:
            return AutoTokenizer.from_pretrained(name, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as e:
            loading = model_rules.Loading("tokenizer", name, e, None if args.tokenizer_name else "model_name_or_path")
            raise checks.explain(model_rules.LOAD_FAILED, loading) from None

    def load_saved_preprocessor(self, source: str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)

    def vocab_size(self, preprocessor) -> int | None:
        return len(preprocessor) if preprocessor is not None else None

    def fit_preprocessor(self, model, preprocessor) -> None:
        """Batches are padded by the tokenizer, whatever the model's config says: a tokenizer without a
        padding token (GPT-2's and kin) pads with its end-of-text token, as transformers' examples do (else
        its unknown token), and the model is told that id (GPT-2's classifier reads the last token that is
        not padding). One with neither is refused by `model_rules.no_padding_token`, before anything is
        written, not at the first batch."""
        if preprocessor.pad_token_id is None:
            fallback = next((t for t in (preprocessor.eos_token, preprocessor.unk_token) if t is not None), None)
            if fallback is None:
                return
            preprocessor.pad_token = fallback
        model.config.pad_token_id = preprocessor.pad_token_id

    def sequence_length(self, data: DataArgs) -> int | None:
        return data.max_length

    def usage_example(self, where: str, problem: Any, data: DataArgs) -> str:
        arguments, returns = problem.pipeline_arguments, problem.pipeline_returns
        if data.text_pair_column:
            call = 'classify({"text": "the first sentence", "text_pair": "the second sentence"})'
        else:
            call = f'classify("a text like those of the `{data.text_column}` column")'
        return (
            f'classify = pipeline("{self.pipeline_tag}", model="{where}"{arguments})\n'
            f"{call}  # {returns}"
        )


class PadText:
    """Pads a text batch to its longest sample, rounded up to `pad_to_multiple_of` (tensor cores)."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8):
        self.tokenizer, self.pad_to_multiple_of = tokenizer, pad_to_multiple_of

    def __call__(self, features: list[dict[str, Any]]):
        return self._with_meta(features, padding=True, pad_to_multiple_of=self.pad_to_multiple_of)

    def pad_to(self, features: list[dict[str, Any]], length: int):
        """The batch padded to exactly `length` tokens (a length bucket, finetune/shapes.py)."""
        return self._with_meta(features, padding="max_length", max_length=length)

    def _with_meta(self, features: list[dict[str, Any]], **padding):
        """The padded batch; a window's text index (text_windows) in `batch["meta"]`, which the model does not read."""
        import torch

        inputs = [{k: v for k, v in f.items() if k not in ("length", "example")} for f in features]
        batch = self.tokenizer.pad(inputs, return_tensors="pt", **padding)
        if features and "example" in features[0]:
            batch["meta"] = {"example": torch.tensor([f["example"] for f in features])}
        return batch

