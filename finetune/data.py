"""Data files → datasets with encoded labels: the one loader of training and evaluation.

    raw, label_names = load_splits(cfg.data_args)        # train (validation, test) as a run sees them
    loaded = load_path("reviews.tsv")                     # evaluate_checkpoint.py --data: a file or a folder

Files go through `datasets` (`load_dataset("csv" | "json" | "parquet")`, a .tsv as csv with tabs),
one split at a time, so that an error names the file and each file's column types are its own; a
folder is an image folder (<dir>/<split>/<label>/<image>) or data files named by split; anything else
is a hub dataset. What does not parse is diagnosed with its line where we can tell.

Labels become ids `0..K-1` in the column `labels` by NAME (the order of `label_names`, else the
sorted names of train), whatever their type was; regression targets and multi-label sets become
numbers and multi-hot vectors (finetune/problems.py). Without a validation split, a seeded share of
train is held out, stratified by class. The task (finetune/tasks.py) checks its input columns; it
prepares the splits for the model afterwards.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import re
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import ClassLabel, DatasetDict, Image, Value, load_dataset
from datasets import Dataset as HFDataset

from finetune.config import DataArgs
from finetune.errors import TrainingStopped, UserError, first_line, warn
from finetune.problems import (
    LOOK_ALIKE,
    MULTI,
    REGRESSION,
    SINGLE,
    TOKENS,
    case_twins,
    encode,
    infer_problem_type,
    label_names_for,
    look_alike,
    number_as_written,
    punctuation_twins,
)
from finetune.tasks import (
    TASKS,
    character_span,
    plain_tags,
    shown,
    spans_error,
    tag_problem,
    task_for_data,
    task_of,
    token_record,
)

# The csv module's checks of a file (a repeated header, leading zeros) read every cell; its default limit of
# 131,072 characters a cell would fail on a long document that pandas (datasets' reader) reads.
csv.field_size_limit(2**31 - 1)

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".tsv": "csv",
                 ".conll": "conll", ".conllu": "conll", ".iob2": "conll", ".iob": "conll", ".bio": "conll",
                 ".txt": "conll"}  # fmt: skip
KINDS = ".csv, .tsv, .json, .jsonl, .parquet, or CoNLL (.conll, .conllu, .iob2, .txt)"


# --- loading ---------------------------------------------------------------------------------------


# The first bytes of compressed files: datasets would read them as text and fail on their bytes.
COMPRESSED = {"gzip": b"\x1f\x8b", "zip": b"PK\x03\x04", "bzip2": b"BZh", "xz": b"\xfd7zXZ", "zstd": b"\x28\xb5\x2f\xfd"}


# What looks like an IOB/IOBES tag (O, B-PER, E-LOC): to find a file's tag column, or its words read as tags.
A_TAG = re.compile(r"O|[BIES]-\S+")

# A .csv whose header has no comma but one of these: how it looks, and what this app reads instead.
_SAVE = "comma-separated .csv or tab-separated .tsv: save it with one of those"
OTHER_SEPARATORS = {
    "\t": ("tab-separated", "a .csv as comma-separated: rename it to .tsv"),
    "|": ("separated by |", _SAVE),
    ";": ("semicolon-separated", _SAVE),
}


def _the(split: str) -> str:
    """How a message names a split: "the train data"; a file read on its own (evaluation's --data) is "the data"."""
    return "the data" if split == "data" else f"the {split} data"


def _builder_for(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise UserError(f"{path}: unsupported file type '{suffix}'; use {KINDS}")
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


def _cache_failure(e: BaseException) -> str | None:
    """datasets writes every file it reads into its cache (HF_DATASETS_CACHE, under HF_HOME) first: a full,
    read-only or unusable cache is said as such, not as a file that is not valid csv."""
    import errno

    from datasets import config

    cache = str(config.HF_DATASETS_CACHE)
    for err in _chain(e):
        full = "Not enough disk space" in str(err) or getattr(err, "errno", None) == errno.ENOSPC
        named = str(getattr(err, "filename", None) or "")
        # in the cache, or a folder on its way (HOME or HF_HOME a file: ~/.cache cannot be made)
        inside = named and (named.startswith(cache) or cache.startswith(named.rstrip("/") + "/"))
        if full or (isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.EEXIST, errno.ENOTDIR,
                                                               errno.ENOENT)  # under /proc: cannot be made
                    and inside):  # fmt: skip
            blocking = next((p for p in (Path(cache), *Path(cache).parents) if p.is_file()), None)
            why = ("is full" if full else f"cannot be made: {blocking} is a file, not a folder" if blocking else
                   f"cannot be written ({first_line(err)})")  # fmt: skip
            fix = "free space there, or set HF_DATASETS_CACHE to a folder with room" if full else (
                "set HF_DATASETS_CACHE to a writable folder")
            return f"the datasets cache it is copied into first ({cache}) {why}; {fix}"
    return None


def _diagnose_file(split: str, path: str) -> str | None:
    """Why a data file does not parse, with a line number, when we can tell; None otherwise.

    Only called after `datasets` failed, so a good file is never read twice."""
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".tsv"):
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f, delimiter="\t" if suffix == ".tsv" else ",")
            header = next(rows, [])
            start = rows.line_num + 1
            for row in rows:
                if row and len(row) != len(header) and any("\n" in field for field in row):
                    return (f"{split} file {path} line {start} opens a quote that no quote closes: the field runs on "
                            f"to line {rows.line_num}; close the quote, or remove it")
                start = rows.line_num + 1
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
        comment = next(((n, t.strip()) for n, t in lines if t.lstrip().startswith(("//", "/*", "#"))), None)
        if comment is not None:  # JSON5's or a hand-edited file's: JSON has no comments
            return (f"{split} file {path} line {comment[0]} is a comment ({shown(comment[1][:40])}), which JSON does "
                    "not allow: remove the comment lines")
        for i, (number, text_line) in enumerate(lines):
            try:
                value = json.loads(text_line, object_pairs_hook=_no_repeated_key)
                if not isinstance(value, dict) and len(lines) > 1:  # valid JSON, but no record: "extra data" blamed line 2
                    kind = {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number or null")
                    return (f"{split} file {path} line {number} holds {kind}, not a record: each "
                            "line of JSON Lines is one object ({\"text\": ..., \"label\": ...}); fix or remove that line")
            except _RepeatedKey as e:  # pyarrow refuses what Python's json reads (the last one wins)
                return f"{split} file {path} line {number} has the key {e.args[0]!r} twice; keep one of them"
            except json.JSONDecodeError as e:
                if i > 0:  # JSON Lines whose earlier lines parse: this line is the broken one
                    line, column, msg = number, e.colno, e.msg
                break
        one_document = len(lines) < 2 or text.lstrip().startswith(("[", "{\n"))  # removing the line removes it all
        commas = [t for _, t in lines if t.rstrip().endswith("},")]
        if not one_document and len(commas) * 2 >= len(lines):  # records written as a JSON array's, one a line
            return (f"{split} file {path} is not valid JSON Lines: its lines end with a comma after each record "
                    "('},'); JSON Lines has one object a line with nothing between them: remove the commas")
        return (
            f"{split} file {path} is not valid JSON or JSON Lines: line {line} column {column}: "
            f"{msg.removesuffix(' at').lower()}; " + ("fix the file there (cut off or mistyped?)" if one_document
                                                      else "fix or remove that line")
        )
    return None


def _no_label_mark(names: list[str], counts: Counter) -> str:
    """A class that is a data set's mark for "no label", said as "'-1' (40 of 400 samples) beside the classes
    0, 1: ..."; "" when none: -1 beside the class ids 0, 1, ... on at most 15% of the samples (the Hub's
    ClassLabel value for a missing label), or '-' beside other classes (SNLI's "no gold label")."""
    of = {names[i]: c for i, c in counts.items()}
    total = sum(of.values())
    others = [n for n in names if n not in ("-1", "-", "?", *EMPTY_CELL)]
    ids = all(re.fullmatch(r"\d+", n) for n in others)
    for mark, why in (("-1", "the Hub's value for a sample without a label"), ("-", "SNLI's mark for no gold label"),
                      ("?", "the UCI repository's (and Kaggle's) mark for a missing value")):
        if mark in of and len(others) >= 2 and (mark != "-1" or (ids and of[mark] <= 0.15 * total)):
            return (f"{mark!r} ({of[mark]} of {total} samples) beside the classes {', '.join(others[:5])}: {why}, "
                    "trained as a class of its own")
    for mark in (n for n in names if n in EMPTY_CELL and others):
        return (f"{mark!r} ({of.get(mark, 0)} of {total} samples) beside the classes {', '.join(others[:5])}: an empty "
                "cell written as text (pandas' astype(str), a spreadsheet's #N/A), trained as a class of its own")
    return ""


# An empty cell written out as text: pandas' astype(str) of NaN or pd.NA, a database's NULL, Excel's #N/A.
EMPTY_CELL = ("nan", "NaN", "NAN", "<NA>", "null", "NULL", "N/A", "n/a", "#N/A")


def _misspelt_class(names: list[str], counts: Counter, named) -> str:
    """A rare class whose name is one slip away from a common one ('positve' once beside 'positive' 180
    times: at most 2 samples, the other 10 or more and 10 times as many, a similarity of 0.8 or more),
    said as "'positve' (1 sample) beside 'positive' (180): a misspelling?"; "" when none, or when
    label_names lists both."""
    import difflib

    named, of = set(named or ()), {names[i]: c for i, c in counts.items()}
    common = [n for n, c in of.items() if c >= 10]
    for rare, count in sorted(((n, c) for n, c in of.items() if c <= 2), key=lambda x: x[1]):
        near = difflib.get_close_matches(rare, [n for n in common if of[n] >= 10 * count], n=1, cutoff=0.8)
        if near and not {rare, near[0]} <= named:
            return (f"{rare!r} ({count} sample{'s' if count > 1 else ''}) beside {near[0]!r} ({of[near[0]]}): a "
                    "misspelling?")
    return ""


TRUE_WORDS, FALSE_WORDS = ("true", "yes", "y", "t", "on"), ("false", "no", "n", "f", "off")


def _what_the_labels_look_like(names: list[str]) -> str:
    """Why a single-label column may have as many classes as a split cannot hold: numbers written with
    separators or units (1,000  3,5  50%), label sets joined in one cell (art,film  art;film), one number
    or one answer written two ways (01 and 1; no, yes, False, True), ids beside names (0, 1, neg, pos)."""
    sets = [n for n in names if re.fullmatch(r"[^,;|]+([,;|] ?[^,;|]+)+", n) and not re.search(r"\d[,]\d", n)]
    # 1,000  3,5  0.25  50%  $5  3.2 stars: not the class ids 0, 1, 2, nor the ranks 1st, 2nd
    numbers = [n for n in names if number_as_written(n) and not re.fullmatch(r"\s*[-+]?\d+\s*", n)]
    if len(numbers) > len(names) // 2:
        return (f"{len(names)} classes such as {numbers[0]!r}: numbers, not classes? for a regression "
                "write them plainly, without units, 1000 or 0.5, and set problem_type=regression")
    if sets:
        return (f"{len(names)} classes such as {sets[0]!r}: several labels in one cell? for multi-label give lists "
                "(JSON Lines) or 0/1 columns (label_columns)")
    values: dict[float, list[str]] = {}  # 01 and 1, 1.0 and 1: one number, two classes
    for n in names:
        if re.fullmatch(r"\s*[-+]?\d+(\.\d+)?\s*", n):
            values.setdefault(float(n), []).append(n)
    twins = next((ns for ns in values.values() if len(ns) > 1), None)
    if twins:
        return (f"{len(names)} classes such as {twins[0]!r} and {twins[1]!r}: the same number written two ways? "
                "write each label one way")
    truth = {n: n.strip().lower() in TRUE_WORDS for n in names if n.strip().lower() in (*TRUE_WORDS, *FALSE_WORDS)}
    if len(truth) == len(names) > 2:  # no, yes, False, True: two answers written two ways?
        falses, trues = [n for n in names if not truth[n]], [n for n in names if truth[n]]
        a, b = falses[:2] if len(falses) > 1 else trues[:2]
        return (f"{len(names)} classes such as {a!r} and {b!r}: yes/no written in more than one way? write each "
                "label one way")
    ids = [n for n in names if re.fullmatch(r"\s*-?\d+\s*", n)]
    words = [n for n in names if n not in ids]
    if len(ids) >= 2 and len(words) >= 2:  # 0, 1, neg, pos: one set of classes written two ways?
        return (f"{len(names)} classes such as {ids[0]!r} and {words[0]!r}: ids and names of the same classes? "
                "write each label one way")
    folded = sorted({n.strip().casefold(): n for n in words}.items())
    short = [(a, b) for (fa, a), (fb, b) in zip(folded, folded[1:], strict=False)
             if len(fa) >= 3 and fb.startswith(fa) and fb[len(fa):].isalpha()]  # neg/negative, not doc1/doc10
    if len(short) >= 2:  # neg, negative, pos, positive: each class written short and long?
        (a, b), (c, d) = short[:2]
        return (f"{len(names)} classes such as {a!r} and {b!r}, {c!r} and {d!r}: each class written short and in "
                "full? write each label one way")
    return ""


def _huge_integer_columns(path: str, sep: str) -> list[str]:
    """The columns of a CSV with a whole number past 64 bits (an id, a class named 100000000000000000000):
    no integer column holds it, and pandas fails on it (an OverflowError)."""
    huge = re.compile(r"\s*[-+]?\d{19,}\s*")
    found: set[str] = set()
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        for row in csv.DictReader(f, delimiter=sep):
            found.update(c for c, v in row.items() if isinstance(c, str) and isinstance(v, str) and huge.fullmatch(v)
                         and abs(int(v)) >= 2**63)  # fmt: skip
    return sorted(found)


def _leading_zero_columns(ds: HFDataset, path: str, sep: str) -> list[str]:
    """The integer columns of a CSV in which a value is written with a leading zero (007, 0123): read as
    numbers, 007 and 7 become one label (and a zip code loses its zero)."""
    ints = [c for c, f in ds.features.items() if isinstance(f, Value) and f.dtype.startswith(("int", "uint"))]
    if not ints:
        return []
    zero = re.compile(r"\s*[+-]?0\d+\s*")
    found: set[str] = set()
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter=sep):
            found.update(c for c in ints if c not in found and zero.fullmatch(row.get(c) or ""))
            if len(found) == len(ints):
                break
    return sorted(found)


