"""finetune/data.py: the one loader of data files and folders. A format per split, string labels and
sentence pairs, a held-out validation split, labels that probably mean something else, an image
folder's classes, the default recipe's label names over a user's own files. (Broken files and columns:
the catalogue, tests/test_bad_input.py.)

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_data.py
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import (
    REPO,
    class_folders,
    drawn_images,
    recipe_text_args,
    reset_accelerate,
    rotten_rows,
    tiny_image_args,
    tiny_text_args,
    user_error,
    write_csv,
    write_jsonl,
)

from finetune import checks
from finetune.config import load_config
from finetune.data import load_splits
from finetune.errors import UserError
from finetune.run import main


@pytest.mark.parametrize(
    "labels, fragment, rule",
    [
        (["['art', 'film']", "['art']", "film"], "holds a list written as text", "labels.list_written_as_text"),
        (["[art, film]", "[art]", "film"], "holds a list written as text ('[art, film]' at row 1)",
         "labels.list_written_as_text"),
        (["pos", " pos", "neg"], "which differ only by spaces", "labels.space_twins"),
        (["neg", "neg.", "pos"], "holds 'neg' and 'neg.', which differ only by punctuation", "labels.punctuation_twins"),
        (["US", "U.S.", "UK"], "holds 'U.S.' and 'US', which differ only by punctuation", "labels.punctuation_twins"),
        (["neg", "NEG", "pos"], "holds 'NEG' and 'neg', which differ only by letter case", "labels.case_twin_classes"),
    ],
)  # fmt: skip
def test_labels_that_probably_mean_something_else_are_refused(labels, fragment, rule, tmp_path, capsys):
    rows = [{"text": f"sentence {i}", "label": labels[i % len(labels)]} for i in range(12)]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows)}
    assert fragment in user_error(capsys, main, recipe_text_args(data, tmp_path / "run"), rule=rule)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_a_model_folder_s_other_files_given_as_data_are_named(name, tmp_path, capsys):
    """The bundled model's own tokenizer files as train_file: named as the model file each is, not listed as
    columns that lack the label."""
    rows = [{"text": f"sentence {i}", "label": ["pos", "neg"][i % 2]} for i in range(12)]
    data = {"train": REPO / "data/bert_minilm_l6_uncased" / name, "validation": write_csv(tmp_path / "v.csv", rows)}
    user_error(capsys, main, recipe_text_args(data, tmp_path / "run"), f"the keys of a model's {name}",
               "give a data file", rule="columns.a_model_file")  # fmt: skip


def test_a_model_s_config_json_given_as_data_is_named(tmp_path, capsys):
    """An export's config.json as train_file (it is JSON, and names a file, not a folder) is said to describe a
    model, not listed as columns (model_type, architectures, ...) that lack the label."""
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"architectures": ["BertForSequenceClassification"], "model_type": "bert",
                                  "hidden_size": 16, "id2label": {"0": "neg", "1": "pos"}}))  # fmt: skip
    rows = [{"text": f"sentence {i}", "label": ["pos", "neg"][i % 2]} for i in range(12)]
    data = {"train": config, "validation": write_csv(tmp_path / "v.csv", rows)}
    user_error(capsys, main, recipe_text_args(data, tmp_path / "run"), "the keys of a model's config.json",
               "give a data file", rule="columns.a_model_file")  # fmt: skip


def test_a_validation_file_of_one_class_is_said(tmp_path, capsys):
    """Its accuracy is that of always answering the class, so it cannot judge the model: one warning."""
    rows = [{"text": f"sentence {i}", "label": ["pos", "neg"][i % 2]} for i in range(12)]
    data = {"train": write_csv(tmp_path / "t.csv", rows),
            "validation": write_csv(tmp_path / "v.csv", [r for r in rows if r["label"] == "pos"])}
    results = main(recipe_text_args(data, tmp_path / "run", "max_steps=1"))
    assert "warning: the validation data holds one class ('pos') of the 2" in capsys.readouterr().err
    assert "splits.validation_of_one_class" in [w["rule"] for w in results["warnings"]]
    data["validation"] = write_csv(tmp_path / "v2.csv", rows[:4])
    main(recipe_text_args(data, tmp_path / "run2", "max_steps=1"))
    assert "holds one class" not in capsys.readouterr().err


def test_a_label_that_differs_only_by_spaces_or_case_in_validation_is_named(tmp_path, capsys):
    rows = [{"text": f"sentence {i}", "label": ["pos", "neg"][i % 2]} for i in range(12)]
    other = [{**row, "label": {"pos": "pos ", "neg": "Neg"}[row["label"]]} for row in rows]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": write_csv(tmp_path / "v.csv", other)}
    line = user_error(capsys, main, recipe_text_args(data, tmp_path / "run"), rule="labels.unseen_near_a_training_label")
    assert "were not seen in training" in line
    assert "'Neg' (train: 'neg'), 'pos ' (train: 'pos') differ from the training labels only by letter case and " \
           "surrounding spaces" in line  # fmt: skip


def test_an_image_class_with_no_training_image_is_refused(tmp_path, capsys):
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog", "fox"]})
    line = user_error(capsys, main, tiny_image_args(folder, tmp_path / "run"), rule="labels.class_without_training_sample")
    assert "class 'fox'" in line and "has no training sample" in line


def test_an_empty_class_folder_is_refused(tmp_path, capsys):
    """datasets would leave the class out without a word; a folder of notes only counts as empty."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    (folder / "train" / "fox").mkdir()
    (folder / "train" / "fox" / "notes.txt").write_text("to do: photos")
    line = user_error(capsys, main, tiny_image_args(folder, tmp_path / "run"), rule="images.empty_class_folder")
    assert f"class folder {folder / 'train' / 'fox'} holds no image, so its class would be left out" in line


def test_phone_photos_that_cannot_be_read_are_named(tmp_path, capsys):
    """.HEIC photos (an iPhone's): among JPEGs, left out with one warning that counts them; a class folder
    of them alone is refused as such, not as empty."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    heic = b"\x00\x00\x00\x18ftypheic" + bytes(64)
    (folder / "train" / "cat" / "IMG_0001.HEIC").write_bytes(heic)
    results = main(tiny_image_args(folder, tmp_path / "run", "max_steps=1"))
    assert "images.photos_not_read" in [w["rule"] for w in results["warnings"]]
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "cannot be read here" in ln]
    assert warned == [f"warning: 1 photo(s) in {folder} are .heic files, which cannot be read here and are left out "
                      f"(first: {folder / 'train' / 'cat' / 'IMG_0001.HEIC'}); convert them to JPEG or PNG to train "
                      "on them"]  # fmt: skip
    reset_accelerate()
    (folder / "train" / "fox").mkdir()
    (folder / "train" / "fox" / "IMG_0002.heic").write_bytes(heic)
    line = user_error(capsys, main, tiny_image_args(folder, tmp_path / "fox"), rule="images.class_of_unreadable_photos")
    assert line.endswith(f"class folder {folder / 'train' / 'fox'} holds only .heic photos, which cannot be read "
                         "here: convert them to JPEG or PNG")  # fmt: skip
    # in the validation split, a class of them alone would just be missing there: counted in the warning
    (folder / "train" / "fox" / "IMG_0002.heic").rename(folder / "validation" / "IMG_0002.heic")
    (folder / "train" / "fox").rmdir()
    (folder / "validation" / "fox").mkdir()
    (folder / "validation" / "IMG_0002.heic").rename(folder / "validation" / "fox" / "IMG_0002.heic")
    reset_accelerate()
    main(tiny_image_args(folder, tmp_path / "val", "max_steps=1"))
    assert "warning: 2 photo(s) in" in capsys.readouterr().err


def test_an_image_class_that_differs_only_by_case_is_named(tmp_path, capsys):
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["Cat", "dog"]})
    user_error(capsys, main, tiny_image_args(folder, tmp_path / "run"),
               "class 'Cat' of label column 'label' has no training sample; 'Cat' (train: 'cat') differ from the "
               "training labels only by letter case", "name each class's folder the same in every split", rule="labels.class_without_training_sample")  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("splits", [{"train": ["cat"]}, {"train": ["cat"], "validation": ["cat"]}])
def test_an_image_folder_of_one_class_is_refused_as_such(splits, tmp_path, capsys):
    """datasets labels an image folder's images only when it has two classes or more: one class read as
    "column 'label' not found"."""
    folder = class_folders(tmp_path / "img", splits)
    line = user_error(capsys, main, tiny_image_args(folder, tmp_path / "run"),
                      "the train images are all in one class folder ('cat'", "a classifier needs two or more classes")  # fmt: skip
    assert "not found" not in line and not (tmp_path / "run").exists()


def test_an_image_class_only_in_validation_named_in_label_names_is_trained_with_a_warning(tmp_path, capsys):
    """label_names asks for the class, so the run goes on, but says the model cannot learn it."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog", "fox"]})
    results = main(tiny_image_args(folder, tmp_path / "run", "label_names=[cat,dog,fox]", "max_steps=1"))
    assert "labels.named_class_without_sample" in [w["rule"] for w in results["warnings"]]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("1 of the 3 classes in label_names have no training sample ('fox'" in w for w in warnings), warnings


