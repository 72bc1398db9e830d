"""Multiple choice: the right one of a sample's candidates (SWAG), by its number."""

from __future__ import annotations

from collections import Counter

from datasets import Dataset as HFDataset

from finetune import checks
from finetune.checks import labels
from finetune.config import DataArgs
from finetune.metrics import CHOICES
from finetune.problems.base import Problem, encode_labels
from finetune.tasks.choices import ENDING, ending_columns


class Choices(Problem):
    """The model scores each candidate (`logits`: (B, candidates)); the loss is the cross-entropy over a
    sample's candidates, as transformers' multiple-choice models compute it; the prediction is the
    best-scored candidate. The classes are the candidates' numbers ("0", "1", ...), however many of them
    training's answers use: which number is right is no class of the data, so the class-share rules of
    single-label classification do not apply."""

    name, hf_problem_type = CHOICES, None
    ids_as_names = False
    trivial_words = "most frequent right candidate"
    baseline_model = "a model that always picks the same candidate"
    label_words = " (the right candidate's number)"

    def describe(self, modality: str, names: list[str]) -> str:
        return f"A {len(names)}-choice multiple-choice model"

    def start_words(self) -> str:
        return ""

    def label_names(self, train: HFDataset, args: DataArgs, said: checks.Said) -> list[str]:
        """The candidates' numbers, one per ending column of train."""
        names = [str(i) for i in range(len(ending_columns(train.column_names)))]
        checks.gate(labels.FIXED_NAMES, args.label_names, names, "multiple choice's outputs (its candidates' numbers)")
        return names

    def report(self, predictions, references, names, threshold=0.5):
        """Accuracy, and each candidate number's own scores; no macro average over the numbers, which are no
        classes of the data."""
        return {k: v for k, v in super().report(predictions, references, names, threshold).items() if not k.startswith("macro_")}

    def encode(self, ds, args, names, split, said, fixed=False):
        """The right candidate's number (2, "2" or 2.0) as its class, checked against the split's candidates
        (checks/labels.py, CANDIDATES)."""
        column = args.label_column
        given = ds[column][:]  # read once
        checks.gate(labels.CANDIDATES, labels.Candidates(split, sorted(set(given), key=str), len(ending_columns(ds.column_names)),
                                                         ENDING, names, fixed))  # fmt: skip
        numbers = [labels.candidate_number(v) for v in given]  # as text: the classes' names
        return encode_labels(ds.remove_columns(column).add_column(column, numbers), column, names, split)

    def check_trained(self, train, names, args, said) -> None:
        right = Counter(names[i] for i in train["labels"][:])
        checks.gate(labels.CANDIDATES_TRAINED, labels.Candidates("train", [], len(names), ENDING, names, right=right),
                    said=said)  # fmt: skip

    def check_splits(self, raw, names, args, said) -> None:
        pass
