"""Labels: what the label column holds, and whether it means what the run will train (finetune/data.py and
finetune/problems/ ask these as they read and encode the labels).

    PROBLEM        the label column against the problem type asked for (or read from it)
    CLASSES        single-label class names: one class, lists written as text, twins that differ by a space,
                   a case, a Unicode form or a full stop, names the splits or label_names do not share
    LISTS          multi-label lists and 0/1 columns: nulls, nested lists, empty lists, names outside the set
    NUMBERS        regression targets: NaN, too large or small for float32, all the same, far from the rest
    TAGS           a tag per word: lists of the words' length, a tag set strict IOB2 scoring reads, a problem_type
                   of the other tag scheme (TAG_PROBLEM)
    TRAINED_AS     warnings once the labels are read: a label set that probably means something else
    CANDIDATES     multiple choice: a label that is no candidate's number, data with another number of
                   candidates than the model's; CANDIDATES_TRAINED: the right candidate always the same

A rule reads the column as the parser typed it (`kind_of`: class names, int, float, list) and the settings
that name the labels.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from finetune.checks import rule
from finetune.formats import A_TAG, IOB2_TAG, is_list, kind_of, plain_tags
from finetune.metrics import MULTI, REGRESSION, SINGLE
from finetune.text import BLANK, shown, visible

# --- helpers the rules share ---------------------------------------------------------------------------------


def _twins(names, key, allowed=()) -> tuple[str, str] | None:
    """The first two names (in sorted order) that `key` makes one, unless `allowed` holds both."""
    seen: dict[str, str] = {}
    for name in sorted(names):
        twin = seen.setdefault(key(name), name)
        if twin != name and not {twin, name} <= set(allowed):
            return twin, name
    return None


def case_twins(names, allowed=()) -> tuple[str, str] | None:
    """The first two names that differ only by letter case, unless `allowed` holds both."""
    return _twins(names, str.casefold, allowed)


PUNCTUATION = ".,;:!?'\"`"  # in a label: a typing slip or a spelling ('neg.', 'U.S.'), not what tells classes apart


def punctuation_twins(names, allowed=()) -> tuple[str, str] | None:
    """The first two names that differ only by punctuation ('neg' and 'neg.', 'US' and 'U.S.'), unless `allowed`
    holds both. Names with a digit are left out: '1.5' and '15' are two numbers."""

    def key(name: str) -> str:
        if any(c.isdigit() for c in name):
            return name
        return "".join(c for c in name if c not in PUNCTUATION).strip().casefold()

    return _twins(names, key, allowed)


def look_alike(names, allowed=()) -> tuple[str, str] | None:
    """The first two names that read the same (`text.visible`: café composed and decomposed, pos and pos
    with a zero-width space), unless `allowed` holds both."""
    return _twins(names, visible, allowed)


LOOK_ALIKE = ("which read the same (they differ only in Unicode form or by invisible characters such as a "
              "zero-width space) and would be two {}; write each label the same way (normalize the file to NFKC, "
              "which also makes full-width letters plain, and remove zero-width characters)")

# A number as a spreadsheet writes it: plain, or with a percent sign, a currency, separators or a unit
# word ("81%", "$1,200", "1 000", "3,5", "3.5 kg", "3.2 stars", "5€"). Ordinals (1st, 2nd) are ranks.
NUMBER_AS_WRITTEN = re.compile(r"[-+]?\s*[$€£¥]?\s*\d[\d.,' ]*(\s*(%|[$€£¥]|[^\W\d_]+\.?))?")
ORDINAL = re.compile(r"\d*(1st|2nd|3rd|\dth)")


def number_as_written(text: str) -> bool:
    """Whether `text` reads as a number, plain or dressed as a spreadsheet dresses one (NUMBER_AS_WRITTEN):
    what regression targets and single-label class names are checked against."""
    text = text.strip()
    return bool(NUMBER_AS_WRITTEN.fullmatch(text)) and not ORDINAL.fullmatch(text.lower())


def not_finite_numbers(values: list) -> list[tuple[int, Any]]:
    """The (row, value) of the values that are not finite numbers."""
    bad = []
    for row, value in enumerate(values):
        try:
            if math.isfinite(float(value)):
                continue
        except (TypeError, ValueError):
            pass
        bad.append((row, value))
    return bad


def _listed(names, most: int = 5) -> str:
    return ", ".join(map(repr, names[:most])) + (", ..." if len(names) > most else "")


# --- what a label cell may hold instead of labels ---


def joined_tags(values: list) -> str | None:
    """The first of a column's values that is IOB2 tags joined by spaces ("O B-geo I-geo O"), where most
    are; None otherwise."""
    strings = [v for v in values[:200] if isinstance(v, str)]
    joined = [v for v in strings if len(v.split()) >= 2 and all(A_TAG.fullmatch(t) for t in v.split())]
    if not joined or len(joined) * 2 <= len(strings) or not any(re.search(r"(^|\s)[BI]-", v) for v in joined):
        return None
    return joined[0]


def joined_tags_line(column: str, split: str, example: str) -> str:
    return (f"column '{column}' of the {split} data holds tags joined by spaces in one string a row ({example!r}): "
            "tagging data; a tagging run reads a list of words and a list of IOB2 tags for each row (JSON Lines: "
            "\"tokens\": [...], \"ner_tags\": [...]) or a CoNLL file: split both columns into lists (pandas: "
            "df[col].str.split()), write JSON Lines, and train with finetune/configs/bert_ner.yaml")


def character_span(value: Any) -> bool:
    """One entity as character offsets: [start, end, label] (spaCy's training tuples) or a record with
    start, end and label (Label Studio's and doccano's exports)."""
    if isinstance(value, dict):
        return {"start", "end"} <= set(value) and any(k in value for k in ("label", "labels", "type"))
    return (isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[2], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value[:2]))  # fmt: skip


def token_record(value: Any) -> bool:
    """One token as a record of its text and character offsets (Prodigy's `tokens`)."""
    return isinstance(value, dict) and "text" in value and {"start", "end"} <= set(value)


def spans_line(column: str, split: str, example: Any) -> str:
    """The line for entities given as character spans (or tokens as records of character offsets), where
    a tag for each word is read."""
    held = ("tokens as records of their text and character offsets" if token_record(example) else
            "entities as character spans")  # fmt: skip
    return (f"column '{column}' of the {split} data holds {held} ({example!r}: as spaCy, Prodigy and annotation "
            "tools export them); a tagging run reads a list of words and a list of "
            "IOB2 tags for each row (JSON: \"tokens\": [...], \"ner_tags\": [...]) or a CoNLL file: convert the spans "
            "first (spaCy: offsets_to_biluo_tags, then biluo_to_iob)")


# --- the problem type ------------------------------------------------------------------------------------------


class Column:
    """A label column as the problem rules see it: the training split, the column, its feature, what kind of
    values it holds (`kind_of`), and the problem type asked for (None: read from the column)."""

    def __init__(self, train, column: str, given: str | None):
        self.train, self.column, self.given = train, column, given
        self.feature = train.features[column]
        self.kind = kind_of(self.feature)

    @property
    def values(self) -> list:
        return list(self.train[self.column])

    @property
    def numbers(self):
        """A float column's values as float64 (None as NaN)."""
        import numpy as np

        return np.asarray(self.values, dtype=np.float64)


@rule("labels.mixed_kinds")
def mixed_kinds(c: Column) -> str | None:
    """A JSON label column of mixed kinds ("1" quoted in some rows and 1 bare in others, names beside lists)."""
    if c.kind is None and type(c.feature).__name__ == "Json":
        return (f"label column '{c.column}' mixes kinds of value (in JSON: \"1\" quoted in some rows and 1 bare in "
                "others, or names beside lists); write every label one way (all names in quotes, all numbers, or all "
                "lists)")
    return None


@rule("labels.no_kind_of_label")
def no_kind_of_label(c: Column) -> str | None:
    """Labels that are no class, number or list (mappings, images)."""
    if c.kind is None:
        return (f"label column '{c.column}' holds {c.feature}; labels are class names or integer ids, numbers "
                "(regression) or lists of names (multi-label)")
    return None


def _fraction(c: Column):
    return next((v for v in c.numbers if math.isfinite(v) and v != round(v)), None)


@rule("labels.floats_as_classes")
def floats_as_classes(c: Column) -> str | None:
    """A float column read as classes: numbers with decimals asked to be single-label, or whole numbers
    stored as floats (1.0, 2.0: class ids or numbers to predict?)."""
    if c.kind != "float" or c.given not in (None, SINGLE):
        return None
    fraction = _fraction(c)
    if c.given != SINGLE and fraction is not None:
        return None
    example = fraction if fraction is not None else c.numbers[0]
    fix = "problem_type=regression to predict them as numbers, or write class ids as integers (1, 2, ...)"
    what = "holds numbers with decimals" if fraction is not None else "holds whole numbers stored as floats"
    problem = f"; single_label_classification needs classes: set {fix}" if c.given else f" (ambiguous): set {fix}"
    return f"label column '{c.column}' {what} (e.g. {example:g}){problem}"


@rule("labels.a_stray_fraction", warning=True)
def a_stray_fraction(c: Column) -> str | None:
    """Class ids with a stray fraction (0, 1, one 1.5): trained as a regression, as the labels say."""
    if c.kind != "float" or c.given is not None:
        return None
    values = c.numbers
    rows = [i for i, v in enumerate(values) if math.isfinite(v) and v != round(v)]
    wholes = {v for v in values if math.isfinite(v) and v == round(v)}
    if rows and len(rows) <= len(values) // 10 and len(wholes) <= 20:
        return (f"label column '{c.column}' holds whole numbers ({len(wholes)} values) and {len(rows)} with decimals "
                f"({values[rows[0]]:g} at row {rows[0] + 1}): trained as a regression; if the labels are classes, fix "
                "those rows (or set problem_type=regression to say it is one)")
    return None


@rule("labels.numbers_with_a_stray_cell")
def numbers_with_a_stray_cell(c: Column) -> str | None:
    """A column of decimal numbers read as strings because of a cell or two ("NaN", "n/a"): it would train a
    classifier with one class per number."""
    if c.given is not None or c.kind != "class" or type(c.feature).__name__ == "ClassLabel":
        return None
    values = c.values
    bad = not_finite_numbers(values)
    if not bad or len(bad) > max(1, len(values) // 20):  # all numbers, or words: not a stray cell
        return None
    stray = {r for r, _ in bad}
    if any(not float(v).is_integer() for i, v in enumerate(values) if i not in stray):
        row, value = bad[0]
        return (f"label column '{c.column}' holds numbers but {value!r} at row {row + 1} is not a finite number "
                f"({len(bad)} such cell(s)); fix or drop those rows for a regression, or set "
                "problem_type=single_label_classification if the values are classes")
    return None


@rule("labels.lists_of_one_label", warning=True)
def lists_of_one_label(c: Column) -> str | None:
    """A list of exactly one label in every training sample: multi-label, where one class a sample is
    written as a name."""
    if c.given is None and c.kind == "list" and len(c.train) > 1 and all(
            labels is not None and len(labels) == 1 for labels in c.values):  # fmt: skip
        return (f"label column '{c.column}' holds a list of exactly one label in every training sample: trained as "
                "multi-label (a yes or no for each label, any number a sample); for one class a sample, write the label "
                f"as a name, not a list (\"{c.column}\": \"neg\"), or set problem_type=multi_label_classification to "
                "keep it without this warning")
    return None


@rule("labels.lists_for_single_label")
def lists_for_single_label(c: Column) -> str | None:
    """Lists of labels asked to be single-label."""
    if c.given == SINGLE and c.kind == "list":
        return (f"label column '{c.column}' holds lists of labels, a multi-label problem; set "
                "problem_type=multi_label_classification (or null)")
    return None


def _regression_of_names(c: Column) -> list[tuple[int, Any]] | None:
    """For a regression asked of class names: the values that are not numbers; None when not that case."""
    if c.given != REGRESSION or c.kind in ("int", "float") or c.kind == "list" or type(c.feature).__name__ == "ClassLabel":
        return None
    return not_finite_numbers(c.values)


@rule("labels.dressed_numbers")
def dressed_numbers(c: Column) -> str | None:
    """Regression targets written with a unit or a separator ("81%", "$1,200", "3.5 kg")."""
    bad = _regression_of_names(c)
    dressed = [v for _, v in bad or () if isinstance(v, str) and number_as_written(v)]
    if bad and len(dressed) * 10 >= len(bad) * 9:
        return (f"label column '{c.column}' holds numbers written with a unit or a separator (e.g. {dressed[0]!r}): "
                "regression reads plain numbers; write them plainly (81 for 81%, or 0.81; 1200 for $1,200)")
    return None


@rule("labels.classes_for_regression")
def classes_for_regression(c: Column) -> str | None:
    """Class names with no number among them given to a regression (IMDb's sentiment under the regression
    recipe)."""
    bad = _regression_of_names(c)
    if bad and len(bad) == len(c.train):
        return (f"label column '{c.column}' holds class names (e.g. {bad[0][1]!r}), not numbers: to predict these "
                "classes, set problem_type=single_label_classification (or train with "
                "finetune/configs/bert_custom_files.yaml)")
    return None


@rule("labels.numbers_as_text")
def numbers_as_text(c: Column) -> str | None:
    """Regression targets that are numbers written as text ("3.5" in JSON)."""
    bad = _regression_of_names(c)
    if bad is not None and not bad:
        example = next(iter(c.values), "")
        return (f"label column '{c.column}' holds numbers written as text (e.g. {example!r}); regression reads "
                f"numbers: write them without quotes (JSON: \"{c.column}\": 3.5)")
    return None


@rule("labels.not_numbers_for_regression")
def not_numbers_for_regression(c: Column) -> str | None:
    """A regression whose labels are no numbers (lists, class ids, or numbers with a stray word)."""
    if c.given != REGRESSION or c.kind in ("int", "float"):
        return None
    what = "lists" if c.kind == "list" else "class names" if type(c.feature).__name__ != "ClassLabel" else "class ids"
    where, bad = "", not_finite_numbers(c.values) if what == "class names" else []
    if bad:  # a column of numbers with a stray word ("n/a", "NaN"): the first such cell
        row, value = bad[0]
        where = f" ({value!r} at row {row + 1} is not a finite number)"
    fix = " written plainly (1000, 0.5: no thousands separator, decimal comma or unit)" if where else ""
    return f"label column '{c.column}' holds {what}{where}; regression needs one number per sample{fix}"


@rule("labels.multi_label_without_lists")
def multi_label_without_lists(c: Column) -> str | None:
    """multi_label_classification asked of a column that holds no lists."""
    if c.given == MULTI and c.kind != "list":
        return (f'multi_label_classification needs a label column of lists (JSON: "label": ["a", "b"]) or '
                f"label_columns=a,b,c naming 0/1 columns; label column '{c.column}' holds {c.feature}")
    return None


PROBLEM = [mixed_kinds, no_kind_of_label, floats_as_classes, a_stray_fraction, numbers_with_a_stray_cell,
           lists_of_one_label, lists_for_single_label, dressed_numbers, classes_for_regression, numbers_as_text,
           not_numbers_for_regression, multi_label_without_lists]  # fmt: skip


# --- single-label classes ----------------------------------------------------------------------------------------


class Classes:
    """A single-label column's classes as the training split holds them: `present` (the names), `named` (the
    names label_names lists: the user's own, which no heuristic second-guesses), `names` (the label set in
    id order) and `feature`."""

    def __init__(self, train, column: str, present: set[str], label_names: list[str] | None, names: list[str],
                 row_name=None):  # fmt: skip
        self.train, self.column, self.present, self.names = train, column, present, names
        self.row_name = row_name  # how a line names row i (a stream's block: its row in the file), else "row i+1"
        self.given = list(label_names or [])
        self.named = set(self.given)
        self.feature = train.features[column]

    def row_of(self, value: str) -> str:
        """The first row that holds `value`, as a line names it ("row 3")."""
        i = next(i for i, v in enumerate(self.train[self.column]) if str(v) == value)
        return self.row_name(i) if self.row_name is not None else f"row {i + 1}"


@rule("labels.single_class")
def single_class(c: Classes) -> str | None:
    """A label column with one class: a classifier needs two."""
    if len(c.present) < 2:
        return (f"label column '{c.column}' has a single class ({', '.join(c.present) or 'none'}); a classifier needs "
                "at least two")
    return None


@rule("labels.list_written_as_text")
def list_written_as_text(c: Classes) -> str | None:
    """Class names that are lists written as text ("['art', 'film']": a multi-label set saved by a CSV writer)."""
    listy = next((v for v in sorted(c.present) if re.fullmatch(r"\s*\[.*\]\s*", v, re.S) and v not in c.named), None)
    if listy is not None:
        return (f"label column '{c.column}' holds a list written as text ({listy!r} at {c.row_of(listy)}); for "
                'several labels a sample, give real lists (JSON Lines: "label": ["art", "film"]) or 0/1 columns '
                "(label_columns); for one label a sample, remove the brackets and quotes (or, if that is a class's "
                "name, list it in label_names)")
    return None


@rule("labels.header_inside_the_file")
def header_inside_the_file(c: Classes) -> str | None:
    """The label column's own name among its labels: a CSV whose header line was pasted in again."""
    if c.column in c.present and c.column not in c.named:
        return (f"label column '{c.column}' holds the label {c.column!r} at {c.row_of(c.column)}: the header "
                "repeated inside the file; remove that row (or, if it is a class's name, list it in label_names)")
    return None


@rule("labels.line_break_in_a_label")
def line_break_in_a_label(c: Classes) -> str | None:
    """A label with a line break in it ("pos\\nx"): a quoted field that ran on into the next line."""
    broken = next((v for v in sorted(c.present) if re.search(r"\S[\r\n]+\S", v) and v not in c.named), None)
    if broken is not None:
        return (f"label column '{c.column}' holds a label with a line break ({broken!r} at {c.row_of(broken)}): a "
                "quote left open in the file, so the field ran on into the next line? fix the quoting (or, if that "
                "is a class's name, list it in label_names)")
    return None


@rule("labels.blank_label")
def blank_label(c: Classes) -> str | None:
    """An empty (blank) label that a CSV kept as text."""
    blank = next((v for v in sorted(c.present) if not v.strip()), None)
    if blank is not None:
        return f"label column '{c.column}' has an empty (blank) label at {c.row_of(blank)}; give that sample its label or drop the row"
    return None


@rule("labels.space_twins")
def space_twins(c: Classes) -> str | None:
    """Two labels that differ only by surrounding spaces: they would be two classes."""
    stripped: dict[str, str] = {}
    for name in sorted(c.present):
        twin = stripped.setdefault(name.strip(), name)
        if twin != name:
            odd = name if name not in c.names else twin  # a stream's block: the label its first rows did not hold
            return (f"label column '{c.column}' holds {twin!r} and {name!r}, which differ only by spaces and would be "
                    f"two classes ({odd!r} at {c.row_of(odd)}); strip the spaces in the data")
    return None


@rule("labels.spaced_labels", warning=True)
def spaced_labels(c: Classes) -> str | None:
    """Labels written with a space around them: names that evaluation data without it won't match."""
    spaced = sorted(v for v in c.present if v != v.strip() and v not in c.named)
    if spaced:
        return (f"label column '{c.column}' has labels that begin or end with a space ({', '.join(map(repr, spaced[:3]))}"
                f"{', ...' if len(spaced) > 3 else ''}): they are class names as written; strip the spaces in the data "
                "unless they are part of the names")
    return None


@rule("labels.look_alike_classes")
def look_alike_classes(c: Classes) -> str | None:
    """Two labels that read the same but differ in Unicode form or by an invisible character."""
    alike = look_alike(c.present, allowed=c.named)
    if alike:
        odd = alike[1] if alike[1] not in c.names else alike[0]  # a stream's block: the label its first rows did not hold
        return (f"label column '{c.column}' holds {shown(alike[0])} and {shown(alike[1])}, " + LOOK_ALIKE.format("classes")
                + f"; {shown(odd)} is first at {c.row_of(odd)}")
    return None


@rule("labels.case_twin_classes")
def case_twin_classes(c: Classes) -> str | None:
    """Two labels that differ only by letter case (unless label_names lists both: the user's own two classes)."""
    twins = case_twins(c.present, allowed=c.named)
    if twins:
        odd = twins[1] if twins[1] not in c.names else twins[0]  # a stream's block: the label its first rows did not hold
        return (f"label column '{c.column}' holds {twins[0]!r} and {twins[1]!r}, which differ only by letter case and "
                f"would be two classes ({odd!r} at {c.row_of(odd)}); write each label the same way (or, if they are two "
                "classes, list both in label_names)")
    return None


@rule("labels.punctuation_twins")
def punctuation_twin_classes(c: Classes) -> str | None:
    """Two labels that differ only by punctuation ("neg" and "neg."): a stray full stop makes a class."""
    twins = punctuation_twins(c.present, allowed=c.named)
    if twins:
        return (f"label column '{c.column}' holds {twins[0]!r} and {twins[1]!r}, which differ only by punctuation and "
                "would be two classes; write each label the same way (or, if they are two classes, list both in "
                "label_names)")
    return None


def near_misses(unseen: list[str], known: list[str]) -> str:
    """For labels another split has that train lacks: those that are a known label but for surrounding
    spaces, letter case or Unicode form (a macOS folder name's café, decomposed, beside a composed one) and
    invisible characters, named (they are the same class written differently), with the fix."""
    forms = (str.strip, lambda t: t.strip().casefold(), lambda t: visible(t).strip().casefold())
    by_form = {(i, form(k)): k for k in known for i, form in enumerate(forms)}
    twins = [(u, next((by_form[i, f(u)] for i, f in enumerate(forms) if (i, f(u)) in by_form), None)) for u in unseen]
    twins = [(u, k) for u, k in twins if k is not None]
    if not twins:
        return ""
    what = " and ".join(sorted({"surrounding spaces" if u.strip() == k.strip() else "letter case"
                                if u.strip().casefold() == k.strip().casefold() else "Unicode form or invisible characters"
                                for u, k in twins}))  # fmt: skip
    pairs = ", ".join(f"{shown(u)} (train: {shown(k)})" for u, k in twins[:3])
    return f"; {pairs} differ from the training labels only by {what}: write each label the same way in every split"


def _absent(c: Classes) -> list[str]:
    return [n for n in c.names if n not in c.present]


@rule("labels.class_without_training_sample")
def class_without_training_sample(c: Classes) -> str | None:
    """A class another split names (an image folder's validation/Cat beside train/cat) that training has no
    sample of: the model could not learn it."""
    absent = _absent(c)
    if type(c.feature).__name__ != "ClassLabel" or c.given or not absent:
        return None
    twin = near_misses(absent[:1], sorted(c.present))
    if twin:
        return (f"class {shown(absent[0])} of label column '{c.column}' has no training sample{twin} (an image folder: name "
                "each class's folder the same in every split)")
    return (f"class {absent[0]!r} of label column '{c.column}' has no training sample (an image folder: no "
            f"train/{absent[0]}/ images, or max_train_samples left them out): the model could not learn it; give it "
            "training samples, or remove it from the other splits")


@rule("labels.label_names_written_otherwise")
def label_names_written_otherwise(c: Classes) -> str | None:
    """label_names that write the training labels in another case or with spaces (NEG, POS for neg, pos)."""
    unknown = c.present - set(c.names)
    forms = {n.strip().casefold(): n for n in c.names}
    twins = [(u, forms[u.strip().casefold()]) for u in sorted(unknown) if u.strip().casefold() in forms]
    if twins:
        return (f"training labels {sorted(unknown)} are not in label_names {c.names}, which write them otherwise "
                f"({twins[0][0]!r} is {twins[0][1]!r} there: letter case or spaces); write label_names as the data does, "
                "or set label_names=null to take them from the data")
    return None


@rule("labels.not_in_label_names")
def not_in_label_names(c: Classes) -> str | None:
    """Training labels that label_names does not list."""
    unknown = c.present - set(c.names)
    if unknown:
        return (f"training labels {sorted(unknown)} are not in label_names {c.names}; list them all in label_names, or "
                "set label_names=null to take them from the data (the recipe for your own files, "
                "finetune/configs/bert_custom_files.yaml, does)")
    return None


@rule("labels.named_class_without_sample", warning=True)
def named_class_without_sample(c: Classes) -> str | None:
    """A class label_names lists that has no training sample: the model cannot learn to predict it."""
    absent = _absent(c)
    if absent:
        return (f"{len(absent)} of the {len(c.names)} classes in label_names have no training sample ({_listed(absent)}; "
                "an image folder: no train/<class>/ images): the model cannot learn to predict them; give them "
                "training samples, or leave them out of label_names")
    return None


CLASSES = [single_class, list_written_as_text, header_inside_the_file, line_break_in_a_label, blank_label, space_twins,
           spaced_labels, look_alike_classes, case_twin_classes, punctuation_twin_classes,
           class_without_training_sample, label_names_written_otherwise, not_in_label_names,
           named_class_without_sample]  # fmt: skip


@rule("labels.tags_joined_as_a_class")
def tags_joined_as_a_class(values: list, column: str, split: str) -> str | None:
    """A label column of IOB2 tags joined by spaces ("O B-geo I-geo O"): a tagging row's tags in one cell,
    which a classifier would read as one class each."""
    example = joined_tags(values)
    return joined_tags_line(column, split, example) if example else None


JOINED_TAGS = [tags_joined_as_a_class]


@rule("labels.class_ids_read_as_names", warning=True)
def class_ids_read_as_names(column: str, pairs: str, names: list[str], what: str) -> str:
    """Class ids (0, 1, ...) in the label column beside label_names that are names (the Hub's habit: the ids
    in the data, the names in its card): each id is read as the name at its place in label_names."""
    return (f"label column '{column}' holds class ids, read as the names at their places in label_names ({pairs}); if "
            "label_names lists them in another order, fix its order")


IDS_AS_NAMES = [class_ids_read_as_names]


@rule("labels.class_ids_read_as_the_models", warning=True)
def class_ids_read_as_the_models(column: str, pairs: str, names: list[str], what: str) -> str | None:
    """Evaluated labels that are class ids, read as the model's classes at those places (as training reads
    ids through label_names); nothing is said for transformers' own LABEL_<id> names."""
    if names == [f"LABEL_{i}" for i in range(len(names))]:
        return None
    return (f"the labels of {what} are class ids, read as the model's classes at those places ({pairs}), as training "
            "reads ids through label_names; if the data numbers its classes in another order, the scores are wrong: "
            "write the classes as names")


MODEL_IDS_AS_NAMES = [class_ids_read_as_the_models]


class Unseen:
    """A split's labels that the label set does not know."""

    def __init__(self, split: str, unseen: list[str], label_names: list[str], seen: set[str]):
        self.split, self.unseen, self.label_names, self.seen = split, unseen, label_names, seen


@rule("labels.unseen_near_a_training_label")
def unseen_near_a_training_label(u: Unseen) -> str | None:
    """A validation or test label that is a training label but for surrounding spaces or letter case."""
    near = near_misses(u.unseen, u.label_names)
    if near:
        return f"{u.split} labels {u.unseen[:5]} were not seen in training (known: {', '.join(u.label_names)}){near}"
    return None


@rule("labels.unseen_beside_default_names")
def unseen_beside_default_names(u: Unseen) -> str | None:
    """Labels scored against a model whose classes are transformers' defaults (LABEL_0, ...): its config.json
    holds no id2label."""
    if u.label_names == [f"LABEL_{i}" for i in range(len(u.label_names))]:
        return (f"{u.split} labels {u.unseen[:5]} were not seen in training (known: {', '.join(u.label_names)}); those "
                "are transformers' default names: the model's config.json holds no id2label (it was saved without its "
                "class names); put them back in its id2label and label2id, or give the labels as class ids (0, 1, ...)")
    return None


@rule("labels.ids_for_named_classes")
def ids_for_named_classes(u: Unseen) -> str | None:
    """Class ids (0, 1) in a split whose classes are names (neg, pos) in training or in the model: which order?"""
    ids = u.seen == {str(i) for i in range(len(u.seen))} and len(u.seen) <= len(u.label_names)
    if ids and not u.seen & set(u.label_names):
        order = ", ".join(f"{i} is {n}" for i, n in enumerate(u.label_names[: len(u.seen)]))
        return (f"{u.split} labels {u.unseen[:5]} were not seen in training (known: {', '.join(u.label_names)}); the "
                f"labels are class ids and the trained classes are names: write the names in the data (in the order "
                f"of the classes, {order})")
    return None


@rule("labels.unseen")
def unseen(u: Unseen) -> str:
    """A validation or test label the model was not trained on."""
    return (f"{u.split} labels {u.unseen[:5]} were not seen in training (known: {', '.join(u.label_names)}); a model "
            "predicts only the labels it was trained on: relabel or drop those rows, or train with them")


UNSEEN = [unseen_near_a_training_label, unseen_beside_default_names, ids_for_named_classes, unseen]


# --- multi-label lists and 0/1 columns -------------------------------------------------------------------------


@rule("labels.label_twice_in_a_list", warning=True)
def label_twice_in_a_list(lists: list, column: str, where: str) -> str | None:
    """Multi-label lists of names: a name written twice in one list (["a", "a"]: a typo for another label?)
    counts once. `where`: whose rows ("training", an evaluated file)."""
    repeated = [(row, labels) for row, labels in enumerate(lists)
                if isinstance(labels, list) and len(labels) != len({str(v) for v in labels})]  # fmt: skip
    if repeated:
        row, labels = repeated[0]
        return (f"{len(repeated)} {where} row(s) of label column '{column}' name a label twice (row {row + 1}: "
                f"{labels}): it counts once; a typo for another label? check those rows")
    return None


REPEATED = [label_twice_in_a_list]


@rule("labels.space_twins_in_lists")
def space_twins_in_lists(lists: list, column: str) -> str | None:
    """Multi-label names that differ only by surrounding spaces: they would be two labels."""
    stripped: dict[str, str] = {}
    for row, labels in enumerate(lists):
        for name in labels or []:
            if isinstance(name, str) and (twin := stripped.setdefault(name.strip(), name)) != name:
                return (f"label column '{column}' holds {twin!r} and {name!r} (row {row + 1}), which differ only by "
                        "spaces and would be two labels; strip the spaces in the data")
    return None


LIST_TEXTS = [space_twins_in_lists]


@rule("labels.null_in_a_list")
def null_in_a_list(lists: list, column: str, split: str) -> str | None:
    """A null inside a list of labels (["sports", null]): it would become a label named "None"."""
    row = next((i for i, labels in enumerate(lists) if labels and any(v is None for v in labels)), None)
    if row is not None:
        return (f"label column '{column}' in the {split} data has a null inside the list at row {row + 1}; name every "
                "label, or drop the null")
    return None


@rule("labels.empty_name_in_a_list")
def empty_name_in_a_list(lists: list, column: str, split: str) -> str | None:
    """An empty label ("") inside a list of labels."""
    row = next((i for i, labels in enumerate(lists)
                if labels and any(isinstance(v, str) and BLANK.fullmatch(v) for v in labels)), None)  # fmt: skip
    if row is not None:
        return (f"label column '{column}' in the {split} data has an empty label (\"\") inside the list at row "
                f"{row + 1}; name every label, or drop the empty one (an empty list is a sample with no label)")
    return None


@rule("labels.spans_as_labels")
def spans_as_labels(lists: list, column: str, split: str) -> str | None:
    """[[0, 12, "PER"]]: entities by their characters, not labels of the text."""
    nested = next((v for labels in lists for v in labels or () if isinstance(v, (list, tuple, dict))), None)
    return spans_line(column, split, nested) if character_span(nested) else None


@rule("labels.list_in_a_list")
def list_in_a_list(lists: list, column: str, split: str) -> str | None:
    """[["a"]]: a list inside the list would train a label named "['a']"."""
    for row, labels in enumerate(lists):
        nested = next((v for v in labels or () if isinstance(v, (list, tuple, dict))), None)
        if nested is not None:
            return (f"label column '{column}' in the {split} data has a list inside the list at row {row + 1} "
                    f"({nested!r}); give each row one flat list of label names")
    return None


NULLS_IN_LISTS = [null_in_a_list, empty_name_in_a_list, spans_as_labels, list_in_a_list]


@rule("labels.look_alike_labels")
def look_alike_labels(names: list[str], column: str) -> str | None:
    """Two multi-label names that read the same but differ in Unicode form or by an invisible character."""
    alike = look_alike(names)
    if alike:
        return f"label column '{column}' holds the labels {shown(alike[0])} and {shown(alike[1])}, " + LOOK_ALIKE.format("labels")
    return None


@rule("labels.case_twin_labels")
def case_twin_labels(names: list[str], column: str) -> str | None:
    """Two multi-label names that differ only by letter case: Art and art would be two labels."""
    twins = case_twins(names)
    if twins:
        return (f"label column '{column}' holds the labels {twins[0]!r} and {twins[1]!r}, which differ only by letter "
                "case and would be two labels; write each label the same way (or, if they are two labels, list both "
                "in label_names)")
    return None


LIST_NAMES = [look_alike_labels, case_twin_labels]


@rule("labels.label_names_of_label_columns")
def label_names_of_label_columns(given: list[str] | None, label_columns: list[str]) -> str | None:
    """label_names beside label_columns that name other labels (they may only order them)."""
    if given and sorted(given) != sorted(label_columns):
        return f"label_columns {label_columns} name the labels; label_names {given} must be the same names (or unset)"
    return None


LABEL_COLUMNS_NAMES = [label_names_of_label_columns]


@rule("labels.label_columns_of_other_labels")
def label_columns_of_other_labels(names: list[str], label_columns: list[str]) -> str | None:
    """Evaluation's label_columns that name other labels than the model's."""
    if names and sorted(names) != sorted(label_columns):
        return f"label_columns {label_columns} must name the labels {names} (in any order)"
    return None


LABEL_COLUMNS_OF = [label_columns_of_other_labels]


@rule("labels.not_zero_or_one")
def not_zero_or_one(ds, columns: list[str], split: str) -> str | None:
    """A 0/1 label column (label_columns) holding another value."""
    for column in columns:
        kind, values = kind_of(ds.features[column]), ds[column][:]
        # True == 1, 1.0 == 1; "0"/"1": a CSV column where a stray word made every value a string
        stray = next((i for i, v in enumerate(values) if v not in (0, 1, "0", "1")), None)
        if kind not in ("int", "float", "class") or type(ds.features[column]).__name__ == "ClassLabel" or stray is not None:
            held = values[stray] if stray is not None else ds.features[column]
            return (f"label column '{column}' in the {split} data holds {held!r}"
                    f"{f' at row {stray + 1}' if stray is not None else ''}; each of label_columns holds 0 or 1")
    return None


ZERO_ONE = [not_zero_or_one]


@rule("labels.not_lists_in_a_split")
def not_lists_in_a_split(ds, column: str, split: str) -> str | None:
    """A multi-label run's split whose label column holds no lists."""
    if not is_list(ds.features[column]):
        return (f"label column '{column}' in the {split} data holds {ds.features[column]}, not lists of labels; a "
                "multi-label run needs lists in every split")
    return None


LISTS_IN_SPLIT = [not_lists_in_a_split]


@rule("labels.empty_list")
def empty_list(lists: list, column: str, split: str, known: list[str], name_of) -> str | None:
    """An empty list of labels: it cannot be told from a missing one."""
    row = next((i for i, labels in enumerate(lists) if not labels), None)
    if row is not None:
        return (f"label column '{column}' in the {split} data has an empty list at row {row + 1}; every sample needs a "
                "label (an empty list cannot be told from a missing one): give samples with none of the labels a "
                'label of their own, e.g. ["none"], or use 0/1 columns (label_columns)')
    return None


@rule("labels.list_names_unknown")
def list_names_unknown(lists: list, column: str, split: str, known: list[str], name_of) -> str | None:
    """A multi-label name outside the label set (label_names, or training's)."""
    unknown: dict[str, int] = {}
    for row, labels in enumerate(lists):
        for v in labels:
            if name_of(v) not in known:
                unknown.setdefault(name_of(v), row + 1)
    if unknown:
        row, names = next(iter(unknown.values())), sorted(unknown)[:5]
        where = "are not in label_names" if split == "train" else "were not seen in training"
        return f"{split} labels {names} {where} (first at row {row}; known: {', '.join(known)})"
    return None


LIST_VALUES = [empty_list, list_names_unknown]


JOINED = re.compile(r"[^,;|/]+(([,;|] ?| / )[^,;|/]+)+")  # art,film  art;film  art|film  art / film


@rule("labels.joined_in_one_item", warning=True)
def joined_in_one_item(names: list[str], column: str) -> str | None:
    """Multi-label items that hold several labels joined in one string (["art,film"]): each such string would
    be a label of its own, beside its parts and their other orders."""
    joined = [n for n in names if JOINED.fullmatch(n) and not re.search(r"\d,\d", n)]
    if joined:
        return (f"label column '{column}' has {len(joined)} label(s) such as {joined[0]!r}: several labels joined in "
                f"one item? give each its own item ({json.dumps(re.split(r'[,;|] ?| / ', joined[0]))}), or list the "
                "labels in label_names to keep them as they are")
    return None


JOINED_ITEMS = [joined_in_one_item]


@rule("labels.label_never_positive", warning=True)
def label_never_positive(positives: list[float], names: list[str], samples: int) -> str | None:
    """A multi-label label that no training sample has: the model only learns never to predict it
    (class_weights cannot weigh positives that are not there)."""
    absent = [name for name, n in zip(names, positives, strict=False) if n == 0]
    if absent:
        return (f"{len(absent)} of the {len(names)} labels have no positive training sample ({_listed(absent)}): the "
                "model cannot learn to predict them; give them positive samples, or leave them out")
    return None


@rule("labels.label_always_positive", warning=True)
def label_always_positive(positives: list[float], names: list[str], samples: int) -> str | None:
    """A multi-label label on every training sample: nothing to tell apart, or a column of another meaning."""
    always = [name for name, n in zip(names, positives, strict=False) if n == samples]
    if always and samples > 1:
        return (f"{len(always)} of the {len(names)} labels are positive on every training sample ({_listed(always)}): "
                "the model learns to predict them always; give them negative samples, or leave them out")
    return None


POSITIVES = [label_never_positive, label_always_positive]


# --- regression targets -------------------------------------------------------------------------------------


@rule("labels.regression_outputs")
def regression_outputs(given: list[str] | None) -> str | None:
    """label_names of more than one name for a regression, which has one output."""
    if given and len(given) != 1:
        return f"a regression model has one output; label_names names it, got {given}"
    return None


REGRESSION_NAMES = [regression_outputs]


@rule("labels.outputs_named_by_the_task")
def outputs_named_by_the_task(given: list[str] | None, names: list[str], what: str) -> str | None:
    """label_names beside a problem whose outputs the task names (question answering's start and end, multiple
    choice's candidates' numbers): the setting would be ignored, and config.yaml and the card would say it."""
    if given and [str(n) for n in given] != names:
        return (f"label_names={list(given)} names classes; {what} are {', '.join(names)}, named by the task: leave "
                "label_names unset (null)")
    return None


FIXED_NAMES = [outputs_named_by_the_task]


# --- answers (question answering) -----------------------------------------------------------------------


@rule("labels.answers_not_squad")
def answers_not_squad(ds, column: str, context: str, split: str) -> str | None:
    """An answers column that is not the squad layout: {text: [...], answer_start: [...]} per question, lists of
    texts and of whole character offsets (a CSV's cell is text, which cannot hold it)."""
    feature = ds.features[column]
    layout = isinstance(feature, dict) and {"text", "answer_start"} <= set(feature)
    def of(part: str, kind: str) -> bool:  # a list of `kind` (or of nothing: every list empty)
        return is_list(feature[part]) and (kind_of(feature[part].feature) == kind or getattr(feature[part].feature, "dtype", "") == "null")

    if layout and of("text", "class") and of("answer_start", "int"):
        return None
    got = (f"answer_start of {feature['answer_start']}" if layout and is_list(feature["text"]) else
           "an answer that is not a list" if layout else f"{feature}")  # fmt: skip
    csv = " (a CSV cell is text: write the data as JSON Lines, one object a line)" if not layout and kind_of(feature) == "class" else ""
    return (f"the answers column '{column}' of the {split} data holds {got}; question answering reads the Hub's squad "
            "layout, one {\"text\": [...], \"answer_start\": [...]} per question: lists of the answers and of their "
            f"first characters' offsets in the context, whole numbers from 0, e.g. {{\"text\": [\"London\"], \"answer_start\": [25]}}{csv}")


@rule("labels.answer_not_in_context")
def answer_not_in_context(ds, column: str, context: str, split: str) -> str | None:
    """An answer whose text is not the context's at its answer_start: offsets counted otherwise (bytes, from
    1, of another version of the context), which would train on the wrong span; or an empty answer text."""
    for row, (text, answers) in enumerate(zip(ds[context][:], ds[column][:], strict=True)):
        texts, starts = answers["text"] or [], answers["answer_start"] or []
        where = f"row {row + 1} of the {split} data"
        if len(texts) != len(starts):
            return f"{where} has {len(texts)} answer text(s) and {len(starts)} answer_start(s); give one start for each answer"
        for answer, start in zip(texts, starts, strict=True):
            if not answer:
                return (f"{where} has an empty answer text; a question without an answer has empty lists "
                        "({\"text\": [], \"answer_start\": []}, SQuAD v2.0's unanswerable)")
            if text is None or start is None or not 0 <= start <= len(text) - len(answer) or \
                    text[start : start + len(answer)] != answer:  # fmt: skip
                found = f", where the context reads {shown(text[start : start + len(answer)])}" if text and start is not None \
                    and 0 <= start < len(text) else f" (the context has {len(text or '')} characters)"  # fmt: skip
                return (f"{where}: the answer {shown(answer)} is not at its answer_start {start} in the context{found}; "
                        "answer_start is the answer's first character in the context, counted in characters from 0")
    return None


@rule("labels.no_answer_to_learn")
def no_answer_to_learn(ds, column: str, context: str, split: str) -> str | None:
    """Training questions none of which has an answer: the model would learn only to answer nothing."""
    if split != "train" or any(a["text"] for a in ds[column][:]):
        return None
    return (f"no question of the training data has an answer (every '{column}' holds empty lists); extractive question "
            "answering learns from answers: give questions with their answers' spans")


ANSWERS = [answers_not_squad, answer_not_in_context, no_answer_to_learn]


class Targets:
    """A regression split's targets: the values (float64), the column, the split."""

    def __init__(self, values, column: str, split: str, feature):
        self.values, self.column, self.split, self.feature = values, column, split, feature


@rule("labels.targets_not_numbers")
def targets_not_numbers(t: Targets) -> str | None:
    """A regression split whose targets are not numbers."""
    if kind_of(t.feature) not in ("int", "float"):
        return f"label column '{t.column}' in the {t.split} data holds {t.feature}; regression needs numbers"
    return None


@rule("labels.targets_not_finite")
def targets_not_finite(t: Targets) -> str | None:
    """NaN or infinite regression targets."""
    import numpy as np

    bad = np.flatnonzero(~np.isfinite(t.values))
    if len(bad):
        return (f"label column '{t.column}' in the {t.split} data has {len(bad)} NaN or infinite target(s) (first at row "
                f"{bad[0] + 1}: {t.values[bad[0]]}); a regression target must be a finite number: fix or drop those rows")
    return None


@rule("labels.targets_too_large")
def targets_too_large(t: Targets) -> str | None:
    """Targets whose square overflows float32, in which the loss is computed: an infinite loss every step."""
    import numpy as np

    huge = np.flatnonzero(np.abs(t.values) > np.sqrt(np.finfo(np.float32).max))
    if len(huge):
        return (f"label column '{t.column}' in the {t.split} data has {len(huge)} target(s) too large for the float32 "
                f"loss (first at row {huge[0] + 1}: {t.values[huge[0]]:g}; its square overflows float32); scale the "
                "targets (divide them by a constant, or take their logarithm) and scale the predictions back")
    return None


@rule("labels.targets_all_the_same")
def targets_all_the_same(t: Targets) -> str | None:
    """The same number in every training row: a regression learns from targets that vary."""
    import numpy as np

    if t.split == "train" and len(t.values) > 1 and np.all(t.values == t.values[0]):
        return (f"label column '{t.column}' holds the same number ({t.values[0]:g}) in every training row; a regression "
                "learns from targets that vary: give samples with other values (or check label_column)")
    return None


@rule("labels.targets_too_small")
def targets_too_small(t: Targets) -> str | None:
    """Targets that round to 0 in float32 (1e-300): the model would learn zeros."""
    import numpy as np

    tiny = np.flatnonzero((t.values != 0) & (t.values.astype(np.float32) == 0))
    if len(tiny):
        return (f"label column '{t.column}' in the {t.split} data has {len(tiny)} target(s) too small for float32 (first "
                f"at row {tiny[0] + 1}: {t.values[tiny[0]]:g}, which rounds to 0); scale the targets (multiply them by "
                "a constant, or take their logarithm) and scale the predictions back")
    return None


FAR_TARGET = 15  # robust standard deviations (1.4826 x the median absolute deviation) from the median


@rule("labels.targets_far_from_the_rest", warning=True)
def targets_far_from_the_rest(t: Targets) -> str | None:
    """Targets far outside the others (45 typed for 4.5): trained on, they pull the model toward them and
    dominate the squared loss. Measured against the median and its absolute deviation, which the outliers
    themselves do not move much (a standard deviation would grow with them)."""
    import numpy as np

    if len(t.values) < 5:
        return None
    median = np.median(t.values)
    spread = 1.4826 * np.median(np.abs(t.values - median))
    far = np.flatnonzero(np.abs(t.values - median) > FAR_TARGET * spread) if spread else []
    if len(far):
        return (f"label column '{t.column}' in the {t.split} data has {len(far)} target(s) more than {FAR_TARGET} robust "
                f"standard deviations from the median {median:g} (first at row {far[0] + 1}: {t.values[far[0]]:g}); if "
                "they are typos, fix them; if they are right, a logarithm of the targets may train better")
    return None


TARGETS = [targets_not_numbers, targets_not_finite, targets_too_large, targets_all_the_same, targets_too_small,
           targets_far_from_the_rest]  # fmt: skip


# --- tags: a label per word --------------------------------------------------------------------------------


OTHER_SEPARATOR = re.compile(r"([BI])[_.:](\S+)")
PART_AFTER = re.compile(r"(\S+?)[-_.:]([BI])")


def tag_problem(tag: str, plain: bool = False, types: set[str] | frozenset = frozenset()) -> str | None:
    """What is wrong with a tag, with the fix; None when there is nothing. In an IOB2 tag set every tag is
    `O`, or `B-`/`I-` and a type (strict IOB2 scoring, seqeval, cannot read another); in a plain one
    (`plain_tags`) any name is a tag, but not a number (a CoNLL file's other column) nor a padded one.
    `types`: the entity types of the data's IOB2 tags, so that 'b-per' beside 'B-LOC' is told 'B-PER'."""
    if tag != tag.strip():
        return "has surrounding spaces, so it would be a tag of its own; strip the spaces in the data"
    if tag == "_":  # CoNLL's placeholder for a value not given
        return "is '_', CoNLL's mark for a value not given: that column holds no tags; give each word its tag"
    if IOB2_TAG.fullmatch(tag) or (plain and tag and not tag.isdigit()):
        return None
    if tag[:1] in ("o", "b", "i") and IOB2_TAG.fullmatch(tag[:1].upper() + tag[1:]):
        kind = tag[2:]
        upper = kind != kind.upper() and (kind.upper() in types or (types and all(t == t.upper() for t in types)))
        fixed = tag.upper() if upper else tag[:1].upper() + tag[1:]  # the type as the data's other tags write it
        return f"is not IOB2: its prefix is lower-case; write the B-, I- and O prefixes in capitals ({fixed!r})"
    other, after = OTHER_SEPARATOR.fullmatch(tag), PART_AFTER.fullmatch(tag)
    if other:
        return f"is not IOB2: write a hyphen after its B- or I- ({other[1]}-{other[2]!s})"
    if after:
        return f"is not IOB2: its B- or I- comes first ({after[2]}-{after[1]})"
    if tag.isdigit():  # a CoNLL file's tags are read as names
        return ("is a number, not an IOB2 tag name (O, B-PER, I-PER...); write the tag names in the file, or give "
                "integer ids in a JSON Lines file with label_names=[the tag of each id]")
    if re.fullmatch(r"[BIES]-\S.*|[SE]", tag) or tag in ("B", "I", "B-", "I-"):
        return ("is not IOB2 (O, or B- or I- and an entity type, e.g. B-PER); IOBES or bare prefixes cannot be scored: "
                "convert the tags to IOB2")
    return ("is not IOB2 (O, or B- or I- and an entity type, e.g. B-PER), beside tags that are: give each entity's "
            "first word B-<type> and the words after it I-<type> (a tag without a prefix, like PER, is neither); "
            "a set with no B-/I- tags at all (parts of speech) is scored word by word")


@rule("labels.tags_not_lists")
def tags_not_lists(ds, args, split: str) -> str | None:
    """A tags column that holds no lists: each row needs one tag per word."""
    feature = ds.features[args.tags_column]
    if not is_list(feature):
        return (f"tags column '{args.tags_column}' in the {split} data holds {feature}, not lists of tags; each row "
                'needs one tag per word, as a list ("ner_tags": ["B-PER", "O", ...])')
    return None


@rule("labels.tags_not_one_per_word")
def tags_not_one_per_word(ds, args, split: str) -> str | None:
    """A row with another number of tags than words (or none)."""
    for row, (tags, words) in enumerate(zip(ds[args.tags_column][:], ds[args.tokens_column][:], strict=True)):
        if tags is None or len(tags) != len(words):
            got = "no tags" if tags is None else f"{len(tags)} tag(s)"
            return f"the {split} data has {len(words)} word(s) but {got} at row {row + 1}; give each word its tag"
    return None


@rule("labels.tag_null")
def tag_null(ds, args, split: str) -> str | None:
    """An empty (null) tag."""
    for row, tags in enumerate(ds[args.tags_column][:]):
        if any(t is None for t in tags):
            return f"the {split} data has an empty (null) tag at row {row + 1}, word {tags.index(None) + 1}"
    return None


@rule("labels.tags_nested")
def tags_nested(ds, args, split: str) -> str | None:
    """A list inside a row's list of tags."""
    for row, tags in enumerate(ds[args.tags_column][:]):
        nested = next((i for i, t in enumerate(tags) if isinstance(t, (list, tuple, dict))), None)
        if nested is not None:
            return (f"the {split} data's tags at row {row + 1} hold a list inside the list (word {nested + 1}: "
                    f"{tags[nested]!r}); give each sentence one flat list of tags, one per word")
    return None


TAG_LISTS = [tags_not_lists, tags_not_one_per_word, tag_null, tags_nested]


@rule("labels.one_tag")
def one_tag(present: set, column: str, inner) -> str | None:
    """Training tags that are all one tag (all O): the loss is 0 from the first step, and nothing is learned."""
    if len(present) < 2:
        names = getattr(inner, "names", None)
        name = names[next(iter(present))] if names is not None and present else next(iter(present), None)
        return (f"tags column '{column}' in the train data holds one tag ({name!r}) in every word; a tagger needs at "
                "least two (the entities' B- and I- tags beside O)")
    return None


TAG_COUNT = [one_tag]


@rule("labels.tag_ids_without_names")
def tag_ids_without_names(column: str) -> str:
    """Integer tag ids without label_names to name them."""
    return (f"tags column '{column}' holds integer ids; set label_names to the tag of each id, in order "
            '(e.g. label_names=["O","B-PER","I-PER"])')


TAG_IDS = [tag_ids_without_names]


@rule("labels.tag_cut_short")
def tag_cut_short(counts: Counter) -> str | None:
    """A tag once beside a longer one many times ('B-LO' once, 'B-LOC' often): a file cut mid-line, not a
    new type."""
    for tag, count in counts.items():
        longer = max((t for t in counts if t != tag and t.startswith(tag)), key=counts.get, default=None)
        if count == 1 and longer is not None and counts[longer] > 1:
            return (f"tag {tag!r} appears once in the train data and {longer!r} {counts[longer]} times: a tag cut short "
                    f"(a file that ends mid-line?); fix it, or set label_names to the full tag set if {tag!r} is meant")
    return None


@rule("labels.tag_case_twins")
def tag_case_twins(counts: Counter) -> str | None:
    """B-PERSON and B-Person: one entity type written two ways."""
    twins = case_twins(counts)
    if twins:
        return (f"the train data's tags {twins[0]!r} and {twins[1]!r} differ only by letter case and would be two tags; "
                "write each tag the same way (or, if they are two tags, list both in label_names)")
    return None


TAG_NAMES = [tag_cut_short, tag_case_twins]


@rule("labels.tag_set_not_iob2")
def tag_set_not_iob2(tags: list[str], named: bool) -> str | None:
    """A tag of label_names (or of a ClassLabel) that strict IOB2 scoring cannot read, in a set that is not
    plain (the data's own tags are checked with their rows: columns.tag_not_iob2)."""
    plain = plain_tags(tags)
    for tag in tags:
        why = tag_problem(str(tag), plain)
        if why:
            where = "label_names' tag" if named else "the tags column's tag name"
            return f"{where} {str(tag)!r} {why}"
    return None


TAG_SET = [tag_set_not_iob2]


@rule("labels.tags_of_another_problem")
def tags_of_another_problem(given: str | None, scheme: str, names: list[str]) -> str | None:
    """A problem_type given for tags of the other scheme: token_classification (entities in IOB2, scored by
    seqeval) beside a plain tag set such as parts of speech, or word_tagging beside IOB2 tags. The tag names
    decide how a tagger is scored; a setting that disagrees would score it by the wrong words."""
    if given is None or given == scheme:
        return None
    shown = ", ".join(map(str, names[:6])) + (", ..." if len(names) > 6 else "")
    return (f"problem_type={given} does not fit these tags ({shown}), which make a {scheme} problem (tags with B-/I- "
            "prefixes are entities, scored whole; tags without them, parts of speech, are scored word by word); "
            "leave problem_type out: the tags decide it")


TAG_PROBLEM = [tags_of_another_problem]


@rule("labels.tag_unknown")
def tag_unknown(split: str, tag: Any, row: int, word: int, tag_set: list[str], listed: bool, fixed: bool) -> str:
    """A tag outside the tag set, at its row and word; `fixed`: the tag set is a trained model's (evaluation),
    which no setting changes."""
    if fixed:
        return (f"the {split} data's tag {tag!r} at row {row}, word {word} is not one of the model's tags "
                f"({', '.join(tag_set)}); fix the tag in the data (the model predicts only these)")
    where = "is not in label_names" if listed else "was not seen in training" if split != "train" else "is unknown"
    return (f"the {split} data's tag {tag!r} at row {row}, word {word} {where} (tags: {', '.join(tag_set)}); fix the "
            "tag, or list it in label_names")


TAG_UNKNOWN = [tag_unknown]


def invalid_iob2(tag_rows: list[list[int]], tag_set: list[str]) -> list[tuple[int, int]]:
    """I-X tags that follow neither B-X nor I-X (IOB2 has them start no entity): the (row, word) of each,
    both 1-based."""
    places = []
    for row, tags in enumerate(tag_rows):
        previous = "O"
        for word, tag_id in enumerate(tags):
            tag = tag_set[tag_id]
            if tag.startswith("I-") and previous[2:] != tag[2:]:
                places.append((row + 1, word + 1))
            previous = tag if tag[:2] in ("B-", "I-") else "O"
    return places


@rule("labels.tags_without_prefixes", warning=True)
def tags_without_prefixes(names: list[str], split: str, ds) -> str | None:
    """Entity types without B-/I- prefixes (O, PER, LOC): a plain tag set, each word scored on its own."""
    if split != "train" or not (plain_tags(names) and "O" in names):
        return None
    kinds = [n for n in names if n != "O"]
    return (f"the tags have no B-/I- prefixes (O, {', '.join(kinds[:5]) + (', ...' if len(kinds) > 5 else '')}): each "
            "word is scored on its own (word accuracy, and each tag's F1), not whole entities; to score whole "
            "entities, write them in IOB2 (B-PER for an entity's first word, I-PER for the words after it)")


def _iob1(names: list[str], ds) -> tuple[int, int] | None:
    """(entities that start with I-, entities) where most entities do (IOB1: B- only where two entities of a
    type touch, as CoNLL-2003's original files write them); None otherwise."""
    starts = sum(1 for tags in ds["labels"][:] for i, t in enumerate(tags)
                 if names[t].startswith("B-") or (names[t].startswith("I-") and (i == 0 or names[tags[i - 1]][2:] != names[t][2:]
                                                                              or names[tags[i - 1]] == "O")))  # fmt: skip
    opened = len(invalid_iob2(ds["labels"], names))
    return (opened, starts) if starts and opened * 2 > starts else None


@rule("labels.iob1_tags", warning=True)
def iob1_tags(names: list[str], split: str, ds) -> str | None:
    """Tags in IOB1 (most entities start with I-; B- only where two entities of one type touch): strict IOB2
    scoring starts no entity at an I-, so those entities count as O, in training's scores and in the model's."""
    found = _iob1(names, ds)
    if found:
        return (f"the {split} data's tags read as IOB1 ({found[0]} of its {found[1]} entities start with I-, where IOB2 "
                "starts every entity with B-): strict IOB2 scoring counts those entities as O; convert the tags to IOB2 "
                "(an entity's first word B-<type>, the words after it I-<type>)")
    return None


@rule("labels.invalid_iob2", warning=True)
def invalid_iob2_tags(names: list[str], split: str, ds) -> str | None:
    """An I- tag that follows no B- or I- of its type: strict IOB2 scoring starts no entity there. Counted and
    named (in a share held out of the training file, by its row there), not repaired; tags that read as IOB1
    throughout have their own rule."""
    places = invalid_iob2(ds["labels"], names)
    if not places or _iob1(names, ds):
        return None
    file_rows = getattr(ds, "file_rows", None)
    if file_rows is None:
        row, word = min(places)
        where = f"row {row}"
    else:
        row, word = min((file_rows[r - 1] + 1, w) for r, w in places)
        where = f"row {row} of the training file"
    return (f"the {split} data has {len(places)} I- tag(s) that follow no B- or I- of their type (first at {where}, "
            f"word {word}); strict IOB2 scoring starts no entity there: fix the tags (an entity starts with B-) or "
            "leave them and know they count as O")


TAGS_READ = [tags_without_prefixes, iob1_tags, invalid_iob2_tags]


# --- what the classes look like, once read -----------------------------------------------------------------------


EMPTY_CELL = ("nan", "NaN", "NAN", "<NA>", "null", "NULL", "N/A", "n/a", "#N/A")
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "y", "t", "on"), ("false", "no", "n", "f", "off")


def no_label_mark(names: list[str], counts: Counter) -> str:
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


def misspelt_class(names: list[str], counts: Counter, named) -> str:
    """A rare class whose name is one slip away from a common one ('positve' once beside 'positive' 180
    times: at most 2 samples, the other 10 or more and 10 times as many, a similarity of 0.8 or more),
    said as "'positve' (1 sample) beside 'positive' (180): a misspelling?"; "" when none, or when
    label_names lists both."""
    named, of = set(named or ()), {names[i]: c for i, c in counts.items()}
    common = [n for n, c in of.items() if c >= 10]
    for rare, count in sorted(((n, c) for n, c in of.items() if c <= 2), key=lambda x: x[1]):
        often = [n for n in common if of[n] >= 10 * count]
        near = difflib.get_close_matches(rare, often, n=1, cutoff=0.8) or [n for n in often if one_slip(rare, n)][:1]
        if near and not {rare, near[0]} <= named:
            return f"{rare!r} ({count} sample{'s' if count > 1 else ''}) beside {near[0]!r} ({of[near[0]]}): a misspelling?"
    return ""


def one_slip(a: str, b: str) -> bool:
    """Names of 3 letters or more one keystroke apart: a letter added, dropped or changed, or two neighbours
    swapped ('pso' for 'pos', which difflib's ratio puts at 0.67)."""
    if min(len(a), len(b)) < 3 or a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) != len(b):
        short, long = sorted((a, b), key=len)
        return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                              and a[diff[1]] == b[diff[0]])  # fmt: skip