def test_data_dir_on_the_command_line_replaces_the_recipe_s_data_files(tmp_path):
    """`task=image-classification data_dir=...` over the default (text) recipe, whose CSV files are not
    cleared: the image folder is read (before, the CSV files were, and the line spoke of a missing
    'image' column)."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    args = [a for a in tiny_image_args(folder, tmp_path / "run", "max_steps=1") if not a.endswith("_file=null")]
    results = main(args)
    assert results["validation"]["num_samples"] == 6
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "train_file: null" in saved and f"data_dir: {folder}" in saved


def test_a_csv_cell_is_missing_only_when_empty(tmp_path):
    """pandas reads NA, N/A, None, null and nan as missing by default: a class of that name (NA for North
    America, None for no topic) would become an empty label. Only an empty cell is missing."""
    from finetune.data import load_raw

    path = tmp_path / "regions.csv"
    path.write_text("text,region\na,NA\nb,N/A\nc,None\nd,null\ne,nan\nf,EU\n,EU\n")
    train = load_raw({"train": str(path)}, None, None, None)["train"]
    assert train["region"] == ["NA", "N/A", "None", "null", "nan", "EU", "EU"]
    assert train["text"][-1] is None  # the empty cell


def test_an_empty_pair_column_names_text_pair_column(tmp_path, capsys):
    rows = [{"text": r["text"], "hypothesis": "", "label": r["label"]} for r in rotten_rows(12)]
    train = write_csv(tmp_path / "pairs.csv", rows)
    line = user_error(capsys, main, tiny_text_args({"train": train, "validation": train}, tmp_path / "run",
                                                   "text_pair_column=hypothesis"))  # fmt: skip
    assert "text column 'hypothesis' in the train data is empty (no text in any row); set text_pair_column" in line


def test_string_labels_and_sentence_pairs_from_jsonl(tmp_path):
    rows = rotten_rows(24)
    names = {"0": "negative", "1": "positive"}
    train = tmp_path / "pairs.jsonl"
    with train.open("w") as f:
        for i, r in enumerate(rows):
            f.write(
                json.dumps(
                    {"premise": r["text"], "hypothesis": rows[-i - 1]["text"], "sentiment": names[r["label"]]}
                )
                + "\n"
            )
    out = tmp_path / "run"
    args = tiny_text_args(
        {"train": train, "validation": train},
        out,
        "validation_file=null",
        "text_column=premise",
        "text_pair_column=hypothesis",
        "label_column=sentiment",
        "max_steps=2",
        "per_device_train_batch_size=4",
        "validation_split_percentage=25",
    )
    results = main(args)
    assert results["label_names"] == ["negative", "positive"]
    assert results["validation"]["num_samples"] == 6  # a stratified 25% of 24 rows
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["label2id"] == {"negative": 0, "positive": 1}


def test_single_class_labels_are_refused(tmp_path):
    rows = [r for r in rotten_rows(60) if r["label"] == "1"]
    train = write_csv(tmp_path / "one.csv", rows)
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_text_args({"train": train, "validation": train}, tmp_path / "o"))
    assert exit_info.value.code == 2


def test_each_split_file_may_have_its_own_format(small_text_data, tmp_path):
    """A .csv train, a .jsonl validation and a .parquet test: datasets loads each split on its own."""
    import pandas as pd

    validation = tmp_path / "dev.jsonl"
    validation.write_text("".join(json.dumps(r) + "\n" for r in rotten_rows(13, start=100)))
    test = tmp_path / "test.parquet"
    pd.DataFrame(rotten_rows(9, start=200)).to_parquet(test)
    data = {"train": small_text_data["train"], "validation": validation}
    results = main(tiny_text_args(data, tmp_path / "run", "max_steps=2", f"test_file={test}"))
    assert results["validation"]["num_samples"] == 13 and results["test"]["num_samples"] == 9


def test_an_image_folder_without_class_folders_says_how_to_lay_it_out(tmp_path, capsys):
    """Images straight in data_dir: datasets finds no labels; the line says where the classes go."""
    drawn_images(tmp_path, {"": [(60 * i, 0, 0) for i in range(4)]}, split="", size=(20, 20))  # no class folder
    recipe = str(REPO / "finetune/configs/vit_imagefolder.yaml")
    out = tmp_path.parent / f"{tmp_path.name}-run"  # outside data_dir, which is refused
    line = user_error(capsys, main, ["--config", recipe, f"data_dir={tmp_path}", f"output_dir={out}"], rule="columns.labels_of_an_image_folder")
    assert "column 'label' not found" in line and "<data_dir>/train/<class>/" in line


def test_own_labels_under_the_default_recipe_are_taken_from_the_data(tmp_path, capsys):
    """The default recipe names the bundled data's labels ("0", "1"); they belong to the recipe's data, so a
    user's own files (train_file= on the command line) bring their own labels, as model_name_or_path does
    its model. Named on the command line, label_names still rule, and a label they lack is refused."""
    from finetune.data import load_splits

    rows = [{"text": f"text {i}", "label": ["pos", "neg"][i % 2]} for i in range(20)]
    train = write_csv(tmp_path / "train.csv", rows)
    mine = [f"train_file={train}", "validation_file=null", "test_file=null", "validation_split_percentage=20"]
    assert load_config(None, mine).label_names is None
    assert load_splits(load_config(None, mine).data_args)[1] == ["neg", "pos"]
    assert load_config(None, [f"train_file={REPO / 'data/rotten_tomatoes/train.csv'}"]).label_names == ["0", "1"]
    with pytest.raises(UserError, match=r"training labels \['neg', 'pos'\] are not in label_names \['0', '1'\]") as e:
        load_splits(load_config(None, [*mine, "label_names=['0','1']"]).data_args)
    assert e.value.rule == "labels.not_in_label_names"
    assert "warning:" not in capsys.readouterr().err
    # a user's own recipe that names no data: its label_names are written for the data the command line names
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("label_names: [pos, neu, neg]\n")
    model = f"model_name_or_path={REPO / 'data/bert_minilm_l6_uncased'}"
    assert load_config(recipe, [*mine, model]).label_names == ["pos", "neu", "neg"]


def test_csv_numbers_written_with_a_leading_zero_stay_text(tmp_path):
    """'007' and '7' read as numbers would be one class (7): a column with a leading-zero integer is read
    as the text it is; a column of plain integers stays numbers."""
    from finetune.data import load_raw

    path = tmp_path / "zeros.csv"
    path.write_text("text,label,count\na,007,1\nb,7,2\nc,8,3\n")
    train = load_raw({"train": str(path)}, None, None, None)["train"]
    assert train["label"] == ["007", "7", "8"] and train["count"] == [1, 2, 3]


KIND, FEW = "splits.classes_of_another_kind", "splits.too_few_to_stratify"


@pytest.mark.parametrize(("labels", "fragment", "rule"), [
    (["1,000", "2,500", "3,000", "4,250", "5,000", "6,000"], "classes such as '1,000': numbers, not classes?", KIND),
    (["50%", "20%", "30%", "40%", "60%", "70%"], "numbers, not classes?", KIND),
    (["3.2 stars", "4 stars", "1.5 stars", "5 stars", "2.5 stars", "4.5 stars"],
     "stars': numbers, not classes? for a regression write them plainly, without units", KIND),
    (["1st", "2nd", "3rd", "4th", "5th", "6th"], "least populated class", FEW),  # ordinals: classes, no hint
    (["$5", "$10", "$20", "$50", "$100", "$200"], "classes such as '$10': numbers, not classes?", KIND),  # as regression reads
    (["art,film", "film", "art;music", "music", "news", "art"], "several labels in one cell?", KIND),
    (["0", "1", "2", "3", "4", "5"], "least populated class", FEW),  # class ids: no hint
    (["0", "1", "neg", "pos", "0", "neg"], "ids and names of the same classes?", KIND),
    (["01", "1", "02", "2", "01", "1"], "classes such as '01' and '1': the same number written two ways?", KIND),
    (["no", "yes", "False", "True", "no", "yes"], "classes such as 'False' and 'no': yes/no written in more than one way?",
     KIND),
    (["yes", "no", "maybe", "yes", "no", "maybe", "x"], "least populated class", FEW),  # three answers: no hint
    (["neg", "negative", "pos", "positive", "neg", "pos"], "'neg' and 'negative', 'pos' and 'positive': each class "
                                                          "written short and in full?", KIND),
    ([str(i % 39) for i in range(80)], "(39 classes, the whole numbers 0 to 38: scores to predict as numbers? then "
                                       "set problem_type=regression)", "splits.scores_as_classes"),
    (["1", "2", "3", "4", "5", "1", "2", "3", "4"], "(the classes are the whole numbers 1 to 5: if they are scores "
                                                    "(stars, grades), problem_type=regression predicts them",
     "splits.stars_as_classes"),
    ([f"row-{i}" for i in range(12)], "(12 classes for 12 samples, most with one sample each: is 'label' an id or a "
                                      "text column? set label_column to the column of classes)", "splits.an_id_column"),
    (["neg", "pos"], "(2 training samples: too few to hold out one of each class)", FEW),  # not "an id column?"
    # 30 classes of 3 samples: the default 10% holds 9, the share that holds one of each is named
    ([f"c{i % 30}" for i in range(90)], "validation_split_percentage=10 holds out 9 of the 90 training samples, "
                                        "fewer than the 30 classes, so the validation split cannot hold one of each: "
                                        "give a validation_file, or set validation_split_percentage=33 or more (at "
                                        "most 66, to leave one of each to train on)",
     "splits.share_too_small_for_every_class"),
])  # fmt: skip
def test_a_split_that_cannot_be_stratified_says_what_the_labels_look_like(labels, fragment, rule, tmp_path):
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "train.csv"
    path.write_text("text,label\n" + "".join(f"sample {i},\"{label}\"\n" for i, label in enumerate(labels)))
    cfg = load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                             "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
    with pytest.raises(UserError) as e:
        load_splits(cfg.data_args)
    assert fragment in str(e.value) and e.value.rule == rule
    if labels[0] == "0":
        assert "not classes?" not in str(e.value) and "one cell?" not in str(e.value)
    if "validation_split_percentage=33" in fragment:  # the shares named do hold one of each
        for share in (33, 66):
            load_splits(load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null",
                                           "label_names=null", f"validation_split_percentage={share}"]).data_args)  # fmt: skip


def test_classes_that_look_like_decimal_numbers_train_with_one_warning(tmp_path, capsys):
    from finetune.config import load_config
    from finetune.data import load_splits

    labels = ["0,5", "1,5", "2,5", "0,5", "1,5", "2,5"]
    path = tmp_path / "train.csv"
    path.write_text("text,label\n" + "".join(f"sample {i},\"{label}\"\n" for i, label in enumerate(labels)))
    for names, warned in (("null", True), ("['0,5','1,5','2,5']", False)):
        cfg = load_config(None, [f"train_file={path}", f"validation_file={path}", "test_file=null",
                                 f"label_names={names}", "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
        raw, _ = load_splits(cfg.data_args, said := checks.Said())
        assert len(raw["train"]) == 6
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: training a")]
        assert len(lines) == warned and (not warned or "numbers, not classes?" in lines[0]), lines
        assert ("labels.classes_of_another_kind" in said.rules()) == warned


@pytest.mark.parametrize("percentage, warned", [(95, True), (50, False), (10, False), (0.5, True)])
def test_holding_out_more_than_is_trained_on_is_one_warning(percentage, warned, tmp_path, capsys):
    """validation_split_percentage=95 (meant 5, or 0.95 read as a fraction) trains on a twentieth, and 0.5
    (Trainer's habit of a fraction: half) holds out a two-hundredth: each said once."""
    from finetune.config import load_config
    from finetune.data import load_splits

    path, rows = tmp_path / "train.csv", 40 if percentage >= 1 else 1000
    path.write_text("text,label\n" + "".join(f"sample {i},{'ab'[i % 2]}\n" for i in range(rows)))
    cfg = load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                             "max_train_samples=null", "max_eval_samples=null",
                             f"validation_split_percentage={percentage}"])  # fmt: skip
    raw, _ = load_splits(cfg.data_args, said := checks.Said())
    lines = [line for line in capsys.readouterr().err.splitlines() if "validation_split_percentage" in line]
    assert len(lines) == warned and ("splits.held_out_share" in said.rules()) == warned, lines
    if warned:
        assert lines[0] == (f"warning: validation_split_percentage={percentage:g} holds out {len(raw['validation'])} of "
                            f"the {rows} training samples and trains on {len(raw['train'])}; it is the percentage held "
                            "out for validation (10 holds out a tenth, 0.2 a five-hundredth)")
        assert len(raw["train"]) == (2 if percentage == 95 else 995)


