"""Data files → datasets with encoded labels: the one loader of training and evaluation.

    raw = read_splits(cfg.data_args, said)                # the files as they are, each read once
    raw, labels = load_splits(cfg.data_args, said, raw)   # train (validation, test) as a run sees them; a Labels
    loaded = load_path(Path("reviews.tsv"), args)          # evaluate_checkpoint.py --data: a file or a folder

Files go through `datasets` (`load_dataset("csv" | "json" | "parquet")`, a .tsv as csv with tabs; CoNLL by
`read_conll`), one split at a time, so that an error names the file and each file's column types are its
own; a folder is an image folder (<dir>/<split>/<label>/<image>) or data files named by split; anything
else is a hub dataset. Each file is read once for its fingerprint (its sha256 and first MiB, which the
file rules read: finetune/checks/files.py) and once by the parser; a parse that fails is explained then.

Labels become ids `0..K-1` in the column `labels` by NAME (the order of `label_names`, else the sorted
names of train), whatever their type was; regression targets and multi-label sets become numbers and
multi-hot vectors (finetune/problems/). Without a validation split, a seeded share of train is held out,
stratified by class. What the data holds is checked by the rules of finetune/checks/ (columns, labels,
splits, images) at each step here; the task prepares the splits for the model afterwards.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import itertools
import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

from datasets import Dataset as HFDataset
from datasets import DatasetDict, IterableDataset, Value, load_dataset

from finetune import checks, formats
from finetune.checks import columns, files, images, splits
from finetune.checks import streams as stream_rules
from finetune.config import DataArgs
from finetune.digests import sha256_of
from finetune.errors import TrainingStopped, UserError
from finetune.formats import A_TAG, CONLLU_COLUMNS, CONLLU_UPOS, FILE_BUILDERS, builder_of, delimiter_of
from finetune.images import verify_images
from finetune.layout import RunDir
from finetune.problems import Labels, Problem, infer_problem_type, problem_of
from finetune.squad import flatten_squad, squad_dataset
from finetune.tasks import task_of

# --- reading files ---------------------------------------------------------------------------------


def read_file(split: str, path: str, conll_columns: tuple[str, str], digests: dict[str, str] | None = None) -> HFDataset:
    """One data file as a split: its path and bytes checked (`files.PATH`, `files.HEAD`), parsed, and a failed
    parse explained (`files.PARSE_FAILED`). `digests` collects the file's sha256 by its resolved path."""
    head = files.FileHead.read(split, path)
    if digests is not None:
        digests[str(Path(path).resolve())] = head.sha256
    checks.gate(files.HEAD, head)
    if head.builder == "conll":  # datasets has no builder for it
        return read_conll(path, split, *conll_columns)
    if head.squad_nested:  # SQuAD's own file: articles of paragraphs of questions, one row a question
        return read_squad(path)
    try:
        ds = _parse(head)
    except Exception as e:  # datasets raises many types for unreadable data
        _reraise_a_stop(e)
        ds = _huge_integers(head, e)
        if ds is None:
            found = checks.first(files.PARSED, head, None)  # a pandas layout that did not parse at all
            raise (checks.refusal(*found) if found else checks.explain(files.PARSE_FAILED, head, e)) from None
    checks.gate(files.PARSED, head, len(ds))
    return ds


def _parse(head: files.FileHead) -> HFDataset:
    kwargs: dict[str, Any] = {"sep": "\t"} if head.suffix == ".tsv" else {}
    if head.quotes_are_text:  # a quote is a character of the text there, not the start of a quoted field
        kwargs["quoting"] = csv.QUOTE_NONE
    if head.builder == "csv":  # only an empty cell is missing: a class named NA, None or null is a class
        kwargs.update(keep_default_na=False, na_values=[""])
    # datasets' builders log their own "Failed to load" line before raising: ours names the line
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    logging.getLogger("datasets.packaged_modules.csv.csv").setLevel(logging.CRITICAL)
    ds = load_dataset(head.builder, data_files={head.split: head.path}, **kwargs)[head.split]
    zeros = [c for c, f in ds.features.items() if c in head.zero_columns and isinstance(f, Value)
             and f.dtype.startswith(("int", "uint"))]  # fmt: skip
    if zeros:  # "007" and "7" would both be read as 7: such a column is read as the text it is
        features = ds.features.copy()
        features.update({c: Value("string") for c in zeros})
        ds = load_dataset(head.builder, data_files={head.split: head.path}, features=features, **kwargs)[head.split]
    return ds


