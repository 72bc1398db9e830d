"""The catalogue of bad inputs: every mistake a user makes gets one line naming the problem and what to
do, exit status 2, no traceback, and the files of an earlier finished run (and the user's own files)
keep their bytes.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_bad_input.py

Every case goes through one assertion of that rule: `conftest.user_error` (the entry point's `main`
in-process) or `conftest.user_error_from_command` (the real command, to show no traceback). The
earlier run is one finished tiny run of the session's factory (`finished_run`), copied once for the
module (`world.done`, which the refusals aim at, told to overwrite it so that the mistake under test
is what stops them) and once more for each case that damages or replaces it (`copy`). The sections:
data files, columns and labels, images, models, settings, recipes and the command line (`CASES`, one
test, keyed `<rule id>:<case>`: the rule of finetune/checks/ that refuses it); the output directory; damaged checkpoints; unreadable files and full disks; the launcher and
the environment; model parallelism that cannot run.
"""

from __future__ import annotations

import csv
import errno
import gzip
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    DATA,
    EARLIER_RUN,
    REPO,
    TINY_BERT,
    TINY_VIT,
    TOKENIZER,
    image_folder,
    one_error_line,
    recipe_text_args,
    rotten_rows,
    save_tiny_bert,
    tiny_text_args,
    user_error,
    user_error_from_command,
    write_csv,
)
from PIL import Image

import finetune.export as export
import finetune.run as run
from finetune import checkpoint as ckpt
from finetune.config import CONFIGS_DIR
from finetune.evaluate_checkpoint import main as evaluate_main
from finetune.launch import main as launch_main
from finetune.run import main

IMAGEFOLDER = str(CONFIGS_DIR / "vit_imagefolder.yaml")
LAST = "step-00000002"  # the earlier run's checkpoints: step-00000001 and step-00000002
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class World:
    root: Path
    done: Path  # the module's copy of the finished run: config, metrics, results, export, checkpoints 1 and 2
    train: Path
    validation: Path

    def __getattr__(self, name: str) -> Path:  # world.ragged -> root/ragged etc., made below
        return self.root / name


def _checkpoint_copy(w: World, name: str, edit: Callable[[Path], None]) -> Path:
    dest = w.root / "checkpoints" / name
    shutil.copytree(w.done / ckpt.CHECKPOINTS / "step-00000001", dest)
    edit(dest)
    return dest


def _edit_manifest(**changes) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        manifest = ckpt.read_manifest(path)
        manifest.update(changes)
        (path / ckpt.MANIFEST).write_text(json.dumps(manifest))

    return edit


class _RunsCode:
    """A pickle that calls a function when loaded: what a hostile checkpoint file would hold."""

    def __reduce__(self):
        return (Path.touch, (Path(_RunsCode.marker),))

    marker = ""


def _plant_code(file: str) -> Callable[[Path], None]:
    def plant(path: Path) -> None:
        _RunsCode.marker = str(path.parent / "code-ran")
        torch.save({"state": _RunsCode()}, path / file)

    return plant


@pytest.fixture(scope="module")
def world(finished_run, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("bad-input")
    data = finished_run.data("text")
    w = World(root, finished_run.copy(root / "done", *EARLIER_RUN), data["train"], data["validation"])
    rows = rotten_rows(37)

    # data files
    (root / "empty.csv").write_text("")
    (root / "header_only.csv").write_text("text,label\n")
    (root / "ragged_more.csv").write_text("text,label\na fine film,1\na dull film,0,extra\nok,1\n")
    (root / "ragged_fewer.csv").write_text("text,label\na fine film,1\na dull film\nok,0\n")
    (root / "null_text.csv").write_text("text,label\na fine film,1\n,0\nok,0\n")
    (root / "numeric_text.csv").write_text("text,label\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))
    write_csv(root / "single_class.csv", [r for r in rotten_rows(60) if r["label"] == "1"])
    write_csv(root / "unseen.csv", [*rotten_rows(6, start=100), {"text": "a third kind", "label": "2"}])
    (root / "broken.jsonl").write_text(  # the last line cut off inside a string (pyarrow fails, datasets logs)
        "".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in rotten_rows(39)) + '{"text": "a fi'
    )
    (root / "broken.json").write_text('[{"text": "a fine film", "label": 1}, {"text": ')
    (root / "train.docx").write_text("text,label\n")
    (root / "nested_label_lists.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": [["a"]] if i == 3 else ["a", "b"][: 1 + i % 2]}) + "\n"
                for i, r in enumerate(rows))
    )  # fmt: skip
    (root / "tabs.csv").write_text("text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows))
    (root / "train.csv.gz").write_bytes(gzip.compress((root / "ragged_more.csv").read_bytes()))
    (root / "dupkey.jsonl").write_text('{"text": "a fine film", "label": "1", "label": "0"}\n'
                                       + "".join(json.dumps(r) + "\n" for r in rows))
    (root / "relative_images.csv").write_text("image,label\nno/such/0.png,a\nno/such/1.png,b\n")
    write_csv(root / "decimals_and_a_nan.csv", [{"text": r["text"], "label": "NaN" if i == 7 else f"{i / 3:.3f}"}
                                                for i, r in enumerate(rows)])  # fmt: skip
    (root / "columns.json").write_text(json.dumps({"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]}))
    write_csv(root / "header_again.csv", [*rows[:5], {"text": "text", "label": "label"}, *rows[5:]])
    (root / "case_label_lists.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": ["Art" if i == 4 else "art", "film"]}) + "\n"
                for i, r in enumerate(rows))
    )  # fmt: skip
    (root / "pipes.csv").write_text("text|label\n" + "".join(f"{r['text']}|{r['label']}\n" for r in rows))
    write_csv(root / "spaced_header.csv", [{"text": r["text"], " label": r["label"]} for r in rows])
    (root / "nested_records.json").write_text(json.dumps({"data": rows}))
    frame = {"text": {str(i): r["text"] for i, r in enumerate(rows)}, "label": {str(i): r["label"] for i, r in enumerate(rows)}}
    (root / "pandas_columns.json").write_text(json.dumps(frame))  # DataFrame.to_json()'s default
    (root / "pandas_columns.jsonl").write_text(json.dumps(frame) + "\n")  # the same, named as JSON Lines
    (root / "pandas_index.json").write_text(json.dumps({str(i): r for i, r in enumerate(rows)}))
    (root / "pandas_split.json").write_text(json.dumps({"columns": ["text", "label"], "index": list(range(len(rows))),
                                                        "data": [[r["text"], r["label"]] for r in rows]}))  # fmt: skip
    (root / "pandas_table.json").write_text(json.dumps({"schema": {"fields": [{"name": "text"}, {"name": "label"}]},
                                                        "data": rows}))  # fmt: skip
    with zipfile.ZipFile(root / "train.xlsx", "w") as z:  # the parts of a workbook that name it one
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("xl/workbook.xml", "<workbook/>")
    with zipfile.ZipFile(root / "sheets.xlsx", "w") as z:  # a sheet alone: a workbook by its name and its part
        z.writestr("xl/worksheets/sheet1.xml", "<worksheet/>")
    (root / "text_as_images.csv").write_text("text,label\na fine film,1\na dull film,0\n")
    words = {"0": "neg", "1": "pos"}
    write_csv(root / "string_labels.csv", [{"text": r["text"], "label": words[r["label"]]} for r in rows])
    (root / "semicolon.csv").write_text("text;label\n" + "".join(f"{r['text']};{r['label']}\n" for r in rows))
    (root / "lists.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": [int(r["label"])]}) + "\n" for r in rows)
    )
    (root / "dicts.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": {"y": int(r["label"])}}) + "\n" for r in rows)
    )
    write_csv(root / "floats.csv", [{"text": r["text"], "label": 0.25 + 0.5 * int(r["label"])} for r in rows])
    (root / "empty_texts.jsonl").write_text(
        "".join(json.dumps({"text": "", "label": int(r["label"])}) + "\n" for r in rows)
    )
    write_csv(root / "blank_text.csv", [{**r, "text": "   " if i == 4 else r["text"]} for i, r in enumerate(rows)])
    write_csv(root / "empty_text_column.csv", [{**r, "text": ""} for r in rows])
    with (root / "repeated_column.csv").open("w", newline="") as f:  # datasets reads it as label, label.1
        csv.writer(f).writerows([["text", "label", "label"], *([r["text"], r["label"], r["label"]] for r in rows)])
    (root / "mixed_texts.jsonl").write_text(
        "".join(json.dumps({"text": 5 if i == 3 else r["text"], "label": r["label"]}) + "\n" for i, r in enumerate(rows))
    )
    (root / "mixed_labels.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": 1 if i == 5 else words[r["label"]]}) + "\n"
                for i, r in enumerate(rows))
    )  # fmt: skip
    write_csv(root / "csv_named.txt", rows)
    (root / "spaced_label_lists.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": ["a", "b " if i == 2 else "b"]}) + "\n"
                for i, r in enumerate(rows))
    )  # fmt: skip
    (root / "latin1.csv").write_bytes(
        ("text,label\n" + "".join(f"caf\xe9 {r['text']},{r['label']}\n" for r in rows)).encode("latin-1")
    )

    # recipes
    (root / "bad.yaml").write_text("learning_rate: 1e-4\n  per_device_train_batch_size: [8\n")
    (root / "list.yaml").write_text("- learning_rate\n- 1e-4\n")
    (root / "typo.yaml").write_text(
        (CONFIGS_DIR / "bert_rotten_tomatoes.yaml").read_text() + "num_train_epoch: 1\n"
    )
    (root / "recipe.yaml").write_text((CONFIGS_DIR / "bert_rotten_tomatoes.yaml").read_text())

    # images
    (root / "no_images" / "train" / "a").mkdir(parents=True)
    (root / "no_images" / "train" / "a" / "notes.txt").write_text("not an image")
    (root / "data_files").mkdir()
    (root / "data_files" / "train.csv").write_text("text,label\ngood,pos\nbad,neg\n")
    (root / "empty_dir").mkdir()
    image_folder(root / "images")
    (image_folder(root / "garbage") / "train" / "0_tshirt_top" / "3.png").write_bytes(b"not an image at all")
    sub = image_folder(root / "nested_images") / "train" / "1_trouser" / "sub"
    sub.mkdir()
    shutil.copy(sub.parent / "0.png", sub / "0.png")
    linked = image_folder(root / "linked_images") / "train" / "1_trouser"
    shutil.move(linked, root / "trousers_elsewhere")
    linked.symlink_to(root / "trousers_elsewhere", target_is_directory=True)
    dangling = image_folder(root / "dangling_images") / "train" / "1_trouser" / "gone.png"
    dangling.symlink_to(root / "no" / "such.png")
    loose = image_folder(root / "loose_images") / "train"
    shutil.copy(loose / "1_trouser" / "0.png", loose / "stray.png")
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    pngs = sorted((root / "images" / "train").glob("*/*.png"))
    Dataset.from_dict({"img": [{"bytes": p.read_bytes(), "path": None} for p in pngs],
                       "label": [p.parent.name for p in pngs]},
                      features=Features({"img": ImageFeature(), "label": Value("string")})).to_parquet(
        str(root / "images_named_img.parquet"))  # fmt: skip
    truncated = image_folder(root / "truncated") / "train" / "1_trouser" / "2.png"
    truncated.write_bytes(truncated.read_bytes()[:200])
    images = image_folder(root / "images_cut_jpeg")
    victim = images / "train" / "1_trouser" / "cut.jpg"
    Image.open(images / "train" / "1_trouser" / "0.png").convert("RGB").resize((200, 200)).save(
        victim, quality=95
    )
    jpeg = bytearray(victim.read_bytes())  # whole, to its end marker: its scan asks for Huffman tables it lacks
    scan = jpeg.find(b"\xff\xda")
    for i in range(jpeg[scan + 4]):
        jpeg[scan + 6 + 2 * i] = 0x33
    victim.write_bytes(bytes(jpeg))  # found only when decoded

    # models and tokenizers
    save_tiny_bert(root / "pickle_model", tokenizer=False, safetensors=False)
    save_tiny_bert(root / "model_without_tokenizer", tokenizer=False)  # config and weights only
    small_vocab = root / "small_tokenizer"
    small_vocab.mkdir()
    vocab = (TOKENIZER / "vocab.txt").read_text().splitlines()[:1000]
    (small_vocab / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (small_vocab / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True})
    )

    # checkpoints that do not fit this run
    _checkpoint_copy(w, "other_task", _edit_manifest(task="image-classification"))
    _checkpoint_copy(w, "other_labels", _edit_manifest(label_names=["negative", "positive"]))
    _checkpoint_copy(w, "no_marker", lambda p: (p / ckpt.COMPLETE).unlink())
    _checkpoint_copy(w, "holds_code", _plant_code("random_states_0.pkl"))
    _checkpoint_copy(w, "optimizer_holds_code", _plant_code("optimizer.bin"))
    return w