def test_a_csv_cell_longer_than_the_csv_modules_default_limit_is_read(tmp_path):
    """A 200,000-character document is valid CSV (pandas reads it); the app's own reading of the file (what
    is wrong with a file that fails to load; leading zeros) reads it too, instead of failing on the csv
    module's default 131,072-character limit."""
    import csv

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    def write(path, rows):
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([["text", "label"], *rows])
        return path

    long = ["word " * 40_000, "01"]
    good = write(tmp_path / "good.csv", [long, *[[f"sample {i}", f"0{i % 2}"] for i in range(7)]])
    ragged = write(tmp_path / "ragged.csv", [long, ["a", "00"], ["b", "01", "extra"]])
    for path, fails in ((good, False), (ragged, True)):
        cfg = load_config(None, [f"train_file={path}", f"validation_file={path}", "test_file=null",
                                 "label_names=null", "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
        if fails:
            with pytest.raises(UserError, match="line 4 has 3 fields, the header has 2"):
                load_splits(cfg.data_args)
        else:
            raw, names = load_splits(cfg.data_args)
            assert len(raw["train"]) == 8 and names == ["00", "01"]  # the leading-zero check read every cell


@pytest.mark.parametrize("rows, fragment, rule", [
    ([{"text": f"t{i}", "label": ["caf\u00e9", "cafe\u0301", "tea"][i % 3]} for i in range(9)],
     "holds 'cafe\\u0301' and 'café', which read the same (they differ only in Unicode form or by invisible",
     "labels.look_alike_classes"),
    ([{"text": f"t{i}", "label": ["pos", "pos\u200b", "neg"][i % 3]} for i in range(9)],
     "holds 'pos' and 'pos\\u200b', which read the same", "labels.look_alike_classes"),
    ([{"text": f"t{i}", "labels": [["art"], ["art", ""], []][i % 3]} for i in range(9)],
     "has an empty label (\"\") inside the list at row 2", "labels.empty_name_in_a_list"),
    ([{"text": f"t{i}", "labels": [["caf\u00e9"], ["cafe\u0301", "art"]][i % 2]} for i in range(8)],
     "holds the labels 'cafe\\u0301' and 'café', which read the same", "labels.look_alike_labels"),
    ([{"text": "\u200b\u200b" if i == 4 else f"t{i}", "label": i % 2} for i in range(8)],
     "has an empty (blank) text of invisible characters (zero-width spaces) at row 5", "columns.text_blank"),
])  # fmt: skip
def test_labels_and_texts_that_read_the_same_or_as_nothing_are_refused(rows, fragment, rule, tmp_path):
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    column = "labels" if "labels" in rows[0] else "label"
    cfg = load_config(None, [f"train_file={path}", f"validation_file={path}", "test_file=null", "label_names=null",
                             "max_train_samples=null", "max_eval_samples=null", f"label_column={column}"])  # fmt: skip
    with pytest.raises(UserError) as e:
        load_splits(cfg.data_args)
    assert fragment in str(e.value) and e.value.rule == rule, (str(e.value), e.value.rule)


def test_class_ids_and_one_fraction_train_a_regression_with_one_warning(tmp_path, capsys):
    """0/1 labels and one 1.5: read as numbers, a regression; probably classes with a typo, so it is said."""
    from finetune.config import load_config
    from finetune.data import load_splits

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": 1.5 if i == 6 else i % 2}) + "\n" for i in range(30)))
    for given, warned in (("null", True), ("regression", False)):
        cfg = load_config(None, [f"train_file={path}", f"validation_file={path}", "test_file=null", "label_names=null",
                                 "max_train_samples=null", "max_eval_samples=null", f"problem_type={given}"])  # fmt: skip
        load_splits(cfg.data_args, said := checks.Said())
        assert cfg.problem_type in (None, "regression") and ("labels.a_stray_fraction" in said.rules()) == warned
        lines = [line for line in capsys.readouterr().err.splitlines() if "with decimals" in line]
        assert lines == ([
            "warning: label column 'label' holds whole numbers (2 values) and 1 with decimals (1.5 at row 7): trained "
            "as a regression; if the labels are classes, fix those rows (or set problem_type=regression to say it is one)"
        ] if warned else []), lines


def test_max_train_samples_that_leaves_one_class_is_refused(tmp_path):
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "train.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{'neg' if i < 3 else 'pos'}\n" for i in range(8)))
    argv = [f"train_file={path}", f"validation_file={path}", "test_file=null", "label_names=null",
            "max_eval_samples=null"]  # fmt: skip
    with pytest.raises(UserError, match="max_train_samples=3 leaves the training data one class \\('neg': the first 3 "
                                        "rows are taken\\); a classifier needs at least two") as raised:  # fmt: skip
        load_splits(load_config(None, [*argv, "max_train_samples=3"]).data_args)
    assert raised.value.rule == "splits.kept_one_class"
    assert len(load_splits(load_config(None, [*argv, "max_train_samples=4"]).data_args)[0]["train"]) == 4


@pytest.mark.parametrize("name, text, fragment, rule", [
    ("cased.csv", "Text,Label\na,0\nb,1\nc,0\nd,1\n",
     "column 'label' not found in the train data, but 'Label' is (the names differ in case): set label_column=Label "
     "text_column=Text, or rename the columns", "columns.names_in_another_case"),
    ("quoted.jsonl", '{"text": "a", "label": "3.5"}\n{"text": "b", "label": "1.0"}\n{"text": "c", "label": "2"}\n',
     "label column 'label' holds numbers written as text (e.g. '3.5'); regression reads numbers: write them without "
     "quotes (JSON: \"label\": 3.5)", "labels.numbers_as_text"),
    ("mixed.jsonl", '{"text": "a", "label": "1"}\n{"text": "b", "label": 0}\n{"text": "c", "label": 1}\n',
     "label column 'label' mixes kinds of value (in JSON: \"1\" quoted in some rows and 1 bare in others",
     "labels.mixed_kinds"),
    ("words.jsonl", '{"tokens": "Ada went home", "ner_tags": ["B-PER", "O", "O"]}\n'
                    '{"tokens": "Bo ran", "ner_tags": ["B-PER", "O"]}\n',
     "column 'tokens' of the train data holds a string in each row, beside lists of tags in 'ner_tags': a tagging "
     "run needs a list of words for each list of tags", "columns.words_as_one_string"),
    ("nested.jsonl", '{"data": {"text": "a", "lang": "en"}, "label": 0}\n{"data": {"text": "b", "lang": "en"}, '
                     '"label": 1}\n',
     "column 'text' not found in the train data; columns are: data, label; 'data' holds fields (lang, text), and "
     "nested fields are not read: flatten them into columns (pandas: pd.json_normalize(records).to_json("
     "orient='records', lines=True)) and set text_column=data.text", "columns.nested_field"),
])  # fmt: skip
def test_columns_almost_right_say_the_fix(name, text, fragment, rule, tmp_path):
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / name
    path.write_text(text)
    problem = "regression" if name == "quoted.jsonl" else "null"
    cfg = load_config(None, [f"train_file={path}", f"validation_file={path}", "test_file=null", "label_names=null",
                             "max_train_samples=null", "max_eval_samples=null", f"problem_type={problem}"])  # fmt: skip
    with pytest.raises(UserError) as e:
        load_splits(cfg.data_args)
    assert fragment in str(e.value) and e.value.rule == rule, (str(e.value), e.value.rule)


