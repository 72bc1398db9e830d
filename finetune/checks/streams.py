"""Streams: a streamed run (streaming=true, finetune/streams.py): the settings that cannot stream, the splits
it needs, and what the stream meets as it is read.

    SETTINGS  the typed config: asked with the settings' CONFIG (finetune/checks/settings.py), the task's
              rule once the task is known
    SPLITS    the split names of the streamed data, before anything is read (finetune/data.py)
    ROWS      a block's rows, as a process reads its share of the stream, by the loaded path's own rules for a
              row: the first rows were checked whole with the split, the later ones are checked here
    NEW_LABELS a block's labels that the first rows did not hold, by the loaded path's rules for one label
    LABELS    a block's labels, as a process reads its share of the stream (finetune/streams.py)
    FIRST_ROWS the first pass's rows, read (finetune/data.py): one label alone, a file sorted by its label
    UNREADABLE rows of the stream its parser refuses, past those read (finetune/data.py's `reading_the_stream`)
    CHANGED   the training file at each pass's start, against what it was when the stream began
    EMPTY     a process's share of one pass, read from its start (finetune/streams.py)
"""

from __future__ import annotations

import csv
import json

from finetune.checks import columns, labels, rule
from finetune.checks.files import root_cause
from finetune.formats import builder_of, delimiter_of
from finetune.tasks import TASKS, task_of

STREAMED_BUILDERS = ("csv", "json", "parquet")  # datasets' builders that stream a file (.tsv is csv)


@rule("streams.without_max_steps")
def without_max_steps(cfg) -> str | None:
    """streaming=true without max_steps: a stream's length is unknown until it has been read, so an epoch
    cannot be counted in advance, nor a schedule planned over epochs."""
    if cfg.streaming and cfg.max_steps is None:
        return ("streaming=true reads data of unknown length: set max_steps=N (the run's optimizer steps; "
                "num_train_epochs cannot be counted on a stream)")
    return None


@rule("streams.task_cannot_stream", needs=("task",))
def task_cannot_stream(cfg) -> str | None:
    """streaming=true for a task that reads its data whole (images, tags, question answering): only text
    classification streams."""
    if cfg.streaming and not task_of(cfg.task).streams:
        which = ", ".join(name for name, task in TASKS.items() if task.streams)
        return f"streaming=true streams the data of {which} only; task={cfg.task} loads it whole: leave streaming out"
    return None


# A setting that needs the whole training split, or a layout a stream does not have: the reason, and what to do.
CANNOT_STREAM = {
    "text_windows": "a text's windows would be scored apart from the texts they come from",
    "length_buckets": "the buckets are chosen from every training length",
    "torch_compile": "its shapes are planned from every training length",
    "resume_allow_topology_change": "each process resumes its own share of the stream, which another topology splits otherwise",
    "dataloader_num_workers": "the stream is read and tokenized by each training process itself",
    "data_dir": "an image folder is read whole",
}


@rule("streams.setting_cannot_stream")
def setting_cannot_stream(cfg) -> str | None:
    """streaming=true with a setting that reads the whole training split (text_windows, length_buckets,
    torch_compile), an image folder, a topology change on resume, or data workers: the first one, and why."""
    if not cfg.streaming:
        return None
    bad = next((key for key in CANNOT_STREAM if getattr(cfg, key) not in (None, False, 0)), None)
    if bad is None:
        return None
    instead = f"leave {bad} out" if bad != "data_dir" or cfg.train_file else "leave streaming out"
    return f"streaming=true cannot be used with {bad}={getattr(cfg, bad)}: {CANNOT_STREAM[bad]}; {instead}"


@rule("streams.file_cannot_stream")
def file_cannot_stream(cfg) -> str | None:
    """A streamed train_file of a format datasets does not stream (CoNLL, an .arrow file of save_to_disk)."""
    if cfg.streaming and cfg.train_file and builder_of(cfg.train_file) not in STREAMED_BUILDERS:
        return (f"streaming=true reads .csv, .tsv, .json, .jsonl and .parquet files; {cfg.train_file} is not one: "
                "convert it, or leave streaming out")
    return None


