"""finetune/checkpoint.py: exact mid-epoch resume (1 and 2 processes), completeness, retention, what a
resume may and may not change, and saves cut short (kill -9, a crash mid-save).

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_checkpoint.py

The uninterrupted runs a resume is compared with come from the session's factory (`finished_run`):
trained once, shared by the tests here and in tests/test_signals.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType
from conftest import (
    DROPOUT_BERT,
    REPO,
    UNINTERRUPTED,
    assert_same_run,
    launch,
    logged_steps,
    recipe_text_args,
    reset_accelerate,
    tiny_text_args,
    user_error,
    wait_until,
)
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune import checks
from finetune.run import Hooks, main

# Two epochs of 10 steps (37 samples in batches of 4), a checkpoint every 3 steps, all kept.
FULL = (f"model_config={DROPOUT_BERT}", "num_train_epochs=2", "per_device_train_batch_size=4", "save_steps=3",
        "save_total_limit=null")  # fmt: skip


def _args(data, out, *extra):
    return tiny_text_args(data, out, *FULL, *extra)


def _losses(out, first_step):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r and r["step"] > first_step]


def _resume_matches_uninterrupted(data, full, tmp_path, run):
    """`full`: the uninterrupted run of `_args(data, ...)`; the same run killed after its step-3
    checkpoint and resumed by `run` ends as it did."""
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


def test_mid_epoch_resume_is_exact_single_process(finished_run, tmp_path):
    _resume_matches_uninterrupted(finished_run.data(), finished_run(*FULL), tmp_path, main)


def test_the_resume_line_counts_epochs_from_1_as_the_console_does(finished_run, tmp_path, capsys):
    """Resumed at step 12 (37 samples in batches of 4: 10 steps an epoch), the run is in its second epoch,
    which the console's validation line and metrics.jsonl call epoch 2; the resume line said epoch 1."""
    full = finished_run(*FULL)
    saved = next(c for c in ckpt.list_checkpoints(full) if c.name == "step-00000012")
    resumed = tmp_path / "resumed"
    (resumed / ckpt.CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(saved, resumed / ckpt.CHECKPOINTS / saved.name)
    capsys.readouterr()
    main(_args(finished_run.data(), resumed, "resume_from_checkpoint=latest"))
    out = capsys.readouterr().out
    assert "at step 12 (epoch 2, 8 samples into it)" in out, out
    assert "(epoch 2): validation" in out
    assert [json.loads(line)["epoch"] for line in (resumed / "metrics.jsonl").read_text().splitlines()
            if "eval_loss" in line] == [2]  # fmt: skip
    assert "this run had finished" not in out
    # the whole finished run resumed from its latest checkpoint (step 18 of 20): trained again, said so
    again = tmp_path / "again"
    shutil.copytree(full, again)
    main(_args(finished_run.data(), again, "resume_from_checkpoint=latest"))
    assert ("this run had finished (step 20, its export in " in (said := capsys.readouterr().out)
            and "trains steps 19 to 20 again and writes the export again" in said), said  # fmt: skip


@pytest.mark.slow
def test_mid_epoch_resume_is_exact_two_processes(small_text_data, tmp_path):
    def run(args):
        result = launch(args, num_processes=2)
        assert result.returncode == 0, result.stderr[-3000:]

    full = tmp_path / "full"
    run(_args(small_text_data, full))
    _resume_matches_uninterrupted(small_text_data, full, tmp_path, run)


@pytest.mark.slow
def test_incomplete_checkpoints_are_never_latest(finished_run, tmp_path):
    out = finished_run.copy(tmp_path / "run", *FULL, "num_train_epochs=1")
    complete = ckpt.list_checkpoints(out)
    # A save killed midway: a hidden temporary directory and a directory without its marker.
    (out / ckpt.CHECKPOINTS / ".tmp-step-00000099").mkdir()
    broken = out / ckpt.CHECKPOINTS / "step-00000098"
    shutil.copytree(complete[-1], broken)
    (broken / ckpt.COMPLETE).unlink()
    assert ckpt.list_checkpoints(out) == complete
    said = checks.Said()
    assert ckpt.resolve_checkpoint("latest", out, said) == complete[-1]
    assert said.rules() == ["runs.latest_skipped"] and f"skipped {broken}: it has no COMPLETE marker" in said.lines[0][1]
    with pytest.raises(Exception, match="not a complete checkpoint") as refused:
        ckpt.resolve_checkpoint(str(broken), out)
    assert refused.value.rule == "runs.resume_not_complete"


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


@pytest.mark.slow
def test_changed_topology_on_resume_is_refused(finished_run, tmp_path, capsys):
    data, out = finished_run.data(), finished_run.copy(tmp_path / "run", *FULL, "num_train_epochs=1")
    user_error(capsys, main, _args(data, out, "resume_from_checkpoint=latest", "gradient_accumulation_steps=2"),
               "resume with the same settings", untouched=out, rule="runs.other_topology")  # fmt: skip
    # other trainable weights: another optimizer state
    user_error(capsys, main, _args(data, out, "resume_from_checkpoint=latest", "freeze_embeddings=true"),
               "trained with freeze_embeddings=false, this run has freeze_embeddings=true; resume with "
               "freeze_embeddings=false", untouched=out, rule="runs.resume_changes_a_fixed_setting")  # fmt: skip


@pytest.mark.slow
def test_allowed_topology_change_continues_without_repeating_samples(finished_run, tmp_path):
    small_text_data, out = finished_run.data(), finished_run(*FULL)  # checkpoints at 3, 6, ...; 10 steps an epoch
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


@pytest.mark.slow
def test_resume_needs_only_the_run_directory(finished_run, tmp_path, capsys):
    """`resume_from_checkpoint=latest output_dir=<run>` alone: the run's saved config.yaml is the recipe
    (here a tiny BERT the default recipe knows nothing of), and the resumed run equals the whole one."""
    full = finished_run(*FULL)
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
    from finetune.cli import resumed_run_recipe

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


def test_a_resume_with_another_learning_rate_goes_on_with_it(finished_run, tmp_path, capsys):
    """After a divergence the line says: lower learning_rate, then resume. The resumed run's learning rate
    is the uninterrupted run's schedule scaled by new / saved, from the first step after the checkpoint."""
    small_text_data, full = finished_run.data(), finished_run(*FULL)
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


@pytest.mark.slow  # ~12 s
def test_only_an_evaluated_checkpoint_carries_metrics_or_can_be_best(small_text_data, tmp_path):
    """Checkpoints every 2 steps, evaluations every 3: a checkpoint at a step without an evaluation
    (4) holds no metrics, so it cannot be named best on the strength of step 3's evaluation."""
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "num_train_epochs=2", "per_device_train_batch_size=8",
                        "eval_steps=3", "save_steps=2", "save_total_limit=null"))  # fmt: skip
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = {e["step"] for e in lines if "eval_loss" in e}
    saved = {int(p.name.split("-")[1]): p for p in ckpt.list_checkpoints(out)}
    assert 4 in saved and 4 not in evaluated and 3 in evaluated  # the case this test is about
    for step, path in saved.items():
        metrics = json.loads((path / ckpt.MANIFEST).read_text())["metrics"]
        assert bool(metrics) == (step in evaluated), step
    best = json.loads((out / "results.json").read_text())["best"]
    assert best["step"] in evaluated and best["step"] in saved


