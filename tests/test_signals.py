"""finetune/signals.py: what SIGTERM and SIGINT do at each moment of a run. In the loop: a checkpoint at
the step reached, one `stopped:` line, exit 143 (130), and the resume is exact. Before the loop: the
earlier run of an overwrite is put back. After it: the export is finished. During a save: the save
is finished first. (Signals to the launcher, and the launcher's death: tests/test_launch.py; under
2-process DDP: `test_sigterm_under_ddp_saves_once_and_resume_is_exact`, slow.)

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_signals.py

Every resumed run is compared with one uninterrupted run of the same recipe from the session's factory
(dropout on, so the RNG state must be restored too): the final parameters within 1e-6 and the same
logged losses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    EARLIER_RUN,
    REPO,
    STEPS,
    UNINTERRUPTED,
    assert_same_run,
    file_hashes,
    launch,
    launch_command,
    logged_steps,
    reset_accelerate,
    tiny_text_args,
    wait_until,
)

import finetune.export as export
import finetune.run as run
from finetune import checkpoint as ckpt
from finetune.run import main

LAST = "step-00000002"


def _args(data, out, *extra) -> list[str]:
    return tiny_text_args(data, out, *UNINTERRUPTED, *extra)


def _checkpoint_steps(out: Path) -> list[int]:
    return [ckpt.read_manifest(p)["step"] for p in ckpt.list_checkpoints(out)]


# --- in the training loop -------------------------------------------------------------------------------


@pytest.mark.parametrize("script, arg", [("finetune/run.py", "--dry-run"), ("finetune/evaluate_checkpoint.py", "model")])
def test_ctrl_c_while_an_entry_point_imports_is_one_line(script, arg, tmp_path):
    """Ctrl-C in the seconds the entry point spends importing torch and transformers: one `stopped:` line and
    exit 130, not a KeyboardInterrupt traceback, for training and for evaluation alike."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(REPO / script), arg], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.0)  # the imports take several seconds
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "stopped: interrupted while starting; nothing was written"


def test_the_evaluation_gives_ctrl_c_back_once_it_has_started(tmp_path, capsys):
    """After its imports the evaluation's Ctrl-C is a KeyboardInterrupt again (said as one `stopped:` line by
    the entry point), not the imports' "interrupted while starting"."""
    from finetune.evaluate_checkpoint import main as evaluate
    from finetune.signals import stop_while_starting

    stop_while_starting()
    try:
        with pytest.raises(SystemExit):
            evaluate([str(tmp_path / "no-model")])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # after its exit; while it runs, a line (below)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("sig, status, said", [
    (signal.SIGINT, 130, "stopped: interrupted (SIGINT); nothing more was saved"),
    (signal.SIGTERM, 143, "stopped: received SIGTERM during the evaluation; nothing more was saved"),
])  # fmt: skip
def test_a_signal_while_the_evaluation_predicts_is_one_stopped_line(sig, status, said, finished_run, tmp_path,
                                                                    monkeypatch, capsys):  # fmt: skip
    """Ctrl-C, or SIGTERM (a scheduler's; torchrun's to the other processes once one stopped), while the
    model predicts: one `stopped:` line and the signal's status; no metrics.json."""
    import finetune.evaluate_checkpoint as evaluate_checkpoint

    def predicting(*args, **kwargs):
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler runs here
        raise AssertionError("the signal did not stop the evaluation")

    monkeypatch.setattr(evaluate_checkpoint, "evaluate_with_predictions", predicting)
    out = tmp_path / "eval"
    try:
        with pytest.raises(SystemExit) as stopped:
            evaluate_checkpoint.main([str(finished_run() / "model"), "--output", str(out)])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert stopped.value.code == status
    assert capsys.readouterr().err.strip().splitlines()[-1] == said
    assert not (out / "metrics.json").exists()


