"""Regression: one number per sample."""

from __future__ import annotations

import numpy as np
import torch
from datasets import Dataset as HFDataset
from datasets import DatasetDict, Value

from finetune import checks
from finetune.checks import labels, splits
from finetune.config import DataArgs
from finetune.formats import kind_of
from finetune.metrics import (
    REGRESSION,
    regression_report,
)
from finetune.problems.base import (
    Problem,
    replace_labels,
    rows_of,
    with_labels,
)


class Regression(Problem):
    name = hf_problem_type = REGRESSION
    classes, ids_as_names, numbers = False, False, True
    trivial_words = "mean"
    pipeline_arguments = ', function_to_apply="none"'
    pipeline_returns = "the predicted number, as the score of the one label"
    label_words = " (regression targets)"

    def describe(self, modality: str, names: list[str]) -> str:
        return f"A {modality} regression model"

    def label_names(self, train: HFDataset, args: DataArgs, said: checks.Said) -> list[str]:
        """The one output's name: label_names, else the label column's name."""
        given = list(args.label_names) if args.label_names else None
        checks.gate(labels.REGRESSION_NAMES, given)
        return given or [args.label_column]

    def encode(self, ds, args, names, split, said, fixed=False):
        """A float32 target."""
        column = args.label_column
        feature = ds.features[column]
        values = np.asarray(ds[column][:], dtype=np.float64) if kind_of(feature) in ("int", "float") else None
        checks.gate(labels.TARGETS, labels.Targets(values, column, split, feature), said=said)
        return replace_labels(ds, [column], lambda b: [float(v) for v in b[column]], Value("float32"), split)

    def check_encoded(self, raw: DatasetDict, said: checks.Said) -> None:
        for split in ("validation", "test"):
            if split in raw:
                checks.gate(splits.SCALE, raw["train"]["labels"][:], raw[split]["labels"][:], f"{split} targets", said=said)

    def check_trained(self, train, names, args, said) -> None:
        pass

    def check_splits(self, raw, names, args, said) -> None:
        pass

    def placeholder(self, ds, args, names):
        return with_labels(ds, Value("float32"), lambda b: [0.0] * rows_of(b))

    def loss(self, logits, labels, class_weights=None, label_smoothing=0.0):
        """Squared error."""
        return (logits.float().squeeze(-1) - labels.float()) ** 2

    def predictions(self, logits):
        """The predicted numbers (B,)."""
        return logits.float().squeeze(-1)

    def scores(self, logits):
        return self.predictions(logits)

    def class_weights(self, train_labels, num_labels, how):
        return None

    def trivial(self, train_labels, train=None):
        """The mean target."""
        return float(torch.as_tensor(list(train_labels), dtype=torch.float32).mean())

    def report(self, predictions, references, names, threshold=0.5):
        return regression_report(predictions, references)

    def record(self, scored, label, names, per_label):
        return {"label": label, "prediction": scored}