def _huge_integers(head: files.FileHead, e: Exception) -> HFDataset | None:
    """A CSV with a whole number past 64 bits (an id, a class named 100000000000000000000), on which pandas
    fails (an OverflowError): read with those columns as the text they are; None for any other failure."""
    if head.builder != "csv" or "OverflowError" not in files.root_cause(e):
        return None
    huge = re.compile(r"\s*[-+]?\d{19,}\s*")
    found: set[str] = set()
    with open(head.path, encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f, delimiter=delimiter_of(head.path)):
            found.update(c for c, v in row.items() if isinstance(c, str) and isinstance(v, str) and huge.fullmatch(v)
                         and abs(int(v)) >= 2**63)  # fmt: skip
    if not found:
        return None
    import pandas as pd

    sep = {"sep": "\t"} if head.suffix == ".tsv" else {}
    frame = pd.read_csv(head.path, dtype=dict.fromkeys(sorted(found), str), keep_default_na=False, na_values=[""], **sep)
    return HFDataset.from_pandas(frame, preserve_index=False)


def _reraise_a_stop(e: BaseException) -> None:
    """A signal while datasets parses a file (SIGTERM raises TrainingStopped there) comes back wrapped in
    datasets' own error: it is a stop, not bad data."""
    stop = next((inner for inner in files.chain(e) if isinstance(inner, TrainingStopped)), None)
    if stop is not None:
        raise stop from None


def load_raw(
    data_files: dict[str, str],
    dataset_name: str | None,
    dataset_config_name: str | None,
    data_dir: str | None,
    require_train: bool = True,
    conll_columns: tuple[str, str] = ("tokens", "ner_tags"),
    said: checks.Said | None = None,
    digests: dict[str, str] | None = None,
) -> DatasetDict:
    """Load train (and validation/test when present) from files (by split), an image folder or the hub.

    Files are loaded one split at a time, so that an error names the file that caused it and a column's type
    is inferred per file (labels are matched by name across splits anyway). `digests` collects each file's
    sha256 by its resolved path (the fingerprint a resume and results.json keep)."""
    said = said if said is not None else checks.Said()
    for split, path in data_files.items():  # every path before any file is read
        checks.gate(files.PATH, split, path)
    if data_dir:
        checks.gate(files.DATA_DIR, data_dir, dataset_name)
    if data_files and dataset_name in (None, "csv", "json", "parquet"):
        raw = DatasetDict({split: read_file(split, path, conll_columns, digests) for split, path in data_files.items()})
    else:
        raw = _load_folder_or_hub(dataset_name, dataset_config_name, data_dir, said)
    for split in raw:  # parquet's exact decimals (a database's NUMERIC, pandas' Decimal) are numbers: floats
        for column, feature in raw[split].features.items():
            if isinstance(feature, Value) and feature.dtype.startswith("decimal"):
                raw[split] = raw[split].cast_column(column, Value("float64"))
    if require_train:
        checks.gate(files.TRAIN_SPLIT, list(raw), data_dir)
    return raw


def _a_run(folder: Path) -> bool:
    run = RunDir(folder)
    return run.is_run() or run.holds_run()