def what_the_labels_look_like(names: list[str]) -> str:
    """Why a single-label column may have as many classes as a split cannot hold: numbers written with
    separators or units (1,000  3,5  50%), label sets joined in one cell (art,film  art;film), one number
    or one answer written two ways (01 and 1; no, yes, False, True), ids beside names (0, 1, neg, pos)."""
    sets = [n for n in names if re.fullmatch(r"[^,;|]+([,;|] ?[^,;|]+)+", n) and not re.search(r"\d[,]\d", n)]
    # 1,000  3,5  0.25  50%  $5  3.2 stars: not the class ids 0, 1, 2, nor the ranks 1st, 2nd
    numbers = [n for n in names if number_as_written(n) and not re.fullmatch(r"\s*[-+]?\d+\s*", n)]
    if len(numbers) > len(names) // 2:
        return (f"{len(names)} classes such as {numbers[0]!r}: numbers, not classes? for a regression write them "
                "plainly, without units, 1000 or 0.5, and set problem_type=regression")
    if sets:
        return (f"{len(names)} classes such as {sets[0]!r}: several labels in one cell? for multi-label give lists "
                "(JSON Lines) or 0/1 columns (label_columns)")
    values: dict[float, list[str]] = {}  # 01 and 1, 1.0 and 1: one number, two classes
    for n in names:
        if re.fullmatch(r"\s*[-+]?\d+(\.\d+)?\s*", n):
            values.setdefault(float(n), []).append(n)
    twins = next((ns for ns in values.values() if len(ns) > 1), None)
    if twins:
        return (f"{len(names)} classes such as {twins[0]!r} and {twins[1]!r}: the same number written two ways? write "
                "each label one way")
    truth = {n: n.strip().lower() in TRUE_WORDS for n in names if n.strip().lower() in (*TRUE_WORDS, *FALSE_WORDS)}
    if len(truth) == len(names) > 2:  # no, yes, False, True: two answers written two ways?
        falses, trues = [n for n in names if not truth[n]], [n for n in names if truth[n]]
        a, b = falses[:2] if len(falses) > 1 else trues[:2]
        return f"{len(names)} classes such as {a!r} and {b!r}: yes/no written in more than one way? write each label one way"
    ids = [n for n in names if re.fullmatch(r"\s*-?\d+\s*", n)]
    words = [n for n in names if n not in ids]
    if len(ids) >= 2 and len(words) >= 2:  # 0, 1, neg, pos: one set of classes written two ways?
        return (f"{len(names)} classes such as {ids[0]!r} and {words[0]!r}: ids and names of the same classes? write "
                "each label one way")
    folded = sorted({n.strip().casefold(): n for n in words}.items())
    short = [(a, b) for (fa, a), (fb, b) in zip(folded, folded[1:], strict=False)
             if len(fa) >= 3 and fb.startswith(fa) and fb[len(fa):].isalpha()]  # neg/negative, not doc1/doc10
    if len(short) >= 2:  # neg, negative, pos, positive: each class written short and in full?
        (a, b), (c, d) = short[:2]
        return (f"{len(names)} classes such as {a!r} and {b!r}, {c!r} and {d!r}: each class written short and in "
                "full? write each label one way")
    return ""


