"""What the machine gets wrong, met for real: a disk that fills or turns read-only mid-run (a small
tmpfs), a failing device (EIO), a disk quota. Each is one `error:` line and exit status 2 that says what
to do for that errno (`conftest.user_error`), nothing half-written left, nothing of an earlier export
or evaluation changed. (What the user's own files get wrong: tests/test_bad_input.py.)

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_faults.py   # as root, with mount; skipped otherwise
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import EARLIER_RUN, REPO, file_hashes, launch_command, recipe_text_args, user_error

from finetune.errors import write_failure
from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import Hooks, main

ROOT = os.geteuid() == 0 and shutil.which("mount") is not None


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


def _one_error(capsys, call, rule: str | None = None) -> str:
    """`user_error` for a call that is more than `main(argv)` (hooks that break the disk mid-run)."""
    return user_error(capsys, lambda _: call(), [], rule=rule)


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


def test_a_disk_that_fills_during_a_checkpoint_is_one_line_and_leaves_no_partial_save(small_text_data, small_disk, capsys):
    out = small_disk / "run"
    line = user_error(capsys, main, recipe_text_args(small_text_data, out, "save_steps=1"),
                      rule="runs.save_failed_before_any_checkpoint")  # fmt: skip
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
def test_a_disk_that_turns_read_only_before_a_checkpoint_says_it_is_read_only(small_text_data, small_disk, capsys):
    out = small_disk / "run"
    args = recipe_text_args(small_text_data, out, "save_steps=2", "max_steps=4", "logging_steps=100")
    line = _one_error(capsys, lambda: main(args, hooks=_BreakAt(1, lambda: _remount(small_disk, "ro"))),
                      "runs.save_failed_before_any_checkpoint")  # fmt: skip
    _remount(small_disk, "rw")
    assert "could not save the checkpoint of step 2: Read-only file system" in line
    assert ADVICE["read-only"] in line and "free some space" not in line
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").iterdir())


@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_disk_that_fills_or_turns_read_only_before_the_export_keeps_the_checkpoints(fault, small_text_data, small_disk, capsys):
    """The checkpoint of step 2 is written; then the disk fills (or is remounted read-only), and the
    export fails for real: one line that says what to do for that error, the checkpoint whole, nothing
    of the export left (card and curves included)."""
    out = small_disk / "run"
    args = recipe_text_args(small_text_data, out, "save_steps=2", "max_steps=2", "save_total_limit=1")
    checkpoints_before = None

    def break_disk():
        nonlocal checkpoints_before
        checkpoints_before = file_hashes(out / "checkpoints")
        _fill(small_disk) if fault == "full" else _remount(small_disk, "ro")

    line = _one_error(capsys, lambda: main(args, hooks=_BreakAt(2, break_disk)), "runs.export_failed")
    assert ("No space left on device" if fault == "full" else "Read-only file system") in line
    assert "could not write the export" in line and ADVICE[fault] in line
    assert fault == "full" or "free some space" not in line
    if fault == "read-only":
        _remount(small_disk, "rw")
    assert file_hashes(out / "checkpoints") == checkpoints_before
    _no_export_left(out)
    assert not (out / "training_curves.png").exists()


def _export_state(out: Path) -> dict:
    return {name: file_hashes(out / name) if (out / name).is_dir() else hashlib.sha256((out / name).read_bytes()).hexdigest()
            for name in ("model", "results.json", "training_curves.png")}  # fmt: skip


@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
@pytest.mark.parametrize("how", ["disk fills", pytest.param("card write fails", marks=pytest.mark.slow)])
def test_a_re_export_that_fails_keeps_the_earlier_export(how, small_text_data, small_disk, monkeypatch, capsys):
    """A finished run, resumed for one more step: the disk fills before the new export (safetensors
    writes its file whole or not at all), or the card, written last into the export, fails (ENOSPC);
    either way the earlier export, its card, curves and results.json keep their bytes (before, the new
    weights had replaced the earlier ones beside the earlier results.json), no hidden folder is left."""
    import errno

    import finetune.export as export

    out = small_disk / "run"
    main(recipe_text_args(small_text_data, out, "save_steps=2", "max_steps=2"))
    earlier = _export_state(out)
    if how == "card write fails":
        def card(folder, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "README.md"))

        monkeypatch.setattr(export, "write_model_card", card)
    args = recipe_text_args(small_text_data, out, "save_steps=2", "max_steps=3", "resume_from_checkpoint=latest")
    fill = (lambda: _fill(small_disk)) if how == "disk fills" else (lambda: None)
    line = _one_error(capsys, lambda: main(args, hooks=_BreakAt(3, fill)), "runs.export_failed")
    assert "could not write the export" in line and ADVICE["full"] in line
    (small_disk / "filler").unlink(missing_ok=True)
    assert _export_state(out) == earlier
    assert not (out / ".export-new").exists() and not (out / ".export-old").exists()


def test_a_failing_device_during_a_checkpoint_says_so(small_text_data, failing_disk, capsys):
    """A real EIO, which the checkpoint's flush reports: not "free some space", no half-written save."""
    mount, fail = failing_disk
    out = mount / "run"
    line = _one_error(capsys, lambda: main(recipe_text_args(small_text_data, out, "save_steps=2", "max_steps=2"), hooks=_BreakAt(1, fail)),
                      "runs.save_failed_before_any_checkpoint")  # fmt: skip
    assert "could not save the checkpoint of step 2: Input/output error" in line
    assert ADVICE["device"] in line and "free some space" not in line
    assert not list((out / "checkpoints").glob(".tmp-*")) and not list((out / "checkpoints").glob("step-*"))