def test_ctrl_c_in_an_entry_point_outside_a_training_loop_is_one_stopped_line(capsys):
    """An evaluation (or a run before its loop) stopped by Ctrl-C: one `stopped:` line that fits every entry
    point (it spoke of a training loop in an evaluation), exit 130, no traceback."""
    from finetune.exits import exit_on_user_error

    @exit_on_user_error
    def evaluating():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stopped:
        evaluating()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "stopped: interrupted (SIGINT); nothing more was saved\n"


def test_sigterm_saves_a_checkpoint_and_resume_is_exact(finished_run, tmp_path):
    """`python finetune/run.py ...` as a one-process job: the process that gets the signal trains."""
    data, reference = finished_run.data(), finished_run(*UNINTERRUPTED)
    out, log = tmp_path / "run", tmp_path / "log"
    proc = subprocess.Popen([sys.executable, str(REPO / "finetune/run.py"), *_args(data, out)], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log.with_suffix(".out").open("w"),
                            stderr=log.with_suffix(".err").open("w"))  # fmt: skip
    wait_until(lambda: logged_steps(out) >= 2, proc)
    proc.send_signal(signal.SIGSTOP)  # freeze it mid-run, so that the signal surely lands before the end
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=120) == 143
    err = log.with_suffix(".err").read_text()
    assert "Traceback" not in err
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "SIGTERM" in stopped[0] and "resume_from_checkpoint=latest" in stopped[0]
    # The checkpoint is at the step the run had reached: nothing trained is lost.
    interrupted_at = logged_steps(out)
    assert _checkpoint_steps(out) == [interrupted_at] and interrupted_at < STEPS
    assert not (out / "model").exists()
    main(_args(data, out, "resume_from_checkpoint=latest"))
    assert_same_run(out, reference)


def test_ctrl_c_saves_a_checkpoint_and_exits_130(small_text_data, tmp_path, capsys):
    """In-process (no interpreter to start): a thread sends SIGINT once training has begun."""
    out = tmp_path / "run"

    def interrupt() -> None:
        deadline = time.monotonic() + 120
        while logged_steps(out) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(SystemExit) as exit_info:
        main(_args(small_text_data, out))
    assert exit_info.value.code == 130
    stopped = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "received SIGINT" in stopped[0]
    assert _checkpoint_steps(out) == [logged_steps(out)] and logged_steps(out) < STEPS
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


@pytest.mark.slow
def test_sigterm_under_ddp_saves_once_and_resume_is_exact(small_text_data, tmp_path):
    """SIGTERM to `finetune-launch`: torchrun forwards it to both workers, which agree on one step,
    save one checkpoint and exit 143, and so does the launcher (plain `accelerate launch` exits 1 with
    torch's SignalException traceback)."""
    data = small_text_data
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
    assert_same_run(out, ref)


# --- outside the loop: set-up, the export, a checkpoint's save -------------------------------------------


