"""Checkpoints: exact mid-epoch resume (1 and 2 processes), completeness, retention, refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY_BERT, launch, tiny_text_args
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.run import main

# Dropout on, so that an exact resume also needs the RNG state restored.
DROPOUT_BERT = TINY_BERT.replace("hidden_dropout_prob: 0.0", "hidden_dropout_prob: 0.1")


def _args(data, out, *extra):
    return tiny_text_args(
        data,
        out,
        f"model_config={DROPOUT_BERT}",
        "num_train_epochs=2",
        "per_device_train_batch_size=4",
        "save_steps=3",
        "save_total_limit=null",
        *extra,
    )


def _losses(out, first_step):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r and r["step"] > first_step]


def _resume_matches_uninterrupted(data, tmp_path, run):
    full = tmp_path / "full"
    run(_args(data, full))
    saved = ckpt.list_checkpoints(full)
    assert saved[0].name == "step-00000003" and len(saved) >= 2
    manifest = ckpt.read_manifest(saved[0])
    assert 0 < manifest["samples_in_epoch"] < 37  # a mid-epoch checkpoint

    # A run "killed" after its step-3 checkpoint: the same run directory up to that point.
    resumed = tmp_path / "resumed"
    (resumed / ckpt.CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(saved[0], resumed / ckpt.CHECKPOINTS / saved[0].name)
    run(_args(data, resumed, "resume_from_checkpoint=latest"))

    a = load_file(full / "model" / "model.safetensors")
    b = load_file(resumed / "model" / "model.safetensors")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, f"resumed weights differ by {worst:.2e}"
    total = _losses(full, 0)[-1][0]
    # A dict: pytest.approx compares numbers in flat containers only (pytest 9.2 refuses nested ones).
    assert dict(_losses(resumed, 3)) == pytest.approx(dict(_losses(full, 3)), abs=1e-6)
    assert len(_losses(resumed, 3)) == total - 3


def test_mid_epoch_resume_is_exact_single_process(small_text_data, tmp_path):
    _resume_matches_uninterrupted(small_text_data, tmp_path, main)


def test_mid_epoch_resume_is_exact_two_processes(small_text_data, tmp_path):
    def run(args):
        result = launch(args, num_processes=2)
        assert result.returncode == 0, result.stderr[-3000:]

    _resume_matches_uninterrupted(small_text_data, tmp_path, run)


def test_incomplete_checkpoints_are_never_latest(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(_args(small_text_data, out, "num_train_epochs=1"))
    complete = ckpt.list_checkpoints(out)
    # A save killed midway: a hidden temporary directory and a directory without its marker.
    (out / ckpt.CHECKPOINTS / ".tmp-step-00000099").mkdir()
    broken = out / ckpt.CHECKPOINTS / "step-00000098"
    shutil.copytree(complete[-1], broken)
    (broken / ckpt.COMPLETE).unlink()
    assert ckpt.list_checkpoints(out) == complete
    assert ckpt.resolve_checkpoint("latest", out) == complete[-1]
    with pytest.raises(Exception, match="not a complete checkpoint"):
        ckpt.resolve_checkpoint(str(broken), out)


def test_retention_keeps_last_and_best(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(
        tiny_text_args(
            small_text_data,
            out,
            "num_train_epochs=2",
            "per_device_train_batch_size=4",
            "save_steps=3",
            "eval_steps=3",
            "save_total_limit=1",
        )
    )
    kept = ckpt.list_checkpoints(out)
    manifest = ckpt.read_manifest(kept[-1])
    best = manifest["best"]["path"]
    assert kept[-1].name == "step-00000018"
    assert {p.name for p in kept} == {kept[-1].name, best.rsplit("/", 1)[-1]}


def test_changed_topology_on_resume_is_refused(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    main(_args(small_text_data, out, "num_train_epochs=1"))
    with pytest.raises(SystemExit) as exit_info:
        main(_args(small_text_data, out, "resume_from_checkpoint=latest", "gradient_accumulation_steps=2"))
    assert exit_info.value.code == 2
    assert "resume with the same settings" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # other trainable weights: another optimizer state
        main(_args(small_text_data, out, "resume_from_checkpoint=latest", "freeze_embeddings=true"))
    assert exit_info.value.code == 2
    assert (
        "trained with freeze_embeddings=false, this run has freeze_embeddings=true; resume with "
        "freeze_embeddings=false" in capsys.readouterr().err
    )


def test_allowed_topology_change_continues_without_repeating_samples(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(_args(small_text_data, out, "max_steps=null"))  # checkpoints at 3, 6, ...; 10 steps an epoch
    first = ckpt.list_checkpoints(out)[0]
    assert ckpt.read_manifest(first)["samples_in_epoch"] == 12
    resumed = tmp_path / "resumed"
    (resumed / ckpt.CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(first, resumed / ckpt.CHECKPOINTS / first.name)
    main(
        _args(
            small_text_data,
            resumed,
            "resume_from_checkpoint=latest",
            "gradient_accumulation_steps=2",
            "resume_allow_topology_change=true",
        )
    )
    # The 25 samples left in epoch 0 are 7 batches of 4 -> 4 steps of 2; epoch 1 is 10 batches -> 5 steps.
    steps = [s for s, _ in _losses(resumed, 0)]
    assert steps == list(range(4, 3 + 4 + 5 + 1))
    records = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if "learning_rate" in r][-1]["learning_rate"] == pytest.approx(0.0, abs=1e-12)


def test_resume_needs_only_the_run_directory(small_text_data, tmp_path, capsys):
    """`resume_from_checkpoint=latest output_dir=<run>` alone: the run's saved config.yaml is the recipe
    (here a tiny BERT the default recipe knows nothing of), and the resumed run equals the whole one."""
    full = tmp_path / "full"
    main(_args(small_text_data, full))
    resumed = tmp_path / "resumed"
    first = ckpt.list_checkpoints(full)[0]
    shutil.copytree(first, resumed / ckpt.CHECKPOINTS / first.name)
    shutil.copy(full / "config.yaml", resumed / "config.yaml")
    capsys.readouterr()
    main(["resume_from_checkpoint=latest", f"output_dir={resumed}"])
    assert f"resuming with the run's own recipe {resumed / 'config.yaml'}" in capsys.readouterr().out
    a, b = (load_file(d / "model" / "model.safetensors") for d in (full, resumed))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    # a checkpoint directory names its run too
    again = tmp_path / "again"
    shutil.copytree(resumed, again, ignore=shutil.ignore_patterns("model", "results.json"))
    main(
        [
            f"resume_from_checkpoint={again / ckpt.CHECKPOINTS / first.name}",
            f"output_dir={again}",
            "overwrite_output_dir=true",
        ]
    )
    c = load_file(again / "model" / "model.safetensors")
    assert max((a[k] - c[k]).abs().max().item() for k in a) <= 1e-6


def test_a_folder_with_a_config_yaml_but_no_checkpoints_is_not_read_as_a_run(tmp_path):
    """A project folder of the user's that holds some config.yaml: `resume_from_checkpoint=latest
    output_dir=<it>` does not take that file for the run's recipe."""
    from finetune.config import resumed_run_recipe

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "config.yaml").write_text("database: postgres\n")
    assert resumed_run_recipe(["resume_from_checkpoint=latest", f"output_dir={folder}"]) is None
    (folder / ckpt.CHECKPOINTS).mkdir()
    assert resumed_run_recipe(["resume_from_checkpoint=latest", f"output_dir={folder}"]) == folder / "config.yaml"


@pytest.mark.parametrize("total_now", [6, 9])
def test_a_resume_with_a_larger_max_steps_trains_its_first_step_on_the_new_schedule(total_now):
    """The checkpoint of a finished 6-step run holds learning rate 0 (the end of its linear decay). Resumed
    with max_steps=9, the first resumed step trains at the 9-step schedule's rate at step 6, not at 0;
    resumed unchanged, the restored rates stay exactly as saved (exact resume)."""
    from transformers import get_scheduler

    def build(total):
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        return optimizer, get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=total)

    optimizer, scheduler = build(6)
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    saved_rate = optimizer.param_groups[0]["lr"]
    state = (optimizer.state_dict(), scheduler.state_dict())
    optimizer, scheduler = build(total_now)
    optimizer.load_state_dict(state[0])
    scheduler.load_state_dict(state[1])
    said = []
    ckpt.apply_learning_rate(optimizer, scheduler, {"config": {"learning_rate": 1e-3}}, 1e-3, said.append)
    if total_now == 6:
        assert saved_rate == 0.0 and optimizer.param_groups[0]["lr"] == saved_rate and not said
    else:
        assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 9, rel=1e-12) and said
        assert scheduler.get_last_lr() == [optimizer.param_groups[0]["lr"]]


def test_a_resume_with_another_learning_rate_goes_on_with_it(small_text_data, tmp_path, capsys):
    """After a divergence the line says: lower learning_rate, then resume. The resumed run's learning rate
    is the uninterrupted run's schedule scaled by new / saved, from the first step after the checkpoint."""
    full = tmp_path / "full"
    main(_args(small_text_data, full))
    resumed = tmp_path / "resumed"
    first = ckpt.list_checkpoints(full)[0]
    shutil.copytree(first, resumed / ckpt.CHECKPOINTS / first.name)
    main(_args(small_text_data, resumed, "resume_from_checkpoint=latest", "learning_rate=5e-4"))
    assert "learning_rate 0.001 in the checkpoint, 0.0005 from here" in capsys.readouterr().out

    def rates(out):
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r and r["step"] > 3}

    before, after = rates(full), rates(resumed)
    assert after and set(after) == set(before)
    assert all(after[s] == pytest.approx(before[s] / 2, rel=1e-9, abs=1e-15) for s in after)
