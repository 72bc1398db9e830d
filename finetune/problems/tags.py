"""Tags: a tag per word (token classification), in one of two schemes that the tag names decide once
(`tag_scheme`): entity tags in IOB2 (`O`, `B-PER`, `I-PER`), scored by whole entities (seqeval's strict
entity F1); or a plain tag set without prefixes (parts of speech: `NOUN`, `VERB`, `DET`), scored word by
word (word accuracy, each tag's F1) against a per-word baseline."""

from __future__ import annotations

import collections
from typing import Any

import torch.nn.functional as F
from datasets import ClassLabel, Sequence
from datasets import Dataset as HFDataset

from finetune import checks
from finetune.checks import labels
from finetune.config import DataArgs
from finetune.formats import kind_of, plain_tags
from finetune.metrics import (
    TOKENS,
    WORD_TAGS,
    token_report,
    word_report,
)
from finetune.problems.base import (
    Problem,
    balanced,
    metrics_only,
    on_device,
    replace_labels,
    with_labels,
)


class Tags(Problem):
    """A tag per word (finetune/tasks/tags.py); not a transformers problem_type."""

    name, hf_problem_type = TOKENS, None
    classes, ids_as_names, per_word, windowed = False, False, True, True
    also_judged_by = "word_accuracy"  # an entity F1 above a baseline's 0 can still come from a tagger worse than "every word O"
    entities = True  # scored by whole entities (the card's per-type table, its words)
    pipeline_example = "Ada Lovelace was born in London."  # the card's pipeline call: a sentence of the kind
    pipeline_returns = "each entity: its type, words, score and character span"

    def describe(self, modality: str, names: list[str]) -> str:
        return f"A word tagger ({len(names)} tags)"

    def label_names(self, train, args, said):
        """The tag set (`tag_names`)."""
        given = list(args.label_names) if args.label_names else None
        checks.gate(labels.TAG_LISTS, train, args, "train")  # a string of tags would be read as its characters
        names = tag_names(train, args.tags_column, given)
        checks.gate(labels.TAG_SET, names, bool(given))
        return names

    def encode(self, ds, args, names, split, said, fixed=False):
        return encode_tags(ds, args, names, split, fixed)

    def check_trained(self, train, names, args, said) -> None:
        """A problem_type given for tags of the other scheme (token_classification beside parts of speech)."""
        checks.gate(labels.TAG_PROBLEM, args.problem_type, tag_scheme(names), names)

    def check_splits(self, raw, names, args, said) -> None:
        pass

    def check_read(self, ds, what, said) -> None:
        """IOB1, stray I- tags: said as they are read (training's splits, evaluation's --data)."""
        checks.gate(labels.TAGS_READ, ds.features["labels"].feature.names, what, ds, said=said)

    def placeholder(self, ds, args, names):
        return with_labels(ds, Sequence(ClassLabel(names=names)), lambda b: [[0] * len(w) for w in b[args.tokens_column]])

    def loss(self, logits, labels, class_weights=None, label_smoothing=0.0):
        """The cross-entropy SUMMED over a sample's labelled tokens (-100: not labelled), which
        `loss_weights` counts: the loop divides by the labelled tokens of the whole optimizer step."""
        return F.cross_entropy(logits.float().transpose(1, 2), labels, weight=on_device(class_weights, logits), reduction="none",
                               ignore_index=-100, label_smoothing=label_smoothing).sum(-1)  # fmt: skip

    def loss_weights(self, labels):
        """Its labelled tokens."""
        return (labels != -100).sum(-1)

    def class_weights(self, train_labels, num_labels, how):
        """Balanced over the labelled tokens' tags."""
        if how is None:
            return None
        return balanced([t for row in train_labels for t in row if t != -100], num_labels)

    def trivial(self, train_labels, train=None):
        """The most frequent tag (the lowest id of the most frequent), over the labelled subwords."""
        tags = [t for row in list(train_labels) for t in row if t != -100]
        return max(set(tags), key=lambda t: (tags.count(t), -t)) if tags else 0

    def baseline(self, constant, references, names, threshold=0.5, dataset=None):
        """Every word given the most frequent tag (usually O: entity F1 0)."""
        return metrics_only(self.report([[constant] * len(sentence) for sentence in references], references, names))

    def assemble(self, windows, dataset, data):
        """Each window's first-subword predictions (labels other than -100) put back into their sentences."""
        pieces: dict[int, list[tuple[int, list[int], list[int]]]] = {}  # sentence -> (first word, preds, gold)
        for meta, p, g in windows:
            scored = g != -100
            pieces.setdefault(int(meta["sentence"]), []).append((int(meta["first_word"]), p[scored].tolist(), g[scored].tolist()))
        sentences = sorted(pieces)
        if sentences != list(range(len(sentences))):
            raise RuntimeError("the evaluated windows do not cover every sentence once")
        predicted, gold = [], []
        for s in sentences:
            ordered = sorted(pieces[s])
            predicted.append([tag for _, p, _ in ordered for tag in p])
            gold.append([tag for _, _, g in ordered for tag in g])
        return predicted, gold

    def report(self, predictions, references, names, threshold=0.5):
        """Per sentence: lists of tag ids."""
        return token_report(predictions, references, names)

    def record(self, scored, label, names, per_label):
        """One line per sentence: its gold tags and predicted tags."""
        return {"labels": [names[t] for t in label], "predictions": [names[t] for t in scored]}