def test_a_csv_label_past_64_bits_is_a_class_name(tmp_path):
    """pandas fails on 100000000000000000000 in an integer column (OverflowError): such a column is read as the
    text it is, as ids and class names are."""
    from finetune.config import load_config
    from finetune.data import load_splits

    path = tmp_path / "train.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{'100000000000000000000' if i % 2 else 5}\n" for i in range(8)))
    cfg = load_config(None, [f"train_file={path}", f"validation_file={path}", "test_file=null", "label_names=null",
                             "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
    raw, names = load_splits(cfg.data_args)
    assert names == ["100000000000000000000", "5"] and len(raw["train"]) == 8


def test_a_validation_file_that_is_the_train_file_is_one_warning(tmp_path, capsys):
    from finetune.config import load_config
    from finetune.data import load_splits

    path = tmp_path / "train.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(8)))
    for validation, warned in ((path, True), (tmp_path / "." / "train.csv", True), ("null", False)):
        cfg = load_config(None, [f"train_file={path}", f"validation_file={validation}", "test_file=null",
                                 "label_names=null", "max_train_samples=null", "max_eval_samples=null",
                                 "validation_split_percentage=50"])  # fmt: skip
        load_splits(cfg.data_args, said := checks.Said())
        lines = [line for line in capsys.readouterr().err.splitlines() if "validation_file is the train_file" in line]
        assert len(lines) == warned and ("splits.validation_is_train" in said.rules()) == warned, lines


def test_a_test_file_that_is_the_validation_file_is_one_warning(tmp_path, capsys):
    """The test split is the one no decision saw: the validation file again as test is said, once."""
    from finetune.config import load_config
    from finetune.data import load_splits

    train, held = tmp_path / "train.csv", tmp_path / "held.csv"
    train.write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(8)))
    held.write_text("text,label\n" + "".join(f"h{i},{i % 2}\n" for i in range(6)))
    for test, warned in ((held, True), (tmp_path / "." / "held.csv", True), (train, False), ("null", False)):
        cfg = load_config(None, [f"train_file={train}", f"validation_file={held}", f"test_file={test}",
                                 "label_names=null", "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
        load_splits(cfg.data_args, said := checks.Said())
        lines = [line for line in capsys.readouterr().err.splitlines() if "test_file is the validation_file" in line]
        assert len(lines) == warned and ("splits.test_is_validation" in said.rules()) == warned, lines


def test_labels_written_with_spaces_around_them_train_with_one_warning(capsys):
    """'pos ' and 'neg ' (a CSV written with ', ' between fields) have no twin without the space: they
    train as written, and one line says so; names listed in label_names are the user's own."""
    from datasets import Dataset

    from finetune.problems import resolve_label_names

    train = Dataset.from_dict({"label": ["pos ", "neg ", " neutral", "pos "]})
    assert resolve_label_names(train, "label", None, said := checks.Said()) == [" neutral", "neg ", "pos "]
    assert said.rules() == ["labels.spaced_labels"]
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "has labels that begin or end with a space (' neutral', 'neg ', 'pos ')" in err
    resolve_label_names(train, "label", ["pos ", "neg ", " neutral"])
    assert capsys.readouterr().err == ""


def test_splits_that_are_not_what_they_seem_warn(tmp_path, capsys):
    """A test_file that is the train_file; a validation file that is a shuffled copy of the training file;
    training texts all the same: each trains with one warning line. Distinct splits say nothing."""
    from finetune.config import load_config
    from finetune.data import load_splits

    rows = [f"sample {i},{['pos', 'neg'][i % 2]}\n" for i in range(12)]
    train, copy, other = tmp_path / "train.csv", tmp_path / "copy.csv", tmp_path / "other.csv"
    train.write_text("text,label\n" + "".join(rows))
    copy.write_text("text,label\n" + "".join(reversed(rows)))
    other.write_text("text,label\n" + "".join(f"other {i},{['pos', 'neg'][i % 2]}\n" for i in range(6)))
    held = tmp_path / "held.csv"
    held.write_text("text,label\n" + "".join(f"held {i},{['pos', 'neg'][i % 2]}\n" for i in range(6)))
    same = tmp_path / "same.csv"
    same.write_text("text,label\n" + "".join(f"same text,{['pos', 'neg'][i % 2]}\n" for i in range(12)))

    def warnings(train_file, validation, test, *rules):
        cfg = load_config(None, [f"train_file={train_file}", f"validation_file={validation}", f"test_file={test}",
                                 "label_names=null", "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
        load_splits(cfg.data_args, said := checks.Said())
        assert said.rules() == list(rules)
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]

    assert warnings(train, other, held) == []
    assert warnings(train, other, train, "splits.test_is_train") == [f"warning: test_file is the train_file ({train}): test scores measure "
                                             "samples the model trained on; give a separate test file"]  # fmt: skip
    assert warnings(train, copy, held, "splits.validation_of_training_samples") == [
        "warning: 12 of the 12 validation samples are also training samples (the same text): their scores measure "
        "samples the model trained on; give validation samples that are not in the training data"]
    assert warnings(same, other, held, "splits.samples_all_the_same") == [
        "warning: every training sample has the same text ('same text'): the model cannot tell them apart; check "
        "text_column"]


def test_a_regression_target_that_never_varies_is_refused(tmp_path):
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "train.jsonl"
    path.write_text("".join(f'{{"text": "sample {i}", "score": 3.5}}\n' for i in range(8)))
    cfg = load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                             "label_column=score", "problem_type=regression"])  # fmt: skip
    with pytest.raises(UserError, match=r"label column 'score' holds the same number \(3.5\) in every training row") as raised:
        load_splits(cfg.data_args)
    assert raised.value.rule == "labels.targets_all_the_same"


def test_a_split_folder_named_in_another_case_is_refused(tmp_path):
    """Train/ and Validation/: the image folder loader would read them as class folders and train on both."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    _check_image_folder(folder)
    (folder / "train").rename(folder / "Train")
    with pytest.raises(UserError, match=r"Train is not read as the train split: .* rename it to train/") as e:
        _check_image_folder(folder)
    assert e.value.rule == "images.split_folder_in_capitals"


def test_a_file_whose_name_says_another_format_is_named(tmp_path):
    """A comma-separated file named .tsv, a parquet file named .csv: the name decides how it is read, so the
    line says which name fits (not 'column not found' or 'not UTF-8')."""
    import pandas as pd

    from finetune.checks import files

    def check(path):
        checks.gate(files.HEAD, files.FileHead.read("train", str(path)))

    comma = tmp_path / "train.tsv"
    comma.write_text("text,label\na,pos\n")
    with pytest.raises(UserError, match="looks comma-separated .* a .tsv file is read as tab-separated; name it train.csv") as e:
        check(comma)
    assert e.value.rule == "files.tsv_of_commas"
    packed = tmp_path / "data.csv"
    pd.DataFrame({"text": ["a"], "label": ["pos"]}).to_parquet(packed)
    with pytest.raises(UserError, match="is a parquet file; name it data.parquet") as e:
        check(packed)
    assert e.value.rule == "files.parquet_by_another_name"


def test_a_relative_path_that_is_not_found_says_where_it_was_looked_for(tmp_path, monkeypatch):
    from finetune.data import load_raw
    from finetune.errors import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=re.escape(f"train file not found: ../d/t.csv (read from the current folder, "
                                                  f"{tmp_path})")):
        load_raw({"train": "../d/t.csv"}, None, None, None)
    # a Windows path: the same line, and the path with '/'
    with pytest.raises(UserError, match=re.escape(r"train file not found: data\train.csv (read from the current "
                                                  f"folder, {tmp_path}); it is written with backslashes, as on "
                                                  "Windows: here folders are separated by '/' (data/train.csv)")):
        load_raw({"train": r"data\train.csv"}, None, None, None)
    with pytest.raises(UserError, match=re.escape("it is a Windows path (a drive letter): give the file's path on "
                                                  "this machine, with '/' between folders")):
        load_raw({"train": r"C:\Users\me\train.csv"}, None, None, None)


def test_a_folder_of_other_files_than_dataset_name_reads_is_named(tmp_path):
    """dataset_name=json data_dir=<a folder of CSV files>: one line naming the files and the builder that
    reads them (datasets printed its own JSON error, then ours without a fix)."""
    from finetune.data import load_raw
    from finetune.errors import UserError

    write_csv(tmp_path / "train.csv", [{"text": "a", "label": "pos"}])
    with pytest.raises(UserError, match=re.escape(f"data_dir {tmp_path} holds no .json or .jsonl file for "
                                                  "dataset_name=json; its files are .csv: set dataset_name=csv")) as raised:
        load_raw({}, "json", None, str(tmp_path))
    assert raised.value.rule == "files.builder_of_other_files"


def test_numbers_written_as_strings_are_texts(tmp_path):
    """The fix the numeric-text refusal gives (tests/test_bad_input.py, numeric_text): the same numbers as
    JSON strings are read as texts."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    def codes(as_strings: bool):
        rows = [{"text": str(1000 + i) if as_strings else 1000 + i, "label": i % 2} for i in range(20)]
        path = write_jsonl(tmp_path / f"codes-{as_strings}.jsonl", rows)
        return load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null"]).data_args

    with pytest.raises(UserError, match="holds only numbers"):
        load_splits(codes(as_strings=False))
    raw, names = load_splits(codes(as_strings=True))
    assert raw["train"].features["text"].dtype == "string" and names == ["0", "1"]


def test_a_hub_dataset_offline_says_how_to_get_it(monkeypatch):
    """dataset_name=glue under HF_DATASETS_OFFLINE (set for the tests): datasets' ConnectionError, and what to
    do about it: load it once online, or give local files."""
    from finetune.data import load_raw
    from finetune.errors import UserError

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match=r"^could not load data from glue: .*; HF_DATASETS_OFFLINE is set \(no "
                                        r"downloads\): load it once while online .* or give local files: train_file=") as raised:
        load_raw({}, "glue", "sst2", None)
    assert raised.value.rule == "files.hub_offline"


