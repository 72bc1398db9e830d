"""The three problems a classifier head is asked to solve: their labels, loss and predictions.

    problem_type                  labels of a sample           outputs  loss per sample          metrics
    single_label_classification   one class name or id         K        cross-entropy            accuracy, macro F1
    multi_label_classification    a list of names, or 0/1      K        BCE with logits, mean    micro/macro F1, subset accuracy,
                                  columns (`label_columns`)             over the K labels        per-label F1 at a threshold
    regression                    one number                   1        squared error            mse, mae, r2, pearson, spearman

`problem_type: null` reads it from train's label column: class names (strings, a ClassLabel) or
integer ids -> single-label; numbers with decimals -> regression; lists -> multi-label; and
`label_columns` -> multi-label. Whole numbers stored as floats (`1.0`, `2.0`, or JSON that mixes `1`
and `2.0`, which Arrow reads as one float column) are ambiguous -- class ids or numbers to predict? --
and refused with a line that names both fixes. A float column is never a class column; an int column
is a regression target only when problem_type says so.

Labels in the `labels` column: a ClassLabel id (single-label), a float32 (regression), a float32
multi-hot vector of K (multi-label). A regression model has one output named after the label column
(its `id2label`), so `pipeline(..., function_to_apply="none")` returns the number under that name.

The per-sample loss is what finetune/run.py masks to real samples and scales by the window's sample
count (docs/topologies.md: the math of exact accumulation), so accumulation and DDP equal one big batch for every
problem type: transformers' BCEWithLogitsLoss and MSELoss are the mean of these per-sample values.

Bad labels are one-line errors (exit 2): NaN or infinite regression targets, an empty label list, a
label name outside `label_names`, a float column asked to be single-label, a list column asked to be
a regression, a 0/1 column holding another value.
"""

from __future__ import annotations

import collections
import json
import math
import re
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import ClassLabel, Sequence, Value
from datasets import Dataset as HFDataset

from finetune.config import DataArgs
from finetune.errors import UserError, warn
from finetune.metrics import MULTI, REGRESSION, SINGLE, TOKENS
from finetune.tasks import BLANK, character_span, shown, spans_error, task_of, visible

# --- which problem ---------------------------------------------------------------------------------


def _is_list(feature: Any) -> bool:
    return type(feature).__name__ in ("List", "LargeList", "Sequence") or isinstance(feature, list)


def _kind(feature: Any) -> str | None:
    """'class' (names, a ClassLabel, booleans), 'int', 'float', 'list' or None (none of them)."""
    if isinstance(feature, ClassLabel):
        return "class"
    if _is_list(feature):
        return "list"
    dtype = getattr(feature, "dtype", "") if isinstance(feature, Value) else ""
    if dtype in ("string", "large_string", "bool"):
        return "class"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("float") or dtype == "double":
        return "float"
    return None