@pytest.fixture
def copy(world, tmp_path) -> Path:
    """A private copy of the finished run, for a case that damages or replaces it."""
    return Path(shutil.copytree(world.done, tmp_path / "run"))


def _text(w: World, *extra: str, out: Path | None = None) -> list[str]:
    """A tiny text run into `out` (the module's finished run by default), told to overwrite it (so that
    the mistake under test is what stops it), with that run's settings (so that it may resume its
    checkpoints)."""
    data = {"train": w.train, "validation": w.validation}
    return tiny_text_args(data, out or w.done, "max_steps=1", "overwrite_output_dir=true",
                          "freeze_embeddings=true", *extra)  # fmt: skip


def _image(w: World, data_dir: Path, *extra: str, out: Path | None = None) -> list[str]:
    return ["--config", IMAGEFOLDER, f"model_config={TINY_VIT}", f"data_dir={data_dir}",
            f"output_dir={out or w.done}", "overwrite_output_dir=true", "max_steps=1", *extra]  # fmt: skip


def _resume(w: World, name: str, *extra: str) -> list[str]:
    return _text(w, f"resume_from_checkpoint={w.root / 'checkpoints' / name}", *extra)


BIGGER_BERT = TINY_BERT.replace("hidden_size: 32", "hidden_size: 64")
Args = Callable[[World], list[str]]

# --- data files, columns, labels, images, models, checkpoints, the command line ------------------------

KAGGLE_TEST = "id,text\n1,a fine film\n2,a dull one\n"
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 123456\n"


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _saved(folder: Path, train: Path, splits: bool = False) -> Path:
    """The training file as datasets' save_to_disk writes it (a Dataset, or a DatasetDict of two splits)."""
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_csv(str(train))
    if not folder.exists():
        (DatasetDict({"train": ds, "validation": ds}) if splits else ds).save_to_disk(str(folder))
    return folder


