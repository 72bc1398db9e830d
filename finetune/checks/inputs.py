"""Inputs: what the model will read of each sample, once it is tokenized (finetune/tasks/' preparation
asks these of the training split).

    TOKENIZED   texts (or sentence pairs) cut at max_length, texts the tokenizer reads as unknown tokens
    WORDS       a tagging word that is no token at all for the tokenizer
    QUESTIONS   a question that leaves a window no room for its context, or for the overlap doc_stride asks
    WINDOWS     windows of a long text (text_windows) that overlap by as much as they hold
    READ_WHOLE  TOKENIZED without the cut texts: texts read whole in windows
"""

from __future__ import annotations

from finetune.checks import rule
from finetune.text import shown


def _cut(texts: list, lengths: list[int], max_length: int, tokenizer, pairs: list | None) -> tuple | None:
    """(how many are cut, the words for the share of tokens past max_length in the texts measured, tokenized
    whole, the words for the model's own limit) where a tenth or more of the training texts (or pairs) reach
    max_length; None otherwise."""
    cut = sum(n >= max_length for n in lengths) if max_length and lengths else 0
    if not cut or cut * 10 < len(lengths):
        return None
    limit = getattr(tokenizer, "model_max_length", None)
    most = f" (the model's limit is {limit})" if limit and limit < 100_000 and limit > max_length else ""
    first = [str(x) for x in texts]
    whole = [len(t) for t in tokenizer(*([first, [str(x) for x in pairs]] if pairs is not None else [first]),
                                       add_special_tokens=True)["input_ids"]]  # fmt: skip
    lost = sum(max(n - max_length, 0) for n in whole) / max(sum(whole), 1)
    measured = f" (of the first {len(texts):,} measured)" if len(texts) < len(lengths) else ""
    return cut, f"{lost:.0%} of the training {'pairs' if pairs is not None else 'texts'}' tokens{measured}", most


@rule("inputs.texts_cut", warning=True)
def texts_cut(texts: list, ids: list[list[int]], lengths: list[int], max_length: int, tokenizer,
              pairs: list | None = None, streaming: bool = False) -> str | None:  # fmt: skip
    """A tenth or more of the training texts cut at max_length: the model reads only their start, which the
    user may not know (the default, 128 tokens, is about 90 words). The line leads with the share of the
    texts' tokens lost (the first 2,000 texts, tokenized whole): a review of 700 words at 128 tokens loses most
    of itself, which "all texts reach max_length" does not say. Windows are offered where the run may read
    them (a streamed run cannot)."""
    found = _cut(texts, lengths, max_length, tokenizer, pairs) if pairs is None else None
    if found is None:
        return None
    cut, lost, most = found
    windows = "" if streaming else f", or read each whole in overlapping windows (text_windows={max_length // 4})"
    return (f"{lost} are lost at max_length={max_length}: {cut:,} of {len(lengths):,} training texts "
            f"({cut / len(lengths):.0%}) reach it and are cut there, so the model reads only their start; raise "
            f"max_length{most} to read more of each, at a cost in time{windows}")


@rule("inputs.pairs_cut", warning=True)
def pairs_cut(texts: list, ids: list[list[int]], lengths: list[int], max_length: int, tokenizer,
              pairs: list | None = None, streaming: bool = False) -> str | None:  # fmt: skip
    """A tenth or more of the training sentence pairs cut at max_length, the share of their tokens lost as
    for single texts; the fix is a larger max_length alone, as text_windows reads single texts, not pairs."""
    found = _cut(texts, lengths, max_length, tokenizer, pairs) if pairs is not None else None
    if found is None:
        return None
    cut, lost, most = found
    return (f"{lost} are lost at max_length={max_length}: {cut:,} of {len(lengths):,} training sentence pairs "
            f"({cut / len(lengths):.0%}) reach it and are cut there (the longer text of a pair first), so the model "
            f"reads only their start; raise max_length{most} to read more of each, at a cost in time (text_windows "
            "reads single texts, not pairs)")