class WordTags(Tags):
    """A plain tag set (parts of speech: no B-/I- prefixes): each word scored on its own, by word accuracy and
    each tag's precision, recall and F1 (`metrics.word_report`); no entities. Its trivial baseline gives each
    word form its most frequent tag in training (a word unseen there: the most frequent tag), a tagger that
    knows words but no context: "every word NOUN" is a bar any model clears."""

    name = WORD_TAGS
    also_judged_by = None  # word accuracy is the judged metric itself
    trivial_words = "most frequent tag of each word form, and the most frequent tag for a word unseen in training"
    baseline_model = "a tagger that gives each word its most frequent training tag, whatever its context"
    entities = False
    pipeline_example = "The old man sat by the river."
    pipeline_returns = "each run of words of one tag: the tag, its words, score and character span"

    def describe(self, modality: str, names: list[str]) -> str:
        return f"A word tagger ({len(names)} tags without B-/I- prefixes, such as parts of speech; scored by word accuracy)"

    def usage(self, example: str, model_json: dict, public: dict[str, Any]) -> str:
        return example + ('\n# a tag per word (no B-/I-): the pipeline joins adjacent words of one tag into one span; '
                          'aggregation_strategy="none" gives each subword its own tag')

    def trivial(self, train_labels, train=None):
        """({word: its most frequent tag}, the most frequent tag over all words), counted over the training
        words (`train`, prepared: each window's `words` and `word_tags`); ties go to the lowest tag id."""
        by_word: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        overall: collections.Counter = collections.Counter()
        for words, tags in zip(train["words"][:], train["word_tags"][:], strict=True):
            for word, tag in zip(words, tags, strict=True):
                by_word[word][tag] += 1
                overall[tag] += 1
        return {word: _most(counts) for word, counts in by_word.items()}, _most(overall)

    def baseline(self, constant, references, names, threshold=0.5, dataset=None):
        """The scores of tagging each word of the evaluated split (`dataset`, prepared) by `trivial`."""
        by_word, default = constant
        words = sentence_words(dataset)
        if [len(s) for s in words] != [len(s) for s in references]:
            raise RuntimeError("the evaluated words do not match the evaluated tags")
        return metrics_only(self.report([[by_word.get(w, default) for w in s] for s in words], references, names))

    def report(self, predictions, references, names, threshold=0.5):
        return word_report(predictions, references, names)


def _most(counts: collections.Counter) -> int:
    """The most frequent tag id of `counts` (ties: the lowest id; none: 0)."""
    return max(counts, key=lambda t: (counts[t], -t)) if counts else 0


def tag_scheme(names) -> str:
    """The problem a tag set is, from its names alone: word tagging for a plain set (no B-/I- or other
    scheme prefixes: parts of speech, `formats.plain_tags`), token classification (entities in IOB2) else."""
    return WORD_TAGS if plain_tags(names) else TOKENS


def sentence_words(dataset) -> list[list[str]]:
    """Each sentence's words, in order, from its windows (`words`, `sentence`, `first_word` of each row)."""
    pieces: dict[int, list[tuple[int, list[str]]]] = {}
    for sentence, first, words in zip(dataset["sentence"][:], dataset["first_word"][:], dataset["words"][:], strict=True):
        pieces.setdefault(int(sentence), []).append((int(first), list(words)))
    return [[w for _, words in sorted(pieces[s]) for w in words] for s in sorted(pieces)]


# --- tags (token classification) ----------------------------------------------------------------------


def tag_names(train: HFDataset, column: str, given: list[str] | None) -> list[str]:
    """The tag set in id order: `label_names`; a ClassLabel's names; else train's tags, "O" first then
    sorted by entity type, B- before I- (a plain set, `formats.plain_tags`: by name). Integer tags need
    `label_names`."""
    inner = getattr(train.features[column], "feature", None)
    checks.gate(labels.TAG_COUNT, {t for row in train[column] for t in row}, column, inner)
    if given:
        return given
    if isinstance(inner, ClassLabel):
        return list(inner.names)
    if kind_of(inner) == "int":
        raise checks.explain(labels.TAG_IDS, column)
    counts = collections.Counter(str(t) for row in train[column] for t in row)
    checks.gate(labels.TAG_NAMES, counts)
    if plain_tags(counts):  # parts of speech: O (if any) first, then by name
        return sorted(counts, key=lambda t: (t != "O", t))
    return sorted(counts, key=lambda t: (t != "O", t[2:], t[:2]))


def encode_tags(ds: HFDataset, args: DataArgs, tag_set: list[str], split: str, fixed: bool = False) -> HFDataset:
    """Each row's tags into `labels`: a list of tag ids, one per word, by name (integer tags through
    `label_names`); a tag outside the tag set is refused with its row and word (`fixed`: in a model's words)."""
    checks.gate(labels.TAG_LISTS, ds, args, split)
    inner = getattr(ds.features[args.tags_column], "feature", None)
    if isinstance(inner, ClassLabel):
        def name_of(v):  # noqa: E306
            return inner.names[v]
    elif kind_of(inner) == "int":
        def name_of(v):  # noqa: E306
            return tag_set[v] if 0 <= v < len(tag_set) else None
    else:
        name_of = str
    to_id = {name: i for i, name in enumerate(tag_set)}
    for row, tags in enumerate(ds[args.tags_column][:]):
        for word, tag in enumerate(tags):
            if name_of(tag) not in to_id:
                raise checks.explain(labels.TAG_UNKNOWN, split, tag, row + 1, word + 1, tag_set, bool(args.label_names), fixed)
    return replace_labels(ds, [args.tags_column], lambda b: [[to_id[name_of(t)] for t in tags] for tags in b[args.tags_column]],
                           Sequence(ClassLabel(names=tag_set)), split)  # fmt: skip
