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
# ENOSPC and EROFS come from the kernel (a tmpfs filled, or remounted read-only); EIO from a real failing
# block device (ext4 on a loop device whose capacity is cut below the file system's size: writes past
# the cut fail when they reach the device, which the flushes report); EDQUOT, which root is exempt
# from, from the flush (os.fsync) where a network file system reports it. Each: one line that says
# what to do for that errno, and nothing half-written left (and an earlier export or evaluation intact).

ADVICE = {"full": "free some space", "read-only": "that file system is read-only: choose another",
          "device": "the disk reported a device error (EIO)", "quota": "free some space under your disk quota"}  # fmt: skip


def _one_error(capsys, call) -> str:
    with pytest.raises(SystemExit) as exit_info:
        call()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


def _remount(folder: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], check=True)


def _no_export_left(out: Path) -> None:
    assert not (out / "model").exists() and not (out / "results.json").exists()
    assert not (out / ".export-new").exists() and not (out / ".export-old").exists()


@pytest.fixture
def failing_disk(tmp_path):
    """ext4 (64 MiB, no journal) on a loop device over a sparse file; `fail()` cuts the device's capacity
    to what is in use now and a little more, so that later writes past it fail for real with EIO."""
    if not ROOT or not all(shutil.which(tool) for tool in ("losetup", "mkfs.ext4")):
        pytest.skip("a loop device needs root, losetup and mkfs.ext4")
    back, mount = tmp_path / "back", tmp_path / "disk"
    back.mkdir(), mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80M", "tmpfs", str(back)], check=True)
    image, loop = back / "disk.img", None
    try:
        image.touch()
        os.truncate(image, 64 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-b", "4096", "-O", "^has_journal", str(image)], check=True)
        made = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"no loop device here: {made.stderr.strip()}")
        loop = made.stdout.strip()
        subprocess.run(["mount", loop, str(mount)], check=True)

        def fail() -> None:
            os.sync()
            stat = os.statvfs(mount)
            used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
            os.truncate(image, used + (1 << 20))
            subprocess.run(["losetup", "-c", loop], check=True)

        yield mount, fail
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False)
        subprocess.run(["umount", "-l", str(back)], check=False)


def test_a_disk_that_fills_during_a_checkpoint_is_one_line_and_leaves_no_partial_save(text, small_disk, capsys):
    out = small_disk / "run"
    line = user_error(capsys, main, tiny(text, out, "save_steps=1"))
    assert "could not save the checkpoint of step 1: No space left on device" in line and ADVICE["full"] in line
    assert not list((out / "checkpoints").glob(".tmp-*"))


class _BreakAt(Hooks):
    """Breaks the disk right after optimizer step `step` (its logging, evaluation and save done)."""

    def __init__(self, step: int, action):
        super().__init__()
        self.step, self.action = step, action

    def mark(self, name, value=None):
        if name == "step" and value == self.step:
            self.action()


@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
def test_a_disk_that_turns_read_only_before_a_checkpoint_says_it_is_read_only(text, small_disk, capsys):
    out = small_disk / "run"
    args = tiny(text, out, "save_steps=2", "max_steps=4", "logging_steps=100")
    line = _one_error(capsys, lambda: main(args, hooks=_BreakAt(1, lambda: _remount(small_disk, "ro"))))
    _remount(small_disk, "rw")
    assert "could not save the checkpoint of step 2: Read-only file system" in line
    assert ADVICE["read-only"] in line and "free some space" not in line
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").iterdir())


@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_disk_that_fills_or_turns_read_only_before_the_export_keeps_the_checkpoints(fault, text, small_disk, capsys):
    """The checkpoint of step 2 is written; then the disk fills (or is remounted read-only), and the
    export fails for real: one line that says what to do for that error, the checkpoint whole, nothing
    of the export left (card and curves included)."""
    out = small_disk / "run"
    args = tiny(text, out, "save_steps=2", "max_steps=2", "save_total_limit=1")
    checkpoints_before = None

    def break_disk():
        nonlocal checkpoints_before
        checkpoints_before = _hashes(out / "checkpoints")
        _fill(small_disk) if fault == "full" else _remount(small_disk, "ro")

    line = _one_error(capsys, lambda: main(args, hooks=_BreakAt(2, break_disk)))
    assert ("No space left on device" if fault == "full" else "Read-only file system") in line
    assert "could not write the export" in line and ADVICE[fault] in line
    assert fault == "full" or "free some space" not in line
    if fault == "read-only":
        _remount(small_disk, "rw")
    assert _hashes(out / "checkpoints") == checkpoints_before
    _no_export_left(out)
    assert not (out / "training_curves.png").exists()