@rule("inputs.unknown_tokens", warning=True)
def unknown_tokens(texts: list, ids: list[list[int]], lengths: list[int], max_length: int, tokenizer,
                   pairs: list | None = None, streaming: bool = False) -> str | None:  # fmt: skip
    """Texts the tokenizer reads as unknown tokens ([UNK]): a script its vocabulary does not cover (Amharic,
    Tibetan, ... for an English vocabulary). Said when a fifth of the first 2,000 texts are nothing else, or
    half of all their tokens are unknown: the model would train on none of their words."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not ids:
        return None
    special = set(tokenizer.all_special_ids) - {unk}
    words = [[t for t in row if t not in special] for row in ids]
    only = [i for i, row in enumerate(words) if row and all(t == unk for t in row)]
    total, unknown = sum(map(len, words)), sum(row.count(unk) for row in words)
    if len(only) * 5 < len(words) and not (total and unknown * 2 >= total):
        return None
    example = texts[only[0]] if only else next((t for t, row in zip(texts, words, strict=False) if unk in row), "")
    return (f"{len(only)} of the first {len(words)} training texts are nothing but unknown tokens to the tokenizer "
            f"({tokenizer.unk_token}), and {unknown} of their {total} tokens are unknown (e.g. {shown(str(example)[:40])}): "
            "the model cannot read their words; use a model whose tokenizer covers their script (a multilingual one)")


PIECES_A_WORD, SPLIT_SHARE = 1.6, 0.35  # English text with an English vocabulary: 1.06-1.12 pieces, 4-8% split


def pieces_a_word(texts: list, tokenizer) -> tuple[float, float] | None:
    """(the tokenizer's pieces a word, the share of words in two or more pieces) over the first 300 texts,
    words as the tokenizer's own pre-tokenizer cuts them (CJK characters one by one); None without a fast
    tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.pre_tokenizer is None:
        return None
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else (lambda t: t)
    words = [w for t in texts[:300] if isinstance(t, str) for w, _ in backend.pre_tokenizer.pre_tokenize_str(normalize(t))]
    if len(words) < 50:
        return None
    counts = [len(ids) for ids in tokenizer(words, add_special_tokens=False)["input_ids"]]
    return sum(counts) / len(counts), sum(c >= 2 for c in counts) / len(counts)


@rule("inputs.words_in_pieces", warning=True)
def words_in_pieces(texts: list, ids: list[list[int]], lengths: list[int], max_length: int, tokenizer,
                    pairs: list | None = None, streaming: bool = False) -> str | None:  # fmt: skip
    """Training texts whose words the tokenizer mostly cuts into pieces: a vocabulary of another language (German
    news under an English uncased vocabulary: no unknown token, since accents are stripped, but 2.6 pieces a word
    and most words split, against 1.1 on English), so the model reads fragments of words it never learned."""
    measured = pieces_a_word(texts, tokenizer)
    if measured is None or measured[0] < PIECES_A_WORD or measured[1] < SPLIT_SHARE:
        return None
    ratio, share = measured
    return (f"the tokenizer cuts {share:.0%} of the training texts' words into two or more pieces ({ratio:.2f} pieces a "
            "word, where text in its vocabulary's language takes about 1.1): its vocabulary is probably not the texts' "
            "language, and the model reads fragments of words; use a model trained on that language (or a "
            "multilingual one, such as xlm-roberta-base)")


TOKENIZED = [texts_cut, pairs_cut, unknown_tokens, words_in_pieces]
READ_WHOLE = [unknown_tokens, words_in_pieces]


@rule("inputs.word_without_tokens", local=True)
def word_without_tokens(split: str, word: str, row: int, index: int) -> str:
    """A tagging word that is no token for the tokenizer (a control character, a symbol it drops): it could
    carry no tag. Met by the process that tokenizes its share."""
    return (f"the {split} data's word {word!r} at row {row + 1}, word {index + 1} is no token for this tokenizer (a "
            "control character, or a symbol it drops); remove or replace it")


WORDS = [word_without_tokens]


@rule("inputs.question_leaves_no_room")
def question_leaves_no_room(questions: list[str], tokenizer, max_length: int, doc_stride: int, split: str) -> str | None:
    """A question so long that a window of max_length tokens has no room for its context, or less room than
    doc_stride, the tokens consecutive windows share (the tokenizer fails on either mid-run)."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
    row = max(range(len(lengths)), key=lengths.__getitem__, default=None)
    if row is None:
        return None
    room = max_length - lengths[row] - specials
    if room <= 0:
        return (f"the question of row {row + 1} of the {split} data is {lengths[row]} tokens long: with the {specials} "
                f"special tokens a window of max_length={max_length} leaves no room for its context; raise max_length "
                "(the recipe's is 384) or shorten the question")
    if doc_stride >= room:
        return (f"doc_stride={doc_stride} is not below the room a window leaves for the context, {room} tokens (max_length="
                f"{max_length} less the {lengths[row]}-token question of row {row + 1} of the {split} data and {specials} "
                f"special tokens); lower doc_stride (to {max(room // 4, 0)}, say) or raise max_length")
    return None


QUESTIONS = [question_leaves_no_room]


@rule("inputs.windows_overlap_whole")
def windows_overlap_whole(tokenizer, max_length: int, overlap: int, pair: str | None) -> str | None:
    """text_windows that asks consecutive windows to share as many tokens as a window holds (the tokenizer
    fails on it mid-run), or windows of sentence pairs (which of the two would be windowed is not said)."""
    if pair is not None:
        return (f"text_windows reads one long text in windows; this data is sentence pairs (text_pair_column={pair}): "
                "set text_windows=null, or raise max_length to read more of each pair")
    room = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    if overlap >= room:
        return (f"text_windows={overlap} is not below the tokens a window holds, {room} (max_length={max_length} less "
                f"the special tokens): consecutive windows would share all of them; lower text_windows (to {room // 4}, say)")
    return None


@rule("inputs.windows_overlap_most", warning=True)
def windows_overlap_most(tokenizer, max_length: int, overlap: int, pair: str | None) -> str | None:
    """text_windows above half of what a window holds: each window moves on by fewer tokens than it
    repeats, so a text makes several times the windows (and the time) it needs to be read whole."""
    room = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    if pair is not None or not room // 2 < overlap < room:
        return None
    return (f"text_windows={overlap} of windows of {room} tokens: each window moves on by {room - overlap}, so every "
            f"token is read about {room / (room - overlap):.0f} times, in as many times the windows; an overlap of a "
            f"quarter, text_windows={room // 4}, reads each text whole at far less cost")


WINDOWS = [windows_overlap_whole, windows_overlap_most]
