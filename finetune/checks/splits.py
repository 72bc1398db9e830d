"""Splits: the training, validation and test splits together (finetune/data.py's `load_splits` asks these
once every split is read and its labels encoded).

    FILES              one split's file given again as another's (args, the files by split)
    SHARED             samples the splits share, or training samples that cannot be told apart (`Samples`)
    HELD_OUT_REPEATS   the share held out of the training file repeats its training samples
    SCALE              regression targets on another scale than training's
    NOT_STRATIFIED     why a stratified validation share could not be held out (the first that can tell)
    HELD_OUT           what the share held out of the training file says
    KEPT               what max_train_samples leaves to train on
    VALIDATION_CLASSES what a validation file leaves to judge on

docs/bad-input.md names each rule's list and subject.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from finetune.checks import rule
from finetune.checks.labels import misspelt_class, what_the_labels_look_like
from finetune.errors import first_line

# --- one file as two splits -----------------------------------------------------------------------------


@rule("splits.validation_is_train", warning=True)
def validation_is_train(args, files: dict) -> str | None:
    """validation_file is the train_file: validation scores and the model chosen by them measure samples the
    model trained on."""
    if "validation" in files and files["validation"] == files.get("train"):
        return (f"validation_file is the train_file ({args.files['train']}): validation scores and the model chosen by "
                "them measure samples it trained on; give a separate file, or leave validation_file out to hold out a "
                "share (validation_split_percentage)")
    return None


@rule("splits.test_is_train", warning=True)
def test_is_train(args, files: dict) -> str | None:
    """test_file is the train_file."""
    if "test" in files and files["test"] == files.get("train"):
        return (f"test_file is the train_file ({args.files['train']}): test scores measure samples the model trained on; "
                "give a separate test file")
    return None


@rule("splits.test_is_validation", warning=True)
def test_is_validation(args, files: dict) -> str | None:
    """test_file is the validation_file: the test scores are the split's that judged the run."""
    if "test" in files and files["test"] == files.get("validation") and files["test"] != files.get("train"):
        return (f"test_file is the validation_file ({args.files['test']}): the test scores are then validation's, the "
                "split that judged the run (and chose its best checkpoint or threshold, where those are tuned); give a "
                "separate test file, or test_file=null")
    return None


FILES = [validation_is_train, test_is_train, test_is_validation]


# --- samples the splits share ----------------------------------------------------------------------------------


def compared_columns(train, args, task) -> list[str]:
    """The columns that make a sample what it is (its texts, words or image: `task.sample_columns`, of the run's
    finetune/tasks/), as far as the data has them."""
    return [c for c in task.sample_columns(train.column_names, args) if c in train.column_names]


def _image_digest(cell: dict | None) -> str | None:
    """An undecoded image cell ({"bytes", "path"}) as the sha1 of its bytes (the file's, for a path)."""
    import hashlib
    from pathlib import Path

    if not cell:
        return None
    data = cell.get("bytes")
    if data is None and cell.get("path"):
        try:
            data = Path(cell["path"]).read_bytes()
        except OSError:  # named with its row by the image rules
            return None
    return hashlib.sha1(data).hexdigest() if data is not None else None


def sample_rows(ds, columns: list[str], images: bool) -> list[tuple]:
    """Each row's values in `columns`, hashable (a list of words as a tuple; an image as its bytes' digest: an
    image folder copied into another class or split is the same bytes): rows to compare across splits."""
    if images:
        from datasets import Image

        return [(_image_digest(cell),) for cell in ds.cast_column(columns[0], Image(decode=False))[columns[0]]]
    return [tuple(tuple(v) if isinstance(v, list) else v for v in row) for row in zip(*(ds[c][:] for c in columns), strict=True)]


class Samples:
    """The splits' samples as the rules compare them: each row's values in the columns that make a sample what
    it is (its texts, words or image bytes' digest), and the training labels."""

    def __init__(self, rows: dict[str, list[tuple]], what: str, images: bool, columns: list[str], labels: list,
                 files: dict, setting_of, sizes: dict[str, int]):  # fmt: skip
        self.rows, self.what, self.images, self.columns, self.labels = rows, what, images, columns, labels
        self.files, self.setting_of, self.sizes = files, setting_of, sizes
        self.train = rows["train"]
        self.seen = set(self.train) - {(None,)}
        self.class_names: dict = {}  # a class id's name (an image folder's ClassLabel), where the data has them

    @classmethod
    def of(cls, raw, args, task, files: dict, classes: bool = True) -> Samples | None:
        """The samples of a run's raw splits (`task`: the run's, finetune/tasks/), or None when it has no input
        column.
        `classes`: whether the labels are classes (not regression's numbers, whole 1-5 ratings too, nor label
        lists): a text with two ratings is good regression data, no class within another."""
        cols, images = compared_columns(raw["train"], args, task), task.modality == "image"
        if not cols:
            return None
        rows = {s: sample_rows(raw[s], cols, images) for s in ("train", "validation", "test") if s in raw}
        answers = raw["train"][args.label_column][:] if classes and args.label_column in raw["train"].column_names else []
        samples = cls(rows, "image (the same bytes)" if images else " and ".join(cols), images, cols, answers, files,
                      args.setting_of, {s: len(d) for s, d in raw.items()})  # fmt: skip
        feature = raw["train"].features.get(args.label_column)
        samples.class_names = dict(enumerate(feature.names)) if hasattr(feature, "names") else {}  # a ClassLabel's
        return samples