# <rule id>:<case> -> (arguments, the part of the one error line that must be there); the test asserts
# that the rule refused it
COMMANDS: dict[str, tuple[Args, str]] = {
    # data files
    "files.not_a_file:train_file_missing": (lambda w: _text(w, f"train_file={w.root / 'nope.csv'}"), "train file not found"),
    "files.not_a_file:validation_file_missing": (
        lambda w: _text(w, f"validation_file={w.root / 'nope.csv'}"),
        "validation file not found",
    ),
    "files.empty:empty_file": (lambda w: _text(w, f"train_file={w.root / 'empty.csv'}"), "(0 bytes); save it with its samples"),
    "files.no_rows:header_only": (
        lambda w: _text(w, f"train_file={w.root / 'header_only.csv'}"),
        "the train data has no rows",
    ),
    "files.unsupported_type:unsupported_type": (
        lambda w: _text(w, f"train_file={w.root / 'train.docx'}"),
        "unsupported file type '.docx'",
    ),
    "files.csv_ragged_row:csv_ragged_more": (
        lambda w: _text(w, f"train_file={w.root / 'ragged_more.csv'}"),
        "line 3 has 3 fields, the header has 2; fix that row",
    ),
    "columns.label_null:csv_ragged_fewer": (
        lambda w: _text(w, f"train_file={w.root / 'ragged_fewer.csv'}"),
        "label column 'label' in the train data has empty (null) values (first at row 2)",
    ),
    "files.json_syntax:jsonl_broken": (
        lambda w: _text(w, f"train_file={w.root / 'broken.jsonl'}", "validation_file=null"),
        "is not valid JSON or JSON Lines: line 40 column 10: unterminated string starting; fix or remove that line",
    ),
    "files.json_syntax:json_broken": (
        lambda w: _text(w, f"train_file={w.root / 'broken.json'}", "validation_file=null"),
        "is not valid JSON or JSON Lines: line 1 column 48: expecting value; fix the file there (cut off",
    ),
    "files.json_key_twice:jsonl_repeated_key": (
        lambda w: _text(w, f"train_file={w.root / 'dupkey.jsonl'}", "validation_file=null"),
        "line 1 has the key 'label' twice; keep one of them",
    ),
    "labels.numbers_with_a_stray_cell:decimal_targets_and_a_nan": (
        lambda w: _text(w, f"train_file={w.root / 'decimals_and_a_nan.csv'}", "validation_file=null"),
        "label column 'label' holds numbers but 'NaN' at row 8 is not a finite number",
    ),
    "labels.not_numbers_for_regression:decimal_targets_and_a_nan_for_regression": (
        lambda w: _text(w, f"train_file={w.root / 'decimals_and_a_nan.csv'}", "validation_file=null",
                        "problem_type=regression"),
        "label column 'label' holds class names ('NaN' at row 8 is not a finite number)",
    ),
    "columns.object_of_columns:json_object_of_columns": (
        lambda w: _text(w, f"train_file={w.root / 'columns.json'}", "validation_file=null"),
        "the train data is one record whose 'text' is a list: a JSON object of columns; give one record per row",
    ),
    "labels.header_inside_the_file:header_repeated_inside_the_file": (
        lambda w: _text(w, f"train_file={w.root / 'header_again.csv'}", "validation_file=null"),
        "label column 'label' holds the label 'label' at row 6: the header repeated inside the file",
    ),
    "labels.case_twin_labels:label_lists_in_two_cases": (
        lambda w: _text(w, f"train_file={w.root / 'case_label_lists.jsonl'}", "validation_file=null"),
        "holds the labels 'Art' and 'art', which differ only by letter case and would be two labels",
    ),
    "files.other_separator:pipe_separated_csv": (
        lambda w: _text(w, f"train_file={w.root / 'pipes.csv'}", "validation_file=null"),
        "looks separated by | (its header is 'text|label')",
    ),
    "columns.spaced_header:header_with_spaces": (
        lambda w: _text(w, f"train_file={w.root / 'spaced_header.csv'}", "validation_file=null"),
        "column 'label' not found in the train data, but ' label' is: strip the spaces",
    ),
    "columns.records_nested_under_a_key:records_nested_under_a_key": (
        lambda w: _text(w, f"train_file={w.root / 'nested_records.json'}", "validation_file=null"),
        "the samples are nested under 'data'; give the records themselves",
    ),
    "files.other_separator:tab_separated_csv": (
        lambda w: _text(w, f"train_file={w.root / 'tabs.csv'}", "validation_file=null"),
        "looks tab-separated (its header is 'text\\tlabel'); this app reads a .csv as comma-separated: rename it to .tsv",
    ),
    **{
        f"files.pandas_layout:pandas_{orient}_json": (
            lambda w, orient=orient: _text(w, f"train_file={w.root / f'pandas_{orient}.json'}", "validation_file=null"),
            f"is a pandas DataFrame.to_json layout (orient='{orient}'), not one record per sample; save it with "
            "df.to_json(path, orient='records', lines=True)",
        )
        for orient in ("columns", "index", "split", "table")
    },
    "files.pandas_layout:pandas_columns_as_jsonl": (
        lambda w: _text(w, f"train_file={w.root / 'pandas_columns.jsonl'}", "validation_file=null"),
        "is a pandas DataFrame.to_json layout (orient='columns'), not one record per sample",
    ),
    "files.workbook:excel_workbook": (
        lambda w: _text(w, f"train_file={w.root / 'train.xlsx'}", "validation_file=null"),
        "is a spreadsheet workbook (Excel, LibreOffice), not a data file; save the sheet as CSV (UTF-8)",
    ),
    "files.workbook:workbook_of_one_sheet": (
        lambda w: _text(w, f"train_file={w.root / 'sheets.xlsx'}", "validation_file=null"),
        "is a spreadsheet workbook (Excel, LibreOffice), not a data file; save the sheet as CSV (UTF-8)",
    ),
    "files.git_lfs_pointer:lfs_pointer": (
        lambda w: _text(w, f"train_file={_written(w.root / 'lfs.csv', LFS_POINTER)}", "validation_file=null"),
        "is a Git LFS pointer, not the data: run `git lfs pull`",
    ),
    "files.saved_dataset_folder:save_to_disk_folder": (
        lambda w: _text(w, f"train_file={_saved(w.root / 'saved', w.train)}", "validation_file=null"),
        "is a dataset that datasets' save_to_disk wrote; give its .arrow file",
    ),
    "files.saved_dataset_folder:save_to_disk_splits": (
        lambda w: _text(w, f"train_file={_saved(w.root / 'saved_dict', w.train, splits=True)}", "validation_file=null"),
        "is a DatasetDict that datasets' save_to_disk wrote (splits: train, validation); give each split's .arrow file",
    ),
    "columns.scored_split_without_labels:test_file_of_ids_and_texts": (  # Kaggle's test.csv: no labels, an id
        lambda w: _text(w, f"test_file={_written(w.root / 'kaggle_test.csv', KAGGLE_TEST)}"),
        "the test split is scored, so it needs its labels; to predict on a file without them",
    ),
    "files.compressed:gzipped_csv": (
        lambda w: _text(w, f"train_file={w.root / 'train.csv.gz'}", "validation_file=null"),
        "is compressed (gzip); unpack it and give the file inside",
    ),
    "files.not_a_file:dev_null": (lambda w: _text(w, "train_file=/dev/null"), "is not a regular file (a device, pipe or socket)"),
    "files.other_separator:semicolon_separated_csv": (
        lambda w: _text(w, f"train_file={w.root / 'semicolon.csv'}", "validation_file=null"),
        "looks semicolon-separated",
    ),
    "files.not_utf8:latin1_csv": (lambda w: _text(w, f"train_file={w.root / 'latin1.csv'}", "validation_file=null"), "latin1.csv"),
    # columns and labels
    "columns.text_column_named_otherwise:text_column_missing": (
        lambda w: _text(w, "text_column=review"),
        "column 'review' not found in the train data; columns are: text, label; if 'text' is that column, set "
        "text_column=text",
    ),
    "columns.label_column_named_otherwise:label_column_missing": (
        lambda w: _text(w, "label_column=sentiment"),
        "column 'sentiment' not found in the train data; columns are: text, label; if 'label' holds the labels, set "
        "label_column=label",
    ),
    "labels.single_class:single_class": (
        lambda w: _text(w, f"train_file={w.root / 'single_class.csv'}"),
        "has a single class (1); a classifier needs at least two",
    ),
    "labels.unseen:unseen_eval_labels": (
        lambda w: _text(w, f"validation_file={w.root / 'unseen.csv'}"),
        "validation labels ['2'] were not seen in training (known: 0, 1); a model predicts only the labels it was "
        "trained on: relabel or drop those rows",
    ),
    "columns.numbers_as_texts:numeric_text": (
        lambda w: _text(w, f"train_file={w.root / 'numeric_text.csv'}"),
        "text column 'text' in the train data holds only numbers (int64), no words: a model classifies text, and "
        "these values would be read as numbers written out; set text_column to the column of texts (if 'text' is a "
        "label or an id, it is not the text); if these numbers are the texts to classify, write them as strings "
        '(JSON Lines: "text": "12345")',
    ),
    "columns.text_missing_in_a_row:null_text": (
        lambda w: _text(w, f"train_file={w.root / 'null_text.csv'}"),
        "text column 'text' in the train data has an empty cell at row 2; fill it in or drop that row",
    ),
    "columns.texts_all_blank:texts_all_empty": (
        lambda w: _text(w, f"train_file={w.root / 'empty_texts.jsonl'}", "validation_file=null"),
        "text column 'text' in the train data holds only empty strings",
    ),
    "columns.text_blank:text_blank": (
        lambda w: _text(w, f"train_file={w.root / 'blank_text.csv'}", "validation_file=null"),
        "text column 'text' in the train data has an empty (blank) text at row 5; fill it in or drop that row",
    ),
    "columns.text_column_empty:text_column_all_empty": (
        lambda w: _text(w, f"train_file={w.root / 'empty_text_column.csv'}", "validation_file=null"),
        "text column 'text' in the train data is empty (no text in any row)",
    ),
    "files.column_twice:csv_header_repeats_a_column": (
        lambda w: _text(w, f"train_file={w.root / 'repeated_column.csv'}", "validation_file=null"),
        "has the column 'label' twice in its header; rename or remove one",
    ),
    "columns.mixed_types:texts_of_mixed_types": (
        lambda w: _text(w, f"train_file={w.root / 'mixed_texts.jsonl'}", "validation_file=null"),
        "column 'text' in the train data holds values of mixed types: row 4 holds a number (5), row 1 text",
    ),
    "columns.mixed_types:labels_of_mixed_types": (
        lambda w: _text(w, f"train_file={w.root / 'mixed_labels.jsonl'}", "validation_file=null"),
        "column 'label' in the train data holds values of mixed types: row 6 holds a number (1), row 1 text",
    ),
    "files.txt_not_conll:csv_named_txt": (
        lambda w: _text(w, f"train_file={w.root / 'csv_named.txt'}", "validation_file=null"),
        "a .txt file is read as CoNLL (a token and its tag on each line, a blank line between sentences); a CSV "
        "file should be named .csv",
    ),
    "labels.space_twins_in_lists:label_lists_that_differ_only_by_spaces": (
        lambda w: _text(w, f"train_file={w.root / 'spaced_label_lists.jsonl'}", "validation_file=null"),
        "label column 'label' holds 'b' and 'b ' (row 3), which differ only by spaces and would be two labels",
    ),
    "labels.lists_for_single_label:labels_that_are_lists": (
        lambda w: _text(w, f"train_file={w.root / 'lists.jsonl'}", "validation_file=null",
                        "problem_type=single_label_classification"),  # fmt: skip
        "label column 'label' holds lists of labels, a multi-label problem",
    ),
    "labels.no_kind_of_label:labels_that_are_mappings": (
        lambda w: _text(w, f"train_file={w.root / 'dicts.jsonl'}", "validation_file=null"),
        "label column 'label' holds {'",
    ),
    "labels.floats_as_classes:labels_that_are_fractions": (
        lambda w: _text(w, f"train_file={w.root / 'floats.csv'}", "validation_file=null",
                        "problem_type=single_label_classification"),  # fmt: skip
        "holds numbers with decimals (e.g. 0.25); single_label_classification needs classes",
    ),
    "settings.label_is_an_input:string_labels_read_as_text": (
        lambda w: _text(w, f"train_file={w.root / 'string_labels.csv'}", "validation_file=null",
                        "text_column=label"),  # fmt: skip
        "'label' is both the label column and a text",
    ),
    # images
    "files.data_dir_missing:data_dir_missing": (lambda w: _image(w, w.root / "nope"), "data_dir not found"),
    "files.no_images:image_folder_without_images": (lambda w: _image(w, w.root / "no_images"), "holds no images"),
    "files.no_images:image_folder_empty": (lambda w: _image(w, w.root / "empty_dir"), "holds no images"),
    "files.data_files_as_image_folder:data_dir_of_data_files": (
        lambda w: _image(w, w.root / "data_files"),
        "holds data files (train.csv), not images: data_dir is an image folder's; give the files as train_file=",
    ),
    "images.unreadable_image:image_corrupt": (lambda w: _image(w, w.root / "garbage"), "cannot read image"),
    "labels.list_in_a_list:label_list_inside_a_label_list": (
        lambda w: _text(w, f"train_file={w.root / 'nested_label_lists.jsonl'}", "validation_file=null"),
        "label column 'label' in the train data has a list inside the list at row 4 (['a'])",
    ),
    "images.relative_path:image_paths_relative_to_elsewhere": (
        lambda w: _image(w, w.root / "images", "data_dir=null", f"train_file={w.root / 'relative_images.csv'}",
                         "validation_file=null"),
        "image 'no/such/0.png' (row 1 of the train data) not found: a relative path is read from the current folder",
    ),
    "columns.image_folder_of_one_class:image_folder_inside_a_class_folder": (
        lambda w: _image(w, w.root / "nested_images"),
        "nested_images/train/1_trouser/sub is a folder inside a class folder",
    ),
    "images.folder_link:image_class_folder_is_a_link": (
        lambda w: _image(w, w.root / "linked_images"),
        "linked_images/train/1_trouser is a link to a folder",
    ),
    "images.dangling_link:image_link_to_nothing": (
        lambda w: _image(w, w.root / "dangling_images"),
        "dangling_images/train/1_trouser/gone.png is a link to",
    ),
    "images.image_beside_class_folders:image_beside_the_class_folders": (
        lambda w: _image(w, w.root / "loose_images"),
        "loose_images/train/stray.png is an image beside the class folders of",
    ),
    "columns.images_under_another_name:images_in_a_column_of_another_name": (
        lambda w: _image(w, w.root / "images", "data_dir=null", f"train_file={w.root / 'images_named_img.parquet'}",
                         "validation_file=null"),
        "column 'image' not found in the train data, but 'img' holds images: set image_column=img",
    ),
    "images.channels:image_model_of_2_channels": (
        lambda w: _image(w, w.root / "images", "model_config.num_channels=2"),
        "the model's num_channels is 2: images are read as 1 (grayscale) or 3 (RGB) channels",
    ),
    "images.text_not_paths:image_column_of_text": (
        lambda w: _image(w, w.root / "images", "data_dir=null", f"train_file={w.root / 'text_as_images.csv'}",
                         "validation_file=null", "image_column=text"),
        "column 'text' of the train data holds text, not image paths ('a fine film' in row 1)",
    ),
    "images.unreadable_image:image_truncated": (lambda w: _image(w, w.root / "truncated"), "1_trouser/2.png in the train data"),
    "models.image_smaller_than_patch:image_size_below_patch_size": (
        lambda w: _image(
            w, w.root / "images", f"model_config={TINY_VIT.replace('image_size: 28', 'image_size: 4')}"
        ),
        "image_size 4 is smaller than its patch_size 7",
    ),
    "models.image_not_a_multiple_of_patch:image_size_not_a_multiple_of_patch_size": (
        lambda w: _image(
            w, w.root / "images", f"model_config={TINY_VIT.replace('image_size: 28', 'image_size: 30')}"
        ),
        "image_size 30 is not a multiple of its patch_size 7: the last 2 rows and columns of pixels would fall "
        "outside every patch; set model_config.image_size to 28 or 35",
    ),
    # models and tokenizers
    "models.path_missing:model_path_missing": (
        lambda w: _text(w, "model_config=null", f"model_name_or_path={w.root / 'nope'}"),
        "model path does not exist",
    ),
    "models.path_missing:tokenizer_path_missing": (
        lambda w: _text(w, f"tokenizer_name={w.root / 'nope'}"),
        "tokenizer path does not exist",
    ),
    "models.not_a_model_for_the_task:not_a_classification_model": (
        lambda w: _image(w, w.root / "images", "model_config=null", f"model_name_or_path={TOKENIZER}"),
        "is not a model that AutoModelForImageClassification can load",
    ),
    "models.pickle_weights_only:pickle_weights": (
        lambda w: _text(w, "model_config=null", f"model_name_or_path={w.root / 'pickle_model'}"),
        "pass allow_pickle_weights=true if you trust its source",
    ),
    "models.padded_past_positions:pad_to_multiple_of_past_position_limit": (
        lambda w: _text(w, "pad_to_multiple_of=200"),
        "pads batches of up to max_length=32 tokens to 200, past the model's position limit 128",
    ),
    "models.max_length_past_positions:max_length_over_position_limit": (
        lambda w: _text(w, "max_length=512"),
        "max_length 512 exceeds the model's position limit 128",
    ),
    "models.heads_do_not_divide:model_config_heads_do_not_divide": (
        lambda w: _text(w, f"model_config={TINY_BERT.replace('hidden_size: 32', 'hidden_size: 30')}"),
        "hidden_size 30 is not a multiple of num_attention_heads 4",
    ),
    "models.tokenizer_without_vocabulary:model_folder_without_tokenizer_files": (
        lambda w: _text(w, "model_config=null", f"model_name_or_path={w.model_without_tokenizer}",
                        "tokenizer_name=null"),  # fmt: skip
        "has no vocabulary, only its 5 special tokens",
    ),
    "models.tokenizer_without_vocabulary:tokenizer_folder_without_tokenizer_files": (
        lambda w: _text(w, f"tokenizer_name={w.model_without_tokenizer}"),
        "has no vocabulary, only its 5 special tokens",
    ),
    "models.tokenizer_larger_than_the_table:tokenizer_larger_than_the_embedding_table": (
        lambda w: _text(w, f"model_config={TINY_BERT[:-1]}, vocab_size: 1000}}"),
        "30522 tokens, more than the 1000 rows of the model's embedding table (ids from 1000 on have none): set "
        "model_config.vocab_size=30522",
    ),
    "models.tokenizer_smaller_than_the_table:tokenizer_smaller_than_the_embedding_table": (
        lambda w: _text(w, "model_config=null", f"model_name_or_path={w.model_without_tokenizer}",
                        f"tokenizer_name={w.small_tokenizer}"),  # fmt: skip
        "1000 tokens for the 30522 rows of the model's embedding table",
    ),
    # checkpoints that do not fit this run (the latest, step 2, resumed with max_steps=2)
    "runs.resume_changes_a_fixed_setting:checkpoint_other_task": (
        lambda w: _resume(w, "other_task"),
        "the checkpoint was trained with task=image-classification, this run has task=text-classification",
    ),
    "runs.resume_on_other_labels:checkpoint_other_labels": (
        lambda w: _resume(w, "other_labels"),
        "trained on the labels ['negative', 'positive'], this run's data has ['0', '1']",
    ),
    "runs.resume_changes_a_fixed_setting:checkpoint_other_model": (
        lambda w: _text(w, f"model_config={BIGGER_BERT}", "resume_from_checkpoint=latest", "max_steps=2"),
        "the checkpoint was trained with model_config.hidden_size=32, this run has model_config.hidden_size=64",
    ),
    "runs.other_topology:checkpoint_other_batch": (
        lambda w: _text(w, "resume_from_checkpoint=latest", "per_device_train_batch_size=4", "max_steps=2"),
        "resume with the same settings",
    ),
    "runs.resume_not_complete:checkpoint_without_marker": (
        lambda w: _resume(w, "no_marker"),
        "is not a complete checkpoint (no COMPLETE",
    ),
    "runs.rng_state_not_plain_data:checkpoint_holding_code": (lambda w: _resume(w, "holds_code"), "does not load as plain data"),
    "runs.state_not_plain_data:checkpoint_optimizer_holding_code": (
        lambda w: _resume(w, "optimizer_holds_code"),
        "does not load as plain data",
    ),
    "runs.checkpoint_not_found:checkpoint_missing": (
        lambda w: _text(w, f"resume_from_checkpoint={w.root / 'nope'}"),
        "checkpoint not found",
    ),
    "runs.no_checkpoint_to_resume:no_checkpoint_to_resume": (
        lambda w: _text(w, "resume_from_checkpoint=latest", out=w.root / "fresh"),
        "checkpoints; to start a new run there, leave resume_from_checkpoint out",
    ),
    # the config and the command line
    "settings.unknown_key:unknown_key": (
        lambda w: _text(w, "learnig_rate=1e-4"),
        "unknown config key 'learnig_rate'; did you mean learning_rate?",
    ),
    "settings.unknown_key:unknown_key_in_recipe": (
        lambda w: ["--config", str(w.root / "typo.yaml"), f"output_dir={w.done}"],
        "unknown config key 'num_train_epoch'; did you mean num_train_epochs?",
    ),
    "settings.wrong_type:wrong_type_int": (
        lambda w: _text(w, "per_device_train_batch_size=two"),
        "per_device_train_batch_size must be an integer, got 'two'",
    ),
    "settings.wrong_type:wrong_type_bool": (lambda w: _text(w, "group_by_length=maybe"), "group_by_length must be true or false"),
    "settings.wrong_type:wrong_type_number": (lambda w: _text(w, "learning_rate=fast"), "learning_rate must be a number"),
    "settings.recipe_not_yaml:recipe_not_yaml": (
        lambda w: ["--config", str(w.root / "bad.yaml"), f"output_dir={w.done}"],
        "is not valid YAML (line",
    ),
    "settings.recipe_not_a_mapping:recipe_not_a_mapping": (
        lambda w: ["--config", str(w.root / "list.yaml"), f"output_dir={w.done}"],
        "must hold a mapping of config keys",
    ),
    "settings.recipe_missing:recipe_is_a_folder": (
        lambda w: ["--config", str(w.root), f"output_dir={w.done}"],
        "config file is a folder, not a recipe file",
    ),
    "settings.recipe_missing:recipe_missing": (
        lambda w: ["--config", str(w.root / "nope.yaml"), f"output_dir={w.done}"],
        "config file not found",
    ),
    "settings.usage:unknown_option": (lambda w: [*_text(w), "--fast", "1"], "unrecognized arguments: --fast"),
    "settings.not_key_value:not_key_value": (lambda w: [*_text(w), "fast"], "expected key=value, got 'fast' (no spaces around '='"),
    # the output directory and the hardware
    "runs.output_dir_holds_a_run:finished_output_dir": (
        lambda w: [a for a in _text(w) if a != "overwrite_output_dir=true"],
        "already holds a finished run; pass overwrite_output_dir=true",
    ),
    "models.device_missing:device_missing": (
        lambda w: _text(w, "model_parallel=true", "devices=cuda:5"),
        "device cuda:5 does not exist",
    ),
    "models.device_unknown:device_unknown": (lambda w: _text(w, "model_parallel=true", "devices=tpu:0"), "unknown device 'tpu:0'"),
    "settings.layer_split_setting_alone:devices_without_model_parallel": (
        lambda w: _text(w, "devices=cpu,cpu"),
        "devices is for model_parallel=true",
    ),
    "launch.plan_only_needs_model_parallel:plan_only_without_model_parallel": (
        lambda w: _text(w, "--plan-only"),
        "--plan-only needs model_parallel=true",
    ),
    "launch.batchnorm_setting_without_batchnorm:freeze_batchnorm_of_bert": (
        lambda w: _text(w, "freeze_batchnorm=true"),
        "BertForSequenceClassification has no BatchNorm layer: freeze_batchnorm=true would do nothing; drop it",
    ),
    "settings.freeze_embeddings_of_task:freeze_embeddings_for_images": (
        lambda w: _text(w, "task=image-classification", "freeze_embeddings=true"),
        "freeze_embeddings is for models with a word-embedding table",
    ),
}