def _load_folder_or_hub(name: str | None, config_name: str | None, data_dir: str | None, said: checks.Said) -> DatasetDict:
    if data_dir:
        checks.gate(files.BUILDER_FOLDER, data_dir, name)  # dataset_name=json on a folder of CSVs
    if name not in (None, "imagefolder"):  # a builder on data_dir, or a local dataset folder: files joined by split
        check_split_files(data_dir if name in files.BUILDERS else str(Path(name, data_dir or "")))
    try:
        if name in (None, "imagefolder") and data_dir:
            checks.gate(images.FOLDER, Path(data_dir), _a_run, said=said)  # what the loader would leave out
            return load_dataset("imagefolder", data_dir=data_dir)
        return load_dataset(name, config_name, data_dir=data_dir)
    except UserError:  # the folder's own rules: their line as it is
        raise
    except Exception as e:  # datasets raises many types for unreadable data
        _reraise_a_stop(e)
        raise checks.explain(files.LOAD_FAILED, name, data_dir, e) from None


def split_files(folder: str) -> list[tuple[str, list[str]]]:
    """The data files datasets reads for each split of a folder (its own patterns: train/, train.csv, ...), as
    (split, files) for each builder's files, or none where it finds none (the loader then says so)."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        found = DataFilesDict.from_patterns(get_data_patterns(folder), base_path=folder)
    except Exception:  # no data file there (datasets' EmptyDatasetError), or a layout it does not know
        return []
    builder = {p: FILE_BUILDERS.get(Path(p).suffix.lower()) for paths in found.values() for p in paths}
    return [(str(split), [p for p in paths if builder[p] == b]) for split, paths in found.items()
            for b in sorted({builder[p] for p in paths if builder[p]})]  # fmt: skip


def file_columns(path: str) -> list[str] | None:
    """A data file's column names from its header alone: a CSV's or TSV's first line, a JSON Lines file's first
    record, a Parquet file's schema (no value read, no image decoded); None for other files or an unreadable one."""
    suffix = Path(path).suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
                return next(csv.reader(f, delimiter=delimiter_of(path)), None)
        if suffix == ".jsonl":
            with open(path, encoding="utf-8-sig", errors="replace") as f:
                record = json.loads(next((line for line in f if line.strip()), "null"))
            return list(record) if isinstance(record, dict) else None
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
    except (OSError, ValueError):  # unreadable, or not its format: the loader's own rules say what it is
        return None
    return None


def check_split_files(folder: str | None) -> None:
    """The files datasets joins into each split of a local folder have the same columns, by their headers
    (`files.SPLIT_FILES`): before it reads them, so that a stream's later file is not read under the first's."""
    if not folder or not Path(folder).is_dir():
        return
    for split, paths in split_files(str(folder)):
        columns = {p: names for p in paths if (names := file_columns(p)) is not None}
        checks.gate(files.SPLIT_FILES, split, columns)


def read_splits(args: DataArgs, said: checks.Said | None = None, digests: dict[str, str] | None = None) -> DatasetDict:
    """The run's splits as its files (or folder, or hub dataset) hold them; a streamed run's train as its
    first rows (`read_streamed`)."""
    if args.streaming:
        return read_streamed(args, said, digests)
    return load_raw(args.files, args.dataset_name, args.dataset_config_name, args.data_dir,
                    conll_columns=(args.tokens_column, args.tags_column), said=said, digests=digests)  # fmt: skip


# --- streams (streaming=true: finetune/streams.py reads the training stream as the run trains) ---------------

FIRST_PASS = 10_000  # a streamed train's first rows: what the checks, the label names and the baseline read


def open_stream(args: DataArgs, split: str = "train") -> IterableDataset:
    """One split as an iterable (`load_dataset(..., streaming=True)`): read as it is iterated, never whole;
    train's first max_train_samples only (`take`)."""
    path = args.files.get(split)
    if path:
        sep = {"sep": "\t"} if path.lower().endswith(".tsv") else {}
        ds = formats.typed_stream(load_dataset(builder_of(path), data_files={split: path}, split=split, streaming=True, **sep))
    else:
        ds = formats.typed_stream(load_dataset(args.dataset_name, args.dataset_config_name, split=split, streaming=True))
    return ds.take(args.max_train_samples) if split == "train" and args.max_train_samples is not None else ds


