"""What the machine or the user's files get wrong, met for real: a disk that fills or turns read-only
mid-run (a small tmpfs), damaged weights, resumes that would change the run, data that means
something else, a model without a padding token. Each is one `error:` line and exit status 2 (or
is handled), nothing left behind, nothing of an earlier run changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import PIL.Image
import pytest
from conftest import (
    DATA,
    REPO,
    TINY_BERT,
    TINY_VIT,
    TOKENIZER,
    launch_command,
    rotten_rows,
    user_error,
    write_csv,
)

from finetune.errors import write_failure
from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import Hooks, main

ROOT = os.geteuid() == 0 and shutil.which("mount") is not None


def tiny(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "task=text-classification", f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}",
        f"train_file={data['train']}", f"validation_file={data['validation']}", "test_file=null",
        "max_train_samples=null", "max_eval_samples=null", "max_length=32", "label_names=null",
        "freeze_embeddings=false", "dropout=null", "logging_steps=1", "per_device_train_batch_size=8",
        f"output_dir={out}", *extra,
    ]  # fmt: skip


@pytest.fixture
def text(tmp_path) -> dict[str, Path]:
    return {"train": write_csv(tmp_path / "train.csv", rotten_rows(37)),
            "validation": write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def small_disk(tmp_path, request):
    """A real file system of 3 MiB (or the size a test names): a tmpfs. Writes past it fail with
    ENOSPC from the kernel; `mount -o remount,ro` makes later writes fail with EROFS."""
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    size = getattr(request, "param", "3M")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path) -> None:
    """Take every free byte of the file system."""
    with open(folder / "filler", "wb", buffering=0) as f:  # unbuffered: closing it writes nothing more
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


# --- real write failures -------------------------------------------------------------------------------


def test_a_disk_that_fills_during_a_checkpoint_is_one_line_and_leaves_no_partial_save(text, small_disk, capsys):
    out = small_disk / "run"
    line = user_error(capsys, main, tiny(text, out, "save_steps=1"))
    assert "could not save the checkpoint of step 1: No space left on device" in line
    assert not list((out / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_disk_that_fills_or_turns_read_only_before_the_export_keeps_the_checkpoints(fault, text, small_disk, capsys):
    """The checkpoint of step 2 is written; then the disk fills (or is remounted read-only), and the
    export fails for real: one line, the checkpoint whole, nothing half-written beside it."""
    out = small_disk / "run"
    args = tiny(text, out, "save_steps=2", "max_steps=2", "save_total_limit=1")

    def break_disk():
        if fault == "full":
            _fill(small_disk)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)

    checkpoints_before = None

    class BreakAfterSave(Hooks):
        def mark(self, name, value=None):
            nonlocal checkpoints_before
            if name == "step" and value == 2:
                checkpoints_before = _hashes(out / "checkpoints")
                break_disk()

    with pytest.raises(SystemExit) as exit_info:
        main(args, hooks=BreakAfterSave())
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    reason = "No space left on device" if fault == "full" else "Read-only file system"
    assert reason in errors[0]
    if fault == "read-only":
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert _hashes(out / "checkpoints") == checkpoints_before
    assert not (out / "results.json").exists()


def test_a_full_disk_under_two_processes_is_one_line_from_the_launch(text, small_disk):
    """Through finetune-launch (plain `accelerate launch` adds its own traceback after any failure)."""
    out = small_disk / "run"
    cmd = [*launch_command(2, launcher="finetune.launch"), str(REPO / "finetune/run.py"), *tiny(text, out, "save_steps=1")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1, result.stderr[-3000:]
    assert "No space left on device" in errors[0] and "Traceback" not in result.stderr
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_an_evaluation_onto_a_full_disk_is_one_line(text, small_disk, tmp_path, capsys):
    main(tiny(text, tmp_path / "run", "max_steps=1"))
    _fill(small_disk)
    line = user_error(capsys, evaluate, [str(tmp_path / "run" / "model"), "--output", str(small_disk / "eval")])
    assert "cannot write the evaluation" in line and "No space left on device" in line


def test_the_libraries_own_write_errors_are_read_as_the_machine_s(small_disk):
    """safetensors and torch do not raise OSError for a full disk; their errors are mapped to it."""
    import errno

    import torch
    from safetensors.torch import save_file

    _fill(small_disk)
    with pytest.raises(Exception) as safetensors_error:
        save_file({"w": torch.zeros(1000)}, str(small_disk / "w.safetensors"))
    assert write_failure(safetensors_error.value).errno == errno.ENOSPC
    with pytest.raises(Exception) as torch_error:
        torch.save(torch.zeros(100000), small_disk / "w.pt")
    assert write_failure(torch_error.value, small_disk).errno == errno.ENOSPC
    # Rust's io::Error names the errno the same way for a quota and a failing disk (messages as safetensors gives them)
    assert write_failure(RuntimeError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")).errno == errno.EDQUOT
    assert write_failure(RuntimeError("I/O error: Input/output error (os error 5)")).errno == errno.EIO
    assert write_failure(RuntimeError("shapes do not match")) is None


# --- checks before anything is written --------------------------------------------------------------


def test_a_resume_with_fewer_samples_than_consumed_is_refused_before_config_yaml_is_rewritten(text, tmp_path, capsys):
    out = tmp_path / "run"
    main(tiny(text, out, "save_steps=3", "per_device_train_batch_size=4"))
    before = _hashes(out)
    line = user_error(capsys, main, tiny(text, out, "resume_from_checkpoint=latest", "max_train_samples=8",
                                         "per_device_train_batch_size=4"))  # fmt: skip
    assert "trained on 37 samples an epoch, this run has 8" in line
    assert _hashes(out) == before


@pytest.mark.parametrize(
    "change, fragment",
    [
        ("seed=7", "trained with seed=42, this run has seed=7; resume with seed=42"),
        ("freeze_layers=1", "trained with freeze_layers=0, this run has freeze_layers=1"),
        ("group_by_length=false", "trained with group_by_length=true"),
    ],
)
def test_a_resume_that_would_change_the_run_names_the_setting(change, fragment, text, tmp_path, capsys):
    out = tmp_path / "run"
    main(tiny(text, out, "save_steps=3", "per_device_train_batch_size=4"))
    before = _hashes(out)
    line = user_error(capsys, main, tiny(text, out, "resume_from_checkpoint=latest", change,
                                         "per_device_train_batch_size=4"))  # fmt: skip
    assert fragment in line
    assert _hashes(out) == before


def test_an_export_or_a_run_given_to_resume_from_says_what_it_is(text, tmp_path, capsys):
    out = tmp_path / "run"
    main(tiny(text, out, "max_steps=2"))
    line = user_error(capsys, main, tiny(text, tmp_path / "next", f"resume_from_checkpoint={out / 'model'}"))
    assert "is an exported model, not a training-state checkpoint" in line
    line = user_error(capsys, main, tiny(text, tmp_path / "next", f"resume_from_checkpoint={out}"))
    assert "is a run directory; resume it with resume_from_checkpoint=latest" in line


# --- damaged files and misleading lines --------------------------------------------------------------


def _damaged_export(text, tmp_path, how: str) -> Path:
    out = tmp_path / "run"
    main(tiny(text, out, "max_steps=1"))
    weights = out / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\xff" * 8 + data[8:])
    return out / "model"


@pytest.mark.parametrize("how", ["truncated", "broken header"])
def test_damaged_weights_are_one_line_when_trained_from_or_evaluated(how, text, tmp_path, capsys):
    export = _damaged_export(text, tmp_path, how)
    line = user_error(capsys, main, tiny(text, tmp_path / "again", "model_config=null",
                                         f"model_name_or_path={export}"))  # fmt: skip
    assert "damaged" in line
    line = user_error(capsys, evaluate, [str(export)])
    assert "damaged" in line or "not a readable safetensors" in line


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda t: ["--config", str(_write(t / "empty.yaml", ""))], "is empty; a recipe is a YAML mapping"),
        (lambda t: [f"train_file={t}"], "is a folder, not a file"),
        (lambda t: [f"train_file={_loop(t)}"], "is a symlink loop"),
        (lambda t: ["model_config=null", f"model_name_or_path={DATA / 'bert_minilm_l6_uncased' / 'model.safetensors'}"],
         "is a file; give the folder that holds config.json"),
    ],
)
def test_lines_say_what_the_path_is(make, fragment, text, tmp_path, capsys):
    line = user_error(capsys, main, tiny(text, tmp_path / "run", *make(tmp_path)))
    assert fragment in line


def _write(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


def _loop(folder: Path) -> Path:
    (folder / "a.csv").symlink_to(folder / "b.csv")
    (folder / "b.csv").symlink_to(folder / "a.csv")
    return folder / "a.csv"


def test_a_model_without_a_padding_token_trains(text, tmp_path):
    """GPT-2 has no padding token: the tokenizer's (or its end-of-text token) is set, as transformers'
    examples do, instead of a ValueError at the first batch."""
    gpt2 = "{model_type: gpt2, n_embd: 32, n_layer: 2, n_head: 4, n_positions: 64}"
    results = main(tiny(text, tmp_path / "run", f"model_config={gpt2}", "max_steps=2"))
    assert results["validation"]["num_samples"] == 13
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["pad_token_id"] is not None


# --- data that probably means something else ---------------------------------------------------------


@pytest.mark.parametrize(
    "labels, fragment",
    [
        (["['art', 'film']", "['art']", "film"], "holds a list written as text"),
        (["pos", " pos", "neg"], "which differ only by spaces"),
    ],
)
def test_labels_that_probably_mean_something_else_are_refused(labels, fragment, tmp_path, capsys):
    rows = [{"text": f"sentence {i}", "label": labels[i % len(labels)]} for i in range(12)]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows)}
    assert fragment in user_error(capsys, main, tiny(data, tmp_path / "run"))


def _image_folder(root: Path, classes: dict[str, list[str]]) -> Path:
    for split, names in classes.items():
        for name in names:
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(3):
                PIL.Image.new("RGB", (28, 28), (40 * i, 90, 150)).save(root / split / name / f"{i}.png")
    return root


def _images(folder: Path, out: Path, *extra: str) -> list[str]:
    return ["task=image-classification", f"model_config={TINY_VIT}", "model_name_or_path=null", "train_file=null",
            "validation_file=null", "test_file=null", f"data_dir={folder}", "max_train_samples=null",
            "max_eval_samples=null", "freeze_embeddings=false", "label_names=null", "per_device_train_batch_size=4",
            "logging_steps=1", f"output_dir={out}", *extra]  # fmt: skip


def test_an_image_class_with_no_training_image_is_refused(tmp_path, capsys):
    folder = _image_folder(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog", "fox"]})
    line = user_error(capsys, main, _images(folder, tmp_path / "run"))
    assert "class 'fox'" in line and "has no training sample" in line


def test_image_augmentation_resumes_exactly(tmp_path):
    """The flip, crop, colour and TrivialAugment draws are seeded by (seed, epoch, row): a run resumed
    mid-epoch trains the weights of the uninterrupted one."""
    from safetensors.torch import load_file

    folder = _image_folder(tmp_path / "img", {"train": ["cat", "dog", "owl"], "validation": ["cat", "dog", "owl"]})
    args = ("num_train_epochs=2", "save_steps=2", "save_total_limit=null", "random_flip=true",
            "augment=[crop,color,trivial]")  # fmt: skip
    main(_images(folder, tmp_path / "full", *args))
    first = sorted((tmp_path / "full" / "checkpoints").iterdir())[0]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    main(_images(folder, resumed, *args, "resume_from_checkpoint=latest"))
    a, b = load_file(tmp_path / "full" / "model" / "model.safetensors"), load_file(resumed / "model" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0.0