def _signal_when(monkeypatch, owner, name: str, sig: signal.Signals, when=lambda *a, **k: True) -> None:
    """Make `owner.name` send `sig` to this process (as a scheduler would) when `when(...)`, then go on."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if when(*args, **kwargs):
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def _stopped(capsys, argv: list[str], status: int) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == status, err[-2000:]
    assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")]
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1, err[-2000:]
    return stopped[0]


def _complete_export(out: Path, step: int) -> None:
    results = json.loads((out / "results.json").read_text())
    assert results["step"] == step and (out / "model" / "README.md").is_file()
    assert (out / "model" / "model.safetensors").is_file() and (out / "training_curves.png").is_file()


def test_sigterm_while_loading_an_overwrite_puts_the_earlier_run_back(finished_run, tmp_path, capsys, monkeypatch):
    """SIGTERM before the loop (here: while the data loads, after the earlier run was set aside):
    one `stopped:` line, exit 143, and the finished run is back, byte for byte."""
    earlier = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    before = file_hashes(earlier)
    real = run.load_splits

    def load_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this thread before the next bytecode
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "load_splits", load_then_signal)
    with pytest.raises(SystemExit) as stop:
        main(tiny_text_args(finished_run.data(), earlier, *EARLIER_RUN, "overwrite_output_dir=true", "seed=7"))
    assert stop.value.code == 143
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("stopped:")] == [
        "stopped: received SIGTERM outside the training loop; nothing more was saved"
    ] and "Traceback" not in err
    assert file_hashes(earlier) == before
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_signal_while_datasets_parses_a_file_is_a_stop_not_bad_data(tmp_path, monkeypatch):
    """SIGTERM raises TrainingStopped inside datasets' parsing, which wraps it in its own error (as
    DatasetGenerationError does, `from` the original): load_raw gives back the stop, not 'not valid JSON'."""
    import finetune.data
    from finetune.errors import TrainingStopped

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n')

    def parse(*args, **kwargs):
        try:
            raise TrainingStopped("received SIGTERM outside the training loop; nothing more was saved", 143)
        except TrainingStopped as e:
            raise RuntimeError("An error occurred while generating the dataset") from e

    monkeypatch.setattr(finetune.data, "load_dataset", parse)
    with pytest.raises(TrainingStopped) as stop:
        finetune.data.load_raw({"train": str(path)}, None, None, None)
    assert stop.value.exit_code == 143


@pytest.mark.parametrize(
    "moment, sig",
    [
        pytest.param("test evaluation", signal.SIGTERM, marks=pytest.mark.slow),
        ("model card", signal.SIGTERM),
        pytest.param("model card", signal.SIGINT, marks=pytest.mark.slow),
        pytest.param("training curves", signal.SIGTERM, marks=pytest.mark.slow),
    ],
    ids=["sigterm-in-final-test-evaluation", "sigterm-in-export", "sigint-in-export", "sigterm-in-curves"],
)
def test_a_signal_after_the_loop_ends_in_a_complete_export(finished_run, tmp_path, monkeypatch, capsys, moment, sig):
    data = finished_run.data("text+test")
    out = tmp_path / "run"
    if moment == "test evaluation":  # the test split has 11 samples, validation 13
        _signal_when(
            monkeypatch, run, "evaluate_model", sig, lambda model, loader, *a, **k: len(loader.dataset) == 11
        )
    elif moment == "model card":
        _signal_when(monkeypatch, export, "write_model_card", sig)
    else:
        _signal_when(monkeypatch, export, "plot_training_curves", sig)
    line = _stopped(capsys, tiny_text_args(data, out, "max_steps=2", f"test_file={data['test']}"), 128 + sig)
    assert sig.name in line and "complete" in line
    _complete_export(out, 2)


@pytest.mark.slow
def test_sigterm_in_the_last_evaluation_of_the_loop_leaves_a_resumable_checkpoint(
    small_text_data, tmp_path, monkeypatch, capsys
):
    """The validation at the last step runs inside the loop: the stop saves that step, and the resume
    trains nothing more and exports."""
    out, data = tmp_path / "run", small_text_data
    with monkeypatch.context() as m:
        _signal_when(m, run, "evaluate_model", signal.SIGTERM)
        line = _stopped(capsys, tiny_text_args(data, out, "max_steps=2"), 143)
    assert "resume_from_checkpoint=latest" in line and not (out / "results.json").exists()
    assert [p.name for p in ckpt.list_checkpoints(out)] == [LAST]
    reset_accelerate()  # the stopped run left its Accelerator behind
    assert main(tiny_text_args(data, out, "max_steps=2", "resume_from_checkpoint=latest"))["step"] == 2
    _complete_export(out, 2)


def test_sigterm_during_a_checkpoint_save_finishes_the_save_then_stops(small_text_data, tmp_path, monkeypatch, capsys):
    from accelerate import Accelerator

    out = tmp_path / "run"
    _signal_when(monkeypatch, Accelerator, "save_state", signal.SIGTERM)
    argv = tiny_text_args(small_text_data, out, "max_steps=3", "save_steps=1", "per_device_train_batch_size=8")
    _stopped(capsys, argv, 143)
    (only,) = ckpt.list_checkpoints(out)
    assert only.name == "step-00000001" and ckpt.checkpoint_problem(only) is None
    assert not list((out / ckpt.CHECKPOINTS).glob(".tmp-*"))
