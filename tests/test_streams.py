"""finetune/streams.py and finetune/checks/streams.py: a streamed run (streaming=true) trains the weights a
loaded run does, resumes exactly mid-pass, splits its stream among DDP processes with every step one big batch,
and refuses what cannot stream in one line.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_streams.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import (
    DROPOUT_BERT,
    REPO,
    launch,
    launch_command,
    logged_losses,
    one_error_line,
    rotten_rows,
    tiny_text_args,
    user_error,
    write_jsonl,
)
from safetensors.torch import load_file

import finetune.data
import finetune.streams
from finetune import checkpoint as ckpt
from finetune.run import main
from finetune.steps import EpochSampler

ROWS = 45  # not a multiple of any global batch here, nor of 2 processes


@pytest.fixture
def rows() -> list[dict]:
    return rotten_rows(ROWS)


def _data(tmp_path: Path, train: list[dict], name: str = "train") -> dict[str, Path]:
    return {"train": write_jsonl(tmp_path / f"{name}.jsonl", train),
            "validation": write_jsonl(tmp_path / "validation.jsonl", rotten_rows(13, start=100))}  # fmt: skip


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "model" / "model.safetensors")


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_a_streamed_run_trains_the_weights_of_a_loaded_run_on_the_same_samples(rows, tmp_path):
    """The loaded run reads its file in the epoch sampler's order; the streamed run (stream_buffer=0: the file's
    order) reads a file of the rows in that order, in micro-batches of 4 with accumulation 2 where the loaded
    run takes batches of 8: 5 steps of 8 samples, the same weights within 1e-5."""
    loaded = tmp_path / "loaded"
    main(tiny_text_args(_data(tmp_path, rows), loaded, "max_steps=5", "per_device_train_batch_size=8",
                        "group_by_length=false"))  # fmt: skip
    order = EpochSampler(ROWS, 42).order(0)
    streamed = tmp_path / "streamed"
    data = _data(tmp_path, [rows[i] for i in order], "ordered")
    results = main(tiny_text_args(data, streamed, "streaming=true", "stream_buffer=0", "max_steps=5",
                                  "per_device_train_batch_size=4", "gradient_accumulation_steps=2", "save_steps=5"))  # fmt: skip
    assert _worst(_weights(loaded), _weights(streamed)) <= 1e-5
    assert results["validation"]["num_samples"] == 13  # validation is read whole: its count is exact
    manifest = ckpt.read_manifest(ckpt.list_checkpoints(streamed)[-1])
    # blocks of one batch (4) without a buffer: 40 samples in, the 10th block's last sample
    assert manifest["stream"] == [{"pass": 0, "block": 9, "raw": manifest["stream"][0]["raw"], "skip": 4}]


# 45 samples in batches of 4: a pass is 11.25 steps, so the run crosses into its second pass; blocks of 8.
RESUMED = (f"model_config={DROPOUT_BERT}", "streaming=true", "stream_buffer=8", "group_by_length=true",
           "max_steps=14", "per_device_train_batch_size=4", "save_steps=3", "save_total_limit=null")  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict[str, Path], Path, str]:
    """The streamed run the resumes are compared with, and its start summary."""
    import io
    from contextlib import redirect_stdout

    root = tmp_path_factory.mktemp("streamed")
    data, printed = _data(root, rotten_rows(ROWS)), io.StringIO()
    with redirect_stdout(printed):
        main(tiny_text_args(data, root / "full", *RESUMED))
    return data, root / "full", printed.getvalue()


@pytest.mark.parametrize("step, position", [
    (9, {"pass": 0, "block": 4, "skip": 4}),  # 36 samples in: block 4 of the first pass, 4 samples into it
    pytest.param(12, {"pass": 1, "block": 0, "skip": 3}, marks=pytest.mark.slow),  # 48: the second pass
])  # fmt: skip
def test_a_streamed_run_resumes_mid_block_and_past_a_pass_bit_exact(step, position, uninterrupted, tmp_path):
    """Killed after a mid-pass checkpoint, the run resumed from it ends with the uninterrupted run's weights,
    bit for bit, and its losses (from step 9 it reads into the second pass after the resume). Dropout on: the
    RNG is restored too. The start summary says what a streamed epoch is and where the label names came from."""
    data, full, summary = uninterrupted
    assert "train a stream of 56 samples (14 steps x 4; a pass over the data is an epoch" in summary, summary
    assert "label names read from its first 10,000 rows" in summary
    saved = ckpt.list_checkpoints(full)[step // 3 - 1]
    assert {k: v for k, v in ckpt.read_manifest(saved)["stream"][0].items() if k != "raw"} == position
    resumed = tmp_path / f"resumed-{step}"
    shutil.copytree(saved, resumed / ckpt.CHECKPOINTS / saved.name)
    main(tiny_text_args(data, resumed, *RESUMED, "resume_from_checkpoint=latest"))
    a, b = _weights(full), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), f"resumed from step {step}: {_worst(a, b):.2e}"
    assert {s: v for s, v in logged_losses(resumed).items() if s > step} == {
        s: v for s, v in logged_losses(full).items() if s > step}


def test_group_by_length_groups_each_streamed_block_into_batches_of_like_lengths(rows, tmp_path, monkeypatch):
    """group_by_length=true on a stream: each block (16 samples, batches of 4) is sorted by length into batches,
    so no two of a block's batches interleave in length. (The stream once kept its DDP
    group under the same name, so the setting was lost: a single process never grouped, and DDP began to group
    after its first block.)"""
    blocks, ordered = [], finetune.streams.TrainStream._ordered

    def spy(stream, samples, pass_, block):
        out = ordered(stream, samples, pass_, block)
        blocks.append([s["length"] for s in out])
        return out

    monkeypatch.setattr(finetune.streams.TrainStream, "_ordered", spy)
    main(tiny_text_args(_data(tmp_path, rows), tmp_path / "out", "streaming=true", "stream_buffer=16", "max_steps=8",
                        "per_device_train_batch_size=4", "group_by_length=true"))  # fmt: skip
    for lengths in blocks[:2]:  # the first pass's whole blocks
        batches = [lengths[i : i + 4] for i in range(0, 16, 4)]
        assert all(max(a) <= min(b) or max(b) <= min(a) for a in batches for b in batches if a is not b), lengths


def test_a_sigterm_mid_pass_saves_the_stream_position_and_the_resume_is_bit_exact(uninterrupted, tmp_path):
    """`python finetune/run.py ... streaming=true` as a job that gets SIGTERM mid-pass: it checkpoints the
    step it reached with the stream's position, exits 143, and the resume ends with the uninterrupted
    run's weights, bit for bit."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO, logged_steps, wait_until

    data, full, _ = uninterrupted
    out, log = tmp_path / "run", tmp_path / "log"
    argv = tiny_text_args(data, out, *RESUMED, "save_steps=null")
    proc = subprocess.Popen([sys.executable, str(REPO / "finetune/run.py"), *argv], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log.with_suffix(".out").open("w"),
                            stderr=log.with_suffix(".err").open("w"))  # fmt: skip
    wait_until(lambda: logged_steps(out) >= 2, proc)
    proc.send_signal(signal.SIGSTOP)  # frozen mid-run, so that the signal surely lands before the end
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=120) == 143
    err = log.with_suffix(".err").read_text()
    assert "Traceback" not in err and "resume_from_checkpoint=latest" in err, err[-2000:]
    [saved] = ckpt.list_checkpoints(out)
    assert ckpt.read_manifest(saved)["stream"][0]["pass"] == 0 and logged_steps(out) < 14
    main(tiny_text_args(data, out, *RESUMED, "save_steps=null", "resume_from_checkpoint=latest"))
    a, b = _weights(full), _weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a), f"{_worst(a, b):.2e}"


