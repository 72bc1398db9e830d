"""Accumulation and DDP equal one big batch, for plain text classification (tests/test_equivalence.py's (a),
(b), (d)), extractive question answering (tests/test_question_answering.py), texts read whole in windows
(tests/test_text_windows.py) and multiple choice (tests/test_multiple_choice.py): each compares one process with one big batch, one process with accumulation,
and 2 processes of DDP over gloo with accumulation.

The four DDP runs are ONE `accelerate launch` of accelerate_configs/cpu_ddp.yaml with 2 processes
(tests/multi_run_worker.py, `conftest.launch_runs`): starting two processes costs ~15 s of imports on the
2-core dev machine, a tiny run a few seconds. Each run is the real loop as finetune/run.py runs it; its
records say that both processes were one DDP group over gloo (MULTI_CPU, 2 processes, DistributedDataParallel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType
from conftest import REPO, launch_runs, logged_losses, rotten_rows, run_outputs, write_csv, write_jsonl
from safetensors.torch import load_file
from test_equivalence import batching_args
from test_multiple_choice import swag_args, swag_rows
from test_question_answering import _rows, _worst, qa_args
from test_text_windows import _documents, window_args

from finetune.evaluate_checkpoint import main as evaluate_main
from finetune.run import main

QA_COMMON = ("num_train_epochs=2", "max_grad_norm=null")
DDP_QA = ("per_device_train_batch_size=2", "gradient_accumulation_steps=2", *QA_COMMON)
DDP_WINDOWS = ("per_device_train_batch_size=2", "gradient_accumulation_steps=2")
CHOICES_COMMON = ("num_train_epochs=2", "max_grad_norm=null", "test_file=null")
DDP_CHOICES = ("per_device_train_batch_size=2", "gradient_accumulation_steps=2", *CHOICES_COMMON)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> dict:
    """The four data sets, and ONE launch of 2 processes that trains, one after another in the same
    processes: the texts' windows (13 training texts, 7 validation), question answering (23 training
    questions, 11 validation; both uneven over 2 processes), text classification (37 training rows, not a
    multiple of any global batch, 13 validation) and multiple choice (41 training contexts of 4 candidates, 11
    validation), each 2 x batch 2 x accumulation 2."""
    root = tmp_path_factory.mktemp("ddp")
    data = {
        "text": {"train": write_csv(root / "train.csv", rotten_rows(37)),
                 "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100))},
        "qa": {"train": write_jsonl(root / "qa_train.jsonl", _rows("train", 23)),
               "validation": write_jsonl(root / "qa_validation.jsonl", _rows("validation", 11))},
        "windows": {"train": write_csv(root / "long_train.csv", _documents(13, 0)),
                    "validation": write_csv(root / "long_validation.csv", _documents(7, 2000))},
        "choices": {"train": write_jsonl(root / "swag_train.jsonl", swag_rows(41, seed=0)),
                    "validation": write_jsonl(root / "swag_validation.jsonl", swag_rows(11, seed=1))},
    }  # fmt: skip
    runs = [
        {"name": "windows", "fsdp": False, "argv": window_args(data["windows"], root / "windows", *DDP_WINDOWS)},
        {"name": "qa", "fsdp": False, "argv": qa_args(data["qa"], root / "qa", *DDP_QA)},
        {"name": "text", "fsdp": False, "argv": batching_args("d_2x2_acc2", data["text"], root / "text")},
        {"name": "choices", "fsdp": False, "argv": swag_args(data["choices"], root / "choices", *DDP_CHOICES)},
    ]
    records, output = launch_runs(REPO / "accelerate_configs/cpu_ddp.yaml", runs, root)
    return {"root": root, "data": data, "records": records, "printed": run_outputs(output)}


def _weights(out: Path) -> dict:
    return load_file(out / "model" / "model.safetensors")


def _ran_as_ddp_over_gloo(ddp: dict, name: str) -> Path:
    """The launched run `name` was 2 processes of one DDP group over gloo; its output folder."""
    for rank in (0, 1):
        record = ddp["records"][(name, rank)]
        assert DistributedType(record["distributed_type"]) == DistributedType.MULTI_CPU, record["distributed_type"]
        assert record["num_processes"] == 2 and record["process_index"] == rank
        assert record["backend"] == "gloo" and record["wrapper"] == "DistributedDataParallel"
    assert "DistributedType.MULTI_CPU" in ddp["printed"][name]
    return ddp["root"] / name


def test_accumulation_and_ddp_equal_one_big_batch(ddp, tmp_path):
    """One big batch, accumulation, and DDP with accumulation (two processes): the same weights. DDP
    alone is the slow test of tests/test_equivalence.py (each launch of two processes costs about 15 s of
    the default run)."""
    data = ddp["data"]["text"]
    for name in ("a_1x8", "b_1x2_acc4"):
        main(batching_args(name, data, tmp_path / name))
    results = {"a_1x8": _weights(tmp_path / "a_1x8"), "b_1x2_acc4": _weights(tmp_path / "b_1x2_acc4"),
               "d_2x2_acc2": _weights(_ran_as_ddp_over_gloo(ddp, "text"))}  # fmt: skip
    reference = results["a_1x8"]
    for name, state in results.items():
        assert state.keys() == reference.keys()
        worst = max((state[k].float() - reference[k].float()).abs().max().item() for k in reference)
        assert worst < 1e-5, f"{name} differs from one big batch by {worst:.2e}"
    # The comparison means something only if training moved the weights.
    fresh = tmp_path / "a_1x8" / "config.yaml"
    assert fresh.exists()
    losses = [line for line in (tmp_path / "a_1x8" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(losses) == 10
    initial_changed = any(torch.any(v != 0) for v in reference.values())
    assert initial_changed


def test_accumulation_and_ddp_equal_one_big_batch_and_score_every_question_once(ddp, tmp_path):
    """1 x 8, 1 x 2 x 4 and 2 processes x 2 x 2 give the same weights (the loss is a mean over windows, the
    windows split unevenly over the ranks); validation scores each of the 11 questions once under both, with
    the same scores."""
    data = ddp["data"]["qa"]
    main(qa_args(data, tmp_path / "a", *QA_COMMON))
    main(qa_args(data, tmp_path / "b", "per_device_train_batch_size=2", "gradient_accumulation_steps=4", *QA_COMMON))
    runs = {"a": tmp_path / "a", "d": _ran_as_ddp_over_gloo(ddp, "qa")}
    reference = _weights(runs["a"])
    assert _worst(_weights(tmp_path / "b"), reference) < 1e-5
    assert _worst(_weights(runs["d"]), reference) < 1e-5
    assert any(v.abs().sum() > 0 for v in reference.values())
    scored = {run: json.loads((out / "results.json").read_text())["validation"] for run, out in runs.items()}
    assert scored["a"]["num_samples"] == scored["d"]["num_samples"] == 11
    assert scored["a"]["f1"] == pytest.approx(scored["d"]["f1"], abs=1e-9)
    assert scored["a"]["exact_match"] == pytest.approx(scored["d"]["exact_match"], abs=1e-9)


def test_accumulation_and_ddp_equal_one_big_batch_and_each_text_is_scored_once(ddp, tmp_path):
    """Texts read whole in windows: 1 x 8, 1 x 2 x 4 and 2 processes x 2 x 2 give the same weights; validation
    scores each of the 7 texts once from its windows under both, alike; the export evaluates the same."""
    long_texts = ddp["data"]["windows"]
    main(window_args(long_texts, tmp_path / "a"))
    main(window_args(long_texts, tmp_path / "b", "per_device_train_batch_size=2", "gradient_accumulation_steps=4"))
    runs = {"a": tmp_path / "a", "b": tmp_path / "b", "d": _ran_as_ddp_over_gloo(ddp, "windows")}
    reference = _weights(runs["a"])
    for run in ("b", "d"):
        assert max((v - reference[k]).abs().max().item() for k, v in _weights(runs[run]).items()) < 1e-5, run
    scored = {run: json.loads((runs[run] / "results.json").read_text())["validation"] for run in ("a", "d")}
    assert scored["a"]["num_samples"] == scored["d"]["num_samples"] == 7
    assert scored["a"]["accuracy"] == pytest.approx(scored["d"]["accuracy"], abs=1e-9)
    assert "7 samples (" in ddp["printed"]["windows"]  # the start summary counts texts and their windows

    # the export evaluates the same, text by text, with a line of predictions each
    evaluated = evaluate_main([str(tmp_path / "a" / "model"), "--data", str(long_texts["validation"]), "--predictions"])
    assert evaluated["num_samples"] == 7 and evaluated["accuracy"] == pytest.approx(scored["a"]["accuracy"])
    [written] = (tmp_path / "a" / "eval").rglob("predictions.jsonl")
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    assert len(lines) == 7 and all(abs(sum(line["probabilities"].values()) - 1) < 1e-5 for line in lines)


def test_accumulation_and_ddp_equal_one_big_batch_for_multiple_choice(ddp, tmp_path):
    """Multiple choice: 1 x 8 against 2 processes x 2 x 2 (41 contexts, uneven over the ranks), the same
    weights but the two kinds whose gradient is exactly zero (tests/test_multiple_choice.py says why), and the
    same validation loss and accuracy over each of the 11 contexts once."""
    main(swag_args(ddp["data"]["choices"], tmp_path / "a", "per_device_train_batch_size=8", *CHOICES_COMMON))
    runs = {"a": tmp_path / "a", "d": _ran_as_ddp_over_gloo(ddp, "choices")}
    reference, ddp_weights = _weights(runs["a"]), _weights(runs["d"])
    compared = [k for k in reference if not k.endswith(("classifier.bias", "attention.self.key.bias"))]
    assert len(compared) == len(reference) - 3
    assert max((ddp_weights[k] - reference[k]).abs().max().item() for k in compared) < 1e-5
    logged = logged_losses(runs["a"])  # and the comparison means something: training moved the model
    assert min(logged.values()) < logged[1] - 0.1, logged
    scored = {run: json.loads((out / "results.json").read_text())["validation"] for run, out in runs.items()}
    assert scored["a"]["num_samples"] == scored["d"]["num_samples"] == 11
    assert scored["a"]["loss"] == pytest.approx(scored["d"]["loss"], abs=1e-6)
    assert scored["a"]["accuracy"] == scored["d"]["accuracy"]