class Trained:
    """The training split's encoded classes, as the warnings read them: the names, the count of each id, the
    settings (`label_names` given, the column), the samples."""

    def __init__(self, names: list[str], counts: Counter, args, samples: int):
        self.names, self.counts, self.args, self.samples = names, counts, args, samples


@rule("labels.no_label_mark", warning=True)
def no_label_mark_rule(t: Trained) -> str | None:
    """A data set's mark for "no label" trained as a class of its own (-1 beside the class ids, SNLI's '-',
    an empty cell written as text)."""
    mark = no_label_mark(t.names, t.counts) if not t.args.label_names else ""
    if mark:
        return (f"label column '{t.args.label_column}' holds {mark}; drop those rows (or list the label in label_names "
                "to keep it as a class)")
    return None


@rule("labels.misspelt_class", warning=True)
def misspelt_class_rule(t: Trained) -> str | None:
    """A rare class one slip from a common one ('positve' once beside 'positive' 180 times): a class of its own,
    never learned."""
    misspelt = misspelt_class(t.names, t.counts, t.args.label_names)
    if misspelt:
        return (f"label column '{t.args.label_column}' holds {misspelt} fix the label in the data, or list both in "
                "label_names if they are two classes")
    return None


@rule("labels.classes_of_another_kind", warning=True)
def classes_of_another_kind(t: Trained) -> str | None:
    """Classes that look like something else (decimal numbers, joined label sets, one number written two ways,
    yes/no written several ways, ids beside names, names short and in full): trained as asked, and said."""
    looks = what_the_labels_look_like(t.names) if not t.args.label_names else ""
    if looks:
        return f"training a classifier of {looks}; list them in label_names to keep them as classes without this warning"
    return None


