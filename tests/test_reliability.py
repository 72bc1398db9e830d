"""Faults lose no work and hang nothing: signals, kill -9 (also mid-save), NaN losses, a failing DDP rank.
And the security promises: no network when offline, no secrets in what a run writes.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_reliability.py            # ~1.5 min on 2 cores
    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_reliability.py -m slow    # DDP signal, crash, hang

Every resumed run is compared with one uninterrupted run of the same recipe (dropout on, so the RNG
state must be restored too): the final parameters within 1e-6 and the same logged losses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    REPO,
    TINY_BERT,
    launch,
    launch_command,
    logged_steps,
    rotten_rows,
    tiny_text_args,
    wait_until,
    write_csv,
)
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.run import main

DROPOUT_BERT = TINY_BERT.replace("hidden_dropout_prob: 0.0", "hidden_dropout_prob: 0.1")
STEPS = 12  # 37 samples in batches of 4: 10 steps an epoch, so the runs cross an epoch end


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("data")
    return {
        "train": write_csv(d / "train.csv", rotten_rows(37)),
        "validation": write_csv(d / "validation.csv", rotten_rows(13, start=100)),
    }


def _args(data, out, *extra) -> list[str]:
    return tiny_text_args(
        data,
        out,
        f"model_config={DROPOUT_BERT}",
        f"max_steps={STEPS}",
        "per_device_train_batch_size=4",
        "save_total_limit=null",
        *extra,
    )


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "run"
    main(_args(data, out))
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return out


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _assert_same_run(out: Path, reference: Path) -> None:
    a = load_file(reference / "model" / "model.safetensors")
    b = load_file(out / "model" / "model.safetensors")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, f"resumed weights differ by {worst:.2e}"
    assert _losses(out) == pytest.approx(_losses(reference), abs=1e-6)


def _start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """`python finetune/run.py ...`, as a one-process job: the process that gets the signal trains."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "finetune/run.py"), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=log.with_suffix(".out").open("w"),
        stderr=log.with_suffix(".err").open("w"),
    )


def _checkpoint_steps(out: Path) -> list[int]:
    return [ckpt.read_manifest(p)["step"] for p in ckpt.list_checkpoints(out)]


# --- signals ---------------------------------------------------------------------------------------


def test_sigterm_saves_a_checkpoint_and_resume_is_exact(data, reference, tmp_path):
    out = tmp_path / "run"
    proc = _start(_args(data, out), tmp_path / "log")
    wait_until(lambda: logged_steps(out) >= 2, proc)
    proc.send_signal(signal.SIGSTOP)  # freeze it mid-run, so that the signal surely lands before the end
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=120) == 143
    err = (tmp_path / "log.err").read_text()
    assert "Traceback" not in err
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "SIGTERM" in stopped[0] and "resume_from_checkpoint=latest" in stopped[0]
    # The checkpoint is at the step the run had reached: nothing trained is lost.
    interrupted_at = logged_steps(out)
    assert _checkpoint_steps(out) == [interrupted_at] and interrupted_at < STEPS
    assert not (out / "model").exists()
    main(_args(data, out, "resume_from_checkpoint=latest"))
    _assert_same_run(out, reference)


def test_ctrl_c_saves_a_checkpoint_and_exits_130(data, tmp_path, capsys):
    """In-process (no interpreter to start): a thread sends SIGINT once training has begun."""
    out = tmp_path / "run"

    def interrupt() -> None:
        deadline = time.monotonic() + 120
        while logged_steps(out) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(SystemExit) as exit_info:
        main(_args(data, out))
    assert exit_info.value.code == 130
    stopped = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "received SIGINT" in stopped[0]
    assert _checkpoint_steps(out) == [logged_steps(out)] and logged_steps(out) < STEPS
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


# --- kill -9 ----------------------------------------------------------------------------------------


def test_kill_9_at_several_points_then_resume_is_exact(data, reference, tmp_path):
    """SIGKILL right after a checkpoint appears, and again between two checkpoints (the steps after the
    checkpoint are trained again, and their first log lines dropped); then resume to the end."""
    out = tmp_path / "run"
    args = _args(data, out, "save_steps=4")
    proc = _start(args, tmp_path / "first")
    wait_until(lambda: 4 in _checkpoint_steps(out), proc)
    proc.kill()
    proc.wait()
    proc = _start([*args, "resume_from_checkpoint=latest"], tmp_path / "second")
    wait_until(lambda: "resumed from" in (tmp_path / "second.out").read_text(), proc)
    wait_until(lambda: logged_steps(out) >= 6, proc)  # past the step-4 checkpoint, before step 8
    proc.kill()
    proc.wait()
    latest = ckpt.resolve_checkpoint("latest", out)
    main([*args, "resume_from_checkpoint=latest"])
    assert ckpt.read_manifest(latest)["step"] in (4, 8)
    _assert_same_run(out, reference)