def test_a_failing_device_during_the_export_says_so(small_text_data, failing_disk, capsys):
    mount, fail = failing_disk
    out = mount / "run"
    line = _one_error(capsys, lambda: main(recipe_text_args(small_text_data, out, "max_steps=2"), hooks=_BreakAt(2, fail)),
                      "runs.export_failed_before_any_checkpoint")  # fmt: skip
    assert "could not write the export" in line and "Input/output error" in line and ADVICE["device"] in line
    assert "then run again with overwrite_output_dir=true" in line  # its own started run would be refused
    _no_export_left(out)


@pytest.mark.slow
def test_a_full_disk_under_two_processes_is_one_line_from_the_launch(small_text_data, small_disk):
    """Through finetune-launch (plain `accelerate launch` adds its own traceback after any failure)."""
    out = small_disk / "run"
    cmd = [*launch_command(2, launcher="finetune.launch"), str(REPO / "finetune/run.py"), *recipe_text_args(small_text_data, out, "save_steps=1")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1, result.stderr[-3000:]
    assert "No space left on device" in errors[0] and "Traceback" not in result.stderr
    assert not list((out / "checkpoints").glob(".tmp-*"))


@pytest.fixture(scope="module")
def evaluated_run(finished_run, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """A finished tiny run (the factory's, read only), and its evaluation outputs' sizes on a disk with
    room (to leave a full disk just enough for some of them)."""
    run = finished_run(*EARLIER_RUN)
    sized = tmp_path_factory.mktemp("sized")
    evaluate([str(run / "model"), "--output", str(sized), "--predictions"])
    return run, {p.name: p.stat().st_size for p in sized.iterdir()}


@pytest.mark.parametrize("room", ["metrics", "metrics and matrix", "read-only"])
def test_an_evaluation_that_cannot_be_written_leaves_nothing_half_written(room, evaluated_run, small_disk, tmp_path, capsys):
    """With room for metrics.json only, or for it and the confusion matrix but not the whole of
    predictions.jsonl, or on a read-only disk: one line for that error, and nothing of the evaluation in
    --output (an earlier evaluation there keeps its bytes)."""
    (run, sizes), target = evaluated_run, small_disk / "eval"
    export = run / "model"
    evaluate([str(export), "--output", str(target)])  # an earlier evaluation, replaced only whole
    earlier = file_hashes(target)
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
    assert file_hashes(target) == earlier
    assert not [p for p in target.iterdir() if p.name.startswith(".")]


def test_a_failing_device_during_an_evaluation_leaves_nothing(evaluated_run, failing_disk, capsys):
    mount, fail = failing_disk
    fail()
    line = _one_error(capsys, lambda: evaluate([str(evaluated_run[0] / "model"), "--output", str(mount / "eval"), "--predictions"]))
    assert "cannot write the evaluation" in line and "Input/output error" in line and ADVICE["device"] in line
    assert not (mount / "eval").exists() or not list((mount / "eval").iterdir())


@pytest.mark.parametrize("writer", ["checkpoint", "export", "evaluation"])
def test_a_disk_quota_reported_by_the_flush_is_one_line_for_each_writer(writer, small_text_data, evaluated_run, tmp_path, monkeypatch, capsys):
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
        line = _one_error(capsys, lambda: evaluate([str(evaluated_run[0] / "model"), "--output", str(target)]))
        assert not target.exists()
    else:
        extra = ("save_steps=1",) if writer == "checkpoint" else ()
        rule = "runs.save_failed_before_any_checkpoint" if extra else "runs.export_failed_before_any_checkpoint"
        line = _one_error(capsys, lambda: main(recipe_text_args(small_text_data, target, "max_steps=1", *extra)), rule)
        if writer == "export":
            _no_export_left(target)
        else:
            assert not list((target / "checkpoints").iterdir())
    assert "Disk quota exceeded" in line and ADVICE["quota"] in line


@pytest.mark.parametrize(
    "code, last, rule, then",
    [
        (28, None, "runs.save_failed_before_any_checkpoint", "no checkpoint was saved before; free some space"),
        (28, "step-00000002", "runs.save_failed", "then continue with resume_from_checkpoint=latest"),
        (30, "step-00000002", "runs.save_failed_on_a_lost_disk", "output_dir=<the other folder>"),
        (5, "step-00000002", "runs.save_failed_on_a_lost_disk", "output_dir=<the other folder>"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_cannot_be_written_says_what_to_continue_from(code, last, rule, then, tmp_path):
    """ENOSPC (28) after an earlier checkpoint: continue from it once there is room; EROFS (30) or EIO (5):
    continue from it elsewhere; none before: run again. Said by the process that met it (`local`), whatever
    its rank (the real failures above: the first checkpoint's)."""
    from finetune import checks
    from finetune.checks import runs

    last = tmp_path / "checkpoints" / last if last else None
    refused = checks.explain(runs.SAVE_FAILED, OSError(code, os.strerror(code), str(tmp_path / "x")), 4, last)
    assert refused.rule == rule and refused.local, (refused.rule, str(refused))
    assert str(refused).startswith(f"could not save the checkpoint of step 4: {os.strerror(code)} ({tmp_path / 'x'}); "
                                   "the partial save was removed and ") and then in str(refused)  # fmt: skip


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


def test_a_picture_that_does_not_fit_is_one_line_that_names_it_and_leaves_nothing(small_disk, tmp_path, capsys):
    """python -m finetune.plots onto a full disk: the line names the picture; no empty .png is left."""
    from conftest import user_error

    from finetune.plots import main as plots

    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(f'{{"step": {s}, "epoch": 1, "loss": {1 / s}, "learning_rate": 0.1}}\n' for s in (1, 2, 3)))
    _fill(small_disk)
    user_error(capsys, plots, [str(log), str(small_disk / "curves.png")], "No space left on device",
               str(small_disk / "curves.png"))  # fmt: skip
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_search_on_a_full_disk_is_one_line_and_leaves_nothing(small_text_data, small_disk, capsys):
    """SQLite's "database or disk is full" (optuna's study.db, through sqlalchemy) and a copy's shutil.Error
    (an OSError without errno, its files' "[Errno 28]" inside) are the machine's error: one line, exit 2,
    and the search leaves neither an empty study.db nor its folder."""
    import errno

    from conftest import tiny_text_args, user_error

    from finetune.search import main as search

    _fill(small_disk)
    out = small_disk / "search"
    user_error(capsys, search, ["--budget", "30", *tiny_text_args(small_text_data, out)], "No space left on device",
               "free some space")  # fmt: skip
    assert not out.exists()
    with pytest.raises(shutil.Error) as copy_error:
        shutil.copytree(Path(__file__).parent, small_disk / "copy")
    assert write_failure(copy_error.value).errno == errno.ENOSPC


# --- checks before anything is written --------------------------------------------------------------


# --- damaged files and misleading lines --------------------------------------------------------------


# --- data that probably means something else ---------------------------------------------------------




@pytest.mark.parametrize("small_disk", ["64M"], indirect=True)
def test_onnx_files_of_a_read_only_run_go_where_output_dir_says(small_disk, tmp_path, capsys):
    """A run on a read-only file system: the export cannot write <run>/onnx/; one line, nothing left, and the
    option to write elsewhere, --output-dir, which then holds the ONNX files (the run untouched)."""
    pytest.importorskip("onnxruntime")
    from conftest import save_tiny_bert

    from finetune.onnx_export import main as onnx_main

    run = small_disk / "run"
    save_tiny_bert(run / "model")
    before = file_hashes(run)
    _remount(small_disk, "ro")
    try:
        line = user_error(capsys, onnx_main, [str(run), "--no-int8"], "cannot write the ONNX files to",
                          "Read-only file system", rule="runs.onnx_write_failed")  # fmt: skip
        assert ADVICE["read-only"] + " --output-dir" in line and "nothing of them was left" in line
        onnx_main([str(run), "--no-int8", "--output-dir", str(tmp_path / "onnx")])
    finally:
        _remount(small_disk, "rw")
    assert (tmp_path / "onnx" / "model.onnx").is_file() and (tmp_path / "onnx" / "config.json").is_file()
    assert file_hashes(run) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
