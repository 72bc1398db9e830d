"""Datasets → dataloaders for text and images.

Text: tokenized once with `map(batched=True)` (cached by `datasets`, run on the main process first),
padded per batch. Images: decoded and run through the model's image processor on the fly, with a
random flip for training. Labels become ids `0..K-1` in the column `labels`, named in `label_names`
(regression targets and multi-label sets: numbers and multi-hot vectors, see finetune/problems.py).

The training order of an epoch is `EpochSampler`: a permutation drawn from (seed, epoch), optionally
length-grouped, that can start at any sample. That is what makes a mid-epoch resume exact without
reading and discarding the batches already seen.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import math
import os
import random
from pathlib import Path
from typing import Any

import PIL.Image
import torch
from datasets import ClassLabel, DatasetDict, Image, Value, load_dataset
from datasets import Dataset as HFDataset
from torch.utils.data import Sampler

from finetune.config import DataArgs
from finetune.errors import TrainingStopped, UserError, first_line
from finetune.problems import SINGLE, encode_splits, infer_problem_type

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".tsv": "csv"}


# --- loading ---------------------------------------------------------------------------------------


def _builder_for(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise UserError(f"{path}: unsupported file type '{suffix}'; use .csv, .json, .jsonl or .parquet")
    return FILE_BUILDERS[suffix]


def _chain(e: BaseException):
    """`e` and the errors it wraps, outermost first: datasets wraps the parser's error in its own."""
    while e is not None:
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # type: ignore[assignment]


def _root_cause(e: BaseException) -> str:
    """The first line of the innermost exception."""
    *_, e = _chain(e)
    first = first_line(e)
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _diagnose_file(split: str, path: str) -> str | None:
    """Why a data file does not parse, with a line number, when we can tell; None otherwise.

    Only called after `datasets` failed, so a good file is never read twice."""
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".tsv"):
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f, delimiter="\t" if suffix == ".tsv" else ",")
            header = next(rows, [])
            for row in rows:
                if row and len(row) != len(header):
                    return (
                        f"{split} file {path} line {rows.line_num} has {len(row)} fields, the header has "
                        f"{len(header)}; fix that row (quote fields that contain the delimiter)"
                    )
    elif suffix in (".json", ".jsonl"):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        try:
            json.loads(text)
            return None  # valid JSON: the problem is its shape, not its syntax
        except json.JSONDecodeError as e:
            line, column, msg = e.lineno, e.colno, e.msg
        lines = [(n, t) for n, t in enumerate(text.splitlines(), 1) if t.strip()]
        for i, (number, text_line) in enumerate(lines):
            try:
                json.loads(text_line)
            except json.JSONDecodeError as e:
                if i > 0:  # JSON Lines whose earlier lines parse: this line is the broken one
                    line, column, msg = number, e.colno, e.msg
                break
        return f"{split} file {path} is not valid JSON or JSON Lines: line {line} column {column}: {msg}"
    return None


def _check_readable_and_separated(split: str, path: str) -> None:
    """Before `datasets` reads the file: that it may be read, and that a .csv is comma-separated. A file
    separated by semicolons (a spreadsheet's export in many locales) reads as one column, or as rows of
    the wrong length: say what it is instead."""
    if not os.access(path, os.R_OK):
        raise UserError(f"{split} file {path} is not readable (permission denied); check its permissions")
    if Path(path).suffix.lower() != ".csv":
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline().strip()
    if ";" in header and "," not in header:
        raise UserError(
            f"{split} file {path} looks semicolon-separated (its header is {header[:80]!r}); this app reads "
            "comma-separated .csv or tab-separated .tsv: save it with one of those"
        )