SETTINGS = [without_max_steps, task_cannot_stream, setting_cannot_stream, file_cannot_stream]


@rule("streams.no_validation")
def no_validation(splits: list[str], where: str) -> str | None:
    """A streamed run without a validation split: a stream cannot hold out a stratified share of itself,
    since its classes are not known before it is read."""
    if "validation" not in splits:
        return (f"streaming=true needs a validation split, and {where} has none (a stream cannot hold out a "
                "stratified share of itself): give validation_file=...")
    return None


SPLITS = [no_validation]


@rule("streams.no_rows")
def no_rows(source: str, rows: int) -> str | None:
    """A training stream with no row in it (a header alone): nothing to train on."""
    return f"the training stream has no rows ({source}); check the file" if rows == 0 else None


@rule("streams.first_rows_of_one_label")
def first_rows_of_one_label(train, column: str, first_rows: int, source: str) -> str | None:
    """A training stream whose first rows (the FIRST_PASS its label names and checks read, all of them filled) hold
    one label alone: a file sorted by its label. A stream is shuffled only within stream_buffer, so it would
    train on one class at a time, and its other classes are not among the names read (a loaded run would say
    single class, which the stream may not have)."""
    values = train[column][:] if column in train.column_names and len(train) >= first_rows else []
    kinds = {str(v) for v in values if v is not None and not isinstance(v, (list, dict))}
    if len(kinds) == 1 and all(v is not None for v in values):
        return (f"the training stream's first {first_rows:,} rows ({source}) all hold the {column} {next(iter(kinds))!r}: "
                "is the file sorted by its label? a stream is shuffled only within stream_buffer, so it would train on "
                "one class at a time; shuffle the file's rows")
    return None


NO_ROWS = [no_rows]
FIRST_ROWS = [first_rows_of_one_label]


# A later row of the stream: the loaded path's rules for one row (`Columns.row` names its row in the file), in
# their order there; and for a label the first rows did not hold, the loaded path's rules for one label.
ROWS = [columns.missing, columns.text_missing_in_a_row, columns.text_blank, columns.label_null]
NEW_LABELS = [labels.list_written_as_text, labels.header_inside_the_file, labels.line_break_in_a_label,
              labels.blank_label, labels.space_twins, labels.look_alike_classes, labels.case_twin_classes]  # fmt: skip


@rule("streams.label_not_in_label_names", local=True)
def label_not_in_label_names(unseen: list[str], names: list[str], first_rows: int, row: str, given: bool) -> str | None:
    """A training label met in the stream that the label_names given do not hold (as a loaded run's
    labels.not_in_label_names): the model has no class for it."""
    if unseen and given:
        return (f"the training stream holds the label(s) {', '.join(map(repr, unseen[:5]))} at {row}, which are not in "
                f"label_names {names}; list them all in label_names, or set label_names=null to read them from the "
                f"stream's first {first_rows:,} rows")
    return None


@rule("streams.label_after_first_pass", local=True)
def label_after_first_pass(unseen: list[str], names: list[str], first_rows: int, row: str, given: bool) -> str | None:
    """A training label met in the stream that its first rows, from which the label names were read, did not
    hold: the model has no class for it."""
    if unseen:
        return (f"the training stream holds the label(s) {', '.join(map(repr, unseen[:5]))} at {row}, which "
                f"its first {first_rows:,} rows (where the label names {names} were read) did not: give every label "
                "in label_names=[...]")
    return None


LABELS = [label_not_in_label_names, label_after_first_pass]


