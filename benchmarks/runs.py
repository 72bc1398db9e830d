"""One measured run of each loop, as `python -m benchmarks.bench` and its levers compare them: the
app's real `finetune.run.train(cfg, hooks)` and the textbook `nlp_example` loop
(benchmarks/reference.py), each under a Recorder (its hooks) and a RunMonitor (benchmarks/recorder.py).

Several runs share one process: Accelerate's singletons are reset between them, so each run builds
its Accelerator afresh.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState

from benchmarks.recorder import Recorder, RunMonitor
from benchmarks.reference import nlp_example
from finetune.config import TrainConfig
from finetune.run import train

# The app's score a bench reports, the first of these its results hold for the split.
APP_METRICS = ("accuracy", "exact_match", "word_accuracy", "f1")


def reset_accelerate() -> None:
    """Forget Accelerate's process-wide state, so that the next Accelerator reads its settings anew."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Environment variables set for the block (Accelerate's settings: precision, the compiler)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def eval_split_of(results: dict[str, Any]) -> str:
    """The split `train()` scored last: test, or validation when the recipe has no test split."""
    return "test" if "test" in results else "validation"


def run_app(cfg: TrainConfig, warmup: int, device: torch.device, split: bool = True) -> dict[str, Any]:
    """The app's `train(cfg)`, timed through its hooks. Eval accuracy is what it returned for the
    test split (the validation split when the recipe has none). `split`: the Recorder's."""
    rec = Recorder(device, warmup, split)
    reset_accelerate()
    load = os.getloadavg()
    with RunMonitor(device) as mem:
        t = time.perf_counter()
        results = train(cfg, rec)
        wall = time.perf_counter() - t
    reset_accelerate()
    split = eval_split_of(results)
    return {
        **rec.summary(warmup),
        **mem.report(),
        "source": "finetune.run.train(cfg, hooks): the app's own loop, timed through its hooks",
        "optimizer_steps": results["step"],
        "train_wall_s": wall,
        "eval_split": split,
        # the app's own score of the task (accuracy; QA: exact match; a tagger: its word accuracy)
        "eval_metric": (metric := next(k for k in APP_METRICS if k in results[split])),
        "eval_accuracy": results[split][metric],
        "eval_samples": results[split]["num_samples"],
        "validation_evaluation": rec.validations[-1] if rec.validations else None,
        "load_avg_before": load,
        "load_avg_after": os.getloadavg(),
    }


def run_reference(
    cfg: TrainConfig,
    steps: int,
    eval_split: str,
    warmup: int,
    device: torch.device,
    pad_to: int | None = None,
    split: bool = True,
) -> dict[str, Any]:
    """The textbook loop (nlp_example) on the app's data, model, precision and schedule, `steps`
    optimizer steps, evaluated on `eval_split`; with the all-reduce time of its gradients."""
    rec = Recorder(device, warmup, split)
    reset_accelerate()
    load = os.getloadavg()
    with RunMonitor(device) as mem:
        t = time.perf_counter()
        ran = nlp_example(cfg, steps, eval_split, rec, pad_to)
        wall = time.perf_counter() - t
    reset_accelerate()
    out = {**rec.summary(warmup), **mem.report()}
    out["phases_s"]["communication"] = ran["communication_s"] if split else None
    return {
        **out,
        "source": "the textbook loop of benchmarks/reference.py (accelerate's nlp_example: shuffle, pad to "
        "longest, default AdamW, accelerator.backward)",
        "optimizer_steps": ran["optimizer_steps"],
        "train_wall_s": wall,
        "eval_split": eval_split,
        "eval_metric": "accuracy of the logits' argmax (a tagger: of each labelled token; QA: start and end of each window)",
        "eval_accuracy": ran["eval_accuracy"],
        "plain_validation": ran["plain_validation"],
        "eval_samples": ran["eval_samples"],
        "load_avg_before": load,
        "load_avg_after": os.getloadavg(),
    }