@rule("splits.samples_all_the_same", warning=True)
def samples_all_the_same(s: Samples) -> str | None:
    """Every training sample the same (its text or image bytes): the model cannot tell them apart."""
    if len(s.seen) == 1 and len(s.train) > 1:
        shown = "" if s.images else f" ({str(s.train[0][0])[:40]!r})"
        return (f"every training sample has the same {s.what}{shown}: the model cannot tell them apart; check "
                f"{s.setting_of(s.columns[0])}")
    return None


@rule("splits.pair_of_one_text", warning=True)
def pair_of_one_text(s: Samples) -> str | None:
    """Sentence pairs whose second sentence is the first, in half the training pairs or more."""
    if s.images or len(s.columns) != 2:
        return None
    twins = sum(a == b for a, b in s.train)
    if twins * 2 >= len(s.train):
        return (f"{twins} of the {len(s.train)} training pairs have the same text in {s.columns[0]} and {s.columns[1]}: "
                f"each sentence would be paired with itself; check {s.setting_of(s.columns[1])}")
    return None


@rule("splits.class_within_another")
def class_within_another(s: Samples) -> str | None:
    """A class whose every training sample (two or more: its texts, or its images by their bytes) is also a
    sample of another class: a class folder copied into another, a file appended to itself with other labels.
    The model cannot learn that class apart from the other. A few samples with two labels (noisy labels) are
    the warning of splits.one_sample_two_labels, and the run goes on."""
    by_class: dict = {}  # a class: its distinct samples
    owners: dict = {}  # a sample: the classes it has
    for row, label in zip(s.train, s.labels, strict=False):
        if isinstance(label, (str, int, bool)) and row != (None,):  # classes; not numbers or label lists
            by_class.setdefault(label, set()).add(row)
            owners.setdefault(row, set()).add(label)
    inside = next(((a, min(others, key=str)) for a in sorted(by_class, key=str) if len(by_class[a]) >= 2
                   and (others := set.intersection(*(owners[r] for r in by_class[a])) - {a})), None)  # fmt: skip
    if inside is None:
        return None
    a, b = (s.class_names.get(c, c) for c in inside)
    many = "images (the same bytes)" if s.images else f"samples (the same {s.what})"
    copied = "an image folder copied into another class's folder?" if s.images else "rows repeated with another label?"
    return (f"all {len(by_class[inside[0]])} training {many} of class '{a}' are also in class '{b}': the "
            f"model cannot learn '{a}' apart from '{b}' ({copied}); give each class its own samples "
            "and remove the copies")


@rule("splits.one_sample_two_labels", warning=True)
def one_sample_two_labels(s: Samples) -> str | None:
    """The same training sample with two labels (an image copied into two class folders)."""
    answers: dict[tuple, set] = {}
    for row, label in zip(s.train, s.labels, strict=False):
        if isinstance(label, (str, int, bool)):  # classes; not numbers to predict or label lists
            answers.setdefault(row, set()).add(label)
    torn = [(row, sorted(map(str, a))) for row, a in answers.items() if len(a) > 1]
    if torn and len(s.seen) > 1:  # (all the same: said by samples_all_the_same)
        many = "images (the same bytes)" if s.images else f"{s.what}s"
        example = "" if s.images else f", e.g. {str(torn[0][0][0])[:40]!r}: {' and '.join(torn[0][1][:3])}"
        return (f"{len(torn)} of the {len(answers)} distinct training {many} appear with different labels (the same "
                f"{'image' if s.images else s.what} once as one class and once as another{example}): the model cannot "
                f"learn them; check the labels{' (an image copied into two class folders?)' if s.images else ''}")
    return None


