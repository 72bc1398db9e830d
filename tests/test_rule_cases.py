"""Cases for rules the other tests do not reach: one user's mistake each, through the app's own entry
points (the settings, the data loader, a run, an evaluation, a search), asserted by the rule's id.

    python -m pytest -q tests/test_rule_cases.py
"""

from __future__ import annotations

import pytest
from conftest import (
    ANIMALS,
    TINY_BERT,
    TOKENIZER,
    multi_label_rows,
    rotten_rows,
    tiny_text_args,
    user_error,
    write_csv,
    write_jsonl,
)

from finetune import checks
from finetune.config import load_config
from finetune.data import load_splits
from finetune.errors import UserError


def refused(*settings: str) -> str:
    """The rule that refuses `settings` over the default recipe."""
    with pytest.raises(UserError) as raised:
        load_config(None, list(settings))
    return raised.value.rule


def loaded(tmp_path, *settings: str, train: list[dict], validation: list[dict] | None = None) -> checks.Said:
    """`load_splits` of `train` (and `validation`) as JSON Lines files under the tiny BERT's settings: what
    it said (it raises what it refuses)."""
    files = [f"train_file={write_jsonl(tmp_path / 'train.jsonl', train)}",
             f"validation_file={write_jsonl(tmp_path / 'validation.jsonl', validation) if validation else 'null'}"]
    cfg = load_config(None, [f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}", "label_names=null",
                             "test_file=null", *files, *settings])  # fmt: skip
    said = checks.Said(quiet=True)
    load_splits(cfg.data_args, said)
    return said


def refused_data(tmp_path, *settings: str, train: list[dict], validation: list[dict] | None = None) -> str:
    """The rule that refuses that data (`loaded`)."""
    with pytest.raises(UserError) as raised:
        loaded(tmp_path, *settings, train=train, validation=validation)
    return raised.value.rule


def texts(n: int, label) -> list[dict]:
    """`n` rows of a text and `label(i)`."""
    return [{"text": f"sample number {i}", "label": label(i)} for i in range(n)]


def named(i: int) -> str:
    return ["neg", "pos"][i % 2]


# --- settings -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, rule", [
    (["label_columns=[a, a]"], "settings.label_columns_repeated"),  # a 0/1 column listed twice
    (["label_columns=[]"], "settings.label_columns_repeated"),  # none listed
    (["dry_run=true"], "settings.mode_as_setting"),  # the --dry-run flag written as a setting
    (["task=token-classification", "problem_type=regression"], "settings.problem_of_task"),  # a tagger can't regress
    (["model_config.=32"], "settings.subkey_empty"),  # KEY.SUBKEY with nothing after the dot
    (["augment=[spin]"], "settings.unknown_augment"),  # an augmentation op that does not exist
    (["text_column=review #2"], "settings.value_comment"),  # an unquoted ' #' that YAML would cut off as a comment
])  # fmt: skip
def test_a_setting_mistake_is_refused_by_its_rule(settings, rule):
    """Settings on the command line that are refused before any data is read, each by its own rule."""
    assert refused(*settings) == rule