def load_raw(
    files: dict[str, str], dataset_name: str | None, dataset_config_name: str | None, data_dir: str | None
) -> DatasetDict:
    """Load train (and validation/test when present) from files (by split), an image folder or the hub.

    Files are loaded one split at a time, so that an error names the file that caused it and a
    column's type is inferred per file (labels are matched by name across splits anyway)."""
    for split, path in files.items():
        if not Path(path).is_file():
            raise UserError(f"{split} file not found: {path}")
        if Path(path).stat().st_size == 0:
            raise UserError(f"{split} file is empty: {path}")
        _check_readable_and_separated(split, path)
    if data_dir and not Path(data_dir).is_dir() and dataset_name in (None, "imagefolder"):
        raise UserError(f"data_dir not found: {data_dir}")
    if files and dataset_name in (None, "csv", "json", "parquet"):
        raw = DatasetDict()
        for split, path in files.items():  # each with its own builder: a .csv train, a .jsonl test
            builder = _builder_for(path)
            kwargs = {"sep": "\t"} if Path(path).suffix.lower() == ".tsv" else {}
            try:
                raw[split] = load_dataset(builder, data_files={split: path}, **kwargs)[split]
            except Exception as e:  # datasets raises many types for unreadable data
                _reraise_a_stop(e)
                if "corresponds to no data" in _root_cause(e):  # a header and no rows
                    raise UserError(f"the {split} data has no rows ({path}); check the file") from None
                raise UserError(
                    _diagnose_file(split, path)
                    or f"could not load the {split} file {path}: "
                    f"{_root_cause(e)}; check that it is valid {builder}"
                ) from None
    else:
        raw = _load_folder_or_hub(dataset_name, dataset_config_name, data_dir)
    if "train" not in raw:
        raise UserError(f"the data has no 'train' split (found: {', '.join(raw) or 'none'})")
    return raw


def _reraise_a_stop(e: BaseException) -> None:
    """A signal while datasets parses a file (SIGTERM raises TrainingStopped there) comes back wrapped in
    datasets' own error: it is a stop, not bad data."""
    stop = next((inner for inner in _chain(e) if isinstance(inner, TrainingStopped)), None)
    if stop is not None:
        raise stop from None


def _load_folder_or_hub(name: str | None, config_name: str | None, data_dir: str | None) -> DatasetDict:
    try:
        if name in (None, "imagefolder") and data_dir:
            return load_dataset("imagefolder", data_dir=data_dir)
        return load_dataset(name, config_name, data_dir=data_dir)
    except Exception as e:  # datasets raises many types for unreadable data; the message is the help
        _reraise_a_stop(e)
        cause = _root_cause(e)
        if name in (None, "imagefolder") and (
            "no data" in cause or "EmptyDataset" in cause or "doesn't contain any data" in cause
        ):
            raise UserError(
                f"data_dir {data_dir} holds no images; an image folder is "
                "<data_dir>/train/<label>/<image>.png|jpg (validation/, test/ optional)"
            ) from None
        what = name or data_dir
        raise UserError(f"could not load data from {what}: {cause}") from None


# --- labels ----------------------------------------------------------------------------------------


def _label_values(ds: HFDataset, column: str) -> list[Any]:
    feature = ds.features[column]
    if isinstance(feature, ClassLabel):
        return [feature.names[i] for i in sorted(set(ds[column]))]
    return sorted(set(ds[column]), key=lambda v: (str(type(v)), v))


def resolve_label_names(train: HFDataset, column: str, label_names: list[str] | None) -> list[str]:
    """Label names in id order: `label_names` as given, a ClassLabel's names, else the sorted
    distinct values of train."""
    feature = train.features[column]
    if label_names:
        names = list(label_names)
    elif isinstance(feature, ClassLabel):
        names = list(feature.names)
    else:
        names = [str(v) for v in _label_values(train, column)]
    present = {str(v) for v in _label_values(train, column)}
    if len(present) < 2:
        raise UserError(
            f"label column '{column}' has a single class ({', '.join(present) or 'none'}); "
            "a classifier needs at least two"
        )
    unknown = present - set(names)
    if unknown:
        raise UserError(
            f"training labels {sorted(unknown)} are not in label_names {names}; list them all in label_names, "
            "or set label_names=null to take them from the data (the recipe for your own files, "
            "finetune/configs/bert_custom_files.yaml, does)"
        )
    return names