def test_a_label_column_of_one_class_a_sample_trains_with_one_warning(tmp_path, capsys):
    """Ids as labels, with a validation file (no split to fail): 12 classes for 12 samples is said."""
    from finetune.config import load_config
    from finetune.data import load_splits

    train = write_csv(tmp_path / "t.csv", [{"text": f"sample {i}", "label": f"row-{i}"} for i in range(12)])
    validation = write_csv(tmp_path / "v.csv", [{"text": "other", "label": "row-1"}])
    cfg = load_config(None, [f"train_file={train}", f"validation_file={validation}", "test_file=null",
                             "label_names=null", "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
    load_splits(cfg.data_args, said := checks.Said())
    assert "labels.a_class_a_sample" in said.rules()
    assert "label column 'label' holds 12 classes for 12 training samples, most with one sample each" in \
        capsys.readouterr().err  # fmt: skip


def test_a_class_folder_beside_the_split_folders_is_refused_from_the_command(tmp_path):
    """train/ with cat/ and dog/, and bird/ beside train/: the loader reads the split folders alone, so the
    birds would be left out without a word; the line names the folder and where to move it (through
    load_splits: the folder's own line, not wrapped in the loader's)."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"],
                                              "__MACOSX": ["train"]})  # a zip's  # fmt: skip
    cfg = load_config("finetune/configs/vit_imagefolder.yaml", [f"data_dir={folder}"])
    assert load_splits(cfg.data_args)[1] == ["cat", "dog"]  # macOS' AppleDouble folder is no one's images
    class_folders(folder, {"bird": ["x"]})
    with pytest.raises(UserError, match=rf"^{folder / 'bird'} holds images beside the split folders of {folder} "
                                        r"\(train, validation\): .* move bird/ into train/ \(as a class\) or out") as raised:  # fmt: skip
        load_splits(cfg.data_args)
    assert raised.value.rule == "images.images_beside_split_folders"


def test_a_run_folder_inside_an_image_folder_is_named(tmp_path):
    """A run written inside train/ (an output_dir there, from before that was refused): its folder would be
    read as a class whose one image is its training curves."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    run = folder / "train" / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("task: image-classification\n")
    with pytest.raises(UserError, match="train/run is a run's output folder inside the image folder") as e:
        _check_image_folder(folder)
    assert e.value.rule == "images.run_inside_the_folder"


def test_a_csv_without_its_header_row_is_named_as_such(tmp_path):
    """The first row read as the header: 'neg' a column's name and its values; the line says the file's
    first line should name the columns, not which setting to change."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    train = tmp_path / "train.csv"
    train.write_text("poorly made,neg\ngreat fun,pos\nbad film,neg\nfine work,pos\n")
    with pytest.raises(UserError, match=r"column 'label' not found in the train data; columns are: poorly made, neg; "
                                        r"the first row looks like data, not a header \('neg' is also a value") as raised:  # fmt: skip
        load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r")))
    assert raised.value.rule == "columns.no_header"


def test_a_file_with_neither_default_column_names_its_labels_and_texts(tmp_path):
    """review,sentiment where the run reads text,label: the line says which column reads as the labels (few
    values, repeated) and which as the texts (the longest), with both settings."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    rows = [{"review": f"a {'dull' if i % 2 else 'fine'} film, scene {i}", "sentiment": ["pos", "neg"][i % 2]}
            for i in range(12)]  # fmt: skip
    train = write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(UserError, match=r"^column 'label' not found in the train data; columns are: review, sentiment; "
                                        r"if 'sentiment' holds the labels and 'review' the texts, set text_column=review "
                                        r"label_column=sentiment$") as raised:  # fmt: skip
        load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r")))
    assert raised.value.rule == "columns.labels_and_texts_named_otherwise"


def test_a_url_as_a_data_file_is_named_as_a_url():
    """Not "not found (read from the current folder)": files are read from this machine."""
    from finetune.data import load_raw
    from finetune.errors import UserError

    with pytest.raises(UserError, match=r"^train file https://example.com/t.csv is a URL; .* download it first") as raised:
        load_raw({"train": "https://example.com/t.csv"}, None, None, None)
    assert raised.value.rule == "files.url"


def test_a_json_lines_line_that_is_an_array_is_the_line_named(tmp_path):
    """Valid JSON but no record (line 3 an array): that line, not "line 2: extra data"."""
    from finetune.data import load_raw
    from finetune.errors import UserError

    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n["c", "x"]\n{"text": "d", "label": "y"}\n')
    with pytest.raises(UserError, match=r"line 3 holds an array, not a record: each line of JSON Lines is one") as raised:
        load_raw({"train": str(path)}, None, None, None)
    assert raised.value.rule == "files.json_line_not_a_record"


def test_a_validation_file_with_other_column_names_than_train_says_to_align_them(tmp_path):
    """label_column=sentiment would fix validation and break train: the line says the splits differ."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    train, validation = tmp_path / "train.csv", tmp_path / "validation.csv"
    train.write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(8)))
    validation.write_text("review,sentiment\n" + "".join(f"r{i},{'ab'[i % 2]}\n" for i in range(4)))
    with pytest.raises(UserError, match=r"not found in the validation data; columns are: review, sentiment; the train "
                                        r"data has '(text|label)' .* give every split the same column names") as raised:  # fmt: skip
        load_splits(load_config(None, tiny_text_args({"train": train, "validation": validation}, tmp_path / "r")))
    assert raised.value.rule == "columns.another_name_than_train"
    # only the text column renamed, or in another case: text_column=sentence (or =Text) would fit validation and
    # break train, so not offered
    for header in ("sentence,label", "Text,label"):
        validation.write_text(f"{header}\n" + "".join(f"r{i},{'ab'[i % 2]}\n" for i in range(4)))
        with pytest.raises(UserError, match=r"the train data has 'text' .* give every split the same column names$") as e:
            load_splits(load_config(None, tiny_text_args({"train": train, "validation": validation}, tmp_path / "r")))
        assert e.value.rule == "columns.another_name_than_train"


def test_a_label_with_a_line_break_is_named_with_its_row(tmp_path):
    """A quote left open: the label runs on into the next line ('pos\\nx'), a class of its own otherwise."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    train = tmp_path / "train.csv"
    train.write_text('text,label\na,pos\nb,neg\nc,"pos\nx"\nd,neg\ne,pos\n')
    with pytest.raises(UserError, match=r"holds a label with a line break \('pos\\nx' at row 3\): a quote left open") as raised:
        load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r")))
    assert raised.value.rule == "labels.line_break_in_a_label"


def test_texts_that_each_appear_with_two_labels_are_warned_of(tmp_path, capsys):
    """A text or two with two labels (noisy labels) is said, and the run goes on; a class whose every text is
    also another class's is refused (splits.class_within_another), as an image folder copied into another is."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"t{i},neg\nt{i},pos\n" for i in range(6)) + "u,pos\n")
    with pytest.raises(UserError, match="all 6 training samples \\(the same text\\) of class 'neg' are also in "
                                        "class 'pos'") as refused:  # fmt: skip
        load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r")))
    assert refused.value.rule == "splits.class_within_another"
    train.write_text("text,label\n" + "".join(f"t{i},neg\nt{i},pos\n" for i in range(6)) + "u,pos\nv,neg\n")
    load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r")), said := checks.Said())
    assert "splits.one_sample_two_labels" in said.rules()
    assert "6 of the 8 distinct training texts appear with different labels" in capsys.readouterr().err
    # one text of many with two labels: said too, with the text and its labels
    train.write_text("text,label\n" + "".join(f"t{i},{'neg' if i % 2 else 'pos'}\n" for i in range(20)) + "t3,pos\n")
    load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r")))
    assert "1 of the 20 distinct training texts appear with different labels (the same text once as one class and " \
           "once as another, e.g. 't3': neg and pos)" in capsys.readouterr().err


def test_pairs_whose_second_sentence_is_the_first_are_warned_of(tmp_path, capsys):
    """text_pair_column=text is refused; a file whose two columns hold the same sentences means the same."""
    from finetune.config import load_config
    from finetune.data import load_splits

    train = tmp_path / "pairs.csv"
    train.write_text("s1,s2,label\n" + "".join(f"t{i},t{i},{'ab'[i % 2]}\n" for i in range(10)))
    load_splits(load_config(None, tiny_text_args({"train": train, "validation": train}, tmp_path / "r",
                                                 "text_column=s1", "text_pair_column=s2")), said := checks.Said())  # fmt: skip
    assert "splits.pair_of_one_text" in said.rules()
    assert "10 of the 10 training pairs have the same text in s1 and s2: each sentence would be paired with " \
           "itself; check text_pair_column" in capsys.readouterr().err


def test_images_copied_into_two_class_folders_are_warned_of(tmp_path, capsys):
    """The same image bytes in cat/ and in dog/: every image two answers, refused (as a text file whose class is
    all another's is); a class's images saved twice in its own folder: the share held out for validation is
    copies of training images, said; two of eight images in both folders: the two answers said."""
    from conftest import drawn_images, tiny_image_args

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    shades = [(30 * i, 10 * i, 0) for i in range(8)]
    folder = drawn_images(tmp_path / "img", {"cat": shades, "dog": shades}, size=(8, 8))
    with pytest.raises(UserError, match="all 8 training images \\(the same bytes\\) of class 'cat' are also") as e:
        load_splits(load_config(None, tiny_image_args(folder, tmp_path / "r")))
    assert e.value.rule == "splits.class_within_another"
    twice = drawn_images(tmp_path / "twice", {"cat": shades * 2, "dog": [(0, 9 * i, 200) for i in range(8)] * 2},
                         size=(8, 8))  # fmt: skip
    load_splits(load_config(None, tiny_image_args(twice, tmp_path / "r")))
    err = capsys.readouterr().err
    assert "validation samples held out of the training folder are also training samples (the folder repeats" in err
    # two of eight copied: the two answers still said
    other = drawn_images(tmp_path / "img2", {"cat": shades, "dog": shades[:2] + [(0, 9 * i, 200) for i in range(6)]},
                         size=(8, 8))  # fmt: skip
    load_splits(load_config(None, tiny_image_args(other, tmp_path / "r2")))
    assert "2 of the 14 distinct training images (the same bytes) appear with different labels" in capsys.readouterr().err


def test_json_lines_with_a_comma_after_each_record_says_so(tmp_path):
    from finetune.data import load_raw
    from finetune.errors import UserError

    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"text": "t{i}", "label": "{"ab"[i % 2]}"}},\n' for i in range(6)))
    with pytest.raises(UserError, match=r"its lines end with a comma after each record .*remove the commas") as raised:
        load_raw({"train": str(path)}, None, None, None)
    assert raised.value.rule == "files.jsonl_commas"


@pytest.mark.parametrize("comment", ["// exported 2026-11-27", "/* reviews */", "# reviews"])
def test_a_json_file_with_a_comment_line_names_the_comment(tmp_path, comment):
    """A JSON array (or JSON Lines) with a comment line, as JSON5 and hand-edited files have: the line says
    the comment, not "remove the commas" of records written one a line."""
    from finetune.data import load_raw
    from finetune.errors import UserError

    records = [f'  {{"text": "t{i}", "label": "{"ab"[i % 2]}"}}' for i in range(6)]
    path = tmp_path / "t.json"
    path.write_text("[\n" + comment + "\n" + ",\n".join(records) + "\n]\n")
    with pytest.raises(UserError, match=rf"line 2 is a comment \('{re.escape(comment[:2])}.*\), which JSON does not "
                                        r"allow: remove the comment lines$") as raised:  # fmt: skip
        load_raw({"train": str(path)}, None, None, None)
    assert raised.value.rule == "files.json_comment"


def test_a_validation_share_written_as_a_fraction_is_read_as_the_percentage_it_is(tmp_path):
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(20)))
    args = tiny_text_args({"train": train, "validation": train}, tmp_path / "r", "validation_file=null",
                          "validation_split_percentage=0.5")  # fmt: skip
    with pytest.raises(UserError, match=r"validation_split_percentage=0.5 is a percentage: it holds out 0.5% of the "
                                        r"samples; for half of them write 50") as raised:  # fmt: skip
        load_splits(load_config(None, args))
    assert raised.value.rule == "splits.share_as_a_fraction"


def test_a_tokenized_split_is_cached_under_what_makes_it_and_nothing_else(tmp_path):
    """The same file, settings and tokenizer find datasets' cache (a second run tokenizes nothing); a
    change to max_length or to the tokenizer (a token added) makes another key, and the result differs."""
    from datasets import load_dataset

    from finetune.config import load_config
    from finetune.models import load_preprocessor
    from finetune.tasks import task_of, tokenized_fingerprint

    path = write_csv(tmp_path / "train.csv", rotten_rows(20))
    task = task_of("text-classification")

    def prepared(*overrides, add=None):
        cfg = load_config(None, [f"train_file={path}", *overrides])
        ds = load_dataset("csv", data_files={"train": str(path)}, cache_dir=str(tmp_path / "cache"))["train"]
        tokenizer = load_preprocessor(cfg.model_args)
        if add:
            tokenizer.add_tokens([add])
        return task.prepare(ds, tokenizer, cfg.data_args, "train", 3)

    first, again = prepared(), prepared()
    assert again._fingerprint == first._fingerprint and again.cache_files == first.cache_files
    shorter = prepared("max_length=8")
    assert shorter._fingerprint != first._fingerprint and max(shorter["length"]) == 8 < max(first["length"])
    tokenizer = load_preprocessor(load_config(None, []).model_args)
    word = next(w for row in rotten_rows(20) for w in row["text"].split() if len(tokenizer.tokenize(w)) > 2)
    added = prepared(add=word)  # a word of several pieces becomes one token
    assert added._fingerprint != first._fingerprint and added["input_ids"] != first["input_ids"]
    assert tokenized_fingerprint(first, lambda batch: batch) is None  # no tokenizer: datasets' own hashing
    # what a call left set (truncation, padding) is state, not what the tokenizer does: the same name
    from finetune.tasks import _serialized

    fresh = _serialized(load_preprocessor(load_config(None, []).model_args))
    tokenizer(["a text"], truncation=True, max_length=5, padding="max_length")
    assert _serialized(tokenizer) == fresh and isinstance(fresh, tuple)  # the quick form: no parse of the vocabulary


def test_a_training_file_that_repeats_its_rows_warns_that_the_held_out_share_was_trained_on(tmp_path, capsys):
    rows = rotten_rows(30)
    data = {"train": write_csv(tmp_path / "twice.csv", rows + rows), "validation": None}
    main(tiny_text_args(data, tmp_path / "run", "validation_file=null", "max_steps=1"))
    err = capsys.readouterr().err
    assert re.search(r"warning: (\d+) of the \1 validation samples held out of the training file are also training "
                     r"samples \(the file repeats them", err), err
    main(tiny_text_args({"train": write_csv(tmp_path / "once.csv", rows), "validation": None}, tmp_path / "run2",
                        "validation_file=null", "max_steps=1"))  # fmt: skip
    assert "held out of the training file are also" not in capsys.readouterr().err


def test_punctuation_twins_leave_numbers_and_other_symbols_alone():
    from finetune.checks.labels import punctuation_twins

    assert punctuation_twins(["neg", "neg.", "pos"]) == ("neg", "neg.")
    assert punctuation_twins(["1.5", "15", "2"]) is None  # two numbers
    assert punctuation_twins(["C", "C#", "C++"]) is None  # other symbols name other classes
    assert punctuation_twins(["neg", "neg."], allowed=["neg", "neg."]) is None  # both listed: the user's own


def test_a_rare_class_one_slip_from_a_common_one_is_said(tmp_path, capsys):
    """'positve' once beside 'positive' 40 times: a warning naming both (a class of its own would never be
    learned); where a stratified split cannot hold it, the refusal says the same. Two classes that label_names
    lists are left alone, and so are two common ones."""
    rows = [{"text": f"sentence {i}", "label": ["negative", "positive"][i % 2]} for i in range(80)]
    typo = [*rows, {"text": "one more", "label": "positve"}]
    val = write_csv(tmp_path / "v.csv", rows[:20])
    results = main(recipe_text_args({"train": write_csv(tmp_path / "t.csv", typo), "validation": val}, tmp_path / "a",
                                    "max_steps=1"))  # fmt: skip
    assert "labels.misspelt_class" in [w["rule"] for w in results["warnings"]]
    err = capsys.readouterr().err
    assert "holds 'positve' (1 sample) beside 'positive' (40): a misspelling? fix the label in the data" in err
    user_error(capsys, main, recipe_text_args({"train": tmp_path / "t.csv", "validation": val}, tmp_path / "b",
                                              "validation_file=null"),  # fmt: skip
               "('positve' (1 sample) beside 'positive' (40): a misspelling? fix that label in the data)", rule="splits.a_misspelt_class")
    main(recipe_text_args({"train": tmp_path / "t.csv", "validation": val}, tmp_path / "c", "max_steps=1",
                          "label_names=[negative,positive,positve]"))  # fmt: skip
    assert "misspelling" not in capsys.readouterr().err


@pytest.mark.parametrize("rare, common", [("pso", "pos"), ("psoitive", "positive"), ("B", "A")])
def test_a_rare_class_one_keystroke_from_a_short_common_one_is_said(rare, common, tmp_path, capsys):
    """Two neighbours swapped ('pso' for 'pos') is one slip too, though difflib's ratio of short names falls
    below its cutoff; names of fewer than 3 letters are left alone (every two are one letter apart)."""
    rows = [{"text": f"sentence {i}", "label": [common, "other"][i % 2]} for i in range(80)]
    said = checks.Said(quiet=True)
    cfg = load_config(None, [f"train_file={write_csv(tmp_path / 't.csv', [*rows, {'text': 'x', 'label': rare}])}",
                             f"validation_file={write_csv(tmp_path / 'v.csv', rows[:20])}", "test_file=null",
                             "label_names=null"])  # fmt: skip
    load_splits(cfg.data_args, said)
    assert ("labels.misspelt_class" in said.rules()) == (len(rare) >= 3)


@pytest.mark.parametrize("recipe", [None, "finetune/configs/vit_fashion_mnist.yaml"])
def test_images_as_pixel_columns_are_named_as_such(recipe, tmp_path, capsys):
    """Kaggle's Fashion-MNIST CSV (label, pixel1 ... pixel784), given to a text or an image recipe: one line
    that names the layout and says how this app reads images, not 785 columns or "set task=..."."""
    path = tmp_path / "fm.csv"
    path.write_text("label," + ",".join(f"pixel{i}" for i in range(1, 785)) + "\n"
                    + "".join(f"{r % 3}," + ",".join(["0"] * 784) + "\n" for r in range(12)))  # fmt: skip
    args = [*(["--config", str(REPO / recipe), "data_dir=null"] if recipe else []), f"train_file={path}",
            f"output_dir={tmp_path / 'o'}"]  # fmt: skip
    line = user_error(capsys, main, args, "holds images as 784 pixel columns (pixel1 ... pixel784)", "data_dir", rule="columns.pixel_columns")
    assert len(line) < 400


def test_round_19s_data_mistakes_get_their_own_fix(small_text_data, tmp_path, capsys):
    """Two files joined with a comma (the Hub's data_files habit), a glob the shell left alone, a data file
    with no key, a model's config.json as the recipe, and a test file without labels (to predict on)."""
    train = small_text_data["train"]
    joined = f"{train},{small_text_data['validation']}"
    base = [a for a in recipe_text_args(small_text_data, tmp_path / "run") if not a.startswith("train_file=")]
    user_error(capsys, main, [*base, f"train_file={joined}"], "names 2 files; a split is one file: join them",
               rule="files.several_files")
    user_error(capsys, main, [*base, f"train_file={train.parent / '*.csv'}"], "is a pattern; a split is one file",
               rule="files.pattern")
    user_error(capsys, main, [*base, str(train)], f"is a file given without a key: name its split, train_file={train}",
               rule="settings.file_without_key")
    user_error(capsys, main, [*base, f"train_file={train}", "--config", str(REPO / "data/bert_minilm_l6_uncased/config.json")],
               "that file is a model's config.json, not a recipe; give the model as model_name_or_path=",
               rule="settings.model_config_json")  # fmt: skip
    unlabelled = write_csv(tmp_path / "unlabelled.csv", [{"text": "a film"}, {"text": "another"}], ["text"])
    user_error(capsys, main, [*base, f"train_file={train}", f"test_file={unlabelled}"],
               "the test split is scored, so it needs its labels; to predict on a file without them: "
               "finetune/evaluate_checkpoint.py", rule="columns.scored_split_without_labels")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_column_of_image_paths_is_named_for_images_and_warned_of_as_text(small_text_data, tmp_path, capsys):
    """A CSV of image paths (filepath, class): given to an image recipe without image_column, the line names
    the column of paths; given to a text recipe, it trains (the names are text) with one warning."""
    from conftest import TINY_VIT
    from PIL import Image

    rows = []
    for i in range(12):
        path = tmp_path / "pics" / ["cat", "dog"][i % 2] / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i * 20, 0, 0)).save(path)
        rows.append({"filepath": str(path), "label": ["cat", "dog"][i % 2]})
    data = write_csv(tmp_path / "paths.csv", rows)
    user_error(capsys, main, ["--config", str(REPO / "finetune/configs/vit_imagefolder.yaml"), f"model_config={TINY_VIT}",
                              "data_dir=null", f"train_file={data}", f"output_dir={tmp_path / 'i'}"],
               "but 'filepath' holds images: set image_column=filepath")  # fmt: skip
    results = main(tiny_text_args({"train": data, "validation": data}, tmp_path / "t", "text_column=filepath",
                                  "max_steps=1"))  # fmt: skip
    assert "warning: column 'filepath' holds image file paths" in capsys.readouterr().err
    assert "columns.image_paths_as_text" in [w["rule"] for w in results["warnings"]]
    # a text run that does not name the column of paths is told to train an image model on them
    user_error(capsys, main, tiny_text_args({"train": data, "validation": data}, tmp_path / "n"),
               "'filepath' holds image file paths", f"vit_imagefolder.yaml train_file={data} image_column=filepath",
               rule="columns.image_paths_for_a_text_model")  # fmt: skip


def test_a_nested_field_named_with_a_dot_is_pointed_to_flattening(tmp_path):
    """text_column=data.text for {"data": {"text": ...}}: the dotted name is the flattened column's, which
    pandas' json_normalize makes; the nested field itself is not read."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "nested.jsonl"
    path.write_text("".join(f'{{"data": {{"text": "t{i}"}}, "label": {i % 2}}}\n' for i in range(6)))
    args = [f"train_file={path}", f"validation_file={path}", "test_file=null", "label_names=null",
            "max_train_samples=null", "max_eval_samples=null"]  # fmt: skip
    with pytest.raises(UserError, match=r"'data' holds fields \(text\), and nested fields are not read: flatten") as raised:
        load_splits(load_config(None, [*args, "text_column=data.text"]).data_args)
    assert raised.value.rule == "columns.nested_field"
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(f'{{"data.text": "t{i}", "label": {i % 2}}}\n' for i in range(6)))
    raw, _ = load_splits(load_config(None, [*args, f"train_file={flat}", f"validation_file={flat}",
                                            "text_column=data.text"]).data_args)  # fmt: skip
    assert raw["train"]["data.text"][:2] == ["t0", "t1"]


def test_parquet_decimals_are_read_as_numbers(tmp_path):
    """A parquet column of exact decimals (a database's NUMERIC, pandas' Decimal) is a regression target,
    not an unknown type."""
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    from finetune.config import load_config
    from finetune.data import load_splits

    path = tmp_path / "train.parquet"
    scores = [decimal.Decimal(f"{i % 5}.{i % 10}") for i in range(20)]
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(20)], "score": pa.array(scores, pa.decimal128(5, 2))}),
                   path)  # fmt: skip
    cfg = load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                             "label_column=score", "max_train_samples=null", "max_eval_samples=null"])  # fmt: skip
    raw, _ = load_splits(cfg.data_args)
    assert raw["train"].features["labels"].dtype.startswith("float")
    assert max([*raw["train"]["labels"], *raw["validation"]["labels"]]) == pytest.approx(4.9)


@pytest.mark.parametrize(
    ("recipe", "column", "entities", "rule"),
    [
        ("finetune/configs/bert_ner.yaml", "entities", [[0, 3, "PER"], [12, 18, "LOC"]],
         "columns.character_spans"),  # spaCy's tuples
        ("finetune/configs/bert_ner.yaml", "spans", [{"start": 0, "end": 3, "label": "PER"}],
         "columns.character_spans"),  # Label Studio's
        ("finetune/configs/bert_multi_label.yaml", "entities", [[0, 3, "PER"]],
         "labels.spans_as_labels"),  # read as lists of labels
        ("finetune/configs/bert_ner.yaml", "tokens", [{"text": "Ada", "start": 0, "end": 3, "id": 0}],
         "columns.character_spans"),  # Prodigy's
    ],
)  # fmt: skip
def test_entities_as_character_spans_are_named_with_the_conversion(tmp_path, recipe, column, entities, rule):
    """Entities as character offsets, where a tag for each word is read (or, under a multi-label recipe,
    lists of label names): one line naming the spans and how to turn them into words and IOB2 tags."""
    import json

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"text": f"Ada went to London {i}", column: entities}) + "\n" for i in range(8)))
    tagging = "ner" in recipe  # the tagging recipe reads tokens and ner_tags, no label_column
    cfg = load_config(recipe, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                               *([] if tagging else [f"label_column={column}"]), "max_train_samples=null",
                               "max_eval_samples=null"])  # fmt: skip
    with pytest.raises(UserError, match=rf"^column '{column}' of the train data holds (entities as character spans|"
                                        r"tokens as records of their text and character offsets) .*"
                                        r"offsets_to_biluo_tags, then biluo_to_iob\)$") as raised:  # fmt: skip
        load_splits(cfg.data_args)
    assert raised.value.rule == rule


@pytest.mark.parametrize(("recipe", "rule"), [("finetune/configs/bert_ner.yaml", "columns.tags_joined_in_a_cell"),
                                              ("finetune/configs/bert_custom_files.yaml", "labels.tags_joined_as_a_class")])  # fmt: skip
def test_tags_joined_by_spaces_in_one_cell_are_named_as_tagging_data(tmp_path, recipe, rule):
    """Kaggle's NER CSV by sentence ("O B-geo O" a row): under the tagging recipe the words and tags are not
    lists; under a classifier each joined string would be a class. Both: one line, how to make the lists."""
    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "ner.csv"
    path.write_text("Sentence,Tag\n" + "Ada went to London,B-per O O B-geo\nThe UN met,O B-org O\n" * 6)
    keys = [] if "ner" in recipe else ["text_column=Sentence", "label_column=Tag"]
    cfg = load_config(recipe, [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
                               "max_train_samples=null", "max_eval_samples=null", *keys])  # fmt: skip
    with pytest.raises(UserError, match=r"^column 'Tag' of the train data holds tags joined by spaces in one string a "
                                        r"row \('B-per O O B-geo'\): tagging data; .*bert_ner.yaml$") as raised:  # fmt: skip
        load_splits(cfg.data_args)
    assert raised.value.rule == rule


def test_a_parquet_of_images_under_other_column_names_gets_both_settings(tmp_path):
    """The Hub's CIFAR-100 as parquet (img, fine_label, coarse_label) with an image recipe: the line names
    the image column and the candidates for the labels, not text classification."""
    import PIL.Image
    from datasets import ClassLabel, Dataset, Features, Value
    from datasets import Image as ImageFeature

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.errors import UserError

    path = tmp_path / "cifar.parquet"
    images = [PIL.Image.new("RGB", (8, 8), (20 * i, 0, 0)) for i in range(8)]
    features = Features({"img": ImageFeature(), "fine_label": ClassLabel(names=["apple", "fish"]),
                         "coarse_label": Value("int64")})  # fmt: skip
    Dataset.from_dict({"img": images, "fine_label": [i % 2 for i in range(8)], "coarse_label": [0] * 8},
                      features=features).to_parquet(str(path))  # fmt: skip
    cfg = load_config("finetune/configs/vit_imagefolder.yaml", [f"train_file={path}", "data_dir=null"])
    with pytest.raises(UserError, match=r"^column 'label' not found in the train data, but 'img' holds images: set "
                                        r"image_column=img label_column=<one of fine_label, coarse_label>$"):  # fmt: skip
        load_splits(cfg.data_args)


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_rows_joined_by_a_quote_never_closed_are_one_warning(tmp_path, capsys, suffix, sep):
    """A tweet that starts with a quote it never closes: the reader joins the rows after it into that text
    until another quote, and they are lost as samples; one warning names the row. Texts with line breaks of
    their own say nothing."""
    from finetune.config import load_config
    from finetune.data import load_splits

    texts = [f"tweet {i} is fine" for i in range(40)]
    texts[5], texts[25] = '"wow a quote that never ends', 'it ends" here'
    texts[2] = '"a text its writer quoted"'  # in a .tsv, what shows that quotes are quoting (below)
    path = tmp_path / f"train{suffix}"
    path.write_text(f"text{sep}label\n" + "".join(f"{t}{sep}{['neg', 'pos'][i % 2]}\n" for i, t in enumerate(texts)))
    args = [f"train_file={path}", "validation_file=null", "test_file=null", "label_names=null",
            "max_train_samples=null", "max_eval_samples=null"]  # fmt: skip
    load_splits(load_config(None, args).data_args, rules := checks.Said())
    said = [line for line in capsys.readouterr().err.splitlines() if "never closed" in line]
    assert len(said) == 1 and said[0].startswith("warning: row 6 of the training data holds 20 lines that end like")
    assert "columns.rows_merged_by_a_quote" in rules.rules()
    quoted = tmp_path / "quoted.csv"  # a real text with line breaks in it
    quoted.write_text("text,label\n" + "".join(f'"line one {i}\nline two, still text",{["neg", "pos"][i % 2]}\n'
                                               for i in range(20)))  # fmt: skip
    load_splits(load_config(None, [*args, f"train_file={quoted}"]).data_args)
    assert "never closed" not in capsys.readouterr().err


def test_a_tsv_written_without_quoting_keeps_its_quotes_as_text(tmp_path):
    """GLUE's TSVs are written without quoting: `5" screen`, a text that starts with a quote, `"Bad" is ...`
    are texts as they stand, every line a row, and no warning. A TSV whose writer quotes (pandas: a field in
    quotes, its own quotes doubled) is read with its quoting."""
    texts = [f"review {i}" + ('"' if i % 10 == 0 else "") for i in range(60)]
    texts[5], texts[7], texts[9] = 'a 5" screen', '"Bad" is an understatement', '"opens and never closes'
    glue = tmp_path / "glue.tsv"
    glue.write_text("text\tlabel\n" + "".join(f"{t}\t{['neg', 'pos'][i % 2]}\n" for i, t in enumerate(texts)))
    pandas = tmp_path / "pandas.tsv"
    pandas.write_text("text\tlabel\n" + "".join(f'"{t.replace(chr(34), chr(34) * 2)}"\t{["neg", "pos"][i % 2]}\n'
                                                for i, t in enumerate(texts)))  # fmt: skip
    for path in (glue, pandas):
        said = checks.Said(quiet=True)
        raw, _ = load_splits(load_config(None, [f"train_file={path}", "validation_file=null", "test_file=null",
                                                "label_names=null", "max_train_samples=null"]).data_args, said)  # fmt: skip
        assert sorted([*raw["train"]["text"], *raw["validation"]["text"]]) == sorted(texts) and said.lines == [], path


def _check_image_folder(folder) -> None:
    """The image folder's own rules, as finetune/data.py asks them before datasets' loader reads the folder."""
    from finetune.checks import images
    from finetune.data import _a_run

    checks.gate(images.FOLDER, folder, _a_run, said=checks.Said())


def test_an_arrow_file_of_a_saved_dataset_is_data(tmp_path):
    """The .arrow file of a folder that datasets' save_to_disk wrote trains as any data file."""
    from datasets import Dataset

    rows = [{"text": f"sentence {i}", "label": ["neg", "pos"][i % 2]} for i in range(20)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    raw, names = load_splits(load_config(None, [f"train_file={arrow}", "validation_file=null", "test_file=null",
                                                "label_names=null"]).data_args, checks.Said(quiet=True))  # fmt: skip
    assert names == ["neg", "pos"] and len(raw["train"]) + len(raw["validation"]) == 20


def _joined_split(folder, second_header: str):
    """A folder whose train split is two CSV files (datasets joins them), the second under `second_header`."""
    (folder / "train").mkdir(parents=True)
    write_csv(folder / "train" / "a.csv", rotten_rows(20))
    rows = "".join(f'"{r["text"]}",{r["label"]}\n' for r in rotten_rows(20, start=20))
    (folder / "train" / "b.csv").write_text(f"{second_header}\n{rows}")
    write_csv(folder / "validation.csv", rotten_rows(13, start=100))
    return folder


@pytest.mark.parametrize("streamed", [False, True])
def test_files_of_one_split_with_other_columns_are_one_line(streamed, tmp_path, capsys):
    """train/a.csv (text, label) and train/b.csv (review, sentiment), one split: datasets would join them (loaded,
    its own cast error; streamed, b's rows without a text or label). Refused before either is read, by the
    files' headers, in both modes."""
    folder = _joined_split(tmp_path / "reviews", "review,sentiment")
    base = [a for a in tiny_text_args({"train": "x", "validation": "x"}, tmp_path / "run")
            if not a.startswith(("train_file=", "validation_file="))] + ["train_file=null", "validation_file=null"]
    source = ([f"dataset_name={folder}", "streaming=true", "max_steps=2"] if streamed else
              ["dataset_name=csv", f"data_dir={folder}"])  # fmt: skip
    user_error(capsys, main, [*base, *source], "the train files have other columns", "b.csv has review, sentiment",
               rule="files.split_files_of_other_columns", untouched=tmp_path / "run")


def test_files_of_one_split_alike_and_every_bundled_data_set_raise_no_alarm(tmp_path):
    """No false alarm: the columns of one split's files in another order, every bundled data set's folder (data/
    and ../shared/data/), and each bundled table file cut in two files of one split."""
    import pyarrow.parquet as pq

    from finetune.data import check_split_files, file_columns

    check_split_files(str(_joined_split(tmp_path / "reordered", "label,text")))  # by name, in any order: alike
    bundled = [p for root in (REPO / "data", REPO.parent / "shared" / "data") if root.is_dir()
               for p in sorted(root.iterdir()) if p.is_dir()]  # fmt: skip
    tables = [f for folder in bundled for f in sorted(folder.rglob("*"))
              if f.suffix in (".csv", ".tsv", ".jsonl", ".parquet")]  # fmt: skip
    assert len(bundled) >= 6 and len(tables) >= 6, (bundled, tables)
    alarms = []
    for n, table in enumerate(tables):
        halves = tmp_path / f"halves{n}" / "train"
        halves.mkdir(parents=True)
        if table.suffix == ".parquet":  # the schema, two row groups' worth: no image decoded
            whole = pq.ParquetFile(table)
            pq.write_table(whole.read_row_group(0), halves / f"a{table.suffix}")
            pq.write_table(whole.read_row_group(whole.num_row_groups - 1), halves / f"b{table.suffix}")
        else:
            head, *lines = table.read_text(encoding="utf-8").splitlines(keepends=True)
            header = [] if table.suffix == ".jsonl" else [head]
            body = [head, *lines] if table.suffix == ".jsonl" else lines
            (halves / f"a{table.suffix}").write_text("".join(header + body[: len(body) // 2]), encoding="utf-8")
            (halves / f"b{table.suffix}").write_text("".join(header + body[len(body) // 2 :]), encoding="utf-8")
        assert file_columns(str(halves / f"a{table.suffix}")), table
    for folder in (*bundled, *sorted(tmp_path.glob("halves*"))):
        try:
            check_split_files(str(folder))
        except UserError as e:
            alarms.append((folder, str(e)))
    assert alarms == [], alarms