def test_a_recipe_given_without_config_is_refused(tmp_path):
    """A recipe file on the command line without --config before it."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("max_steps: 1\n")
    assert refused(str(recipe)) == "settings.recipe_without_option"


def test_a_binary_file_as_the_recipe_is_refused(tmp_path):
    """--config given a file that is not text."""
    recipe = tmp_path / "weights.yaml"
    recipe.write_bytes(b"\x80\x81\xfe\xff\x00 not text")
    with pytest.raises(UserError) as raised:
        load_config(recipe, [])
    assert raised.value.rule == "settings.recipe_not_text"


# --- files --------------------------------------------------------------------------------------------------


def test_a_damaged_parquet_file_is_refused_with_the_parsers_words(tmp_path):
    """A validation file named .parquet whose bytes are no parquet file (cut short, overwritten)."""
    (tmp_path / "validation.parquet").write_bytes(b"PAR1" + b"not a parquet file" * 8)
    cfg = load_config(None, [f"train_file={write_jsonl(tmp_path / 'train.jsonl', texts(8, named))}",
                             f"validation_file={tmp_path / 'validation.parquet'}", "test_file=null", "label_names=null"])
    with pytest.raises(UserError) as raised:
        load_splits(cfg.data_args, checks.Said(quiet=True))
    assert raised.value.rule == "files.unparsable"


def test_a_local_dataset_folder_that_does_not_load_is_refused(tmp_path):
    """dataset_name= naming a local folder without any data file in it."""
    (tmp_path / "mydata").mkdir()
    cfg = load_config(None, [f"dataset_name={tmp_path / 'mydata'}", "train_file=null", "validation_file=null",
                             "test_file=null", "label_names=null"])  # fmt: skip
    with pytest.raises(UserError) as raised:
        load_splits(cfg.data_args, checks.Said(quiet=True))
    assert raised.value.rule == "files.not_loaded"


# --- columns ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, rows, rule", [
    # text_column naming a column the file lacks, beside two other string columns (no one guess)
    (["text_column=body"], [{"title": f"title {i}", "summary": f"summary {i}", "label": named(i)} for i in range(8)],
     "columns.missing"),
    # the texts given as lists of words to a sentence classifier
    ([], [{"text": ["a", "list"], "label": named(i)} for i in range(8)], "columns.text_not_strings"),
    # a tagging row with an empty word
    (["task=token-classification"], [{"tokens": ["Ada", "" if i == 3 else "went"], "ner_tags": ["B-PER", "O"]}
                                     for i in range(8)], "columns.word_empty"),
])  # fmt: skip
def test_a_column_mistake_is_refused_by_its_rule(tmp_path, settings, rows, rule):
    """Columns that are missing or hold the wrong kind of values."""
    assert refused_data(tmp_path, *settings, train=rows) == rule


def test_parquet_strings_that_are_not_utf8_are_refused(tmp_path):
    """A parquet file whose text column holds bytes in another encoding than UTF-8."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = pa.array([b"good text", b"caf\xe9 latin-1"] * 4, pa.binary()).view(pa.string())  # unchecked bytes
    pq.write_table(pa.table({"text": text, "label": pa.array(["neg", "pos"] * 4)}), tmp_path / "train.parquet")
    cfg = load_config(None, [f"train_file={tmp_path / 'train.parquet'}", "validation_file=null", "test_file=null",
                             "label_names=null"])  # fmt: skip
    with pytest.raises(UserError) as raised:
        load_splits(cfg.data_args, checks.Said(quiet=True))
    assert raised.value.rule == "columns.strings_not_utf8"


# --- labels -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, train, validation, rule", [
    # training labels are names, the validation file's class ids
    ([], texts(8, named), texts(4, lambda i: i % 2), "labels.ids_for_named_classes"),
    # label_names other than the 0/1 label_columns
    (["label_columns=[a, b]", "label_names=[a, c]"], [{"text": f"t {i}", "a": i % 2, "b": 1 - i % 2}
                                                      for i in range(8)], None, "labels.label_names_of_label_columns"),
    # label_names in capitals for the data's lower-case labels
    (["label_names=[NEG, POS]"], texts(8, named), None, "labels.label_names_written_otherwise"),
    # lists of labels in train, one label a row in validation
    ([], texts(8, lambda i: [["x"], ["y"], ["x", "y"]][i % 3]), texts(4, named), "labels.not_lists_in_a_split"),
    # two output names for a regression
    (["problem_type=regression", "label_names=[a, b]"], texts(8, lambda i: i + 0.5), None, "labels.regression_outputs"),
    # a tagging row with a null tag
    (["task=token-classification"], [{"tokens": ["Ada", "went"], "ner_tags": ["B-PER", None if i == 3 else "O"]}
                                     for i in range(8)], None, "labels.tag_null"),
    # numbers to predict in train, words in validation
    ([], texts(8, lambda i: i + 0.5), texts(4, lambda i: ["low", "high"][i % 2]), "labels.targets_not_numbers"),
])  # fmt: skip
def test_a_label_mistake_is_refused_by_its_rule(tmp_path, settings, train, validation, rule):
    """Labels that do not fit the run's label set or problem type."""
    assert refused_data(tmp_path, *settings, train=train, validation=validation) == rule