# A finished run of 4 steps at a constant learning rate, checkpoints at 2 and 4.
CONSTANT = ("max_steps=4", "save_steps=2", "lr_scheduler_type=constant", "warmup_ratio=0",
            "per_device_train_batch_size=4")  # fmt: skip


@pytest.mark.slow  # ~9 s
def test_resume_from_the_last_step_trains_nothing_more(finished_run, tmp_path):
    """With a constant learning rate an extra step would change the weights."""
    finished = finished_run(*CONSTANT)
    again = finished_run.copy(tmp_path / "again", *CONSTANT)
    shutil.rmtree(again / "model")
    (again / "results.json").unlink()  # as a kill during the export leaves it
    results = main(tiny_text_args(finished_run.data(), again, *CONSTANT, "resume_from_checkpoint=latest"))
    assert results["step"] == 4
    a, b = load_file(finished / "model/model.safetensors"), load_file(again / "model/model.safetensors")
    assert all((a[k] - b[k]).abs().max() == 0 for k in a)


# --- what a resume may change -----------------------------------------------------------------------------

# A finished run with checkpoints at steps 6 and 9 (of 10), under the default recipe's optimisation.
SAVED = ("save_steps=3", "per_device_train_batch_size=4")


@pytest.fixture(scope="module")
def saved_run(finished_run) -> tuple[dict[str, Path], Path]:
    """What refused resumes must not change (they aim at the shared run: `user_error` checks its bytes)."""
    data = finished_run.data()
    return data, finished_run(*SAVED, recipe=True)


