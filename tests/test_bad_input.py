"""Every bad input gets one line naming the problem and what to do, exit status 2, no traceback, and
nothing already in the output directory is touched.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_bad_input.py

Most cases run `finetune.run.main` in-process against the output directory of a finished run (with
`overwrite_output_dir=true`, so that the refusal to overwrite does not hide the error under test) and
check that every byte of it is unchanged; a handful run the real command to show no traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_BERT, TINY_VIT, TOKENIZER, rotten_rows, tiny_text_args, user_error, write_csv
from PIL import Image

from finetune import checkpoint as ckpt
from finetune.config import CONFIGS_DIR
from finetune.run import main

IMAGEFOLDER = str(CONFIGS_DIR / "vit_imagefolder.yaml")
SAMPLE_PNG = REPO / "data/fashion_mnist/sample_png/train"


@dataclass
class Files:
    root: Path
    done: Path  # a finished run: config, metrics, results, model export, checkpoint step-00000001
    train: Path
    validation: Path

    def __getattr__(self, name: str) -> Path:  # files.ragged -> root/ragged.csv etc., made below
        return self.root / name


def _image_folder(root: Path, per_class: int = 6) -> Path:
    for folder in sorted(SAMPLE_PNG.iterdir())[:2]:
        dest = root / "train" / folder.name
        dest.mkdir(parents=True)
        for j, png in enumerate(sorted(folder.iterdir())[:per_class]):
            shutil.copy(png, dest / f"{j}.png")
    return root


def _checkpoint_copy(files: Files, name: str, edit: Callable[[Path], None]) -> Path:
    dest = files.root / "checkpoints" / name
    shutil.copytree(files.done / ckpt.CHECKPOINTS / "step-00000001", dest)
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
def files(tmp_path_factory) -> Files:
    root = tmp_path_factory.mktemp("bad-input")
    f = Files(
        root,
        root / "done",
        write_csv(root / "train.csv", rotten_rows(37)),
        write_csv(root / "validation.csv", rotten_rows(13, start=100)),
    )
    main(
        tiny_text_args({"train": f.train, "validation": f.validation}, f.done, "max_steps=1", "save_steps=1")
    )
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()

    (root / "empty.csv").write_text("")
    (root / "header_only.csv").write_text("text,label\n")
    (root / "ragged_more.csv").write_text("text,label\na fine film,1\na dull film,0,extra\nok,1\n")
    (root / "ragged_fewer.csv").write_text("text,label\na fine film,1\na dull film\nok,0\n")
    (root / "null_text.csv").write_text("text,label\na fine film,1\n,0\nok,0\n")
    (root / "numeric_text.csv").write_text("text,label\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))
    write_csv(root / "single_class.csv", [r for r in rotten_rows(60) if r["label"] == "1"])
    write_csv(root / "unseen.csv", [*rotten_rows(6, start=100), {"text": "a third kind", "label": "2"}])
    (root / "broken.jsonl").write_text(
        '{"text": "a fine film", "label": 1}\n{"text": "a dull film", "label": \n'
    )
    (root / "broken.json").write_text('[{"text": "a fine film", "label": 1}, {"text": ')
    (root / "train.docx").write_text("text,label\n")
    (root / "bad.yaml").write_text("learning_rate: 1e-4\n  per_device_train_batch_size: [8\n")
    (root / "list.yaml").write_text("- learning_rate\n- 1e-4\n")
    (root / "typo.yaml").write_text(
        (CONFIGS_DIR / "bert_rotten_tomatoes.yaml").read_text() + "num_train_epoch: 1\n"
    )
    (root / "no_images" / "train" / "a").mkdir(parents=True)
    (root / "no_images" / "train" / "a" / "notes.txt").write_text("not an image")
    (root / "empty_dir").mkdir()
    _image_folder(root / "images")
    (_image_folder(root / "garbage") / "train" / "0_tshirt_top" / "3.png").write_bytes(b"not an image at all")
    truncated = _image_folder(root / "truncated") / "train" / "1_trouser" / "2.png"
    truncated.write_bytes(truncated.read_bytes()[:200])

    from transformers import BertConfig, BertForSequenceClassification

    pickled = root / "pickle_model"
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    config.save_pretrained(pickled)
    torch.save(BertForSequenceClassification(config).state_dict(), pickled / "pytorch_model.bin")

    _checkpoint_copy(f, "other_task", _edit_manifest(task="image-classification"))
    _checkpoint_copy(f, "other_labels", _edit_manifest(label_names=["negative", "positive"]))
    _checkpoint_copy(f, "no_marker", lambda p: (p / ckpt.COMPLETE).unlink())
    _checkpoint_copy(f, "holds_code", _plant_code("random_states_0.pkl"))
    _checkpoint_copy(f, "optimizer_holds_code", _plant_code("optimizer.bin"))
    return f


def _text(f: Files, *extra: str, out: Path | None = None) -> list[str]:
    return tiny_text_args(
        {"train": f.train, "validation": f.validation},
        out or f.done,
        "max_steps=1",
        "overwrite_output_dir=true",
        *extra,
    )


def _image(f: Files, data_dir: Path, *extra: str) -> list[str]:
    return [
        "--config",
        IMAGEFOLDER,
        f"model_config={TINY_VIT}",
        f"data_dir={data_dir}",
        f"output_dir={f.done}",
        "overwrite_output_dir=true",
        "max_steps=1",
        *extra,
    ]


def _resume(f: Files, name: str, *extra: str) -> list[str]:
    return _text(f, f"resume_from_checkpoint={f.root / 'checkpoints' / name}", *extra)


BIGGER_BERT = TINY_BERT.replace("hidden_size: 32", "hidden_size: 64")

# id -> (arguments, the part of the one error line that must be there)
CASES: dict[str, tuple[Callable[[Files], list[str]], str]] = {
    # data files
    "train_file_missing": (lambda f: _text(f, f"train_file={f.root / 'nope.csv'}"), "train file not found"),
    "validation_file_missing": (
        lambda f: _text(f, f"validation_file={f.root / 'nope.csv'}"),
        "validation file not found",
    ),
    "empty_file": (lambda f: _text(f, f"train_file={f.root / 'empty.csv'}"), "train file is empty"),
    "header_only": (
        lambda f: _text(f, f"train_file={f.root / 'header_only.csv'}"),
        "the train data has no rows",
    ),
    "unsupported_type": (
        lambda f: _text(f, f"train_file={f.root / 'train.docx'}"),
        "unsupported file type '.docx'",
    ),
    "csv_ragged_more": (
        lambda f: _text(f, f"train_file={f.root / 'ragged_more.csv'}"),
        "line 3 has 3 fields, the header has 2; fix that row",
    ),
    "csv_ragged_fewer": (
        lambda f: _text(f, f"train_file={f.root / 'ragged_fewer.csv'}"),
        "label column 'label' in the train data has empty (null) values (first at row 2)",
    ),
    "jsonl_broken": (
        lambda f: _text(f, f"train_file={f.root / 'broken.jsonl'}", "validation_file=null"),
        "is not valid JSON or JSON Lines: line 2 column",
    ),
    "json_broken": (
        lambda f: _text(f, f"train_file={f.root / 'broken.json'}", "validation_file=null"),
        "is not valid JSON or JSON Lines: line 1 column",
    ),
    # columns and labels
    "text_column_missing": (
        lambda f: _text(f, "text_column=review"),
        "column 'review' not found in the train data; columns are: text, label",
    ),
    "label_column_missing": (
        lambda f: _text(f, "label_column=sentiment"),
        "column 'sentiment' not found in the train data; columns are: text, label",
    ),
    "single_class": (
        lambda f: _text(f, f"train_file={f.root / 'single_class.csv'}"),
        "has a single class (1); a classifier needs at least two",
    ),
    "unseen_eval_labels": (
        lambda f: _text(f, f"validation_file={f.root / 'unseen.csv'}"),
        "validation labels ['2'] were not seen in training (known: 0, 1)",
    ),
    "numeric_text": (
        lambda f: _text(f, f"train_file={f.root / 'numeric_text.csv'}"),
        "text column 'text' in the train data holds Value('int64'), not text",
    ),
    "null_text": (
        lambda f: _text(f, f"train_file={f.root / 'null_text.csv'}"),
        "text column 'text' in the train data has empty (null) values",
    ),
    # images
    "data_dir_missing": (lambda f: _image(f, f.root / "nope"), "data_dir not found"),
    "image_folder_without_images": (lambda f: _image(f, f.root / "no_images"), "holds no images"),
    "image_folder_empty": (lambda f: _image(f, f.root / "empty_dir"), "holds no images"),
    "image_corrupt": (lambda f: _image(f, f.root / "garbage"), "cannot read image"),
    "image_truncated": (lambda f: _image(f, f.root / "truncated"), "1_trouser/2.png in the train data"),
    "image_size_below_patch_size": (
        lambda f: _image(
            f, f.root / "images", f"model_config={TINY_VIT.replace('image_size: 28', 'image_size: 4')}"
        ),
        "image_size 4 is smaller than its patch_size 7",
    ),
    # models
    "model_path_missing": (
        lambda f: _text(f, "model_config=null", f"model_name_or_path={f.root / 'nope'}"),
        "model path does not exist",
    ),
    "tokenizer_path_missing": (
        lambda f: _text(f, f"tokenizer_name={f.root / 'nope'}"),
        "tokenizer path does not exist",
    ),
    "not_a_classification_model": (
        lambda f: _image(f, f.root / "images", "model_config=null", f"model_name_or_path={TOKENIZER}"),
        "is not a model that AutoModelForImageClassification can load",
    ),
    "pickle_weights": (
        lambda f: _text(f, "model_config=null", f"model_name_or_path={f.root / 'pickle_model'}"),
        "pass allow_pickle_weights=true if you trust its source",
    ),
    "pad_to_multiple_of_past_position_limit": (
        lambda f: _text(f, "pad_to_multiple_of=200"),
        "pads batches of up to max_length=32 tokens to 200, past the model's position limit 128",
    ),
    "max_length_over_position_limit": (
        lambda f: _text(f, "max_length=512"),
        "max_length 512 exceeds the model's position limit 128",
    ),
    # checkpoints
    "checkpoint_other_task": (
        lambda f: _resume(f, "other_task"),
        "the checkpoint was trained with task=image-classification, this run has task=text-classification",
    ),
    "checkpoint_other_labels": (
        lambda f: _resume(f, "other_labels"),
        "trained on the labels ['negative', 'positive'], this run's data has ['0', '1']",
    ),
    "checkpoint_other_model": (
        lambda f: _text(f, f"model_config={BIGGER_BERT}", "resume_from_checkpoint=latest"),
        "does not fit this model",
    ),
    "checkpoint_other_batch": (
        lambda f: _text(f, "resume_from_checkpoint=latest", "per_device_train_batch_size=4"),
        "resume with the same settings",
    ),
    "checkpoint_without_marker": (
        lambda f: _resume(f, "no_marker"),
        "is not a complete checkpoint (no COMPLETE",
    ),
    "checkpoint_holding_code": (lambda f: _resume(f, "holds_code"), "does not load as plain data"),
    "checkpoint_optimizer_holding_code": (
        lambda f: _resume(f, "optimizer_holds_code"),
        "does not load as plain data",
    ),
    "checkpoint_missing": (
        lambda f: _text(f, f"resume_from_checkpoint={f.root / 'nope'}"),
        "checkpoint not found",
    ),
    "no_checkpoint_to_resume": (
        lambda f: _text(f, "resume_from_checkpoint=latest", out=f.root / "fresh"),
        "no complete checkpoint in",
    ),
    # config
    "unknown_key": (
        lambda f: _text(f, "learnig_rate=1e-4"),
        "unknown config key 'learnig_rate'; did you mean learning_rate?",
    ),
    "unknown_key_in_recipe": (
        lambda f: ["--config", str(f.root / "typo.yaml"), f"output_dir={f.done}"],
        "unknown config key 'num_train_epoch'; did you mean num_train_epochs?",
    ),
    "wrong_type_int": (
        lambda f: _text(f, "per_device_train_batch_size=two"),
        "per_device_train_batch_size must be an integer, got 'two'",
    ),
    "wrong_type_bool": (lambda f: _text(f, "group_by_length=maybe"), "group_by_length must be true or false"),
    "wrong_type_number": (lambda f: _text(f, "learning_rate=fast"), "learning_rate must be a number"),
    "batch_size_zero": (
        lambda f: _text(f, "per_device_train_batch_size=0"),
        "per_device_train_batch_size must be a positive integer, got 0",
    ),
    "batch_size_negative": (
        lambda f: _text(f, "per_device_train_batch_size=-8"),
        "per_device_train_batch_size must be a positive integer, got -8",
    ),
    "learning_rate_zero": (lambda f: _text(f, "learning_rate=0"), "learning_rate must be > 0, got 0.0"),
    "learning_rate_negative": (lambda f: _text(f, "learning_rate=-1e-4"), "learning_rate must be > 0"),
    "accumulation_zero": (
        lambda f: _text(f, "gradient_accumulation_steps=0"),
        "gradient_accumulation_steps must be a positive integer, got 0",
    ),
    "accumulation_over_epoch": (
        lambda f: _text(f, "gradient_accumulation_steps=50", "per_device_train_batch_size=8"),
        "gradient_accumulation_steps=50 exceeds the 5 batches per process in an epoch",
    ),
    "nonfinite_limit_zero": (
        lambda f: _text(f, "max_nonfinite_loss_steps=0"),
        "max_nonfinite_loss_steps must be a positive integer",
    ),
    "ddp_timeout_negative": (lambda f: _text(f, "ddp_timeout=-1"), "ddp_timeout must be a positive integer"),
    "recipe_not_yaml": (
        lambda f: ["--config", str(f.root / "bad.yaml"), f"output_dir={f.done}"],
        "is not valid YAML (line",
    ),
    "recipe_not_a_mapping": (
        lambda f: ["--config", str(f.root / "list.yaml"), f"output_dir={f.done}"],
        "must hold a mapping of config keys",
    ),
    "recipe_is_a_folder": (
        lambda f: ["--config", str(f.root), f"output_dir={f.done}"],
        "config file is a folder, not a recipe file",
    ),
    "metric_for_best_model_unknown": (
        lambda f: _text(f, "metric_for_best_model=bogus"),
        "metric_for_best_model must be one of accuracy, macro_f1",
    ),
    "recipe_missing": (
        lambda f: ["--config", str(f.root / "nope.yaml"), f"output_dir={f.done}"],
        "config file not found",
    ),
    "unknown_option": (lambda f: [*_text(f), "--learning-rate", "1"], "unrecognized arguments: --learning-rate"),
    "not_key_value": (lambda f: [*_text(f), "fast"], "expected key=value, got 'fast'"),
    # output directory and hardware
    "finished_output_dir": (
        lambda f: [a for a in _text(f) if a != "overwrite_output_dir=true"],
        "already holds a finished run; pass overwrite_output_dir=true",
    ),
    "device_missing": (
        lambda f: _text(f, "model_parallel=true", "devices=cuda:5"),
        "device cuda:5 does not exist",
    ),
    "device_unknown": (lambda f: _text(f, "model_parallel=true", "devices=tpu:0"), "unknown device 'tpu:0'"),
    "devices_without_model_parallel": (
        lambda f: _text(f, "devices=cpu,cpu"),
        "devices is for model_parallel=true",
    ),
    "plan_only_without_model_parallel": (
        lambda f: _text(f, "--plan-only"),
        "--plan-only needs model_parallel=true",
    ),
    "freeze_embeddings_for_images": (
        lambda f: _text(f, "task=image-classification", "freeze_embeddings=true"),
        "freeze_embeddings is for models with a word-embedding table",
    ),
}


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, files, capsys):
    make_args, message = CASES[case]
    before = _snapshot(files.done)
    with pytest.raises(SystemExit) as exit_info:
        main(make_args(files))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-2000:]
    assert message in errors[0]
    assert _snapshot(files.done) == before, "the finished run's files changed"
    assert not (files.root / "checkpoints" / "code-ran").exists()


def test_pickle_weights_load_when_the_user_opts_in(files):
    from finetune.config import load_config
    from finetune.models import build_model

    cfg = load_config(
        None,
        [
            f"model_name_or_path={files.root / 'pickle_model'}",
            "allow_pickle_weights=true",
            f"output_dir={files.root / 'o'}",
        ],
    )
    assert build_model(cfg.model_args, ["0", "1"]).config.hidden_size == 32


def test_odd_images_just_work(tmp_path):
    """Grayscale, palette, RGBA and RGB mixed, and images far smaller than a patch (resized)."""
    root = _image_folder(tmp_path / "images")
    for i, png in enumerate(sorted(root.rglob("*.png"))):
        image = Image.open(png)
        image.convert(["L", "RGB", "P", "RGBA", "LA"][i % 5]).save(png)
    Image.new("RGB", (3, 3), (200, 10, 10)).save(root / "train" / "1_trouser" / "tiny.png")
    Image.new("L", (1, 5), 128).save(root / "train" / "0_tshirt_top" / "sliver.png")
    results = main(
        [
            "--config",
            IMAGEFOLDER,
            f"model_config={TINY_VIT}",
            f"data_dir={root}",
            "max_steps=2",
            "per_device_train_batch_size=7",
            "validation_split_percentage=25",
            f"output_dir={tmp_path / 'o'}",
        ]
    )
    assert results["step"] == 2 and results["validation"]["num_samples"] >= 3


# --- the real command: no traceback ---------------------------------------------------------------


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "finetune/run.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
    )


def _assert_one_line_exit_2(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]


@pytest.mark.parametrize(
    "case", ["csv_ragged_more", "image_corrupt", "checkpoint_holding_code", "finished_output_dir"]
)
def test_bad_input_from_the_command_line(case, files):
    make_args, message = CASES[case]
    before = _snapshot(files.done)
    _assert_one_line_exit_2(_run(make_args(files), files.root), message)
    assert _snapshot(files.done) == before
    assert not (files.root / "checkpoints" / "code-ran").exists()


def test_image_that_fails_only_when_decoded_is_named(tmp_path):
    """A JPEG whose pixel data is cut short passes the load-time check (PIL's verify() reads headers);
    decoding it in training raises one line naming the file, still exit 2 and no traceback."""
    root = _image_folder(tmp_path / "images")
    victim = root / "train" / "1_trouser" / "cut.jpg"
    Image.open(root / "train" / "1_trouser" / "0.png").convert("RGB").resize((200, 200)).save(
        victim, quality=95
    )
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    args = [
        "--config",
        IMAGEFOLDER,
        f"model_config={TINY_VIT}",
        f"data_dir={root}",
        "num_train_epochs=1",
        "per_device_train_batch_size=4",
        f"output_dir={tmp_path / 'o'}",
    ]
    _assert_one_line_exit_2(_run(args, tmp_path), "cut.jpg")


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
def test_model_parallel_that_cannot_run_is_one_line(
    env, extra, message, files, tmp_path, monkeypatch, capsys
):
    """DDP x layer split and FSDP do not combine; under several processes each takes its own GPUs.
    Refused before any process group forms (as if launched on a machine with 4 GPUs: the check runs
    first, so no GPU is touched)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for key, value in {"LOCAL_RANK": "0", **env}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "o"
    assert message in user_error(capsys, main, _text(files, "model_parallel=true", *extra, out=out))
    assert not out.exists()


# A missing or unparsable accelerate config: tests/test_launch.py (finetune-launch).
