"""report_to=tensorboard goes through Accelerate's tracker and works offline, beside metrics.jsonl."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_text_args

from finetune.run import main


def test_tensorboard_events_hold_the_logged_loss(small_text_data, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    main(
        tiny_text_args(
            small_text_data, out, "report_to=tensorboard", "max_steps=3", "per_device_train_batch_size=8"
        )
    )

    events = sorted(out.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event files under {out}"
    scalars = {}
    for directory in {e.parent for e in events}:
        accumulator = EventAccumulator(str(directory))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars[tag] = [(e.step, e.value) for e in accumulator.Scalars(tag)]
    assert {"loss", "learning_rate", "eval_accuracy", "eval_loss"} <= scalars.keys()

    # The same numbers as metrics.jsonl, at the same optimizer steps (TensorBoard stores float32).
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in logged if "loss" in r]
    assert [s for s, _ in scalars["loss"]] == [s for s, _ in losses] == [1, 2, 3]
    assert [v for _, v in scalars["loss"]] == pytest.approx([v for _, v in losses], rel=1e-6)


def test_overwritten_run_leaves_no_old_tensorboard_events(small_text_data, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    args = tiny_text_args(
        small_text_data, out, "report_to=tensorboard", "max_steps=2", "per_device_train_batch_size=8"
    )
    main(args)
    main([*args, "overwrite_output_dir=true"])

    steps = []
    for directory in {e.parent for e in out.rglob("events.out.tfevents.*")}:
        accumulator = EventAccumulator(str(directory))
        accumulator.Reload()
        if "loss" in accumulator.Tags()["scalars"]:
            steps += [e.step for e in accumulator.Scalars("loss")]
    assert sorted(steps) == [1, 2]  # today [1, 1, 2, 2]: both runs' curves drawn as one