class _Killed(BaseException):
    """Stands for kill -9: nothing catches it, nothing after it runs."""


@pytest.mark.parametrize("where", ["in save_state", "before the rename"])
def test_kill_during_a_checkpoint_write_keeps_the_previous_one(data, reference, tmp_path, monkeypatch, where):
    """The second save dies half-way (files written, no COMPLETE; or complete but still hidden): the
    first checkpoint stays the latest, loads, and the resumed run ends where the uninterrupted one did."""
    from accelerate import Accelerator

    out = tmp_path / "run"
    args = _args(data, out, "save_steps=3")
    calls = {"save_state": 0, "fsync": 0}
    original_save_state, original_fsync_tree = Accelerator.save_state, ckpt._fsync_tree

    def save_state(self, output_dir=None, **kw):
        calls["save_state"] += 1
        result = original_save_state(self, output_dir, **kw)
        if where == "in save_state" and calls["save_state"] == 2:
            for name in ("optimizer.bin", "scheduler.bin"):  # only half the files made it to disk
                (Path(output_dir) / name).unlink()
            raise _Killed
        return result

    def fsync_tree(path):
        original_fsync_tree(path)
        calls["fsync"] += 1  # twice a save: before and after writing COMPLETE
        if where == "before the rename" and calls["fsync"] == 4:
            assert (path / ckpt.COMPLETE).exists()
            raise _Killed

    monkeypatch.setattr(Accelerator, "save_state", save_state)
    monkeypatch.setattr(ckpt, "_fsync_tree", fsync_tree)
    with pytest.raises(_Killed):
        main(args)
    monkeypatch.undo()
    assert (out / ckpt.CHECKPOINTS / ".tmp-step-00000006").is_dir()
    assert ckpt.resolve_checkpoint("latest", out).name == "step-00000003"
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    main([*args, "resume_from_checkpoint=latest"])  # re-saves step 6 over the leftover
    assert not (out / ckpt.CHECKPOINTS / ".tmp-step-00000006").exists()
    _assert_same_run(out, reference)


# --- NaN/inf losses -----------------------------------------------------------------------------------