def _export_state(out: Path) -> dict:
    return {name: _hashes(out / name) if (out / name).is_dir() else hashlib.sha256((out / name).read_bytes()).hexdigest()
            for name in ("model", "results.json", "training_curves.png")}  # fmt: skip


@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
@pytest.mark.parametrize("how", ["disk fills", "card write fails"])
def test_a_re_export_that_fails_keeps_the_earlier_export(how, text, small_disk, monkeypatch, capsys):
    """A finished run, resumed for one more step: the disk fills before the new export (safetensors
    writes its file whole or not at all), or the card, written last into the export, fails (ENOSPC);
    either way the earlier export, its card, curves and results.json keep their bytes (before, the new
    weights had replaced the earlier ones beside the earlier results.json), no hidden folder is left."""
    import errno

    import finetune.export as export

    out = small_disk / "run"
    main(tiny(text, out, "save_steps=2", "max_steps=2"))
    earlier = _export_state(out)
    if how == "card write fails":
        def card(folder, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "README.md"))

        monkeypatch.setattr(export, "write_model_card", card)
    args = tiny(text, out, "save_steps=2", "max_steps=3", "resume_from_checkpoint=latest")
    fill = (lambda: _fill(small_disk)) if how == "disk fills" else (lambda: None)
    line = _one_error(capsys, lambda: main(args, hooks=_BreakAt(3, fill)))
    assert "could not write the export" in line and ADVICE["full"] in line
    (small_disk / "filler").unlink(missing_ok=True)
    assert _export_state(out) == earlier
    assert not (out / ".export-new").exists() and not (out / ".export-old").exists()


def test_a_failing_device_during_a_checkpoint_says_so(text, failing_disk, capsys):
    """A real EIO, which the checkpoint's flush reports: not "free some space", no half-written save."""
    mount, fail = failing_disk
    out = mount / "run"
    line = _one_error(capsys, lambda: main(tiny(text, out, "save_steps=2", "max_steps=2"), hooks=_BreakAt(1, fail)))
    assert "could not save the checkpoint of step 2: Input/output error" in line
    assert ADVICE["device"] in line and "free some space" not in line
    assert not list((out / "checkpoints").glob(".tmp-*")) and not list((out / "checkpoints").glob("step-*"))