def encode_labels(ds: HFDataset, column: str, label_names: list[str], split: str) -> HFDataset:
    """Map the label column to ids by NAME into `labels` (a ClassLabel), whatever its type was."""
    feature = ds.features[column]
    to_id = {name: i for i, name in enumerate(label_names)}
    if isinstance(feature, ClassLabel):
        names = feature.names

        def name_of(v):  # noqa: E306
            return names[v]
    else:
        name_of = str
    seen = {name_of(v) for v in set(ds[column])}
    unseen = sorted(seen - set(to_id))
    if unseen:
        raise UserError(
            f"{split} labels {unseen[:5]} were not seen in training (known: {', '.join(label_names)})"
        )
    ds = ds.map(
        lambda b: {"labels": [to_id[name_of(v)] for v in b[column]]}, batched=True, desc=f"labels ({split})"
    )
    if column != "labels":
        ds = ds.remove_columns(column)
    return ds.cast_column("labels", ClassLabel(names=label_names))


def check_columns(
    ds: HFDataset, split: str, label_column: str | list[str], inputs: list[str], text: bool
) -> None:
    """The label column(s) and input columns exist; text columns hold strings; no value is null."""
    label_columns = [label_column] if isinstance(label_column, str) else list(label_column)
    for column in (*label_columns, *inputs):
        if column not in ds.column_names:
            folders = (
                "; an image folder labels each image by the folder it is in: <data_dir>/train/<class>/*.png "
                "(and validation/, test/ beside train/)"
                if not text and column in label_columns and ds.column_names == inputs
                else ""
            )
            raise UserError(
                f"column '{column}' not found in the {split} data; columns are: {', '.join(ds.column_names)}"
                + folders
            )
    if text:
        for column in inputs:
            feature = ds.features[column]
            if not (isinstance(feature, Value) and feature.dtype in ("string", "large_string")):
                raise UserError(
                    f"text column '{column}' in the {split} data holds {feature}, not text; "
                    "set text_column to a column of strings"
                )
            if any(v is None for v in ds[column]):
                raise UserError(f"text column '{column}' in the {split} data has empty (null) values")
            _check_not_all_empty(ds[column], column, split)
    for column in label_columns:
        labels = ds[column]
        if any(v is None for v in labels):
            row = next(i for i, v in enumerate(labels) if v is None)
            raise UserError(
                f"label column '{column}' in the {split} data has empty (null) values "
                f"(first at row {row + 1}); fill them in or drop those rows"
            )


def _check_not_all_empty(texts: list, column: str, split: str) -> None:
    """A text column of empty strings trains on the special tokens alone."""
    if texts and all(not v.strip() for v in texts):
        raise UserError(
            f"text column '{column}' in the {split} data holds only empty strings; set text_column to the "
            "column that holds the texts"
        )


def load_splits(args: DataArgs) -> tuple[DatasetDict, list[str]]:
    """Raw splits with encoded `labels` (class ids; numbers or multi-hot vectors, finetune/problems.py);
    a seeded validation split (stratified by class) when there is none."""
    raw = load_raw(args.files, args.dataset_name, args.dataset_config_name, args.data_dir)
    text = args.task == "text-classification"
    for split in raw:
        if len(raw[split]) == 0:
            raise UserError(f"the {split} data has no rows; check the file or folder")
        check_columns(raw[split], split, args.label_sources, args.input_columns, text)
        if not text:
            verify_images(raw[split], args.image_column, split)
    problem = infer_problem_type(raw["train"], args)  # regression and multi-label: finetune/problems.py
    if problem == SINGLE:
        label_names = resolve_label_names(raw["train"], args.label_column, args.label_names)
        raw = DatasetDict({s: encode_labels(d, args.label_column, label_names, s) for s, d in raw.items()})
    else:
        raw, label_names = encode_splits(raw, args, problem)
    if "validation" not in raw:
        held_out = args.validation_split_percentage / 100
        # Stratified by class for single-label; a seeded random share for numbers and label sets.
        stratify = {"stratify_by_column": "labels"} if problem == SINGLE else {}
        try:
            parts = raw["train"].train_test_split(test_size=held_out, seed=args.seed, **stratify)
        except ValueError as e:
            raise UserError(f"cannot hold out a stratified validation split: {e}") from None
        raw["train"], raw["validation"] = parts["train"], parts["test"]
    for split, limit in (
        ("train", args.max_train_samples),
        ("validation", args.max_eval_samples),
        ("test", args.max_test_samples),
    ):
        if limit is not None and split in raw and len(raw[split]) > limit:
            raw[split] = raw[split].select(range(limit))
    return raw, label_names