def test_a_regression_target_far_from_the_rest_is_said(tmp_path):
    """One target typed ten times too large (450.5 among numbers near 4)."""
    train = texts(19, lambda i: 3.5 + (i % 5) * 0.25) + [{"text": "the typo", "label": 450.5}]
    assert "labels.targets_far_from_the_rest" in loaded(tmp_path, train=train).rules()


def test_label_columns_of_other_labels_than_the_models_are_refused(multi_label_export, tmp_path, capsys):
    """Evaluating a multi-label model (bird, cat, dog) on 0/1 columns that name another label (fish)."""
    from finetune.evaluate_checkpoint import main as evaluate

    names = ["cat", "dog", "fish"]
    rows = [{"text": r["text"], **{n: int(n in r["labels"]) for n in names}}
            for r in multi_label_rows(6, seed=3)]  # fmt: skip
    data = write_csv(tmp_path / "animals.csv", rows)
    assert set(names) != set(ANIMALS)
    user_error(capsys, evaluate, [str(multi_label_export), "--data", str(data), "--output", str(tmp_path / "e"),
                                  f"label_columns=[{','.join(names)}]"],
               "must name the labels", rule="labels.label_columns_of_other_labels")  # fmt: skip


# --- images, inputs ---------------------------------------------------------------------------------------


def test_an_image_column_of_lists_is_refused(tmp_path):
    """An image run whose image column holds lists of paths, not one image a row."""
    rows = [{"image": [f"{i}.png"], "label": ["cat", "dog"][i % 2]} for i in range(8)]
    cfg = load_config(None, ["task=image-classification", f"train_file={write_jsonl(tmp_path / 'train.jsonl', rows)}",
                             "validation_file=null", "test_file=null", "label_names=null"])  # fmt: skip
    with pytest.raises(UserError) as raised:
        load_splits(cfg.data_args, checks.Said(quiet=True))
    assert raised.value.rule == "images.not_an_image_column"


def test_texts_the_tokenizer_cannot_read_are_said(tmp_path):
    """Amharic texts trained with an English vocabulary: every word an unknown token."""
    from finetune.run import main

    amharic = ["ሰላም ለዓለም", "እንደምን አደርክ", "መልካም ቀን", "ጥሩ ፊልም ነው"]
    rows = [{"text": amharic[i % 4], "label": named(i)} for i in range(12)]
    data = {"train": write_csv(tmp_path / "train.csv", rows), "validation": write_csv(tmp_path / "validation.csv", rows[:4])}
    results = main(tiny_text_args(data, tmp_path / "out", "max_steps=1", "label_names=null"))
    assert "inputs.unknown_tokens" in [w["rule"] for w in results["warnings"]]


# --- tools --------------------------------------------------------------------------------------------------


def test_overwrite_output_dir_on_a_search_says_it_continues_the_study(tmp_path):
    """overwrite_output_dir=true given to a search whose folder holds a study, expecting a fresh start."""
    from finetune.search import search

    data = {"train": write_csv(tmp_path / "train.csv", rotten_rows(16)),
            "validation": write_csv(tmp_path / "validation.csv", rotten_rows(8, start=100))}
    settings = [*tiny_text_args(data, tmp_path / "search"), "max_steps=1"]
    first = checks.Said(quiet=True)
    search(None, settings, 300, ["learning_rate"], 1, said=first)
    assert "tools.overwrite_continues_study" not in first.rules()
    again = checks.Said(quiet=True)
    search(None, [*settings, "overwrite_output_dir=true"], 300, ["learning_rate"], 1, said=again)
    assert "tools.overwrite_continues_study" in again.rules()