def infer_problem_type(train: HFDataset, args: DataArgs) -> str:
    """`args.problem_type` checked against train's labels, or read from them when it is null."""
    given = args.problem_type
    if task_of(args.task).problems == (TOKENS,):  # a tag per word: the task's one problem
        return TOKENS
    if args.label_columns:
        return MULTI  # TrainConfig refuses another problem_type beside label_columns
    column = args.label_column
    feature = train.features[column]
    kind = _kind(feature)
    if kind is None:
        if type(feature).__name__ == "Json":  # datasets' type for a JSON column of mixed kinds
            raise UserError(
                f"label column '{column}' mixes kinds of value (in JSON: \"1\" quoted in some rows and 1 bare in "
                "others, or names beside lists); write every label one way (all names in quotes, all numbers, "
                "or all lists)"
            )
        raise UserError(
            f"label column '{column}' holds {feature}; labels are class names or integer ids, numbers "
            "(regression) or lists of names (multi-label)"
        )
    if kind == "float" and given in (None, SINGLE):
        values = np.asarray(list(train[column]), dtype=np.float64)
        fraction = next((v for v in values if math.isfinite(v) and v != round(v)), None)
        if given == SINGLE or fraction is None:
            example = fraction if fraction is not None else values[0]
            fix = "problem_type=regression to predict them as numbers, or write class ids as integers (1, 2, ...)"
            what = (
                "holds numbers with decimals"
                if fraction is not None
                else "holds whole numbers stored as floats"
            )
            problem = (
                f"; single_label_classification needs classes: set {fix}"
                if given
                else f" (ambiguous): set {fix}"
            )
            raise UserError(f"label column '{column}' {what} (e.g. {example:g}){problem}")
        rows = [i for i, v in enumerate(values) if math.isfinite(v) and v != round(v)]
        wholes = {v for v in values if math.isfinite(v) and v == round(v)}
        if given is None and len(rows) <= len(values) // 10 and len(wholes) <= 20:  # 0/1 ... and one 1.5
            warn(f"label column '{column}' holds whole numbers ({len(wholes)} values) and {len(rows)} with decimals "
                 f"({values[rows[0]]:g} at row {rows[0] + 1}): trained as a regression; if the labels are classes, "
                 "fix those rows (or set problem_type=regression to say it is one)")
        return REGRESSION
    if given is None:
        if kind == "class" and not isinstance(feature, ClassLabel):
            _check_not_numbers_with_a_stray_cell(train, column)
        if kind == "list" and len(train) > 1 and all(labels is not None and len(labels) == 1 for labels in train[column]):
            warn(f"label column '{column}' holds a list of exactly one label in every training sample: trained as "
                 "multi-label (a yes or no for each label, any number a sample); for one class a sample, write the "
                 f"label as a name, not a list (\"{column}\": \"neg\"), or set "
                 "problem_type=multi_label_classification to keep it without this warning")
        return {"list": MULTI, "class": SINGLE, "int": SINGLE}[kind]
    if given == SINGLE and kind == "list":
        raise UserError(
            f"label column '{column}' holds lists of labels, a multi-label problem; set "
            "problem_type=multi_label_classification (or null)"
        )
    if given == REGRESSION and kind not in ("int", "float"):
        what = (
            "lists"
            if kind == "list"
            else "class names"
            if not isinstance(feature, ClassLabel)
            else "class ids"
        )
        where, bad = "", _not_finite_numbers(train[column]) if what == "class names" else []
        dressed = [v for _, v in bad if isinstance(v, str) and number_as_written(v)]  # bad: not plain numbers
        if bad and len(dressed) * 10 >= len(bad) * 9:  # "81%", "$1,200", "3.5 kg": numbers a spreadsheet dressed
            raise UserError(f"label column '{column}' holds numbers written with a unit or a separator (e.g. "
                            f"{dressed[0]!r}): regression reads plain numbers; write them plainly (81 for 81%, or "
                            "0.81; 1200 for $1,200)")  # fmt: skip
        if bad and len(bad) == len(train):  # no number at all: classes (IMDb's sentiment under the regression recipe)
            raise UserError(f"label column '{column}' holds class names (e.g. {bad[0][1]!r}), not numbers: to predict "
                            "these classes, set problem_type=single_label_classification (or train with "
                            "finetune/configs/bert_custom_files.yaml)")  # fmt: skip
        if what == "class names":  # a column of numbers with a stray word ("n/a", "NaN"): name the first such cell
            row, value = next(iter(bad), (None, None))
            if row is not None:
                where = f" ({value!r} at row {row + 1} is not a finite number)"
            else:  # every value reads as a number: written as text ("3.5" in JSON)
                example = next(iter(train[column]), "")
                raise UserError(f"label column '{column}' holds numbers written as text (e.g. {example!r}); regression "
                                f"reads numbers: write them without quotes (JSON: \"{column}\": 3.5)")
        fix = " written plainly (1000, 0.5: no thousands separator, decimal comma or unit)" if where else ""
        raise UserError(f"label column '{column}' holds {what}{where}; regression needs one number per sample{fix}")
    if given == MULTI and kind != "list":
        raise UserError(
            f'multi_label_classification needs a label column of lists (JSON: "label": ["a", "b"]) or '
            f"label_columns=a,b,c naming 0/1 columns; label column '{column}' holds {feature}"
        )
    return given


# A number as a spreadsheet writes it: plain, or with a percent sign, a currency, separators or a unit
# word ("81%", "$1,200", "1 000", "3,5", "3.5 kg", "3.2 stars", "5€"). Ordinals (1st, 2nd) are ranks.
NUMBER_AS_WRITTEN = re.compile(r"[-+]?\s*[$€£¥]?\s*\d[\d.,' ]*(\s*(%|[$€£¥]|[^\W\d_]+\.?))?")
ORDINAL = re.compile(r"\d*(1st|2nd|3rd|\dth)")