# --- preprocessing ---------------------------------------------------------------------------------


def tokenize(ds: HFDataset, tokenizer, columns: list[str], max_length: int) -> HFDataset:
    """Tokenize `columns` (a text, or a pair) without padding (the collator pads per batch); keep
    `length` for grouping."""

    def fn(batch):
        texts = [batch[c] for c in columns]
        enc = tokenizer(*texts, truncation=True, max_length=max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    keep = {"labels"}
    return ds.map(
        fn, batched=True, remove_columns=[c for c in ds.column_names if c not in keep], desc="tokenizing"
    )


def _image_name(value: dict[str, Any], index: int | None = None) -> str:
    if value.get("path"):
        return str(value["path"])
    return f"#{index}" if index is not None else "(an image stored in the data file)"


def _image_source(value: dict[str, Any]):
    """What PIL opens for an `Image(decode=False)` value: its bytes, else its path."""
    return io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value["path"]


def open_image(value: dict[str, Any], index: int | None = None) -> PIL.Image.Image:
    """Decode one image of an `Image(decode=False)` column ({"bytes", "path"}), naming it on failure."""
    try:
        image = PIL.Image.open(_image_source(value))
        image.load()
        return image
    except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError) as e:
        raise UserError(
            f"cannot read image {_image_name(value, index)}: {e}; remove or replace the file", local=True
        ) from None


def _undecoded(ds: HFDataset, column: str, split: str) -> HFDataset:
    try:
        return ds.cast_column(column, Image(decode=False))
    except (ValueError, TypeError) as e:
        raise UserError(
            f"column '{column}' in the {split} data does not hold images ({ds.features[column]}): "
            f"{e}; set image_column"
        ) from None


def verify_images(ds: HFDataset, column: str, split: str) -> None:
    """Check every image's container before training starts, so a corrupt file stops the run before it
    writes anything. PIL's `verify()` reads the file without decoding the pixels (~40 us for a small
    PNG): it catches garbage, truncated PNGs and bad headers; pixel data cut short inside a JPEG is
    only found when decoded, by `open_image` in the training transform, which names the file too."""
    ds = _undecoded(ds, column, split).select_columns([column])
    for start, batch in enumerate(ds.iter(batch_size=256)):
        for offset, value in enumerate(batch[column]):
            index = start * 256 + offset
            if value is None:
                raise UserError(f"the {split} data has no image in row {index + 1}; drop that row")
            try:
                with PIL.Image.open(_image_source(value)) as image:
                    image.verify()
            except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError) as e:
                raise UserError(
                    f"cannot read image {_image_name(value, index)} in the {split} data: {e}; "
                    "remove or replace the file"
                ) from None


def image_sizes(ds: HFDataset, column: str, limit: int = 256) -> collections.Counter:
    """Width x height of the first `limit` images (headers only), counted."""
    sizes: collections.Counter = collections.Counter()
    for value in _undecoded(ds.select(range(min(limit, len(ds)))), column, "train")[column]:
        with PIL.Image.open(_image_source(value)) as image:  # the header: no pixels decoded
            sizes[image.size] += 1
    return sizes


def resize_notice(sizes: collections.Counter, processor) -> str | None:
    """One line when the image processor resizes the images, or None when they already fit."""
    size = getattr(processor, "size", None) or {}
    target = (size.get("width"), size.get("height"))
    if None in target or not sizes or set(sizes) == {target}:
        return None
    seen = ", ".join(f"{w}x{h}" for (w, h), _ in sizes.most_common(3)) + (", ..." if len(sizes) > 3 else "")
    return (
        f"note: the training images ({seen}) are resized to {target[0]}x{target[1]} by the image processor; "
        "for a model built from model_config, model_config.image_size sets the size it takes"
    )