def _scored_on_training_samples(s: Samples, split: str) -> str | None:
    if split not in s.rows or (split in s.files and s.files[split] == s.files.get("train")):
        return None  # a split read from the train_file itself is warned of on its own
    shared = sum(row in s.seen for row in s.rows[split])
    if shared and shared * 2 >= s.sizes[split]:
        return (f"{shared} of the {s.sizes[split]} {split} samples are also training samples (the same {s.what}): their "
                f"scores measure samples the model trained on; give {split} samples that are not in the training data")
    return None


@rule("splits.validation_of_training_samples", warning=True)
def validation_of_training_samples(s: Samples) -> str | None:
    """Validation samples that are mostly training samples (a shuffled copy of the training file, an image
    folder copied into another split)."""
    return _scored_on_training_samples(s, "validation")


@rule("splits.test_of_training_samples", warning=True)
def test_of_training_samples(s: Samples) -> str | None:
    """Test samples that are mostly training samples."""
    return _scored_on_training_samples(s, "test")


SHARED = [samples_all_the_same, pair_of_one_text, class_within_another, one_sample_two_labels,
          validation_of_training_samples, test_of_training_samples]  # fmt: skip


@rule("splits.held_out_repeats", warning=True)
def held_out_repeats(values: list[tuple], file_rows: dict[str, list[int]], what: str, source: str) -> str | None:
    """A training file that repeats its samples (every row written twice): the share held out for validation is
    then mostly copies of samples kept for training."""
    kept = {values[i] for i in file_rows["train"]}
    held = file_rows["validation"]
    shared = sum(values[i] in kept for i in held)
    if held and shared * 2 >= len(held):
        return (f"{shared} of the {len(held)} validation samples held out of the training {source} are also training "
                f"samples (the {source} repeats them, the same {what}): their scores measure samples the model trained "
                "on; remove the repeated rows, or give a validation_file")
    return None


HELD_OUT_REPEATS = [held_out_repeats]


# --- regression targets on another scale --------------------------------------------------------------------------


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


@rule("splits.another_scale", warning=True)
def another_scale_rule(trained, values, what: str) -> str | None:
    """A validation or test split's regression targets mostly far outside the training targets' range: the
    model predicts on the training scale."""
    said = another_scale(trained, values, what)
    return f"{said} the model predicts on the training scale; put every split on the same scale" if said else None


SCALE = [another_scale_rule]


# --- a stratified validation share ---------------------------------------------------------------------------------


class Stratify:
    """A stratified held-out share that datasets could not draw: its error, the label names, the count of
    each class id and the settings."""

    def __init__(self, error: Exception, label_names: list[str], counts: Counter, samples: int, args):
        self.error, self.names, self.counts, self.samples, self.args = error, label_names, counts, samples, args
        self.ints = sorted(int(n) for n in label_names if re.fullmatch(r"\s*-?\d+\s*", n))

    def line(self, looks: str = "") -> str:
        return (f"cannot hold out a stratified validation split: {first_line(self.error)}{f' ({looks})' if looks else ''}"
                "; give a validation_file, or enough samples of every class (2 or more) and a "
                "validation_split_percentage whose share holds one of each")


@rule("splits.classes_of_another_kind")
def classes_of_another_kind(s: Stratify) -> str | None:
    """Classes that look like something else (numbers with units, joined sets, one value written two ways)."""
    looks = what_the_labels_look_like(s.names)
    return s.line(looks) if looks else None


@rule("splits.a_misspelt_class")
def a_misspelt_class(s: Stratify) -> str | None:
    """A class of one or two samples one slip from a common one: a misspelling."""
    misspelt = misspelt_class(s.names, s.counts, s.args.label_names)
    return s.line(f"{misspelt} fix that label in the data") if misspelt else None


@rule("splits.an_id_column")
def an_id_column(s: Stratify) -> str | None:
    """About a class a sample: an id or a text column read as the label."""
    single = sum(s.counts[i] == 1 for i in range(len(s.names)))
    if len(s.names) * 2 > s.samples >= 10 and single * 2 > len(s.names):
        return s.line(f"{len(s.names)} classes for {s.samples} samples, most with one sample each: is "
                      f"'{s.args.label_column}' an id or a text column? set label_column to the column of classes")
    return None


@rule("splits.scores_as_classes")
def scores_as_classes(s: Stratify) -> str | None:
    """More than ten classes that are the whole numbers 0 to 39: scores, too rare to be classes?"""
    if len(s.ints) == len(s.names) > 10:
        return s.line(f"{len(s.ints)} classes, the whole numbers {s.ints[0]} to {s.ints[-1]}: scores to predict as "
                      "numbers? then set problem_type=regression")
    return None


