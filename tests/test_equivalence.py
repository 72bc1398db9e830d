"""Accumulation and DDP equal one big batch: the foundation's central promise, tested four ways
(and for regression and multi-label, below).

(a) 1 process, batch 8; (b) 1 process, batch 2, accumulation 4; (c) 2 processes over gloo, batch 4
each (the slow run); (d) 2 processes, batch 2, accumulation 2 — on 37 samples, so every epoch ends in a partial
window and (c), (d) get samples Accelerate duplicates to even out the last batch. The parameters
after 10 optimizer steps (two epochs, linear schedule with warmup; no clipping, which would hide a wrongly scaled gradient) agree within 1e-5.

(a), (b) and (d) in the default run: tests/test_ddp_equivalence.py (one launch for its three DDP runs); here
the slow ones.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from conftest import launch, multi_label_rows, regression_rows, tiny_text_args, write_jsonl
from safetensors.torch import load_file

from finetune.run import main

RUNS = {
    "a_1x8": (1, 8, 1),
    "b_1x2_acc4": (1, 2, 4),
    "c_2x4": (2, 4, 1),
    "d_2x2_acc2": (2, 2, 2),
}


def batching_args(name: str, data, out):
    """The run `name` of RUNS (its batch and accumulation per process) on `data`, into `out`."""
    _, batch, acc = RUNS[name]
    return tiny_text_args(data, out, f"per_device_train_batch_size={batch}", f"gradient_accumulation_steps={acc}",
                          "num_train_epochs=2", "max_grad_norm=null", "weight_decay=0.01")  # fmt: skip


def _train(name, small_text_data, tmp_path):
    procs = RUNS[name][0]
    out = tmp_path / name
    args = batching_args(name, small_text_data, out)
    if procs == 1:
        main(args)
    else:
        result = launch(args, num_processes=procs)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "DistributedType.MULTI_CPU" in result.stdout + result.stderr
    return load_file(out / "model" / "model.safetensors")


@pytest.mark.slow  # a launch of two processes
def test_ddp_alone_equals_one_big_batch(small_text_data, tmp_path):
    reference, ddp = (_train(name, small_text_data, tmp_path) for name in ("a_1x8", "c_2x4"))
    worst = max((ddp[k].float() - reference[k].float()).abs().max().item() for k in reference)
    assert worst < 1e-5, f"DDP differs from one big batch by {worst:.2e}"
    assert any(torch.any(v != 0) for v in reference.values())


# Regression (squared error) and multi-label (BCE averaged over the labels) go through the same
# masking and window scaling: the same four batchings agree for them too.
PROBLEM_DATA = {
    "regression": (regression_rows, "label_column=score"),
    "multi_label": (multi_label_rows, "label_column=labels"),
}


def _train_problem(problem: str, name: str, tmp_path) -> dict:
    rows_of, label = PROBLEM_DATA[problem]
    data = {
        "train": write_jsonl(tmp_path / "train.jsonl", rows_of(37, seed=0)),
        "validation": write_jsonl(tmp_path / "validation.jsonl", rows_of(13, seed=1)),
    }
    procs, batch, acc = RUNS[name]
    out = tmp_path / name
    args = tiny_text_args(data, out, label, f"per_device_train_batch_size={batch}",
                          f"gradient_accumulation_steps={acc}", "num_train_epochs=1", "max_grad_norm=null")  # fmt: skip
    if procs == 1:
        main(args)
    else:
        result = launch(args, num_processes=procs)
        assert result.returncode == 0, result.stderr[-3000:]
    assert yaml.safe_load((out / "config.yaml").read_text())["problem_type"] == (
        "regression" if problem == "regression" else "multi_label_classification"
    )
    return load_file(out / "model" / "model.safetensors")


def _worst(state: dict, reference: dict) -> float:
    assert state.keys() == reference.keys()
    return max((state[k].float() - reference[k].float()).abs().max().item() for k in reference)


@pytest.mark.slow
@pytest.mark.parametrize("problem", PROBLEM_DATA)
def test_regression_and_multi_label_accumulation_equals_one_big_batch(problem, tmp_path):
    reference = _train_problem(problem, "a_1x8", tmp_path)
    worst = _worst(_train_problem(problem, "b_1x2_acc4", tmp_path), reference)
    assert worst < 1e-5, f"{problem}: accumulation differs from one big batch by {worst:.2e}"


@pytest.mark.slow  # two launches of 2 processes, 90-120 s each on the loaded 2-core machine
@pytest.mark.parametrize("problem", PROBLEM_DATA)
def test_regression_and_multi_label_ddp_equals_one_big_batch(problem, tmp_path):
    """2 processes with accumulation: duplicates to mask, a partial last window."""
    reference = _train_problem(problem, "a_1x8", tmp_path)
    worst = _worst(_train_problem(problem, "d_2x2_acc2", tmp_path), reference)
    assert worst < 1e-5, f"{problem}: DDP differs from one big batch by {worst:.2e}"
