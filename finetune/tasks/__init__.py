"""The tasks: what a model predicts from what. Each task says everything about itself here.

    task                   inputs              auto class                          preprocessor     labels
    text-classification    a text, or a pair   AutoModelForSequenceClassification  tokenizer        per text
    image-classification   an image            AutoModelForImageClassification     image processor  per image
    token-classification   a list of words     AutoModelForTokenClassification     tokenizer        a tag per word
    question-answering     question, context   AutoModelForQuestionAnswering       tokenizer        answer spans
    multiple-choice        context, endings    AutoModelForMultipleChoice          tokenizer        the right ending

A task names its auto model class (and the `architectures` of a saved model it recognises), loads
its preprocessor and checks it against the model, names and checks its input columns, prepares a
split for the model (tokenized once; images decoded on the fly) and collates batches, says how many
data workers it wants on a GPU, what the layer-split planner takes as a sample's sequence length,
what predictions.jsonl shows of a sample, and the model card's usage example. No other module
compares task names: the rest of the app asks `task_of(cfg.task)`. Adding a task is a module here and
its entry in `TASKS` (docs/development.md).

Heavy libraries (transformers, datasets, PIL) are imported where they are used, so that reading the
config (and `--help`) does not load them.
"""

from __future__ import annotations

from finetune import checks
from finetune.checks import models as model_rules
from finetune.tasks.base import DataArgs, Task, _serialized, tokenized_fingerprint
from finetune.tasks.choices import MultipleChoice
from finetune.tasks.images import ImageClassification, stack_images
from finetune.tasks.questions import PadSpans, QuestionAnswering
from finetune.tasks.tags import WORD_META, WORD_TEXT, PadWords, TokenClassification
from finetune.tasks.text import PAIRS, PadText, TextClassification, pair_first, pair_partner

__all__ = ["PAIRS", "WORD_META", "WORD_TEXT", "ImageClassification", "PadSpans", "PadText", "PadWords",
           "QuestionAnswering", "Task", "TextClassification", "TokenClassification", "_serialized", "pair_first",
           "pair_partner", "stack_images", "tokenized_fingerprint"]

# In the order `task_for_data` asks them whether the data is theirs.
TASKS: dict[str, Task] = {
    task.name: task
    for task in (QuestionAnswering(), MultipleChoice(), TokenClassification(), ImageClassification(), TextClassification())
}
TASK_NAMES = tuple(TASKS)
DEFAULT_TASK = TextClassification.name


def task_of(name: str) -> Task:
    return TASKS[name]


def task_for_data(features, data: DataArgs) -> str:
    """The task whose data this is (datasets' `features` of the training split): the first task that
    claims it, else text classification."""
    return next((t.name for t in TASKS.values() if t.holds(features, data)), DEFAULT_TASK)


def task_of_model(config, spec: str, asked: str | None = None) -> Task:
    """The task of a saved model, from its config's `architectures` (or `asked`, from --task). A pretrained
    base model (BertModel, BertForMaskedLM: no head of ours, transformers' default labels) is refused:
    its classifier would be random weights."""
    architectures = getattr(config, "architectures", None) or []
    suffixes = [t.architecture_suffix for t in TASKS.values()]
    checks.gate(model_rules.SAVED_TASK, spec, architectures, getattr(config, "id2label", None) or {}, suffixes)
    if asked is not None:
        return task_of(asked)
    for task in TASKS.values():
        if any(a.endswith(task.architecture_suffix) for a in architectures):
            return task
    raise checks.explain(model_rules.TASK_UNKNOWN, spec, architectures, TASK_NAMES)