def test_a_resume_with_fewer_samples_than_consumed_is_refused_before_config_yaml_is_rewritten(saved_run, capsys):
    data, out = saved_run
    line = user_error(capsys, main, recipe_text_args(data, out, "resume_from_checkpoint=latest", "max_train_samples=8",
                                                     "per_device_train_batch_size=4"), untouched=out,
                      rule="runs.other_sample_count")  # fmt: skip
    assert "trained on 37 samples an epoch, this run has 8" in line


@pytest.mark.slow  # a second refused resume of the same kind (~10 s)
def test_a_resume_whose_sample_count_changed_with_validation_file_names_it(saved_run, capsys):
    """The run had a validation file; the resume has none, so it holds out a share of the training data."""
    data, out = saved_run
    line = user_error(capsys, main, recipe_text_args(data, out, "resume_from_checkpoint=latest", "validation_file=null",
                                                     "per_device_train_batch_size=4"), untouched=out,
                      rule="runs.other_sample_count")  # fmt: skip
    assert "this run has 33 (the run had validation_file=" in line and "this run has null: a run without one" in line


def test_a_resume_on_a_training_file_edited_in_place_is_refused(saved_run, tmp_path, capsys):
    """The same number of rows, one label changed: the checkpoint's order would now feed other samples.
    The manifest keeps the training file's sha256; the same bytes under another path still resume
    (every other resume test here reads the same files)."""
    data, out = saved_run
    rows = data["train"].read_text().splitlines()
    text, label = rows[1].rsplit(",", 1)
    rows[1] = f"{text},{1 - int(label)}"
    edited = tmp_path / "train.csv"
    edited.write_text("\n".join(rows) + "\n")
    argv = recipe_text_args({**data, "train": edited}, out, "resume_from_checkpoint=latest", "per_device_train_batch_size=4")
    line = user_error(capsys, main, argv, untouched=out, rule="runs.training_data_changed")
    assert f"the training data changed since the checkpoint was saved ({edited} differs" in line


def test_a_resume_past_max_steps_is_refused_before_anything_is_written(saved_run, capsys):
    """The checkpoint is at step 9; max_steps=2 would export the step-9 model under a config.yaml that
    says 2 steps."""
    data, out = saved_run
    line = user_error(capsys, main, recipe_text_args(data, out, "resume_from_checkpoint=latest", "max_steps=2",
                                                     "per_device_train_batch_size=4"), untouched=out,
                      rule="runs.checkpoint_past_the_plan")  # fmt: skip
    assert "the checkpoint is at optimizer step 9, past the 2 steps of this run (max_steps=2)" in line
    assert "max_steps=9 or more" in line and "evaluate_checkpoint.py" in line