def _ddp_order(n: int, processes: int, per_step: int, steps: int) -> list[int]:
    """The rows of each step of a DDP streamed run in the file's order (stream_buffer=0): process p reads rows
    p, p + P, ... of each pass in turn, per_step of them a step."""
    shares = [[i for i in range(n) if i % processes == p] for p in range(processes)]
    streams = [[i for _ in range(steps * per_step // len(s) + 1) for i in s] for s in shares]
    return [i for t in range(steps) for s in streams for i in s[t * per_step : (t + 1) * per_step]]


@pytest.mark.slow
def test_two_processes_read_their_own_shares_and_each_step_is_one_big_batch(rows, tmp_path):
    """Two processes, batch 2, accumulation 2, on 45 rows (shares of 23 and 22) for 8 steps of 8: 64 samples,
    across the end of the first pass, where the shares end unevenly. Each process reads its own share once a
    pass (split_dataset_by_node), and the weights are those of one process taking each step's 8 samples as one
    batch, within 1e-5."""
    streamed = tmp_path / "ddp"
    args = ("streaming=true", "stream_buffer=0", "max_steps=8", "per_device_train_batch_size=2",
            "gradient_accumulation_steps=2")  # fmt: skip
    result = launch(tiny_text_args(_data(tmp_path, rows), streamed, *args), num_processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    order = _ddp_order(ROWS, 2, 4, 8)
    # every row once in the first pass, then the second pass's first rows; around the uneven end the processes'
    # passes overlap (process 0's 23rd row and process 1's second-pass first rows share step 6)
    assert sorted(set(order)) == list(range(ROWS)) and sorted(Counter(order).values())[-1] == 2
    one = tmp_path / "one"
    main(tiny_text_args(_data(tmp_path, [rows[i] for i in order], "one"), one, "streaming=true",
                        "stream_buffer=0", "max_steps=8", "per_device_train_batch_size=8"))  # fmt: skip
    assert _worst(_weights(streamed), _weights(one)) <= 1e-5


@pytest.mark.slow
def test_a_dataset_by_name_streams_its_train_split_and_reads_validation_whole(tmp_path):
    """dataset_name: the hub's path (here a local dataset folder, offline): train streamed, validation written
    to datasets' cache and counted exactly."""
    folder = tmp_path / "reviews"
    folder.mkdir()
    data = _data(folder, rotten_rows(ROWS))
    args = [a for a in tiny_text_args(data, tmp_path / "out") if not a.startswith(("train_file=", "validation_file="))]
    results = main([*args, "train_file=null", "validation_file=null", f"dataset_name={folder}", "streaming=true",
                    "max_steps=2", "per_device_train_batch_size=4"])  # fmt: skip
    assert results["validation"]["num_samples"] == 13 and results["step"] == 2


# --- what cannot stream: one line each ----------------------------------------------------------------------


@pytest.mark.parametrize("extra, rule, fragment", [
    (("streaming=true",), "streams.without_max_steps", "set max_steps=N"),
    (("streaming=true", "max_steps=2", "length_buckets=4"), "streams.setting_cannot_stream",
     "cannot be used with length_buckets=4"),
    (("streaming=true", "max_steps=2", "task=token-classification"), "streams.task_cannot_stream",
     "task=token-classification loads it whole"),
])  # fmt: skip
def test_settings_that_cannot_stream_are_one_line(extra, rule, fragment, rows, tmp_path, capsys):
    user_error(capsys, main, tiny_text_args(_data(tmp_path, rows), tmp_path / "out", *extra), fragment, rule=rule)


def test_a_streamed_file_datasets_cannot_stream_and_a_missing_validation_split_are_one_line(rows, tmp_path, capsys):
    data = _data(tmp_path, rows)
    conll = tmp_path / "train.conll"
    conll.write_text("a O\n")
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=2", f"train_file={conll}")
    user_error(capsys, main, args, "is not one: convert it", rule="streams.file_cannot_stream")
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=2", "validation_file=null")
    user_error(capsys, main, args, "needs a validation split", rule="streams.no_validation")


def test_a_missing_empty_or_header_only_training_stream_is_one_line(rows, tmp_path, capsys):
    """As a loaded file's: not there, 0 bytes, a header and no rows; each one line, exit 2."""
    data = _data(tmp_path, rows)
    header = tmp_path / "header.csv"
    header.write_text("text,label\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for path, fragment, rule in ((tmp_path / "none.jsonl", "train file not found", None),
                                 (empty, "train file is empty", None),
                                 (header, "the training stream has no rows", "streams.no_rows")):  # fmt: skip
        args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=2", f"train_file={path}")
        user_error(capsys, main, args, fragment, rule=rule)


def test_a_label_the_first_pass_did_not_hold_is_one_line(rows, tmp_path, capsys, monkeypatch):
    """The label names are read from the stream's first rows (FIRST_PASS, 8 here): a class met later has no
    place in the model, and the line says to give label_names."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    late = [*rows[:20], {"text": "a new kind of review", "label": "2"}, *rows[20:]]
    args = tiny_text_args(_data(tmp_path, late), tmp_path / "out", "streaming=true", "max_steps=10",
                          "per_device_train_batch_size=4", "stream_buffer=8")  # fmt: skip
    line = user_error(capsys, main, args, "give every label in label_names", rule="streams.label_after_first_pass")
    assert f"at row 21 of {tmp_path / 'train.jsonl'}," in line  # the row in the file, not in its block
    given = [*args, "label_names=[0,1]", f"output_dir={tmp_path / 'given'}"]  # given, not read: the line says so
    user_error(capsys, main, given, "which are not in label_names ['0', '1']", rule="streams.label_not_in_label_names")


def test_a_stream_sorted_by_its_label_is_one_line_naming_the_cause(rows, tmp_path, capsys, monkeypatch):
    """A file sorted by its label: the first pass (8 rows here) holds one class, which a loaded run would call a
    single class, and which a stream shuffled within its buffer would train on alone; label_names given or not."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    data = _data(tmp_path, sorted(rows, key=lambda r: r["label"]))
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=4", "label_names=[0,1]")
    user_error(capsys, main, args, "first 8 rows", "all hold the label '0'", "shuffle the file's rows",
               rule="streams.first_rows_of_one_label")


LATE = 37  # a row past the first pass (FIRST_PASS 8) and past the first blocks (stream_buffer 8), in the file from 1


@pytest.mark.parametrize("bad, rule, fragment", [
    ({"text": "", "label": "1"}, "columns.text_blank", "has an empty (blank) text at row"),
    ({"text": "   ", "label": "0"}, "columns.text_blank", "has an empty (blank) text at row"),
    ({"text": None, "label": "1"}, "columns.text_missing_in_a_row", "has an empty cell at row"),
    ({"label": "1"}, "columns.text_missing_in_a_row", "has an empty cell at row"),
    ({"text": "a review", "label": None}, "columns.label_null", "has empty (null) values (first at row"),
    ({"text": "a review"}, "columns.label_null", "has empty (null) values (first at row"),
    ({"text": "text", "label": "label"}, "labels.header_inside_the_file", "the header repeated inside the file"),
    ({"text": "a review", "label": ""}, "labels.blank_label", "has an empty (blank) label at row"),
    ({"text": "a review", "label": " 1"}, "labels.space_twins", "which differ only by spaces"),
    ({"text": "a review", "label": "1\u200b"}, "labels.look_alike_classes", "which read the same"),
])  # fmt: skip
def test_a_bad_row_past_the_first_pass_is_refused_by_its_own_rule_naming_its_row(bad, rule, fragment, rows, tmp_path,
                                                                                 capsys, monkeypatch):  # fmt: skip
    """Rows after the first pass (the checked first rows) are checked by the loaded path's rules for a row, as
    the stream reads them: an empty text is not trained on, a null or missing label is not a class named 'None';
    the line names the row in the file (not in its block) and the file. Under 2 processes too (slow: below)."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    late = [*rows[: LATE - 1], bad, *rows[LATE - 1 :]]
    data = _data(tmp_path, late)
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=12", "per_device_train_batch_size=4",
                          "stream_buffer=8")  # fmt: skip
    line = user_error(capsys, main, args, fragment, f"row {LATE} of {data['train']}", rule=rule)
    assert "None" not in line


@pytest.mark.parametrize("problem, bad, rule", [
    ("regression", {"text": "a review", "score": float("nan")}, "labels.targets_not_finite"),
    ("multi_label", {"text": "a review", "labels": []}, "labels.empty_list"),
    ("multi_label", {"text": "a review", "labels": ["cat", "zebra"]}, "streams.label_after_first_pass"),
])  # fmt: skip
def test_a_bad_label_past_the_first_pass_is_named_by_its_row_in_the_file(problem, bad, rule, tmp_path, capsys,
                                                                        monkeypatch):  # fmt: skip
    """The problem's own label rules (a NaN target, an empty label list) count the rows of the block they are
    given: a stream's line names the row in the file instead, as its row rules do. A label list's name the first
    rows did not hold is one, as a single label's is."""
    from conftest import multi_label_rows, regression_rows

    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    made = regression_rows(58) if problem == "regression" else multi_label_rows(58)
    train = [*made[: LATE - 1], bad, *made[LATE - 1 : 44]]
    data = {"train": write_jsonl(tmp_path / "train.jsonl", train),
            "validation": write_jsonl(tmp_path / "validation.jsonl", made[44:])}  # fmt: skip
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=12", "per_device_train_batch_size=4",
                          "stream_buffer=8", f"label_column={'score' if problem == 'regression' else 'labels'}")  # fmt: skip
    user_error(capsys, main, args, f"at row {LATE} of {data['train']}", rule=rule)


def test_a_bad_row_is_named_by_its_row_in_the_file_after_a_resume(rows, tmp_path, capsys, monkeypatch):
    """A resume reads on from the checkpoint's block: a bad row after it is still named by its row in the file."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    late = [*rows[: LATE - 1], {"text": "", "label": "1"}, *rows[LATE - 1 :]]
    args = tiny_text_args(_data(tmp_path, late), tmp_path / "out", "streaming=true", "per_device_train_batch_size=4",
                          "stream_buffer=8", "save_steps=3")  # fmt: skip
    main([*args, "max_steps=3"])
    user_error(capsys, main, [*args, "max_steps=12", "resume_from_checkpoint=latest"], f"at row {LATE} of",
               rule="columns.text_blank")


def test_a_process_with_an_empty_share_is_one_line(tmp_path):
    """One sample for two processes: the second's share is empty (what it meets, alone, under DDP)."""
    from types import SimpleNamespace

    from finetune.config import load_config
    from finetune.errors import UserError
    from finetune.streams import TrainStream
    from finetune.tasks import task_of

    data = _data(tmp_path, rotten_rows(1))
    cfg = load_config(None, tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=1",
                                           "problem_type=single_label_classification"))  # fmt: skip
    tokenizer = task_of(cfg.task).load_preprocessor(cfg.model_args)
    second = SimpleNamespace(process_index=1, num_processes=2, device=torch.device("cpu"))
    stream = TrainStream(cfg, second, tokenizer, ["0", "1"])
    stream.reset(0)
    with pytest.raises(UserError) as refused:
        next(iter(stream))
    assert refused.value.rule == "streams.empty_share" and "process 1's share" in str(refused.value)



def test_a_dry_run_of_a_stream_counts_its_steps_not_a_placeholder(rows, tmp_path):
    """--dry-run of a streamed run: the samples max_steps reads, no epoch length (the stream's is unknown)."""
    plan = main([*tiny_text_args(_data(tmp_path, rows), tmp_path / "out", "streaming=true", "max_steps=3",
                                 "per_device_train_batch_size=4"), "--dry-run"])  # fmt: skip
    assert plan["train_samples"] == "a stream (12 samples in max_steps=3)"
    assert plan["optimizer_steps_per_epoch"] == "-" and plan["total_optimizer_steps"] == 3


@pytest.mark.slow
def test_a_late_refusal_under_two_processes_is_one_line_and_status_2(rows, tmp_path):
    """Two processes (finetune-launch, which keeps a process's exit status): a label past the first pass (10,000
    rows) that process 1 alone meets. The run ends with status 2 and one line, the rule's, from process 1, naming
    the row in the file; process 0, which was about to wait in the step's all-reduce, ends quietly: no gloo
    traceback. stream_buffer past the first pass: each process's first block holds its whole share."""
    many = [rows[i % ROWS] for i in range(finetune.data.FIRST_PASS)]
    data = _data(tmp_path, [*many, rows[0], {"text": "a new kind of review", "label": "2"}, *rows])
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=4", "stream_buffer=10016",
                          "per_device_train_batch_size=2")  # fmt: skip
    result = subprocess.run([*launch_command(2, launcher="finetune.launch"), "finetune/run.py", *args], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "FINETUNE_SHOW_RULES": "1"},
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    line = one_error_line(result.returncode, result.stderr, "[rank 1] [streams.label_after_first_pass]",
                          f"at row 10,002 of {data['train']}")  # fmt: skip
    assert "gloo" not in result.stderr.lower() and "Connection closed" not in result.stderr, result.stderr[-3000:]
    assert line


def test_a_resume_with_fewer_samples_than_the_checkpoint_trained_past_is_one_line(rows, tmp_path, capsys):
    """A checkpoint 12 rows into its stream (3 steps of 4): a resume with max_train_samples=10 would stand past the
    data's end; refused, naming the rows trained. As many rows as trained, or more, resume as asked."""
    args = tiny_text_args(_data(tmp_path, rows), tmp_path / "out", "streaming=true", "per_device_train_batch_size=4",
                          "stream_buffer=8", "save_steps=3")  # fmt: skip
    main([*args, "max_steps=3"])
    resumed = [*args, "max_steps=6", "resume_from_checkpoint=latest"]
    user_error(capsys, main, [*resumed, "max_train_samples=10"], "trained on the stream's first 12 rows of its pass 1",
               "max_train_samples=12 or more", rule="runs.stream_past_max_train_samples", untouched=tmp_path / "out")
    assert main([*resumed, "max_train_samples=12", "--dry-run"])["total_optimizer_steps"] == 6


def test_evaluating_the_train_split_of_a_streamed_run_scores_the_whole_file(rows, tmp_path, monkeypatch):
    """evaluate_checkpoint --split train of a streamed run: every row of its training file (its first
    max_train_samples where the run had one, as the stream took them), not only the first pass (8 here) that
    the run's checks read."""
    from finetune.evaluate_checkpoint import main as evaluate

    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    args = tiny_text_args(_data(tmp_path, rows), tmp_path / "out", "streaming=true", "max_steps=2",
                          "per_device_train_batch_size=4")  # fmt: skip
    main(args)
    assert evaluate([str(tmp_path / "out" / "model"), "--split", "train"])["num_samples"] == ROWS
    main([*args, "max_train_samples=20", f"output_dir={tmp_path / 'capped'}"])
    assert evaluate([str(tmp_path / "capped" / "model"), "--split", "train"])["num_samples"] == 20


@pytest.mark.parametrize("chunk", [None, 512])
def test_a_malformed_json_line_in_the_stream_is_one_line_naming_its_row(chunk, rows, tmp_path, capsys, monkeypatch):
    """A line of the training stream that is no JSON: the parser reads the file in blocks (10 MiB; 512 bytes
    here puts the line past the first pass's block, so the training stream meets it, not the first pass), and
    either way the run ends in one line naming the row and line in the file, status 2, no traceback."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    if chunk is not None:
        load = finetune.data.load_dataset
        monkeypatch.setattr(finetune.data, "load_dataset", lambda *a, **k: load(*a, **k, chunksize=chunk)
                            if a and a[0] == "json" and k.get("streaming") else load(*a, **k))  # fmt: skip
    data = _data(tmp_path, rows)
    lines = data["train"].read_text().splitlines()
    lines[LATE - 1] = '{"text": "a review cut off", "label": '
    data["train"].write_text("\n".join(lines) + "\n")
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=12", "per_device_train_batch_size=4",
                          "stream_buffer=8")  # fmt: skip
    user_error(capsys, main, args, f"row {LATE} of {data['train']} (line {LATE}) is not valid JSON Lines: column",
               "fix or remove that line", rule="streams.row_unparsable")


@pytest.mark.parametrize("suffix", ["jsonl", "json", "folder"])
def test_a_number_among_texts_past_the_first_pass_names_its_row_in_the_file(suffix, rows, tmp_path, capsys,
                                                                           monkeypatch):  # fmt: skip
    """A JSON text cell that is a number past the first pass: datasets types the stream's column from the whole
    block it reads (Json), while the first pass's rows are all text; the line names the row in the file and
    its value, not the feature's type. A JSON array (.json) too, which datasets streams without features and,
    untyped, would hand on every text of the column as its JSON text ('"a review"') to train on."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    rows[LATE - 1] = {**rows[LATE - 1], "text": 123}
    data = _data(tmp_path, rows)
    if suffix == "json":
        data["train"] = tmp_path / "train.json"
        data["train"].write_text(json.dumps(rows))
    if suffix == "folder":  # a local dataset's folder (dataset_name): no file to read again, so no row named
        (tmp_path / "dataset").mkdir()
        (tmp_path / "dataset" / "train.json").write_text(json.dumps(rows))
        shutil.copy(data["validation"], tmp_path / "dataset" / "validation.jsonl")
        args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=12", "per_device_train_batch_size=4",
                              "train_file=null", "validation_file=null", f"dataset_name={tmp_path / 'dataset'}")  # fmt: skip
        user_error(capsys, main, args, "its first rows hold text, but a later row holds another kind",
                   rule="columns.mixed_types")
        return
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=12", "per_device_train_batch_size=4")
    user_error(capsys, main, args, f"its first rows hold text, but row {LATE} of {data['train']} holds a number (123)",
               "give every row the same type", rule="columns.mixed_types")  # fmt: skip

