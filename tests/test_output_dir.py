"""What a run does to its output_dir at the edges: a resume from the last step, an export cut short,
folders that hold other things, damaged checkpoints (the cases a hostile tester found)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO, tiny_text_args, user_error
from safetensors.torch import load_file

import finetune.export as export
from finetune.run import main


def _args(data, out, *extra):
    return tiny_text_args(data, out, "max_steps=4", "save_steps=2", "lr_scheduler_type=constant",
                          "warmup_ratio=0", "per_device_train_batch_size=4", *extra)  # fmt: skip


def _run(data, out, *extra):
    return main(_args(data, out, *extra))


def _user_error(capsys, argv) -> str:
    return user_error(capsys, main, argv)


@pytest.fixture
def finished(small_text_data, tmp_path):
    out = tmp_path / "done"
    _run(small_text_data, out)
    return out


def test_resume_from_the_last_step_trains_nothing_more(small_text_data, tmp_path, finished):
    """With a constant learning rate an extra step would change the weights."""
    again = tmp_path / "again"
    shutil.copytree(finished, again)
    shutil.rmtree(again / "model")
    (again / "results.json").unlink()  # as a kill during the export leaves it
    results = _run(small_text_data, again, "resume_from_checkpoint=latest")
    assert results["step"] == 4
    a, b = load_file(finished / "model/model.safetensors"), load_file(again / "model/model.safetensors")
    assert all((a[k] - b[k]).abs().max() == 0 for k in a)


def test_an_export_cut_short_does_not_look_finished(small_text_data, tmp_path, monkeypatch, capsys):
    def broken_card(*args, **kwargs):
        raise RuntimeError("killed")  # as a kill in the middle of the export

    monkeypatch.setattr(export, "write_model_card", broken_card)
    out = tmp_path / "cut"
    with pytest.raises(RuntimeError, match="killed"):
        _run(small_text_data, out)
    # Nothing of the export is left (it is written aside and moved into place whole), no results.json
    assert not (out / "model").exists() and not (out / "results.json").exists()
    assert not (out / ".export-new").exists() and not (out / ".export-old").exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert "already holds a started run" in _user_error(
        capsys, tiny_text_args(small_text_data, out, "max_steps=2")
    )


def test_output_dir_that_is_a_file_or_holds_other_files(small_text_data, tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for target in (a_file, a_file / "sub"):
        assert "is a file, not a folder" in _user_error(
            capsys, tiny_text_args(small_text_data, target, "max_steps=2")
        )
    theirs = tmp_path / "project"
    (theirs / "project").mkdir(parents=True)
    (theirs / "project/keep.txt").write_text("mine")  # the tracker folder's name: never cleared here
    (theirs / "config.yaml").write_text("mine: true\n")
    assert "not a run of this app" in _user_error(
        capsys, tiny_text_args(small_text_data, theirs, "max_steps=2")
    )
    assert (theirs / "config.yaml").read_text() == "mine: true\n"
    # Asked for: written into, nothing deleted, nothing written over (config.yaml is the user's here).
    assert "would write over them" in _user_error(
        capsys, _args(small_text_data, theirs, "overwrite_output_dir=true")
    )
    (theirs / "config.yaml").rename(theirs / "my-config.yaml")
    _run(small_text_data, theirs, "overwrite_output_dir=true")
    assert (theirs / "project/keep.txt").read_text() == "mine" and (theirs / "results.json").exists()
    assert (theirs / "my-config.yaml").read_text() == "mine: true\n"


@pytest.mark.parametrize("damage", ["manifest", "weights"])
def test_damaged_checkpoint_is_one_line(small_text_data, tmp_path, finished, capsys, damage):
    """Named on the command line. (`latest` skips a damaged checkpoint for an older one that loads:
    tests/test_hostile.py.)"""
    latest = sorted((finished / "checkpoints").glob("step-*"))[-1]
    if damage == "manifest":
        (latest / "manifest.json").write_text("{bad json")
    else:
        weights = latest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    before = {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()}
    message = _user_error(capsys, _args(small_text_data, finished, f"resume_from_checkpoint={latest}"))
    assert str(latest / ("manifest.json" if damage == "manifest" else "model.safetensors")) in message
    assert before == {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()}


def test_unknown_tracker_and_tokens_in_errors(small_text_data, tmp_path, capsys):
    assert "unknown tracker 'bogus'" in _user_error(
        capsys, tiny_text_args(small_text_data, tmp_path / "o", "report_to=[bogus]")
    )
    token = "hf_" + "a" * 30
    message = _user_error(
        capsys,
        tiny_text_args(
            small_text_data, tmp_path / "o", f"push_to_hub_model_id=https://me:{token}@hf.co/me/m"
        ),
    )
    assert token not in message and "<redacted>" in message


def test_finetune_launch_bad_flag_is_one_line(capsys):
    from finetune.launch import main as launch_main

    with pytest.raises(SystemExit) as exit_info:
        launch_main(["--bogus-flag", str(REPO / "finetune/run.py")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bogus-flag" in err[0], err  # no usage page


def test_results_mark_a_finished_run(finished):
    results = json.loads((finished / "results.json").read_text())
    assert results["step"] == 4 and (finished / "model/README.md").exists()


def test_sigterm_while_loading_an_overwrite_puts_the_earlier_run_back(
    small_text_data, finished, capsys, monkeypatch
):
    """SIGTERM before the loop (here: while the data loads, after the earlier run was set aside):
    one `stopped:` line, exit 143, and the finished run is back, byte for byte."""
    import hashlib
    import os
    import signal

    import finetune.run as run

    def digest(root):
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*")
            if p.is_file()
        }

    before = digest(finished)
    real = run.load_splits

    def load_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this thread before the next bytecode
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "load_splits", load_then_signal)
    with pytest.raises(SystemExit) as stop:
        main(_args(small_text_data, finished, "overwrite_output_dir=true", "seed=7"))
    assert stop.value.code == 143
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("stopped:")] == [
        "stopped: received SIGTERM outside the training loop; nothing more was saved"
    ] and "Traceback" not in err
    assert digest(finished) == before
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