@pytest.mark.parametrize(
    "change, fragment",
    [
        ("seed=7", "trained with seed=42, this run has seed=7; resume with seed=42"),
        ("freeze_layers=1", "trained with freeze_layers=0, this run has freeze_layers=1"),
        pytest.param("group_by_length=false", "trained with group_by_length=true", marks=pytest.mark.slow),
        pytest.param("max_length=16", "trained with max_length=32, this run has max_length=16; resume with max_length=32",
                     marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_a_resume_that_would_change_the_run_names_the_setting(change, fragment, saved_run, capsys):
    data, out = saved_run
    argv = recipe_text_args(data, out, "resume_from_checkpoint=latest", change, "per_device_train_batch_size=4")
    user_error(capsys, main, argv, fragment, untouched=out, rule="runs.resume_changes_a_fixed_setting")


@pytest.mark.parametrize(
    "key, value, shown",
    [("label_smoothing", 0.1, "label_smoothing=0.0"), ("class_weights", "balanced", "class_weights=null"),
     ("metric_for_best_model", "macro_f1", "metric_for_best_model=accuracy"),
     ("greater_is_better", False, "greater_is_better=true"), ("random_flip", True, "random_flip=false"),
     ("augment", ["crop"], "augment=[]"), ("validation_split_percentage", 20.0, "validation_split_percentage=10.0"),
     ("label_column", "sentiment", "label_column=label"), ("text_pair_column", "other", "text_pair_column=null")],
)  # fmt: skip
def test_settings_that_define_the_data_or_the_loss_are_fixed_on_resume(key, value, shown, saved_run):
    """The same check as above, on the saved manifest, for the rest of what defines the data or the loss."""
    from finetune.config import config_from_dict
    from finetune.errors import UserError

    manifest = ckpt.read_manifest(ckpt.list_checkpoints(saved_run[1])[-1])
    if key in ("random_flip", "augment"):  # image settings, refused on a text run: the run made an image one
        manifest["config"] = {k: v for k, v in manifest["config"].items() if "text" not in k and k != "max_length"}
        manifest["config"]["task"] = manifest["task"] = "image-classification"
    cfg = config_from_dict({**manifest["config"], key: value}, saved=True)
    with pytest.raises(UserError) as refused:
        ckpt.check_resume_compatible(manifest, cfg, 1, manifest["label_names"], 37, fsdp=False)
    assert f"the checkpoint was trained with {shown}, this run has {key}=" in str(refused.value)
    assert refused.value.rule == "runs.resume_changes_a_fixed_setting"


def test_a_resume_with_another_tokenizer_is_refused_and_the_same_by_another_path_is_not(saved_run, monkeypatch):
    """The tokenizer says what a sample is: another one is refused; the same folder given relative to
    the working directory instead of absolute is the same tokenizer."""
    import os

    from finetune.config import config_from_dict
    from finetune.errors import UserError

    manifest = ckpt.read_manifest(ckpt.list_checkpoints(saved_run[1])[-1])
    saved = manifest["config"]["tokenizer_name"]
    other = config_from_dict({**manifest["config"], "tokenizer_name": "bert-base-cased"}, saved=True)
    with pytest.raises(UserError, match=f"trained with tokenizer_name={saved}, this run has tokenizer_name="):
        ckpt.check_resume_compatible(manifest, other, 1, manifest["label_names"], 37, fsdp=False)
    monkeypatch.chdir(Path(saved).parent)
    relative = config_from_dict({**manifest["config"], "tokenizer_name": os.path.basename(saved)}, saved=True)
    ckpt.check_resume_compatible(manifest, relative, 1, manifest["label_names"], 37, fsdp=False)


def test_a_resume_with_another_model_config_names_the_sub_key(saved_run):
    """The run built its model from a config; the resume gives the same config with a wider layer: the line
    names the sub-key and both values, not damaged weights; the same config resumes."""
    from finetune.config import config_from_dict
    from finetune.errors import UserError

    manifest = ckpt.read_manifest(ckpt.list_checkpoints(saved_run[1])[-1])
    built = manifest["config"]["model_config"]
    wider = config_from_dict({**manifest["config"], "model_config": {**built, "hidden_size": built["hidden_size"] * 2}},
                             saved=True)  # fmt: skip
    with pytest.raises(UserError) as refused:
        ckpt.check_resume_compatible(manifest, wider, 1, manifest["label_names"], 37, fsdp=False)
    assert (f"trained with model_config.hidden_size={built['hidden_size']}, this run has "
            f"model_config.hidden_size={built['hidden_size'] * 2}") in str(refused.value)  # fmt: skip
    same = config_from_dict({**manifest["config"], "model_config": dict(built)}, saved=True)
    assert ckpt.check_resume_compatible(manifest, same, 1, manifest["label_names"], 37, fsdp=False) is False


class _Optimizer(Hooks):
    """Keeps the weight decay of the optimizer's first group at each step (after the resume's restore)."""

    def __init__(self):
        super().__init__()
        self.run, self.weight_decay = None, []

    def mark(self, name, value=None):
        if name == "prepared":
            self.run = value
        elif name == "step":
            self.weight_decay.append(self.run.optimizer.param_groups[0]["weight_decay"])


@pytest.mark.slow  # ~10 s
def test_a_resume_that_changes_what_may_change_says_so_and_keeps_the_history(small_text_data, tmp_path, capsys):
    """learning_rate, weight_decay, dropout, max_steps and the cadences may change on a resume: one line
    names each change, old -> new; the new weight decay is the one used (torch would restore the old);
    the checkpoints' manifests and results.json keep every resume's changes, so that config.yaml (the
    last values) is not read as the whole run's."""
    out = tmp_path / "run"
    main(recipe_text_args(small_text_data, out, "save_steps=3", "per_device_train_batch_size=4", "max_steps=6"))
    capsys.readouterr()
    watch = _Optimizer()
    main(recipe_text_args(small_text_data, out, "resume_from_checkpoint=latest", "per_device_train_batch_size=4", "max_steps=8",
              "save_steps=2", "weight_decay=0.1", "dropout=0.1"), hooks=watch)  # fmt: skip
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resumed with changed settings")]
    assert said == ["resumed with changed settings: dropout null -> 0.1, max_steps 6 -> 8, weight_decay 0.01 -> 0.1, "
                    "save_steps 3 -> 2"]  # fmt: skip
    assert watch.weight_decay == [0.1, 0.1]
    first = {"step": 6, "changed": {"dropout": [None, 0.1], "max_steps": [6, 8], "weight_decay": [0.01, 0.1],
                                    "save_steps": [3, 2]}}  # fmt: skip
    assert json.loads((out / "checkpoints" / "step-00000008" / "manifest.json").read_text())["resumed_with"] == [first]
    results = main(recipe_text_args(small_text_data, out, "resume_from_checkpoint=latest", "per_device_train_batch_size=4", "max_steps=9",
                        "save_steps=2", "weight_decay=0.1", "dropout=0.1"))  # fmt: skip
    assert results["resumed_with"] == [first, {"step": 8, "changed": {"max_steps": [8, 9]}}]
    assert json.loads((out / "results.json").read_text())["resumed_with"] == results["resumed_with"]


# --- saves cut short: kill -9, a crash mid-save ---------------------------------------------------------


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """`python finetune/run.py ...`, as a one-process job: the process that gets the signal trains."""
    return subprocess.Popen([sys.executable, str(REPO / "finetune/run.py"), *args], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log.with_suffix(".out").open("w"),
                            stderr=log.with_suffix(".err").open("w"))  # fmt: skip


def _checkpoint_steps(out: Path) -> list[int]:
    return [ckpt.read_manifest(p)["step"] for p in ckpt.list_checkpoints(out)]


@pytest.mark.slow
def test_kill_9_at_several_points_then_resume_is_exact(finished_run, tmp_path):
    """SIGKILL right after a checkpoint appears, and again between two checkpoints (the steps after the
    checkpoint are trained again, and their first log lines dropped); then resume to the end."""
    out = tmp_path / "run"
    args = tiny_text_args(finished_run.data(), out, *UNINTERRUPTED, "save_steps=4")
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
    assert_same_run(out, finished_run(*UNINTERRUPTED))


class _Killed(BaseException):
    """Stands for kill -9: nothing catches it, nothing after it runs."""


@pytest.mark.parametrize("where", [pytest.param("in save_state", marks=pytest.mark.slow),  # ~20 s; test_faults: no partial save
                                   pytest.param("before the rename", marks=pytest.mark.slow)])
def test_kill_during_a_checkpoint_write_keeps_the_previous_one(finished_run, tmp_path, monkeypatch, where):
    """The second save dies half-way (files written, no COMPLETE; or complete but still hidden): the
    first checkpoint stays the latest, loads, and the resumed run ends where the uninterrupted one did."""
    from accelerate import Accelerator

    out = tmp_path / "run"
    args = tiny_text_args(finished_run.data(), out, *UNINTERRUPTED, "save_steps=3")
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
    reset_accelerate()  # the killed run left its Accelerator behind
    main([*args, "resume_from_checkpoint=latest"])  # re-saves step 6 over the leftover
    assert not (out / ckpt.CHECKPOINTS / ".tmp-step-00000006").exists()
    assert_same_run(out, finished_run(*UNINTERRUPTED))


def test_latest_in_another_case_is_pointed_to_the_keyword(tmp_path):
    """resume_from_checkpoint=Latest is a path that does not exist; the line names the keyword."""
    from finetune.errors import UserError

    with pytest.raises(UserError, match=r"^checkpoint not found: Latest; the newest checkpoint is "
                                        r"resume_from_checkpoint=latest \(lower case\)$") as refused:  # fmt: skip
        ckpt.resolve_checkpoint("Latest", tmp_path)
    assert refused.value.rule == "runs.latest_misspelt"


@pytest.mark.slow
def test_a_resumed_runs_config_yaml_as_a_new_runs_recipe_starts_afresh(small_text_data, tmp_path, capsys):
    """config.yaml holds the run's settings, not the command's resume: after a resume it says
    resume_from_checkpoint: null, so `--config <run>/config.yaml output_dir=<new>` trains a new run instead
    of looking for a checkpoint the user never named."""
    import yaml

    run, new = tmp_path / "run", tmp_path / "new"
    main(tiny_text_args(small_text_data, run, "max_steps=2", "save_steps=1"))
    main(tiny_text_args(small_text_data, run, "max_steps=3", "save_steps=1", "resume_from_checkpoint=latest"))
    assert yaml.safe_load((run / "config.yaml").read_text())["resume_from_checkpoint"] is None
    capsys.readouterr()
    results = main(["--config", str(run / "config.yaml"), f"output_dir={new}"])
    assert results["step"] == 3 and "resuming" not in capsys.readouterr().out


def test_a_resume_whose_training_file_moved_names_the_setting_to_give(small_text_data, tmp_path, capsys):
    """The run's own recipe (config.yaml) names a training file that has since moved: one line says which
    setting gives its new path, and with it the resume goes on (the file's bytes are the run's)."""
    (tmp_path / "mine").mkdir()
    data = {split: Path(shutil.copy(path, tmp_path / "mine" / f"{split}.csv")) for split, path in small_text_data.items()}
    run = tmp_path / "run"
    main(tiny_text_args(data, run, "max_steps=2", "save_steps=1"))
    moved = data["train"].rename(tmp_path / "moved.csv")
    resume = ["resume_from_checkpoint=latest", f"output_dir={run}", "max_steps=3"]
    user_error(capsys, main, resume, f"the run's train_file {data['train']} is not found (moved or renamed since the "
               "run?); resume with train_file=<its path now>", untouched=run, rule="settings.resumed_data_moved")  # fmt: skip
    assert main([*resume, f"train_file={moved}"])["step"] == 3


# --- the rules that name a checkpoint's damage, and what loading one refuses (finetune/checks/runs.py) -----


def _manifest_edit(edit):
    def damage(path: Path) -> None:
        manifest = json.loads((path / ckpt.MANIFEST).read_text())
        (path / ckpt.MANIFEST).write_text(json.dumps(edit(manifest) or manifest))

    return damage


def _zero(name: str):
    return lambda path: (path / name).write_bytes(b"")


# rule id -> the damage it names
DAMAGES = {
    "runs.manifest_unreadable": lambda p: (p / ckpt.MANIFEST).write_text("{not json"),
    "runs.manifest_not_a_mapping": lambda p: (p / ckpt.MANIFEST).write_text("[1, 2]"),
    "runs.manifest_lacks_a_count": _manifest_edit(lambda m: m.pop("world_size") and None),
    "runs.manifest_count_not_a_count": _manifest_edit(lambda m: m.update(epoch=-1)),
    "runs.manifest_labels_differ": _manifest_edit(lambda m: m.update(label_names=["b", "a"])),
    "runs.manifest_of_another_step": _manifest_edit(lambda m: m.update(step=99)),
    "runs.weights_missing": lambda p: (p / "model.safetensors").unlink(),
    "runs.weights_damaged": lambda p: (p / "model.safetensors").write_bytes(b"\xff" * 16),
    "runs.state_file_missing": lambda p: (p / "optimizer.bin").unlink(),
    "runs.state_file_damaged": _zero("scheduler.bin"),
}


@pytest.fixture
def saved_copy(saved_run, tmp_path) -> Path:
    """A private copy of the saved run (its checkpoints at steps 3, 6 and 9)."""
    return Path(shutil.copytree(saved_run[1], tmp_path / "run"))


@pytest.mark.parametrize("rule", DAMAGES)
def test_a_damaged_checkpoint_is_named_by_the_rule_that_finds_the_damage(rule, saved_copy):
    """checkpoint_problem's line is the damage alone; a resume from the checkpoint, and a read of its
    manifest, are refused under that rule with what to do after it."""
    from finetune.checks import runs
    from finetune.errors import UserError

    path = ckpt.list_checkpoints(saved_copy)[-1]
    DAMAGES[rule](path)
    found = ckpt.checkpoint_damage(path)
    assert found is not None and found[0].id == rule and ckpt.checkpoint_problem(path) == found[1]
    with pytest.raises(UserError) as refused:
        ckpt.resolve_checkpoint(str(path), saved_copy)
    assert refused.value.rule == rule and str(refused.value) == f"cannot resume from {path}: {found[1]}; {runs.ANOTHER}"
    if rule.startswith("runs.manifest_"):
        with pytest.raises(UserError) as refused:
            ckpt.read_manifest(path)
        assert refused.value.rule == rule and str(refused.value) == f"{found[1]}; {runs.ANOTHER}"


def test_latest_with_every_checkpoint_damaged_names_each_and_a_checkpoint_without_its_marker(saved_copy):
    from finetune.errors import UserError

    saved = ckpt.list_checkpoints(saved_copy)
    for path in saved:
        (path / "scheduler.bin").write_bytes(b"")
    with pytest.raises(UserError) as refused:
        ckpt.resolve_checkpoint("latest", saved_copy)
    assert refused.value.rule == "runs.no_checkpoint_loads"
    assert str(refused.value).count("is damaged (empty)") == len(saved) > 1
    (saved[0] / ckpt.COMPLETE).unlink()
    assert ckpt.checkpoint_damage(saved[0])[0].id == "runs.checkpoint_incomplete"


class _Loading:
    """An accelerator as load_checkpoint asks it: one process, not FSDP; `load_state` fails with `error`."""

    distributed_type, process_index = DistributedType.NO, 0

    def __init__(self, error: Exception | None = None):
        self.error = error

    def load_state(self, path, load_kwargs):
        if self.error is not None:
            raise self.error


MISSING_KEY = 'Error(s) in loading state_dict for BertModel:\n\tMissing key(s) in state_dict: "pooler.dense.weight".'


@pytest.mark.parametrize(
    "rule, damage, error, fragment",
    [
        ("runs.no_model_weights", lambda p: (p / "model.safetensors").unlink(), None, "has no model.safetensors"),
        ("runs.rng_state_missing", lambda p: (p / "random_states_0.pkl").unlink(), None, "saved by fewer processes"),
        ("runs.rng_state_not_plain_data", lambda p: torch.save({"calls": shutil.rmtree}, p / "random_states_0.pkl"),
         None, "random_states_0.pkl does not load as plain data"),  # a function: what a pickle with code names
        ("runs.state_not_plain_data", None, EOFError("Ran out of input"), "does not load as plain data (Ran out"),
        ("runs.weights_do_not_fit", None, RuntimeError(MISSING_KEY), "(missing 1, e.g. pooler.dense.weight)"),
        ("runs.state_does_not_fit", None, KeyError("param_groups"), "does not fit this model or optimizer"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_does_not_load_is_one_line_of_its_rule(rule, damage, error, fragment, saved_copy):
    from finetune.errors import UserError

    path = ckpt.list_checkpoints(saved_copy)[-1]
    if damage is not None:
        damage(path)
    with pytest.raises(UserError) as refused:
        ckpt.load_checkpoint(_Loading(error), path)
    assert refused.value.rule == rule and fragment in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    "rule, change",
    [
        ("runs.resume_on_other_labels", {"labels": ["x", "y"]}),
        ("runs.other_sample_count", {"train_samples": 12}),
        ("runs.other_state_layout", {"fsdp": True}),
        ("runs.other_topology", {"num_processes": 2}),
    ],
)
def test_a_resume_that_is_not_the_run_that_saved_it_is_refused_by_its_rule(rule, change, saved_run):
    from finetune.config import config_from_dict
    from finetune.errors import UserError

    manifest = ckpt.read_manifest(ckpt.list_checkpoints(saved_run[1])[-1])
    given = {"num_processes": 1, "labels": manifest["label_names"], "train_samples": 37, "fsdp": False, **change}
    with pytest.raises(UserError) as refused:
        ckpt.check_resume_compatible(manifest, config_from_dict(manifest["config"], saved=True), **given)
    assert refused.value.rule == rule


def test_a_resume_on_its_labels_in_another_order_names_the_order_to_set(saved_run):
    """The same labels in another order (label_names left out: the sorted names) get the checkpoint's order
    as the value to set."""
    from finetune.config import config_from_dict
    from finetune.errors import UserError

    manifest = ckpt.read_manifest(ckpt.list_checkpoints(saved_run[1])[-1])
    saved = manifest["label_names"]
    with pytest.raises(UserError, match=rf"in this order, .*resume with label_names=\[{', '.join(saved)}\]$") as refused:
        ckpt.check_resume_compatible(manifest, config_from_dict(manifest["config"], saved=True), 1, saved[::-1], 37,
                                     fsdp=False)  # fmt: skip
    assert refused.value.rule == "runs.resume_on_other_labels"


def test_a_best_checkpoint_missing_from_a_resumed_run_is_said(tmp_path):
    from finetune import checks
    from finetune.checks import runs

    said = checks.Said()
    checks.gate(runs.BEST, {"step": 3, "metric": "accuracy", "value": 0.5}, tmp_path / "checkpoints", said=said)
    assert said.rules() == ["runs.best_checkpoint_missing"] and "step 3, validation accuracy 0.5" in said.lines[0][1]