def test_persistent_nan_loss_stops_the_run(data, tmp_path, capsys):
    """A learning rate of 1e30 makes the weights overflow after one step; every loss after is NaN."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(
            tiny_text_args(
                data,
                out,
                "max_steps=20",
                "per_device_train_batch_size=4",
                "warmup_ratio=0",
                "learning_rate=1e30",
                "max_nonfinite_loss_steps=3",
            )
        )
    assert exit_info.value.code == 3
    stopped = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "NaN or infinite for 3 optimizer steps in a row" in stopped[0]
    assert "(optimizer step 4)" in stopped[0] and "no checkpoint was saved" in stopped[0]
    assert logged_steps(out) == 4 and not (out / "model").exists()


def test_nan_weights_are_never_checkpointed(data, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(
            tiny_text_args(
                data,
                out,
                "max_steps=20",
                "per_device_train_batch_size=4",
                "warmup_ratio=0",
                "learning_rate=1e30",
                "save_steps=1",
            )
        )
    assert exit_info.value.code == 3
    err = capsys.readouterr().err
    good = out / ckpt.CHECKPOINTS / "step-00000001"
    assert f"the last good checkpoint is {good}" in err
    assert _checkpoint_steps(out) == [1]
    weights = load_file(good / "model.safetensors")
    assert all(t.isfinite().all() for t in weights.values())


# --- DDP: a failing process ends the job ----------------------------------------------------------------


def _ddp_fault(data, tmp_path, mode: str, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """Two CPU processes; process 1 fails after optimizer step 2. Returns the result and the seconds
    from the failure (step 1 logged, step 2 not) to the end of the whole job."""
    out = tmp_path / "run"
    cmd = [
        *launch_command(2),
        str(REPO / "finetune/run.py"),
        *tiny_text_args(data, out, "max_steps=20", "per_device_train_batch_size=2", *extra),
    ]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "FINETUNE_TEST_FAIL_RANK": "1",
        "FINETUNE_TEST_FAIL_STEP": "2",
        "FINETUNE_TEST_FAIL_MODE": mode,
    }
    log = tmp_path / "log"
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=log.with_suffix(".out").open("w"),
        stderr=log.with_suffix(".err").open("w"),
        text=True,
    )
    deadline = time.monotonic() + 240
    while logged_steps(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    failed_at = time.monotonic()
    proc.wait(timeout=240)
    elapsed = time.monotonic() - failed_at
    result = subprocess.CompletedProcess(
        cmd, proc.returncode, log.with_suffix(".out").read_text(), log.with_suffix(".err").read_text()
    )
    assert logged_steps(out) == 1, "process 1 did not fail at step 2"
    return result, elapsed


def test_a_process_that_raises_ends_the_ddp_job(data, tmp_path):
    result, elapsed = _ddp_fault(data, tmp_path, "raise")
    assert result.returncode != 0
    assert "injected failure on process 1" in result.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


@pytest.mark.slow
def test_a_process_that_dies_ends_the_ddp_job(data, tmp_path):
    result, elapsed = _ddp_fault(data, tmp_path, "exit")
    assert result.returncode != 0
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


@pytest.mark.slow
def test_a_hung_process_ends_the_ddp_job_after_ddp_timeout(data, tmp_path):
    """Process 0 waits ddp_timeout=10 s in a collective, fails; the launcher then stops process 1
    (SIGTERM, which a hung process ignores, then SIGKILL after torchrun's 30 s)."""
    result, elapsed = _ddp_fault(data, tmp_path, "hang", "ddp_timeout=10")
    assert result.returncode != 0
    assert "Timed out" in result.stderr or "timed out" in result.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


@pytest.mark.slow
def test_sigterm_under_ddp_saves_once_and_resume_is_exact(data, tmp_path):
    """SIGTERM to `finetune-launch`: torchrun forwards it to both workers, which agree on one step,
    save one checkpoint and exit 143, and so does the launcher (plain `accelerate launch` exits 1 with
    torch's SignalException traceback)."""
    ref = tmp_path / "ref"
    result = launch(_args(data, ref, "per_device_train_batch_size=2"), num_processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "run"
    cmd = [
        *launch_command(2, launcher="finetune.launch"),
        str(REPO / "finetune/run.py"),
        *_args(data, out, "per_device_train_batch_size=2"),
    ]
    log = tmp_path / "log"
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=log.with_suffix(".out").open("w"),
        stderr=log.with_suffix(".err").open("w"),
    )
    wait_until(lambda: logged_steps(out) >= 2, proc, timeout=240)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    err = log.with_suffix(".err").read_text()
    assert "Traceback" not in err, err[-3000:]
    assert len([line for line in err.splitlines() if line.startswith("stopped:")]) == 1
    assert len(_checkpoint_steps(out)) == 1
    result = launch(
        _args(data, out, "per_device_train_batch_size=2", "resume_from_checkpoint=latest"), num_processes=2
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_same_run(out, ref)


# --- security ----------------------------------------------------------------------------------------


def test_offline_run_opens_no_socket_and_writes_no_secret(data, tmp_path, monkeypatch, capsys):
    """HF_HUB_OFFLINE=1 (set by conftest): a whole run without one connection attempt. One process only:
    gloo's DDP would use sockets. A token in the environment appears in nothing the run writes."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    secret = "hf_SECRETtoken0123456789abcdefghij"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", secret)
    attempts = []

    def refuse(self, address, *a, **kw):
        attempts.append(address)
        raise OSError(f"test: no network ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    out = tmp_path / "run"
    main(tiny_text_args(data, out, "max_steps=2", "save_steps=1"))
    assert attempts == []
    printed = capsys.readouterr()
    assert secret not in printed.out + printed.err
    for path in out.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_trust_remote_code_is_off_and_weights_are_safetensors_by_default(monkeypatch, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.config import load_config
    from finetune.models import build_model, load_preprocessor

    calls = []
    for cls in (AutoModelForSequenceClassification, AutoTokenizer):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            calls.append((klass.__name__, kwargs))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    cfg = load_config(None, [f"output_dir={tmp_path}"])  # the default recipe: the bundled MiniLM
    assert cfg.trust_remote_code is False and cfg.allow_pickle_weights is False
    load_preprocessor(cfg.model_args)
    build_model(cfg.model_args, ["0", "1"])
    assert {name for name, _ in calls} == {"AutoModelForSequenceClassification", "AutoTokenizer"}
    assert all(kwargs["trust_remote_code"] is False for _, kwargs in calls)
    model_kwargs = [kw for name, kw in calls if name == "AutoModelForSequenceClassification"]
    assert all(kw["use_safetensors"] is True for kw in model_kwargs)