def _stream_rows(args: DataArgs, split: str):
    yield from open_stream(args, split)


@contextlib.contextmanager
def reading_the_stream(args: DataArgs):
    """Reading the training stream: a row its parser refuses, past those read, is one line (streams.UNREADABLE)."""
    try:
        yield
    except (MemoryError, UserError):  # not the data's fault, or said already
        raise
    except Exception as e:  # datasets' parsers raise many types (pyarrow's ArrowInvalid for a malformed JSON line)
        _reraise_a_stop(e)
        raise checks.explain(stream_rules.UNREADABLE, args.train_file, args.train_file or args.dataset_name, e) from None


def read_streamed(args: DataArgs, said: checks.Said | None, digests: dict[str, str] | None) -> DatasetDict:
    """A streamed run's splits: train's first `FIRST_PASS` rows (its file's bytes checked as any file's),
    validation and test whole (files as `load_raw` reads them; a hub's written to datasets' cache)."""
    if args.train_file:
        checks.gate(stream_rules.SPLITS, list(args.files), args.train_file)
        checks.gate(files.PATH, "train", args.train_file)  # as a loaded file's: not there, empty, a folder
        head = files.FileHead.read("train", args.train_file)
        if digests is not None:
            digests[str(Path(args.train_file).resolve())] = head.sha256
        checks.gate(files.HEAD, head)
        others = {s: p for s, p in args.files.items() if s != "train"}
        raw = load_raw(others, None, None, None, require_train=False, said=said, digests=digests)
    else:
        check_split_files(args.dataset_name)  # a local dataset folder: the files of each split alike
        names = list(load_dataset(args.dataset_name, args.dataset_config_name, streaming=True))
        checks.gate(stream_rules.SPLITS, names, args.dataset_name)
        raw = DatasetDict({s: HFDataset.from_generator(_stream_rows, gen_kwargs={"args": args, "split": s})
                           for s in ("validation", "test") if s in names})  # fmt: skip
    with reading_the_stream(args):
        stream = open_stream(args)
        raw["train"] = HFDataset.from_list(list(itertools.islice(stream, FIRST_PASS)), features=stream.features)
    checks.gate(stream_rules.NO_ROWS, args.train_file or args.dataset_name, len(raw["train"]))
    checks.gate(stream_rules.FIRST_ROWS, raw["train"], args.label_column, FIRST_PASS, args.train_file or args.dataset_name)
    return raw


def data_file_digests(args: DataArgs, known: dict[str, str] | None = None) -> dict[str, str]:
    """The sha256 of each data file of the run, by its resolved path (kept in results.json: an evaluation
    of the run's own split says when the file changed since the run); `known`: those the run read."""
    known = known or {}
    paths = dict.fromkeys(str(Path(f).resolve()) for f in (args.train_file, args.validation_file, args.test_file) if f)
    return {p: known.get(p) or sha256_of(p) for p in paths if Path(p).is_file()}


def train_data_fingerprint(args: DataArgs, known: dict[str, str] | None = None) -> dict[str, str] | None:
    """What a resume checks the training data against (finetune/checkpoint.py): the sha256 of the train
    file's bytes, or of an image folder's file list (each file's path and size, under train/ when there
    is one); None for hub data, which its name and revision say. A file edited in place between a save
    and its resume would otherwise go on training on other samples in the saved order."""
    if args.train_file and Path(args.train_file).is_file():
        return {"train_file": data_file_digests(args, known)[str(Path(args.train_file).resolve())]}
    if args.data_dir and args.dataset_name in (None, "imagefolder") and Path(args.data_dir).is_dir():
        root = Path(args.data_dir) / "train" if (Path(args.data_dir) / "train").is_dir() else Path(args.data_dir)
        listing = hashlib.sha256()
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            listing.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\n".encode())
        return {"data_dir": listing.hexdigest()}
    return None


