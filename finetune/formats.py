"""The data formats the loader reads (finetune/data.py), and the tag schemes a tagging file writes.

    suffix                                     read by
    .csv, .tsv                                 datasets' csv builder (a .tsv with tabs)
    .json, .jsonl                              datasets' json builder (one array of records, or a record a line)
    .parquet                                   datasets' parquet builder
    .conll, .conllu, .iob2, .iob, .bio, .txt   finetune's CoNLL reader (a word and its tag a line)

Tags: IOB2 (`O`, `B-PER`, `I-PER`), which strict entity scoring reads, or a plain set (parts of speech:
`NOUN`, `VERB`), scored word by word. Nothing heavy is imported: the checks read these too.
"""

from __future__ import annotations

import re

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".tsv": "csv",
                 ".arrow": "arrow", ".conll": "conll", ".conllu": "conll", ".iob2": "conll", ".iob": "conll",
                 ".bio": "conll", ".txt": "conll"}  # fmt: skip
KINDS = ".csv, .tsv, .json, .jsonl, .parquet, .arrow, or CoNLL (.conll, .conllu, .iob2, .iob, .bio, .txt)"
TEXT_FORMATS = tuple(s for s in FILE_BUILDERS if s not in (".parquet", ".arrow"))  # binary: no text to decode


def builder_of(path: str) -> str | None:
    """The builder that reads a file, by its suffix (None: no format of the loader's)."""
    return FILE_BUILDERS.get(path[path.rfind("."):].lower() if "." in path else "")


def delimiter_of(path: str) -> str:
    """A delimited file's separator: a tab for a .tsv, else a comma."""
    return "\t" if path.lower().endswith(".tsv") else ","


# The first bytes of compressed files: datasets would read them as text and fail on their bytes.
COMPRESSED = {"gzip": b"\x1f\x8b", "zip": b"PK\x03\x04", "bzip2": b"BZh", "xz": b"\xfd7zXZ", "zstd": b"\x28\xb5\x2f\xfd"}

# What looks like an IOB/IOBES tag (O, B-PER, E-LOC): to find a file's tag column, or its words read as tags.
A_TAG = re.compile(r"O|[BIES]-\S+")

# A first line of these (word, tag; TOKEN, NE...) is a table's header, not a token: CoNLL files have none.
CONLL_HEADER_WORDS = {"word", "words", "token", "tokens", "form", "tag", "tags", "ner", "ner_tag", "ner_tags", "ne",
                      "label", "labels", "iob", "bio", "entity"}  # fmt: skip
# A CoNLL-U file (Universal Dependencies): ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC.
CONLLU_COLUMNS, CONLLU_UPOS = 10, 3

IOB2_TAG = re.compile(r"O|[BI]-\S(?:.*\S)?", re.S)
# A tag that reads as an entity's part in some scheme: B-, I-, E-, S-, L-, U- (any case), or such a bare prefix;
# B_PER, B.PER, B:PER (another separator); PER-B, PER_I (the part written after the type).
SCHEME_PREFIX = re.compile(r"[BIESLU](-.*)?|[BIESLU][_.:]\S+|\S+[-_.:][BIES]", re.S | re.I)


def plain_tags(tags) -> bool:
    """Whether a tag set is plain: tags of words, not parts of entities (parts of speech: NOUN, VERB, DET;
    or entity types without B-/I-: O, PER, LOC). No tag has a scheme's prefix, and one is not O. Such a
    set is scored word by word (`metrics.token_report`); any other is read as IOB2."""
    tags = {str(t) for t in tags}
    return bool(tags - {"O"}) and not any(SCHEME_PREFIX.fullmatch(t.strip()) for t in tags)


# --- what a datasets feature holds (by its type's name: no datasets import here) ------------------------------


def is_list(feature) -> bool:
    """Whether a datasets feature holds lists (List, LargeList, Sequence, or [feature])."""
    return type(feature).__name__ in ("List", "LargeList", "Sequence") or isinstance(feature, list)


def word_lists(feature) -> bool:
    """A datasets feature that holds lists of strings (a tagging row's words)."""
    inner = feature[0] if isinstance(feature, list) else getattr(feature, "feature", None)
    return is_list(feature) and getattr(inner, "dtype", None) in ("string", "large_string")


def kind_of(feature) -> str | None:
    """'class' (names, a ClassLabel, booleans), 'int', 'float', 'list' or None (none of them)."""
    if type(feature).__name__ == "ClassLabel":
        return "class"
    if is_list(feature):
        return "list"
    dtype = getattr(feature, "dtype", "") if type(feature).__name__ == "Value" else ""
    if dtype in ("string", "large_string", "bool"):
        return "class"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("float") or dtype == "double":
        return "float"
    return None


# Folder names that datasets' image folder reads as splits, not classes.
SPLIT_FOLDERS = ("train", "training", "validation", "valid", "val", "dev", "eval", "test", "testing")


# --- image files -------------------------------------------------------------------------------------------

# Photo formats that cameras and phones write and that PIL reads only with plugins: the image folder
# loader skips them as if they were not images.
UNREADABLE_PHOTOS = (".heic", ".heif", ".avif", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf")


def image_suffixes() -> set[str]:
    """The suffixes PIL reads as images (PIL imported here, when asked)."""
    import PIL.Image

    return set(PIL.Image.registered_extensions())


def image_paths(values: list) -> bool:
    """Whether a column's values are image file paths (nine in ten end in an image suffix)."""
    from pathlib import Path

    suffixes = image_suffixes()
    paths = [v for v in values if isinstance(v, str) and Path(v.strip()).suffix.lower() in suffixes]
    return bool(values) and len(paths) * 10 >= len(values) * 9


def typed_stream(ds):
    """A streamed file typed by its first table, where datasets gave it no features (a JSON array, which its json
    builder reads whole each pass): untyped, a column of mixed kinds (a number among texts, which datasets types
    `Json`) is handed on as each value's JSON text ('"a text"'), which would train as text unnoticed."""
    from datasets import Features

    if ds.features is not None:
        return ds
    first = next(iter(ds.with_format("arrow").iter(batch_size=1)), None)
    return ds.cast(Features.from_arrow_schema(first.schema)) if first is not None else ds