@rule("splits.stars_as_classes")
def stars_as_classes(s: Stratify) -> str | None:
    """Classes 1 to 5 (stars or grades, most likely: class ids count from 0)."""
    if len(s.ints) == len(s.names) >= 3 and s.ints == list(range(1, s.ints[-1] + 1)):
        return s.line(f"the classes are the whole numbers 1 to {s.ints[-1]}: if they are scores (stars, grades), "
                      "problem_type=regression predicts them as numbers and needs no sample of each")
    return None


@rule("splits.share_as_a_fraction")
def share_as_a_fraction(s: Stratify) -> str | None:
    """validation_split_percentage=0.5 meant as a share: half a percent."""
    share = s.args.validation_split_percentage
    if share < 1:
        return s.line(f"validation_split_percentage={share:g} is a percentage: it holds out {share:g}% of the samples; "
                      "for half of them write 50")
    return None


@rule("splits.share_too_small_for_every_class")
def share_too_small_for_every_class(s: Stratify) -> str | None:
    """A held-out share too small to hold one sample of each class (3 classes of 6 photos: 10% holds out 2): the
    validation split to give instead, or the share that does hold one of each."""
    n, k, share = s.samples, len(s.names), s.args.validation_split_percentage

    def held(p: float) -> int:  # as datasets' train_test_split counts its test share
        return math.ceil(p / 100 * n)

    fits = [p for p in range(1, 100) if k <= held(p) <= n - k]  # one of each held out, one of each left
    if min(s.counts.values()) < 2 or not fits or held(share) >= k:
        return None
    need, room = fits[0], fits[-1]
    folder = s.args.data_dir and s.args.dataset_name in (None, "imagefolder")  # an image folder's validation/
    what = "images" if folder else "samples"
    give = f"add a validation/ folder beside {s.args.data_dir}/train/ (a folder per class)" if folder else "give a validation_file"
    return (f"validation_split_percentage={share:g} holds out {held(share)} of the {n} training {what}, "
            f"fewer than the {k} classes, so the validation split cannot hold one of each: {give}, or set "
            f"validation_split_percentage={need} or more (at most {room}, to leave one of each to train on)")


@rule("splits.too_few_to_stratify")
def too_few_to_stratify(s: Stratify) -> str | None:
    """A few rows to try the app: too few to hold out one of each class."""
    if s.samples < 10:
        return s.line(f"{s.samples} training samples: too few to hold out one of each class")
    return None


@rule("splits.not_stratified")
def not_stratified(s: Stratify) -> str:
    """A stratified share datasets could not draw (a class of one sample): the classes too small, named."""
    alone = [s.names[i] for i, n in sorted(s.counts.items()) if n < 2]
    return s.line(f"{len(alone)} class(es) of one sample: {', '.join(map(repr, alone[:5]))}" if alone else "")


NOT_STRATIFIED = [classes_of_another_kind, a_misspelt_class, an_id_column, scores_as_classes, stars_as_classes,
                  share_as_a_fraction, share_too_small_for_every_class, too_few_to_stratify, not_stratified]  # fmt: skip


@rule("splits.held_out_share", warning=True)
def held_out_share(share: float, held: int, total: int, kept: int) -> str | None:
    """A validation_split_percentage above 50 or below 1 (95 for 5, or for 0.95? 0.2 for a fifth, the Trainer's
    fraction?): the counts it gives."""
    if share / 100 > 0.5 or share / 100 < 0.01:
        return (f"validation_split_percentage={share:g} holds out {held} of the {total} training samples and trains on "
                f"{kept}; it is the percentage held out for validation (10 holds out a tenth, 0.2 a five-hundredth)")
    return None


HELD_OUT = [held_out_share]


# --- what the limits leave ------------------------------------------------------------------------------------


@rule("splits.kept_one_class")
def kept_one_class(limit: int | None, classes: int, only: str) -> str | None:
    """max_train_samples that leaves the training data one class (the first rows are taken)."""
    if limit is not None and classes < 2:
        return (f"max_train_samples={limit} leaves the training data one class ({only!r}: the first {limit} rows are "
                "taken); a classifier needs at least two: raise max_train_samples")
    return None


KEPT = [kept_one_class]


@rule("splits.validation_of_one_class", warning=True)
def validation_of_one_class(held: set, label_names: list[str], samples: int) -> str | None:
    """A validation split of one class: its scores are those of always answering it, and cannot tell whether
    the model learned."""
    if samples > 1 and len(held) == 1:
        only = label_names[next(iter(held))]
        return (f"the validation data holds one class ({only!r}) of the {len(label_names)}: its scores are those of "
                "always answering it, and cannot tell whether the model learned; give validation data with every "
                "class, or leave validation_file out to hold out a stratified share of train")
    return None


VALIDATION_CLASSES = [validation_of_one_class]
