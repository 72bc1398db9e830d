"""The interface every task fills in (`Task`), and the fingerprint of a tokenized split that every text task's
preparation shares."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from finetune import checks
from finetune.checks import models as model_rules
from finetune.metrics import MULTI, REGRESSION, SINGLE

# The settings a task reads: finetune.config's DataArgs and ModelArgs. Named here, not imported, since
# the config imports this module (its task names and columns come from the tasks).
DataArgs = Any
ModelArgs = Any


def column_numbers(columns, prefix: str) -> list[int]:
    """The numbers of the columns named `prefix` and a number (ending0, ending1, ...), sorted."""
    return sorted(int(c[len(prefix):]) for c in columns if re.fullmatch(rf"{re.escape(prefix)}\d+", c))


EXPORT_TEXTS = ["a short text", "a second, somewhat longer text, so that the batch is padded"]


class Task:
    """The interface every task fills in; the text task is the default behaviour."""

    name: str
    modality: str  # the card's words: "a 2-class text classifier"
    auto_class: str  # transformers' auto class
    architecture_suffix: str  # a saved model's `architectures` entry ends with it
    # Settings only this task reads: the card's hyperparameter table leaves them out for the others.
    own_settings: frozenset[str] = frozenset()
    problems: tuple[str, ...] = (SINGLE, MULTI, REGRESSION)  # finetune/problems/: the first is the default
    has_word_embeddings = False  # freeze_embeddings applies
    preprocessor_first = False  # loaded before the model (a tokenizer's vocabulary sizes a model from a config)
    streams = False  # streaming=true reads its training data as a stream (finetune/streams.py)
    numbered: str | None = None  # the prefix of input columns numbered from 0 (multiple choice's ending0, ...)
    layout: str | None = None  # fixed column names the task reads: the line on a missing one names them
    # The rules `check_model` asks of the built model and its preprocessor (a `model_rules.Fit`).
    model_checks: tuple[checks.Rule, ...] = ()

    @property
    def pipeline_tag(self) -> str:
        return self.name

    def auto_model(self):
        import transformers

        return getattr(transformers, self.auto_class)

    # --- data -------------------------------------------------------------------------------------
    def input_columns(self, data: DataArgs) -> list[str]:
        raise NotImplementedError

    def label_columns(self, data: DataArgs) -> list[str]:
        """The columns the labels come from: label_columns (multi-label 0/1 columns), else label_column."""
        return list(data.label_columns) if data.label_columns else [data.label_column]

    def holds(self, features, data: DataArgs) -> bool:
        """Whether training data with these columns (datasets' `features`) is this task's, for a config
        that leaves `task` null; the text task takes what no other task claims."""
        return False

    def prepare(self, ds, preprocessor, data: DataArgs, split: str, num_channels: int,
                said: checks.Said | None = None):
        """One split as the model reads it, with `labels` kept; training augmentation for "train"; what it
        will read checked (finetune/checks/inputs.py)."""
        raise NotImplementedError

    def collator(self, preprocessor, pad_to_multiple_of: int | None):
        raise NotImplementedError

    def epoch_listener(self, ds):
        """What the epoch sampler tells each epoch's number (an augmentation seeded by it), or None."""
        return getattr(ds, "epoch_listener", None)

    def lengths(self, ds) -> list[int] | None:
        """Each prepared sample's length, for length-grouped batches and longest-first evaluation."""
        return ds["length"][:] if "length" in ds.column_names else None

    def default_workers(self, device_type: str) -> int:
        """Data-loader workers when `dataloader_num_workers` is null."""
        return 0

    def counted(self, ds) -> str:
        """A prepared split's size as the start summary says it: "201 samples"."""
        return f"{len(ds):,} samples"

    def sample_inputs(self, ds, data: DataArgs) -> list[dict[str, Any]]:
        """What each sample was, for predictions.jsonl."""
        raise NotImplementedError

    # --- model --------------------------------------------------------------------------------------
    def load_preprocessor(self, args: ModelArgs, model_config=None):
        raise NotImplementedError

    def load_saved_preprocessor(self, source: str):
        """The preprocessor saved beside a model (an export, a hub model)."""
        raise NotImplementedError

    def vocab_size(self, preprocessor) -> int | None:
        return None

    def fit_preprocessor(self, model, preprocessor) -> None:
        """The preprocessor and the built model made to agree where the task knows how (a padding token)."""

    def check_model(
        self, model, preprocessor, args: ModelArgs, data: DataArgs, exported: str | None = None
    ) -> None:
        """After the model is built: the preprocessor fitted to it (`fit_preprocessor`), then the task's rules
        of what would train garbage or fail mid-run (`model_checks`: a wrong tokenizer, finetune/checks/models.py).
        `exported`: the saved model whose own preprocessor was loaded (evaluation), not `args`'s."""
        self.fit_preprocessor(model, preprocessor)
        name = exported or args.tokenizer_name or args.model_name_or_path
        checks.gate(self.model_checks, model_rules.Fit(model, preprocessor, name, data, bool(exported)))

    def notices(self, raw, preprocessor, data: DataArgs) -> list[str]:
        """Notes worth printing before training (images resized), from the raw splits."""
        return []

    def sample_weights(self, ds) -> list[int] | None:
        """Each prepared sample's count in its optimizer step's loss; None: one each."""
        return None

    def sample_labels(self, ds, labels: list) -> list:
        """The labels of a prepared split's samples as the data has them (the trivial baseline's), from its
        rows' `labels`: one per row, where a row is a sample; a text read in windows counts once (`example`),
        not once a window."""
        if "example" not in ds.column_names:
            return labels
        first = {}
        for text, label in zip(ds["example"], labels, strict=True):
            first.setdefault(text, label)
        return list(first.values())

    def export_inputs(self, model, preprocessor) -> dict[str, Any]:
        """A batch of two as the preprocessor makes it (texts of two lengths: padded), the inputs the model
        takes: what the ONNX graph is traced on (finetune/onnx_export.py)."""
        import inspect

        batch = preprocessor(EXPORT_TEXTS, padding=True, return_tensors="pt")
        return {k: v for k, v in batch.items() if k in inspect.signature(model.forward).parameters}

    def export_axes(self, sample: dict[str, Any]) -> dict[str, dict[int, str]]:
        """Each traced input's dynamic axes by name: any batch size and text length runs on the ONNX file."""
        return {k: {0: "batch", 1: "sequence"} for k in sample}

    def sample_columns(self, columns: list[str], data: DataArgs) -> list[str]:
        """The columns whose values make a sample what it is, of a split's `columns` (the splits' shared-sample
        rules compare them): the input columns."""
        return self.input_columns(data)

    def setting_of(self, column: str, data: DataArgs) -> str | None:
        """The setting that names an input column (`text_column`, `context_column`, ...), which a line about
        the column tells the user to set; None where the task's layout names it (multiple choice's endings)."""
        named = [s for s in ("text_pair_column", *sorted(self.own_settings)) if s.endswith("_column") and s != "label_column"]
        return next((s for s in named if getattr(data, s, None) == column), None)

    def numbers(self, columns) -> list[int]:
        """The numbers of the task's `numbered` input columns among `columns` (none for a task without them)."""
        return column_numbers(columns, self.numbered) if self.numbered else []

    def card_columns(self, data: DataArgs) -> str:
        """The card's words for the columns the model reads: "text column `text` paired with `text_pair`"."""
        return f"{self.modality} column " + " paired with ".join(f"`{c}`" for c in self.input_columns(data))

    def sequence_length(self, data: DataArgs) -> int | None:
        """Tokens per sample for the layer-split planner; None: from the model's config."""
        return None

    # --- the model card ---------------------------------------------------------------------------
    # `problem`: the run's finetune.problems.Problem (its pipeline arguments and words); not imported here,
    # which would make the problems' home, which asks the tasks, an import of theirs.
    def usage_example(self, where: str, problem: Any, data: DataArgs) -> str:
        raise NotImplementedError



def tokenized_fingerprint(ds, fn) -> str | None:
    """The fingerprint of `ds.map(fn)` (datasets' cache key: an unchanged split is tokenized once, across
    runs), made without pickling the tokenizer. datasets' own hashes `fn` with everything it closes over,
    the tokenizer's whole vocabulary included, at every map: 0.7 s a split on 2 cores, most of a small
    run's data phase. Here the tokenizer is named by its serialized form (what it does to text: its
    vocabulary, normaliser, pre-tokenizer, post-processor and truncation side) with the settings its
    Python side adds; the rest is `fn`'s code, the rest of its closure, the task modules' source (the
    helpers `fn` calls) and the dataset's own fingerprint. None, datasets' own hashing, for a tokenizer without a
    serialized form (a slow one)."""
    from datasets.fingerprint import Hasher
    from transformers import PreTrainedTokenizerBase

    def named(value):
        if not isinstance(value, PreTrainedTokenizerBase):
            return value
        return (type(value).__name__, _serialized(value), value.model_max_length, value.padding_side,
                value.truncation_side, sorted(value.special_tokens_map.items()))  # fmt: skip

    cells = [cell.cell_contents for cell in fn.__closure__ or ()]
    tokenizers = [v for v in cells if isinstance(v, PreTrainedTokenizerBase)]
    if not tokenizers or not all(hasattr(t, "backend_tokenizer") for t in tokenizers):
        return None
    try:  # every task module's: the helpers `fn` calls live in its own and in those it builds on
        source = [file.read_bytes() for file in sorted(Path(__file__).parent.glob("*.py"))]
    except OSError:  # no source to read (an installed bytecode-only copy)
        return None
    code = fn.__code__
    return Hasher.hash((ds._fingerprint, code.co_code, code.co_consts, code.co_names, [named(v) for v in cells], source))


def _serialized(tokenizer) -> Any:
    """A fast tokenizer's serialized form less the truncation and padding its last call left set (state,
    not what it does to text). A tokenizers' file opens with version, truncation and padding: the rest is
    named by its SHA-256, neither parsed nor hashed as a Python object (a 30k vocabulary: 0.5 s a split
    on 2 cores, where this takes 2 ms)."""
    text = tokenizer.backend_tokenizer.to_str()
    cut = text.find(',"added_tokens":')
    try:
        head = json.loads(text[:cut] + "}") if cut > 0 else None
    except ValueError:
        head = None
    if head is None or set(head) - {"version", "truncation", "padding"}:  # another layout: parsed whole
        serialized = json.loads(text)
        for state in ("truncation", "padding"):
            serialized.pop(state, None)
        return serialized
    return head.get("version"), hashlib.sha256(text[cut:].encode()).hexdigest()