# Settings out of range: id -> (settings, fragment).
SETTINGS: dict[str, tuple[list[str], str]] = {
    "settings.positive:batch_size_zero": (
        ["per_device_train_batch_size=0"],
        "per_device_train_batch_size must be a positive integer, got 0",
    ),
    "settings.positive:batch_size_negative": (
        ["per_device_train_batch_size=-8"],
        "per_device_train_batch_size must be a positive integer, got -8",
    ),
    "settings.out_of_range:learning_rate_zero": (["learning_rate=0"], "learning_rate must be > 0, got 0.0"),
    "settings.out_of_range:learning_rate_negative": (["learning_rate=-1e-4"], "learning_rate must be > 0"),
    "settings.finite:learning_rate_infinite": (["learning_rate=.inf"], "learning_rate must be a finite number"),
    "settings.finite:learning_rate_nan": (["learning_rate=.nan"], "learning_rate must be"),
    "settings.positive:accumulation_zero": (
        ["gradient_accumulation_steps=0"],
        "gradient_accumulation_steps must be a positive integer, got 0",
    ),
    "launch.accumulation_over_epoch:accumulation_over_epoch": (
        ["gradient_accumulation_steps=50", "per_device_train_batch_size=8"],
        "gradient_accumulation_steps=50 exceeds the 5 batches per process in an epoch",
    ),
    "settings.positive:nonfinite_limit_zero": (["max_nonfinite_loss_steps=0"], "max_nonfinite_loss_steps must be a positive integer"),
    "settings.positive:ddp_timeout_negative": (["ddp_timeout=-1"], "ddp_timeout must be a positive integer"),
    "settings.out_of_range:ddp_timeout_past_timedelta": (["ddp_timeout=100000000000000"], "ddp_timeout must be at most 604800"),
    "settings.metric_of_no_problem:metric_for_best_model_unknown": (
        ["metric_for_best_model=bogus"],
        "metric_for_best_model must be a metric of the run's problem type, got 'bogus'; each problem type's: "
        "single_label_classification: accuracy, macro_f1",
    ),
    "settings.metric_with_eval_prefix:metric_with_eval_prefix": (["metric_for_best_model=eval_accuracy"], "metric_for_best_model=eval_accuracy: "
                                "the metric is named without the Trainer's eval_ prefix here: metric_for_best_model="
                                "accuracy"),
    "settings.wrong_type:greater_is_better_not_a_bool": (["greater_is_better=maybe"], "greater_is_better must be true or false"),
    "settings.out_of_range:max_grad_norm_negative": (["max_grad_norm=-1"], "max_grad_norm must be >= 0"),
    "settings.finite:max_grad_norm_nan": (["max_grad_norm=.nan"], "max_grad_norm must be a finite number"),
    "settings.out_of_range:seed_negative": (["seed=-1"], "seed must be in [0, 4294967295]"),
    "settings.out_of_range:seed_past_2_32": (["seed=4294967296"], "seed must be in [0, 4294967295]"),
    "settings.out_of_range:adam_beta1_one": (["adam_beta1=1.0"], "adam_beta1 must be in [0, 1)"),
    "settings.out_of_range:adam_beta1_negative": (["adam_beta1=-0.1"], "adam_beta1 must be in [0, 1)"),
    "settings.out_of_range:adam_beta2_above_one": (["adam_beta2=1.5"], "adam_beta2 must be in [0, 1)"),
    "settings.out_of_range:adam_epsilon_negative": (["adam_epsilon=-1e-8"], "adam_epsilon must be > 0"),
    "settings.out_of_range:adam_epsilon_zero": (["adam_epsilon=0"], "adam_epsilon must be > 0"),
    "settings.out_of_range:weight_decay_negative": (["weight_decay=-1"], "weight_decay must be >= 0"),
    "settings.finite:weight_decay_infinite": (["weight_decay=.inf"], "weight_decay must be a finite number"),
    "settings.cpu_threads:cpu_threads_100000": (["cpu_threads=100000"], "cpu_threads=100000"),
    "settings.positive_or_null:cpu_threads_zero": (["cpu_threads=0"], "cpu_threads must be positive"),
    "settings.label_names_repeated:label_names_duplicated": (["label_names=[0,0,1]"], "label_names lists '0' twice"),
    "settings.label_names_empty:label_names_empty": (["label_names=[]"], "label_names is empty"),
    "settings.threshold_without_multi_label:multi_label_threshold_single_label": (["multi_label_threshold=0.9"], "multi_label_threshold=0.9 decides a "
                                                                         "multi-label run's labels"),
    "settings.threshold_without_multi_label:tune_threshold_per_label_single_label": (["tune_threshold=per_label"], "tune_threshold=per_label tunes each "
                                                                            "label's decision threshold of a multi-label run"),
    "settings.model_config_label_key:model_config_num_labels": (["model_config.num_labels=5"], "model_config.num_labels is set from the data's labels"),
    "settings.model_config_label_key:model_config_problem_type": (["model_config.problem_type=regression"], "set problem_type= (a setting of its own)"),
    "settings.yaml_booleans_in_list:label_names_yaml_null": (["label_names=[neg, null]"], "label_names must hold strings, but YAML read some as "
                                                           "booleans or null (['neg', None]): put them in quotes "
                                                           "(label_names=\"['neg', 'null']\""),
    "settings.yaml_booleans_in_list:label_names_yaml_bool": (["label_names=[no, yes]"], "put them in quotes (label_names=\"['no', 'yes']\" on the "
                                                         "command line"),
    "settings.yaml_boolean_for_text:text_column_yaml_bool": (["text_column=on"], "text_column must be a string, but YAML read it as the boolean true"),
    "settings.null_for_a_value:label_column_null": (["label_column=null"], "label_column cannot be null: leave it out (its default)"),
    "settings.environment_variable:env_var_in_a_path": (["output_dir=${HOME}/runs/x"], "environment variables are not expanded in settings"),
    "settings.warmup_past_max_steps:warmup_steps_past_max_steps": (["warmup_steps=5"], "warmup_steps=5 exceeds max_steps=1"),
    "launch.warmup_steps_cover_the_run:warmup_steps_past_the_run": (
        ["max_steps=null", "num_train_epochs=1", "warmup_steps=500"],
        "warmup_steps=500 covers all 2 optimizer step(s) of the run",
    ),
    "settings.positive:logging_steps_zero": (["logging_steps=0"], "logging_steps must be a positive integer"),
    "settings.positive_or_null:eval_steps_zero": (["eval_steps=0"], "eval_steps must be positive"),
    "settings.positive_or_null:save_steps_negative": (["save_steps=-5"], "save_steps must be positive"),
    "settings.positive_or_null:save_total_limit_zero": (["save_total_limit=0"], "save_total_limit must be positive"),
    "settings.positive:eval_batch_size_zero": (["per_device_eval_batch_size=0"], "per_device_eval_batch_size must be a positive"),
    "settings.positive_or_null:early_stopping_patience_zero": (["early_stopping_patience=0"], "early_stopping_patience must be positive"),
    "models.max_length_without_room:max_length_one": (["max_length=1", "pad_to_multiple_of=null"], "max_length=1 leaves no room for text"),
    "settings.label_is_an_input:text_column_is_the_label_column": (["text_column=label"], "'label' is both the label column and a text"),
    "settings.pair_is_the_text:text_pair_is_the_text_column": (["text_pair_column=text"], "text_pair_column is the text_column"),
    # model_config values the model cannot be built or trained with: said before the build
    "models.size_below_one:model_config_size_zero": (["model_config.hidden_size=0"], "model_config.hidden_size=0: it must be 1 or more"),
    "models.size_below_one:model_config_no_layers": (["model_config.num_hidden_layers=-1"], "num_hidden_layers=-1: it must be 1 or more"),
    "models.size_below_one:model_config_no_positions": (["model_config.max_position_embeddings=0"], "max_position_embeddings=0: it must"),
    "models.unknown_activation:model_config_activation": (["model_config.hidden_act=swishy"], "'swishy' is not an activation transformers has"),
    "models.pad_token_outside_vocabulary:model_config_pad_outside": (["model_config.pad_token_id=40000"], "pad_token_id=40000 is outside the vocabulary"),
}