def test_a_failing_device_during_the_export_says_so(text, failing_disk, capsys):
    mount, fail = failing_disk
    out = mount / "run"
    line = _one_error(capsys, lambda: main(tiny(text, out, "max_steps=2"), hooks=_BreakAt(2, fail)))
    assert "could not write the export" in line and "Input/output error" in line and ADVICE["device"] in line
    _no_export_left(out)


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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """A finished tiny run, and its evaluation outputs' sizes on a disk with room (to leave a full disk
    just enough for some of them)."""
    root = tmp_path_factory.mktemp("finished")
    data = {"train": write_csv(root / "train.csv", rotten_rows(37)),
            "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    main(tiny(data, root / "run", "max_steps=1"))
    _reset_accelerate()
    evaluate([str(root / "run" / "model"), "--output", str(root / "sized"), "--predictions"])
    _reset_accelerate()
    return root / "run", {p.name: p.stat().st_size for p in (root / "sized").iterdir()}


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.parametrize("room", ["metrics", "metrics and matrix", "read-only"])
def test_an_evaluation_that_cannot_be_written_leaves_nothing_half_written(room, finished_run, small_disk, tmp_path, capsys):
    """With room for metrics.json only, or for it and the confusion matrix but not the whole of
    predictions.jsonl, or on a read-only disk: one line for that error, and nothing of the evaluation in
    --output (an earlier evaluation there keeps its bytes)."""
    (run, sizes), target = finished_run, small_disk / "eval"
    export = run / "model"
    evaluate([str(export), "--output", str(target)])  # an earlier evaluation, replaced only whole
    earlier = _hashes(target)
    if room == "read-only":
        _remount(small_disk, "ro")
    else:
        _fill(small_disk)
        page = 4096
        keep = sizes["metrics.json"] + (sizes["confusion_matrix.png"] if room == "metrics and matrix" else 0)
        keep = -(-keep // page) * page + page + sizes["predictions.jsonl"] // 2
        keep = min(keep, (small_disk / "filler").stat().st_size)
        os.truncate(small_disk / "filler", (small_disk / "filler").stat().st_size - keep)
    line = _one_error(capsys, lambda: evaluate([str(export), "--output", str(target), "--predictions"]))
    if room == "read-only":
        _remount(small_disk, "rw")
        assert "Read-only file system" in line and ADVICE["read-only"] in line and "--output" in line
    else:
        assert "No space left on device" in line and ADVICE["full"] in line
    assert "cannot write the evaluation" in line and "nothing of it was left" in line
    assert _hashes(target) == earlier
    assert not [p for p in target.iterdir() if p.name.startswith(".")]


def test_a_failing_device_during_an_evaluation_leaves_nothing(finished_run, failing_disk, capsys):
    mount, fail = failing_disk
    fail()
    line = _one_error(capsys, lambda: evaluate([str(finished_run[0] / "model"), "--output", str(mount / "eval"), "--predictions"]))
    assert "cannot write the evaluation" in line and "Input/output error" in line and ADVICE["device"] in line
    assert not (mount / "eval").exists() or not list((mount / "eval").iterdir())


@pytest.mark.parametrize("writer", ["checkpoint", "export", "evaluation"])
def test_a_disk_quota_reported_by_the_flush_is_one_line_for_each_writer(writer, text, finished_run, tmp_path, monkeypatch, capsys):
    """EDQUOT as a network file system reports it, at the flush (root is exempt from a local quota):
    os.fsync of any file under the output folder raises it. The line says to free space under the quota."""
    import errno

    target = tmp_path / "quota"
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(target)):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    if writer == "evaluation":
        line = _one_error(capsys, lambda: evaluate([str(finished_run[0] / "model"), "--output", str(target)]))
        assert not target.exists()
    else:
        extra = ("save_steps=1",) if writer == "checkpoint" else ()
        line = _one_error(capsys, lambda: main(tiny(text, target, "max_steps=1", *extra)))
        if writer == "export":
            _no_export_left(target)
        else:
            assert not list((target / "checkpoints").iterdir())
    assert "Disk quota exceeded" in line and ADVICE["quota"] in line


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
    # Rust's io::Error names the errno the same way for a quota and a failing disk: safetensors' own message
    # for the full disk, with the errno swapped
    message = str(safetensors_error.value)
    for code in (errno.EDQUOT, errno.EIO):
        other = message.replace("os error 28", f"os error {code}").replace(os.strerror(errno.ENOSPC), os.strerror(code))
        assert write_failure(type(safetensors_error.value)(other)).errno == code
    assert write_failure(RuntimeError("shapes do not match")) is None


# --- checks before anything is written --------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> tuple[dict[str, Path], Path]:
    """A finished tiny run with checkpoints at steps 6 and 9 (of 10): what refused resumes must not change."""
    root = tmp_path_factory.mktemp("saved")
    data = {"train": write_csv(root / "train.csv", rotten_rows(37)),
            "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    main(tiny(data, root / "run", "save_steps=3", "per_device_train_batch_size=4"))
    _reset_accelerate()
    return data, root / "run"


def test_a_resume_with_fewer_samples_than_consumed_is_refused_before_config_yaml_is_rewritten(saved_run, capsys):
    data, out = saved_run
    before = _hashes(out)
    line = user_error(capsys, main, tiny(data, out, "resume_from_checkpoint=latest", "max_train_samples=8",
                                         "per_device_train_batch_size=4"))  # fmt: skip
    assert "trained on 37 samples an epoch, this run has 8" in line
    assert _hashes(out) == before


def test_a_resume_past_max_steps_is_refused_before_anything_is_written(saved_run, capsys):
    """The checkpoint is at step 9; max_steps=2 would export the step-9 model under a config.yaml that
    says 2 steps."""
    data, out = saved_run
    before = _hashes(out)
    line = user_error(capsys, main, tiny(data, out, "resume_from_checkpoint=latest", "max_steps=2",
                                         "per_device_train_batch_size=4"))  # fmt: skip
    assert "the checkpoint is at optimizer step 9, past the 2 steps of this run (max_steps=2)" in line
    assert "max_steps=9 or more" in line and "evaluate_checkpoint.py" in line
    assert _hashes(out) == before


@pytest.mark.parametrize(
    "change, fragment",
    [
        ("seed=7", "trained with seed=42, this run has seed=7; resume with seed=42"),
        ("freeze_layers=1", "trained with freeze_layers=0, this run has freeze_layers=1"),
        ("group_by_length=false", "trained with group_by_length=true"),
        ("max_length=16", "trained with max_length=32, this run has max_length=16; resume with max_length=32"),
    ],
)
def test_a_resume_that_would_change_the_run_names_the_setting(change, fragment, saved_run, capsys):
    data, out = saved_run
    before = _hashes(out)
    line = user_error(capsys, main, tiny(data, out, "resume_from_checkpoint=latest", change,
                                         "per_device_train_batch_size=4"))  # fmt: skip
    assert fragment in line
    assert _hashes(out) == before


@pytest.mark.parametrize(
    "key, value, shown",
    [("label_smoothing", 0.1, "label_smoothing=0.0"), ("class_weights", "balanced", "class_weights=null"),
     ("metric_for_best_model", "macro_f1", "metric_for_best_model=accuracy"),
     ("greater_is_better", False, "greater_is_better=true"), ("random_flip", True, "random_flip=false"),
     ("augment", ["crop"], "augment=[]"), ("validation_split_percentage", 20.0, "validation_split_percentage=10.0"),
     ("label_column", "sentiment", "label_column=label"), ("text_pair_column", "other", "text_pair_column=null")],
)  # fmt: skip
def test_settings_that_define_the_data_or_the_loss_are_fixed_on_resume(key, value, shown, saved_run):
    """The same check as above, on the saved manifest, for the rest of what defines the data or the loss."""
    from finetune import checkpoint as ckpt
    from finetune.config import config_from_dict
    from finetune.errors import UserError

    manifest = ckpt.read_manifest(ckpt.list_checkpoints(saved_run[1])[-1])
    cfg = config_from_dict({**manifest["config"], key: value}, saved=True)
    with pytest.raises(UserError) as refused:
        ckpt.check_resume_compatible(manifest, cfg, 1, manifest["label_names"], 37, fsdp=False)
    assert f"the checkpoint was trained with {shown}, this run has {key}=" in str(refused.value)


class _Optimizer(Hooks):
    """Keeps the weight decay of the optimizer's first group at each step (after the resume's restore)."""

    def __init__(self):
        super().__init__()
        self.run, self.weight_decay = None, []

    def mark(self, name, value=None):
        if name == "prepared":
            self.run = value
        elif name == "step":
            self.weight_decay.append(self.run.optimizer.param_groups[0]["weight_decay"])


def test_a_resume_that_changes_what_may_change_says_so_and_keeps_the_history(text, tmp_path, capsys):
    """learning_rate, weight_decay, dropout, max_steps and the cadences may change on a resume: one line
    names each change, old -> new; the new weight decay is the one used (torch would restore the old);
    the checkpoints' manifests and results.json keep every resume's changes, so that config.yaml (the
    last values) is not read as the whole run's."""
    out = tmp_path / "run"
    main(tiny(text, out, "save_steps=3", "per_device_train_batch_size=4", "max_steps=6"))
    capsys.readouterr()
    watch = _Optimizer()
    main(tiny(text, out, "resume_from_checkpoint=latest", "per_device_train_batch_size=4", "max_steps=8",
              "save_steps=2", "weight_decay=0.1", "dropout=0.1"), hooks=watch)  # fmt: skip
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resumed with changed settings")]
    assert said == ["resumed with changed settings: dropout null -> 0.1, max_steps 6 -> 8, weight_decay 0.01 -> 0.1, "
                    "save_steps 3 -> 2"]  # fmt: skip
    assert watch.weight_decay == [0.1, 0.1]
    first = {"step": 6, "changed": {"dropout": [None, 0.1], "max_steps": [6, 8], "weight_decay": [0.01, 0.1],
                                    "save_steps": [3, 2]}}  # fmt: skip
    assert json.loads((out / "checkpoints" / "step-00000008" / "manifest.json").read_text())["resumed_with"] == [first]
    results = main(tiny(text, out, "resume_from_checkpoint=latest", "per_device_train_batch_size=4", "max_steps=9",
                        "save_steps=2", "weight_decay=0.1", "dropout=0.1"))  # fmt: skip
    assert results["resumed_with"] == [first, {"step": 8, "changed": {"max_steps": [8, 9]}}]
    assert json.loads((out / "results.json").read_text())["resumed_with"] == results["resumed_with"]


def _write_tokenizer(folder: Path, special: list[str]) -> Path:
    """A byte-level BPE tokenizer (GPT-2's kind) trained here on a few sentences, with only `special`:
    ["<|endoftext|>"] is GPT-2's case, a tokenizer with an end-of-text token and no padding token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator([row["text"] for row in rotten_rows(200)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=special[0] if special else None)
    assert fast.pad_token is None and fast.unk_token is None
    fast.save_pretrained(folder)
    return folder


GPT2 = "{model_type: gpt2, n_embd: 32, n_layer: 2, n_head: 4, n_positions: 64}"


@pytest.mark.parametrize("model", [GPT2, TINY_BERT], ids=["gpt2-config-without-pad", "bert-config-with-pad-0"])
def test_a_tokenizer_with_only_an_end_of_text_token_pads_with_it(model, text, tmp_path):
    """Whatever the model's config says of padding (GPT-2's: nothing; BERT's: id 0), the tokenizer pads
    the batches: without a padding token it pads with its end-of-text token, as transformers' examples
    do, and the model is told that id (instead of ValueError "Asking to pad..." at the first batch)."""
    tokenizer = _write_tokenizer(tmp_path / "tok", ["<|endoftext|>"])
    out = tmp_path / "run"
    results = main(tiny(text, out, f"model_config={model}", f"tokenizer_name={tokenizer}", "max_steps=2"))
    assert results["validation"]["num_samples"] == 13
    eos = json.loads((tokenizer / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    assert json.loads((out / "model" / "config.json").read_text())["pad_token_id"] == eos
    saved = json.loads((out / "model" / "tokenizer_config.json").read_text())
    assert saved["pad_token"] == "<|endoftext|>"


def test_a_model_without_a_padding_token_trains(text, tmp_path):
    """GPT-2's config has no padding token: the tokenizer's is set on it."""
    results = main(tiny(text, tmp_path / "run", f"model_config={GPT2}", "max_steps=2"))
    assert results["validation"]["num_samples"] == 13
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["pad_token_id"] == 0  # the BERT tokenizer's [PAD]


def test_a_tokenizer_that_cannot_pad_is_refused_before_anything_is_written(text, tmp_path, capsys):
    tokenizer = _write_tokenizer(tmp_path / "tok", [])
    out = tmp_path / "run"
    line = user_error(capsys, main, tiny(text, out, f"tokenizer_name={tokenizer}", "max_steps=2"))
    assert "has no padding token, and no end-of-text or unknown token to pad with" in line
    assert not out.exists()


def test_an_export_or_a_run_given_to_resume_from_says_what_it_is(saved_run, tmp_path, capsys):
    data, out = saved_run
    line = user_error(capsys, main, tiny(data, tmp_path / "next", f"resume_from_checkpoint={out / 'model'}"))
    assert "is an exported model, not a training-state checkpoint" in line
    line = user_error(capsys, main, tiny(data, tmp_path / "next", f"resume_from_checkpoint={out}"))
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


def test_what_the_fuzzer_found_is_said_with_its_fix(text, tmp_path, capsys):
    """tests/test_fuzz.py's findings: a recipe with the command line's dotted form of a key; a held-out
    validation split that cannot hold every class (a class with one sample)."""
    recipe = _write(tmp_path / "dotted.yaml", "model_config.hidden_size: 8\n")
    line = user_error(capsys, main, ["--config", str(recipe), *tiny(text, tmp_path / "run")])
    assert "in a recipe write model_config: {hidden_size: ...}" in line
    rows = [{"text": f"sentence {i}", "label": "rare" if i == 0 else ["pos", "neg"][i % 2]} for i in range(20)]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": "null"}
    line = user_error(capsys, main, tiny(data, tmp_path / "run"))
    assert "cannot hold out a stratified validation split" in line and "give a validation_file" in line


def _write(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


def _loop(folder: Path) -> Path:
    (folder / "a.csv").symlink_to(folder / "b.csv")
    (folder / "b.csv").symlink_to(folder / "a.csv")
    return folder / "a.csv"


# --- data that probably means something else ---------------------------------------------------------


@pytest.mark.parametrize(
    "labels, fragment",
    [
        (["['art', 'film']", "['art']", "film"], "holds a list written as text"),
        (["[art, film]", "[art]", "film"], "holds a list written as text ('[art, film]' at row 1)"),
        (["pos", " pos", "neg"], "which differ only by spaces"),
    ],
)
def test_labels_that_probably_mean_something_else_are_refused(labels, fragment, tmp_path, capsys):
    rows = [{"text": f"sentence {i}", "label": labels[i % len(labels)]} for i in range(12)]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows)}
    assert fragment in user_error(capsys, main, tiny(data, tmp_path / "run"))


def test_a_label_that_differs_only_by_spaces_or_case_in_validation_is_named(tmp_path, capsys):
    rows = [{"text": f"sentence {i}", "label": ["pos", "neg"][i % 2]} for i in range(12)]
    other = [{**row, "label": {"pos": "pos ", "neg": "Neg"}[row["label"]]} for row in rows]
    data = {"train": write_csv(tmp_path / "t.csv", rows), "validation": write_csv(tmp_path / "v.csv", other)}
    line = user_error(capsys, main, tiny(data, tmp_path / "run"))
    assert "were not seen in training" in line
    assert "'Neg' (train: 'neg'), 'pos ' (train: 'pos') differ from the training labels only by letter case and " \
           "surrounding spaces" in line  # fmt: skip


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


def test_an_image_class_only_in_validation_named_in_label_names_is_trained_with_a_warning(tmp_path, capsys):
    """label_names asks for the class, so the run goes on, but says the model cannot learn it."""
    folder = _image_folder(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog", "fox"]})
    main(_images(folder, tmp_path / "run", "label_names=[cat,dog,fox]", "max_steps=1"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("1 of the 3 classes in label_names have no training sample ('fox'" in w for w in warnings), warnings


def test_data_dir_on_the_command_line_replaces_the_recipe_s_data_files(tmp_path):
    """`task=image-classification data_dir=...` over the default (text) recipe, whose CSV files are not
    cleared: the image folder is read (before, the CSV files were, and the line spoke of a missing
    'image' column)."""
    folder = _image_folder(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    args = [a for a in _images(folder, tmp_path / "run", "max_steps=1") if not a.endswith("_file=null")]
    results = main(args)
    assert results["validation"]["num_samples"] == 6
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "train_file: null" in saved and f"data_dir: {folder}" in saved


@pytest.mark.parametrize("workers", [0, 2])
def test_image_augmentation_resumes_exactly(workers, tmp_path):
    """The flip, crop, colour and TrivialAugment draws are seeded by (seed, epoch, row): a run resumed
    mid-epoch trains the weights of the uninterrupted one, also when data-loader workers (which read
    ahead) decode and augment the images. (Under 2-process DDP and FSDP: tests/test_fsdp.py.)"""
    from safetensors.torch import load_file

    folder = _image_folder(tmp_path / "img", {"train": ["cat", "dog", "owl"], "validation": ["cat", "dog", "owl"]})
    args = ("num_train_epochs=2", "save_steps=2", "save_total_limit=null", "random_flip=true",
            "augment=[crop,color,trivial]", f"dataloader_num_workers={workers}")  # fmt: skip
    main(_images(folder, tmp_path / "full", *args))
    first = sorted((tmp_path / "full" / "checkpoints").iterdir())[0]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    main(_images(folder, resumed, *args, "resume_from_checkpoint=latest"))
    a, b = load_file(tmp_path / "full" / "model" / "model.safetensors"), load_file(resumed / "model" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0.0