def _to_8_bit(image: PIL.Image.Image) -> PIL.Image.Image:
    """16-bit images (PIL modes I;16*, and I, as some decoders give 16-bit PNGs) scaled to 8 bits.
    PIL's convert() to L or RGB clips every value above 255 instead: a 16-bit gradient came out 99.6%
    white. An I image whose values all fit in 8 bits is left as it is."""
    if not (image.mode.startswith("I;16") or image.mode == "I"):
        return image
    import numpy as np

    values = np.asarray(image).astype(np.int64)
    if image.mode == "I" and values.max(initial=0) <= 255:
        return image
    return PIL.Image.fromarray((values.clip(0, 65535) >> 8).astype(np.uint8))


class ImageTransform:
    """Images → `pixel_values` through the image processor; random horizontal flip in training.

    The transform decodes the images itself (the column is cast to `Image(decode=False)`), so that a
    file that fails to decode is named in the error. Every image is converted to the model's channel
    count first, so grayscale, palette and RGBA files mixed with RGB just work; images of any size,
    even smaller than a patch, are resized by the processor. The flip draws from Python's `random`,
    whose state Accelerate's checkpoints keep, so a resumed run flips the same images.
    """

    def __init__(self, processor, column: str, num_channels: int, train: bool):
        self.processor, self.column, self.train = processor, column, train
        self.mode = "RGB" if num_channels == 3 else "L"

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        images = []
        for value in batch[self.column]:
            image = value if isinstance(value, PIL.Image.Image) else open_image(value)
            image = _to_8_bit(image).convert(self.mode)
            if self.train and random.random() < 0.5:
                image = image.transpose(PIL.Image.Transpose.FLIP_LEFT_RIGHT)
            images.append(image)
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "labels": batch["labels"]}


def prepare_splits(args: DataArgs, raw: DatasetDict, preprocessor, num_channels: int = 3) -> DatasetDict:
    """Text: tokenized once. Images: the processor (and the training flip) run as a transform."""
    if args.task == "text-classification":
        columns, max_length = args.text_columns, args.max_length
        return DatasetDict({s: tokenize(d, preprocessor, columns, max_length) for s, d in raw.items()})
    column, out = args.image_column, DatasetDict()
    for split, ds in raw.items():
        ds = ds.remove_columns([c for c in ds.column_names if c not in (column, "labels")])
        ds = _undecoded(ds, column, split)
        flip = split == "train" and args.random_flip
        out[split] = ds.with_transform(ImageTransform(preprocessor, column, num_channels, train=flip))
    return out


class Collator:
    """Pads text batches dynamically (to a multiple of 8 for tensor cores); stacks image batches."""

    def __init__(self, tokenizer=None, pad_to_multiple_of: int | None = 8):
        self.tokenizer, self.pad_to_multiple_of = tokenizer, pad_to_multiple_of

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if "pixel_values" in features[0]:
            return {
                "pixel_values": torch.stack([torch.as_tensor(f["pixel_values"]) for f in features]),
                # class ids (int64), numbers or multi-hot vectors (float32)
                "labels": torch.tensor([f["labels"] for f in features]),
            }
        features = [{k: v for k, v in f.items() if k != "length"} for f in features]
        return self.tokenizer.pad(
            features, padding=True, pad_to_multiple_of=self.pad_to_multiple_of, return_tensors="pt"
        )


# --- order of an epoch -----------------------------------------------------------------------------