assert not COMMANDS.keys() & SETTINGS.keys()
CASES: dict[str, tuple[Args, str]] = {
    **COMMANDS,
    **{case: (lambda w, settings=settings: _text(w, *settings), fragment)
       for case, (settings, fragment) in SETTINGS.items()},
}  # fmt: skip


def _some_slow(cases, slow: set[str]) -> list:
    """The cases, those in `slow` behind the 'slow' marker: each of them trains or loads a model before
    it is refused (~5 s), and a case of the same kind stays in the default run."""
    assert slow <= set(cases), slow - set(cases)
    return [pytest.param(c, marks=pytest.mark.slow) if c in slow else c for c in cases]


# Refused only after a model is built or a checkpoint read: one of each kind stays in the default run
# (checkpoint_holding_code, checkpoint_other_task, device_unknown, warmup_steps_past_the_run).
SLOW_CASES = {
    "runs.state_not_plain_data:checkpoint_optimizer_holding_code",
    "runs.no_checkpoint_to_resume:no_checkpoint_to_resume",
    "runs.checkpoint_not_found:checkpoint_missing",
    "runs.resume_not_complete:checkpoint_without_marker",
    "runs.other_topology:checkpoint_other_batch",
    "runs.resume_changes_a_fixed_setting:checkpoint_other_model",
    "runs.resume_on_other_labels:checkpoint_other_labels",
    "models.device_missing:device_missing",
    "launch.accumulation_over_epoch:accumulation_over_epoch",
}