class _RepeatedKey(ValueError):
    pass


def _no_repeated_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is not None:
        raise _RepeatedKey(repeated)
    return dict(pairs)


def _not_a_file(path: Path) -> str:
    """Why a path the user gave as a data file is none, in their words."""
    if path.is_symlink() and not path.exists():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python reports a symlink loop this way
            return "is a symlink loop; point it at the data file"
        except OSError:
            pass
        return f"is a symlink to {os.readlink(path)}, which does not exist"
    if path.is_dir():
        return "is a folder, not a file; give a data file (an image folder goes in data_dir)"
    if path.exists():  # /dev/null, a pipe, a socket
        return "is not a regular file (a device, pipe or socket); give a data file"
    return "not found"


def _check_utf8(split: str, path: str) -> None:
    """A text data file must be UTF-8: datasets reads other bytes into its tables and fails only when a
    value is read, deep in training's preparation. Decoded in chunks of 1 MiB (about a millisecond each)."""
    import codecs

    decoder, line, offset = codecs.getincrementaldecoder("utf-8")(), 1, 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                bad = offset + e.start
                line += chunk[: e.start].count(b"\n")
                raise UserError(
                    f"{split} file {path} is not UTF-8 text (line {line}, byte {bad}); save it as UTF-8"
                ) from None
            line += chunk.count(b"\n")
            offset += len(chunk)


def _one_line(path: str) -> bool:
    """A file of one line (a JSON document saved as .jsonl)."""
    with open(path, "rb") as f:
        f.readline()
        return not f.read(4096).strip()