def test_a_training_file_changed_while_it_streams_is_refused_at_the_next_pass(rows, tmp_path, capsys, monkeypatch):
    """The training file grown while the run streams it: the next pass would read other data than the run
    checked and recorded, so its start refuses it in one line; what was saved stays."""
    data = _data(tmp_path, rows)
    opened, open_pass = [], finetune.streams.TrainStream._open

    def grow_then_open(stream, state):
        opened.append(state)
        if len(opened) == 2:  # the second pass's start
            with open(data["train"], "a") as f:
                f.write('{"text": "a review written while it trained", "label": "1"}\n')
        return open_pass(stream, state)

    monkeypatch.setattr(finetune.streams.TrainStream, "_open", grow_then_open)
    args = tiny_text_args(data, tmp_path / "out", "streaming=true", "max_steps=14", "per_device_train_batch_size=4")
    user_error(capsys, main, args, f"the training file {data['train']} changed", "resume_from_checkpoint=latest",
               rule="streams.file_changed")  # fmt: skip

def test_a_ragged_csv_row_in_the_stream_is_the_loaded_paths_line_naming_its_line(rows, tmp_path, capsys, monkeypatch):
    """A CSV row of more fields than the header, past the first pass: pandas' parser refuses it as the stream
    reads on, and the line names the file's line as a loaded run's does (files.csv_ragged_row), not the
    parser's words."""
    monkeypatch.setattr(finetune.data, "FIRST_PASS", 8)
    data = _data(tmp_path, rows)
    train = tmp_path / "train.csv"
    lines = ["text,label", *(f"{r['text'].replace(',', ' ')},{r['label']}" for r in rows)]
    lines[LATE] = "a review, with a comma,1"
    train.write_text("\n".join(lines) + "\n")
    args = tiny_text_args({**data, "train": train}, tmp_path / "out", "streaming=true", "max_steps=12",
                          "per_device_train_batch_size=4", "stream_buffer=8")  # fmt: skip
    user_error(capsys, main, args, f"train file {train} line {LATE + 1} has 3 fields, the header has 2",
               "quote fields that contain the delimiter", rule="streams.delimited_row_unparsable")  # fmt: skip