def number_as_written(text: str) -> bool:
    """Whether `text` reads as a number, plain or dressed as a spreadsheet dresses one (NUMBER_AS_WRITTEN):
    what regression targets and single-label class names are checked against."""
    text = text.strip()
    return bool(NUMBER_AS_WRITTEN.fullmatch(text)) and not ORDINAL.fullmatch(text.lower())


def _not_finite_numbers(values: list) -> list[tuple[int, Any]]:
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


def _check_not_numbers_with_a_stray_cell(train: HFDataset, column: str) -> None:
    """A column of decimal numbers read as strings because of a cell or two ("NaN", "n/a") would train a
    classifier with one class per number: name the cell instead."""
    values = train[column]
    bad = _not_finite_numbers(values)
    if not bad or len(bad) > max(1, len(values) // 20):  # all numbers, or words: not a stray cell
        return
    stray = {r for r, _ in bad}
    if any(not float(v).is_integer() for i, v in enumerate(values) if i not in stray):
        row, value = bad[0]
        raise UserError(
            f"label column '{column}' holds numbers but {value!r} at row {row + 1} is not a finite number "
            f"({len(bad)} such cell(s)); fix or drop those rows for a regression, or set "
            "problem_type=single_label_classification if the values are classes"
        )


def problem_type_of(ds: HFDataset) -> str:
    """The problem type of a split whose `labels` are encoded (by `encode` or data.encode_labels)."""
    feature = ds.features["labels"]
    if _is_list(feature) and isinstance(getattr(feature, "feature", None), ClassLabel):
        return TOKENS  # a tag id per word
    return SINGLE if isinstance(feature, ClassLabel) else MULTI if _is_list(feature) else REGRESSION


# --- labels --------------------------------------------------------------------------------------------


def label_names_for(train: HFDataset, args: DataArgs, problem: str) -> list[str]:
    """Regression: the one output's name (label_names, else the label column's name). Multi-label: the
    label columns, or `label_names`, else the sorted distinct names in train's lists."""
    given = list(args.label_names) if args.label_names else None
    if problem == TOKENS:
        _check_tag_lists(train, args, "train")  # a string of tags would be read as its characters
        names = tag_names(train, args.tags_column, given)
        recipe = getattr(args, "label_names_recipe", None)
        present = {t for row in train[args.tags_column][:2000] for t in row if isinstance(t, str)}
        if given and recipe and present and not (present - {"O"}) & set(given):  # POS tags, the NER recipe's set
            shown_tags = ", ".join(sorted(present)[:6]) + (", ..." if len(present) > 6 else "")
            raise UserError(
                f"the train data's tags ({shown_tags}) are none of the label_names of {recipe} "
                f"({', '.join(given[:7])}{', ...' if len(given) > 7 else ''}), which are that recipe's own data's "
                "tags; set label_names=null to take the tag set from your data"
            )
        if given and recipe and _kind(getattr(train.features[args.tags_column], "feature", None)) == "int":
            warn(f"tags column '{args.tags_column}' holds integer ids, read through the label_names of {recipe} "
                 f"({', '.join(f'{i}={n}' for i, n in enumerate(given))}), which were written for that recipe's own "
                 "data; if your ids mean other tags, set label_names=[the tag of each id] on the command line")  # fmt: skip
        return names
    if problem == REGRESSION:
        if given and len(given) != 1:
            raise UserError(f"a regression model has one output; label_names names it, got {given}")
        return given or [args.label_column]
    if args.label_columns:  # label_names may only order them (an evaluation gives the model's order)
        if given and sorted(given) != sorted(args.label_columns):
            raise UserError(
                f"label_columns {args.label_columns} name the labels; label_names {given} must be the "
                "same names (or unset)"
            )
        return given or list(args.label_columns)
    if given:
        return given
    _check_no_null_in_lists(train, args.label_column, "train")
    name_of = _list_names(train.features[args.label_column])
    names = sorted({name_of(v) for row in train[args.label_column] for v in row})
    alike = look_alike(names)
    if alike:
        raise UserError(f"label column '{args.label_column}' holds the labels {shown(alike[0])} and "
                        f"{shown(alike[1])}, " + LOOK_ALIKE.format("labels"))
    twins = case_twins(names)
    if twins:  # as single-label classes: Art and art would be two labels
        raise UserError(
            f"label column '{args.label_column}' holds the labels {twins[0]!r} and {twins[1]!r}, which differ only by "
            "letter case and would be two labels; write each label the same way (or, if they are "
            "two labels, list both in label_names)"
        )
    return names


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
    """The first two names that read the same (`tasks.visible`: café composed and decomposed, pos and pos
    with a zero-width space), unless `allowed` holds both."""
    return _twins(names, visible, allowed)


LOOK_ALIKE = ("which read the same (they differ only in Unicode form or by invisible characters such as a "
              "zero-width space) and would be two {}; write each label the same way (normalize the file to NFKC, "
              "which also makes full-width letters plain, and remove zero-width characters)")


def _check_no_null_in_lists(ds: HFDataset, column: str, split: str) -> None:
    """A null inside a list of labels (["sports", null]) would become a class named "None"."""
    for row, labels in enumerate(ds[column]):
        if labels and any(v is None for v in labels):
            raise UserError(
                f"label column '{column}' in the {split} data has a null inside the list at row {row + 1}; "
                "name every label, or drop the null"
            )
        if labels and any(isinstance(v, str) and BLANK.fullmatch(v) for v in labels):  # "" would be a label
            raise UserError(
                f"label column '{column}' in the {split} data has an empty label (\"\") inside the list at row "
                f"{row + 1}; name every label, or drop the empty one (an empty list is a sample with no label)"
            )
        nested = next((v for v in labels or () if isinstance(v, (list, tuple, dict))), None)
        if character_span(nested):  # [[0, 12, "PER"]]: entities by their characters, not labels of the text
            raise UserError(spans_error(column, split, nested))
        if nested is not None:  # [["a"]] would train a label named "['a']"
            raise UserError(
                f"label column '{column}' in the {split} data has a list inside the list at row {row + 1} "
                f"({nested!r}); give each row one flat list of label names"
            )


def _list_names(feature: Any):
    """How one item of a list label becomes its name: a ClassLabel's name, else str()."""
    inner = getattr(feature, "feature", None)
    if isinstance(inner, ClassLabel):
        return lambda v: inner.names[v]
    return str


def encode(ds: HFDataset, args: DataArgs, problem: str, label_names: list[str], split: str) -> HFDataset:
    """The labels of a regression or multi-label split into `labels`: a float32, or a float32 multi-hot
    vector in `label_names` order. Single-label splits go through data.encode_labels."""
    if problem == REGRESSION:
        return _encode_regression(ds, args.label_column, split)
    if problem == TOKENS:
        return encode_tags(ds, args, label_names, split)
    if args.label_columns:  # the columns in label_names order
        if label_names and sorted(label_names) != sorted(args.label_columns):
            raise UserError(
                f"label_columns {args.label_columns} must name the labels {label_names} (in any order)"
            )
        encoded = _encode_label_columns(ds, label_names or list(args.label_columns), split)
    else:
        encoded = _encode_lists(ds, args.label_column, label_names, split)
    if split == "train":
        _warn_labels_without_positives(encoded, label_names or list(args.label_columns or []))
        if not args.label_names and not args.label_columns:
            _warn_joined_labels(label_names, args.label_column)
    return encoded


JOINED = re.compile(r"[^,;|/]+(([,;|] ?| / )[^,;|/]+)+")  # art,film  art;film  art|film  art / film


def _warn_joined_labels(names: list[str], column: str) -> None:
    """Multi-label items that hold several labels joined in one string (["art,film"]): each such string
    would be a label of its own, beside its parts and their other orders."""
    joined = [n for n in names if JOINED.fullmatch(n) and not re.search(r"\d,\d", n)]
    if joined:
        warn(f"label column '{column}' has {len(joined)} label(s) such as {joined[0]!r}: several labels joined in one "
             f"item? give each its own item ({json.dumps(re.split(r'[,;|] ?| / ', joined[0]))}), or list the labels in "
             "label_names to keep them as they are")


def _warn_labels_without_positives(train: HFDataset, names: list[str]) -> None:
    """A multi-label label that no training sample has: the model only learns never to predict it
    (class_weights cannot weigh positives that are not there)."""
    if not len(train) or not names:
        return
    positives = np.asarray(train["labels"], dtype=np.float32).sum(0)
    absent = [name for name, n in zip(names, positives, strict=False) if n == 0]
    if absent:
        shown = ", ".join(map(repr, absent[:5])) + (", ..." if len(absent) > 5 else "")
        warn(f"{len(absent)} of the {len(names)} labels have no positive training sample ({shown}): the model "
             "cannot learn to predict them; give them positive samples, or leave them out")
    always = [name for name, n in zip(names, positives, strict=False) if n == len(train)]
    if always and len(train) > 1:  # a label on every sample: nothing to tell apart, or a column of another meaning
        shown = ", ".join(map(repr, always[:5])) + (", ..." if len(always) > 5 else "")
        warn(f"{len(always)} of the {len(names)} labels are positive on every training sample ({shown}): the model "
             "learns to predict them always; give them negative samples, or leave them out")


def _replace_labels(ds: HFDataset, columns: list[str], fn, feature, split: str) -> HFDataset:
    ds = ds.map(lambda b: {"labels": fn(b)}, batched=True, remove_columns=columns, desc=f"labels ({split})")
    return ds.cast_column("labels", feature)


def _encode_regression(ds: HFDataset, column: str, split: str) -> HFDataset:
    kind = _kind(ds.features[column])
    if kind not in ("int", "float"):
        raise UserError(
            f"label column '{column}' in the {split} data holds {ds.features[column]}; regression needs numbers"
        )
    values = np.asarray(list(ds[column]), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise UserError(
            f"label column '{column}' in the {split} data has {len(bad)} NaN or infinite target(s) (first at row "
            f"{bad[0] + 1}: {values[bad[0]]}); a regression target must be a finite number: fix or drop those rows"
        )
    # The loss is computed in float32: a target whose square overflows it gives an infinite loss at every step.
    huge = np.flatnonzero(np.abs(values) > np.sqrt(np.finfo(np.float32).max))
    if len(huge):
        raise UserError(
            f"label column '{column}' in the {split} data has {len(huge)} target(s) too large for the float32 loss "
            f"(first at row {huge[0] + 1}: {values[huge[0]]:g}; its square overflows float32); scale the targets "
            "(divide them by a constant, or take their logarithm) and scale the predictions back"
        )
    if split == "train" and len(values) > 1 and np.all(values == values[0]):  # as a single class would be
        raise UserError(
            f"label column '{column}' holds the same number ({values[0]:g}) in every training row; a regression "
            "learns from targets that vary: give samples with other values (or check label_column)"
        )
    tiny = np.flatnonzero((values != 0) & (values.astype(np.float32) == 0))
    if len(tiny):  # 1e-300 rounds to 0 in float32: the model would learn zeros
        raise UserError(
            f"label column '{column}' in the {split} data has {len(tiny)} target(s) too small for float32 (first at "
            f"row {tiny[0] + 1}: {values[tiny[0]]:g}, which rounds to 0); scale the targets (multiply them by a "
            "constant, or take their logarithm) and scale the predictions back"
        )
    _warn_far_targets(values, column, split)
    return _replace_labels(ds, [column], lambda b: [float(v) for v in b[column]], Value("float32"), split)


FAR_TARGET = 15  # robust standard deviations (1.4826 x the median absolute deviation) from the median


def _warn_far_targets(values: np.ndarray, column: str, split: str) -> None:
    """Targets far outside the others (45 typed for 4.5): trained on, they pull the model toward them
    and dominate the squared loss. Measured against the median and its absolute deviation, which the
    outliers themselves do not move much (a standard deviation would grow with them)."""
    if len(values) < 5:
        return
    median = np.median(values)
    spread = 1.4826 * np.median(np.abs(values - median))
    if spread == 0:
        return
    far = np.flatnonzero(np.abs(values - median) > FAR_TARGET * spread)
    if len(far):
        warn(f"label column '{column}' in the {split} data has {len(far)} target(s) more than {FAR_TARGET} robust "
             f"standard deviations from the median {median:g} (first at row {far[0] + 1}: {values[far[0]]:g}); "
             "if they are typos, fix them; if they are right, a logarithm of the targets may train better")


def _encode_lists(ds: HFDataset, column: str, label_names: list[str], split: str) -> HFDataset:
    feature = ds.features[column]
    if not _is_list(feature):
        raise UserError(
            f"label column '{column}' in the {split} data holds {feature}, not lists of labels; a multi-label "
            "run needs lists in every split"
        )
    _check_no_null_in_lists(ds, column, split)
    name_of, to_id = _list_names(feature), {name: i for i, name in enumerate(label_names)}
    unknown: dict[str, int] = {}
    for row, labels in enumerate(ds[column]):
        if not labels:
            raise UserError(
                f"label column '{column}' in the {split} data has an empty list at row {row + 1}; every sample "
                "needs a label (an empty list cannot be told from a missing one): give samples with none of "
                'the labels a label of their own, e.g. ["none"], or use 0/1 columns (label_columns)'
            )
        for v in labels:
            if name_of(v) not in to_id:
                unknown.setdefault(name_of(v), row + 1)
    if unknown:
        row, names = next(iter(unknown.values())), sorted(unknown)[:5]
        where = "are not in label_names" if split == "train" else "were not seen in training"
        raise UserError(
            f"{split} labels {names} {where} (first at row {row}; known: {', '.join(label_names)})"
        )

    def multi_hot(b):
        rows = [[0.0] * len(label_names) for _ in b[column]]
        for row, labels in zip(rows, b[column], strict=True):
            for v in labels:
                row[to_id[name_of(v)]] = 1.0
        return rows

    return _replace_labels(
        ds, [column], multi_hot, Sequence(Value("float32"), length=len(label_names)), split
    )


def _encode_label_columns(ds: HFDataset, columns: list[str], split: str) -> HFDataset:
    for column in columns:
        kind = _kind(ds.features[column])
        values = list(ds[column])
        # True == 1, 1.0 == 1; "0"/"1": a CSV column where a stray word made every value a string
        stray = next((i for i, v in enumerate(values) if v not in (0, 1, "0", "1")), None)
        if (
            kind not in ("int", "float", "class")
            or isinstance(ds.features[column], ClassLabel)
            or stray is not None
        ):
            shown = values[stray] if stray is not None else ds.features[column]
            raise UserError(
                f"label column '{column}' in the {split} data holds {shown!r}"
                f"{f' at row {stray + 1}' if stray is not None else ''}; each of label_columns holds 0 or 1"
            )
    return _replace_labels(
        ds,
        columns,
        lambda b: [[float(v) for v in row] for row in zip(*(b[c] for c in columns), strict=True)],
        Sequence(Value("float32"), length=len(columns)),
        split,
    )


# --- tags (token classification) ----------------------------------------------------------------------


def _check_tag_lists(ds: HFDataset, args: DataArgs, split: str) -> None:
    """Each row's tags: a list, one per word."""
    column, words_column = args.tags_column, args.tokens_column
    feature = ds.features[column]
    if not _is_list(feature):
        raise UserError(
            f"tags column '{column}' in the {split} data holds {feature}, not lists of tags; each row needs one tag "
            'per word, as a list ("ner_tags": ["B-PER", "O", ...])'
        )
    for row, (tags, words) in enumerate(zip(ds[column], ds[words_column], strict=True)):
        if tags is None or len(tags) != len(words):
            got = "no tags" if tags is None else f"{len(tags)} tag(s)"
            raise UserError(
                f"the {split} data has {len(words)} word(s) but {got} at row {row + 1}; give each word its tag"
            )
        if any(t is None for t in tags):
            raise UserError(f"the {split} data has an empty (null) tag at row {row + 1}, word {tags.index(None) + 1}")
        nested = next((i for i, t in enumerate(tags) if isinstance(t, (list, tuple, dict))), None)
        if nested is not None:
            raise UserError(
                f"the {split} data's tags at row {row + 1} hold a list inside the list (word {nested + 1}: "
                f"{tags[nested]!r}); give each sentence one flat list of tags, one per word"
            )


def tag_names(train: HFDataset, column: str, given: list[str] | None) -> list[str]:
    """The tag set in id order: `label_names`; a ClassLabel's names; else train's tags, "O" first then
    sorted by entity type, B- before I- (a plain set, `tasks.plain_tags`: by name), refused when two differ
    only by case (integer tags need `label_names`)."""
    inner = getattr(train.features[column], "feature", None)
    present = {t for row in train[column] for t in row}
    if len(present) < 2:  # all O: the loss is 0 from the first step, and nothing is learned
        name = inner.names[next(iter(present))] if isinstance(inner, ClassLabel) and present else next(iter(present), None)
        raise UserError(
            f"tags column '{column}' in the train data holds one tag ({name!r}) in every word; a tagger needs "
            "at least two (the entities' B- and I- tags beside O)"
        )
    if given:
        return given
    if isinstance(inner, ClassLabel):
        return list(inner.names)
    if _kind(inner) == "int":
        raise UserError(
            f"tags column '{column}' holds integer ids; set label_names to the tag of each id, in order "
            '(e.g. label_names=["O","B-PER","I-PER"])'
        )
    counts = collections.Counter(str(t) for row in train[column] for t in row)
    for tag, count in counts.items():  # 'B-LO' once beside many 'B-LOC': a file cut mid-line, not a new type
        longer = max((t for t in counts if t != tag and t.startswith(tag)), key=counts.get, default=None)
        if count == 1 and longer is not None and counts[longer] > 1:
            raise UserError(
                f"tag {tag!r} appears once in the train data and {longer!r} {counts[longer]} times: a tag cut short "
                f"(a file that ends mid-line?); fix it, or set label_names to the full tag set if {tag!r} is meant"
            )
    twins = case_twins(counts)  # B-PERSON and B-Person: one entity type written two ways
    if twins:
        raise UserError(
            f"the train data's tags {twins[0]!r} and {twins[1]!r} differ only by letter case and would be two "
            "tags; write each tag the same way (or, if they are two tags, list both in label_names)"
        )
    from finetune.tasks import plain_tags

    if plain_tags(counts):  # parts of speech: O (if any) first, then by name
        return sorted(counts, key=lambda t: (t != "O", t))
    return sorted(counts, key=lambda t: (t != "O", t[2:], t[:2]))


class UnknownTag(UserError):
    """A tag outside the tag set, at its row and word; said with training's fix (evaluation says its own:
    a model's tags are fixed)."""

    def __init__(self, split: str, tag: Any, row: int, word: int, tag_set: list[str], listed: bool) -> None:
        self.split, self.tag, self.row, self.word, self.tag_set = split, tag, row, word, tag_set
        where = "is not in label_names" if listed else "was not seen in training" if split != "train" else "is unknown"
        super().__init__(f"the {split} data's tag {tag!r} at row {row}, word {word} {where} (tags: "
                         f"{', '.join(tag_set)}); fix the tag, or list it in label_names")  # fmt: skip


def encode_tags(ds: HFDataset, args: DataArgs, tag_set: list[str], split: str) -> HFDataset:
    """Each row's tags into `labels`: a list of tag ids, one per word, by name (integer tags through
    `label_names`); a tag outside the tag set is refused with its row and word."""
    _check_tag_lists(ds, args, split)
    inner = getattr(ds.features[args.tags_column], "feature", None)
    if isinstance(inner, ClassLabel):
        def name_of(v):  # noqa: E306
            return inner.names[v]
    elif _kind(inner) == "int":
        def name_of(v):  # noqa: E306
            if not 0 <= v < len(tag_set):
                raise KeyError(v)
            return tag_set[v]
    else:
        name_of = str
    to_id = {name: i for i, name in enumerate(tag_set)}
    for row, tags in enumerate(ds[args.tags_column]):
        for word, tag in enumerate(tags):
            try:
                known = name_of(tag) in to_id
            except KeyError:
                known = False
            if not known:
                raise UnknownTag(split, tag, row + 1, word + 1, tag_set, listed=bool(args.label_names))
    return _replace_labels(
        ds,
        [args.tags_column],
        lambda b: [[to_id[name_of(t)] for t in tags] for tags in b[args.tags_column]],
        Sequence(ClassLabel(names=tag_set)),
        split,
    )


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


# --- loss and predictions ------------------------------------------------------------------------------


def per_sample_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    problem_type: str | None,
    class_weights: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """(B,) losses in fp32: cross-entropy; squared error; BCE with logits averaged over the K labels;
    for tags, the cross-entropy SUMMED over a sample's labelled tokens (-100: not labelled), which
    `loss_weights` counts: the loop divides by the labelled tokens of the whole optimizer step.
    `class_weights` (`class_weights_of`) weigh each class's cross-entropy, or each label's positives
    in BCE (its pos_weight); `label_smoothing` is the cross-entropy's. Evaluation reports the plain loss."""
    logits = logits.float()
    weight = class_weights.to(logits.device) if class_weights is not None else None
    if problem_type == TOKENS:  # (B, T, K), (B, T)
        return F.cross_entropy(logits.transpose(1, 2), labels, weight=weight, reduction="none", ignore_index=-100,
                               label_smoothing=label_smoothing).sum(-1)  # fmt: skip
    if problem_type == REGRESSION:
        return (logits.squeeze(-1) - labels.float()) ** 2
    if problem_type == MULTI:
        return F.binary_cross_entropy_with_logits(logits, labels.float(), pos_weight=weight, reduction="none").mean(-1)
    return F.cross_entropy(logits, labels, weight=weight, reduction="none", label_smoothing=label_smoothing)


def class_weights_of(train_labels, problem: str, num_labels: int, how: str | None) -> torch.Tensor | None:
    """`class_weights=balanced`: single-label (and tags) n / (K * n_k) per class, as scikit-learn's
    class_weight="balanced" (a class absent from training: 1); multi-label (n - n_k) / n_k for each
    label's positives, BCE's pos_weight, at most 100 (a label absent from training: 1). None otherwise."""
    if how is None or problem == REGRESSION:
        return None
    rows = list(train_labels)
    if problem == MULTI:
        positives = torch.as_tensor(rows, dtype=torch.float32).sum(0)
        weights = (len(rows) - positives) / positives.clamp(min=1)
        return torch.where(positives > 0, weights.clamp(max=100.0), torch.ones_like(weights))
    ids = [t for row in rows for t in row if t != -100] if problem == TOKENS else rows
    counts = torch.bincount(torch.as_tensor(ids, dtype=torch.long), minlength=num_labels).float()
    weights = len(ids) / (num_labels * counts.clamp(min=1))
    return torch.where(counts > 0, weights, torch.ones_like(weights))


def loss_weights(labels: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """(B,) how many terms each sample's loss sums: its labelled tokens for tags, else 1."""
    if problem_type == TOKENS:
        return (labels != -100).sum(-1)
    return torch.ones(len(labels), dtype=torch.long, device=labels.device)


def predictions(logits: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """What the metrics read: class ids (B,); predicted numbers (B,); label probabilities (B, K);
    tag ids (B, T) for tags."""
    if problem_type == REGRESSION:
        return logits.float().squeeze(-1)
    if problem_type == MULTI:
        return logits.float().sigmoid()
    return logits.argmax(-1)


def scores(logits: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """What predictions.jsonl shows: softmax probabilities, sigmoid ones, or the predicted number."""
    return logits.float().softmax(-1) if problem_type in (None, SINGLE, TOKENS) else predictions(logits, problem_type)


def placeholder_labels(ds: HFDataset, args: DataArgs, problem: str, label_names: list[str]) -> HFDataset:
    """Data without labels (predictions only) given a `labels` column of the problem's type, all zero,
    so that it goes through the same preparation and evaluation loop; no metric is read from it."""
    if problem == TOKENS:
        feature, value = Sequence(ClassLabel(names=label_names)), lambda b: [[0] * len(w) for w in b[args.tokens_column]]
    elif problem == MULTI:
        feature = Sequence(Value("float32"), length=len(label_names))
        value = lambda b: [[0.0] * len(label_names)] * len(next(iter(b.values())))  # noqa: E731
    elif problem == REGRESSION:
        feature, value = Value("float32"), lambda b: [0.0] * len(next(iter(b.values())))
    else:
        feature, value = ClassLabel(names=label_names), lambda b: [0] * len(next(iter(b.values())))
    ds = ds.map(lambda b: {"labels": value(b)}, batched=True, desc="placeholder labels")
    return ds.cast_column("labels", feature)


def trivial_prediction(train_labels, problem: str):
    """What a model that learned nothing from the inputs predicts, from the training labels alone: the
    majority class (single-label), the most frequent tag (tags), the mean target (regression), each
    label's frequency as its probability (multi-label). The baseline every evaluation reports beside
    the model's metrics (finetune/metrics.py, `learned`)."""
    if problem == TOKENS:
        tags = [t for row in list(train_labels) for t in row if t != -100]
        return max(set(tags), key=lambda t: (tags.count(t), -t)) if tags else 0
    values = torch.as_tensor(list(train_labels), dtype=torch.float32)
    if problem == REGRESSION:
        return float(values.mean())
    if problem == MULTI:
        return values.mean(0)
    counts = torch.bincount(values.long())
    return int(counts.argmax())  # the first of the most frequent
