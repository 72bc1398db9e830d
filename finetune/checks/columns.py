"""Columns: a split's columns as the run names them (finetune/data.py's `check_columns` asks these).

    MISSING   a column the run reads is not there: why, in the order below (the first that can tell wins),
              then the line that lists the columns with the setting most likely meant
    VALUES    the columns that are there: one kind of value a column, text that is text, words that are
              words, no missing label
    TRAINING  what only the training split is warned of: image paths read as text, rows a quote merged

The subject is a `Columns`: the split, its name, the data settings, the run's task and whether the labels
are read (evaluation predicts on data without them).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from finetune.checks import rule
from finetune.checks.images import one_class_folder
from finetune.checks.labels import (
    character_span,
    joined_tags,
    joined_tags_line,
    spans_line,
    tag_problem,
    token_record,
)
from finetune.formats import A_TAG, IOB2_TAG, image_paths, plain_tags, word_lists
from finetune.metrics import SPANS, TOKENS
from finetune.tasks import DEFAULT_TASK, TASKS, pair_first, pair_partner, task_for_data
from finetune.text import BLANK, shown


@dataclass
class Columns:
    """A split as the column rules see it."""

    ds: Any  # a datasets.Dataset
    split: str
    args: Any  # the run's DataArgs
    labelled: bool = True  # the labels are read (evaluation predicts on data without them)
    model_task: bool = False  # the task is a trained model's (evaluation): other data is the wrong data
    train_columns: list[str] | None = None  # the train split's, for another split
    row_name: Callable[[int], str] | None = None  # how a line names row i (a stream's block: its row in the file)
    _values: dict[str, list] = field(default_factory=dict, repr=False)

    @property
    def task(self):
        return TASKS[self.args.task]

    @property
    def tagging(self) -> bool:
        return TOKENS in self.task.problems

    @property
    def label_columns(self) -> list[str]:
        return self.args.label_sources if self.labelled else []

    @property
    def inputs(self) -> list[str]:
        return self.args.input_columns

    @property
    def names(self) -> list[str]:
        return self.ds.column_names

    @functools.cached_property
    def missing(self) -> str | None:
        """The first column the run reads that the split lacks."""
        return next((c for c in (*self.label_columns, *self.inputs) if c not in self.names), None)

    @functools.cached_property
    def head(self) -> dict[str, list]:
        """The first 1,000 rows of the columns that hold no image (one read: each ds[column] copies the
        features)."""
        from datasets import Image

        columns = [c for c, f in self.ds.features.items() if not isinstance(f, Image)]
        return self.ds.select_columns(columns)[:1000] if columns else {}

    def values(self, column: str) -> list:
        """A column's values as a list, read once for every rule that asks (iterating datasets' Column row by
        row formats each row on its own: 60 times slower)."""
        if column not in self._values:
            self._values[column] = self.ds[column][:]
        return self._values[column]

    @functools.cached_property
    def first(self) -> dict[str, Any]:
        """The first row, its images left out (decoding a damaged one fails before the images' own check)."""
        return {name: values[0] for name, values in self.head.items() if values}

    @functools.cached_property
    def looks_like(self) -> str:
        """The task whose data this looks like."""
        other = task_for_data(self.ds.features, self.args)
        words = len(self.ds) and any(isinstance(v, list) and v and all(isinstance(w, str) for w in v)
                                     for v in self.first.values())  # fmt: skip
        if self.model_task and other == self.args.task and not self.tagging and self.missing in self.inputs and words:
            other = next(n for n, t in TASKS.items() if TOKENS in t.problems)  # words to tag, a text model
        return other

    def row(self, i: int) -> str:
        """Row i (from 0) as a line names it: "row 3", or where a streamed block's row is in its file."""
        return self.row_name(i) if self.row_name is not None else f"row {i + 1}"

    def setting_of(self, column: str) -> str:
        return self.args.setting_of(column)

    def not_found(self, hint: str = "") -> str:
        return f"column '{self.missing}' not found in the {self.split} data; columns are: {', '.join(self.names)}{hint}"

    @property
    def train_has(self) -> bool:
        """The train split has the missing column: this split's file differs, not the settings."""
        return self.train_columns is not None and self.missing in self.train_columns


# --- why a column is missing ---------------------------------------------------------------------------------

# The keys that mark a one-record JSON file as one of a model folder's own files, not data.
MODEL_FILES = {
    "config.json (model_type, architectures, ...)": {"model_type", "architectures"},
    "tokenizer_config.json (tokenizer_class, model_max_length, ...)": {"tokenizer_class", "model_max_length",
                                                                       "added_tokens_decoder"},
    "tokenizer.json (added_tokens, normalizer, pre_tokenizer, ...)": {"added_tokens", "normalizer", "pre_tokenizer"},
    "special_tokens_map.json (cls_token, pad_token, ...)": {"cls_token", "pad_token", "unk_token", "sep_token"},
    "preprocessor_config.json (image_processor_type, ...)": {"image_processor_type", "feature_extractor_type"},
    "generation_config.json (decoder_start_token_id, ...)": {"decoder_start_token_id", "transformers_version"},
}  # fmt: skip


@rule("columns.a_model_file")
def a_model_file(c: Columns) -> str | None:
    """A model folder's own file given as data (its config.json, tokenizer_config.json, ...)."""
    if c.missing is None or len(c.ds) != 1:
        return None
    described = next((name for name, keys in MODEL_FILES.items() if keys & set(c.names)), None)
    if described is not None:
        return (f"the {c.split} data is one record with the keys of a model's {described}: that file describes a "
                "model, it holds no samples; give a data file")
    return None


@rule("columns.pixel_columns")
def pixel_columns(c: Columns) -> str | None:
    """Images as rows of pixel columns (Kaggle's MNIST-style CSV: label, pixel1 ... pixel784)."""
    if c.missing is None:
        return None
    pixels = [n for n in c.names if re.fullmatch(r"(pixel|px|p)_?\d+|\d+x\d+", n.strip().lower())]
    if len(pixels) >= 64:  # by the names alone, before any row of a table this wide is read
        return (f"the {c.split} data holds images as {len(pixels)} pixel columns ({pixels[0]} ... {pixels[-1]}): this "
                "app reads images from files; save each row as a PNG in a folder of its class "
                "(<dir>/train/<label>/<n>.png) and give data_dir with an image recipe (finetune/configs/vit_*.yaml)")
    return None


@rule("columns.tags_joined_in_a_cell")
def tags_joined_in_a_cell(c: Columns) -> str | None:
    """A row's tags joined by spaces in one cell (Kaggle's NER CSV by sentence: "O B-geo O")."""
    if c.missing is None:
        return None
    found = next(((n, v) for n in c.head if (v := joined_tags(c.head[n]))), None)
    return joined_tags_line(found[0], c.split, found[1]) if found else None


@rule("columns.character_spans")
def character_spans(c: Columns) -> str | None:
    """Entities as character spans (spaCy's, Label Studio's), or tokens as records of character offsets
    (Prodigy's), where a list of words and their tags is read."""
    if c.missing is None:
        return None
    examples = {n: next((v[0] for v in values if isinstance(v, list) and v), None) for n, values in c.head.items()}
    found = next((n for n, v in examples.items() if character_span(v)), None)  # the spans, else the token records
    found = found or next((n for n, v in examples.items() if token_record(v)), None)
    return spans_line(found, c.split, examples[found]) if found is not None else None


@rule("columns.image_folder_of_one_class")
def image_folder_of_one_class(c: Columns) -> str | None:
    """An image folder whose images are all in one class folder (the loader labels images only when there
    are two or more), or one with a folder inside a class folder."""
    if c.missing not in c.label_columns or c.task.modality != "image":
        return None
    return one_class_folder(c.ds, c.split, c.args)


@rule("columns.images_under_another_name")
def images_under_another_name(c: Columns) -> str | None:
    """An image run whose image column is missing while another column holds images (a parquet of the Hub's
    CIFAR: img, fine_label): the settings that name them, the label column's too where it is missing."""
    from datasets import ClassLabel, Image, Value

    args = c.args
    if c.missing is None or args.image_column in c.names or (c.missing != args.image_column and c.task.modality != "image"):
        return None
    held = next((n for n, f in c.ds.features.items() if isinstance(f, Image)
                 or (isinstance(f, dict) and {"bytes", "path"} <= set(f))), None)  # fmt: skip
    held = held or next((n for n in c.names if image_paths(c.head.get(n, [])[:200])), None)
    if held is None:
        return None
    fix = f"image_column={held}"
    if args.label_column in c.label_columns and args.label_column not in c.names:
        others = [n for n, f in c.ds.features.items() if n != held and (isinstance(f, ClassLabel) or (
                  isinstance(f, Value) and (f.dtype in ("string", "large_string") or f.dtype.startswith("int"))))]  # fmt: skip
        fix += (f" label_column={others[0]}" if len(others) == 1 else
                f" label_column=<one of {', '.join(others)}>" if others else "")  # fmt: skip
    return f"column '{c.missing}' not found in the {c.split} data, but '{held}' holds images: set {fix}"


@rule("columns.spaced_header")
def spaced_header(c: Columns) -> str | None:
    """`text, label`: the spaces around a header's names are part of them."""
    spaced = next((n for n in c.names if c.missing and n.strip() == c.missing), None)
    if spaced is not None:
        return (f"column '{c.missing}' not found in the {c.split} data, but {spaced!r} is: strip the spaces around the "
                "names in the file's header")
    return None


@rule("columns.names_in_another_case")
def names_in_another_case(c: Columns) -> str | None:
    """`Text,Label`: the names in another case (in train too: a split that differs is said by its own rule)."""
    if c.missing is None or c.train_has:
        return None
    cased = {col: next((n for n in c.names if n.strip().lower() == col.lower()), None)
             for col in (*c.label_columns, *c.inputs) if col not in c.names}  # fmt: skip
    if cased.get(c.missing) is not None:
        fixes = " ".join(f"{c.setting_of(col)}={n}" for col, n in cased.items() if n is not None)
        return (f"column '{c.missing}' not found in the {c.split} data, but {cased[c.missing]!r} is (the names differ in "
                f"case): set {fixes}, or rename the columns")
    return None


@rule("columns.words_as_one_string")
def words_as_one_string(c: Columns) -> str | None:
    """A tagging split whose words are one string a row, beside lists of tags."""
    args = c.args
    words, tags = c.first.get(args.tokens_column), c.first.get(args.tags_column)
    if c.missing in c.label_columns and isinstance(words, str) and isinstance(tags, list):
        return (f"column '{args.tokens_column}' of the {c.split} data holds a string in each row, beside lists of tags "
                f"in '{args.tags_column}': a tagging run needs a list of words for each list of tags; split each "
                "sentence into its words ([\"Ada\", \"went\", ...])")
    return None


@rule("columns.records_nested_under_a_key")
def records_nested_under_a_key(c: Columns) -> str | None:
    """`{"data": [{...}, ...]}`: the records nested under one key."""
    (only,) = c.names if len(c.names) == 1 else (None,)
    if c.missing is not None and only is not None and len(c.ds) == 1 and isinstance(c.first.get(only), list):
        return (f"the {c.split} data is one record whose '{only}' holds a list: the samples are nested under "
                f"'{only}'; give the records themselves (JSON Lines, or a JSON array of records)")
    return None


def word_and_tag_lists(ds) -> tuple[str, str] | None:
    """The two columns of tagging data under any names: a list of words and, beside it, a list of tags (names
    or ids) of the same length in the first row; None unless exactly one such pair."""
    from datasets import Image

    plain = [c for c, f in ds.features.items() if not isinstance(f, Image)]  # a damaged image is not read here
    if not len(ds) or not plain:
        return None
    row = ds.select_columns(plain)[0]
    words = [n for n, v in row.items() if isinstance(v, list) and v and all(isinstance(w, str) for w in v)]
    pairs = [(w, t) for w in words for t, v in row.items()
             if t != w and isinstance(v, list) and len(v) == len(row[w]) and all(isinstance(x, (str, int)) for x in v)]

    def tags(values) -> bool:
        return all(isinstance(x, str) and A_TAG.fullmatch(x) for x in values)

    if len(pairs) == 2 and pairs[0] == pairs[1][::-1]:  # two lists of strings: the tags are the ones that read so
        pairs = [(w, t) for w, t in pairs if tags(row[t])]
    if len(pairs) == 1 and tags(row[pairs[0][0]]) and not tags(row[pairs[0][1]]):  # words beside a number (1990)
        return pairs[0][::-1]
    return pairs[0] if len(pairs) == 1 else None


@rule("columns.words_and_tags_under_other_names")
def words_and_tags_under_other_names(c: Columns) -> str | None:
    """Lists of words and their tags under other names than the run's, or given to a sentence classifier."""
    if c.missing is None:
        return None
    lists = word_and_tag_lists(c.ds)
    renamed = lists is not None and lists != (c.args.tokens_column, c.args.tags_column)
    if renamed or (lists is not None and not c.tagging and not c.model_task):
        fix = [*(["task=token-classification"] if not c.tagging else []),
               *([f"tokens_column={lists[0]}", f"tags_column={lists[1]}"] if renamed else [])]  # fmt: skip
        return c.not_found(f"; '{lists[0]}' and '{lists[1]}' hold lists of words and their tags: to tag words, set "
                           f"{' '.join(fix)}")
    return None


@rule("columns.words_without_tags")
def words_without_tags(c: Columns) -> str | None:
    """Tagging data with words and no tags."""
    if c.missing in c.label_columns and c.tagging and c.names == c.inputs:
        return c.not_found("; a tagging run trains on a tag for each word (CoNLL: the word and its tag on each line; "
                           "JSON: a list of tags beside the list of words)")
    return None


@rule("columns.conll_read_as_a_table")
def conll_read_as_a_table(c: Columns) -> str | None:
    """Tagging data read as a table of a word and its tag a row: a CoNLL file under another name, or a
    table with a row per word (Kaggle's Sentence #,Word,POS,Tag)."""
    last = c.names[-1] if c.names else None
    tags = list(c.head.get(last, [])[:200]) if last is not None and len(c.ds) else []
    if c.missing is None or not c.tagging or len(c.names) > 4 or not tags or \
            sum(isinstance(v, str) and bool(A_TAG.fullmatch(v)) for v in tags) * 2 <= len(tags):  # fmt: skip
        return None
    if A_TAG.fullmatch(last.strip()):
        return c.not_found("; its rows read as a word and its tag on each line: a CoNLL file; name it .conll")
    word = next((n for n in c.names[:-1] if all(isinstance(v, str) for v in c.head.get(n, [])[:200])
                 and n.strip().lower() in ("word", "words", "token", "tokens", "form")), None)  # fmt: skip
    return c.not_found(f"; it is a table with a row per word{f' (the word in {word!r}, ' if word else ' ('}its tag in "
                       f"{last!r}): a tagging run reads a sentence per row (JSON Lines: a list of words beside a list "
                       "of tags) or a CoNLL file; group the rows by sentence (pandas: fill the sentence column down, "
                       "groupby(...).agg(list), to_json(orient='records', lines=True))")


def _no_labels_hint(c: Columns) -> str:
    """The task's own word on a split of inputs alone (an image folder labels each image by its folder)."""
    if c.missing in c.label_columns and c.names == c.inputs and c.task.modality == "image":
        return ("; an image folder labels each image by the folder it is in: <data_dir>/train/<class>/*.png (and "
                "validation/, test/ beside train/)")
    return ""


@rule("columns.question_answering_columns")
def question_answering_columns(c: Columns) -> str | None:
    """Question-answering data whose columns go by other names (q, passage, ans) or whose answers are two flat
    columns (a CSV's answer_text, answer_start): the settings that name them, or the one answers column."""
    if c.missing is None or c.task.problems != (SPANS,):
        return None
    texts = [n for n in c.names if c.head.get(n) and all(isinstance(v, str) for v in c.head[n][:50])]
    answers = next((n for n in c.names if c.head.get(n) and isinstance(c.head[n][0], dict)
                    and {"text", "answer_start"} <= set(c.head[n][0])), None)  # fmt: skip
    if answers is None and any("start" in n.lower() for n in c.names):
        return c.not_found("; question answering reads the answers as one column of {\"text\": [...], \"answer_start\": "
                           "[...]} (the Hub's squad layout), not as separate columns: build it (pandas: df['answers'] = "
                           "[{'text': [t], 'answer_start': [s]} for t, s in zip(df.answer_text, df.answer_start)]) and "
                           "write JSON Lines (to_json(orient='records', lines=True))")
    if len(texts) < 2:
        return None
    mean = {n: sum(len(v) for v in c.head[n]) / len(c.head[n]) for n in texts}
    context = max(texts, key=mean.get)
    question = next((n for n in texts if n != context and "?" in "".join(c.head[n][:50])), min(texts, key=mean.get))
    named = [f"question_column={question}", f"context_column={context}"] + ([f"answers_column={answers}"] if answers else [])
    return c.not_found(f"; question answering reads a question, a context and its answers: set {', '.join(named)}"
                       + ("" if answers else " and answers_column=<the column of {\"text\": [...], \"answer_start\": [...]}>"))


@rule("columns.another_tasks_data")
def another_tasks_data(c: Columns) -> str | None:
    """The columns of another task's data (lists of words for a text run, images for a tagger)."""
    other = c.looks_like
    if c.missing is None or other == c.args.task:
        return None
    if c.model_task:  # a model of one task, data of another
        return c.not_found(f"{_no_labels_hint(c)}; these look like {other} data, and the model is a {c.args.task} "
                           f"model: give it {c.args.task} data, or evaluate a {other} model on these")
    return c.not_found(f"{_no_labels_hint(c)}; these look like {other} data: set task={other} (or task=null to read it "
                       "from the data)")


@rule("columns.labels_of_an_image_folder")
def labels_of_an_image_folder(c: Columns) -> str | None:
    """An image split with no label column: an image folder labels each image by the folder it is in."""
    hint = _no_labels_hint(c)
    return c.not_found(hint) if c.missing is not None and hint else None


def _spare(c: Columns) -> list[str]:
    return [n for n in c.names if n not in (*c.label_columns, *c.inputs, *c.args.label_sources)
            and isinstance(c.first.get(n), str)]  # fmt: skip


def _the_texts_among(ds, columns: list[str]) -> list[str]:
    """Of string columns, the one whose values are much longer (3x or more) than every other's: the texts
    beside a label column of words ('review' beside 'stars'); else all of them."""
    if len(columns) < 2 or not len(ds):
        return columns
    width = {n: sum(len(str(v)) for v in ds[n][:200]) for n in columns}
    longest = max(columns, key=width.get)
    return [longest] if all(width[longest] >= 3 * width[n] for n in columns if n != longest) else columns


@rule("columns.image_paths_for_a_text_model")
def image_paths_for_a_text_model(c: Columns) -> str | None:
    """A text run's missing text column beside a column of image file paths: images, for an image model."""
    if c.missing not in c.inputs or c.train_has or c.task.modality != "text":
        return None
    found = next((n for n, values in c.head.items() if image_paths(values[:200])), None)
    if found:
        column = "" if found == "image" else f" image_column={found}"
        return c.not_found(f"; '{found}' holds image file paths ({c.first[found]}): train an image model on them, "
                           f"e.g. --config finetune/configs/vit_imagefolder.yaml train_file={c.args.files.get(c.split)}"
                           f"{column}")  # fmt: skip
    return None


@rule("columns.text_column_named_otherwise")
def text_column_named_otherwise(c: Columns) -> str | None:
    """A missing text column: the one string column left ("sentence", not "text"; the column of long strings
    beside a label column of words), a pair under other names (premise and hypothesis for sentence1 and
    sentence2, in order), or a pair model's second text."""
    if c.missing not in c.inputs or c.train_has:
        return None
    missing = [n for n in c.inputs if n not in c.names]
    spare = _the_texts_among(c.ds, _spare(c)) if len(missing) == 1 else _spare(c)
    if len(spare) == 1:
        return c.not_found(f"; if '{spare[0]}' is that column, set {c.setting_of(c.missing)}={spare[0]}")
    if c.model_task and c.missing == c.args.text_pair_column:
        return c.not_found(f"; the model reads pairs of texts, the second in '{c.missing}': give the data a second text "
                           f"column, named so or set {c.setting_of(c.missing)}=<its name>")
    if len(missing) == len(spare) == 2:
        return c.not_found(f"; if '{spare[0]}' and '{spare[1]}' are the pair, set {c.setting_of(missing[0])}={spare[0]} "
                           f"{c.setting_of(missing[1])}={spare[1]}")
    return None


@rule("columns.no_header")
def no_header(c: Columns) -> str | None:
    """A file without a header: a column's name is one of its values ("neg" a column's name and a value)."""
    headed = next((n for n in c.names if n in {str(v) for v in c.head.get(n, [])[:1000]}), None) if c.missing else None
    if headed is not None:
        return c.not_found(f"; the first row looks like data, not a header ('{headed}' is also a value of its column): "
                           "the first line names the columns (e.g. text,label)")
    return None


def _others(c: Columns) -> list[str]:
    return [n for n in c.names if n not in (*c.label_columns, *c.inputs, *c.args.label_sources)]


@rule("columns.label_column_named_otherwise")
def label_column_named_otherwise(c: Columns) -> str | None:
    """A missing label column beside one other column ("labels" where the run reads "label")."""
    others = _others(c)
    if c.missing == c.args.label_column and not c.args.label_columns and len(others) == 1:
        return c.not_found(f"; if '{others[0]}' holds the labels, set label_column={others[0]}")
    return None


@rule("columns.labels_and_texts_named_otherwise")
def labels_and_texts_named_otherwise(c: Columns) -> str | None:
    """Neither the label column nor (perhaps) the text column under the run's names (review, sentiment): the
    column of strings that reads as classes (few values, each repeated) and, where the text column is missing
    too, the one of longest strings."""
    if c.missing != c.args.label_column or c.args.label_columns or c.train_has:
        return None
    others = _others(c)
    head = c.ds.select_columns(others)[:1000] if others else {}
    strings = [n for n in others if head[n] and all(isinstance(v, str) for v in head[n])]
    classes = [n for n in strings if len(set(head[n])) <= max(2, len(head[n]) // 5)]
    if len(classes) != 1:
        return None
    label, missing = classes[0], [n for n in c.inputs if n not in c.names]
    if not missing:
        return c.not_found(f"; if '{label}' holds the labels, set label_column={label}")
    texts = [n for n in strings if n != label]
    if len(missing) != 1 or not texts:
        return None
    text = max(texts, key=lambda n: sum(len(v) for v in head[n]))
    return c.not_found(f"; if '{label}' holds the labels and '{text}' the texts, set {c.setting_of(missing[0])}={text} "
                       f"label_column={label}")


@rule("columns.scored_split_without_labels")
def scored_split_without_labels(c: Columns) -> str | None:
    """A validation or test file with the inputs and no labels: a scored split needs them."""
    if c.train_has and c.missing in c.label_columns and c.split in ("validation", "test") and all(
            n in c.names for n in c.inputs):  # fmt: skip
        return c.not_found(f"; the {c.split} split is scored, so it needs its labels; to predict on a file without "
                           "them: finetune/evaluate_checkpoint.py <output_dir>/model --data <file>")
    return None


@rule("columns.another_name_than_train")
def another_name_than_train(c: Columns) -> str | None:
    """A split whose column names differ from the train split's."""
    if c.train_has:
        return c.not_found(f"; the train data has '{c.missing}' (columns: {', '.join(c.train_columns)}): give every "
                           "split the same column names")
    return None


@rule("columns.nested_field")
def nested_field(c: Columns) -> str | None:
    """A column missing because it sits inside another's records ({"data": {"text": ...}}): nested fields are
    not read, so the fix is to flatten them into columns."""
    if c.missing is None:
        return None
    held = {n: sorted(c.first[n]) for n in c.names if isinstance(c.first.get(n), dict)}
    head, _, sub = c.missing.partition(".")
    inside = head if sub and sub in held.get(head, ()) else next((n for n, keys in held.items() if c.missing in keys), None)
    if inside is None:
        return None
    flat = c.missing if sub else f"{inside}.{c.missing}"
    return c.not_found(f"; '{inside}' holds fields ({', '.join(held[inside])}), and nested fields are not read: "
                       "flatten them into columns (pandas: pd.json_normalize(records).to_json(orient='records', "
                       f"lines=True)) and set {c.setting_of(c.missing)}={flat}")


@rule("columns.another_layout")
def another_layout(c: Columns) -> str | None:
    """A task that reads fixed column names (multiple choice: SWAG's) given data in another layout (HellaSwag's
    list of endings, CommonsenseQA's choices): the layout to rename them to."""
    if c.task.layout is None or c.missing not in c.inputs or c.looks_like not in (c.args.task, DEFAULT_TASK):
        return None
    other = "" if c.looks_like == c.args.task else f"; or, for {DEFAULT_TASK} data, set task={DEFAULT_TASK}"
    return c.not_found(f"; {c.args.task} reads {c.task.layout}{other}")


@rule("columns.numbered_with_a_gap")
def numbered_with_a_gap(c: Columns) -> str | None:
    """Numbered input columns (multiple choice's endings) with a number missing: those after the gap would
    not be read."""
    numbers, prefix = c.task.numbers(c.names), c.task.numbered
    gap = next((i for i, n in enumerate(numbers) if n != i), None)
    if gap is None:
        return None
    return (f"the {c.split} data has {', '.join(f'{prefix}{n}' for n in numbers)} but no {prefix}{gap}: the candidates "
            f"are read from {prefix}0 to the first number missing, so {prefix}{numbers[gap]} on would be left out; "
            "number them from 0 without a gap")


@rule("columns.numbered_unlike_train")
def numbered_unlike_train(c: Columns) -> str | None:
    """A split with another number of numbered input columns than train's (multiple choice: 5 endings in
    validation, 4 in train): the model scores as many candidates as it trains on."""
    if c.train_columns is None or not c.task.numbered:
        return None
    mine, theirs, prefix = len(c.task.numbers(c.names)), len(c.task.numbers(c.train_columns)), c.task.numbered
    if mine == theirs:
        return None
    return (f"the {c.split} data has {mine} candidates ({prefix}0 to {prefix}{mine - 1}), the train data {theirs}: every "
            f"split needs as many")


@rule("columns.missing")
def missing(c: Columns) -> str | None:
    """A column the run reads that the split does not have: the columns it has."""
    return c.not_found() if c.missing is not None else None


# The order a missing column is explained in: layouts that are not a table of samples first, then the
# settings that name the columns, then what the other columns suggest; the last lists the columns.
MISSING = [a_model_file, pixel_columns, tags_joined_in_a_cell, character_spans, image_folder_of_one_class,
           images_under_another_name, spaced_header, names_in_another_case, words_as_one_string,
           records_nested_under_a_key, words_and_tags_under_other_names, words_without_tags, conll_read_as_a_table,
           question_answering_columns, another_layout, another_tasks_data, labels_of_an_image_folder, image_paths_for_a_text_model, text_column_named_otherwise,
           no_header, scored_split_without_labels, label_column_named_otherwise, labels_and_texts_named_otherwise,
           another_name_than_train, nested_field, numbered_with_a_gap, numbered_unlike_train, missing]  # fmt: skip


# --- the values of the columns that are there --------------------------------------------------------------


def _kind_of_value(value: Any) -> str:
    """A JSON value's kind, in a user's words."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return {list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


@rule("columns.mixed_types")
def mixed_types(c: Columns) -> str | None:
    """A JSON column whose values are of several kinds (a number among texts): datasets reads it as `Json`,
    which no other rule would name; the row that differs from the first. Where the rows read all agree (a
    stream's first pass; datasets typed the column from more of the file), the file is read again to find it."""
    lists = {*c.task.input_columns(c.args), *c.task.label_columns(c.args)} if c.tagging else set()
    for column in (n for n in (*c.inputs, *c.label_columns) if n not in lists):
        if type(c.ds.features[column]).__name__ != "Json":
            continue
        values = list(c.values(column))
        kinds = [None if v is None else _kind_of_value(v) for v in values]
        first = next((k for k in kinds if k is not None), None)
        odd = next((i for i, k in enumerate(kinds) if k is not None and k != first), None)
        path = c.args.files.get(c.split) if odd is None and first is not None else None
        found = _another_kind_in_file(path, column, first) if path else None
        if found and found[0] > len(values):  # past the rows read (a stream's first pass): its row in the file
            return (f"column '{column}' in the {c.split} data holds values of mixed types: its first rows hold {first}, "
                    f"but row {found[0]:,} of {path} holds {found[1]} ({found[2]!r:.40}); give every row the same type "
                    "(write numbers meant as text in quotes)")
        if odd is None and first in ("text", "a number", "true/false") and not found:  # a dataset's folder
            return (f"column '{column}' in the {c.split} data holds values of mixed types: its first rows hold {first}, "
                    "but a later row holds another kind (datasets read the column as Json); give every row the same "
                    "type (write numbers meant as text in quotes)")
        if odd is not None:
            start = kinds.index(first)
            return (f"column '{column}' in the {c.split} data holds values of mixed types: row {odd + 1} holds "
                    f"{kinds[odd]} ({values[odd]!r:.40}), row {start + 1} {first} ({values[start]!r:.40}); give every "
                    "row the same type (write numbers meant as text in quotes)")
    return None


def _another_kind_in_file(path: str, column: str, kind: str) -> tuple[int, str, Any] | None:
    """A JSON Lines file read again, a line at a time, or a JSON array whole (as datasets reads it): (the data row,
    its kind, its value) of the first value in `column` of another kind than `kind`; None for another format, or
    where none differs."""
    import json

    with open(path, encoding="utf-8-sig", errors="replace") as f:
        if f.read(4096).lstrip().startswith("["):  # a JSON array of records
            f.seek(0)
            try:
                records = [r if isinstance(r, dict) else {} for r in json.load(f)]
            except (ValueError, TypeError):
                return None
            return next(((row, _kind_of_value(r[column]), r[column]) for row, r in enumerate(records, 1)
                         if r.get(column) is not None and _kind_of_value(r[column]) != kind), None)  # fmt: skip
        f.seek(0)
        for row, line in enumerate((line for line in f if line.strip()), 1):
            try:
                value = json.loads(line).get(column)
            except (ValueError, AttributeError):  # not JSON Lines (a JSON document over several lines)
                return None
            if value is not None and _kind_of_value(value) != kind:
                return row, _kind_of_value(value), value
    return None


def _text_columns(c: Columns):
    """(column, the setting that names it) of a text run's inputs."""
    if c.task.modality != "text" or c.tagging:
        return []
    inputs = [n for n in c.task.sample_columns(c.names, c.args) if n in c.names or n in c.inputs]  # every candidate
    return [(n, c.task.setting_of(n, c.args)) for n in inputs]


def _set_to(setting: str | None, column: str, what: str) -> str:
    """The fix of a text column that holds no text: set the setting that names it to the column of `what`, or,
    where the task's layout names its columns (multiple choice's endings), put `what` in the column itself."""
    if setting is None:
        return f"put the {what} in '{column}' itself (the task's layout names its columns)"
    return f"set {setting} to the column of {what}"


def _strings(feature) -> bool:
    from datasets import Value

    return isinstance(feature, Value) and feature.dtype in ("string", "large_string")


@rule("columns.text_column_empty")
def text_column_empty(c: Columns) -> str | None:
    """A text column with no text in any row (a CSV's empty column reads as numbers)."""
    for column, setting in _text_columns(c):
        if not _strings(c.ds.features[column]) and len(c.ds) and all(v is None for v in c.values(column)):
            return (f"text column '{column}' in the {c.split} data is empty (no text in any row); "
                    f"{_set_to(setting, column, 'texts')}, or fill it in")
    return None


@rule("columns.object_of_columns")
def object_of_columns(c: Columns) -> str | None:
    """A JSON object of columns ({"text": [...], "label": [...]}): one record whose text is a list."""
    for column, _ in _text_columns(c):
        if not _strings(c.ds.features[column]) and len(c.ds) == 1 and isinstance(c.first.get(column), list):
            return (f"the {c.split} data is one record whose '{column}' is a list: a JSON object of columns; give one "
                    'record per row (JSON Lines: {"text": ..., "label": ...} on each line, or a JSON array of such '
                    "records)")
    return None


@rule("columns.numbers_as_texts")
def numbers_as_texts(c: Columns) -> str | None:
    """A text column the file's reader found to hold only numbers (or true/false): an id or a label column
    given as the text, or numbers meant as text."""
    from datasets import Value

    for column, setting in _text_columns(c):
        feature = c.ds.features[column]
        if isinstance(feature, Value) and feature.dtype.startswith(("int", "uint", "float", "bool")):
            return (f"text column '{column}' in the {c.split} data holds only numbers ({feature.dtype}), no words: a "
                    f"model classifies text, and these values would be read as numbers written out; "
                    f"{_set_to(setting, column, 'texts')} (if '{column}' is a label or an id, it is not the text); if these numbers "
                    f'are the texts to classify, write them as strings (JSON Lines: "{column}": "12345")')
    return None


@rule("columns.text_not_strings")
def text_not_strings(c: Columns) -> str | None:
    """A text column of lists, mappings or another type than strings."""
    for column, setting in _text_columns(c):
        if not _strings(c.ds.features[column]):
            return (f"text column '{column}' in the {c.split} data holds {c.ds.features[column]}, not text; "
                    f"{_set_to(setting, column, 'strings')}")
    return None


@rule("columns.text_missing_in_a_row")
def text_missing_in_a_row(c: Columns) -> str | None:
    """A text cell that is empty (null)."""
    for column, _ in _text_columns(c):
        row = next((i for i, v in enumerate(c.values(column)) if v is None), None)
        if row is not None:
            return f"text column '{column}' in the {c.split} data has an empty cell at {c.row(row)}; fill it in or drop that row"
    return None


@rule("columns.texts_all_blank")
def texts_all_blank(c: Columns) -> str | None:
    """A text column of empty strings only: the model would see the special tokens alone."""
    for column, setting in _text_columns(c):
        texts = c.values(column)
        if len(texts) and all(BLANK.fullmatch(v) for v in texts):
            return (f"text column '{column}' in the {c.split} data holds only empty strings; set {setting} to the "
                    "column that holds the texts")
    return None


@rule("columns.text_blank")
def text_blank(c: Columns) -> str | None:
    """A blank text (spaces, or invisible characters alone): as good as empty."""
    for column, _ in _text_columns(c):
        texts = c.values(column)
        row = next((i for i, v in enumerate(texts) if BLANK.fullmatch(v)), None)
        if row is not None:
            invisible = " of invisible characters (zero-width spaces)" if texts[row].strip() else ""
            return (f"text column '{column}' in the {c.split} data has an empty (blank) text{invisible} at "
                    f"{c.row(row)}; fill it in or drop that row")
    return None


@rule("columns.pair_unread", warning=True)
def pair_unread(c: Columns) -> str | None:
    """A sentence-pair data set (sentence1, sentence2; premise, hypothesis) trained on one of its texts."""
    args = c.args
    if c.split != "train" or c.task.modality != "text" or c.tagging or args.text_pair_column is not None:
        return None
    first, partner = pair_first(args.text_column, c.names), pair_partner(args.text_column, c.names)
    if (partner or first) is None:
        return None
    fix = f"text_pair_column={partner}" if partner else f"text_column={first} text_pair_column={args.text_column}"
    return f"column '{partner or first}' is not read: the model sees '{args.text_column}' alone; for sentence pairs set {fix}"


@rule("columns.word_not_a_string")
def word_not_a_string(c: Columns) -> str | None:
    """A tagging row's words with a number among them (`[1990, "was", "good"]`)."""
    column = c.args.tokens_column
    if not c.tagging or word_lists(c.ds.features[column]):
        return None
    odd = next(((row, i, w) for row, words in enumerate(c.values(column)) if isinstance(words, list)
                for i, w in enumerate(words) if not isinstance(w, str)), None)  # fmt: skip
    if odd is not None:
        row, i, word = odd
        return f"the {c.split} data's word {i + 1} at row {row + 1} is {word!r}, not a string; write every word in quotes (\"{word}\")"
    return None


@rule("columns.words_not_lists")
def words_not_lists(c: Columns) -> str | None:
    """A tagging run's tokens column that holds something else than lists of words."""
    column = c.args.tokens_column
    if c.tagging and not word_lists(c.ds.features[column]):
        return (f"tokens column '{column}' in the {c.split} data holds {c.ds.features[column]}, not lists of words; "
                'give each row its words as a list ("tokens": ["Ada", "lived", "in", "London"]), or a CoNLL file')
    return None


@rule("columns.sentence_empty")
def sentence_empty(c: Columns) -> str | None:
    """A tagging row without words."""
    if c.tagging:
        row = next((i for i, words in enumerate(c.values(c.args.tokens_column)) if not words), None)
        if row is not None:
            return f"the {c.split} data has an empty sentence (no words) at row {row + 1}; drop that row"
    return None


@rule("columns.word_empty")
def word_empty(c: Columns) -> str | None:
    """A tagging row with an empty word."""
    if not c.tagging:
        return None
    for row, words in enumerate(c.values(c.args.tokens_column)):
        blank = next((i for i, w in enumerate(words) if w is None or not w.strip()), None)
        if blank is not None:
            return f"the {c.split} data has an empty word at row {row + 1}, word {blank + 1}; give it its text"
    return None


@rule("columns.words_with_spaces", warning=True)
def words_with_spaces(c: Columns) -> str | None:
    """Words with a space inside ("New York" as one word, a phrase tagged whole): the model learns them whole,
    but a pipeline splits its text at spaces, so such a word is two to it."""
    if c.split != "train" or not c.tagging:
        return None
    sentences = c.values(c.args.tokens_column)
    spaced = [w for words in sentences for w in words if " " in w.strip()]
    if spaced:
        total = sum(len(words) for words in sentences)
        return (f"{len(spaced):,} of the {total:,} training words hold a space ({shown(spaced[0])}): a pipeline and any "
                "text split at spaces sees such a word as two; write each word as its own item, the tag on the first "
                '(B-...) and I-... on the rest ("New", "York": B-LOC, I-LOC)')
    return None


@rule("columns.tag_not_iob2")
def tag_not_iob2(c: Columns) -> str | None:
    """A tag a tagging row gives by name that strict IOB2 scoring cannot read (IOBES, a lower-case prefix,
    another separator, a bare prefix), in a set that is not plain (parts of speech)."""
    tags = c.ds.features.get(c.args.tags_column)
    if not c.tagging or not word_lists(tags):  # integer ids are named by label_names (labels.tag_set)
        return None
    rows = c.values(c.args.tags_column)
    every = {t for names in rows for t in names or [] if t is not None}
    plain, types = plain_tags(every), {t[2:] for t in every if IOB2_TAG.fullmatch(t) and t != "O"}
    for row, names in enumerate(rows):
        for word, tag in enumerate(names or []):
            why = tag_problem(tag, plain, types) if tag is not None else None
            if why:
                return f"the {c.split} data's tag {tag!r} at row {row + 1}, word {word + 1} {why}"
    return None


@rule("columns.label_null")
def label_null(c: Columns) -> str | None:
    """A label cell that is empty (null)."""
    for column in c.label_columns:
        labels = c.values(column)
        row = next((i for i, v in enumerate(labels) if v is None), None)
        if row is not None:
            return (f"label column '{column}' in the {c.split} data has empty (null) values (first at {c.row(row)}); "
                    "fill them in or drop those rows")
    return None


# The values of the columns that are there, in order; the image columns' own are checks/images.py's.
VALUES = [mixed_types, text_column_empty, object_of_columns, numbers_as_texts, text_not_strings,
          text_missing_in_a_row, texts_all_blank, text_blank, pair_unread, word_not_a_string, words_not_lists,
          sentence_empty, word_empty, words_with_spaces, tag_not_iob2]  # fmt: skip
LABELS = [label_null]


@rule("columns.strings_not_utf8")
def strings_not_utf8(c: Columns, error: UnicodeDecodeError) -> str:
    """A parquet file's strings that are not UTF-8 (read only when a value is)."""
    return (f"the {c.split} data holds text that is not UTF-8 ({error.reason}); the file is damaged or in another "
            "encoding: save it again as UTF-8")


NOT_UTF8 = [strings_not_utf8]


# --- what only the training split is warned of --------------------------------------------------------------


@rule("columns.image_paths_as_text", warning=True)
def image_paths_as_text(c: Columns) -> str | None:
    """A CSV of image paths given to a text recipe: the model would learn the file names."""
    if c.split != "train" or c.task.modality != "text":
        return None
    found = next((n for n in c.inputs if n in c.names and image_paths(c.head.get(n, [])[:200])), None)
    if found:
        return (f"column '{found}' holds image file paths ({c.values(found)[0]}), read as text: the model learns their "
                f"names, not the pictures; to train on the images, use an image recipe with image_column={found}")
    return None


@rule("columns.rows_merged_by_a_quote", warning=True)
def rows_merged_by_a_quote(c: Columns) -> str | None:
    """A text cell that holds lines ending the way the file's rows end (",pos"): a quote opened in a text and
    never closed ("great!) made the CSV reader join the following rows into that one cell, until another
    quote. Their samples are lost and the text is wrong."""
    column, labels = c.args.text_column, c.args.label_column
    if c.split != "train" or c.task.modality != "text" or not c.labelled or column not in c.names or labels not in c.names:
        return None
    broken = [(row, text) for row, text in enumerate(c.values(column)[:20000]) if isinstance(text, str) and "\n" in text]
    if not broken:  # the first 20,000 rows only, and the label values below only when a text holds a line break
        return None
    values = {str(v) for v in c.values(labels)[:5000] if isinstance(v, (str, int)) and not isinstance(v, bool)}
    ends = re.compile(r".*[,\t;|]\s*(" + "|".join(map(re.escape, sorted(values, key=len, reverse=True))) + r")\s*$")
    for row, text in broken if values else []:
        lines = text.splitlines()
        merged = sum(bool(ends.fullmatch(line)) for line in lines)
        if merged >= 2:
            return (f"row {row + 1} of the training data holds {merged} lines that end like the file's rows "
                    f"({shown(lines[1][-40:])}): a quote (\") opened in a text and never closed joined the rows after it "
                    "into that one text; close or remove the quote (or save the file with every text quoted)")
    return None


TRAINING = [image_paths_as_text, rows_merged_by_a_quote]