# --- advice that is followed: what a line tells a streamed run to set passes the settings' rules ---------------

ADVISED = re.compile(r"\b([a-z_]+)=(null|true|false|\d+)\b")  # a setting a line's advice names, with its value


def _followed(args: list[str], line: str) -> list[str]:
    """`args` as a user who follows the line's advice (after its last ';') literally makes them: each setting it
    says to leave out dropped, each key=value it names set."""
    advice = line.rsplit("; ", 1)[-1]
    left_out = re.findall(r"leave (\w+) out", advice)
    kept = [a for a in args if a.split("=", 1)[0] not in left_out]
    return [*kept, *(f"{key}={value}" for key, value in ADVISED.findall(advice))]


def _passes(args: list[str]) -> None:
    from finetune.config import load_config

    load_config(None, args)  # a refusal of any settings rule would raise here


@pytest.mark.parametrize("mistake", ["text_windows=16", "length_buckets=4", "torch_compile=true",
                                     "resume_allow_topology_change=true", "dataloader_num_workers=2", "data_dir"])
def test_the_advice_of_a_setting_that_cannot_stream_passes_the_settings_rules(mistake, rows, tmp_path):
    """streams.setting_cannot_stream says what to leave out; the settings it leaves pass (an image folder without a
    train_file: leaving streaming out, as leaving data_dir out would leave no data)."""
    from finetune.errors import UserError

    base = tiny_text_args(_data(tmp_path, rows), tmp_path / "out", "streaming=true", "max_steps=4")
    if mistake == "data_dir":
        mistake = f"data_dir={tmp_path / 'images'}"
        base = [*base, "train_file=null", "validation_file=null"]
    with pytest.raises(UserError) as refused:
        _passes([*base, mistake])
    assert refused.value.rule == "streams.setting_cannot_stream", refused.value
    _passes(_followed([*base, mistake], str(refused.value)))