@rule("labels.a_class_a_sample", warning=True)
def a_class_a_sample(t: Trained) -> str | None:
    """About as many classes as samples: an id or a text column read as the label?"""
    if not t.args.label_names and not what_the_labels_look_like(t.names) and len(t.names) * 2 > t.samples > 2:
        return (f"label column '{t.args.label_column}' holds {len(t.names)} classes for {t.samples} training samples, "
                "most with one sample each: is it an id or a text column? set label_column to the column of classes "
                "(or list them in label_names to keep them as classes without this warning)")
    return None


TRAINED_AS = [no_label_mark_rule, misspelt_class_rule, classes_of_another_kind, a_class_a_sample]


# --- multiple choice: the right candidate's number (finetune/problems/choices.py) -----------------------------


@dataclass
class Candidates:
    """A split's multiple-choice labels against its candidates: `values`, the distinct labels as the data holds
    them; `count` candidates (`prefix`0 ...); `names`, training's (or the model's) candidate numbers; `right`, how
    often each number is right in training (None for another split)."""

    split: str
    values: list
    count: int
    prefix: str
    names: list[str]
    fixed: bool = False
    right: Counter | None = None


def candidate_number(value) -> str | None:
    """A label as a candidate's number ("2" for 2, "2", 2.0), or None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text if re.fullmatch(r"\d+", text) else None


@rule("labels.candidates_unlike_the_models")
def candidates_unlike_the_models(c: Candidates) -> str | None:
    """Data for a multiple-choice model with another number of candidates than it was trained on: it scores
    as many as it learned to choose among."""
    if not c.fixed or c.count == len(c.names):
        return None
    return (f"the {c.split} data has {c.count} candidates ({c.prefix}0 to {c.prefix}{c.count - 1}); the model was "
            f"trained on {len(c.names)}: give it data with {c.prefix}0 to {c.prefix}{len(c.names) - 1}")


@rule("labels.not_a_candidate_number")
def not_a_candidate_number(c: Candidates) -> str | None:
    """A multiple-choice label that is not the number of one of its candidates: a letter (A-D), the right
    answer's text, numbers counted from 1, a number past the last candidate."""
    numbers = [candidate_number(v) for v in c.values]
    bad = [v for v, n in zip(c.values, numbers, strict=True) if n is None or int(n) >= c.count]
    if not bad:
        return None
    letters = all(isinstance(v, str) and re.fullmatch(r"[A-Za-z]", v.strip()) for v in bad)
    from_one = all(n is not None for n in numbers) and {int(n) for n in numbers} <= set(range(1, c.count + 1))
    texts = all(n is None for n in numbers)
    hint = ("map the letters to numbers (A to 0, B to 1, ...)" if letters else "the numbers count from 1 here: "
            "subtract 1" if from_one else "write the right candidate's number, not its text" if texts
            else "check these rows")  # fmt: skip
    return (f"the {c.split} labels {', '.join(shown(str(v)) for v in sorted(bad, key=str)[:4])} are not candidates' numbers: a label is the "
            f"right candidate's number, 0 for {c.prefix}0 to {c.count - 1} for {c.prefix}{c.count - 1}; {hint}")


@rule("labels.right_candidate_always_the_same")
def right_candidate_always_the_same(c: Candidates) -> str | None:
    """Every training question answered by the same candidate (the right answer always written first): the
    model would learn the position, not the answer, and a validation split written alike would not tell."""
    if c.right is None or len(c.right) != 1 or sum(c.right.values()) < 2:
        return None
    (number, n), = c.right.items()
    return (f"every one of the {n} training labels is {number} ({c.prefix}{number} always the right candidate): "
            f"the model would learn the position, not the answer; shuffle each row's candidates and set its label "
            f"to where the right one went")


CANDIDATES = [candidates_unlike_the_models, not_a_candidate_number]
CANDIDATES_TRAINED = [right_candidate_always_the_same]