@pytest.mark.parametrize("case", _some_slow(CASES, SLOW_CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, world, capsys):
    make_args, fragment = CASES[case]
    user_error(capsys, main, make_args(world), fragment, untouched=world.done, rule=case.split(":")[0])
    assert not (world.root / "checkpoints" / "code-ran").exists()


@pytest.mark.parametrize(  # the slow ones are held in-process too
    "case",
    _some_slow(["files.csv_ragged_row:csv_ragged_more", "images.unreadable_image:image_corrupt",
                "runs.rng_state_not_plain_data:checkpoint_holding_code", "runs.output_dir_holds_a_run:finished_output_dir"],
               {"files.csv_ragged_row:csv_ragged_more", "images.unreadable_image:image_corrupt",
                "runs.rng_state_not_plain_data:checkpoint_holding_code"}),
)  # fmt: skip
def test_bad_input_from_the_command_line(case, world):
    make_args, fragment = CASES[case]
    script = str(REPO / "finetune/run.py")
    user_error_from_command([script, *make_args(world)], fragment, untouched=world.done, cwd=world.root,
                            rule=case.split(":")[0])  # fmt: skip
    assert not (world.root / "checkpoints" / "code-ran").exists()


def test_a_cut_off_json_lines_file_is_our_line_alone(world):
    """pyarrow fails on the cut-off last line and datasets logs its own "Failed to load JSON" line before
    raising: only the app's line, which names the line and the fix, reaches the user."""
    make_args, fragment = CASES["files.json_syntax:jsonl_broken"]
    result = subprocess.run([sys.executable, str(REPO / "finetune/run.py"), *make_args(world)], capture_output=True,
                            text=True, timeout=180, cwd=world.root)  # fmt: skip
    one_error_line(result.returncode, result.stderr, fragment)
    assert "Failed to load JSON" not in result.stderr, result.stderr


@pytest.mark.slow
def test_an_image_that_fails_only_when_decoded_is_named(world, tmp_path):
    """A JPEG whose scan data is broken (its file whole, to its end marker) passes the load-time check (PIL's
    verify() reads headers); decoding it in training raises one line naming the file, still exit 2 and no
    traceback."""
    args = ["--config", IMAGEFOLDER, f"model_config={TINY_VIT}", f"data_dir={world.images_cut_jpeg}",
            "num_train_epochs=1", "per_device_train_batch_size=4", f"output_dir={tmp_path / 'o'}"]  # fmt: skip
    user_error_from_command([str(REPO / "finetune/run.py"), *args], "cut.jpg", cwd=tmp_path)


def test_pickle_weights_load_when_the_user_opts_in(world):
    from finetune.config import load_config
    from finetune.models import build_model

    cfg = load_config(None, [f"model_name_or_path={world.pickle_model}", "allow_pickle_weights=true",
                             f"output_dir={world.root / 'o'}"])  # fmt: skip
    assert build_model(cfg.model_args, ["0", "1"]).config.hidden_size == 32


def _write(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


def _loop(folder: Path) -> Path:
    (folder / "a.csv").symlink_to(folder / "b.csv")
    (folder / "b.csv").symlink_to(folder / "a.csv")
    return folder / "a.csv"


@pytest.mark.parametrize(
    "make, fragment, rule",
    [
        (lambda t: ["--config", str(_write(t / "empty.yaml", ""))], "is empty; a recipe is a YAML mapping",
         "settings.recipe_empty"),
        (lambda t: [f"train_file={t}"], "is a folder, not a file", "files.not_a_file"),
        (lambda t: [f"train_file={_loop(t)}"], "is a symlink loop", "files.not_a_file"),
        (lambda t: ["model_config=null", f"model_name_or_path={DATA / 'bert_minilm_l6_uncased' / 'model.safetensors'}"],
         "model.safetensors is a file; give the folder that holds it", "settings.model_path_is_a_file"),
        (lambda t: [f"tokenizer_name={DATA / 'bert_minilm_l6_uncased' / 'tokenizer.json'}"],
         f"tokenizer_name={DATA / 'bert_minilm_l6_uncased' / 'tokenizer.json'} is a file; give the folder that holds it",
         "settings.model_path_is_a_file"),
    ],
)  # fmt: skip
def test_lines_say_what_the_path_is(make, fragment, rule, small_text_data, tmp_path, capsys):
    user_error(capsys, main, recipe_text_args(small_text_data, tmp_path / "run", *make(tmp_path)), fragment, rule=rule)


def test_a_data_dir_that_is_a_zip_or_a_file_says_so(world, tmp_path, capsys):
    import zipfile

    with zipfile.ZipFile(tmp_path / "images.zip", "w") as z:
        z.writestr("train/cat/0.png", b"")
    for path, fragment, rule in [(tmp_path / "images.zip", "is a zip file; unzip it", "files.data_dir_is_a_zip"),
                                 (world.train, "is a file, not a folder of images", "files.data_dir_is_a_file")]:  # fmt: skip
        args = ["--config", IMAGEFOLDER, f"model_config={TINY_VIT}", f"data_dir={path}", f"output_dir={tmp_path / 'o'}"]
        user_error(capsys, main, args, f"data_dir {path} {fragment}", rule=rule)


def test_what_the_fuzzer_found_is_said_with_its_fix(small_text_data, tmp_path, capsys):
    """tests/test_fuzz.py's findings: a recipe with the command line's dotted form of a key; a held-out
    validation split that cannot hold every class (a class with one sample)."""
    recipe = _write(tmp_path / "dotted.yaml", "model_config.hidden_size: 8\n")
    user_error(capsys, main, ["--config", str(recipe), *recipe_text_args(small_text_data, tmp_path / "run")],
               "in a recipe write model_config: {hidden_size: ...}", rule="settings.dotted_key_in_recipe")  # fmt: skip
    rows = [{"text": f"sentence {i}", "label": "rare" if i == 0 else ["pos", "neg"][i % 2]} for i in range(20)]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": "null"}
    user_error(capsys, main, recipe_text_args(data, tmp_path / "run"),
               "cannot hold out a stratified validation split", "1 class(es) of one sample: 'rare'",
               "give a validation_file", rule="splits.not_stratified")  # fmt: skip


def test_unknown_tracker_and_tokens_in_errors(small_text_data, tmp_path, capsys):
    user_error(capsys, main, tiny_text_args(small_text_data, tmp_path / "o", "report_to=[bogus]"),
               "unknown tracker 'bogus'")  # fmt: skip
    token = "hf_" + "a" * 30
    argv = tiny_text_args(small_text_data, tmp_path / "o", f"push_to_hub_model_id=https://me:{token}@hf.co/me/m")
    message = user_error(capsys, main, argv, "<redacted>")
    assert token not in message


@pytest.mark.slow  # six subprocesses; test_bad_input_is_one_line_exit_2_and_touches_nothing holds them in-process
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["learnig_rate=1e-4"], "unknown config key 'learnig_rate'; did you mean learning_rate?"),
        (["per_device_train_batch_size=two"], "per_device_train_batch_size must be an integer"),
        (["per_device_train_batch_size=0"], "per_device_train_batch_size must be a positive integer"),
        (["train_file=/nonexistent/train.csv"], "train file not found: /nonexistent/train.csv"),
        (["text_column=review"], "column 'review' not found in the train data; columns are: text, label"),
        (["--config", "/nonexistent.yaml"], "config file not found"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args, message, tmp_path):
    """The default recipe with one mistake, from the command line."""
    script = str(REPO / "finetune/run.py")
    user_error_from_command([script, *args, f"output_dir={tmp_path / 'o'}"], message, cwd=tmp_path)
    assert not (tmp_path / "o").exists()


# --- the output directory --------------------------------------------------------------------------------


def _user_folder(path: Path) -> Path:
    (path / "notes").mkdir(parents=True)
    (path / "notes" / "todo.txt").write_text("mine")
    (path / "data.csv").write_text("a,b\n1,2\n")
    return path


@pytest.mark.parametrize("spelling", ["''", "."])
def test_output_dir_that_is_the_current_folder_of_user_files(world, tmp_path, monkeypatch, capsys, spelling):
    folder = _user_folder(tmp_path / "mine")
    monkeypatch.chdir(folder)
    data = {"train": world.train, "validation": world.validation}
    argv = tiny_text_args(data, Path("x"), "max_steps=1", f"output_dir={spelling}")
    user_error(capsys, main, argv, "holds files that are not a run of this app", untouched=folder)


def test_overwrite_into_a_folder_whose_files_a_run_would_write_over(world, tmp_path, capsys):
    """overwrite_output_dir=true writes into a folder of other files, deleting nothing: so a file of the
    user's that has a run file's name (config.yaml, model/) is refused, not written over."""
    folder = _user_folder(tmp_path / "mine")
    (folder / "config.yaml").write_text("my: settings\n")
    (folder / "model").mkdir()
    (folder / "model" / "weights.bin").write_bytes(b"mine")
    user_error(capsys, main, _text(world, out=folder), "config.yaml", "model", "would write over", untouched=folder)


def test_output_dir_that_is_a_checkpoint(world, capsys):
    data = {"train": world.train, "validation": world.validation}
    argv = tiny_text_args(data, world.done / "checkpoints" / LAST, "max_steps=1")
    user_error(capsys, main, argv, "holds files that are not a run of this app", untouched=world.done)


def test_overwrite_then_a_mistake_found_mid_run_keeps_the_earlier_run(world, copy, capsys):
    """A JPEG whose scan data is broken passes the check before training and fails when it is decoded: by
    then the overwrite has begun. The earlier run, and the user's file beside it, come back whole."""
    (copy / "notes.txt").write_text("mine")
    argv = _image(world, world.images_cut_jpeg, "num_train_epochs=1", "per_device_train_batch_size=4", out=copy)
    user_error(capsys, main, [a for a in argv if a != "max_steps=1"], "cut.jpg", untouched=copy, rule="images.undecodable")
    assert json.loads((copy / "results.json").read_text())["step"] == 2


@pytest.mark.parametrize("how", ["busy", "read-only"])
def test_an_overwrite_that_cannot_set_the_earlier_run_aside_keeps_it_where_it_was(how, world, copy, capsys,
                                                                                  monkeypatch):  # fmt: skip
    """model/ that does not move: busy (a mount point, here bound onto itself: rename says EBUSY) or read-only
    (EACCES, which root never meets: raised in its place). One line naming it; the checkpoints that had
    moved come back, and no .previous-run.tmp/ is left."""
    import finetune.rundir as rundir

    model = copy / "model"
    if how == "busy" and (not AS_ROOT or subprocess.run(["mount", "--bind", model, model]).returncode):
        pytest.skip("binding a folder onto itself needs root")
    if how == "read-only":
        replace = os.replace
        refuse = OSError(errno.EACCES, "Permission denied")
        monkeypatch.setattr(rundir.os, "replace", lambda a, b: (_ for _ in ()).throw(refuse)
                            if Path(a) == model else replace(a, b))  # fmt: skip
    try:
        user_error(capsys, main, _text(world, out=copy), f"cannot set aside the run in {copy}: {model} does not move",
                   "the earlier run is as it was", untouched=copy, rule="runs.set_aside_failed")  # fmt: skip
    finally:
        if how == "busy":
            subprocess.run(["umount", model], check=True)
    assert not (copy / ".previous-run.tmp").exists() and not (copy / ".previous-run").exists()
    assert (copy / "checkpoints" / LAST).is_dir()


# --- damaged checkpoints ---------------------------------------------------------------------------------


def _cut(name: str, keep: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[: keep(len(data))])

    return damage


def _manifest(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        manifest = json.loads((path / ckpt.MANIFEST).read_text())
        result = edit(manifest)
        (path / ckpt.MANIFEST).write_text(json.dumps(manifest if result is None else result))

    return damage


def _header_garbage(path: Path) -> None:
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(b"\xff" * 8 + data[8:])


# id -> (the file the line must name, the damage)
DAMAGES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "weights_truncated": ("model.safetensors", _cut("model.safetensors", lambda n: n // 2)),
    "weights_zero_bytes": ("model.safetensors", _cut("model.safetensors", lambda n: 0)),
    "weights_header_garbage": ("model.safetensors", _header_garbage),
    "weights_missing": ("model.safetensors", lambda p: (p / "model.safetensors").unlink()),
    "weights_a_folder": ("model.safetensors", lambda p: ((p / "model.safetensors").unlink(),
                                                         (p / "model.safetensors").mkdir())),
    "optimizer_zero_bytes": ("optimizer.bin", _cut("optimizer.bin", lambda n: 0)),
    "optimizer_truncated": ("optimizer.bin", _cut("optimizer.bin", lambda n: n - 100)),
    "optimizer_missing": ("optimizer.bin", lambda p: (p / "optimizer.bin").unlink()),
    "scheduler_zero_bytes": ("scheduler.bin", _cut("scheduler.bin", lambda n: 0)),
    "scheduler_missing": ("scheduler.bin", lambda p: (p / "scheduler.bin").unlink()),
    "random_states_missing": ("random_states_0.pkl", lambda p: (p / "random_states_0.pkl").unlink()),
    "random_states_truncated": ("random_states_0.pkl", _cut("random_states_0.pkl", lambda n: n // 2)),
    "manifest_not_json": ("manifest.json", lambda p: (p / ckpt.MANIFEST).write_text("{not json")),
    "manifest_zero_bytes": ("manifest.json", _cut(ckpt.MANIFEST, lambda n: 0)),
    "manifest_missing_a_key": ("manifest.json", _manifest(lambda m: m.pop("world_size"))),
    "manifest_wrong_type": ("manifest.json", _manifest(lambda m: m.update(step="two"))),
    "manifest_a_list": ("manifest.json", _manifest(lambda m: [1, 2])),
    "manifest_of_another_step": ("manifest.json", _manifest(lambda m: m.update(step=99))),
    # the weights hold no names: edited names would swap every prediction's
    "manifest_labels_edited": ("manifest.json", _manifest(lambda m: m.update(label_names=m["label_names"][::-1]))),
    "manifest_missing": ("manifest.json", lambda p: (p / ckpt.MANIFEST).unlink()),
}


def _damage(copy: Path, case: str, name: str = LAST) -> Path:
    path = copy / ckpt.CHECKPOINTS / name
    DAMAGES[case][1](path)
    return path


# One damage of each file a resume reads stays in the default run (~4.5 s each); every damage is
# also read by test_latest_skips_a_damaged_checkpoint_and_says_so, which trains nothing.
RESUMED_DAMAGES = _some_slow(
    DAMAGES,
    set(DAMAGES) - {"weights_truncated", "optimizer_missing", "scheduler_zero_bytes", "random_states_truncated",
                    "manifest_not_json"},
)  # fmt: skip


@pytest.mark.parametrize("case", RESUMED_DAMAGES)
def test_resuming_a_damaged_checkpoint_is_one_line_naming_the_file(case, world, copy, capsys):
    path = _damage(copy, case)
    argv = _text(world, "max_steps=2", f"resume_from_checkpoint={path}", out=copy)
    user_error(capsys, main, argv, str(path / DAMAGES[case][0]), untouched=copy)


EVALUATED = [c for c in DAMAGES if c.startswith(("weights", "manifest"))]


@pytest.mark.parametrize("case", EVALUATED)
def test_evaluating_a_damaged_checkpoint_is_one_line_naming_the_file(case, copy, capsys):
    """Evaluation reads the manifest and the weights only. (A checkpoint without its manifest is named as
    "no COMPLETE marker or manifest": hence the file's stem.)"""
    path = _damage(copy, case)
    line = user_error(capsys, evaluate_main, [str(path)], DAMAGES[case][0].split(".")[0], untouched=copy)
    if case in ("weights_truncated", "weights_zero_bytes", "weights_header_garbage", "weights_a_folder"):
        assert "evaluate another checkpoint of the run, or its export" in line
    if case == "weights_a_folder":  # not "holds no model.safetensors" beside a listing that shows one
        assert "model.safetensors is a folder, not a weights file" in line


@pytest.mark.parametrize("case", list(DAMAGES))
def test_latest_skips_a_damaged_checkpoint_and_says_so(case, copy, capsys):
    path = _damage(copy, case)
    assert ckpt.resolve_checkpoint("latest", copy).name == "step-00000001"
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and str(path) in skipped[0] and DAMAGES[case][0] in skipped[0], err


@pytest.mark.parametrize("damage, what", [
    (lambda b: b"", "empty"),
    (lambda b: b[: len(b) // 2], "cut off: a torch file's start without its end"),
    (lambda b: b"\x80\x04" + bytes(len(b)), "not a torch file: overwritten, or another file"),
])  # fmt: skip
def test_a_damaged_state_file_is_said_as_what_it_is(damage, what, copy, capsys):
    """runs.state_file_damaged names the damage it sees: an empty file, a cut-off one, or other bytes."""
    state = copy / ckpt.CHECKPOINTS / LAST / "random_states_0.pkl"
    state.write_bytes(damage(state.read_bytes()))
    assert ckpt.resolve_checkpoint("latest", copy).name == "step-00000001"
    assert f"{state} is damaged ({what})" in capsys.readouterr().err


def test_latest_names_a_checkpoint_folder_that_was_renamed(copy, capsys):
    """checkpoints/step-abc (the user's rename of the newest): latest cannot order it, and says so."""
    renamed = copy / ckpt.CHECKPOINTS / "step-abc"
    (copy / ckpt.CHECKPOINTS / LAST).rename(renamed)
    assert ckpt.resolve_checkpoint("latest", copy).name == "step-00000001"
    skipped = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert skipped == [f"warning: resume_from_checkpoint=latest skipped {renamed}: it is not named step-<step> "
                       "(renamed?); to resume from it, give its path"], skipped


def test_latest_names_a_newer_checkpoint_whose_save_was_cut_short(copy, capsys):
    """A newest checkpoint without its COMPLETE marker is skipped, as it always was, and now said."""
    (copy / ckpt.CHECKPOINTS / LAST / "COMPLETE").unlink()
    assert ckpt.resolve_checkpoint("latest", copy).name == "step-00000001"
    skipped = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert skipped == [f"warning: resume_from_checkpoint=latest skipped {copy / ckpt.CHECKPOINTS / LAST}: it has no "
                       "COMPLETE marker (a save cut short): the run saves that step again"], skipped


def test_latest_resumes_from_the_newest_checkpoint_that_loads(world, copy, capsys):
    _damage(copy, "weights_truncated")
    (copy / "results.json").unlink()  # a run cut short after its last checkpoint
    results = main(
        _text(world, "max_steps=2", "resume_from_checkpoint=latest", "overwrite_output_dir=false", out=copy)
    )
    out = capsys.readouterr()
    assert results["step"] == 2 and "resumed from" in out.out and "step-00000001" in out.out
    assert f"skipped {copy / ckpt.CHECKPOINTS / LAST}" in out.err


def test_latest_with_every_checkpoint_damaged_is_one_line(world, copy, capsys):
    _damage(copy, "weights_truncated")
    _damage(copy, "manifest_not_json", "step-00000001")
    argv = _text(world, "max_steps=2", "resume_from_checkpoint=latest", out=copy)
    user_error(capsys, main, argv, "no checkpoint in", "loads", "step-00000001", LAST, untouched=copy)


@pytest.mark.parametrize("damage", ["manifest", "weights"])
def test_damaged_checkpoint_named_on_the_command_line_is_one_line(world, copy, capsys, damage):
    """(`latest` skips a damaged checkpoint for an older one that loads: above.)"""
    latest = sorted((copy / "checkpoints").glob("step-*"))[-1]
    if damage == "manifest":
        (latest / "manifest.json").write_text("{bad json")
    else:
        weights = latest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    argv = _text(world, "max_steps=2", f"resume_from_checkpoint={latest}", out=copy)
    name = "manifest.json" if damage == "manifest" else "model.safetensors"
    user_error(capsys, main, argv, str(latest / name), untouched=copy)


@pytest.mark.parametrize("how", ["truncated", "broken header"])
def test_damaged_weights_are_one_line_when_trained_from_or_evaluated(how, world, copy, tmp_path, capsys):
    weights = copy / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\xff" * 8 + data[8:])
    argv = _text(world, "model_config=null", f"model_name_or_path={copy / 'model'}", out=tmp_path / "again")
    user_error(capsys, main, argv, "damaged", untouched=copy)
    line = user_error(capsys, evaluate_main, [str(copy / "model")], untouched=copy / "model")
    assert "damaged" in line or "not a readable safetensors" in line


def test_a_weights_file_that_is_a_folder_is_said_so_when_trained_from_or_evaluated(world, copy, tmp_path, capsys):
    weights = copy / "model" / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    argv = _text(world, "model_config=null", f"model_name_or_path={copy / 'model'}", out=tmp_path / "again")
    user_error(capsys, main, argv, "its model.safetensors is a folder, not a weights file", untouched=copy)
    user_error(capsys, evaluate_main, [str(copy / "model")], f"{weights} is a folder, not a weights file",
               untouched=copy / "model")


# --- unreadable files and full disks ---------------------------------------------------------------------


@pytest.mark.skipif(AS_ROOT, reason="root reads files whatever their mode")
@pytest.mark.parametrize("what", ["train file", "image", "recipe"])
def test_an_unreadable_file_is_one_line(what, world, tmp_path, capsys):
    if what == "train file":
        victim = shutil.copy(world.train, tmp_path / "train.csv")
        argv = _text(world, f"train_file={victim}")
    elif what == "image":
        victim = image_folder(tmp_path / "images") / "train" / "1_trouser" / "2.png"
        argv = _image(world, tmp_path / "images")
    else:
        victim = shutil.copy(world.root / "recipe.yaml", tmp_path / "recipe.yaml")
        argv = ["--config", str(victim), f"output_dir={world.done}"]
    Path(victim).chmod(0)
    try:
        user_error(capsys, main, argv, Path(victim).name, untouched=world.done)
    finally:
        Path(victim).chmod(0o644)


@pytest.mark.parametrize("what", ["train file", "recipe"])
def test_a_permission_refused_is_one_line_also_as_root(what, world, monkeypatch, capsys):
    """As root nothing is unreadable, so here the refusal is simulated where the file is checked or read."""
    if what == "train file":
        access = os.access

        def refuse(path, mode, *args, **kwargs):
            if str(path) == str(world.train) and mode == os.R_OK:
                return False
            return access(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", refuse)
        argv = _text(world)
    else:
        read_text = Path.read_text

        def refuse(self, *args, **kwargs):
            if self == world.root / "recipe.yaml":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refuse)
        argv = ["--config", str(world.root / "recipe.yaml"), f"output_dir={world.done}"]
    name = "train.csv" if what == "train file" else "recipe.yaml"
    # a recipe's read refused is the environment's (finetune/exits.py says every such OSError), not a rule's
    rule = "files.unreadable" if what == "train file" else None
    user_error(capsys, main, argv, name, "ermission", untouched=world.done, rule=rule)


def _disk_full(path: str = "") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


@pytest.mark.slow  # tests/test_faults.py fills a real (tmpfs) disk during a checkpoint by default
def test_disk_full_during_a_checkpoint_save(world, tmp_path, monkeypatch, capsys):
    """The second save runs out of space half-way: one line, the half-written save is removed, the
    first checkpoint is whole (it loads: tests/test_checkpoint.py resumes after a save cut short)."""
    from accelerate import Accelerator

    out = tmp_path / "run"
    original, calls = Accelerator.save_state, []

    def save_state(self, output_dir=None, **kwargs):
        calls.append(output_dir)
        result = original(self, output_dir, **kwargs)
        if len(calls) == 2:
            raise _disk_full(str(Path(output_dir) / "optimizer.bin"))
        return result

    monkeypatch.setattr(Accelerator, "save_state", save_state)
    data = {"train": world.train, "validation": world.validation}
    argv = tiny_text_args(data, out, "max_steps=3", "save_steps=1", "per_device_train_batch_size=8")
    user_error(capsys, main, argv, "No space left on device", "step-00000001")
    assert sorted(p.name for p in (out / ckpt.CHECKPOINTS).iterdir()) == ["step-00000001"]
    assert ckpt.checkpoint_problem(out / ckpt.CHECKPOINTS / "step-00000001") is None


def test_disk_full_writing_the_manifest(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    original, calls = ckpt._fsync_tree, []

    def fsync_tree(path):
        calls.append(path)
        if len(calls) == 3:  # twice a save: the second save's first flush
            raise _disk_full(str(path / ckpt.MANIFEST))
        return original(path)

    monkeypatch.setattr(ckpt, "_fsync_tree", fsync_tree)
    data = {"train": world.train, "validation": world.validation}
    argv = tiny_text_args(data, out, "max_steps=3", "save_steps=1", "per_device_train_batch_size=8")
    user_error(capsys, main, argv, "No space left on device")
    assert sorted(p.name for p in (out / ckpt.CHECKPOINTS).iterdir()) == ["step-00000001"]


@pytest.mark.parametrize("where", ["export", pytest.param("metrics log", marks=pytest.mark.slow)])
def test_disk_full_in_an_overwrite_keeps_the_earlier_run(where, world, copy, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise _disk_full(str(copy / ("model/README.md" if where == "export" else "metrics.jsonl")))

    if where == "export":
        monkeypatch.setattr(export, "write_model_card", full)
    else:
        monkeypatch.setattr(run.MetricsLog, "log", full)
    user_error(capsys, main, _text(world, out=copy), "No space left on device", untouched=copy)
    assert json.loads((copy / "results.json").read_text())["step"] == 2


# --- the launcher and the environment -------------------------------------------------------------------

ACCELERATE_BASE = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "NO",
    "num_machines": 1,
    "machine_rank": 0,
    "num_processes": 1,
    "use_cpu": True,
    "mixed_precision": "no",
}

# id -> (changes to a valid one-process CPU config, or the file's raw text; extra flags; fragment)
LAUNCHER: dict[str, tuple[dict | str, list[str], str]] = {
    "num_processes_zero": ({"num_processes": 0}, [], "num_processes must be at least 1, got 0"),
    "num_processes_negative": ({"num_processes": -3}, [], "num_processes must be at least 1, got -3"),
    "mixed_precision_fp8x": ({"mixed_precision": "fp8x"}, [], "mixed_precision 'fp8x'"),
    "distributed_type_unknown": ({"distributed_type": "BOGUS"}, [], "not a valid accelerate config"),
    "num_machines_zero": ({"num_machines": 0}, [], "num_machines must be at least 1, got 0"),
    "machine_rank_past_the_machines": ({"num_machines": 2, "machine_rank": 2}, [], "machine_rank 2"),
    "main_process_port_past_65535": ({"main_process_port": 70000}, [], "main_process_port 70000"),
    "dynamo_backend_unknown": ({"dynamo_config": {"dynamo_backend": "BOGUS"}}, [], "dynamo_backend 'BOGUS'"),
    "config_empty": ("", [], "not a valid accelerate config"),
    "config_a_list": ("- a\n- b\n", [], "not a valid accelerate config"),
    "config_a_folder": ("<folder>", [], "is a folder"),
    "flag_num_processes_zero": ({}, ["--num_processes", "0"], "num_processes must be at least 1, got 0"),
    "flag_num_machines_zero": ({}, ["--num_machines", "0"], "num_machines must be at least 1, got 0"),
    "flag_machine_rank_negative": ({}, ["--machine_rank", "-1"], "machine_rank -1"),
}


@pytest.mark.parametrize("case", list(LAUNCHER))
def test_a_bad_launch_is_one_line_before_anything_starts(case, tmp_path, capsys):
    changes, flags, fragment = LAUNCHER[case]
    config = tmp_path / "accelerate.yaml"
    if changes == "<folder>":
        config.mkdir()
    elif isinstance(changes, str):
        config.write_text(changes)
    else:
        config.write_text(yaml.safe_dump({**ACCELERATE_BASE, **changes}))
    script = tmp_path / "would_train.py"  # had the launcher started it, it would leave this mark
    script.write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    user_error(capsys, launch_main, ["--config_file", str(config), *flags, str(script)], fragment)
    assert not (tmp_path / "started").exists()


@pytest.mark.slow  # a launcher process of its own: ~10 s
def test_a_bad_accelerate_config_from_the_command_line(tmp_path):
    config = tmp_path / "accelerate.yaml"
    config.write_text(yaml.safe_dump({**ACCELERATE_BASE, "num_processes": 0}))
    user_error_from_command(["-m", "finetune.launch", "--config_file", str(config), "finetune/run.py"],
                            "num_processes")  # fmt: skip


# A missing or unparsable accelerate config given to finetune-launch: tests/test_launch.py.


# --- model parallelism that cannot run ---------------------------------------------------------------


@pytest.mark.parametrize(
    "env, extra, message",
    [
        ({"ACCELERATE_USE_FSDP": "true"}, (), "splits a replica of the model inside each process"),
        ({"WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}, (), "4 visible GPUs do not split evenly among 3"),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, ("devices=cuda:0,cuda:1",), "on the same GPUs"),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, ("devices=cuda:0;cuda:1;cuda:2",), "3 device lists"),
    ],
    ids=["with_fsdp", "gpus_do_not_divide", "one_gpu_list_for_all", "lists_do_not_match"],
)
def test_model_parallel_that_cannot_run_is_one_line(env, extra, message, world, tmp_path, monkeypatch, capsys):
    """DDP x layer split and FSDP do not combine; under several processes each takes its own GPUs.
    Refused before any process group forms (as if launched on a machine with 4 GPUs: the check runs
    first, so no GPU is touched)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for key, value in {"LOCAL_RANK": "0", **env}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "o"
    user_error(capsys, main, _text(world, "model_parallel=true", *extra, out=out), message)
    assert not out.exists()



def test_resuming_a_checkpoint_whose_weights_are_another_models_names_the_file(world, copy, capsys):
    """A ViT's model.safetensors in a BERT run's checkpoint: the line names the file and what differs, not
    torch's "Error(s) in loading state_dict" header alone."""
    from conftest import tiny_vit_config
    from safetensors.torch import save_file
    from transformers import AutoModelForImageClassification

    path = copy / ckpt.CHECKPOINTS / LAST
    vit = AutoModelForImageClassification.from_config(tiny_vit_config(num_labels=2))
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, path / "model.safetensors")
    argv = _text(world, "max_steps=3", f"resume_from_checkpoint={path}", out=copy)
    line = user_error(capsys, main, argv, f"{path / 'model.safetensors'} holds weights that do not fit the model "
                                          "this run builds (missing", untouched=copy)  # fmt: skip
    assert "unexpected" in line and "vit." in line and "if that file was replaced, use another checkpoint" in line


def test_an_export_whose_labels_were_edited_is_said_to_differ_from_its_run(copy, capsys):
    config_file = copy / "model" / "config.json"
    config = json.loads(config_file.read_text())
    names = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    config["id2label"] = {str(i): name for i, name in enumerate(reversed(names))}
    config["label2id"] = {name: i for i, name in enumerate(reversed(names))}
    config_file.write_text(json.dumps(config))
    user_error(capsys, evaluate_main, [str(copy / "model")],
               f"config.json names the labels {list(reversed(names))}, but its run", "id2label was edited",
               untouched=copy)  # fmt: skip


def test_a_label_column_in_another_case_is_not_predicted_silently(world, tmp_path, capsys):
    """"Label" beside a model that reads "label": the file holds labels; say how to score them."""
    data = write_csv(tmp_path / "Label.csv", [{"text": r["text"], "Label": r["label"]} for r in rotten_rows(6)])
    user_error(capsys, evaluate_main, [str(world.done / "model"), "--data", str(data), "--output", str(tmp_path / "e")],
               "column 'Label' of", "looks like the label column 'label' in another case; to score it, pass "
               "label_column=Label")  # fmt: skip
    assert not (tmp_path / "e").exists()
    # "labels" beside a model that reads "label": the same, by another name
    data = write_csv(tmp_path / "labels.csv", [{"text": r["text"], "labels": r["label"]} for r in rotten_rows(6)])
    user_error(capsys, evaluate_main, [str(world.done / "model"), "--data", str(data), "--output", str(tmp_path / "e")],
               "looks like the label column 'label' by another name; to score it, pass label_column=labels")  # fmt: skip


def test_evaluating_an_export_whose_weights_are_another_models_is_one_line(copy, capsys):
    """transformers would fill the missing weights at random (a log line) and score a random model."""
    from conftest import tiny_vit_config
    from safetensors.torch import save_file
    from transformers import AutoModelForImageClassification

    vit = AutoModelForImageClassification.from_config(tiny_vit_config(num_labels=2))
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, copy / "model" / "model.safetensors")
    user_error(capsys, evaluate_main, [str(copy / "model")], "do not fit its config.json (another model's "
               "model.safetensors, or a config.json edited?)", "weight(s) missing", untouched=copy)  # fmt: skip


def test_a_datasets_cache_that_cannot_be_written_is_named_not_the_file(world, tmp_path, capsys, monkeypatch):
    """datasets copies every file it reads into its cache first: a cache that is a file (or full, or read-only:
    the same line, tested by hand on a tmpfs) is said as such, not as a file that is not valid csv."""
    import datasets

    cache = tmp_path / "cache-is-a-file"
    cache.write_text("x")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    user_error(capsys, main, _text(world, out=tmp_path / "o"), f"the datasets cache it is copied into first "
               f"({cache}) cannot be made: {cache} is a file, not a folder", "set HF_DATASETS_CACHE",
               rule="files.cache_unwritable")  # fmt: skip
    # HOME (or HF_HOME) a file: the cache below it cannot be made; the data file is not blamed
    under = cache / ".cache" / "huggingface" / "datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", under)
    line = user_error(capsys, main, _text(world, out=tmp_path / "o2"),
                      f"({under}) cannot be made: {cache} is a file, not a folder")  # fmt: skip
    assert "valid csv" not in line
    # a cache under a folder nothing can be made in (/proc): the same line, with the system's reason
    proc = Path("/proc/finetune-no-such-cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", proc)
    line = user_error(capsys, main, _text(world, out=tmp_path / "o3"), f"({proc}) cannot be written", "writable folder")
    assert "valid csv" not in line


def test_a_parquet_file_without_rows_says_so(world, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "label": pa.array([], pa.string())}), path)
    user_error(capsys, main, _text(world, f"train_file={path}", out=tmp_path / "o"),
               f"the train data has no rows ({path})")  # fmt: skip


@pytest.mark.parametrize("first, fragment, rule", [
    ("sep=,\n", "starts with the line 'sep=,', a hint for Excel, not the header; delete that line",
     "files.excel_separator_line"),
    ("# exported by a tool\n", "starts with the line '# exported by a tool', a comment, where the header belongs",
     "files.comment_above_header"),
    (None, "line 4 opens a quote that no quote closes: the field runs on to line 9", "files.csv_open_quote"),
])  # fmt: skip
def test_a_csv_line_that_is_not_data_is_named(world, tmp_path, capsys, first, fragment, rule):
    rows = ["text,label", *(f"sample {i},{'pos' if i % 2 else 'neg'}" for i in range(8))]
    if first is None:
        rows[3] = '"an open quote,pos'  # line 4
    path = tmp_path / "t.csv"
    path.write_text((first or "") + "\n".join(rows) + "\n")
    user_error(capsys, main, _text(world, f"train_file={path}", out=tmp_path / "o"), fragment, rule=rule)
