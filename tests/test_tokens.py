"""Token classification: a tag per word, scored on words, exact under accumulation, DDP and resume.

Synthetic tagging data (people, places, organisations from small word lists, in IOB2), a few
sentences longer than a window of `max_length` subwords, and the tiny BERT of conftest.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import DATA, REPO, TINY_BERT, TOKENIZER, launch, user_error, write_jsonl
from datasets import ClassLabel, Dataset, Sequence
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune import checks
from finetune.checks.labels import invalid_iob2
from finetune.config import load_config, resolved
from finetune.data import load_raw, load_splits, read_conll, read_splits
from finetune.errors import UserError
from finetune.evaluate_checkpoint import main as evaluate
from finetune.metrics import token_report
from finetune.models import load_preprocessor
from finetune.run import main
from finetune.tasks import task_of

TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
PEOPLE = [["ada", "lovelace"], ["alan", "turing"], ["grace"], ["marie", "curie"]]
PLACES = [["london"], ["new", "york"], ["paris"], ["buenos", "aires"]]
ORGS = [["the", "royal", "society"], ["acme"], ["united", "nations"]]
FILLER = "the a of in and was said went to met with near from by for".split()


def sentence(rng: random.Random, length: int) -> dict:
    words, tags = [], []
    while len(words) < length:
        kind = rng.random()
        if kind < 0.15:
            entity, label = rng.choice(PEOPLE), "PER"
        elif kind < 0.25:
            entity, label = rng.choice(PLACES), "LOC"
        elif kind < 0.3:
            entity, label = rng.choice(ORGS), "ORG"
        else:
            words.append(rng.choice(FILLER))
            tags.append("O")
            continue
        words += entity
        tags += [f"B-{label}"] + [f"I-{label}"] * (len(entity) - 1)
    return {"tokens": words, "ner_tags": tags}


def write_tagging(path: Path, n: int, seed: int, long_every: int = 9) -> Path:
    """n sentences; every `long_every`-th one has 40 words (more subwords than a 32-token window)."""
    rng = random.Random(seed)
    rows = [sentence(rng, 40 if i % long_every == 4 else rng.randint(1, 12)) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def tagging(tmp_path) -> dict[str, Path]:
    return {
        "train": write_tagging(tmp_path / "train.jsonl", 37, seed=0),
        "validation": write_tagging(tmp_path / "validation.jsonl", 13, seed=1),
    }


def tagging_args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "task=token-classification",
        f"model_config={TINY_BERT}",
        f"tokenizer_name={TOKENIZER}",
        f"train_file={data['train']}",
        f"validation_file={data['validation']}",
        "test_file=null",
        "max_train_samples=null",
        "max_eval_samples=null",
        "freeze_embeddings=false",  # the default recipe freezes them and turns dropout off: tests choose
        "dropout=null",
        f"label_names={json.dumps(TAGS)}",
        "max_length=32",
        "learning_rate=1e-3",
        "warmup_ratio=0.2",
        "logging_steps=1",
        f"output_dir={out}",
        *extra,
    ]


def _counts(path: Path) -> tuple[int, int]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return len(rows), sum(len(r["tokens"]) for r in rows)


# --- data and labels ---------------------------------------------------------------------------------


def test_conll_files_read_with_comments_docstart_and_an_index_column(tmp_path):
    plain = tmp_path / "a.conll"
    plain.write_text("-DOCSTART- -X- -X- O\n\nAda B-PER\nLovelace I-PER\nwrote O\n\n# a comment\nLondon B-LOC\n")
    ds = read_conll(str(plain), "train", "tokens", "ner_tags")
    assert ds["tokens"] == [["Ada", "Lovelace", "wrote"], ["London"]]
    assert ds["ner_tags"] == [["B-PER", "I-PER", "O"], ["B-LOC"]]
    ud = tmp_path / "b.iob2"  # UNER's layout: index, word, tag, and two more columns
    ud.write_text("# sent_id = 1\n1\tAda\tB-PER\t-\tx\n2\tsaid\tO\t-\t-\n\n1\t#\tO\t-\t-\n")
    ds = read_conll(str(ud), "train", "words", "tags")
    assert ds["words"] == [["Ada", "said"], ["#"]] and ds["tags"] == [["B-PER", "O"], ["O"]]


def test_conll_words_that_start_with_a_hash_and_a_bom_are_read_as_words(tmp_path):
    """`#foodie O` inside a sentence is a word and its tag, not a comment (`# sent_id = 1` still is); a
    BOM before `-DOCSTART-` or a first comment is not part of the line."""
    path = tmp_path / "tweets.conll"
    path.write_text("\ufeff-DOCSTART- -X- -X- O\n\n#Marta B-PER\nloves O\n#foodie O\n\n# a comment here\n#1 O\n",
                    encoding="utf-8")  # fmt: skip
    ds = read_conll(str(path), "train", "tokens", "ner_tags")
    assert ds["tokens"] == [["#Marta", "loves", "#foodie"], ["#1"]]
    assert ds["ner_tags"] == [["B-PER", "O", "O"], ["O"]]
    ud = tmp_path / "bom.conllu"
    ud.write_text("\ufeff# sent_id = 1\n1\tAda\tAda\tPROPN\tNNP\t_\t2\tnsubj\t_\t_\n2\twent\tgo\tVERB\tVBD\t_\t0\troot\t_\t_\n",
                  encoding="utf-8")  # fmt: skip
    assert read_conll(str(ud), "train", "tokens", "upos")["upos"] == [["PROPN", "VERB"]]


def test_tags_that_differ_only_by_case_are_refused_and_a_plain_set_is_ordered_by_name(tmp_path, capsys):
    from finetune.problems import tag_names

    rows = [{"tokens": ["ada", "went"], "ner_tags": ["B-PERSON", "O"]}, {"tokens": ["bo", "ran"], "ner_tags": ["B-Person", "O"]}]
    data = {"train": _rows(tmp_path / "t.jsonl", rows * 3), "validation": _rows(tmp_path / "v.jsonl", rows)}
    user_error(capsys, main, tagging_args(data, tmp_path / "run", "label_names=null"),
               "tags 'B-PERSON' and 'B-Person' differ only by letter case", rule="labels.tag_case_twins")  # fmt: skip
    assert not (tmp_path / "run").exists()
    upos = _rows(tmp_path / "p.jsonl", [{"tokens": ["a", "b", "c", "d"], "upos": ["VERB", "ADJ", "NOUN", "DET"]}])
    assert tag_names(load_raw({"train": str(upos)}, None, None, None)["train"], "upos", None) == ["ADJ", "DET", "NOUN",
                                                                                                  "VERB"]


def test_a_conllu_file_gives_its_words_and_parts_of_speech(tmp_path, capsys):
    """Universal Dependencies' ten columns: FORM and UPOS, a multiword token's range and an empty node
    skipped; trained as a plain tag set. Its MISC column of `_` would be no tags: a `_` tag is refused."""
    rows = ["# sent_id = 1", "# text = Ada didn't go.",
            "1\tAda\tAda\tPROPN\tNNP\t_\t3\tnsubj\t_\t_", "2-3\tdidn't\t_\t_\t_\t_\t_\t_\t_\t_",
            "2\tdid\tdo\tAUX\tVBD\t_\t4\taux\t_\t_", "3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_",
            "4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No", "4.1\tgone\t_\t_\t_\t_\t_\t_\t_\t_",
            "5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_", ""]  # fmt: skip
    path = tmp_path / "ud.conllu"
    path.write_text("\n".join(rows * 12))
    ds = read_conll(str(path), "train", "tokens", "upos")
    assert ds["tokens"][0] == ["Ada", "did", "n't", "go", "."] and len(ds) == 12
    assert ds["upos"][0] == ["PROPN", "AUX", "PART", "VERB", "PUNCT"]
    main(tagging_args({"train": path, "validation": path}, tmp_path / "run", "label_names=null", "max_steps=1"))
    assert json.loads((tmp_path / "run" / "results.json").read_text())["validation"]["num_words"] == 60
    blank = tmp_path / "misc.conll"  # a word and its MISC column
    blank.write_text("Ada\t_\ngo\t_\n\n")
    user_error(capsys, main, tagging_args({"train": blank, "validation": path}, tmp_path / "run2", "label_names=null"),
               "tag '_' at row 1, word 1 is '_', CoNLL's mark for a value not given", rule="columns.tag_not_iob2")  # fmt: skip


@pytest.mark.parametrize(
    "text, fragment, rule",
    [
        ("Ada B-PER\nsaid O extra\n", "line 2 has 3 column(s), the file's first token line has 2",
         "files.txt_not_conll"),
        ("Ada\n", "line 1 has 1 column(s), a token and its tag", "files.txt_not_conll"),
        ("# only a comment\n\n", "no token lines", "files.conll_no_tokens"),
        ("Ada B-PER\nsaid O\n" * 60 + "\nok O\n", "reads as 2 sentence(s), one of 120 words: a CoNLL file has a "
                                                   "blank line after each sentence", "files.conll_no_blank_lines"),
    ],
)  # fmt: skip
def test_a_damaged_conll_file_is_one_line_with_its_line(tmp_path, text, fragment, rule):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as raised:
        load_raw({"train": str(path)}, None, None, None)
    assert raised.value.rule == rule


def test_a_conll_file_with_a_header_line_is_refused_as_such(tmp_path):
    """`word<TAB>tag` (a table's header) on the first line is said to be one; a first word "Word" tagged O is
    a token."""
    path = tmp_path / "h.conll"
    path.write_text("TOKEN\tNE\nAda\tB-PER\nwrote\tO\n")
    with pytest.raises(UserError, match=r"line 1 looks like a header \('TOKEN NE'\): a CoNLL file has none") as raised:
        read_conll(str(path), "train", "tokens", "ner_tags")
    assert raised.value.rule == "files.conll_header"
    path.write_text("Word\tO\nAda\tB-PER\n")
    assert read_conll(str(path), "train", "tokens", "ner_tags")["tokens"] == [["Word", "Ada"]]


def test_a_conll_file_of_many_sentences_with_one_long_one_is_read(tmp_path):
    """Twenty sentences with their blank lines, one of 600 words: a long sentence (split into windows for
    the model), not a file without blank lines."""
    path = tmp_path / "long.conll"
    path.write_text("\n".join(["Ada B-PER\nsaid O\n"] * 19 + ["word O\n" * 600]))
    ds = read_conll(str(path), "train", "tokens", "ner_tags")
    assert len(ds) == 20 and max(len(w) for w in ds["tokens"]) == 600


def test_first_subword_carries_the_tag_and_long_sentences_become_windows(tmp_path):
    """Every word is labelled exactly once, on its first subword, whatever the windows; with
    label_all_tokens the later subwords of a B- word train on its I- tag."""
    words = ["ada", "lovelace", "visited", "unbelievably", "londonderry"] * 12  # 60 words
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC"] * 12
    ds = Dataset.from_dict({"tokens": [words], "labels": [[TAGS.index(t) for t in tags]]})
    ds = ds.cast_column("labels", Sequence(ClassLabel(names=TAGS)))
    cfg = load_config(None, ["task=token-classification", f"tokenizer_name={TOKENIZER}", f"model_config={TINY_BERT}",
                             "max_length=24", f"train_file={DATA / 'rotten_tomatoes' / 'train.csv'}"])  # fmt: skip
    tokenizer = load_preprocessor(cfg.model_args)
    task = task_of("token-classification")
    prepared = task.prepare(ds, tokenizer, cfg.data_args, "validation", 3)
    assert len(prepared) > 1 and all(n <= 24 for n in prepared["length"])  # windows that fit
    assert prepared["sentence"] == [0] * len(prepared)
    windows = sorted(zip(prepared["first_word"], prepared["labels"], strict=True))
    labelled = [label for _, labels in windows for label in labels if label != -100]
    assert labelled == [TAGS.index(t) for t in tags]  # each word once, in order
    assert task.sample_weights(prepared) == [sum(label != -100 for label in ls) for ls in prepared["labels"]]

    cfg = dataclasses.replace(cfg, label_all_tokens=True)
    trained = task.prepare(ds, tokenizer, cfg.data_args, "train", 3)
    pieces = tokenizer(["lovelace", "londonderry"], add_special_tokens=False)["input_ids"]
    assert len(pieces[1]) > 1  # londonderry is several subwords: its later ones get I-LOC
    first = sorted(zip(trained["first_word"], trained["labels"], strict=True))[0][1]
    assert TAGS.index("I-LOC") in first and -100 not in first[1:-1]


def test_task_is_read_from_the_data_when_null(tagging, tmp_path):
    cfg = load_config(None, ["task=null", f"train_file={tagging['train']}"])
    assert infer_task(cfg.data_args) == "token-classification"
    cfg = load_config(None, ["task=null"])  # the default recipe's sentences
    assert infer_task(cfg.data_args) == "text-classification"


def infer_task(args) -> str:
    """The task the data holds, as finetune/run.py reads it when the config leaves it null."""
    from finetune.tasks import task_for_data

    return task_for_data(read_splits(args)["train"].features, args)


def test_tags_from_parquet_json_and_integer_ids_with_label_names(tmp_path):
    """The same sentences from parquet, from a .json array and from JSON Lines of integer tag ids
    (with label_names naming each id) load as the same tags, and each is recognised as tagging data."""
    rows = [json.loads(line) for line in write_tagging(tmp_path / "s.jsonl", 12, seed=3).read_text().splitlines()]
    Dataset.from_list(rows).to_parquet(tmp_path / "tags.parquet")
    (tmp_path / "tags.json").write_text(json.dumps(rows))  # one JSON array of records, not lines
    ids = [{"tokens": r["tokens"], "ner_tags": [TAGS.index(t) for t in r["ner_tags"]]} for r in rows]
    _rows(tmp_path / "ids.jsonl", ids)
    Dataset.from_list(ids).to_parquet(tmp_path / "ids.parquet")
    validation = _rows(tmp_path / "v.jsonl", rows[:2])

    def load(train: str, label_names: list[str] | None):
        cfg = load_config(None, ["task=null", f"train_file={tmp_path / train}", f"validation_file={validation}",
                                 "test_file=null", f"label_names={json.dumps(label_names)}"])  # fmt: skip
        cfg = resolved(cfg, checks.Said(), task=infer_task(cfg.data_args))
        assert cfg.task == "token-classification", train
        return load_splits(cfg.data_args)

    for train, given in (("tags.parquet", None), ("tags.json", None), ("ids.jsonl", TAGS), ("ids.parquet", TAGS)):
        raw, names = load(train, given)
        assert [[names[i] for i in labels] for labels in raw["train"]["labels"]] == [r["ner_tags"] for r in rows], train
        assert raw["train"]["tokens"] == [r["tokens"] for r in rows], train
    with pytest.raises(UserError, match="holds integer ids; set label_names"):  # ids alone name nothing
        load("ids.parquet", None)
    _rows(tmp_path / "seven.jsonl", [{"tokens": ["ada", "went"], "ner_tags": [1, 7]}])  # ids 0-6 only
    with pytest.raises(UserError, match="tag 7 at row 1, word 2 is not in label_names"):
        load("seven.jsonl", TAGS)


def test_the_start_summary_counts_sentences_and_their_windows(tagging, tmp_path, capsys):
    """A tagging run's first line counts sentences, as its scores do, and the windows the long ones make."""
    main(tagging_args(tagging, tmp_path / "run", "max_steps=1"))
    found = re.search(r"train 37 sentences \((\d+) windows\) / validation 13 sentences \((\d+) windows\)",
                      capsys.readouterr().out)  # fmt: skip
    assert found and int(found.group(1)) > 37 and int(found.group(2)) > 13  # every 9th sentence is split


def test_words_that_hold_a_space_are_one_warning(tmp_path, capsys):
    """"New York" as one word: the model learns it whole, a pipeline splits it at the space; one warning with
    the fix. Words without spaces say nothing."""
    rows = [{"tokens": ["New York", "is", "big"], "ner_tags": ["B-LOC", "O", "O"]},
            {"tokens": ["Ada", "lives", "there"], "ner_tags": ["B-PER", "O", "O"]}] * 4  # fmt: skip

    def said(data: list[dict]) -> list[str]:
        path, heard = write_jsonl(tmp_path / "t.jsonl", data), checks.Said()
        load_splits(load_config(None, ["task=token-classification", f"train_file={path}", "validation_file=null",
                                       "test_file=null", "validation_split_percentage=25", "label_names=null"]
                                ).data_args, heard)  # fmt: skip
        lines = [line for line in capsys.readouterr().err.splitlines() if "hold a space" in line]
        assert ("columns.words_with_spaces" in heard.rules()) == bool(lines)
        return lines

    (line,) = said(rows)
    assert re.search(r"^warning: \d of the \d+ training words hold a space \('New York'\): a pipeline and any text "
                     r"split at spaces sees such a word as two", line), line
    assert said([{"tokens": r["tokens"][0].split()[:1] + r["tokens"][1:], "ner_tags": r["ner_tags"]} for r in rows]) == []


def test_a_share_held_out_of_a_file_that_repeats_its_sentences_is_said(tmp_path):
    """Every sentence written twice and a share held out for validation: the share is mostly copies of
    training sentences, said once; the same sentences each written once say nothing."""
    rows = [json.loads(line) for line in write_tagging(tmp_path / "s.jsonl", 20, seed=4).read_text().splitlines()]

    def rules(data: list[dict]) -> list[str]:
        path, said = write_jsonl(tmp_path / "t.jsonl", data), checks.Said()
        load_splits(load_config(None, ["task=token-classification", f"train_file={path}", "validation_file=null",
                                       "test_file=null", "validation_split_percentage=25", "label_names=null"]
                                ).data_args, said)  # fmt: skip
        return said.rules()

    assert "splits.held_out_repeats" in rules(rows * 2)
    assert "splits.held_out_repeats" not in rules(rows)


def test_integer_tags_of_the_users_file_are_not_read_through_the_recipes_label_names(tmp_path, capsys):
    """Integer tag ids of the user's own file beside the NER recipe: the recipe's label_names belong to its own
    data, so they decode nothing here; the line asks for the tag of each id. Given on the command line, they
    read the ids; the recipe's own data keeps its list."""
    rows = [json.loads(line) for line in write_tagging(tmp_path / "s.jsonl", 12, seed=3).read_text().splitlines()]
    ids = _rows(tmp_path / "ids.jsonl", [{"tokens": r["tokens"], "ner_tags": [TAGS.index(t) for t in r["ner_tags"]]}
                                         for r in rows])  # fmt: skip
    recipe = REPO / "finetune" / "configs" / "bert_ner.yaml"

    def names(*overrides: str) -> list[str]:
        return load_splits(load_config(recipe, ["validation_file=null", "test_file=null", *overrides]).data_args)[1]

    with pytest.raises(UserError, match="tags column 'ner_tags' holds integer ids; set label_names") as raised:
        names(f"train_file={ids}")
    assert raised.value.rule == "labels.tag_ids_without_names"
    assert names(f"train_file={ids}", f"label_names={json.dumps(TAGS)}") == TAGS
    assert "read through the label_names of" not in capsys.readouterr().err
    assert names() == load_config(recipe, []).data_args.label_names


def test_invalid_iob2_is_counted_and_seqeval_strict_scores_on_entities():
    ids = {t: i for i, t in enumerate(TAGS)}
    gold = [[ids[t] for t in s] for s in (["O", "I-PER", "O"], ["B-LOC", "I-LOC", "I-PER"])]
    assert invalid_iob2(gold, TAGS) == [(1, 2), (2, 3)]
    predicted = [[ids[t] for t in s] for s in (["O", "B-PER", "O"], ["B-LOC", "I-LOC", "O"])]
    report = token_report(predicted, gold, TAGS)
    # strict IOB2: the gold entities are LOC only (an I- after O or another type starts none)
    assert report["per_class"]["LOC"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert report["entity_precision"] == 0.5 and report["entity_recall"] == 1.0
    assert report["num_words"] == 6 and report["num_sentences"] == 2
    assert report["word_accuracy"] == pytest.approx(4 / 6)


def test_a_plain_tag_set_is_scored_word_by_word():
    """Parts of speech (no B-/I- tags): word accuracy and each tag's precision, recall and F1 over the words
    (finetune/metrics.py's word_report; tests/test_pos_tags.py holds the rest)."""
    from finetune.formats import plain_tags
    from finetune.metrics import word_report

    upos = ["DET", "NOUN", "VERB", "PUNCT"]
    gold = [[0, 1, 2, 3], [0, 1, 1, 2]]
    predicted = [[0, 1, 1, 3], [0, 1, 1, 2]]
    report = word_report(predicted, gold, upos)
    assert report["word_accuracy"] == pytest.approx(7 / 8) and "entity_f1" not in report
    assert report["per_class"]["VERB"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}
    assert report["per_class"]["NOUN"]["precision"] == pytest.approx(3 / 4)
    # O, PER, LOC (entities without prefixes): O is a tag like the others
    io = word_report([[1, 1, 0]], [[1, 0, 0]], ["O", "PER"])
    assert (io["per_class"]["PER"]["precision"], io["per_class"]["PER"]["recall"], io["word_accuracy"]) == (
        0.5, 1.0, pytest.approx(2 / 3))  # fmt: skip
    assert plain_tags(upos) and plain_tags(["O", "PER"]) and plain_tags(["NN", "-LRB-", "X", "."])
    assert not plain_tags(TAGS) and not plain_tags(["O"]) and not plain_tags(["O", "PER", "B-LOC"])
    assert not plain_tags(["S-PER", "O"]) and not plain_tags(["b-per", "o"]) and not plain_tags(["B", "I", "O"])
    # IOB2 written with another separator or the part after the type: not plain (refused, with the fix)
    assert not plain_tags(["O", "B_CITY", "I_CITY"]) and not plain_tags(["O", "FOOD-B", "FOOD-I"])
    assert plain_tags(["NOUN", "-LRB-", "PRP$", "NNP", "VBZ", "SCONJ"])


# --- runs ----------------------------------------------------------------------------------------------


def _weights(out: Path) -> dict:
    return load_file(out / "model" / "model.safetensors")


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _losses(out: Path) -> list[float]:
    """The training loss logged at each optimizer step."""
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.slow
def test_tagging_accumulation_and_ddp_equal_one_big_batch_and_count_every_word(tagging, tmp_path):
    """The loss is divided by the labelled tokens of the whole step, across processes and
    accumulation: 1 x 8, 1 x 2 x 4 and 2 processes x 2 x 2 give the same weights; every word and
    sentence of the validation file is scored once under DDP (uneven last batch, windows)."""
    common = ("num_train_epochs=2", "max_grad_norm=null", "dropout=0.0")
    main(tagging_args(tagging, tmp_path / "a", "per_device_train_batch_size=8", *common))
    main(tagging_args(tagging, tmp_path / "b", "per_device_train_batch_size=2", "gradient_accumulation_steps=4",
                      *common))  # fmt: skip
    result = launch(tagging_args(tagging, tmp_path / "d", "per_device_train_batch_size=2",
                                 "gradient_accumulation_steps=2", *common), num_processes=2)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reference = _weights(tmp_path / "a")
    assert _worst(_weights(tmp_path / "b"), reference) < 1e-5
    assert _worst(_weights(tmp_path / "d"), reference) < 1e-5
    sentences, words = _counts(tagging["validation"])
    for run in ("a", "d"):
        validation = json.loads((tmp_path / run / "results.json").read_text())["validation"]
        assert (validation["num_sentences"], validation["num_words"]) == (sentences, words)
    logged = [json.loads(line) for line in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval_num_words"] for r in logged if "eval_num_words" in r] == [words, words]


@pytest.mark.slow
def test_tagging_resumes_mid_epoch_exactly(tagging, tmp_path):
    dropout = TINY_BERT.replace("hidden_dropout_prob: 0.0", "hidden_dropout_prob: 0.1")
    args = ("per_device_train_batch_size=4", "num_train_epochs=2", "save_steps=3", "save_total_limit=null",
            f"model_config={dropout}")  # fmt: skip
    main(tagging_args(tagging, tmp_path / "full", *args))
    first = ckpt.list_checkpoints(tmp_path / "full")[0]
    assert 0 < ckpt.read_manifest(first)["samples_in_epoch"]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    main(tagging_args(tagging, resumed, *args, "resume_from_checkpoint=latest"))
    assert _worst(_weights(resumed), _weights(tmp_path / "full")) <= 1e-6


@pytest.mark.parametrize("all_subwords, strategy", [pytest.param(False, "first", marks=pytest.mark.slow),  # ~27 s each
                                                    pytest.param(True, "simple", marks=pytest.mark.slow)])
def test_the_export_tags_in_a_pipeline_and_evaluates_word_by_word(all_subwords, strategy, tagging, tmp_path):
    """An overfit tiny tagger: the pipeline's entity spans with the aggregation its card names (first
    subwords trained: "first"; every subword: "simple"), and predictions.jsonl's words and tags."""
    out = tmp_path / "run"
    main(tagging_args(tagging, out, "num_train_epochs=12", "per_device_train_batch_size=8", "learning_rate=3e-3",
                      f"validation_file={tagging['train']}", "dropout=0.0", f"label_all_tokens={all_subwords}"))  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["validation"]["entity_f1"] > 0.9, results["validation"]
    assert f'aggregation_strategy="{strategy}"' in (out / "model" / "README.md").read_text()

    from transformers import pipeline

    tag = pipeline("token-classification", model=str(out / "model"), aggregation_strategy=strategy)
    text = "ada lovelace went to paris"
    entities = tag(text)
    assert [(e["entity_group"], text[e["start"] : e["end"]]) for e in entities] == [
        ("PER", "ada lovelace"),
        ("LOC", "paris"),
    ]
    evaluate([str(out / "model"), "--data", str(tagging["validation"]), "--predictions", "--output", str(tmp_path / "ev")])
    lines = [json.loads(line) for line in (tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in tagging["validation"].read_text().splitlines()]
    assert [r["words"] for r in lines] == [r["tokens"] for r in rows]
    assert [r["labels"] for r in lines] == [r["ner_tags"] for r in rows]
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    right = sum(p == g for r in lines for p, g in zip(r["predictions"], r["labels"], strict=True))
    assert metrics["word_accuracy"] == pytest.approx(right / metrics["num_words"])
    # words alone, one a line (CoNLL without its tag column): predicted, not scored
    words = tmp_path / "words.conll"
    words.write_text("\n\n".join("\n".join(r["tokens"]) for r in rows) + "\n")
    evaluate([str(out / "model"), "--data", str(words), "--predictions", "--output", str(tmp_path / "words")])
    predicted = [json.loads(line) for line in (tmp_path / "words" / "predictions.jsonl").read_text().splitlines()]
    assert [r["words"] for r in predicted] == [r["tokens"] for r in rows] and "labels" not in predicted[0]
    assert [r["predictions"] for r in predicted] == [r["predictions"] for r in lines]


@pytest.mark.slow
def test_tagging_with_the_layer_split_lora_and_bf16(tagging, tmp_path, monkeypatch):
    """The layer split (two CPU stages, pipelined chunks) trains the unsplit run's weights; LoRA trains
    adapters and exports a merged tagger with its adapter; bf16 autocast trains and scores words."""
    common = ("per_device_train_batch_size=8", "num_train_epochs=1", "dropout=0.0")
    main(tagging_args(tagging, tmp_path / "whole", *common))
    main(tagging_args(tagging, tmp_path / "split", *common, "model_parallel=true", "devices=cpu,cpu",
                      "pipeline_chunks=2"))  # fmt: skip
    assert _worst(_weights(tmp_path / "split"), _weights(tmp_path / "whole")) < 1e-5

    pytest.importorskip("peft")
    main(tagging_args(tagging, tmp_path / "lora", *common, "peft={r: 4, target_modules: [query, value]}"))
    assert (tmp_path / "lora" / "adapter" / "adapter_config.json").is_file()
    assert not any("lora" in k for k in _weights(tmp_path / "lora"))  # merged into an ordinary tagger

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    results = main(tagging_args(tagging, tmp_path / "bf16", *common))
    assert results["validation"]["num_words"] == _counts(tagging["validation"])[1]


@pytest.mark.slow
def test_tagging_accumulation_in_bf16_equals_one_big_batch(tagging, tmp_path, capsys, monkeypatch):
    """bf16 autocast on the CPU (as accelerate_configs/cpu_bf16.yaml runs it): 1 x 2 x 4 logs the losses
    of 1 x 8 within 5e-4 (measured: 5e-5; a loss divided by each micro-batch's own tokens instead of the
    step's: 9e-3). The weights are not compared: Adam divides each weight's gradient by its own running
    size, so a bf16 rounding in a near-zero gradient moves that weight by up to the learning rate: fp32
    and bf16 differ about as much (2e-3) as a right and a wrong division do."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    common = ("num_train_epochs=2", "max_grad_norm=null", "dropout=0.0")
    big = main(tagging_args(tagging, tmp_path / "big", "per_device_train_batch_size=8", *common))
    accumulated = main(tagging_args(tagging, tmp_path / "acc", "per_device_train_batch_size=2",
                                    "gradient_accumulation_steps=4", *common))  # fmt: skip
    assert capsys.readouterr().out.count("precision bf16") == 2

    assert len(_losses(tmp_path / "big")) == 12
    assert _losses(tmp_path / "acc") == pytest.approx(_losses(tmp_path / "big"), rel=0, abs=5e-4)
    assert accumulated["validation"]["loss"] == pytest.approx(big["validation"]["loss"], rel=0, abs=5e-4)
    assert accumulated["validation"]["num_words"] == big["validation"]["num_words"] == _counts(tagging["validation"])[1]


@pytest.mark.slow  # a launch of 2 processes and a run beside it: about 40 s on 2 cores
def test_tagging_under_ddp_x_layer_split_equals_one_process(tagging, tmp_path):
    """accelerate_configs/ddp_model_parallel.yaml: 2 processes (DDP over gloo), each splitting its
    replica over cpu,cpu with 2 pipelined chunks, train a tagger to one unsplit process's weights and
    losses (global batch 8 = 2 x 4) within 1e-5, and score every validation word once."""
    from accelerate.utils import DistributedType
    from conftest import launch_runs

    common = ("num_train_epochs=1", "dropout=0.0", "max_grad_norm=0.1", "adam_epsilon=1e-6")
    plain = main(tagging_args(tagging, tmp_path / "plain", "per_device_train_batch_size=8", *common))
    argv = tagging_args(tagging, tmp_path / "hybrid", "per_device_train_batch_size=4", "model_parallel=true",
                        "devices=cpu,cpu", "pipeline_chunks=2", *common)  # fmt: skip
    records, output = launch_runs(REPO / "accelerate_configs/ddp_model_parallel.yaml",
                                  [{"name": "hybrid", "fsdp": False, "argv": argv}], tmp_path)  # fmt: skip
    for rank in (0, 1):
        r = records[("hybrid", rank)]
        assert DistributedType(r["distributed_type"]) == DistributedType.MULTI_CPU and r["num_processes"] == 2
        assert r["wrapper"] == "DistributedDataParallel" and [s["device"] for s in r["stages"]] == ["cpu", "cpu"]
        assert r["handoffs"] > 0
    assert "layer split into 2 stages in each of 2 processes (DDP x layer split)" in output
    assert _worst(_weights(tmp_path / "hybrid"), _weights(tmp_path / "plain")) < 1e-5

    assert _losses(tmp_path / "hybrid") == pytest.approx(_losses(tmp_path / "plain"), rel=0, abs=1e-5)
    hybrid = json.loads((tmp_path / "hybrid" / "results.json").read_text())["validation"]
    assert hybrid["num_words"] == plain["validation"]["num_words"] == _counts(tagging["validation"])[1]


def test_a_tagging_run_keeps_the_best_by_entity_f1_and_draws_and_cards_it(tagging, tmp_path):
    """Left to its default, metric_for_best_model is entity F1: the best checkpoint is the first
    evaluation with the highest validation entity F1, and it is the export. The curves draw entity F1
    and word accuracy and star the best; the card's usage example is the token-classification pipeline
    with the aggregation the app chose (first subwords trained: "first"), its table shows entity F1."""
    from finetune.plots import training_curves_figure

    out = tmp_path / "run"
    results = main(tagging_args(tagging, out, "num_train_epochs=3", "per_device_train_batch_size=8",
                                "learning_rate=3e-3", "eval_steps=2", "load_best_model_at_end=true"))  # fmt: skip
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["metric_for_best_model"], saved["greater_is_better"]) == ("entity_f1", True)
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_entity_f1" in r]
    assert len(evals) >= 6 and len({r["eval_entity_f1"] for r in evals}) > 1  # it moved: there is a choice
    top = max(r["eval_entity_f1"] for r in evals)
    first_top = min(r["step"] for r in evals if r["eval_entity_f1"] == top)
    best = results["best"]
    assert (best["metric"], best["value"], best["step"]) == ("entity_f1", top, first_top)
    assert results["exported"]["step"] == first_top
    # Here (fixed seeds) the lowest loss and the best word accuracy fall at other steps: the choice tells
    # entity F1 from them.
    assert min(evals, key=lambda r: r["eval_loss"])["step"] != first_top
    assert max(evals, key=lambda r: r["eval_word_accuracy"])["step"] != first_top

    assert (out / "training_curves.png").is_file()
    metrics_ax = training_curves_figure(out / "metrics.jsonl").axes[1]
    drawn = [line.get_label() for line in metrics_ax.get_lines() if not line.get_label().startswith("_")]
    assert drawn[:2] == ["validation entity F1", "validation word accuracy"]
    legend = [text.get_text() for text in metrics_ax.get_legend().get_texts()]
    assert legend[-1] == f"best checkpoint: step {first_top}, entity F1 {top:.4g}"  # the metric table's name

    card = (out / "model" / "README.md").read_text()
    assert 'pipeline("token-classification", model="run/model", aggregation_strategy="first")' in card
    header = next(line for line in card.splitlines() if line.startswith("| split |"))
    assert header.split(" | ")[1:3] == ["entity F1", "entity precision"]
    row = next(line for line in card.splitlines() if line.startswith("| validation |"))
    assert row.split(" | ")[1] == f"{results['validation']['entity_f1']:.4f}"
    # the labels are the tags; the per-class metrics are per entity type, each with its numbers
    assert "| entity type | precision | recall | F1 | support |" in card
    for kind, scores in results["validation"]["per_class"].items():
        entity = next(line for line in card.splitlines() if line.startswith(f"| `{kind}` |"))
        assert entity.split(" | ")[-1].rstrip(" |") == str(scores["support"])


def test_the_bundled_ner_recipe_trains_and_prints_test_entity_f1(tmp_path, capsys):
    """finetune/configs/bert_ner.yaml through the entry point, with a tiny model from config and 2 steps:
    it loads the bundled files and prints its test line over every sentence and word of
    data/uner_english_ewt/test.jsonl."""
    recipe = REPO / "finetune" / "configs" / "bert_ner.yaml"
    main(["--config", str(recipe), f"model_config={TINY_BERT}", "max_steps=2", f"output_dir={tmp_path / 'run'}"])
    sentences, words = _counts(REPO / "data" / "uner_english_ewt" / "test.jsonl")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("test entity F1 ")]
    assert len(lines) == 1 and lines[0].endswith(f" on {sentences} sentences ({words} words)"), lines
    assert sentences == 2077
    other = _rows(tmp_path / "other.jsonl", [{"tokens": ["ada", "went"], "ner_tags": ["B-MISC", "O"]}])
    line = user_error(capsys, evaluate, [str(tmp_path / "run" / "model"), "--data", str(other)], rule="labels.tag_unknown")
    assert "tag 'B-MISC' at row 1, word 1 is not one of the model's tags (O, B-PER, " in line  # no evaluation key
    assert line.endswith("; fix the tag in the data (the model predicts only these)"), line


@pytest.mark.slow  # one launch of 2 processes running FSDP and DDP, ~60 s on 2 cores
def test_tagging_under_fsdp_equals_ddp(tagging, tmp_path):
    from conftest import launch_runs

    argv = {name: tagging_args(tagging, tmp_path / name, "per_device_train_batch_size=4", "num_train_epochs=1",
                               "dropout=0.0", "max_grad_norm=0.5") for name in ("fsdp", "ddp")}  # fmt: skip
    runs = [{"name": name, "fsdp": name == "fsdp", "argv": args} for name, args in argv.items()]
    launch_runs(REPO / "accelerate_configs/fsdp.yaml", runs, tmp_path, env={"FINETUNE_TEST_FSDP_ON_CPU": "1"})
    assert _worst(_weights(tmp_path / "fsdp"), _weights(tmp_path / "ddp")) < 1e-5
    for name in ("fsdp", "ddp"):
        validation = json.loads((tmp_path / name / "results.json").read_text())["validation"]
        assert validation["num_words"] == _counts(tagging["validation"])[1]


@pytest.mark.slow  # ~9 s; tests/test_verify.py checks verify itself by default
def test_verify_checks_a_tagging_recipe(tagging, tmp_path, capsys, monkeypatch):
    from finetune import verify

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # verify sets it: put back after the test
    args = [*tagging_args(tagging, tmp_path / "unused"), "per_device_train_batch_size=4",
            "gradient_accumulation_steps=2", "--steps", "3", "--keep", str(tmp_path / "verify")]  # fmt: skip
    code = verify.main(args)
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "OK: every variant agrees with one big batch" in out


def test_invalid_iob2_in_the_gold_tags_is_one_warning_line(tmp_path, capsys):
    rows = [{"tokens": ["ada", "went", "home"], "ner_tags": ["O", "I-PER", "O"]},
            {"tokens": ["paris"], "ner_tags": ["B-LOC"]}] * 6  # fmt: skip
    data = {"train": _rows(tmp_path / "t.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows[:2])}
    main(tagging_args(data, tmp_path / "run", "num_train_epochs=1"))
    # (a model of 12 sentences also gets the trivial-baseline warning: not this test's concern)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:") and " I- " in line]
    assert warnings == [
        "warning: the train data has 6 I- tag(s) that follow no B- or I- of their type (first at row 1, word 2); "
        "strict IOB2 scoring starts no entity there: fix the tags (an entity starts with B-) or leave them and "
        "know they count as O",
        "warning: the validation data has 1 I- tag(s) that follow no B- or I- of their type (first at row 1, "
        "word 2); strict IOB2 scoring starts no entity there: fix the tags (an entity starts with B-) or leave "
        "them and know they count as O",
    ]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [w["rule"] for w in results["warnings"]].count("labels.invalid_iob2") == 2


def test_tags_in_iob1_are_said_as_such_with_the_conversion(tmp_path, capsys):
    """IOB1 (CoNLL-2003's original files: entities start with I-, B- only where two of a type touch): one line a
    split that names the scheme and the fix, not the line for a stray I- tag."""
    rows = [{"tokens": ["Ada", "Lovelace", "lived", "in", town], "ner_tags": ["I-PER", "I-PER", "O", "O", "I-LOC"]}
            for town in ("London", "Paris", "Rome", "Oslo", "Lima", "Bern")]  # fmt: skip
    data = {"train": _rows(tmp_path / "t.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows[:2])}
    main(tagging_args(data, tmp_path / "run", "max_steps=1"))
    err = capsys.readouterr().err
    assert "warning: the train data's tags read as IOB1 (12 of its 12 entities start with I-" in err, err
    assert "convert the tags to IOB2" in err and "follow no B- or I-" not in err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [w["rule"] for w in results["warnings"]].count("labels.iob1_tags") == 2
    evaluate([str(tmp_path / "run" / "model"), "--data", str(data["validation"])])  # the same line for --data
    assert f"warning: the --data {data['validation']} data's tags read as IOB1 (4 of its 4" in capsys.readouterr().err


# --- bad input -----------------------------------------------------------------------------------------


def _rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "rows, fragment, rule",
    [
        ([{"tokens": ["a", "b"], "ner_tags": ["O"]}], "has 2 word(s) but 1 tag(s) at row 2",
         "labels.tags_not_one_per_word"),
        ([{"tokens": [], "ner_tags": []}], "empty sentence (no words) at row 2", "columns.sentence_empty"),
        ([{"tokens": ["ada"], "ner_tags": ["B-PERSON"]}], "tag 'B-PERSON' at row 2, word 1 is not in label_names",
         "labels.tag_unknown"),
        ([{"tokens": ["ada", "\u200b"], "ner_tags": ["O", "O"]}], "at row 2, word 2 is no token for this tokenizer",
         "inputs.word_without_tokens"),
        # a control character (BEL), and the emoji presentation selector split from "❤️" into a word of its
        # own: MiniLM's tokenizer drops both (whole emoji are [UNK]: test_which_words_are_no_token)
        ([{"tokens": ["ada", "went", "\x07"], "ner_tags": ["O", "O", "O"]}], "word '\\x07' at row 2, word 3 is no token",
         "inputs.word_without_tokens"),
        ([{"tokens": ["\u2764", "\ufe0f"], "ner_tags": ["O", "O"]}], "word '\ufe0f' at row 2, word 2 is no token",
         "inputs.word_without_tokens"),
        ([{"tokens": "ada said", "ner_tags": ["O", "O"]}], "not lists of words", "columns.words_not_lists"),
        ([{"tokens": ["ada"], "ner_tags": "O"}], "not lists of tags", "labels.tags_not_lists"),
        ([{"tokens": ["ada", "said"], "ner_tags": [["B-PER"], ["O"]]}], "hold a list inside the list (word 1: ['B-PER'])",
         "labels.tags_nested"),
        # tags that are not IOB2: seqeval's strict scoring raised KeyError at the first evaluation; the fix
        # writes the type as the data's other tags do (B-PER, not B-per, which would then be a tag of its own)
        ([{"tokens": ["ada", "said"], "ner_tags": ["b-per", "O"]}],
         "tag 'b-per' at row 2, word 1 is not IOB2: its prefix is lower-case; write the B-, I- and O prefixes in "
         "capitals ('B-PER')", "columns.tag_not_iob2"),
        ([{"tokens": ["ada", "said"], "ner_tags": ["O", "PER"]}], "tag 'PER' at row 2, word 2 is not IOB2 (O, or B- or I-",
         "columns.tag_not_iob2"),
        ([{"tokens": ["ada"], "ner_tags": ["E-PER"]}], "tag 'E-PER' at row 2, word 1 is not IOB2",
         "columns.tag_not_iob2"),
        ([{"tokens": ["ada"], "ner_tags": ["B_PER"]}], "tag 'B_PER' at row 2, word 1 is not IOB2: write a hyphen after "
                                                       "its B- or I- (B-PER)", "columns.tag_not_iob2"),
        ([{"tokens": ["ada"], "ner_tags": ["PER-B"]}], "tag 'PER-B' at row 2, word 1 is not IOB2: its B- or I- comes "
                                                       "first (B-PER)", "columns.tag_not_iob2"),
        ([{"tokens": ["ada"], "ner_tags": ["B-PER "]}], "tag 'B-PER ' at row 2, word 1 has surrounding spaces",
         "columns.tag_not_iob2"),
        # a CoNLL file's integer ids are read as strings: names that are numbers
        ([{"tokens": ["ada"], "ner_tags": ["3"]}], "tag '3' at row 2, word 1 is a number, not an IOB2 tag name",
         "columns.tag_not_iob2"),
    ],
)  # fmt: skip
def test_bad_tagging_data_is_one_line_with_its_row(rows, fragment, rule, tmp_path, capsys):
    good = {"tokens": ["ada", "lovelace"], "ner_tags": ["B-PER", "I-PER"]}
    data = {"train": _rows(tmp_path / "train.jsonl", [good, *rows, good]), "validation": _rows(tmp_path / "v.jsonl", [good])}
    out = tmp_path / "run"
    line = user_error(capsys, main, tagging_args(data, out), rule=rule)
    assert fragment in line
    assert not out.exists()  # nothing written


def test_parts_of_speech_train_and_are_scored_word_by_word(tmp_path, capsys):
    """A tag set without B-/I- (UPOS) trains, with no warning about its tags, and is scored per word: word accuracy
    and each tag's scores, no entity F1 (tests/test_pos_tags.py holds the rest)."""
    rows = [{"tokens": ["the", "cat", "sat", "."], "upos": ["DET", "NOUN", "VERB", "PUNCT"]},
            {"tokens": ["a", "dog", "ran", "home"], "upos": ["DET", "NOUN", "VERB", "NOUN"]}] * 6  # fmt: skip
    data = {"train": _rows(tmp_path / "t.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows)}
    out = tmp_path / "run"
    main(tagging_args(data, out, "tags_column=upos", "label_names=null", "max_steps=2"))
    assert "B-/I-" not in capsys.readouterr().out  # (a tiny model's 2 steps may warn that it did not learn)
    validation = json.loads((out / "results.json").read_text())["validation"]
    assert "entity_f1" not in validation and "word_accuracy" in validation
    assert set(validation["per_class"]) == {"DET", "NOUN", "VERB", "PUNCT"} and validation["num_words"] == 48
    config = json.loads((out / "model" / "config.json").read_text())
    assert sorted(config["label2id"]) == ["DET", "NOUN", "PUNCT", "VERB"]
    # the card's pipeline example says how a pipeline groups a tag per word
    card = (out / "model" / "README.md").read_text()
    assert "the pipeline joins adjacent words of one tag into one span" in card
    # its model-index names word accuracy, not an entity F1 of IOB2 spans
    assert "name: word accuracy" in card and "IOB2" not in card and "entity" not in card.lower()


@pytest.mark.parametrize("label_names", ["null", "[O,PER,LOC]"])
def test_entity_tags_without_prefixes_train_word_by_word_with_one_warning(label_names, tmp_path, capsys):
    """`PER`, `LOC`, `O` (the IO scheme): accepted as a plain tag set, scored word by word, with one warning
    that says so and how to get entity-level scores."""
    rows = [{"tokens": ["ada", "went", "to", "paris"], "ner_tags": ["PER", "O", "O", "LOC"]}] * 4
    data = {"train": _rows(tmp_path / "t.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows)}
    results = main(tagging_args(data, tmp_path / "run", f"label_names={label_names}", "max_steps=1"))
    assert "labels.tags_without_prefixes" in [w["rule"] for w in results["warnings"]]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:") and "B-/I-" in line]
    assert len(warnings) == 1 and "the tags have no B-/I- prefixes (O, " in warnings[0], warnings
    assert "write them in IOB2" in warnings[0]


def test_a_tag_set_that_mixes_iob2_and_plain_tags_is_refused(tmp_path, capsys):
    """B-PER beside LOC: neither scheme reads it; refused before the output folder is made, also when
    label_names lists it for integer tags."""
    rows = [{"tokens": ["ada", "went", "to", "paris"], "ner_tags": ["B-PER", "O", "O", "LOC"]}] * 4
    data = {"train": _rows(tmp_path / "t.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows)}
    out = tmp_path / "run"
    user_error(capsys, main, tagging_args(data, out, "label_names=null"),
               "the train data's tag 'LOC' at row 1, word 4 is not IOB2", "beside tags that are",
               rule="columns.tag_not_iob2")  # fmt: skip
    assert not out.exists()
    rows = [{"tokens": ["ada", "went", "to", "paris"], "ner_tags": [1, 0, 0, 2]}] * 4
    data = {"train": _rows(tmp_path / "t.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows)}
    user_error(capsys, main, tagging_args(data, tmp_path / "run", "label_names=[O,B-PER,LOC]"),
               "label_names' tag 'LOC' is not IOB2", rule="labels.tag_set_not_iob2")  # fmt: skip


def test_a_conll_file_with_the_tag_first_is_refused(tmp_path, capsys):
    train = tmp_path / "train.conll"
    train.write_text("B-PER Ada\nI-PER Lovelace\nO wrote\n\nB-LOC London\n")
    data = {"train": train, "validation": _rows(tmp_path / "v.jsonl", [{"tokens": ["a"], "ner_tags": ["O"]}])}
    user_error(capsys, main, tagging_args(data, tmp_path / "run"),
               "the tag column seems to be the first (line 1 reads 'B-PER Ada')", "words would be read as tags",
               "put each word first and its tag last", rule="files.conll_tags_first")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_invalid_iob2_in_a_held_out_share_names_the_file_row(tmp_path, capsys):
    """The warning names the row of the training file, not of the share held out of it."""
    good = {"tokens": ["ada", "went", "home"], "ner_tags": ["B-PER", "O", "O"]}
    bad = {"tokens": ["ada", "went"], "ner_tags": ["O", "I-PER"]}
    rows = [bad if i in (3, 15) else good for i in range(16)]  # held out in the order 6, 15, 11, 10, 9, 3, 0, 7
    train = _rows(tmp_path / "t.jsonl", rows)
    main(tagging_args({"train": train, "validation": train}, tmp_path / "run", "validation_file=null",
                      "validation_split_percentage=50", "max_steps=1"))  # fmt: skip
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:") and " I- " in line]
    # The share is drawn, not in the file's order: the first named is the first in the file of those it holds.
    held = [line for line in warnings if "validation data" in line]
    assert len(held) == 1 and "I- tag(s) that follow no B- or I- of their type (first at row 4 of the training " \
           "file, word 2)" in held[0], warnings  # fmt: skip


def test_tag_evaluation_gives_the_model_each_batch_as_it_is():
    """Each evaluation batch reaches the model at its own size: none is filled to the windows counted so far
    (that made the bundled recipe's test evaluation five times slower), and every window is scored once."""
    from types import SimpleNamespace

    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from finetune.evaluation import evaluate_model
    from finetune.metrics import TOKENS

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seen: list[int] = []
            self.head = torch.nn.Embedding(10, 3)

        def forward(self, input_ids, attention_mask):
            self.seen.append(len(input_ids))
            return SimpleNamespace(logits=self.head(input_ids))

    windows = [{"input_ids": torch.tensor([1, 2 + i % 3, 3]), "attention_mask": torch.ones(3, dtype=torch.long),
                "labels": torch.tensor([-100, i % 3, -100]), "meta": {"sentence": i, "first_word": 0}}
               for i in range(7)]  # fmt: skip
    model = Tagger()
    metrics = evaluate_model(model, DataLoader(windows, batch_size=2), Accelerator(cpu=True), ["O", "B-X", "I-X"],
                             problem_type=TOKENS)  # fmt: skip
    assert model.seen == [2, 2, 2, 1]
    assert metrics["num_words"] == 7 and metrics["num_sentences"] == 7


def test_which_words_are_no_token():
    """What the bad-input cases rest on, for the bundled MiniLM tokenizer: control characters, zero-width
    characters and an emoji's variation selector tokenize to nothing; whole emoji (faces, a flag, a
    skin-tone or ZWJ sequence) are one [UNK] each, so they train and score as words."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)

    def pieces(word: str) -> list[int]:
        return tokenizer(word, add_special_tokens=False)["input_ids"]

    assert [pieces(w) for w in ("\x07", "\x00", "\x1b", "\u200b", "\u200d", "\ufe0f")] == [[]] * 6
    emoji = ("\U0001f600", "\U0001f917", "\u2764", "\U0001f1ec\U0001f1e7", "\U0001f44d\U0001f3fb",
             "\U0001f468\u200d\U0001f4bb", "\u2764\ufe0f")  # fmt: skip
    assert [pieces(w) for w in emoji] == [[tokenizer.unk_token_id]] * len(emoji)


def test_a_wrong_column_count_in_a_conll_train_file_is_one_line(tmp_path, capsys):
    train = tmp_path / "train.conll"
    train.write_text("Ada B-PER\nLovelace I-PER\n\nsaid O O\n")
    data = {"train": train, "validation": _rows(tmp_path / "v.jsonl", [{"tokens": ["a"], "ner_tags": ["O"]}])}
    assert "line 4 has 3 column(s)" in user_error(capsys, main, tagging_args(data, tmp_path / "run"), rule="files.conll_width")


def test_a_conll_train_file_cut_mid_tag_is_one_line(tmp_path, capsys):
    """A file that ends mid-line ('B-LO' beside the 'B-LOC' of every other location): no new entity type."""
    train = tmp_path / "train.conll"
    train.write_text("in O\nKew B-LOC\n\nto O\nParis B-LOC\n\nAda B-PER\n\nfrom O\nRome B-LO")
    data = {"train": train, "validation": _rows(tmp_path / "v.jsonl", [{"tokens": ["a"], "ner_tags": ["O"]}])}
    line = user_error(capsys, main, [*tagging_args(data, tmp_path / "run"), "label_names=null"], rule="labels.tag_cut_short")
    assert "tag 'B-LO' appears once in the train data and 'B-LOC' 2 times: a tag cut short" in line


def test_a_validation_tag_unseen_in_training_says_so(tmp_path, capsys):
    """With label_names=null the tags are the training data's: the line names training, not label_names."""
    good = {"tokens": ["ada", "lovelace"], "ner_tags": ["B-PER", "I-PER"]}
    data = {"train": _rows(tmp_path / "t.jsonl", [good] * 4),
            "validation": _rows(tmp_path / "v.jsonl", [{"tokens": ["kew"], "ner_tags": ["B-LOC"]}])}  # fmt: skip
    line = user_error(capsys, main, [*tagging_args(data, tmp_path / "run"), "label_names=null"], rule="labels.tag_unknown")
    assert "the validation data's tag 'B-LOC' at row 1, word 1 was not seen in training" in line


def test_tags_written_as_one_string_are_refused_as_not_lists(tmp_path, capsys):
    """"B-PER O" instead of ["B-PER", "O"]: its characters are no tags (the space would be named first)."""
    data = {"train": _rows(tmp_path / "t.jsonl", [{"tokens": ["Ada", "said"], "ner_tags": "B-PER O"}] * 4)}
    line = user_error(capsys, main, tagging_args({**data, "validation": data["train"]}, tmp_path / "run"), rule="labels.tags_not_lists")
    assert "tags column 'ner_tags' in the train data holds Value('string'), not lists of tags" in line


def test_a_conll_train_file_of_words_alone_is_one_line(tmp_path, capsys):
    train = tmp_path / "train.conll"
    train.write_text("Ada\nLovelace\n\nsaid\n")
    data = {"train": train, "validation": _rows(tmp_path / "v.jsonl", [{"tokens": ["a"], "ner_tags": ["O"]}])}
    line = user_error(capsys, main, tagging_args(data, tmp_path / "run"), rule="columns.words_without_tags")
    assert "column 'ner_tags' not found in the train data; columns are: tokens; a tagging run trains on a tag" in line
    assert "text-classification" not in line


def test_a_tags_column_is_checked_before_a_text_run_trains_on_it(tmp_path, capsys):
    """Word and tag lists given to a text-classification run: not trained on silently."""
    data = {"train": _rows(tmp_path / "t.jsonl", [{"tokens": ["a", "b"], "ner_tags": ["O", "B-PER"]}] * 4)}
    line = user_error(capsys, main, [*tagging_args({**data, "validation": data["train"]}, tmp_path / "run"),
                                     "task=text-classification", "label_names=null"], rule="columns.words_and_tags_under_other_names")  # fmt: skip
    assert "token-classification" in line


@pytest.mark.parametrize("label_names", ["null", "[O,B-PER,I-PER]"])
def test_training_tags_that_are_all_o_are_refused(label_names, tmp_path, capsys):
    """Every word O: the loss is 0 from the first step; a classifier of one class is refused the same way."""
    rows = [{"tokens": ["ada", "said", str(i)], "ner_tags": ["O", "O", "O"]} for i in range(6)]
    data = {"train": _rows(tmp_path / "train.jsonl", rows), "validation": _rows(tmp_path / "v.jsonl", rows[:2])}
    out = tmp_path / "run"
    user_error(capsys, main, tagging_args(data, out, f"label_names={label_names}"),
               "tags column 'ner_tags' in the train data holds one tag ('O') in every word", rule="labels.one_tag")  # fmt: skip
    assert not out.exists()


def test_a_conll_line_of_the_word_hash_and_its_tag_is_a_word_not_a_comment(tmp_path):
    """`# O` holds a word (#) and its tag; `# text = He said O` and `# sent_id = 1` are comments."""
    from finetune.data import read_conll

    path = tmp_path / "hash.conll"
    path.write_text("# sent_id = 1\n# text = He said O\n# O\nAda B-PER\nwent O\n# O\nhome O\n\n# O\nBo B-PER\n")
    ds = read_conll(str(path), "train", "tokens", "ner_tags")
    assert ds["tokens"][:] == [["#", "Ada", "went", "#", "home"], ["#", "Bo"]]
    assert ds["ner_tags"][:] == [["O", "B-PER", "O", "O", "O"], ["O", "B-PER"]]


@pytest.mark.parametrize("task", ["token-classification", "null"])
def test_word_and_tag_lists_under_other_names_are_named(task, tmp_path):
    """{"words": [...], "tags": [...]} for a tagging run (or task=null): the line names both columns and the
    settings that read them, not another task's data."""
    from finetune.config import load_config
    from finetune.data import load_splits

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"tags": ["B-PER", "O"], "words": ["Ada", f"w{i}"]}) + "\n" for i in range(6)))
    recipe = "finetune/configs/bert_ner.yaml" if task != "null" else None
    cfg = load_config(recipe, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                               f"task={task}"])  # fmt: skip
    retask = "" if task != "null" else "task=token-classification "
    with pytest.raises(UserError, match=re.escape(f"'words' and 'tags' hold lists of words and their tags: to tag "
                                                  f"words, set {retask}tokens_column=words tags_column=tags")) as raised:
        if cfg.task is None:  # as finetune/run.py does: the task read from the data first
            cfg = resolved(cfg, checks.Said(), task=infer_task(cfg.data_args))
        load_splits(cfg.data_args)
    assert raised.value.rule == "columns.words_and_tags_under_other_names"


def test_tagging_data_with_a_number_among_the_words_is_not_read_the_wrong_way_round(tmp_path, capsys):
    """[1990, "was", "good"] beside ["B-DATE", "O", "O"]: the tags are the list that reads as tags, so the line
    offers the task, not tokens_column=ner_tags tags_column=tokens."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"tokens": [1990 + i, "was", "good"], "ner_tags": ["B-DATE", "O", "O"]}) + "\n"
                            for i in range(8)))  # fmt: skip
    line = user_error(capsys, main, ["task=null", f"train_file={path}", "validation_file=null", "test_file=null",
                                     f"output_dir={tmp_path / 'o'}"], "to tag words, set task=token-classification")
    assert "tokens_column=ner_tags" not in line
    user_error(capsys, main, ["task=token-classification", f"train_file={path}", "validation_file=null", "test_file=null",
                              f"output_dir={tmp_path / 'o'}"], "word 1 at row 1 is 1990, not a string",
               rule="columns.word_not_a_string")  # fmt: skip


def test_a_table_with_a_row_per_word_is_told_to_be_grouped_by_sentence(tmp_path, capsys):
    """Kaggle's NER CSV (Sentence #,Word,POS,Tag; a row per word): not a CoNLL file under another name (its
    first line is a header), but a table to group into a sentence per row."""
    path = tmp_path / "ner.csv"
    path.write_text("Sentence #,Word,POS,Tag\n" + "Sentence: 1,Ada,NNP,B-PER\n,went,VBD,O\n,to,TO,O\n,Paris,NNP,B-LOC\n" * 3)
    line = user_error(capsys, main, tagging_args({"train": path, "validation": path}, tmp_path / "run"),
                      rule="columns.conll_read_as_a_table")
    assert "it is a table with a row per word (the word in 'Word', its tag in 'Tag')" in line and "groupby" in line
    assert "name it" not in line
    renamed = tmp_path / "ner.conll"  # then renamed .conll all the same: its commas are named
    renamed.write_text(path.read_text())
    user_error(capsys, main, tagging_args({"train": renamed, "validation": renamed}, tmp_path / "run"),
               "separates its fields with commas", "a token and its tag separated by a space or a tab",
               rule="files.conll_of_commas")  # fmt: skip


def test_a_conll_file_named_tsv_is_told_to_be_named_conll(tmp_path, capsys):
    """word<TAB>tag lines with blank lines between sentences, saved as .tsv: read as a table, whose line
    says to name it .conll, not that the data looks like another task's."""
    text = "Ada\tB-PER\nLovelace\tI-PER\nwrote\tO\n\nParis\tB-LOC\nis\tO\nbig\tO\n\n"
    for name, body in [("ner.tsv", text), ("ner.csv", text), ("spaced.tsv", text.replace("\t", " "))]:
        path = tmp_path / name
        path.write_text(body * 4)
        line = user_error(capsys, main, tagging_args({"train": path, "validation": path}, tmp_path / "run"),
                          rule="files.conll_as_table")
        assert line.endswith(f"reads as a word and its tag on each line (its first line is {body.splitlines()[0]!r}): "
                             f"a CoNLL file; name it {path.stem}.conll")  # fmt: skip
        assert "text-classification" not in line and "tab-separated" not in line
    # a comment or -DOCSTART- first (CoNLL-2003, CoNLL-U's "# sent_id"): still named as CoNLL, not as a
    # comment above a header; a CoNLL-U file (ten columns, UPOS tags) too
    conllu = "1\tAda\tAda\tPROPN\tNNP\t_\t2\tnsubj\t_\t_\n2\twrote\twrite\tVERB\tVBD\t_\t0\troot\t_\t_\n\n"
    for name, body, first in [("c.tsv", "# sent_id = 1\n" + text, "Ada\tB-PER"),
                              ("d.tsv", "-DOCSTART- -X- O O\n\n" + text, "Ada\tB-PER"),
                              ("u.tsv", "# sent_id = 1\n# text = Ada wrote\n" + conllu, conllu.splitlines()[0])]:
        path = tmp_path / name
        path.write_text(body * 4)
        line = user_error(capsys, main, tagging_args({"train": path, "validation": path}, tmp_path / "run"),
                          rule="files.conll_as_table")
        assert line.endswith(f"(its first line of words is {first!r}): a CoNLL file; name it {path.stem}.conll"), line


def test_tags_given_as_numbers_to_an_evaluation_are_read_by_place_with_one_warning(tagging, tmp_path, capsys):
    """The Hub's habit, tags as ids: read as the model's tags at those places, which is right only if the
    data numbers its tags in the model's order; one warning says so and how to be sure."""
    out = tmp_path / "run"
    main(tagging_args(tagging, out, "max_steps=1"))
    id2label = json.loads((out / "model" / "config.json").read_text())["id2label"]
    to_id = {name: int(i) for i, name in id2label.items()}
    rows = [json.loads(line) for line in tagging["validation"].read_text().splitlines()]
    ids = write_jsonl(tmp_path / "ids.jsonl", [{**r, "ner_tags": [to_id[t] for t in r["ner_tags"]]} for r in rows])
    capsys.readouterr()
    by_id = evaluate([str(out / "model"), "--data", str(ids), "--output", str(tmp_path / "by-id")])
    assert f"are numbers, read as the model's tags at those places (0={id2label['0']}, " in capsys.readouterr().err
    by_name = evaluate([str(out / "model"), "--data", str(tagging["validation"]), "--output", str(tmp_path / "by-name")])
    assert by_id["word_accuracy"] == by_name["word_accuracy"]
    assert "are numbers" not in capsys.readouterr().err


def test_a_users_tags_replace_the_recipes_label_names(tmp_path):
    """Parts of speech trained with the NER recipe: its label_names are its own data's entity tags, and the
    user's file brings its own (as model_name_or_path replaces the recipe's model_config)."""
    from finetune.config import load_config
    from finetune.data import load_splits

    path = tmp_path / "pos.conll"
    path.write_text("".join(f"The DET\ncat NOUN\nsat{i} VERB\n\n" for i in range(12)))
    args = [f"train_file={path}", "validation_file=null", "test_file=null"]
    _, names = load_splits(load_config("finetune/configs/bert_ner.yaml", args).data_args)
    assert names == ["DET", "NOUN", "VERB"]