def _first_unparsable_line(path: str) -> tuple[int, int, str] | None:
    """A JSON Lines file read again, a line at a time: its first line that is no JSON record, as (its row among
    the data's lines, its line, why); None where every line is one (a JSON document over several lines)."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        rows = (pair for pair in enumerate(f, 1) if pair[1].strip())
        for row, (line, text) in enumerate(rows, 1):
            try:
                record = json.loads(text.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                return row, line, f"column {e.colno}: {e.msg.lower()}"
            if not isinstance(record, dict):
                return row, line, f"{type(record).__name__} {text.strip()[:30]!r}, not a record"
    return None


def _first_ragged_row(path: str) -> tuple[int, int, int, int, bool] | None:
    """A CSV or TSV file read again, a row at a time: its first row of another width than its header, as (its
    first line, its last line, its fields, the header's, whether a field holds a line break: a quote left
    open); None where every row fits."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        rows = csv.reader(f, delimiter=delimiter_of(path))
        header, start = next(rows, []), rows.line_num + 1
        for row in rows:
            if row and len(row) != len(header):
                return start, rows.line_num, len(row), len(header), any("\n" in field for field in row)
            start = rows.line_num + 1
    return None


@rule("streams.delimited_row_unparsable")
def delimited_row_unparsable(path: str | None, source: str, error: Exception) -> str | None:
    """A row of a CSV or TSV training stream that its parser refuses past the rows already read (more or fewer
    fields than the header, a quote never closed): the file is read again a row at a time to name its line,
    as the loaded path's rules do (files.csv_ragged_row, files.csv_open_quote)."""
    found = _first_ragged_row(path) if path and builder_of(path) == "csv" else None
    if found is None:
        return None
    first, last, fields, names, open_quote = found
    if open_quote:
        return (f"train file {path} line {first:,} opens a quote that no quote closes: the field runs on to line "
                f"{last:,}; close the quote, or remove it (a stream reads each row as the run trains)")
    return (f"train file {path} line {last:,} has {fields} fields, the header has {names}; fix that row (quote "
            "fields that contain the delimiter; a stream reads each row as the run trains)")


@rule("streams.row_unparsable")
def row_unparsable(path: str | None, source: str, error: Exception) -> str:
    """A row of the training stream that its parser refuses (a malformed JSON line) past the rows already read:
    the stream meets it as the run trains. A JSON Lines file is read again a line at a time to name the row;
    another format, or data of the hub, by the parser's own words."""
    found = _first_unparsable_line(path) if path and builder_of(path) == "json" else None
    if found is not None:
        row, line, why = found
        return (f"row {row:,} of {path} (line {line:,}) is not valid JSON Lines: {why}; fix or remove that line "
                "(a stream reads each row as the run trains)")
    return f"the training stream {source} could not be read on: {root_cause(error)}; check that it is valid data"


UNREADABLE = [delimited_row_unparsable, row_unparsable]


@rule("streams.file_changed", local=True)
def file_changed(path: str | None, then: tuple | None, now: tuple | None) -> str | None:
    """The training file replaced, grown, cut or removed while a streamed run reads it (its size and modification
    time, at each pass's start): a stream reads the file again each pass, so the run would go on training on
    other data than it checked and recorded (the sha256 in results.json, which a resume holds it to)."""
    if path is None or then == now:
        return None
    what = "is gone" if now is None else "changed (its size or modification time)"
    return (f"the training file {path} {what} since the run began to stream it, and a stream reads it again each "
            "pass; keep it as it is until the run ends (change a copy): put back the file it began with and resume "
            "(resume_from_checkpoint=latest), or start a new run on the new file")


CHANGED = [file_changed]


@rule("streams.empty_share", local=True)
def empty_share(rows: int, rank: int, processes: int) -> str | None:
    """A process whose share of the training stream is empty (fewer samples than processes, or a
    max_train_samples smaller than that): it would wait for samples forever."""
    if rows:
        return None
    if processes > 1:
        return (f"process {rank}'s share of the training stream is empty: it has fewer samples than the "
                f"{processes} processes; give more training data, or fewer processes")
    return "the training stream has no samples: give a train_file (or max_train_samples) with some"


EMPTY = [empty_share]
