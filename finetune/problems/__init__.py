"""The problems a head is asked to solve: everything about each, in one class of its own.

    problem                       labels of a sample           outputs  loss per sample          metrics
    single_label_classification   one class name or id         K        cross-entropy            accuracy, macro F1
    multi_label_classification    a list of names, or 0/1      K        BCE with logits, mean    micro/macro F1, subset accuracy,
                                  columns (`label_columns`)             over the K labels        per-label F1 at a threshold
    regression                    one number                   1        squared error            mse, mae, r2, pearson, spearman
    token_classification          an IOB2 tag per word         K/token  cross-entropy, summed    entity F1, P, R; word accuracy
    word_tagging                  a plain tag per word (POS)   K/token  cross-entropy, summed    word accuracy, per-tag F1
    question_answering            an answer's span             2/token  cross-entropy of start   exact match, F1 (SQuAD's)
                                                                       and end, mean
    multiple_choice               the right candidate's number 1/cand.  cross-entropy over the   accuracy
                                                                       candidates

    problem = problem_of(cfg.problem_type)   # a `Problem`: the rest of the app asks it, and compares no names
    names = problem.labels_in(train, args, said)      # a `Labels`: what the outputs are, by name in id order
    train = problem.encode(train, args, names, "train", said)
    loss = problem.loss(problem.outputs(model(**inputs), inputs), labels)

Each problem is a class of its own module: single-label classification (`Problem` itself, the default
behaviour, with what every problem shares) in base.py, then multi_label.py, regression.py and tags.py (the
two tag schemes: entities in IOB2, and plain tags such as parts of speech, which the tag names decide:
`tag_scheme`); this module reads which problem a split holds and keeps the table of them. A `Problem` says what its labels are and how they are read and encoded into `labels`, what the model's
outputs are, its loss per sample and the weights that make DDP and accumulation exact, how outputs
become predictions and scores, its metrics (finetune/metrics.py computes them), its trivial baseline,
what predictions.jsonl records of a sample, and its words for the console, the card and the pipeline
example. Problem-type names are compared here only (and in the rules of finetune/checks/, which judge
the settings' values).

`problem_type: null` reads it from train's label column: class names (strings, a ClassLabel) or
integer ids -> single-label; numbers with decimals -> regression; lists -> multi-label; and
`label_columns` -> multi-label. Whole numbers stored as floats (`1.0`, `2.0`) are ambiguous -- class ids or
numbers to predict? -- and refused with a line that names both fixes. A float column is never a class
column; an int column is a regression target only when problem_type says so. What a label column may
hold is checked by finetune/checks/labels.py as the labels are read and encoded here.

Labels in the `labels` column: a ClassLabel id (single-label), a float32 (regression), a float32
multi-hot vector of K (multi-label), a list of ClassLabel tag ids (tags). A regression model has one
output named after the label column (its `id2label`), so `pipeline(..., function_to_apply="none")`
returns the number under that name.

The per-sample loss is what finetune/run.py masks to real samples and scales by the window's sample
count (docs/topologies.md: the math of exact accumulation), so accumulation and DDP equal one big batch for every
problem type: transformers' BCEWithLogitsLoss and MSELoss are the mean of these per-sample values.
"""

from __future__ import annotations

from datasets import ClassLabel
from datasets import Dataset as HFDataset

from finetune import checks
from finetune.checks import labels
from finetune.config import DataArgs
from finetune.formats import is_list
from finetune.metrics import MULTI, PROBLEMS, REGRESSION, SINGLE, SPANS, TOKENS, WORD_TAGS
from finetune.problems.base import Labels, Problem, encode_labels, resolve_label_names
from finetune.problems.choices import Choices
from finetune.problems.multi_label import MultiLabel
from finetune.problems.regression import Regression
from finetune.problems.spans import Spans
from finetune.problems.tags import Tags, WordTags, encode_tags, tag_names, tag_scheme
from finetune.tasks import task_of

__all__ = ["MULTI", "REGRESSION", "SINGLE", "SPANS", "TOKENS", "WORD_TAGS", "Labels", "MultiLabel", "Problem", "Regression", "Spans",
           "Tags", "WordTags", "encode_labels", "encode_tags", "infer_problem_type", "problem_of", "problem_type_of",
           "problem_type_of_model", "resolve_label_names", "tag_names", "tag_scheme", "tags_in"]  # fmt: skip


# --- which problem ---------------------------------------------------------------------------------


def infer_problem_type(train: HFDataset, args: DataArgs, said: checks.Said | None = None) -> str:
    """`args.problem_type` checked against train's labels (checks/labels.py, PROBLEM), or read from them
    when it is null."""
    task = task_of(args.task)
    if problem_of(task.problems[0]).per_word:  # tags: the scheme of their names (IOB2 entities, or plain tags)
        tagger = problem_of(task.problems[0])  # both schemes read tags alike
        return tag_scheme(args.label_names or tagger.label_names(train, args, said if said is not None else checks.Said()))
    if len(task.problems) == 1:  # spans: the task's one problem
        return task.problems[0]
    if args.label_columns:
        return MULTI  # a rule refuses another problem_type beside label_columns
    column = labels.Column(train, args.label_column, args.problem_type)
    checks.gate(labels.PROBLEM, column, said=said if said is not None else checks.Said())
    if column.given is not None:
        return column.given
    return {"list": MULTI, "class": SINGLE, "int": SINGLE, "float": REGRESSION}[column.kind]


def problem_type_of(ds: HFDataset, task: str | None = None) -> str:
    """The problem type of a split whose `labels` are encoded (by `encode` or data.encode_labels): `task`'s
    one problem where it has one, else what the labels' feature holds."""
    if task is not None and len(task_of(task).problems) == 1:
        return task_of(task).problems[0]
    feature = ds.features["labels"]
    if isinstance(feature, dict):  # answers: {text, answer_start}
        return SPANS
    if is_list(feature) and isinstance(getattr(feature, "feature", None), ClassLabel):
        return tag_scheme(feature.feature.names)  # a tag id per word
    return SINGLE if isinstance(feature, ClassLabel) else MULTI if is_list(feature) else REGRESSION


PROBLEM_OF: dict[str, Problem] = {
    p.name: p for p in (Problem(), MultiLabel(), Regression(), Tags(), WordTags(), Spans(), Choices())
}
assert set(PROBLEM_OF) == set(PROBLEMS), "a problem of finetune/metrics.py's table has no class here"


def problem_of(name: str | None) -> Problem:
    """The problem of a problem_type (null: single-label, transformers' default)."""
    return PROBLEM_OF[name or SINGLE]


def problem_type_of_model(config) -> str | None:
    """A saved model's problem type, as transformers reads it (one output is a regression); None: from
    the data."""
    return getattr(config, "problem_type", None) or (REGRESSION if config.num_labels == 1 else None)


def tags_in(task: str) -> bool:
    """Whether a task's labels are a tag per word."""
    return any(problem_of(p).per_word for p in task_of(task).problems)
