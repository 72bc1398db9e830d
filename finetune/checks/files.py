"""Files: a data file's path, its bytes (read once, as a `FileHead`), why the parser failed on it, and what
a parse that succeeded hides (finetune/data.py's `read_file` asks these, in this order).

    PATH          before the file is opened: a URL, a path that is not there, an empty or unreadable file
    HEAD          the bytes only the file shows: a workbook, a compressed file, another delimiter, not UTF-8
    PARSE_FAILED  the parser refused it: the line that is wrong, and why (read again only then)
    PARSED        what a parse that succeeded hides: a pandas layout read as one row
    CONLL_*       the CoNLL reader's findings (a line of another width, a header, no blank lines)
    FOLDER        a folder given as data_dir or --data, and a hub dataset that does not load
    SPLIT_FILES   the files a folder holds for one split, which datasets joins: their columns, by their headers

A good file is read once here, by `FileHead.read` (its sha256, its first MiB and whether it is UTF-8 in one
pass), and once by the parser.
"""

from __future__ import annotations

import codecs
import csv
import functools
import hashlib
import io
import itertools
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.checks import rule
from finetune.errors import first_line
from finetune.formats import (
    A_TAG,
    COMPRESSED,
    CONLL_HEADER_WORDS,
    FILE_BUILDERS,
    KINDS,
    TEXT_FORMATS,
    delimiter_of,
)
from finetune.text import shown

# The csv module's reading of a failed file (a ragged row) must not fail on a long document that pandas reads.
csv.field_size_limit(2**31 - 1)

HEAD_BYTES = 1 << 20  # what the rules read of a file: its first MiB
ZERO_LED = re.compile(r"\s*[+-]?0\d+\s*")  # 007, 0123: a number that would lose its zeros (finetune/data.py)