# --- columns ---------------------------------------------------------------------------------------


def check_columns(ds: HFDataset, split: str, args: DataArgs, labelled: bool = True, model_task: bool = False,
                  train_columns: list[str] | None = None, said: checks.Said | None = None) -> None:  # fmt: skip
    """The label column(s) (unless the data is `labelled=False`: predictions only) and the task's input
    columns exist and hold what they should (checks/columns.py, checks/images.py). `model_task`: the task is
    a trained model's (evaluation), so data of another task is the wrong data, not a wrong `task`.
    `train_columns`: the train split's, for another split."""
    said = said if said is not None else checks.Said()
    subject = columns.Columns(ds, split, args, labelled, model_task, train_columns)
    try:
        checks.gate(columns.MISSING, subject)
        checks.gate(columns.VALUES, subject, said=said)
        if task_of(args.task).modality == "image":
            if split == "train" and args.data_dir and args.dataset_name in (None, "imagefolder"):
                checks.gate(images.CLASSES, args.data_dir)
            verify_images(ds, args.image_column, split, said)
        checks.gate(columns.LABELS, subject)
    except UnicodeDecodeError as e:  # a parquet file's strings: read only when a value is
        raise checks.explain(columns.NOT_UTF8, subject, e) from None
    checks.gate(columns.TRAINING, subject, said=said)


# --- the splits ------------------------------------------------------------------------------------


def _hold_out(train: HFDataset, args: DataArgs, problem: Problem, names: Labels, said: checks.Said) -> dict:
    """A seeded share of train held out for validation: stratified by class (one class a sample), a seeded
    random share for numbers, label sets and tags; split by row number (the same draw as splitting the data
    itself), so that each row's place in the file is known. Returns each part's rows of the training file
    (0-based)."""
    stratify = {"stratify_by_column": "labels"} if problem.classes else {}
    rows = train.select_columns(["labels"]).add_column("file_row", list(range(len(train))))
    try:
        parts = rows.train_test_split(test_size=args.validation_split_percentage / 100, seed=args.seed, **stratify)
    except ValueError as e:
        raise checks.explain(splits.NOT_STRATIFIED, splits.Stratify(e, names, Counter(train["labels"]),
                                                                    len(train), args)) from None  # fmt: skip
    file_rows = {"train": list(parts["train"]["file_row"]), "validation": list(parts["test"]["file_row"])}
    images_, cols = task_of(args.task).modality == "image", splits.compared_columns(train, args, task_of(args.task))
    if cols:
        source = "folder" if images_ and args.data_dir else "file"  # an image folder, or a file of image paths
        what = "image bytes" if images_ else " and ".join(cols)
        checks.gate(splits.HELD_OUT_REPEATS, splits.sample_rows(train, cols, images_), file_rows, what, source,
                    said=said)  # fmt: skip
    checks.gate(splits.HELD_OUT, args.validation_split_percentage, len(parts["test"]), len(rows), len(parts["train"]),
                said=said)  # fmt: skip
    return file_rows


