"""finetune/steps.py: optimizer steps are the unit. The plan a dry run prints, and a learning-rate
schedule that ends where it was planned, with and without accumulation.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_steps.py
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import (
    tiny_text_args,
    user_error,
)
from transformers import get_scheduler

from finetune.run import main


def _records(out, key):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if key in r]


@pytest.mark.parametrize(
    "scheduler, accumulation",
    [pytest.param("linear", 1, marks=pytest.mark.slow), ("cosine", 3), pytest.param("linear", 3, marks=pytest.mark.slow),
     pytest.param("cosine", 1, marks=pytest.mark.slow)],
)  # fmt: skip
def test_schedule_ends_where_planned(small_text_data, tmp_path, scheduler, accumulation):
    """The LR schedule is planned in optimizer steps: the last step's LR is the schedule's end."""
    out = tmp_path / "run"
    main(
        tiny_text_args(
            small_text_data,
            out,
            "num_train_epochs=2",
            "per_device_train_batch_size=4",
            f"gradient_accumulation_steps={accumulation}",
            f"lr_scheduler_type={scheduler}",
        )
    )
    batches = math.ceil(37 / 4)
    total = 2 * math.ceil(batches / accumulation)
    logged = _records(out, "learning_rate")
    assert [r["step"] for r in logged] == list(range(1, total + 1))
    # The expected curve, from an independent scheduler on a dummy optimizer.
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    reference = get_scheduler(
        scheduler, opt, num_warmup_steps=math.ceil(0.2 * total), num_training_steps=total
    )
    expected = []
    for _ in range(total):
        opt.step()
        reference.step()
        expected.append(reference.get_last_lr()[0])
    assert [r["learning_rate"] for r in logged] == pytest.approx(expected, abs=1e-12)
    assert logged[-1]["learning_rate"] == pytest.approx(0.0, abs=1e-12)


def test_dry_run_prints_the_plan_and_writes_nothing(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    plan = main(
        tiny_text_args(
            small_text_data,
            out,
            "--dry-run",
            "per_device_train_batch_size=4",
            "gradient_accumulation_steps=3",
            "num_train_epochs=2",
            "lr_scheduler_type=linear",
        )
    )
    # 37 samples / batch 4 = 10 batches; 3 accumulation steps -> 4 optimizer steps an epoch.
    assert plan["optimizer_steps_per_epoch"] == 4 and plan["total_optimizer_steps"] == 8
    assert plan["global_batch_size"] == 12 and plan["warmup_steps"] == 2  # ceil(0.2 * 8)
    assert plan["first_learning_rate"] == 0.0
    assert plan["last_learning_rate"] == pytest.approx(1e-3 * (8 - 7) / (8 - 2))
    printed = capsys.readouterr().out
    assert "total_optimizer_steps" in printed and "last_learning_rate" in printed
    assert not out.exists()


def test_a_warm_up_as_long_as_the_run_is_said_or_refused(small_text_data, tmp_path, capsys):
    """max_steps=1 with a warm-up ratio: the only step's learning rate is 0, so nothing trains: one warning.
    warmup_steps as many as the run's steps (from its epochs) never reach learning_rate: refused."""
    main(tiny_text_args(small_text_data, tmp_path / "one", "--dry-run", "max_steps=1", "warmup_ratio=0.1"))
    assert "warning: warmup_ratio=0.1 makes all 1 optimizer step(s) warm-up steps" in capsys.readouterr().err
    main(tiny_text_args(small_text_data, tmp_path / "two", "--dry-run", "max_steps=2", "warmup_ratio=0.1"))
    assert "warm-up steps" not in capsys.readouterr().err
    user_error(capsys, main, tiny_text_args(small_text_data, tmp_path / "r", "--dry-run", "per_device_train_batch_size=37",
                                            "num_train_epochs=2", "warmup_steps=2"),
               "warmup_steps=2 covers all 2 optimizer step(s) of the run", rule="launch.warmup_steps_cover_the_run")  # fmt: skip


def test_the_plan_refuses_accumulation_past_an_epoch_and_warns_of_a_run_all_warm_up():
    """`plan_steps` on its own: 37 samples in batches of 8 are 5 batches a process, fewer than 6
    accumulation steps; one step with a warm-up ratio is all warm-up (said once, not refused)."""
    from types import SimpleNamespace

    from finetune import checks
    from finetune.errors import UserError
    from finetune.steps import plan_steps

    cfg = SimpleNamespace(per_device_train_batch_size=8, gradient_accumulation_steps=6, max_steps=None,
                          num_train_epochs=1, warmup_steps=None, warmup_ratio=0.1)  # fmt: skip
    with pytest.raises(UserError, match="gradient_accumulation_steps=6 exceeds the 5 batches per process") as e:
        plan_steps(cfg, 1, 37)
    assert e.value.rule == "launch.accumulation_over_epoch"
    said = checks.Said()
    plan_steps(SimpleNamespace(**{**vars(cfg), "gradient_accumulation_steps": 1, "max_steps": 1}), 1, 37, said=said)
    assert said.rules() == ["launch.all_warmup"]