class _Tap(io.RawIOBase):
    """A binary file read through: its sha256 and its first MiB kept as the bytes go by."""

    def __init__(self, f):
        self.f, self.digest, self.head, self.size = f, hashlib.sha256(), bytearray(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.f.readinto(buffer)
        chunk = memoryview(buffer)[:n]
        self.digest.update(chunk)
        if len(self.head) < HEAD_BYTES:
            self.head += chunk[: HEAD_BYTES - len(self.head)]
        self.size += n
        return n

    def drain(self) -> None:
        while self.readinto(bytearray(1 << 20)):
            pass


def _not_utf8_at(path: str) -> tuple[int, int] | None:
    """(line, byte) of a file's first byte that is not UTF-8, or None: in chunks of 1 MiB."""
    decoder, line, offset = codecs.getincrementaldecoder("utf-8")(), 1, 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                return line + chunk[: e.start].count(b"\n"), offset + e.start
            line, offset = line + chunk.count(b"\n"), offset + len(chunk)
    return None


QUOTED_FIELD = re.compile(r'"(?:[^"]|"")*"')  # a field a quoting writer enclosed, its own quotes doubled


@dataclass
class FileHead:
    """A data file as the rules see it, read once: its size, sha256 (the fingerprint a resume and
    results.json keep), its first MiB, where it stops being UTF-8, and for a CSV the columns in which a
    value is written with a leading zero."""

    split: str
    path: str
    size: int
    head: bytes
    sha256: str
    not_utf8: tuple[int, int] | None  # (line, byte) of the first byte that is not UTF-8, for a text format
    zero_columns: frozenset = frozenset()  # a CSV's columns (by header name) holding a value such as 007
    _text: str | None = field(default=None, repr=False)

    @classmethod
    def read(cls, split: str, path: str) -> FileHead:
        """One pass over the bytes: the digest and the head as they go by, while a text format is decoded
        as UTF-8 and a CSV's cells are read by the csv module (for the leading zeros)."""
        suffix, bad, zeros = Path(path).suffix.lower(), None, set()
        with open(path, "rb") as f:
            tap = _Tap(f)
            if suffix in TEXT_FORMATS:
                text = io.TextIOWrapper(io.BufferedReader(tap, 1 << 20), encoding="utf-8-sig", newline="")
                try:
                    if suffix in (".csv", ".tsv"):
                        zeros = _zero_led(csv.reader(text, delimiter=delimiter_of(path)))
                    else:
                        while text.read(1 << 20):
                            pass
                except UnicodeDecodeError:
                    bad = _not_utf8_at(path)  # only a file that is not UTF-8 is read again, to name the place
                except csv.Error:  # a NUL byte, a field past the limit: the parser says what it makes of it
                    pass
            tap.drain()
        return cls(split, path, tap.size, bytes(tap.head), tap.digest.hexdigest(), bad, frozenset(zeros))

    @property
    def suffix(self) -> str:
        return Path(self.path).suffix.lower()

    @property
    def builder(self) -> str | None:
        return FILE_BUILDERS.get(self.suffix)

    @property
    def text(self) -> str:
        """The head as text (undecodable bytes replaced)."""
        if self._text is None:
            self._text = self.head.decode("utf-8", errors="replace")
        return self._text

    @functools.cached_property
    def whole(self) -> str:
        """The whole file as text, its line ends as written: read again, only to explain a parse that failed."""
        with open(self.path, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()

    @property
    def header(self) -> str:
        return self.text.split("\n", 1)[0].strip()

    @functools.cached_property
    def squad_nested(self) -> bool:
        """A .json file in SQuAD's own nested layout ({"version", "data": [{"title", "paragraphs": [{"context",
        "qas": [...]}]}]}): read by finetune/squad.py's flatten_squad into the Hub's squad rows."""
        return (self.suffix == ".json" and self.text.lstrip("\ufeff \t\r\n").startswith("{")
                and re.search(r'"paragraphs"\s*:', self.text) is not None and '"qas"' in self.text)  # fmt: skip

    @functools.cached_property
    def quotes_are_text(self) -> bool:
        """A .tsv whose quotes are characters of its texts (GLUE's TSVs, written without quoting: `5" screen`),
        read so: no field of the head is enclosed in quotes, as a writer that quotes (pandas) leaves one on a
        line, or around a text with line breaks (a field that spans lines and holds no tab of other rows)."""
        if self.suffix != ".tsv" or '"' not in self.text:
            return False
        fields = (f for line in self.text.splitlines()[1:] for f in line.rstrip("\r").split("\t"))
        if any(len(f) >= 2 and QUOTED_FIELD.fullmatch(f) for f in fields):
            return False
        width = len(self.names())
        try:
            rows = list(csv.reader(io.StringIO(self.text, newline=""), delimiter="\t"))[1:-1]  # the last may be cut
        except csv.Error:
            return False
        return not any(len(r) == width and any("\n" in f and "\t" not in f for f in r) for r in rows)

    def names(self) -> list[str]:
        """The header's fields, as the csv module reads them."""
        return next(csv.reader(self.text.splitlines()[:1] or [""], delimiter=delimiter_of(self.path)), [])


def _zero_led(rows) -> set[str]:
    """The columns (by the header's names) in which a cell is a number written with a leading zero."""
    header = next(rows, [])
    found: set[int] = set()
    for row in rows:
        found.update(i for i, cell in enumerate(row) if i not in found and ZERO_LED.fullmatch(cell))
    return {header[i] for i in found if i < len(header)}


def _the(split: str) -> str:
    """How a message names a split: "the train data"; a file read on its own (evaluation's --data) is "the data"."""
    return "the data" if split == "data" else f"the {split} data"


# --- the path ------------------------------------------------------------------------------------------


@rule("files.url")
def url(split: str, path: str) -> str | None:
    """A URL as a data file: files are read from this machine, so "not found" would mislead."""
    if re.match(r"(https?|s3|gs|hf)://", str(path)):
        return (f"{split} file {path} is a URL; files are read from this machine: download it first and give its path "
                "(or dataset_name= for a data set on the Hugging Face hub)")
    return None


@rule("files.several_files")
def several_files(split: str, path: str) -> str | None:
    """`train_file=a.csv,b.csv` (the Hub's data_files habit): a split is one file."""
    parts = [p.strip() for p in str(path).split(",")]
    if not Path(path).exists() and len(parts) > 1 and all(Path(p).is_file() for p in parts):
        return f"{split} file {path} names {len(parts)} files; a split is one file: join them into one (the same columns)"
    return None


@rule("files.pattern")
def pattern(split: str, path: str) -> str | None:
    """A glob the shell did not expand (`data/*.csv`)."""
    if not Path(path).exists() and not Path(path).is_symlink() and any(c in str(path) for c in "*?["):
        return f"{split} file {path} is a pattern; a split is one file: give its path (join the matching files into one first)"
    return None


def _where_read(path: str) -> str:
    """For a path not found: where a relative one was read from, and a Windows path said as one."""
    said = "" if Path(path).expanduser().is_absolute() else f" (read from the current folder, {Path.cwd()})"
    posix = str(path).replace("\\", "/")
    if "\\" in str(path) and os.sep == "/":  # C:\data\train.csv, data\train.csv
        said += ("; it is a Windows path (a drive letter): give the file's path on this machine, with '/' between "
                 "folders" if re.match(r"[A-Za-z]:/", posix) else "; it is written with backslashes, as on Windows: "
                 f"here folders are separated by '/' ({posix})")  # fmt: skip
    return said


@rule("files.saved_dataset_folder")
def saved_dataset_folder(split: str, path: str) -> str | None:
    """A folder that datasets' save_to_disk wrote, given as a data file: its .arrow files are the data."""
    p = Path(path)
    if p.is_dir() and (p / "dataset_dict.json").is_file():
        splits = sorted(q.name for q in p.iterdir() if (q / "state.json").is_file())
        return (f"{split} file {path} is a DatasetDict that datasets' save_to_disk wrote (splits: {', '.join(splits)}); "
                f"give each split's .arrow file, e.g. train_file={p / (splits or ['train'])[0] / 'data-00000-of-00001.arrow'}")
    arrows = sorted(p.glob("*.arrow")) if p.is_dir() and (p / "state.json").is_file() else []
    if arrows:
        return (f"{split} file {path} is a dataset that datasets' save_to_disk wrote; give its .arrow file "
                f"({arrows[0]}{' and the others' if len(arrows) > 1 else ''})")
    return None


@rule("files.not_a_file")
def not_a_file(split: str, path: str) -> str | None:
    """A data file's path that names something else: a dangling link or a link loop, a folder, a device."""
    p = Path(path)
    if p.is_file():
        return None
    if p.is_symlink() and not p.exists():
        try:
            p.resolve(strict=True)
        except RuntimeError:  # Python reports a symlink loop this way
            return f"{split} file {path} is a symlink loop; point it at the data file"
        except OSError:
            pass
        return f"{split} file {path} is a symlink to {os.readlink(p)}, which does not exist"
    if p.is_dir():
        return f"{split} file {path} is a folder, not a file; give a data file (an image folder goes in data_dir)"
    if p.exists():  # /dev/null, a pipe, a socket
        return f"{split} file {path} is not a regular file (a device, pipe or socket); give a data file"
    return f"{split} file not found: {path}{_where_read(path)}"


@rule("files.empty")
def empty(split: str, path: str) -> str | None:
    """A data file of 0 bytes."""
    if Path(path).stat().st_size == 0:
        return f"{split} file is empty: {path} (0 bytes); save it with its samples, or name another file"
    return None


@rule("files.unreadable")
def unreadable(split: str, path: str) -> str | None:
    """A data file the process may not read."""
    if not os.access(path, os.R_OK):
        return f"{split} file {path} is not readable (permission denied); check its permissions"
    return None


PATH = [url, several_files, pattern, saved_dataset_folder, not_a_file, empty, unreadable]


# --- the bytes -------------------------------------------------------------------------------------------


def _workbook(head: FileHead) -> bool:
    """An .xlsx/.ods (a zip holding the sheets) or an old .xls (an OLE2 compound file)."""
    if head.head.startswith(b"\xd0\xcf\x11\xe0"):
        return True
    if not head.head.startswith(COMPRESSED["zip"]):
        return False
    try:
        with zipfile.ZipFile(head.path) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    by_name = head.suffix in (".xlsx", ".xlsm", ".ods", ".numbers")  # by its name, whatever it holds
    return by_name or any(n.startswith("xl/") for n in names) or "content.xml" in names and "mimetype" in names


@rule("files.workbook")
def workbook(head: FileHead) -> str | None:
    """A spreadsheet workbook (Excel's .xlsx or .xls, LibreOffice's .ods) given as a data file."""
    if _workbook(head):
        return (f"{head.split} file {head.path} is a spreadsheet workbook (Excel, LibreOffice), not a data file; save "
                "the sheet as CSV (UTF-8) and give that file")
    return None


@rule("files.git_lfs_pointer")
def git_lfs_pointer(head: FileHead) -> str | None:
    """A Git LFS pointer (a clone without `git lfs pull`): three lines that name the data, not the data."""
    if head.head.startswith(b"version https://git-lfs.github.com/spec/"):
        return f"{head.split} file {head.path} is a Git LFS pointer, not the data: run `git lfs pull` in its repository"
    return None


@rule("files.compressed")
def compressed(head: FileHead) -> str | None:
    """A compressed file (gzip, zip, bzip2, xz, zstd): the parser would read its bytes as text."""
    packed = next((name for name, magic in COMPRESSED.items() if head.head.startswith(magic)), None)
    if packed is not None:
        return f"{head.split} file {head.path} is compressed ({packed}); unpack it and give the file inside ({KINDS})"
    return None


@rule("files.parquet_by_another_name")
def parquet_by_another_name(head: FileHead) -> str | None:
    """A parquet file whose name does not say so: the format is read from the name."""
    if head.head.startswith(b"PAR1") and head.suffix != ".parquet":
        return f"{head.split} file {head.path} is a parquet file; name it {Path(head.path).stem}.parquet"
    return None


@rule("files.unsupported_type")
def unsupported_type(head: FileHead) -> str | None:
    """A file of a type the loader does not read (by its suffix)."""
    if head.builder is None:
        return f"{head.path}: unsupported file type '{head.suffix}'; use {KINDS}"
    return None


@rule("files.not_utf8")
def not_utf8(head: FileHead) -> str | None:
    """A text file that is not UTF-8 (latin-1, a Windows code page): the parser would fail only when a value
    is read, deep in preparation."""
    if head.not_utf8 is not None:
        line, byte = head.not_utf8
        return f"{head.split} file {head.path} is not UTF-8 text (line {line}, byte {byte}); save it as UTF-8"
    return None


def _delimited(head: FileHead) -> bool:
    return head.suffix in (".csv", ".tsv")


@rule("files.excel_separator_line")
def excel_separator_line(head: FileHead) -> str | None:
    """Excel's separator hint (a first line sep=, or sep=;) above the header."""
    if _delimited(head) and re.fullmatch(r"\ufeff?sep=.?", head.header, re.I):
        return (f"{head.split} file {head.path} starts with the line {head.header!r}, a hint for Excel, not the header; "
                "delete that line (the header is the line after it)")
    return None


@rule("files.conll_as_table")
def conll_as_table(head: FileHead) -> str | None:
    """A CoNLL file (a word and its tag on each line) named .csv or .tsv."""
    if not _delimited(head):
        return None
    # CoNLL's first word line, past comments (CoNLL-U's "# sent_id = 1"), -DOCSTART- and blank lines
    word_line = next((line.strip() for line in itertools.islice(head.text.splitlines(), 50) if line.strip()
                      and not line.lstrip("\ufeff").startswith(("#", "-DOCSTART-"))), "")  # fmt: skip
    fields, columns = word_line.split(), word_line.split("\t")
    conllu = len(columns) == 10 and re.fullmatch(r"\d+([-.]\d+)?", columns[0]) and re.fullmatch(r"\d+|_", columns[6])
    if conllu or (2 <= len(fields) <= 4 and A_TAG.fullmatch(fields[-1]) and "," not in word_line):  # "Ada B-PER"
        which = "first line" if word_line == head.header.lstrip("\ufeff") else "first line of words"
        return (f"{head.split} file {head.path} reads as a word and its tag on each line (its {which} is "
                f"{word_line[:80]!r}): a CoNLL file; name it {Path(head.path).stem}.conll")
    return None


@rule("files.comment_above_header")
def comment_above_header(head: FileHead) -> str | None:
    """A `#` comment line where the header belongs."""
    if _delimited(head) and head.header.lstrip("\ufeff").startswith("#") and delimiter_of(head.path) not in head.header:
        return (f"{head.split} file {head.path} starts with the line {head.header[:60]!r}, a comment, where the header "
                "belongs; delete the comment lines above the header")
    return None


# A .csv whose header has no comma but one of these: how it looks, and what this app reads instead.
_SAVE = "comma-separated .csv or tab-separated .tsv: save it with one of those"
OTHER_SEPARATORS = {
    "\t": ("tab-separated", "a .csv as comma-separated: rename it to .tsv"),
    "|": ("separated by |", _SAVE),
    ";": ("semicolon-separated", _SAVE),
}


@rule("files.other_separator")
def other_separator(head: FileHead) -> str | None:
    """A .csv separated by tabs, `|` or `;` (a spreadsheet's export in many locales): it would read as one
    column, or as rows of the wrong length."""
    separator = next((sep for sep in OTHER_SEPARATORS if sep in head.header), None)
    if head.suffix == ".csv" and separator is not None and "," not in head.header:
        looks, fix = OTHER_SEPARATORS[separator]
        return f"{head.split} file {head.path} looks {looks} (its header is {head.header[:80]!r}); this app reads {fix}"
    return None


@rule("files.tsv_of_commas")
def tsv_of_commas(head: FileHead) -> str | None:
    """A comma-separated file named .tsv, which is read as tab-separated."""
    if head.suffix == ".tsv" and "\t" not in head.header and "," in head.header:
        return (f"{head.split} file {head.path} looks comma-separated (its header is {head.header[:80]!r}), but a .tsv "
                f"file is read as tab-separated; name it {Path(head.path).stem}.csv")
    return None


@rule("files.column_twice")
def column_twice(head: FileHead) -> str | None:
    """A CSV header that names a column twice: the parser renames one (label, label.1) and reads the first."""
    names = head.names() if _delimited(head) else []
    repeated = next((n for i, n in enumerate(names) if n and n in names[:i]), None)
    if repeated is not None:
        return (f"{head.split} file {head.path} has the column {repeated!r} twice in its header; rename or remove one "
                "of them (only the first would be read)")
    return None


HEAD = [git_lfs_pointer, workbook, compressed, parquet_by_another_name, unsupported_type, not_utf8, excel_separator_line,
        conll_as_table, comment_above_header, other_separator, tsv_of_commas, column_twice]  # fmt: skip


# --- a parse that failed ------------------------------------------------------------------------------------


def chain(e: BaseException):
    """`e` and the errors it wraps, outermost first: datasets wraps the parser's error in its own."""
    while e is not None:
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # type: ignore[assignment]


def root_cause(e: BaseException) -> str:
    """The first line of the innermost exception."""
    *_, e = chain(e)
    first = first_line(e)
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@rule("files.no_rows")
def no_rows(head: FileHead, error: Exception) -> str | None:
    """A file with a header and no rows (or a parquet file of none)."""
    cause = root_cause(error)
    if "corresponds to no data" in cause or "BatchSize must be greater than 0" in cause:
        return f"{_the(head.split)} has no rows ({head.path}); check the file"
    return None


def cache_failure(e: BaseException) -> str | None:
    """datasets writes every file it reads into its cache (HF_DATASETS_CACHE, under HF_HOME) first: what is
    wrong with the cache, when that is why it failed."""
    import errno

    from datasets import config

    cache = str(config.HF_DATASETS_CACHE)
    for err in chain(e):
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


@rule("files.cache_unwritable")
def cache_unwritable(head: FileHead, error: Exception) -> str | None:
    """The datasets cache, where every file read is copied first, is full or cannot be written: said as such,
    not as a file that is not valid CSV."""
    cache = cache_failure(error)
    return f"could not load the {head.split} file {head.path}: {cache}" if cache else None


def _ragged(head: FileHead) -> tuple[int, int, int, bool] | None:
    """A delimited file's first row of another width than its header: (its first line, its last line, its
    fields, whether a field holds a line break: a quote left open), or None."""
    rows = csv.reader(io.StringIO(head.whole, newline=""), delimiter=delimiter_of(head.path))
    header = next(rows, [])
    start = rows.line_num + 1
    for row in rows:
        if row and len(row) != len(header):
            return start, rows.line_num, len(row), any("\n" in f for f in row)
        start = rows.line_num + 1
    return None


@rule("files.csv_open_quote")
def csv_open_quote(head: FileHead, error: Exception) -> str | None:
    """A quote opened in a CSV field and never closed: the field runs on to a later line."""
    found = _ragged(head) if _delimited(head) else None
    if found and found[3]:
        return (f"{head.split} file {head.path} line {found[0]} opens a quote that no quote closes: the field runs on "
                f"to line {found[1]}; close the quote, or remove it")
    return None


@rule("files.csv_ragged_row")
def csv_ragged_row(head: FileHead, error: Exception) -> str | None:
    """A CSV row with more or fewer fields than the header (an unquoted delimiter inside a field)."""
    found = _ragged(head) if _delimited(head) else None
    if found:
        return (f"{head.split} file {head.path} line {found[1]} has {found[2]} fields, the header has "
                f"{len(head.names())}; fix that row (quote fields that contain the delimiter)")
    return None


class _RepeatedKey(ValueError):
    pass


def _no_repeated_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is not None:
        raise _RepeatedKey(repeated)
    return dict(pairs)


def _json(head: FileHead) -> bool:
    return head.suffix in (".json", ".jsonl")


def _lines(head: FileHead) -> list[tuple[int, str]]:
    return [(n, t) for n, t in enumerate(head.whole.splitlines(), 1) if t.strip()]


def _valid_json(head: FileHead) -> bool:
    try:
        json.loads(head.whole)
        return True
    except json.JSONDecodeError:
        return False


@rule("files.json_comment")
def json_comment(head: FileHead, error: Exception) -> str | None:
    """A comment line in a JSON file (JSON5's, or a hand-edited file's): JSON has none."""
    if not _json(head) or _valid_json(head):
        return None
    comment = next(((n, t.strip()) for n, t in _lines(head) if t.lstrip().startswith(("//", "/*", "#"))), None)
    if comment is not None:
        return (f"{head.split} file {head.path} line {comment[0]} is a comment ({shown(comment[1][:40])}), which JSON "
                "does not allow: remove the comment lines")
    return None


def _first_bad_line(head: FileHead) -> tuple[int, str, Exception | None] | None:
    """JSON Lines: the first line that is no record, or that does not parse after lines that did."""
    lines = _lines(head)
    for i, (number, text) in enumerate(lines):
        try:
            value = json.loads(text, object_pairs_hook=_no_repeated_key)
            if not isinstance(value, dict) and len(lines) > 1:  # valid JSON, but no record
                return number, {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number or null"), None
        except _RepeatedKey as e:
            return number, "", e
        except json.JSONDecodeError as e:
            return (number, "", e) if i > 0 else None  # the first line's: the file is read as one document
    return None


@rule("files.json_key_twice")
def json_key_twice(head: FileHead, error: Exception) -> str | None:
    """A JSON Lines record that sets one key twice (Python's json keeps the last; the parser refuses it)."""
    found = _first_bad_line(head) if _json(head) and not _valid_json(head) else None
    if found and isinstance(found[2], _RepeatedKey):
        return f"{head.split} file {head.path} line {found[0]} has the key {found[2].args[0]!r} twice; keep one of them"
    return None


@rule("files.json_line_not_a_record")
def json_line_not_a_record(head: FileHead, error: Exception) -> str | None:
    """A JSON Lines line that is valid JSON but no record (an array, a string, a number)."""
    found = _first_bad_line(head) if _json(head) and not _valid_json(head) else None
    if found and found[2] is None:
        return (f"{head.split} file {head.path} line {found[0]} holds {found[1]}, not a record: each line of JSON Lines "
                "is one object ({\"text\": ..., \"label\": ...}); fix or remove that line")
    return None


def _one_document(head: FileHead) -> bool:
    """Whether a JSON file is one document (an array or an object over several lines), not JSON Lines."""
    return len(_lines(head)) < 2 or head.whole.lstrip().startswith(("[", "{\n"))


@rule("files.jsonl_commas")
def jsonl_commas(head: FileHead, error: Exception) -> str | None:
    """JSON Lines whose records end with a comma (an array's records written one a line)."""
    if not _json(head) or _valid_json(head) or _one_document(head):
        return None
    lines = _lines(head)
    if len([t for _, t in lines if t.rstrip().endswith("},")]) * 2 >= len(lines):
        return (f"{head.split} file {head.path} is not valid JSON Lines: its lines end with a comma after each record "
                "('},'); JSON Lines has one object a line with nothing between them: remove the commas")
    return None


@rule("files.json_syntax")
def json_syntax(head: FileHead, error: Exception) -> str | None:
    """A JSON file that does not parse: its line and column (a file cut off, a character mistyped)."""
    if not _json(head):
        return None
    try:
        json.loads(head.whole)
        return None  # valid JSON: the problem is its shape, not its syntax
    except json.JSONDecodeError as e:
        line, column, msg = e.lineno, e.colno, e.msg
    found = _first_bad_line(head)
    if found and isinstance(found[2], json.JSONDecodeError):  # JSON Lines whose earlier lines parse: this one
        line, column, msg = found[0], found[2].colno, found[2].msg
    one = _one_document(head)
    return (f"{head.split} file {head.path} is not valid JSON or JSON Lines: line {line} column {column}: "
            f"{msg.removesuffix(' at').lower()}; " + ("fix the file there (cut off or mistyped?)" if one
                                                      else "fix or remove that line"))


@rule("files.unparsable")
def unparsable(head: FileHead, error: Exception) -> str:
    """A file the parser refused for another reason: the parser's own words."""
    return f"could not load the {head.split} file {head.path}: {root_cause(error)}; check that it is valid {head.builder}"


# The order a failed parse is explained in; the last always answers. A pandas layout is asked first (PARSED).
PARSE_FAILED = [no_rows, cache_unwritable, csv_open_quote, csv_ragged_row, json_comment, json_key_twice,
                json_line_not_a_record, jsonl_commas, json_syntax, unparsable]  # fmt: skip


# --- what a parse hides -------------------------------------------------------------------------------------


def pandas_layout(path: str) -> str | None:
    """The orient of a pandas `to_json` file that is not records: 'split' ({"columns", "index", "data"}),
    'table' ({"schema", "data"}), 'columns' (the default: {column: {row index: value}}), 'index' ({row
    index: {column: value}}) or 'values' (lists of lists); None for records or anything else."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None  # not one JSON document (JSON Lines, or damaged)

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


@rule("files.pandas_layout")
def pandas_layout_rule(head: FileHead, rows: int | None) -> str | None:
    """A pandas `DataFrame.to_json` file in another layout than records (orient columns, index, split,
    table, values): read as one row of mappings, or not at all. Asked of a JSON file that parsed as one row
    (`rows`), or did not parse (None)."""
    if head.suffix not in (".json", ".jsonl") or rows not in (None, 1):
        return None
    layout = pandas_layout(head.path)
    if layout is not None:
        return (f"{head.split} file {head.path} is a pandas DataFrame.to_json layout (orient='{layout}'), not one "
                "record per sample; save it with df.to_json(path, orient='records', lines=True) as a .jsonl file")
    return None


PARSED = [pandas_layout_rule]


# --- the CoNLL reader ---------------------------------------------------------------------------------------


@rule("files.conll_header")
def conll_header(split: str, path: str, number: int, fields: list[str]) -> str | None:
    """A CoNLL file whose first line is a table's header (`word tag`): a CoNLL file has none."""
    if len(fields) >= 2 and not A_TAG.fullmatch(fields[-1]) and {fields[0].lower(), fields[-1].lower()} & CONLL_HEADER_WORDS:
        return (f"{split} file {path} line {number} looks like a header ({' '.join(fields)!r}): a CoNLL file has none, "
                "only a token and its tag on each line; delete that line")
    return None


CONLL_FIRST_LINE = [conll_header]


def _what(columns: int) -> str:
    return f"the file's first token line has {columns}" if columns >= 2 else "a token and its tag"


@rule("files.txt_not_conll")
def txt_not_conll(split: str, path: str, number: int, text: str, fields: list[str], columns: int) -> str | None:
    """A .txt read as CoNLL that is no CoNLL file (often a CSV or TSV saved as .txt)."""
    if Path(path).suffix.lower() == ".txt":
        return (f"{split} file {path} line {number} has {len(fields)} column(s), {_what(columns)}: a .txt file is read "
                "as CoNLL (a token and its tag on each line, a blank line between sentences); a CSV file should be named "
                ".csv (a tab-separated one .tsv), words alone to tag (one a line) .conll")
    return None


@rule("files.conll_of_commas")
def conll_of_commas(split: str, path: str, number: int, text: str, fields: list[str], columns: int) -> str | None:
    """A CSV of words and tags named .conll."""
    commas = text.split(",")
    if len(commas) >= 2 and A_TAG.fullmatch(commas[-1].strip()):
        return (f"{split} file {path} line {number} separates its fields with commas ({text[:60]!r}): a CoNLL file "
                "holds a token and its tag separated by a space or a tab; a table of words is a .csv, read as a "
                "sentence per row (a list of words beside a list of tags)")
    return None


@rule("files.conll_width")
def conll_width(split: str, path: str, number: int, text: str, fields: list[str], columns: int) -> str:
    """A CoNLL line with another number of columns than the file's first token line."""
    return (f"{split} file {path} line {number} has {len(fields)} column(s), {_what(columns)}; each line holds a "
            "token and its tag (the tag last), a blank line between sentences")


CONLL_LINE = [txt_not_conll, conll_of_commas, conll_width]


@rule("files.conll_no_tokens")
def conll_no_tokens(split: str, path: str, sentences: list, first) -> str | None:
    """A CoNLL file with no token line (comments and blank lines only)."""
    if not sentences:
        return f"{_the(split)} has no rows ({path}): no token lines; check the file"
    return None


@rule("files.conll_no_blank_lines")
def conll_no_blank_lines(split: str, path: str, sentences: list, first) -> str | None:
    """A CoNLL file without blank lines between its sentences: it reads as one long sentence (or a few,
    around a stray blank line). A file of many sentences has its blank lines, whatever one's length."""
    longest = max(len(w) for w, _ in sentences)
    if longest > 100 and longest * 2 > sum(len(w) for w, _ in sentences) and len(sentences) <= 3:
        return (f"{split} file {path} reads as {len(sentences)} sentence(s), one of {longest} words: a CoNLL file has a "
                "blank line after each sentence; put them in (a file without them reads as one long sentence)")
    return None


@rule("files.conll_tags_first")
def conll_tags_first(split: str, path: str, sentences: list, first) -> str | None:
    """The tag column first (`B-PER Ada`): its words would be read as the tags. Said when no tag read looks
    like a tag and every word does."""
    tags = [t for _, row in sentences for t in row if t is not None]
    words = [w for row, _ in sentences for w in row]
    if not tags or any(A_TAG.fullmatch(t) for t in tags) or not all(A_TAG.fullmatch(w) for w in words):
        return None
    number, fields = first or (0, [])
    return (f"{split} file {path}: the tag column seems to be the first (line {number} reads {' '.join(fields)!r}), "
            "so its words would be read as tags; put each word first and its tag last (Ada B-PER)")


CONLL_READ = [conll_no_tokens, conll_no_blank_lines, conll_tags_first]


# --- a folder, or a data set of the hub ----------------------------------------------------------------------


@rule("files.data_dir_is_a_zip")
def data_dir_is_a_zip(data_dir: str, dataset_name: str | None) -> str | None:
    """data_dir that is a zip file, not the folder it holds."""
    if not Path(data_dir).is_dir() and dataset_name in (None, "imagefolder") and zipfile.is_zipfile(data_dir):
        return f"data_dir {data_dir} is a zip file; unzip it and give the folder it holds"
    return None


@rule("files.data_dir_is_a_file")
def data_dir_is_a_file(data_dir: str, dataset_name: str | None) -> str | None:
    """data_dir that is a file of samples: that is train_file."""
    if dataset_name in (None, "imagefolder") and Path(data_dir).is_file():
        return (f"data_dir {data_dir} is a file, not a folder of images (<class>/<image>); a file of samples is given "
                "as train_file=")
    return None


@rule("files.data_dir_missing")
def data_dir_missing(data_dir: str, dataset_name: str | None) -> str | None:
    """data_dir that is not there."""
    if dataset_name in (None, "imagefolder") and not Path(data_dir).is_dir():
        return f"data_dir not found: {data_dir}"
    return None


BUILDERS = {"csv": (".csv", ".tsv"), "json": (".json", ".jsonl"), "parquet": (".parquet",)}


@rule("files.builder_of_other_files")
def builder_of_other_files(data_dir: str, dataset_name: str | None) -> str | None:
    """dataset_name=json on a folder of CSV files: the builder finds none of its files there."""
    if dataset_name not in BUILDERS or not Path(data_dir).is_dir():
        return None
    found = {p.suffix.lower() for p in Path(data_dir).rglob("*") if p.is_file()}
    fits = next((b for b, suffixes in BUILDERS.items() if found & set(suffixes)), None)
    if not found & set(BUILDERS[dataset_name]):
        instead = f"; its files are {', '.join(sorted(found))}: set dataset_name={fits}" if fits else ""
        return f"data_dir {data_dir} holds no {' or '.join(BUILDERS[dataset_name])} file for dataset_name={dataset_name}{instead}"
    return None


DATA_DIR = [data_dir_is_a_zip, data_dir_is_a_file, data_dir_missing]
BUILDER_FOLDER = [builder_of_other_files]


def _empty_folder(name: str | None, error: Exception) -> bool:
    cause = root_cause(error)
    return name in (None, "imagefolder") and ("no data" in cause or "EmptyDataset" in cause
                                              or "doesn't contain any data" in cause)  # fmt: skip


@rule("files.data_files_as_image_folder")
def data_files_as_image_folder(name: str | None, data_dir: str | None, error: Exception) -> str | None:
    """A folder of data files given where an image folder is read."""
    if not _empty_folder(name, error):
        return None
    found = sorted(p.name for p in Path(data_dir).iterdir() if p.suffix.lower() in FILE_BUILDERS)
    if found:
        return (f"data_dir {data_dir} holds data files ({', '.join(found[:4])}), not images: data_dir is an image "
                "folder's; give the files as train_file= (validation_file=, test_file=)")
    return None


@rule("files.no_images")
def no_images(name: str | None, data_dir: str | None, error: Exception) -> str | None:
    """An image folder without images."""
    if _empty_folder(name, error):
        return (f"data_dir {data_dir} holds no images; an image folder is <data_dir>/train/<label>/<image>.png|jpg "
                "(validation/, test/ optional)")
    return None


@rule("files.hub_offline")
def hub_offline(name: str | None, data_dir: str | None, error: Exception) -> str | None:
    """A hub dataset under HF_HUB_OFFLINE (or HF_DATASETS_OFFLINE): no download is allowed."""
    offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if os.environ.get(v, "").lower() in
               ("1", "true", "yes", "on")]  # fmt: skip
    if name and offline and not Path(name).expanduser().exists():
        return (f"could not load data from {name}: {root_cause(error)}; {offline[0]} is set (no downloads): load it once "
                "while online (then it is read from the datasets cache), or give local files: train_file=... "
                "validation_file=...")
    return None


@rule("files.not_loaded")
def not_loaded(name: str | None, data_dir: str | None, error: Exception) -> str:
    """A folder or hub dataset that datasets could not load: its words."""
    return f"could not load data from {name or data_dir}: {root_cause(error)}"


LOAD_FAILED = [data_files_as_image_folder, no_images, hub_offline, not_loaded]


@rule("files.no_train_split")
def no_train_split(splits: list[str], data_dir: str | None) -> str | None:
    """Data without a 'train' split."""
    if "train" in splits:
        return None
    fix = (f"; an image folder trains on {data_dir}/train/<label>/<image> (validation/ and test/ beside it)" if data_dir
           else "; give train_file (or a data set with a train split)")
    return f"the data has no 'train' split (found: {', '.join(splits) or 'none'}){fix}"


TRAIN_SPLIT = [no_train_split]


@rule("files.no_data_files")
def no_data_files(path: Path, image_task: bool) -> str | None:
    """`--data` that names a folder without data files for a model that reads no images."""
    if not image_task:
        return (f"--data {path} is a folder without data files ({KINDS}); give a file, or a folder of files named by "
                "split (test.csv, validation.jsonl, ...)")
    return None


DATA_FOLDER = [no_data_files]


@rule("files.squad_file_malformed")
def squad_file_malformed(path: str, error: Exception) -> str | None:
    """A SQuAD-layout .json file that breaks the layout: a question without its id or answers, an answer
    without its answer_start."""
    missing = f"a key {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
    return (f"{path} is in SQuAD's nested layout but breaks it ({missing} missing or of another type); each question "
            'needs "id", "question" and "answers": [{"text": ..., "answer_start": ...}] (v2.0: "is_impossible": true '
            "and no answers)")


SQUAD_FILE = [squad_file_malformed]


@rule("files.split_files_of_other_columns")
def split_files_of_other_columns(split: str, columns: dict[str, list[str]]) -> str | None:
    """Files of one split (a folder's train/a.csv and train/b.csv, which datasets joins into one split) whose
    columns differ, by their headers: the second file's rows would miss the first's columns (its texts or labels
    read as empty), or its header be read as a row and trained as a class. Compared by name, in any order."""
    if not columns:
        return None
    first, *others = columns.items()
    other = next(((path, names) for path, names in others if set(names) != set(first[1])), None)
    if other is None:
        return None
    return (f"the {split} files have other columns: {first[0]} has {', '.join(first[1])}; {other[0]} has "
            f"{', '.join(other[1])}; give every file of a split the same header (rename the columns), or train on "
            "one file (train_file=...)")


SPLIT_FILES = [split_files_of_other_columns]