def load_splits(args: DataArgs, said: checks.Said | None = None,
                raw: DatasetDict | None = None) -> tuple[DatasetDict, Labels]:  # fmt: skip
    """Raw splits with encoded `labels` (class ids; numbers or multi-hot vectors, finetune/problems/);
    a seeded validation split (stratified by class) when there is none. `raw`: the splits `read_splits`
    read (read here when not given)."""
    said = said if said is not None else checks.Said()
    raw = raw if raw is not None else read_splits(args, said)
    for split in raw:
        check_columns(raw[split], split, args, train_columns=None if split == "train" else raw["train"].column_names,
                      said=said)  # fmt: skip
    paths = {s: Path(f).resolve() for s, f in args.files.items() if f}
    checks.gate(splits.FILES, args, paths, said=said)
    problem = problem_of(infer_problem_type(raw["train"], args, said))  # finetune/problems/
    samples = splits.Samples.of(raw, args, task_of(args.task), paths, problem.classes)
    if samples is not None:
        checks.gate(splits.SHARED, samples, said=said)
    raw = problem.read_ids_as_names(raw, args, said)
    names = problem.labels_in(raw["train"], args, said)
    raw = DatasetDict({s: problem.encode(d, args, names, s, said) for s, d in raw.items()})
    problem.check_encoded(raw, said)
    file_rows = _hold_out(raw["train"], args, problem, names, said) if "validation" not in raw else {}
    problem.check_trained(raw["train"], names, args, said)  # once the split held
    if file_rows:  # the held-out split, drawn above
        raw["train"], raw["validation"] = raw["train"].select(file_rows["train"]), raw["train"].select(file_rows["validation"])
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples),
                         ("test", args.max_test_samples)):  # fmt: skip
        if limit is not None and split in raw and len(raw[split]) > limit:
            raw[split] = raw[split].select(range(limit))
    problem.check_splits(raw, names, args, said)
    for split, rows_of in file_rows.items():  # read by the tag rules (a tag's row in the training file)
        raw[split].file_rows = rows_of[: len(raw[split])]
    for split, ds in raw.items():
        problem.check_read(ds, split, said)
    return raw, names


def prepare_splits(args: DataArgs, raw: DatasetDict, preprocessor, num_channels: int = 3,
                   said: checks.Said | None = None) -> DatasetDict:  # fmt: skip
    """Every split as the model reads it (the task's preparation; training augmentation on "train")."""
    task, said = task_of(args.task), said if said is not None else checks.Said()
    return DatasetDict({s: task.prepare(d, preprocessor, args, s, num_channels, said) for s, d in raw.items()})


def load_path(path: Path, args: DataArgs, said: checks.Said | None = None,
              digests: dict[str, str] | None = None) -> DatasetDict:  # fmt: skip
    """What `--data` names: a file (one split, "data"), a folder of data files named by split
    (train.csv, test.jsonl, ...), or an image folder (<dir>/<split>/<label>/<image>)."""
    conll = (args.tokens_column, args.tags_column)
    checks.gate(images.ONE_IMAGE, path)
    if path.is_file():
        return load_raw({"data": str(path)}, None, None, None, False, conll, said, digests)
    named = {re.sub(r"\W", "_", p.stem): str(p)  # datasets' split names are words
             for p in sorted(path.iterdir()) if p.is_file() and p.suffix.lower() in FILE_BUILDERS}  # fmt: skip
    if named:
        return load_raw(named, None, None, None, False, conll, said, digests)
    checks.gate(files.DATA_FOLDER, path, not args.task or task_of(args.task).modality == "image")
    raw = load_raw({}, None, None, str(path), require_train=False, said=said)
    return DatasetDict({split: _labelled_by_its_folder(ds, args) for split, ds in raw.items()})


def _labelled_by_its_folder(ds: HFDataset, args: DataArgs) -> HFDataset:
    """An image folder whose images are all in one folder named as a label of the model (<data>/dog/*.jpg: how
    does it do on dogs?), labelled by it: datasets labels images by their folders only when there are two or
    more, and would leave these to be predicted, unscored. Any other one folder (batch1/) stays unlabelled."""
    from datasets import Image  # the image column's cells undecoded: their paths

    column = args.image_column
    given = Labels.given(args)
    if args.label_column in ds.column_names or column not in ds.column_names or not given:
        return ds
    folders = {Path(v["path"]).parent for v in ds.cast_column(column, Image(decode=False))[column] if v and v.get("path")}
    name = folders.pop().name if len(folders) == 1 else None
    return ds.add_column(args.label_column, [name] * len(ds)) if name in map(str, given) else ds


# --- CoNLL -----------------------------------------------------------------------------------------