class EpochSampler(Sampler[int]):
    """The sample order of one epoch, reproducible from (seed, epoch) and startable mid-epoch.

    `reset(epoch, start)` selects the epoch's permutation and skips its first `start` samples, so a
    resumed run continues from the exact position without reading the skipped batches. With
    `lengths`, samples are grouped by length the way transformers' LengthGroupedSampler does
    (sorted inside random mega-batches) into groups of `group_size` — the samples of one optimizer
    step, so that any split of a step into processes and accumulation sees the same samples — and
    the groups are shuffled so that long and short steps alternate; the last, partial group stays
    last so that step boundaries are those of an ungrouped epoch. Every process computes the same
    order, and Accelerate's `BatchSamplerShard` deals its batches round-robin.

    With `pad_to` = processes x per-device batch (several processes) the stream is padded to a
    whole number of global batches with the epoch's FIRST samples, whatever `start` is. Accelerate would otherwise complete the last
    global batch itself, from the first samples it happened to see — after a resume, other samples
    than in the uninterrupted run. The padding is masked out of the loss either way, but its lengths
    set the padded shape of the batch and so the dropout masks drawn for the real samples.

    Deliberately no `set_epoch`: Accelerate's DataLoaderShard calls `set_epoch(iteration)` on the
    sampler at each iteration, which would fight the explicit position set here.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        group_size: int = 1,
        lengths: list[int] | None = None,
        megabatch_mult: int = 50,
        pad_to: int = 1,
    ):
        self.num_samples, self.seed, self.group_size = num_samples, seed, group_size
        self.lengths, self.megabatch_mult, self.pad_to = lengths, megabatch_mult, pad_to
        self.epoch, self.start = 0, 0

    def reset(self, epoch: int, start: int = 0) -> None:
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"start {start} outside the epoch of {self.num_samples} samples")
        self.epoch, self.start = epoch, start

    def order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(self.num_samples, generator=g).tolist()
        if self.lengths is None:
            return perm
        gb = self.group_size
        mega = gb * self.megabatch_mult
        grouped: list[int] = []
        for i in range(0, len(perm), mega):
            grouped += sorted(perm[i : i + mega], key=lambda j: -self.lengths[j])
        batches = [grouped[i : i + gb] for i in range(0, len(grouped), gb)]
        tail = [batches.pop()] if batches and len(batches[-1]) < gb else []
        shuffle = torch.randperm(len(batches), generator=g).tolist()
        return [j for b in [batches[i] for i in shuffle] + tail for j in b]

    def _padding(self) -> int:
        return -(self.num_samples - self.start) % self.pad_to

    def __iter__(self):
        order = self.order(self.epoch)
        return iter(order[self.start :] + order[: self._padding()])

    def __len__(self) -> int:
        return self.num_samples - self.start + self._padding()


def batches_per_process(num_samples: int, per_device_batch: int, num_processes: int) -> int:
    """Batches each process sees in an epoch: Accelerate completes the last global batch."""
    return math.ceil(num_samples / (per_device_batch * num_processes))


def real_sample_mask(
    num_samples: int,
    batch_index: int,
    per_device_batch: int,
    num_processes: int,
    process_index: int,
    batch_len: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Which rows of this process's `batch_index`-th batch are real, not Accelerate's padding.
    Built on `device` (a copy from the host to a GPU would wait for the GPU to finish its work).

    Accelerate's BatchSamplerShard cuts the epoch's stream into batches of `per_device_batch` and
    deals them round-robin; the last global batch is completed with padding samples (by
    `EpochSampler(pad_to=...)`, or else by Accelerate). Row j of this batch is stream position
    (batch_index * P + process_index) * B + j and is
    real when that position is below the number of samples in the stream.
    """
    first = (batch_index * num_processes + process_index) * per_device_batch
    return (torch.arange(batch_len, device=device) + first) < num_samples


def window_sample_count(
    num_samples: int,
    window: int,
    accumulation: int,
    num_batches: int,
    per_device_batch: int,
    num_processes: int,
) -> int:
    """Real samples, over all processes, in optimizer step `window` (its micro-batches)."""
    total = 0
    for k in range(window * accumulation, min((window + 1) * accumulation, num_batches)):
        first = k * num_processes * per_device_batch
        total += max(0, min(num_samples - first, num_processes * per_device_batch))
    return total