def test_advice_given_to_a_streamed_run_names_no_setting_a_stream_refuses(rows, tmp_path):
    """What the rules advise a streamed run (texts cut at max_length, a run that learned nothing after that, a
    resume on another topology, epochs in a search's space beside max_steps, a validation split too small, a
    share to hold out beside a validation_file), followed literally, passes the settings' rules: no
    text_windows, resume_allow_topology_change, max_steps=null or validation_file=null, which a stream refuses.
    The same rules' advice to a loaded run names them, and passes too."""
    from types import SimpleNamespace

    from conftest import TOKENIZER
    from transformers import AutoTokenizer

    from finetune.checks import inputs, runs, settings, tools

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    texts = [" ".join(["a long review of a film"] * 20)] * 10
    ids = tokenizer(texts, truncation=True, max_length=32)["input_ids"]
    learned = {"warn": True, "verdict": False, "baseline": 0.5, "shown": "accuracy", "value": 0.5, "at": "",
               "baseline_model": "the majority class", "trivial": "majority class", "spread": 1.0}
    for streaming in (True, False):
        base = tiny_text_args(_data(tmp_path, rows), tmp_path / "out", "max_steps=4", "max_length=32",
                              *(["streaming=true"] if streaming else []))  # fmt: skip
        resume = SimpleNamespace(saved_topology=(1, 1, 4), topology=(2, 1, 4), sharded=False,
                                 cfg=SimpleNamespace(streaming=streaming, resume_allow_topology_change=False))
        cfg = SimpleNamespace(streaming=streaming, validation_file="validation.jsonl")
        lines = [inputs.texts_cut(texts, ids, [len(i) for i in ids], 32, tokenizer, None, streaming),
                 tools.did_not_learn(learned, ["inputs.texts_cut"], streaming), runs.other_topology(resume),
                 tools.epochs_not_searched(4, ["num_train_epochs", "learning_rate"], streaming),
                 tools.too_few_to_judge({**learned, "verdict": None, "n": 3, "counted": "samples",
                                         "unreachable": False}, [], streaming),
                 settings.split_share_unread({"validation_split_percentage": 20}, cfg)]  # fmt: skip
        advised = {key for line in lines for key, _ in ADVISED.findall(line.rsplit("; ", 1)[-1])}
        refused = {"text_windows", "resume_allow_topology_change", "max_steps", "validation_file"}
        assert bool(advised & refused) is not streaming, lines
        assert ("validation_split_percentage" in lines[4]) is not streaming, lines[4]
        for line in lines:
            _passes(_followed(base, line))


def test_reading_the_stream_says_what_a_parser_refuses_and_lets_memory_and_said_errors_through(tmp_path):
    """A parser's error is the data's (one line naming the file); running out of memory is not, and a line a rule
    said already is not said again in other words."""
    from finetune import data
    from finetune.config import load_config
    from finetune.errors import UserError

    (tmp_path / "big.jsonl").write_text('{"text": "fine", "label": "pos"}\n{"text": oops}\n')
    args = load_config(None, [f"train_file={tmp_path / 'big.jsonl'}", f"output_dir={tmp_path / 'run'}"]).data_args
    with pytest.raises(UserError, match="big.jsonl"):
        with data.reading_the_stream(args):
            raise ValueError("JSON parse error: Missing a name for object member")
    for error in (MemoryError(), UserError("said already")):
        with pytest.raises(type(error)) as raised, data.reading_the_stream(args):
            raise error
        assert raised.value is error