def read_squad(path: str) -> HFDataset:
    """A SQuAD v1.1/v2.0 file (`{"version", "data": [...]}`) as the Hub's squad rows (finetune/squad.py):
    id, title, context, question, answers {text, answer_start}; v2's unanswerable questions have none."""
    with open(path, encoding="utf-8-sig") as f:
        try:
            rows = flatten_squad(json.load(f))
        except (KeyError, TypeError, AttributeError) as e:
            raise checks.explain(files.SQUAD_FILE, path, e) from None
    return squad_dataset(rows)


def read_conll(path: str, split: str, tokens_column: str, tags_column: str) -> HFDataset:
    """A CoNLL/IOB2 text file as sentences: {tokens_column: [words], tags_column: [tags]}.

    One token per line (tab- or space-separated columns), a blank line between sentences, `#` comments
    and `-DOCSTART-` lines skipped (a line `# O` is the word # and its tag). The word is the first column, or
    the second when the first is a running index (UD and UNER files); the tag is the last column of the first
    token line that reads as a tag (O, or B-/I-/E-/S- and a type: CoNLL-2003's chunk tags stand before its NER
    tags), else the last column; in a CoNLL-U file (ten columns, an index first) with no such column, UPOS,
    the fourth, and its multiword-token ranges (1-2) and empty nodes (8.1) are skipped. A file of one column
    is words without tags (data to predict: no tags column). Read by hand: datasets has no CoNLL builder (its
    hub scripts are gone); what the file gets wrong is checked by checks/files.py's CONLL_* rules."""
    sentences, words, tags, columns_, tag_at, first = [], [], [], None, -1, None
    with open(path, encoding="utf-8-sig") as f:  # a BOM (a Windows editor's) is not part of the first line
        for number, line in enumerate(f, 1):
            text = line.rstrip("\r\n")
            if not text.strip():
                if words:
                    sentences.append((words, tags))
                    words, tags = [], []
                continue
            fields = text.split("\t") if "\t" in text else text.split()
            # `# O`, `#foodie O`: a word and its tag, not a comment (`# text = ...`, `# sent_id = 3` have no tag there)
            hash_word = fields[0].startswith("#") and len(fields) == (columns_ or 2) and bool(
                A_TAG.fullmatch(fields[tag_at if columns_ else -1]))
            if (text.startswith("#") and not text.startswith("#\t") and not hash_word) or fields[0] == "-DOCSTART-":
                continue
            if len(fields) == CONLLU_COLUMNS and re.fullmatch(r"\d+[-.]\d+", fields[0]):
                continue  # CoNLL-U: a multiword token's range (1-2 don't) or an empty node (8.1), not a word
            if columns_ is None:
                checks.gate(files.CONLL_FIRST_LINE, split, path, number, fields)
                columns_ = len(fields)
                looks = [i for i, f in enumerate(fields) if i and A_TAG.fullmatch(f)]
                tag_at = looks[-1] if looks else -1
                if not looks and columns_ == CONLLU_COLUMNS and fields[0].isdigit():
                    tag_at = CONLLU_UPOS  # a CoNLL-U file (UD): its universal part-of-speech column
            if len(fields) != columns_ or (columns_ < 2 and Path(path).suffix.lower() == ".txt"):
                raise checks.explain(files.CONLL_LINE, split, path, number, text, fields, columns_)
            if first is None:
                first = (number, fields)
            words.append(fields[1] if columns_ > 2 and fields[0].isdigit() else fields[0])
            tags.append(fields[tag_at] if columns_ > 1 else None)
    if words:
        sentences.append((words, tags))
    checks.gate(files.CONLL_READ, split, path, sentences, first)
    if columns_ == 1:  # words alone, one a line: sentences to tag (evaluation predicts them; training needs tags)
        return HFDataset.from_dict({tokens_column: [w for w, _ in sentences]})
    return HFDataset.from_dict({tokens_column: [w for w, _ in sentences], tags_column: [t for _, t in sentences]})