def _pandas_layout(path: str) -> str | None:
    """The orient of a pandas `to_json` file that is not records: 'split' ({"columns", "index", "data"}),
    'table' ({"schema", "data"}),
    'columns' (the default: {column: {row index: value}}), 'index' ({row index: {column: value}}) or
    'values' (lists of lists); None for records or anything else."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None  # not one JSON document (JSON Lines, or damaged): datasets says what it finds

    def numbered(keys) -> bool:
        return bool(keys) and all(re.fullmatch(r"\d+", str(k)) for k in keys)

    if isinstance(data, dict) and data:
        if {"columns", "data"} <= set(data) and set(data) <= {"columns", "index", "data", "index_names", "column_names"}:
            return "split"
        if set(data) == {"schema", "data"} and isinstance(data["schema"], dict) and "fields" in data["schema"]:
            return "table"
        values = list(data.values())
        if all(isinstance(v, dict) for v in values):
            if numbered(data) and not all(numbered(v) for v in values):
                return "index"
            if all(numbered(v) for v in values):
                return "columns"
    if isinstance(data, list) and data and all(isinstance(r, list) for r in data[:100]):
        return "values"
    return None


def _a_workbook(path: str, magic: bytes) -> bool:
    """An .xlsx/.ods (a zip holding the sheets) or an old .xls (an OLE2 compound file)."""
    import zipfile

    if magic.startswith(b"\xd0\xcf\x11\xe0"):
        return True
    if not magic.startswith(COMPRESSED["zip"]):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    workbook = Path(path).suffix.lower() in (".xlsx", ".xlsm", ".ods", ".numbers")  # by its name, whatever it holds
    return workbook or any(n.startswith("xl/") for n in names) or "content.xml" in names and "mimetype" in names


def _check_readable_and_separated(split: str, path: str) -> None:
    """Before `datasets` reads the file: that it may be read, and that a .csv is comma-separated. A file
    separated by semicolons (a spreadsheet's export in many locales) reads as one column, or as rows of
    the wrong length: say what it is instead."""
    if not os.access(path, os.R_OK):
        raise UserError(f"{split} file {path} is not readable (permission denied); check its permissions")
    with open(path, "rb") as f:
        magic = f.read(6)
    packed = next((name for name, head in COMPRESSED.items() if magic.startswith(head)), None)
    if _a_workbook(path, magic):
        raise UserError(f"{split} file {path} is a spreadsheet workbook (Excel, LibreOffice), not a data file; save "
                        "the sheet as CSV (UTF-8) and give that file")  # fmt: skip
    if packed is not None:
        raise UserError(f"{split} file {path} is compressed ({packed}); unpack it and give the file inside ({KINDS})")
    if magic.startswith(b"PAR1") and Path(path).suffix.lower() != ".parquet":  # the file type is read from its name
        raise UserError(f"{split} file {path} is a parquet file; name it {Path(path).stem}.parquet")
    if Path(path).suffix.lower() != ".parquet":
        _check_utf8(split, path)
    suffix = Path(path).suffix.lower()
    if (suffix == ".json" or suffix == ".jsonl" and _one_line(path)) and os.path.getsize(path) < 256 * 2**20:
        layout = _pandas_layout(path)
        if layout is not None:
            raise UserError(
                f"{split} file {path} is a pandas DataFrame.to_json layout (orient='{layout}'), not one record per "
                "sample; save it with df.to_json(path, orient='records', lines=True) as a .jsonl file"
            )
    if suffix not in (".csv", ".tsv"):
        return
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        header = f.readline().strip()
        f.seek(0)
        # CoNLL's first word line, past comments (CoNLL-U's "# sent_id = 1"), -DOCSTART- and blank lines
        word_line = next((line.strip() for line in itertools.islice(f, 50) if line.strip()
                          and not line.lstrip("\ufeff").startswith(("#", "-DOCSTART-"))), "")  # fmt: skip
        f.seek(0)
        names = next(csv.reader(f, delimiter="\t" if suffix == ".tsv" else ","), [])
    if re.fullmatch(r"\ufeff?sep=.?", header, re.I):  # Excel's hint line, above the header
        raise UserError(f"{split} file {path} starts with the line {header!r}, a hint for Excel, not the header; "
                        "delete that line (the header is the line after it)")
    sep = "\t" if suffix == ".tsv" else ","
    fields, columns = word_line.split(), word_line.split("\t")
    conllu = len(columns) == 10 and re.fullmatch(r"\d+([-.]\d+)?", columns[0]) and re.fullmatch(r"\d+|_", columns[6])
    if conllu or (2 <= len(fields) <= 4 and A_TAG.fullmatch(fields[-1]) and "," not in word_line):  # "Ada B-PER"
        which = "first line" if word_line == header.lstrip("\ufeff") else "first line of words"
        raise UserError(f"{split} file {path} reads as a word and its tag on each line (its {which} is "
                        f"{word_line[:80]!r}): a CoNLL file; name it {Path(path).stem}.conll")  # fmt: skip
    if header.lstrip("\ufeff").startswith("#") and sep not in header:  # a comment above the header, read as one
        raise UserError(f"{split} file {path} starts with the line {header[:60]!r}, a comment, where the header "
                        "belongs; delete the comment lines above the header")
    separator = next((sep for sep in OTHER_SEPARATORS if sep in header), None)
    if suffix == ".csv" and separator is not None and "," not in header:
        looks, fix = OTHER_SEPARATORS[separator]
        raise UserError(f"{split} file {path} looks {looks} (its header is {header[:80]!r}); this app reads {fix}")
    if suffix == ".tsv" and "\t" not in header and "," in header:  # text,label in a file named .tsv
        raise UserError(f"{split} file {path} looks comma-separated (its header is {header[:80]!r}), but a .tsv file "
                        f"is read as tab-separated; name it {Path(path).stem}.csv")
    # datasets renames a repeated column (label, label.1) and reads the first: say so instead
    repeated = next((n for i, n in enumerate(names) if n and n in names[:i]), None)
    if repeated is not None:
        raise UserError(
            f"{split} file {path} has the column {repeated!r} twice in its header; rename or remove one "
            "of them (only the first would be read)"
        )


def load_raw(
    files: dict[str, str],
    dataset_name: str | None,
    dataset_config_name: str | None,
    data_dir: str | None,
    require_train: bool = True,
    conll_columns: tuple[str, str] = ("tokens", "ner_tags"),
) -> DatasetDict:
    """Load train (and validation/test when present) from files (by split), an image folder or the hub.

    Files are loaded one split at a time, so that an error names the file that caused it and a
    column's type is inferred per file (labels are matched by name across splits anyway)."""
    for split, path in files.items():
        if re.match(r"(https?|s3|gs|hf)://", str(path)):  # read as a local path, "not found" would mislead
            raise UserError(f"{split} file {path} is a URL; files are read from this machine: download it first and "
                            "give its path (or dataset_name= for a data set on the Hugging Face hub)")  # fmt: skip
        if not Path(path).is_file():
            why = _not_a_file(Path(path))
            parts = [p.strip() for p in str(path).split(",")]
            if why == "not found" and len(parts) > 1 and all(Path(p).is_file() for p in parts):  # HF's data_files habit
                raise UserError(f"{split} file {path} names {len(parts)} files; a split is one file: join them into "
                                "one (the same columns)")  # fmt: skip
            if why == "not found" and any(c in str(path) for c in "*?["):  # a glob the shell did not expand
                raise UserError(f"{split} file {path} is a pattern; a split is one file: give its path (join the "
                                "matching files into one first)")  # fmt: skip
            relative = "" if Path(path).expanduser().is_absolute() else f" (read from the current folder, {Path.cwd()})"
            posix = str(path).replace("\\", "/")
            if why == "not found" and "\\" in str(path) and os.sep == "/":  # C:\data\train.csv, data\train.csv
                relative += ("; it is a Windows path (a drive letter): give the file's path on this machine, with '/' "
                             "between folders" if re.match(r"[A-Za-z]:/", posix) else "; it is written with "
                             f"backslashes, as on Windows: here folders are separated by '/' ({posix})")  # fmt: skip
            raise UserError(f"{split} file not found: {path}{relative}" if why == "not found"
                            else f"{split} file {path} {why}")
        if Path(path).stat().st_size == 0:
            raise UserError(f"{split} file is empty: {path} (0 bytes); save it with its samples, or name another file")
        _check_readable_and_separated(split, path)
    if data_dir and not Path(data_dir).is_dir() and dataset_name in (None, "imagefolder"):
        if zipfile.is_zipfile(data_dir):
            raise UserError(f"data_dir {data_dir} is a zip file; unzip it and give the folder it holds")
        if Path(data_dir).is_file():
            raise UserError(f"data_dir {data_dir} is a file, not a folder of images (<class>/<image>); a file of "
                            "samples is given as train_file=")  # fmt: skip
        raise UserError(f"data_dir not found: {data_dir}")
    if files and dataset_name in (None, "csv", "json", "parquet"):
        raw = DatasetDict()
        for split, path in files.items():  # each with its own builder: a .csv train, a .jsonl test
            builder = _builder_for(path)
            if builder == "conll":  # datasets has no builder for it
                raw[split] = read_conll(path, split, *conll_columns)
                continue
            kwargs = {"sep": "\t"} if Path(path).suffix.lower() == ".tsv" else {}
            if builder == "csv":  # only an empty cell is missing: a class named NA, None or null is a class
                kwargs.update(keep_default_na=False, na_values=[""])
            # datasets' json builder logs its own "Failed to load JSON" line before raising: ours names the line
            logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
            logging.getLogger("datasets.packaged_modules.csv.csv").setLevel(logging.CRITICAL)  # its own line too
            try:
                raw[split] = load_dataset(builder, data_files={split: path}, **kwargs)[split]
                if builder == "csv" and (zeros := _leading_zero_columns(raw[split], path, kwargs.get("sep", ","))):
                    # "007" and "7" would both be read as 7: such a column is read as the text it is
                    features = raw[split].features.copy()
                    features.update({c: Value("string") for c in zeros})
                    raw[split] = load_dataset(builder, data_files={split: path}, features=features, **kwargs)[split]
            except Exception as e:  # datasets raises many types for unreadable data
                _reraise_a_stop(e)
                huge = _huge_integer_columns(path, kwargs.get("sep", ",")) if builder == "csv" else []
                if huge and "OverflowError" in _root_cause(e):  # ids past 64 bits: read as the text they are
                    import pandas as pd

                    frame = pd.read_csv(path, dtype=dict.fromkeys(huge, str), **kwargs)
                    raw[split] = HFDataset.from_pandas(frame, preserve_index=False)
                    continue
                if "corresponds to no data" in _root_cause(e) or "BatchSize must be greater than 0" in _root_cause(e):
                    raise UserError(f"{_the(split)} has no rows ({path}); check the file") from None  # a header alone
                cache = _cache_failure(e)
                if cache:
                    raise UserError(f"could not load the {split} file {path}: {cache}") from None
                raise UserError(
                    _diagnose_file(split, path)
                    or f"could not load the {split} file {path}: "
                    f"{_root_cause(e)}; check that it is valid {builder}"
                ) from None
    else:
        raw = _load_folder_or_hub(dataset_name, dataset_config_name, data_dir)
    for split in raw:  # parquet's exact decimals (a database's NUMERIC, pandas' Decimal) are numbers: floats
        for column, feature in raw[split].features.items():
            if isinstance(feature, Value) and feature.dtype.startswith("decimal"):
                raw[split] = raw[split].cast_column(column, Value("float64"))
    if require_train and "train" not in raw:
        fix = (f"; an image folder trains on {data_dir}/train/<label>/<image> (validation/ and test/ beside it)"
               if data_dir else "; give train_file (or a data set with a train split)")
        raise UserError(f"the data has no 'train' split (found: {', '.join(raw) or 'none'}){fix}")
    return raw


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (what `sha256sum` prints)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_file_digests(args: DataArgs) -> dict[str, str]:
    """The sha256 of each data file of the run, by its resolved path (kept in results.json: an evaluation
    of the run's own split says when the file changed since the run)."""
    files = dict.fromkeys(f for f in (args.train_file, args.validation_file, args.test_file) if f)
    return {str(Path(f).resolve()): file_sha256(f) for f in files if Path(f).is_file()}


def train_data_fingerprint(args: DataArgs) -> dict[str, str] | None:
    """What a resume checks the training data against (finetune/checkpoint.py): the sha256 of the train
    file's bytes, or of an image folder's file list (each file's path and size, under train/ when there
    is one); None for hub data, which its name and revision say. A file edited in place between a save
    and its resume would otherwise go on training on other samples in the saved order."""
    if args.train_file and Path(args.train_file).is_file():
        return {"train_file": file_sha256(args.train_file)}
    if args.data_dir and args.dataset_name in (None, "imagefolder") and Path(args.data_dir).is_dir():
        root = Path(args.data_dir) / "train" if (Path(args.data_dir) / "train").is_dir() else Path(args.data_dir)
        listing = hashlib.sha256()
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            listing.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\n".encode())
        return {"data_dir": listing.hexdigest()}
    return None


def _reraise_a_stop(e: BaseException) -> None:
    """A signal while datasets parses a file (SIGTERM raises TrainingStopped there) comes back wrapped in
    datasets' own error: it is a stop, not bad data."""
    stop = next((inner for inner in _chain(e) if isinstance(inner, TrainingStopped)), None)
    if stop is not None:
        raise stop from None


def _check_image_folder(root: Path) -> None:
    """What datasets' image folder loader would leave out without a word: a split or class folder that is
    a link (it follows links to files, not to folders), a link to an image that is gone, and an image
    beside the class folders of a split (it has no class: the loader drops every label for it)."""
    from finetune.tasks import SPLIT_FOLDERS

    for level in (root.iterdir(), *(p.iterdir() for p in root.iterdir() if p.is_dir())):
        for path in sorted(level):
            if path.is_symlink() and path.is_dir():
                raise UserError(
                    f"{path} is a link to a folder ({os.readlink(path)}), which the image folder loader does not "
                    "follow: its images would be left out; copy the folder in its place, or link each image file"
                )
            _refuse_dangling_link(path)
    cased = next((p for p in sorted(root.iterdir()) if p.is_dir() and p.name.lower() in SPLIT_FOLDERS
                  and p.name not in SPLIT_FOLDERS), None)  # fmt: skip
    if cased is not None:  # Train/, Validation/: read as class folders, every split's images trained on
        raise UserError(f"{cased} is not read as the {cased.name.lower()} split: the image folder loader knows split "
                        f"folders by their lower-case names only; rename it to {cased.name.lower()}/")
    splits = [p for p in root.iterdir() if p.is_dir() and p.name.lower() in SPLIT_FOLDERS] or [root]
    beside = next((p for p in sorted(root.iterdir()) if splits != [root] and p.is_dir() and p not in splits
                   and not p.name.startswith((".", "__"))  # __MACOSX/, .ipynb_checkpoints/: no one's images
                   and any(q.suffix.lower() in _image_suffixes() for q in p.rglob("*"))), None)  # fmt: skip
    if beside is not None:  # train/ and bird/: the loader reads the split folders alone
        into = next((p.name for p in splits if p.name in ("train", "training")), splits[0].name)
        raise UserError(f"{beside} holds images beside the split folders of {root} "
                        f"({', '.join(sorted(p.name for p in splits))}): the image folder loader reads only the split "
                        f"folders, so they would be left out; move {beside.name}/ into {into}/ (as a class) or out of "
                        f"{root}")  # fmt: skip
    from finetune.rundir import RunDir

    for folder in (f for split in splits for f in sorted(split.iterdir()) if f.is_dir()):
        run = RunDir(folder)
        if run.is_run() or run.holds_run():  # an output_dir once put there
            raise UserError(f"{folder} is a run's output folder inside the image folder: its files would be read "
                            "as a class of images; move it out of the image folder")
    for folder in splits:
        entries = sorted(folder.iterdir())
        loose = [p for p in entries if p.is_file() and p.suffix.lower() in _image_suffixes()]
        if loose and any(p.is_dir() for p in entries):
            raise UserError(
                f"{loose[0]} is an image beside the class folders of {folder}: an image folder labels each image "
                "by the folder it is in; move it into its class's folder, or delete it"
            )
    for link in root.glob("*/*/*"):  # an image in a class folder of a split
        _refuse_dangling_link(link)
    train = root / "train" if (root / "train").is_dir() else root  # its class folders of them alone: refused
    unread = sorted(p for p in root.rglob("*") if p.suffix.lower() in UNREADABLE_PHOTOS and p.is_file()
                    and (p.parent.parent != train or any(q.suffix.lower() in _image_suffixes()
                                                         for q in p.parent.iterdir())))  # fmt: skip
    if unread:  # left out by the loader, which knows images by their names
        kinds = ", ".join(sorted({p.suffix.lower() for p in unread}))
        warn(f"{len(unread)} photo(s) in {root} are {kinds} files, which cannot be read here and are left out "
             f"(first: {unread[0]}); convert them to JPEG or PNG to train on them")


# Photo formats that cameras and phones write and that PIL reads only with plugins: the image folder
# loader skips them as if they were not images.
UNREADABLE_PHOTOS = (".heic", ".heif", ".avif", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf")


def _refuse_dangling_link(path: Path) -> None:
    """A link to a file that is gone: the image folder loader would leave it out without a word."""
    if path.is_symlink() and not path.exists():
        raise UserError(f"{path} is a link to {os.readlink(path)}, which does not exist: the image would be "
                        "left out; fix the link or delete it")


def _image_paths(values: list) -> bool:
    """Whether a column's values are image file paths (nine in ten end in an image suffix)."""
    suffixes = _image_suffixes()
    paths = [v for v in values if isinstance(v, str) and Path(v.strip()).suffix.lower() in suffixes]
    return bool(values) and len(paths) * 10 >= len(values) * 9


@functools.cache
def _image_suffixes() -> set[str]:
    import PIL.Image

    return set(PIL.Image.registered_extensions())


def _load_folder_or_hub(name: str | None, config_name: str | None, data_dir: str | None) -> DatasetDict:
    builders = {"csv": (".csv", ".tsv"), "json": (".json", ".jsonl"), "parquet": (".parquet",)}
    if name in builders and data_dir and Path(data_dir).is_dir():  # dataset_name=json on a folder of CSVs
        found = {p.suffix.lower() for p in Path(data_dir).rglob("*") if p.is_file()}
        fits = next((b for b, suffixes in builders.items() if found & set(suffixes)), None)
        if not found & set(builders[name]):
            instead = f"; its files are {', '.join(sorted(found))}: set dataset_name={fits}" if fits else ""
            raise UserError(f"data_dir {data_dir} holds no {' or '.join(builders[name])} file for "
                            f"dataset_name={name}{instead}")
    try:
        if name in (None, "imagefolder") and data_dir:
            _check_image_folder(Path(data_dir))
            return load_dataset("imagefolder", data_dir=data_dir)
        return load_dataset(name, config_name, data_dir=data_dir)
    except UserError:  # the folder's own check: its line as it is
        raise
    except Exception as e:  # datasets raises many types for unreadable data; the message is the help
        _reraise_a_stop(e)
        cause = _root_cause(e)
        if name in (None, "imagefolder") and (
            "no data" in cause or "EmptyDataset" in cause or "doesn't contain any data" in cause
        ):
            files = sorted(p.name for p in Path(data_dir).iterdir() if p.suffix.lower() in FILE_BUILDERS)
            if files:  # a folder of data files given where an image folder is read
                raise UserError(f"data_dir {data_dir} holds data files ({', '.join(files[:4])}), not images: data_dir "
                                "is an image folder's; give the files as train_file= (validation_file=, test_file=)"
                                ) from None  # fmt: skip
            raise UserError(
                f"data_dir {data_dir} holds no images; an image folder is "
                "<data_dir>/train/<label>/<image>.png|jpg (validation/, test/ optional)"
            ) from None
        what = name or data_dir
        offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if os.environ.get(v, "").lower() in
                   ("1", "true", "yes", "on")]  # fmt: skip
        if name and offline and not Path(name).expanduser().exists():  # a hub dataset, no download allowed
            raise UserError(f"could not load data from {name}: {cause}; {offline[0]} is set (no downloads): load "
                            "it once while online (then it is read from the datasets cache), or give local files: "
                            "train_file=... validation_file=...") from None  # fmt: skip
        raise UserError(f"could not load data from {what}: {cause}") from None


# --- labels ----------------------------------------------------------------------------------------


def _label_values(ds: HFDataset, column: str) -> list[Any]:
    feature = ds.features[column]
    if isinstance(feature, ClassLabel):
        return [feature.names[i] for i in sorted(set(ds[column]))]
    return sorted(set(ds[column]), key=lambda v: (str(type(v)), v))


def ids_read_through_label_names(
    raw: DatasetDict, args: DataArgs, problem: str, saying: Callable[[str], str] | None = None
) -> DatasetDict:
    """Class ids (0, 1, ...) in the label column beside `label_names` that are names (the Hub's habit: the
    ids in the data, the names in its card): each id is read as the name at its place in label_names,
    in every split, with one warning that says so (`saying` words it from the places shown; evaluation
    words it for the model's classes, and says nothing for transformers' own LABEL_<id>). Single-label
    and multi-label lists; a ClassLabel column names its ids itself; a missing label stays missing."""
    names, column = list(args.label_names or []), args.label_column
    if problem not in (SINGLE, MULTI) or not names or args.label_columns:
        return raw
    if any(isinstance(d.features.get(column), ClassLabel) or column not in d.column_names for d in raw.values()):
        return raw

    def as_id(v):
        if isinstance(v, bool):
            return None
        if isinstance(v, int) or (isinstance(v, str) and re.fullmatch(r"\d+", v.strip())):
            return int(v)
        return None

    def values(ds: HFDataset) -> list:
        rows = [v for v in ds[column] if v is not None]
        return [v for row in rows for v in row] if problem == MULTI else rows

    ids = {as_id(v) for d in raw.values() for v in values(d)}
    if not ids or None in ids or not all(0 <= i < len(names) for i in ids) or {str(i) for i in ids} & set(names):
        return raw

    def named(batch):
        if problem == MULTI:
            return {column: [None if row is None else [names[as_id(v)] for v in row] for row in batch[column]]}
        return {column: [None if v is None else names[as_id(v)] for v in batch[column]]}

    shown = ", ".join(f"{i} -> {names[i]}" for i in sorted(ids)[:4]) + (", ..." if len(ids) > 4 else "")
    if saying is None:
        warn(f"label column '{column}' holds class ids, read as the names at their places in label_names "
             f"({shown}); if label_names lists them in another order, fix its order")  # fmt: skip
    elif names != [f"LABEL_{i}" for i in range(len(names))]:
        warn(saying(shown))
    raw = DatasetDict({s: d.cast_column(column, Value("string")) if problem == SINGLE and d.features[column] !=
                       Value("string") else d for s, d in raw.items()})  # fmt: skip
    return DatasetDict({s: d.map(named, batched=True, desc=f"labels ({s})") for s, d in raw.items()})


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
    _check_label_texts(train, column, present, label_names)
    absent = [n for n in names if n not in present]
    if isinstance(feature, ClassLabel) and not label_names and absent:
        twin = _near_misses(absent[:1], sorted(present))
        if twin:  # an image folder's validation/Cat beside train/cat
            raise UserError(
                f"class {absent[0]!r} of label column '{column}' has no training sample{twin} (an image folder: "
                "name each class's folder the same in every split)"
            )
        raise UserError(
            f"class {absent[0]!r} of label column '{column}' has no training sample (an image folder: no "
            f"train/{absent[0]}/ images, or max_train_samples left them out): the model could not learn it; "
            "give it training samples, or remove it from the other splits"
        )
    unknown = present - set(names)
    if unknown:
        forms = {n.strip().casefold(): n for n in names}
        twins = [(u, forms[u.strip().casefold()]) for u in sorted(unknown) if u.strip().casefold() in forms]
        if twins:  # label_names=[NEG, POS] for neg, pos
            raise UserError(
                f"training labels {sorted(unknown)} are not in label_names {names}, which write them otherwise "
                f"({twins[0][0]!r} is {twins[0][1]!r} there: letter case or spaces); write label_names as the data "
                "does, or set label_names=null to take them from the data"
            )
        raise UserError(
            f"training labels {sorted(unknown)} are not in label_names {names}; list them all in label_names, "
            "or set label_names=null to take them from the data (the recipe for your own files, "
            "finetune/configs/bert_custom_files.yaml, does)"
        )
    if absent:  # named in label_names: the user asked for them
        shown = ", ".join(map(repr, absent[:5])) + (", ..." if len(absent) > 5 else "")
        warn(
            f"{len(absent)} of the {len(names)} classes in label_names have no training sample ({shown}; "
            "an image folder: no train/<class>/ images): the model cannot learn to predict them; give them "
            "training samples, or leave them out of label_names"
        )
    return names


def _check_label_texts(train: HFDataset, column: str, present: set[str], label_names: list[str] | None) -> None:
    """Class names that probably mean something else: lists written as text ("['art', 'film']", a
    multi-label set saved by a CSV writer, or "[art, film]" without quotes; a class listed in label_names
    is the user's own name), and names that differ only by surrounding spaces."""
    named = set(label_names or [])
    listy = next((v for v in sorted(present) if re.fullmatch(r"\s*\[.*\]\s*", v, re.S) and v not in named), None)
    if listy is not None:
        row = next(i for i, v in enumerate(train[column]) if str(v) == listy)
        raise UserError(
            f"label column '{column}' holds a list written as text ({listy!r} at row {row + 1}); for several labels a "
            'sample, give real lists (JSON Lines: "label": ["art", "film"]) or 0/1 columns (label_columns); for '
            "one label a sample, remove the brackets and quotes (or, if that is a class's name, list it in label_names)"
        )
    if column in present and column not in named:  # a CSV whose header line was pasted in again
        row = next(i for i, v in enumerate(train[column]) if str(v) == column)
        raise UserError(
            f"label column '{column}' holds the label {column!r} at row {row + 1}: the header repeated inside the "
            "file; remove that row (or, if it is a class's name, list it in label_names)"
        )
    broken = next((v for v in sorted(present) if re.search(r"\S[\r\n]+\S", v) and v not in named), None)
    if broken is not None:  # "pos\nx": a quoted field that ran on into the next line
        row = next(i for i, v in enumerate(train[column]) if str(v) == broken)
        raise UserError(
            f"label column '{column}' holds a label with a line break ({broken!r} at row {row + 1}): a quote left open "
            "in the file, so the field ran on into the next line? fix the quoting (or, if that is a class's name, "
            "list it in label_names)"
        )
    blank = next((v for v in sorted(present) if not v.strip()), None)
    if blank is not None:  # "   ": an empty label that a CSV kept as text
        row = next(i for i, v in enumerate(train[column]) if str(v) == blank)
        raise UserError(
            f"label column '{column}' has an empty (blank) label at row {row + 1}; give that sample its label or "
            "drop the row"
        )
    stripped: dict[str, str] = {}
    for name in sorted(present):
        twin = stripped.setdefault(name.strip(), name)
        if twin != name:
            raise UserError(
                f"label column '{column}' holds {twin!r} and {name!r}, which differ only by spaces and would be two "
                "classes; strip the spaces in the data"
            )
    spaced = sorted(v for v in present if v != v.strip() and v not in named)
    if spaced:  # every label written with a space around it: names that evaluation data without it won't match
        warn(f"label column '{column}' has labels that begin or end with a space ({', '.join(map(repr, spaced[:3]))}"
             f"{', ...' if len(spaced) > 3 else ''}): they are class names as written; strip the spaces in the data "
             "unless they are part of the names")
    alike = look_alike(present, allowed=named)
    if alike:
        raise UserError(f"label column '{column}' holds {shown(alike[0])} and {shown(alike[1])}, "
                        + LOOK_ALIKE.format("classes"))
    twins = case_twins(present, allowed=named)  # both in label_names: the user's own two classes
    if twins:
        raise UserError(
            f"label column '{column}' holds {twins[0]!r} and {twins[1]!r}, which differ only by letter case and "
            "would be two classes; write each label the same way (or, if they are two classes, list both in "
            "label_names)"
        )
    punctuated = punctuation_twins(present, allowed=named)
    if punctuated:  # "neg" and "neg.": a stray full stop makes a class of its own
        raise UserError(
            f"label column '{column}' holds {punctuated[0]!r} and {punctuated[1]!r}, which differ only by punctuation "
            "and would be two classes; write each label the same way (or, if they are two classes, list both in "
            "label_names)"
        )


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
        near = _near_misses(unseen, label_names)
        ids = seen == {str(i) for i in range(len(seen))} and len(seen) <= len(label_names)
        if not near and label_names == [f"LABEL_{i}" for i in range(len(label_names))]:  # transformers' defaults
            near = ("; those are transformers' default names: the model's config.json holds no id2label (it was "
                    "saved without its class names); put them back in its id2label and label2id, or give the "
                    "labels as class ids (0, 1, ...)")  # fmt: skip
        if not near and ids and not set(seen) & set(to_id):  # 0/1 for a model of neg/pos: class ids, its order?
            shown = ", ".join(f"{i} is {n}" for i, n in enumerate(label_names[: len(seen)]))
            near = (f"; the labels are class ids and the model's classes are names: write the names in the data "
                    f"(in the model's order, {shown})")  # fmt: skip
        raise UserError(f"{split} labels {unseen[:5]} were not seen in training (known: {', '.join(label_names)})"
                        + (near or "; a model predicts only the labels it was trained on: relabel or drop those "
                                   "rows, or train with them"))  # fmt: skip
    ds = ds.map(
        lambda b: {"labels": [to_id[name_of(v)] for v in b[column]]}, batched=True, desc=f"labels ({split})"
    )
    if column != "labels":
        ds = ds.remove_columns(column)
    return ds.cast_column("labels", ClassLabel(names=label_names))


def _near_misses(unseen: list[str], known: list[str]) -> str:
    """For labels another split has that train lacks: those that are a known label but for surrounding
    spaces or letter case, named (they are the same class written differently), with the fix."""
    by_form = {form(k): k for k in known for form in (str.strip, lambda t: t.strip().casefold())}
    twins = [(u, by_form.get(u.strip()) or by_form.get(u.strip().casefold())) for u in unseen]
    twins = [(u, k) for u, k in twins if k is not None]
    if not twins:
        return ""
    what = " and ".join(sorted({"surrounding spaces" if u.strip() == k.strip() else "letter case" for u, k in twins}))
    pairs = ", ".join(f"{u!r} (train: {k!r})" for u, k in twins[:3])
    return f"; {pairs} differ from the training labels only by {what}: write each label the same way in every split"


def check_columns(ds: HFDataset, split: str, args: DataArgs, labelled: bool = True, model_task: bool = False,
                  train_columns: list[str] | None = None) -> None:  # fmt: skip
    """The label column(s) (unless the data is `labelled=False`: predictions only) and the task's input
    columns exist and hold what they should; no label is null. `model_task`: the task is a trained
    model's (evaluation), so data of another task is the wrong data, not a wrong `task`. `train_columns`:
    the train split's, for another split (a column train has: the fix is in this file, not a setting)."""
    try:
        _check_columns(ds, split, args, labelled, model_task, train_columns)
    except UnicodeDecodeError as e:  # a parquet file's strings: read only when a value is
        raise UserError(
            f"the {split} data holds text that is not UTF-8 ({e.reason}); the file is damaged or in another "
            "encoding: save it again as UTF-8"
        ) from None
    text = split == "train" and task_of(args.task).modality == "text"  # said once, for the split that trains
    texts = [c for c in args.input_columns if text and c in ds.column_names and _image_paths(ds[c][:200])]
    if texts:  # a CSV of image paths given to a text recipe: the file names would be learned
        warn(f"column '{texts[0]}' holds image file paths ({ds[texts[0]][0]}), read as text: the model learns their "
             f"names, not the pictures; to train on the images, use an image recipe with image_column={texts[0]}")
    if text and labelled:
        _warn_merged_rows(ds, args)


def _warn_merged_rows(ds: HFDataset, args: DataArgs) -> None:
    """A text cell that holds lines ending the way the file's rows end (",pos"): a quote opened in a text and
    never closed ("great!) made the CSV reader join the following rows into that one cell, until another
    quote. Their samples are lost and the text is wrong; one warning names the row."""
    column, labels = args.text_column, args.label_column
    if column not in ds.column_names or labels not in ds.column_names:
        return
    broken = [(row, text) for row, text in enumerate(ds[column][:20000]) if isinstance(text, str) and "\n" in text]
    if not broken:  # the first 20,000 rows only, and the label values below only when a text holds a line break
        return
    values = {str(v) for v in ds[labels][:5000] if isinstance(v, (str, int)) and not isinstance(v, bool)}
    ends = re.compile(r".*[,\t;|]\s*(" + "|".join(map(re.escape, sorted(values, key=len, reverse=True))) + r")\s*$")
    for row, text in broken if values else []:
        lines = text.splitlines()
        merged = sum(bool(ends.fullmatch(line)) for line in lines)
        if merged >= 2:
            warn(f"row {row + 1} of the training data holds {merged} lines that end like the file's rows "
                 f"({shown(lines[1][-40:])}): a quote (\") opened in a text and never closed joined the rows after it "
                 "into that one text; close or remove the quote (or save the file with every text quoted)")
            return


def _label_and_text_guess(ds: HFDataset, others: list[str], missing: list[str], args: DataArgs) -> str:
    """Neither the label column nor (perhaps) the text column under the run's names (review, sentiment): the
    columns of strings that read as classes (few values, each repeated) and, where the text column is
    missing too, the one of longest strings; a hint that names both, or "" when it is not one of each."""
    head = ds.select_columns(others)[:1000] if others else {}
    strings = [c for c in others if head[c] and all(isinstance(v, str) for v in head[c])]
    classes = [c for c in strings if len(set(head[c])) <= max(2, len(head[c]) // 5)]
    if len(classes) != 1:
        return ""
    label = classes[0]
    if not missing:
        return f"; if '{label}' holds the labels, set label_column={label}"
    texts = [c for c in strings if c != label]
    if len(missing) != 1 or not texts:
        return ""
    text = max(texts, key=lambda c: sum(len(v) for v in head[c]))
    return (f"; if '{label}' holds the labels and '{text}' the texts, set {_setting_of(missing[0], args)}={text} "
            f"label_column={label}")


def _setting_of(column: str, args: DataArgs) -> str:
    """The setting that names `column`."""
    names = ("label_column", "text_column", "text_pair_column", "tokens_column", "tags_column", "image_column")
    return next((n for n in names if getattr(args, n, None) == column), "label_columns")


def _word_and_tag_lists(ds: HFDataset) -> tuple[str, str] | None:
    """The two columns of tagging data under any names: a list of words and, beside it, a list of tags (names
    or ids) of the same length in the first row; None unless exactly one such pair."""
    if not len(ds):
        return None
    row = ds[0]
    words = [c for c, v in row.items() if isinstance(v, list) and v and all(isinstance(w, str) for w in v)]
    pairs = [(w, t) for w in words for t, v in row.items()
             if t != w and isinstance(v, list) and len(v) == len(row[w]) and all(isinstance(x, (str, int)) for x in v)]
    def tags(values) -> bool:
        return all(isinstance(x, str) and A_TAG.fullmatch(x) for x in values)

    if len(pairs) == 2 and pairs[0] == pairs[1][::-1]:  # two lists of strings: the tags are the ones that read so
        pairs = [(w, t) for w, t in pairs if tags(row[t])]
    if len(pairs) == 1 and tags(row[pairs[0][0]]) and not tags(row[pairs[0][1]]):  # words beside a number (1990)
        return pairs[0][::-1]
    return pairs[0] if len(pairs) == 1 else None


# The keys that mark a one-record JSON file as one of a model folder's own files, not data.
MODEL_FILES = {
    "config.json (model_type, architectures, ...)": {"model_type", "architectures"},
    "tokenizer_config.json (tokenizer_class, model_max_length, ...)": {"tokenizer_class", "model_max_length",
                                                                       "added_tokens_decoder"},
    "tokenizer.json (added_tokens, normalizer, pre_tokenizer, ...)": {"added_tokens", "normalizer", "pre_tokenizer"},
    "special_tokens_map.json (cls_token, pad_token, ...)": {"cls_token", "pad_token", "unk_token", "sep_token"},
    "preprocessor_config.json (image_processor_type, ...)": {"image_processor_type", "feature_extractor_type"},
    "generation_config.json (decoder_start_token_id, ...)": {"decoder_start_token_id", "transformers_version"},
}


def _model_file(ds: HFDataset) -> str | None:
    """The model folder's file that a one-record data set was read from, by its keys, or None."""
    if len(ds) != 1:
        return None
    return next((name for name, keys in MODEL_FILES.items() if keys & set(ds.column_names)), None)


def _nested_field_hint(ds, column: str, setting: str) -> str:
    """A column missing because it sits inside another's records ({"data": {"text": ...}}): nested fields
    are not read, so the fix is to flatten them into columns."""
    held = {c: sorted(ds[0][c]) for c in ds.column_names if len(ds) and isinstance(ds[0][c], dict)}
    head, _, sub = column.partition(".")
    inside = head if sub and sub in held.get(head, ()) else next((c for c, keys in held.items() if column in keys), None)
    if inside is None:
        return ""
    flat = column if sub else f"{inside}.{column}"
    return (f"; '{inside}' holds fields ({', '.join(held[inside])}), and nested fields are not read: flatten them "
            f"into columns (pandas: pd.json_normalize(records).to_json(orient='records', lines=True)) and set "
            f"{setting}={flat}")


def _images_under_another_name(ds: HFDataset, column: str, split: str, args: DataArgs, labels: list[str]) -> None:
    """An image run whose image column is missing while another column holds images (a parquet of the Hub's
    CIFAR: img, fine_label): the settings that name them, the label column's too where it is missing."""
    if args.image_column in ds.column_names or (column != args.image_column and task_of(args.task).modality != "image"):
        return
    held = next((c for c, f in ds.features.items() if isinstance(f, Image)
                 or (isinstance(f, dict) and {"bytes", "path"} <= set(f))), None)  # fmt: skip
    held = held or next((c for c in ds.column_names if _image_paths(ds[c][:200])), None)
    if held is None:
        return
    fix = f"image_column={held}"
    if args.label_column in labels and args.label_column not in ds.column_names:
        others = [c for c, f in ds.features.items() if c != held and (isinstance(f, ClassLabel) or (
                  isinstance(f, Value) and (f.dtype in ("string", "large_string") or f.dtype.startswith("int"))))]  # fmt: skip
        fix += f" label_column={others[0]}" if len(others) == 1 else f" label_column=<one of {', '.join(others)}>" \
            if others else ""  # fmt: skip
    raise UserError(f"column '{column}' not found in the {split} data, but '{held}' holds images: set {fix}")


def _refuse_joined_tags(values: list, column: str, split: str) -> None:
    """A column of IOB2 tags joined by spaces in one string a row ("O B-geo I-geo O"): a tagging row's tags
    in one cell, which a classifier would read as one class each. `values`: the column's first rows."""
    strings = [v for v in values[:200] if isinstance(v, str)]
    joined = [v for v in strings if len(v.split()) >= 2 and all(A_TAG.fullmatch(t) for t in v.split())]
    if not joined or len(joined) * 2 <= len(strings) or not any(re.search(r"(^|\s)[BI]-", v) for v in joined):
        return
    raise UserError(
        f"column '{column}' of the {split} data holds tags joined by spaces in one string a row ({joined[0]!r}): "
        "tagging data; a tagging run reads a list of words and a list of IOB2 tags for each row (JSON Lines: "
        "\"tokens\": [...], \"ner_tags\": [...]) or a CoNLL file: split both columns into lists (pandas: "
        "df[col].str.split()), write JSON Lines, and train with finetune/configs/bert_ner.yaml"
    )


def _refuse_other_layouts(ds: HFDataset, split: str) -> None:
    """Samples laid out as another tool keeps them, where a column is missing: Kaggle's MNIST-style CSV
    (label, pixel1 ... pixel784: images as rows of pixel columns), or entities as character spans
    (spaCy's, Label Studio's) where tags for each word are read."""
    pixels = [c for c in ds.column_names if re.fullmatch(r"(pixel|px|p)_?\d+|\d+x\d+", c.strip().lower())]
    if len(pixels) >= 64:  # by the names alone, before any row of a table this wide is read
        raise UserError(
            f"the {split} data holds images as {len(pixels)} pixel columns ({pixels[0]} ... {pixels[-1]}): this app "
            "reads images from files; save each row as a PNG in a folder of its class (<dir>/train/<label>/<n>.png) "
            "and give data_dir with an image recipe (finetune/configs/vit_*.yaml)"
        )
    columns = [c for c, f in ds.features.items() if not isinstance(f, Image)]  # no image decoded to look
    head = ds.select_columns(columns)[:1000] if columns else {}  # one read: each ds[column] copies the features
    for column in columns:  # Kaggle's NER CSV by sentence: "O B-geo O" in one cell
        _refuse_joined_tags(head[column], column, split)
    examples = {c: next((v[0] for v in head[c] if isinstance(v, list) and v), None) for c in columns}
    found = next((c for c, v in examples.items() if character_span(v)), None)  # the spans, else the token records
    found = found or next((c for c, v in examples.items() if token_record(v)), None)
    if found is not None:
        raise UserError(spans_error(found, split, examples[found]))


def _input_hint(ds: HFDataset, column: str, args: DataArgs, missing: list[str], spare: list[str],
                model_task: bool) -> str:
    """The setting that names a missing text column: the one string column left ("sentence", not "text";
    the column of long strings beside a label column of words), a pair under other names (premise and
    hypothesis for sentence1 and sentence2, in order), or a pair model's second text. "" if none."""
    spare = _the_texts_among(ds, spare) if len(missing) == 1 else spare
    if len(spare) == 1:
        return f"; if '{spare[0]}' is that column, set {_setting_of(column, args)}={spare[0]}"
    if model_task and column == args.text_pair_column:
        return (f"; the model reads pairs of texts, the second in '{column}': give the data a second text column, "
                f"named so or set {_setting_of(column, args)}=<its name>")
    if len(missing) == len(spare) == 2:
        return (f"; if '{spare[0]}' and '{spare[1]}' are the pair, set {_setting_of(missing[0], args)}={spare[0]} "
                f"{_setting_of(missing[1], args)}={spare[1]}")
    return ""


def _the_texts_among(ds: HFDataset, columns: list[str]) -> list[str]:
    """Of string columns, the one whose values are much longer (3x or more) than every other's: the texts
    beside a label column of words ('review' beside 'stars'); else all of them."""
    if len(columns) < 2 or not len(ds):
        return columns
    width = {c: sum(len(str(v)) for v in ds[c][:200]) for c in columns}
    longest = max(columns, key=width.get)
    return [longest] if all(width[longest] >= 3 * width[c] for c in columns if c != longest) else columns


def _check_columns(ds: HFDataset, split: str, args: DataArgs, labelled: bool, model_task: bool = False,
                   train_columns: list[str] | None = None) -> None:  # fmt: skip
    task, label_columns, inputs = task_of(args.task), args.label_sources if labelled else [], args.input_columns
    for column in (*label_columns, *inputs):
        if column not in ds.column_names:
            described = _model_file(ds)
            if described is not None:  # an export's config.json, tokenizer_config.json, ...
                raise UserError(f"the {split} data is one record with the keys of a model's {described}: that file "
                                "describes a model, it holds no samples; give a data file")  # fmt: skip
            _refuse_other_layouts(ds, split)
            why = task.missing_label_error(ds, split, args) if column in label_columns else None
            if why:
                raise UserError(why)
            _images_under_another_name(ds, column, split, args, label_columns)
            spaced = next((c for c in ds.column_names if c.strip() == column), None)
            if spaced is not None:  # "text, label": the header's space is part of the name
                raise UserError(f"column '{column}' not found in the {split} data, but {spaced!r} is: strip the spaces "
                                "around the names in the file's header")
            cased = {c: next((n for n in ds.column_names if n.strip().lower() == c.lower()), None)
                     for c in (*label_columns, *inputs) if c not in ds.column_names}  # fmt: skip
            if cased.get(column) is not None and not (train_columns is not None and column in train_columns):
                # Text,Label: the names in another case (in train too: a split that differs is said below)
                fixes = " ".join(f"{_setting_of(c, args)}={n}" for c, n in cased.items() if n is not None)
                raise UserError(f"column '{column}' not found in the {split} data, but {cased[column]!r} is (the names "
                                f"differ in case): set {fixes}, or rename the columns")
            words, tags = (ds[0].get(args.tokens_column), ds[0].get(args.tags_column)) if len(ds) else (None, None)
            if column in label_columns and isinstance(words, str) and isinstance(tags, list):
                raise UserError(
                    f"column '{args.tokens_column}' of the {split} data holds a string in each row, beside lists of "
                    f"tags in '{args.tags_column}': a tagging run needs a list of words for each list of tags; split "
                    "each sentence into its words ([\"Ada\", \"went\", ...])"
                )
            (only,) = ds.column_names if len(ds.column_names) == 1 else (None,)
            if only is not None and len(ds) == 1 and isinstance(ds[0][only], list):  # {"data": [{...}, ...]}
                raise UserError(
                    f"the {split} data is one record whose '{only}' holds a list: the samples are nested under "
                    f"'{only}'; give the records themselves (JSON Lines, or a JSON array of records)"
                )
            hint = task.missing_label_hint() if column in label_columns and ds.column_names == inputs else ""
            other = task_for_data(ds.features, args)
            if model_task and other == args.task and TOKENS not in task.problems and column in inputs and len(ds) \
                    and any(isinstance(v, list) and v and all(isinstance(w, str) for w in v) for v in ds[0].values()):
                other = next(n for n, t in TASKS.items() if t.problems == (TOKENS,))  # words to tag, a text model
            lists = _word_and_tag_lists(ds)
            renamed = lists is not None and lists != (args.tokens_column, args.tags_column)
            if renamed or (lists is not None and task.problems != (TOKENS,) and not model_task):  # words and tags
                fix = [*(["task=token-classification"] if task.problems != (TOKENS,) else []),
                       *([f"tokens_column={lists[0]}", f"tags_column={lists[1]}"] if renamed else [])]  # fmt: skip
                raise UserError(
                    f"column '{column}' not found in the {split} data; columns are: {', '.join(ds.column_names)}; "
                    f"'{lists[0]}' and '{lists[1]}' hold lists of words and their tags: to tag words, set "
                    f"{' '.join(fix)}"
                )
            if column in label_columns and task.problems == (TOKENS,) and ds.column_names == inputs:
                other = args.task  # words without tags: tagging data that lacks its tags, not another task's
                hint = ("; a tagging run trains on a tag for each word (CoNLL: the word and its tag on each line; "
                        "JSON: a list of tags beside the list of words)")
            last = ds.column_names[-1] if ds.column_names else None
            tags = [v for v in ds[last][:200]] if last is not None and len(ds) else []
            if (task.problems == (TOKENS,) and len(ds.column_names) <= 4 and tags
                    and sum(isinstance(v, str) and bool(A_TAG.fullmatch(v)) for v in tags) * 2 > len(tags)):
                other = args.task  # a word and its tag on each line, read as a table: CoNLL under another name
                hint = "; its rows read as a word and its tag on each line: a CoNLL file; name it .conll"
                if not A_TAG.fullmatch(last.strip()):  # a header (Kaggle's Sentence #,Word,POS,Tag): a table of words
                    word = next((c for c in ds.column_names[:-1] if all(isinstance(v, str) for v in ds[c][:200])
                                 and c.strip().lower() in ("word", "words", "token", "tokens", "form")), None)  # fmt: skip
                    hint = (f"; it is a table with a row per word{f' (the word in {word!r}, ' if word else ' ('}its tag in "
                            f"{last!r}): a tagging run reads a sentence per row (JSON Lines: a list of words beside a "
                            "list of tags) or a CoNLL file; group the rows by sentence (pandas: fill the sentence "
                            "column down, groupby(...).agg(list), to_json(orient='records', lines=True))")  # fmt: skip
            if other != args.task and model_task:  # a model of one task, data of another
                hint += (f"; these look like {other} data, and the model is a {args.task} model: give it "
                         f"{args.task} data, or evaluate a {other} model on these")
            elif other != args.task:  # the columns of another task's data
                hint += f"; these look like {other} data: set task={other} (or task=null to read it from the data)"
            spare = [c for c in ds.column_names if c not in (*label_columns, *inputs, *args.label_sources)
                     and len(ds) and isinstance(ds[0][c], str)]  # fmt: skip
            train_has = train_columns is not None and column in train_columns  # then the split's name is wrong
            if column in inputs and other == args.task and not train_has:
                hint += _input_hint(ds, column, args, [c for c in inputs if c not in ds.column_names], spare, model_task)
            others = [c for c in ds.column_names if c not in (*label_columns, *inputs, *args.label_sources)]
            headed = next((c for c in ds.column_names if c in {str(v) for v in ds[c][:1000]}), None)
            if headed is not None and not hint:  # "neg" a column's name and one of its values: a file without header
                hint = (f"; the first row looks like data, not a header ('{headed}' is also a value of its column): "
                        "the first line names the columns (e.g. text,label)")
            if column == args.label_column and not args.label_columns and other == args.task and len(others) == 1 \
                    and not hint:  # "labels" where the run read "label"  # fmt: skip
                hint = f"; if '{others[0]}' holds the labels, set label_column={others[0]}"
            elif column == args.label_column and not args.label_columns and other == args.task and not hint \
                    and not train_has:  # (a split whose names differ from train's: said below)  # fmt: skip
                hint = _label_and_text_guess(ds, others, [c for c in inputs if c not in ds.column_names], args)
            if not hint and train_has and column in label_columns and split in ("validation", "test") \
                    and all(c in ds.column_names for c in inputs):  # its inputs there, no labels  # fmt: skip
                hint = (f"; the {split} split is scored, so it needs its labels; to predict on a file without them: "
                        "finetune/evaluate_checkpoint.py <output_dir>/model --data <file>")  # fmt: skip
            if not hint and train_has:  # train's passed: this file differs
                hint = (f"; the train data has '{column}' (columns: {', '.join(train_columns)}): give every split the "
                        "same column names")
            raise UserError(
                f"column '{column}' not found in the {split} data; columns are: {', '.join(ds.column_names)}"
                + (hint or _nested_field_hint(ds, column, _setting_of(column, args)))
            )
    lists = set(task.input_columns(args) + task.label_columns(args)) if task.problems == (TOKENS,) else set()
    for column in (*inputs, *label_columns):
        if column not in lists:  # word and tag lists: the task names what a row should hold
            _check_one_type(ds, split, column)
    task.check_inputs(ds, split, args)
    for column in label_columns:
        labels = ds[column]
        if any(v is None for v in labels):
            row = next(i for i, v in enumerate(labels) if v is None)
            raise UserError(
                f"label column '{column}' in the {split} data has empty (null) values "
                f"(first at row {row + 1}); fill them in or drop those rows"
            )


def _kind_of_value(value: Any) -> str:
    """A JSON value's kind, in a user's words."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return {list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def _check_one_type(ds: HFDataset, split: str, column: str) -> None:
    """A JSON column whose values are of several kinds (a number among texts): datasets reads it as
    `Json`, which no check below would name; say which row differs from the first."""
    if type(ds.features[column]).__name__ != "Json":
        return
    values = list(ds[column])
    kinds = [None if v is None else _kind_of_value(v) for v in values]
    first = next((k for k in kinds if k is not None), None)
    odd = next((i for i, k in enumerate(kinds) if k is not None and k != first), None)
    if odd is None:
        return
    start = kinds.index(first)
    raise UserError(
        f"column '{column}' in the {split} data holds values of mixed types: row {odd + 1} holds {kinds[odd]} "
        f"({values[odd]!r:.40}), row {start + 1} {first} ({values[start]!r:.40}); give every row the same type "
        "(write numbers meant as text in quotes)"
    )


def _image_digest(cell: dict | None) -> str | None:
    """An undecoded image cell ({"bytes", "path"}) as the sha1 of its bytes (the file's, for a path)."""
    if not cell:
        return None
    data = cell.get("bytes")
    if data is None and cell.get("path"):
        try:
            data = Path(cell["path"]).read_bytes()
        except OSError:  # named with its row by the image checks
            return None
    return hashlib.sha1(data).hexdigest() if data is not None else None


def _warn_shared_samples(raw: DatasetDict, args: DataArgs, files: dict[str, Path]) -> None:
    """Text or images that say the splits are not what they seem: training samples all the same; validation
    or test samples that are mostly training samples (a shuffled copy of the training file, an image folder
    copied into another split), whose scores measure what the model saw. A split read from the train_file
    itself is warned of on its own."""
    images = task_of(args.task).modality == "image"
    columns = _compared_columns(raw["train"], args)
    if not columns:
        return

    def rows(ds: HFDataset) -> list[tuple]:
        return _sample_rows(ds, columns, images)

    train = rows(raw["train"])
    seen = set(train) - {(None,)}
    what = "image (the same bytes)" if images else " and ".join(columns)
    if len(seen) == 1 and len(train) > 1:
        shown = "" if images else f" ({str(train[0][0])[:40]!r})"
        warn(f"every training sample has the same {what}{shown}: the model cannot tell them apart; check "
             f"{_setting_of(columns[0], args)}")  # fmt: skip
    if not images and len(columns) == 2:  # sentence pairs whose second sentence is the first
        twins = sum(a == b for a, b in train)
        if twins * 2 >= len(train):
            warn(f"{twins} of the {len(train)} training pairs have the same text in {columns[0]} and {columns[1]}: "
                 f"each sentence would be paired with itself; check {_setting_of(columns[1], args)}")  # fmt: skip
    labels = raw["train"][args.label_column] if args.label_column in raw["train"].column_names else []
    answers: dict[tuple, set] = {}
    for row, label in zip(train, labels, strict=False):
        if isinstance(label, (str, int, bool)):  # classes; not numbers to predict or label lists
            answers.setdefault(row, set()).add(label)
    torn = [(row, sorted(map(str, a))) for row, a in answers.items() if len(a) > 1]
    if torn and len(seen) > 1:  # the same sample with two answers (all the same: said above)
        many = "images (the same bytes)" if images else f"{what}s"
        example = "" if images else f", e.g. {str(torn[0][0][0])[:40]!r}: {' and '.join(torn[0][1][:3])}"
        warn(f"{len(torn)} of the {len(answers)} distinct training {many} appear with different labels (the same "
             f"{'image' if images else what} once as one class and once as another{example}): the model cannot "
             f"learn them; check the labels{' (an image copied into two class folders?)' if images else ''}")
    for split in ("validation", "test"):
        if split in raw and not (split in files and files[split] == files.get("train")):
            shared = sum(row in seen for row in rows(raw[split]))
            if shared and shared * 2 >= len(raw[split]):
                warn(f"{shared} of the {len(raw[split])} {split} samples are also training samples (the same "
                     f"{what}): their scores measure samples the model trained on; give {split} samples that are "
                     "not in the training data")


def another_scale(trained, values, what: str) -> str | None:
    """Regression targets (`values`, of `what`) mostly far outside the range of the `trained` targets (0-1
    in training, 0-100 here): another scale, on which a model trained on the first is scored. The line's
    start, or None."""
    import numpy as np

    trained = np.asarray(trained, dtype=np.float64).ravel()
    trained, values = trained[np.isfinite(trained)], np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if not len(trained) or not len(values):
        return None
    lo, hi = float(trained.min()), float(trained.max())
    span = max(hi - lo, 1e-12)
    far = values[(values < lo - span) | (values > hi + span)]
    if len(far) * 2 < len(values):
        return None
    return (f"{len(far)} of the {len(values)} {what} lie far outside the training targets' range {lo:g} to {hi:g} "
            f"(they span {float(values.min()):g} to {float(values.max()):g}): another scale?")


def _warn_another_scale(raw: DatasetDict) -> None:
    """A validation or test file's regression targets on another scale than training's (another_scale)."""
    for split in ("validation", "test"):
        said = another_scale(raw["train"]["labels"], raw[split]["labels"], f"{split} targets") if split in raw else None
        if said:
            warn(f"{said} the model predicts on the training scale; put every split on the same scale")


def _compared_columns(train: HFDataset, args: DataArgs) -> list[str]:
    """The columns that make a sample what it is (its texts, words or image), as far as the data has them."""
    images = task_of(args.task).modality == "image"
    return [c for c in ([args.image_column] if images else args.input_columns) if c in train.column_names]


def _sample_rows(ds: HFDataset, columns: list[str], images: bool) -> list[tuple]:
    """Each row's values in `columns`, hashable (a list of words as a tuple; an image as its bytes' digest: an
    image folder copied into another class or split is the same bytes): rows to compare across splits."""
    if images:
        return [(_image_digest(cell),) for cell in ds.cast_column(columns[0], Image(decode=False))[columns[0]]]
    return [tuple(tuple(v) if isinstance(v, list) else v for v in row) for row in zip(*(ds[c] for c in columns), strict=True)]


def _warn_held_out_repeats(train: HFDataset, file_rows: dict[str, list[int]], args: DataArgs) -> None:
    """A training file that repeats its samples (every row written twice): the share held out for validation
    is then mostly copies of samples kept for training, as a validation_file would be (`_warn_shared_samples`)."""
    columns = _compared_columns(train, args)
    if not columns:
        return
    images = task_of(args.task).modality == "image"
    values = _sample_rows(train, columns, images)
    kept = {values[i] for i in file_rows["train"]}
    held = file_rows["validation"]
    shared = sum(values[i] in kept for i in held)
    if held and shared * 2 >= len(held):
        source = "folder" if images and args.data_dir else "file"  # an image folder, or a file of image paths
        warn(f"{shared} of the {len(held)} validation samples held out of the training {source} are also training "
             f"samples (the {source} repeats them, the same "
             f"{'image bytes' if images else ' and '.join(columns)}): their scores measure samples the model "
             "trained on; remove the repeated rows, or give a validation_file")


def _warn_same_files(args: DataArgs, files: dict[str, Path]) -> None:
    """One split's file given again as another's: scores that measure what they seem not to."""
    if "validation" in files and files["validation"] == files.get("train"):  # the verdict would be on seen samples
        warn(f"validation_file is the train_file ({args.files['train']}): validation scores and the model chosen "
             "by them measure samples it trained on; give a separate file, or leave validation_file out to hold "
             "out a share (validation_split_percentage)")
    if "test" in files and files["test"] == files.get("train"):
        warn(f"test_file is the train_file ({args.files['train']}): test scores measure samples the model trained "
             "on; give a separate test file")
    elif "test" in files and files["test"] == files.get("validation"):
        warn(f"test_file is the validation_file ({args.files['test']}): the test scores are then validation's, the "
             "split that judged the run (and chose its best checkpoint or threshold, where those are tuned); give a "
             "separate test file, or test_file=null")


def load_splits(args: DataArgs) -> tuple[DatasetDict, list[str]]:
    """Raw splits with encoded `labels` (class ids; numbers or multi-hot vectors, finetune/problems.py);
    a seeded validation split (stratified by class) when there is none."""
    raw = load_raw(args.files, args.dataset_name, args.dataset_config_name, args.data_dir,
                   conll_columns=(args.tokens_column, args.tags_column))  # fmt: skip
    for split in raw:
        if len(raw[split]) == 0:
            raise UserError(f"{_the(split)} has no rows; check the file or folder")
        check_columns(raw[split], split, args, train_columns=None if split == "train" else raw["train"].column_names)
    files = {s: Path(f).resolve() for s, f in args.files.items() if f}
    _warn_same_files(args, files)
    _warn_shared_samples(raw, args, files)
    problem = infer_problem_type(raw["train"], args)  # regression and multi-label: finetune/problems.py
    raw = ids_read_through_label_names(raw, args, problem)
    if problem == SINGLE:
        column = args.label_column
        _refuse_joined_tags(raw["train"].select_columns([column])[:200][column], column, "train")
        label_names = resolve_label_names(raw["train"], args.label_column, args.label_names)
    else:
        if problem == MULTI and not args.label_columns:
            _check_list_label_texts(raw["train"], args.label_column)
        label_names = label_names_for(raw["train"], args, problem)
        if problem == TOKENS:
            _check_tag_set(label_names, bool(args.label_names))
    raw = DatasetDict({s: encode_split(d, args, problem, label_names, s) for s, d in raw.items()})
    if problem == REGRESSION:
        _warn_another_scale(raw)
    file_rows: dict[str, list[int]] = {}  # a held-out split's rows: their rows in the training file (0-based)
    if "validation" not in raw:
        held_out = args.validation_split_percentage / 100
        # Stratified by class for single-label; a seeded random share for numbers and label sets. Split by
        # row number (the same draw as splitting the data itself), so that each row's place in the file is known.
        stratify = {"stratify_by_column": "labels"} if problem == SINGLE else {}
        rows = raw["train"].select_columns(["labels"]).add_column("file_row", list(range(len(raw["train"]))))
        try:
            parts = rows.train_test_split(test_size=held_out, seed=args.seed, **stratify)
        except ValueError as e:
            looks = _what_the_labels_look_like(label_names)
            ints = sorted(int(n) for n in label_names if re.fullmatch(r"\s*-?\d+\s*", n))
            counts = Counter(raw["train"]["labels"])
            single = sum(counts[i] == 1 for i in range(len(label_names)))
            misspelt = _misspelt_class(label_names, counts, args.label_names)
            if not looks and misspelt:
                looks = f"{misspelt} fix that label in the data"
            if not looks and len(label_names) * 2 > len(raw["train"]) >= 10 and single * 2 > len(label_names):
                # an id or a text column as the label?
                looks = (f"{len(label_names)} classes for {len(raw['train'])} samples, most with one sample each: is "
                         f"'{args.label_column}' an id or a text column? set label_column to the column of classes")
            if not looks and len(ints) == len(label_names) > 10:  # 0..39: scores, too rare to be classes?
                looks = (f"{len(ints)} classes, the whole numbers {ints[0]} to {ints[-1]}: scores to predict as numbers? "
                         "then set problem_type=regression")
            if not looks and len(ints) == len(label_names) >= 3 and ints == list(range(1, ints[-1] + 1)):
                # 1 to 5: stars or grades, most likely (class ids count from 0, and get no hint)
                looks = (f"the classes are the whole numbers 1 to {ints[-1]}: if they are scores (stars, "
                         "grades), problem_type=regression predicts them as numbers and needs no sample of each")
            if not looks and args.validation_split_percentage < 1:  # 0.5 meant as a share: half a percent
                looks = (f"validation_split_percentage={args.validation_split_percentage:g} is a percentage: it holds "
                         f"out {args.validation_split_percentage:g}% of the samples; for half of them write 50")
            n, k = len(raw["train"]), len(label_names)
            need, room = math.ceil(100 * k / n), math.floor(100 * (n - k) / n)  # one of each held out, one left
            if not looks and min(counts.values()) >= 2 and need <= room and need > args.validation_split_percentage:
                looks = (f"the held-out share must hold one sample of each of the {k} classes: "
                         f"validation_split_percentage={need} or more (at most {room}, to leave one of each)")
            if not looks and len(raw["train"]) < 10:  # a few rows to try the app (an id column needs more to tell)
                looks = f"{len(raw['train'])} training samples: too few to hold out one of each class"
            raise UserError(
                f"cannot hold out a stratified validation split: {first_line(e)}{f' ({looks})' if looks else ''}"
                "; give a validation_file, or enough samples of every class (2 or more) and a "
                "validation_split_percentage whose share holds one of each"
            ) from None
        file_rows = {"train": list(parts["train"]["file_row"]), "validation": list(parts["test"]["file_row"])}
        _warn_held_out_repeats(raw["train"], file_rows, args)
        if held_out > 0.5 or held_out < 0.01:  # 95 for 5, or for 0.95? 0.2 for a fifth (Trainer's fraction)?
            warn(f"validation_split_percentage={args.validation_split_percentage:g} holds out "
                 f"{len(parts['test'])} of the {len(rows)} training samples and trains on {len(parts['train'])}; "
                 "it is the percentage held out for validation (10 holds out a tenth, 0.2 a five-hundredth)")
    looks = _what_the_labels_look_like(label_names) if problem == SINGLE and not args.label_names else ""
    misspelt = _misspelt_class(label_names, Counter(raw["train"]["labels"]), args.label_names) if problem == SINGLE else ""
    unlabelled = _no_label_mark(label_names, Counter(raw["train"]["labels"])) if problem == SINGLE else ""
    if unlabelled and not args.label_names:
        warn(f"label column '{args.label_column}' holds {unlabelled}; drop those rows (or list the label in "
             "label_names to keep it as a class)")
    if misspelt:  # 'positve' once beside 'positive' 180 times: a class of its own, never learned
        warn(f"label column '{args.label_column}' holds {misspelt} fix the label in the data, or list both in "
             "label_names if they are two classes")
    if looks:  # trained as classes, as asked; but say so (once the split held)
        warn(f"training a classifier of {looks}; list them in label_names to keep them as classes without "
             "this warning")
    elif problem == SINGLE and not args.label_names and len(label_names) * 2 > len(raw["train"]) > 2:
        warn(f"label column '{args.label_column}' holds {len(label_names)} classes for {len(raw['train'])} training "
             "samples, most with one sample each: is it an id or a text column? set label_column to the column of "
             "classes (or list them in label_names to keep them as classes without this warning)")
    if file_rows:  # the held-out split, drawn above
        raw["train"], raw["validation"] = (raw["train"].select(file_rows["train"]),
                                           raw["train"].select(file_rows["validation"]))  # fmt: skip
    for split, limit in (
        ("train", args.max_train_samples),
        ("validation", args.max_eval_samples),
        ("test", args.max_test_samples),
    ):
        if limit is not None and split in raw and len(raw[split]) > limit:
            raw[split] = raw[split].select(range(limit))
    if problem == SINGLE and args.max_train_samples is not None and len(set(raw["train"]["labels"])) < 2:
        only = label_names[raw["train"][0]["labels"]]
        raise UserError(
            f"max_train_samples={args.max_train_samples} leaves the training data one class ({only!r}: the first "
            f"{args.max_train_samples} rows are taken); a classifier needs at least two: raise max_train_samples"
        )
    if problem == SINGLE and "validation" in raw and len(raw["validation"]) > 1:
        held = set(raw["validation"]["labels"])
        if len(held) == 1:  # its accuracy is that of always answering that class: "learned" cannot be judged there
            only = label_names[next(iter(held))]
            warn(f"the validation data holds one class ({only!r}) of the {len(label_names)}: its scores are those of "
                 "always answering it, and cannot tell whether the model learned; give validation data with every "
                 "class, or leave validation_file out to hold out a stratified share of train")  # fmt: skip
    for split, rows_of in file_rows.items():  # read by the notices (finetune/tasks.py: a tag's row)
        raw[split].file_rows = rows_of[: len(raw[split])]
    return raw, label_names


def warn_repeated_labels(lists: list, column: str, where: str) -> None:
    """Multi-label lists of names: a name written twice in one list (["a", "a"]: a typo for another
    label?) counts once, which is said in one line. `where`: whose rows ("training", an evaluated file)."""
    repeated = [(row, labels) for row, labels in enumerate(lists)
                if isinstance(labels, list) and len(labels) != len({str(v) for v in labels})]  # fmt: skip
    if repeated:
        row, labels = repeated[0]
        warn(f"{len(repeated)} {where} row(s) of label column '{column}' name a label twice (row {row + 1}: "
             f"{labels}): it counts once; a typo for another label? check those rows")  # fmt: skip


def _check_list_label_texts(train: HFDataset, column: str) -> None:
    """Multi-label lists of names: names that differ only by surrounding spaces would be two labels; a name
    written twice in one list is said once (`warn_repeated_labels`)."""
    stripped: dict[str, str] = {}
    lists = train[column]
    warn_repeated_labels(lists, column, "training")
    for row, labels in enumerate(lists):
        for name in labels or []:
            if not isinstance(name, str):
                continue
            twin = stripped.setdefault(name.strip(), name)
            if twin != name:
                raise UserError(
                    f"label column '{column}' holds {twin!r} and {name!r} (row {row + 1}), which differ only by "
                    "spaces and would be two labels; strip the spaces in the data"
                )


def _check_tag_set(tags: list[str], named: bool) -> None:
    """Every tag of the tag set is IOB2 (strict IOB2 scoring reads no other), or the set is plain (parts of
    speech, `tasks.plain_tags`); the data's own tags were checked with their rows (finetune/tasks.py), so
    this names the tags of label_names or of a ClassLabel."""
    plain = plain_tags(tags)
    for tag in tags:
        why = tag_problem(str(tag), plain)
        if why:
            where = "label_names' tag" if named else "the tags column's tag name"
            raise UserError(f"{where} {str(tag)!r} {why}")


def encode_split(ds: HFDataset, args: DataArgs, problem: str, label_names: list[str], split: str) -> HFDataset:
    """One split's labels into `labels`, by name, in `label_names` order (class ids, numbers or
    multi-hot vectors); a label the names do not know is a UserError."""
    if problem == SINGLE:
        return encode_labels(ds, args.label_column, label_names, split)
    return encode(ds, args, problem, label_names, split)


def prepare_splits(args: DataArgs, raw: DatasetDict, preprocessor, num_channels: int = 3) -> DatasetDict:
    """Every split as the model reads it (the task's preparation; training augmentation on "train")."""
    task = task_of(args.task)
    return DatasetDict({s: task.prepare(d, preprocessor, args, s, num_channels) for s, d in raw.items()})


def load_path(path: Path, args: DataArgs) -> DatasetDict:
    """What `--data` names: a file (one split, "data"), a folder of data files named by split
    (train.csv, test.jsonl, ...), or an image folder (<dir>/<split>/<label>/<image>)."""
    columns = (args.tokens_column, args.tags_column)
    if path.is_file() and path.suffix.lower() in (*_image_suffixes(), *UNREADABLE_PHOTOS):
        raise UserError(f"--data {path} is one image; give a folder of images (an image folder: a subfolder per "
                        "class, as in training)")  # fmt: skip
    if path.is_file():
        return load_raw({"data": str(path)}, None, None, None, require_train=False, conll_columns=columns)
    named = {
        re.sub(r"\W", "_", p.stem): str(p)  # datasets' split names are words
        for p in sorted(path.iterdir())
        if p.is_file() and p.suffix.lower() in FILE_BUILDERS
    }
    if named:
        return load_raw(named, None, None, None, require_train=False, conll_columns=columns)
    if args.task and task_of(args.task).modality != "image":  # not an image folder's model: no images asked for
        raise UserError(f"--data {path} is a folder without data files ({KINDS}); give a file, or a folder of files "
                        "named by split (test.csv, validation.jsonl, ...)")  # fmt: skip
    return load_raw({}, None, None, str(path), require_train=False)


def infer_task(args: DataArgs) -> str:
    """The task the training data holds, for a config that leaves `task` null (finetune/tasks.py)."""
    train = {"train": args.train_file} if args.train_file else {}
    raw = load_raw(train, args.dataset_name, args.dataset_config_name, args.data_dir,
                   conll_columns=(args.tokens_column, args.tags_column))  # fmt: skip
    return task_for_data(raw["train"].features, args)


# A first line of these (word, tag; TOKEN, NE...) is a table's header, not a token: CoNLL files have none.
CONLL_HEADER_WORDS = {"word", "words", "token", "tokens", "form", "tag", "tags", "ner", "ner_tag", "ner_tags", "ne",
                      "label", "labels", "iob", "bio", "entity"}  # fmt: skip


# A CoNLL-U file (Universal Dependencies): ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC.
CONLLU_COLUMNS, CONLLU_UPOS = 10, 3


def read_conll(path: str, split: str, tokens_column: str, tags_column: str) -> HFDataset:
    """A CoNLL/IOB2 text file as sentences: {tokens_column: [words], tags_column: [tags]}.

    One token per line (tab- or space-separated columns), a blank line between sentences, `#` comments
    and `-DOCSTART-` lines skipped (a line `# O` is the word # and its tag). The word is the first column, or the second when the first is a
    running index (UD and UNER files); the tag is the last column of the first token line that reads
    as a tag (O, or B-/I-/E-/S- and a type: CoNLL-2003's chunk tags stand before its NER tags), else the
    last column; in a CoNLL-U file (ten columns, an index first) with no such column, UPOS, the fourth,
    and its multiword-token ranges (1-2) and empty nodes (8.1) are skipped. A file of
    one column is words without tags (data to predict: no tags column). A line with another number of
    columns than the file's first token line is refused with its line number; so is a file that is not
    UTF-8. Read by hand: datasets has no CoNLL builder (its hub scripts are gone)."""
    sentences, words, tags, columns, tag_at, first = [], [], [], None, -1, None
    try:
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
                hash_word = fields[0].startswith("#") and len(fields) == (columns or 2) and bool(
                    A_TAG.fullmatch(fields[tag_at if columns else -1]))
                if (text.startswith("#") and not text.startswith("#\t") and not hash_word) or fields[0] == "-DOCSTART-":
                    continue
                if len(fields) == CONLLU_COLUMNS and re.fullmatch(r"\d+[-.]\d+", fields[0]):
                    continue  # CoNLL-U: a multiword token's range (1-2 don't) or an empty node (8.1), not a word
                if columns is None:
                    if (len(fields) >= 2 and not A_TAG.fullmatch(fields[-1])
                            and {fields[0].lower(), fields[-1].lower()} & CONLL_HEADER_WORDS):  # fmt: skip
                        raise UserError(f"{split} file {path} line {number} looks like a header ({' '.join(fields)!r}): a "
                                        "CoNLL file has none, only a token and its tag on each line; delete that line")  # fmt: skip
                    columns = len(fields)
                    looks = [i for i, f in enumerate(fields) if i and A_TAG.fullmatch(f)]
                    tag_at = looks[-1] if looks else -1
                    if not looks and columns == CONLLU_COLUMNS and fields[0].isdigit():
                        tag_at = CONLLU_UPOS  # a CoNLL-U file (UD): its universal part-of-speech column
                if len(fields) != columns or (columns < 2 and Path(path).suffix.lower() == ".txt"):
                    what = f"the file's first token line has {columns}" if columns >= 2 else "a token and its tag"
                    if Path(path).suffix.lower() == ".txt":  # often a CSV or TSV saved as .txt
                        raise UserError(
                            f"{split} file {path} line {number} has {len(fields)} column(s), {what}: a .txt file is "
                            "read as CoNLL (a token and its tag on each line, a blank line between sentences); a "
                            "CSV file should be named .csv (a tab-separated one .tsv), words alone to tag (one a "
                            "line) .conll"
                        )
                    commas = text.split(",")
                    if len(commas) >= 2 and A_TAG.fullmatch(commas[-1].strip()):  # a CSV of words renamed .conll
                        raise UserError(
                            f"{split} file {path} line {number} separates its fields with commas ({text[:60]!r}): a "
                            "CoNLL file holds a token and its tag separated by a space or a tab; a table of words "
                            "is a .csv, read as a sentence per row (a list of words beside a list of tags)"
                        )
                    raise UserError(
                        f"{split} file {path} line {number} has {len(fields)} column(s), {what}; each line holds "
                        "a token and its tag (the tag last), a blank line between sentences"
                    )
                if first is None:
                    first = (number, fields)
                words.append(fields[1] if columns > 2 and fields[0].isdigit() else fields[0])
                tags.append(fields[tag_at] if columns > 1 else None)
    except UnicodeDecodeError as e:
        raise UserError(f"{split} file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    if words:
        sentences.append((words, tags))
    if not sentences:
        raise UserError(f"{_the(split)} has no rows ({path}): no token lines; check the file")
    longest = max(len(w) for w, _ in sentences)
    # No blank lines: the file reads as one sentence (or a few, around a stray blank line). A file of many
    # sentences has its blank lines, whatever the length of one of them (split into windows for the model).
    if longest > 100 and longest * 2 > sum(len(w) for w, _ in sentences) and len(sentences) <= 3:
        raise UserError(
            f"{split} file {path} reads as {len(sentences)} sentence(s), one of {longest} words: a CoNLL file has a "
            "blank line after each sentence; put them in (a file without them reads as one long sentence)"
        )
    if columns == 1:  # words alone, one a line: sentences to tag (evaluation predicts them; training needs tags)
        return HFDataset.from_dict({tokens_column: [w for w, _ in sentences]})
    _check_conll_columns(split, path, sentences, first)
    return HFDataset.from_dict({tokens_column: [w for w, _ in sentences], tags_column: [t for _, t in sentences]})


def _check_conll_columns(split: str, path: str, sentences: list, first: tuple[int, list[str]] | None) -> None:
    """Words read as tags: the file's tag column comes first (`B-PER Ada`), so its words are read as the
    tags. Said when no tag read looks like a tag and every word does."""
    tags = [t for _, row in sentences for t in row]
    words = [w for row, _ in sentences for w in row]
    if any(A_TAG.fullmatch(t) for t in tags) or not all(A_TAG.fullmatch(w) for w in words):
        return
    number, fields = first or (0, [])
    raise UserError(
        f"{split} file {path}: the tag column seems to be the first (line {number} reads {' '.join(fields)!r}), so "
        "its words would be read as tags; put each word first and its tag last (Ada B-PER)"
    )
