"""finetune.search: what a trial is scored on, trials stopped from their periodic evaluations by the
pruner or by the budget, and the search under DDP. Tiny BERTs from config, a few steps each.

    python -m pytest -q tests/test_search.py
"""

from __future__ import annotations

import json
import time

import optuna
import pytest
import yaml
from conftest import (
    launch,
    multi_label_rows,
    recipe_text_args,
    tiny_text_args,
    user_error,
    write_jsonl,
)

from finetune.search import STUDY
from finetune.search import main as search


def settings(data, out, *extra: str) -> list[str]:
    return [*tiny_text_args(data, out), "per_device_train_batch_size=8", *extra]


def evaluated_steps(trial_dir) -> list[int]:
    records = [json.loads(line) for line in (trial_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "eval_accuracy" in r]


def test_a_trial_that_falls_behind_is_pruned_at_its_first_evaluation(small_text_data, tmp_path):
    """Two finished trials that scored 1.0 at every step: a third one below them at its first periodic
    evaluation is pruned there (MedianPruner, after two trials), and trains no further."""
    out = tmp_path / "search"
    out.mkdir()
    study = optuna.create_study(study_name="finetune", storage=f"sqlite:///{out / STUDY}", direction="maximize")
    for _ in range(2):
        study.add_trial(optuna.trial.create_trial(value=1.0, intermediate_values=dict.fromkeys(range(1, 9), 1.0)))
    record = search(["--budget", "300", "--trials", "1", "--space", "learning_rate", *settings(small_text_data, out, "max_steps=8")])
    assert record["trials"] == 3 and record["pruned"] == 1 and record["cut_at_budget"] == 0
    assert evaluated_steps(out / "trial-2") == [2]  # eval_steps 8 // 4: pruned at its first evaluation
    assert not (out / "trial-2" / "results.json").exists()  # no final evaluation, no export


@pytest.mark.slow
def test_a_trial_running_when_the_budget_is_spent_is_cut_at_its_next_evaluation(small_text_data, tmp_path, capsys):
    """The budget stops a long trial at its next evaluation, not at its end; the summary says how long
    the search took against the budget. (The study's first trial, a short one, gives it a best.)"""
    out = tmp_path / "search"
    search(["--budget", "300", "--trials", "1", "--space", "learning_rate", *settings(small_text_data, out, "max_steps=4")])
    # as a study from before its settings were recorded, which continues with other ones (max_steps=5000 below
    # is refused otherwise: a short first trial and a long second are what this test needs)
    optuna.load_study(study_name="finetune", storage=f"sqlite:///{out / STUDY}").set_user_attr("settings", None)
    budget = 8
    began = time.monotonic()
    record = search(["--budget", str(budget), "--space", "learning_rate", *settings(small_text_data, out, "max_steps=5000")])
    took = time.monotonic() - began
    assert record["trials"] == 2 and record["cut_at_budget"] == 1 and record["best_trial"] == 0
    steps = evaluated_steps(out / "trial-1")
    assert steps and steps[-1] < 5000, steps  # evaluated at each epoch's end (5 steps): cut soon after
    assert budget <= record["seconds"] < budget + 30 and took < budget + 40
    assert record["budget_s"] == budget and record["over_budget_s"] == pytest.approx(record["seconds"] - budget, abs=0.2)
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("trial 1: ") and line.endswith("-> cut at the budget") for line in lines), lines
    summary = [line for line in lines if line.startswith("best: trial 0")][-1]  # the second search's
    assert f"1 of them cut at the budget; wall time {record['seconds']} s of a {budget} s budget" in summary


def test_a_multi_label_trial_is_scored_at_its_tuned_threshold(tmp_path):
    """With tune_threshold, a trial's value is validation at the tuned threshold (the export's decisions)."""
    data = {"train": write_jsonl(tmp_path / "train.jsonl", multi_label_rows(48)),
            "validation": write_jsonl(tmp_path / "validation.jsonl", multi_label_rows(24, seed=1))}  # fmt: skip
    out = tmp_path / "search"
    record = search(["--budget", "300", "--trials", "1", "--space", "learning_rate",
                     *settings(data, out, "label_column=labels", "max_steps=3", "tune_threshold=global")])  # fmt: skip
    results = json.loads((out / "trial-0" / "results.json").read_text())
    tuned, fixed = results["validation_tuned"]["micro_f1"], results["validation"]["micro_f1"]
    assert tuned != fixed  # else this test could not tell them apart
    assert record["value"] == pytest.approx(tuned)
    assert results["learned"]["value"] == pytest.approx(tuned)  # the run's verdict reads the same


@pytest.mark.slow  # a launch of 2 processes: ~40 s on the loaded 2-core machine
def test_a_search_under_ddp_runs_each_trial_on_both_processes(small_text_data, tmp_path):
    """Two processes (CPU DDP over gloo): process 0 asks optuna, both train each trial in one group (the
    group the search forms before the first trial: on a CPU, a gloo group, as the run's own), the budget
    and the pruner decide the same on both."""
    out = tmp_path / "search"
    proc = launch(["--budget", "300", "--trials", "2", "--space", "learning_rate",
                   *settings(small_text_data, out, "max_steps=4")], num_processes=2, script="finetune/search.py")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    record = json.loads((out / "search.json").read_text())
    assert record["trials"] == 2 and (out / "model" / "config.json").is_file()
    assert "2 process(es)" in proc.stdout and proc.stdout.count("best: trial") == 1  # printed by process 0 only


@pytest.mark.slow
def test_the_search_runs_trials_continues_its_study_and_keeps_the_best(small_text_data, tmp_path):
    import transformers

    from finetune.search import main as search

    out = tmp_path / "search"
    args = ["--budget", "300", *recipe_text_args(small_text_data, out)[:-1], f"output_dir={out}", "max_steps=4"]
    transformers.utils.logging.enable_progress_bar()  # as in a fresh process: a trial's log_level turns it off
    record = search([*args, "--trials", "3", "--space", "learning_rate,warmup_ratio"])
    assert record["trials"] == 3 and (out / "model" / "config.json").is_file()
    assert not transformers.utils.logging.is_progress_bar_enabled()  # no export's "Writing model shards" bar
    best = yaml.safe_load((out / "best_recipe.yaml").read_text())
    assert best["learning_rate"] == pytest.approx(record["params"]["learning_rate"])
    assert sum((d / "model").is_dir() for d in out.glob("trial-*")) == 1  # only the best keeps its weights
    again = search([*args, "--trials", "1", "--space", "learning_rate,warmup_ratio"])
    assert again["trials"] == 4  # the study continued


def test_a_space_of_which_nothing_applies_is_one_line(small_text_data, tmp_path, capsys):
    """tune_threshold on a single-label run: every trial would be the same run until the budget is spent."""
    line = user_error(capsys, search, ["--budget", "60", "--space", "tune_threshold",
                                       *settings(small_text_data, tmp_path / "s", "max_steps=2")],
                      rule="tools.space_applies_to_nothing")  # fmt: skip
    assert "--space tune_threshold: nothing in it applies to this run" in line
    assert not (tmp_path / "s").exists()
    # beside a setting that applies, named but dropped without a word; now refused
    line = user_error(capsys, search, ["--budget", "60", "--space", "learning_rate,tune_threshold",
                                       *settings(small_text_data, tmp_path / "s", "max_steps=2")],
                      rule="tools.space_does_not_apply")  # fmt: skip
    assert "tune_threshold is for multi-label runs, which this run is not; leave tune_threshold out of --space" in line
    assert not (tmp_path / "s").exists()


def test_trial_0_is_the_recipes_own_settings_run_as_the_recipe_runs(small_text_data, tmp_path):
    """A new study's first trial trains with the recipe's values of every searched setting (a batch size
    outside the searched four included) and the recipe's evaluations only (each epoch's end), so a
    budget that holds one run of the recipe ends with at least the recipe's model."""
    out = tmp_path / "search"
    own = ["learning_rate=3e-4", "per_device_train_batch_size=12", "warmup_ratio=0.1", "num_train_epochs=2"]
    record = search(["--budget", "300", "--trials", "1", "--space",
                     "learning_rate,per_device_train_batch_size,warmup_ratio,num_train_epochs",
                     *tiny_text_args(small_text_data, out), *own])  # fmt: skip
    assert record["params"] == {"learning_rate": 3e-4, "per_device_train_batch_size": 12, "warmup_ratio": 0.1,
                                "num_train_epochs": 2}  # fmt: skip
    # one trial ran: the count leaves out trial 1, queued from trial 0's curve for a continued search
    assert record["trials"] == 1 and "The best of 1 trials" in (out / "best_recipe.yaml").read_text()
    trained = yaml.safe_load((out / "trial-0" / "config.yaml").read_text())
    assert (trained["learning_rate"], trained["per_device_train_batch_size"], trained["num_train_epochs"]) == (3e-4, 12, 2)
    assert trained["eval_steps"] is None
    assert evaluated_steps(out / "trial-0") == [4, 8]  # 37 rows in batches of 12: 4 steps an epoch
    # the same model as the recipe's own command: a search given the recipe's time ties it, never worse
    from finetune.run import main as run

    run([*tiny_text_args(small_text_data, tmp_path / "plain"), *own])
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())["validation"]
    assert json.loads((out / "trial-0" / "results.json").read_text())["validation"] == plain


@pytest.mark.parametrize(
    ("curve", "greater", "own", "expected"),
    [
        ([0.6, 0.7, 0.8], True, {"per_device_train_batch_size": 32}, {"per_device_train_batch_size": 16}),  # improving
        ([0.6, 0.8, 0.7], True, {"learning_rate": 3e-4}, {"learning_rate": 1e-4}),  # best before its end
        ([0.30, 0.25, 0.20], False, {"per_device_train_batch_size": 16}, {"per_device_train_batch_size": 8}),  # mse falling
        ([0.30, 0.20, 0.25], False, {"learning_rate": 3e-4}, {"learning_rate": 1e-4}),
        ([0.6, 0.7], True, {"per_device_train_batch_size": 8}, None),  # no smaller batch in the space
        ([0.6, 0.7], True, {"per_device_train_batch_size": 24}, None),  # 12: not a batch the space holds
        ([0.6, 0.7], True, {"learning_rate": 1e-4}, None),  # the batch is not searched
        ([0.7, 0.6], True, {"learning_rate": 2e-5}, None),  # a third would leave the range
        ([0.7], True, {"per_device_train_batch_size": 32}, None),  # one evaluation tells nothing
        # a flat end is neither improving nor best before its end (a tester's 0.35, 0.35, 0.35 was "improving")
        ([0.35, 0.35, 0.35], True, {"per_device_train_batch_size": 32, "learning_rate": 3e-4}, None),
        ([0.6, 0.7, 0.7], True, {"per_device_train_batch_size": 32, "learning_rate": 3e-4}, None),
        ([0.3, 0.2, 0.2], False, {"per_device_train_batch_size": 32, "learning_rate": 3e-4}, None),
    ],
)
def test_trial_1s_change_follows_trial_0s_curve(curve, greater, own, expected):
    from finetune.search import the_next_step

    step = the_next_step(own, curve, greater)
    assert (step if step is None else pytest.approx(step[0])) == expected


def test_trial_1_is_the_recipes_settings_with_the_change_trial_0s_curve_points_to(small_text_data, tmp_path, capsys):
    out = tmp_path / "search"
    args = ["--budget", "300", "--trials", "1", "--space", "learning_rate,per_device_train_batch_size,num_train_epochs",
            *tiny_text_args(small_text_data, out), "per_device_train_batch_size=16", "learning_rate=3e-4",
            "num_train_epochs=2"]  # fmt: skip
    first = search(args)  # trial 0 alone: trial 1 is queued for the study's next command, and not counted
    records = [json.loads(line) for line in (out / "trial-0" / "metrics.jsonl").read_text().splitlines()]
    curve = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
    assert len(curve) == 2 and first["trials"] == 1
    queued = optuna.load_study(study_name="finetune", storage=f"sqlite:///{out / STUDY}").trials
    assert [t.state.name for t in queued] == ["COMPLETE"] + ["WAITING"] * (curve[0] != curve[1])
    assert search(args)["trials"] == 2  # the continued study runs the queued one
    if curve[0] == curve[1]:  # a flat end tells nothing: optuna draws trial 1
        assert "trial 1 (trial 0" not in capsys.readouterr().out
        return
    improving = curve[-1] > curve[0]
    study = optuna.load_study(study_name="finetune", storage=f"sqlite:///{out / STUDY}")
    changed = {"per_device_train_batch_size": 8} if improving else {"learning_rate": pytest.approx(1e-4)}
    assert study.trials[1].params == {"learning_rate": 3e-4, "per_device_train_batch_size": 16, "num_train_epochs": 2,
                                      **changed}  # fmt: skip
    said = "was still improving at its last evaluation" if improving else "was best before its end"
    assert f"trial 1 (trial 0 {said}: its settings at" in capsys.readouterr().out


def test_the_recipes_own_values_are_those_the_space_can_hold():
    from finetune.config import TrainConfig as Config
    from finetune.search import SPACE, the_recipes_own

    def TrainConfig(**settings):  # noqa: N802 - a recipe of these settings
        return Config(model_name_or_path="data/bert_minilm_l6_uncased", train_file="data/x.csv", **settings)

    recipe = TrainConfig(learning_rate=2e-4, num_train_epochs=1.35, per_device_train_batch_size=64,
                         warmup_ratio=0.06, freeze_layers=2, problem_type="multi_label_classification")  # fmt: skip
    own = the_recipes_own(recipe, list(SPACE), layers=6)
    # 1.35 epochs cannot be drawn from 1..5: drawn instead; the threshold is tuned (costs no training)
    assert own == {"learning_rate": 2e-4, "per_device_train_batch_size": 64, "warmup_ratio": 0.06,
                   "freeze_layers": 2, "tune_threshold": "global"}  # fmt: skip
    # a value outside the ranges the later trials draw from is kept as written (issue 49: 20 epochs drawn as 2)
    assert the_recipes_own(TrainConfig(learning_rate=5e-3), ["learning_rate"], layers=6) == {"learning_rate": 5e-3}
    assert the_recipes_own(TrainConfig(num_train_epochs=20), ["num_train_epochs"], layers=6) == {"num_train_epochs": 20}
    assert the_recipes_own(TrainConfig(freeze_layers=3), ["freeze_layers", "tune_threshold"], layers=4) == {}


def test_the_space_fits_the_recipe_it_searches():
    """Epochs around the recipe's own (a 20-epoch recipe: 10 to 40, not 1 to 5), a learning rate range that
    holds the recipe's; queued, trial 0's values are used as they are."""
    import optuna

    from finetune.config import TrainConfig
    from finetune.search import epoch_range, rate_range, suggest

    assert epoch_range(TrainConfig(num_train_epochs=3)) == (1, 5)
    assert epoch_range(TrainConfig(num_train_epochs=20)) == (10, 40)
    assert rate_range(TrainConfig(learning_rate=1e-2)) == (1e-5, 1e-2)
    cfg = TrainConfig(num_train_epochs=20, learning_rate=1e-2)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"num_train_epochs": 20, "learning_rate": 1e-2})
    assert suggest(study.ask(), cfg, ["num_train_epochs", "learning_rate"], layers=6, max_epochs=8) == {
        "num_train_epochs": 20, "learning_rate": 1e-2}
    drawn = [suggest(study.ask(), cfg, ["num_train_epochs"], 6, 40)["num_train_epochs"] for _ in range(20)]
    assert all(10 <= e <= 40 for e in drawn)
    assert all(e <= 12 for e in (suggest(study.ask(), cfg, ["num_train_epochs"], 6, 12)["num_train_epochs"]
                                 for _ in range(10)))  # fmt: skip


def test_the_end_line_compares_the_best_trial_with_the_recipe():
    import optuna

    from finetune.search import RECIPE, against_the_recipe

    study = optuna.create_study(direction="maximize")
    for value, attrs in ((0.78, {RECIPE: True}), (0.80, {})):
        trial = study.ask()
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, value)
    assert against_the_recipe(study, study.best_trial) == (
        "against the recipe as written (trial 0, validation 0.7800): the best trial +0.0200")
    assert "is the best trial" in against_the_recipe(study, study.trials[0])


def test_a_value_the_space_cannot_hold_is_said_not_dropped(capsys):
    """num_train_epochs=1.35 given with --space num_train_epochs: trial 0 draws it instead, and says so."""
    from finetune.checks import Said
    from finetune.config import TrainConfig
    from finetune.search import say_what_trial_0_draws, the_recipes_own

    cfg = TrainConfig(model_name_or_path="data/bert_minilm_l6_uncased", train_file="data/x.csv", num_train_epochs=1.35)
    said = Said()
    say_what_trial_0_draws(cfg, ["num_train_epochs"], the_recipes_own(cfg, ["num_train_epochs"], layers=6), said)
    assert "warning: num_train_epochs=1.35: outside what the search draws from" in capsys.readouterr().err
    assert said.rules() == ["tools.outside_the_space"]
    say_what_trial_0_draws(cfg, ["per_device_train_batch_size"], the_recipes_own(cfg, ["per_device_train_batch_size"], 6),
                           Said())  # fmt: skip
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("left", "durations", "epoch_seconds", "by_epochs", "fits"),
    [
        (100.0, [], [], True, 5),  # nothing measured yet
        (100.0, [90.0], [30.0], True, 3),  # three 30 s epochs fit in 100 s
        (25.0, [90.0], [30.0], True, 0),  # not one
        (400.0, [90.0], [30.0], True, 5),  # never more than the space's 5
        (100.0, [90.0, 120.0], [], False, 0),  # epochs not searched: the median trial (120 s) does not fit
        (130.0, [90.0, 120.0], [], False, 5),
        (0.0, [], [], True, 0),
    ],
)
def test_a_trial_gets_no_more_epochs_than_the_time_left_holds(left, durations, epoch_seconds, by_epochs, fits):
    from finetune.search import epochs_that_fit

    assert epochs_that_fit(left, durations, epoch_seconds, by_epochs) == fits


def test_epochs_planned_slower_fit_fewer():
    """A continuation at half the batch plans its epochs as slower ones: three 30 s epochs fit in 100 s,
    two at 1.15 times 30 s."""
    from finetune.search import epochs_that_fit

    assert epochs_that_fit(100.0, [90.0], [30.0], True, 1.15) == 2 < epochs_that_fit(100.0, [90.0], [30.0], True)


@pytest.mark.parametrize("holds", ["a finished run", "the user's files"])
def test_a_search_into_a_folder_that_holds_no_search_is_refused(holds, small_text_data, tmp_path, capsys):
    """A search writes model/ and trial-N/ into its output_dir: over a finished run's export it would
    replace that run's weights beside the run's own results.json."""
    out = tmp_path / "folder"
    (out / "model").mkdir(parents=True)
    (out / "model" / "model.safetensors").write_bytes(b"weights")
    if holds == "a finished run":
        (out / "results.json").write_text('{"step": 2}')
        (out / "config.yaml").write_text("task: text-classification\nseed: 42\n")
    line = user_error(capsys, search, ["--budget", "60", *settings(small_text_data, out, "max_steps=2")],
                      "and no search (study.db); a search would write its trials and model/ there", untouched=out,
                      rule="tools.search_folder_not_a_search")  # fmt: skip
    assert ("holds a training run" in line) == (holds == "a finished run")


def test_a_search_into_a_file_is_refused(small_text_data, tmp_path, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("mine\n")
    user_error(capsys, search, ["--budget", "60", *settings(small_text_data, out, "max_steps=2")],
               f"output_dir {out} is a file, not a folder", untouched=tmp_path, rule="tools.search_folder_is_a_file")


@pytest.mark.slow  # ~12 s: two searches
def test_epochs_are_not_searched_when_max_steps_decides_the_length(small_text_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # the rule's id before the line
    out = tmp_path / "search"
    record = search(["--budget", "300", "--trials", "1", "--space", "learning_rate,num_train_epochs",
                     *settings(small_text_data, out, "max_steps=2")])  # fmt: skip
    # trial 0, the recipe's: its epochs (the default 3) would otherwise have been drawn, max_steps set
    assert "num_train_epochs" not in record["params"] and "learning_rate" in record["params"]
    # asked for by name, the epochs dropped from the space are said (the default space: no word)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "max_steps=2 decides" in ln]
    rule = "tools.epochs_not_searched"
    assert said == [f"warning: [{rule}] max_steps=2 decides each trial's length, so num_train_epochs is not "
                    "searched; to search it, set max_steps=null"]  # fmt: skip
    search(["--budget", "300", "--trials", "1", *settings(small_text_data, tmp_path / "s2", "max_steps=2")])
    assert "num_train_epochs is not searched" in capsys.readouterr().err  # the default space's too, said once


@pytest.mark.slow  # ~10 s: a search continued
def test_a_study_is_continued_only_with_the_settings_it_was_made_with(small_text_data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "search"
    search(["--budget", "300", "--trials", "1", "--space", "learning_rate", *settings(small_text_data, out, "max_steps=2")])
    other = {**small_text_data, "train": small_text_data["validation"]}
    user_error(capsys, search, ["--budget", "300", "--trials", "1", "--space", "learning_rate",
                                *settings(other, out, "max_steps=2")],
               "holds a search made with other settings (train_file was", untouched=out,
               rule="tools.study_other_settings")  # fmt: skip
    user_error(capsys, search, ["--budget", "300", "--trials", "1", "--space", "learning_rate,warmup_ratio",
                                *settings(small_text_data, out, "max_steps=2")],
               "holds a search over --space learning_rate, not learning_rate,warmup_ratio; continue it with --space "
               "learning_rate", untouched=out, rule="tools.study_other_space")  # fmt: skip
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # the rule's id before the line
    again = search(["--budget", "300", "--trials", "1", "--space", "learning_rate",  # where it reports: no matter
                    *settings(small_text_data, out, "max_steps=2", "overwrite_output_dir=true", "logging_steps=7")])
    assert again["trials"] == 2
    # overwrite_output_dir does not start it over (its study is never deleted), which is said
    assert ("warning: [tools.overwrite_continues_study] overwrite_output_dir=true does not start a search over: this "
            "one continues the study") in capsys.readouterr().err  # fmt: skip


@pytest.mark.parametrize("damage", ["cut to a third", "an SQLite header and then garbage", "a text file"])
def test_a_damaged_study_is_one_line_and_left_as_it_is(damage, small_text_data, tmp_path, capsys):
    """A study.db that SQLite cannot read (cut short, overwritten, never SQLite) would end the continued
    search in a traceback (sqlalchemy's DatabaseError); it is refused, and not written over or removed."""
    out = tmp_path / "search"
    out.mkdir()
    db = out / STUDY
    if damage == "cut to a third":
        study = optuna.create_study(study_name="finetune", storage=f"sqlite:///{db}", direction="maximize")
        study.add_trial(optuna.trial.create_trial(value=1.0))
        del study
        whole = db.read_bytes()
        db.write_bytes(whole[: len(whole) // 3])
    elif damage == "an SQLite header and then garbage":
        db.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    else:
        db.write_text("trial 0: learning_rate 5e-05 -> 0.8\n" * 20)
    (out / "trial-0").mkdir()
    (out / "trial-0" / "metrics.jsonl").write_text('{"step": 2, "eval_accuracy": 0.8}\n')
    line = user_error(capsys, search, ["--budget", "60", "--trials", "1", "--space", "learning_rate",
                                       *settings(small_text_data, out, "max_steps=2")],
                      f"{db} is damaged, not a readable optuna study", "restore it", "give a new output_dir",
                      untouched=out, rule="tools.study_damaged")  # fmt: skip
    assert ("malformed" in line) == (damage == "cut to a third")


def test_trials_counts_the_trials_of_this_command(capsys):
    """`--trials N` on a continued search runs up to N more (as the continued searches above show); the
    help says so."""
    with pytest.raises(SystemExit) as exit_info:
        search(["--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--trials N at most N trials in this command: a continued search adds up to N more" in shown
    assert "(`--trials N` counts this command's trials: a continued study gets up to N more)" in shown


def test_space_names_are_read_without_the_spaces_around_them(capsys):
    """`--space 'learning_rate, warmup_ratio,'`: the names as written, a trailing comma dropped; a name not
    in the space is still refused (and named without its spaces)."""
    from finetune.search import parse_args

    args = parse_args(["--budget", "60", "--space", " learning_rate, warmup_ratio ,"])
    assert args.space == ["learning_rate", "warmup_ratio"]
    line = user_error(capsys, search, ["--budget", "60", "--space", "learning_rate, warmup_ration"],
                      "--space: warmup_ration cannot be searched; choose among", rule="tools.unknown_space")  # fmt: skip
    assert "choose among learning_rate, num_train_epochs" in line
    for budget in ("inf", "nan", "0", "-5"):  # a search without an end, or none at all
        user_error(capsys, search, ["--budget", budget], "--budget must be a positive, finite number of seconds",
                   rule="tools.budget")  # fmt: skip
    user_error(capsys, search, ["--budget", "60", "--trials", "0"], "--trials must be at least 1, got 0", rule="tools.trials")
    # a duration as people write it: 30m, 2h; anything else names the forms
    from finetune.search import duration

    assert [duration(t) for t in ("1800", "90s", "30m", "1.5h", "2 H", "1e3", "2.5E2s")] == [1800, 90, 1800, 5400,
                                                                                          7200, 1000, 250]  # fmt: skip
    user_error(capsys, search, ["--budget", "30 minutes"], "'30 minutes' is not a duration: give seconds (1800) or 30m, 2h")


@pytest.mark.slow  # ~11 s: two searches
def test_a_search_stopped_by_a_signal_says_how_to_continue_and_runs_that_trial_again(small_text_data, tmp_path, capsys,
                                                                                     monkeypatch):  # fmt: skip
    """A signal during trial 0: the line says to run the search again (not a trial's resume_from_checkpoint),
    and the continued search runs trial 0's settings again, as the recipe's own, to the end."""
    import finetune.run
    from finetune.errors import TrainingStopped

    def stopped(cfg, hooks=None, said=None):
        raise TrainingStopped("received SIGTERM during training; saved checkpoint x; continue with "
                              "resume_from_checkpoint=latest output_dir=x", 143)  # fmt: skip

    out = tmp_path / "search"
    argv = ["--budget", "300", "--trials", "1", "--space", "learning_rate", *settings(small_text_data, out, "max_steps=2")]
    with monkeypatch.context() as m:
        m.setattr(finetune.run, "train", stopped)
        with pytest.raises(SystemExit) as stop:
            search(argv)
    assert stop.value.code == 143
    err = capsys.readouterr().err
    assert "(trial 0); the study is kept" in err and "run the same search command again" in err
    assert "resume_from_checkpoint" not in err
    search(argv)
    assert "trial 1 (trial 0's settings again):" in capsys.readouterr().out
    study = optuna.load_study(study_name="finetune", storage=f"sqlite:///{out / STUDY}")
    again = [t for t in study.trials if t.user_attrs.get("run_again_of") == 0]
    assert len(again) == 1 and again[0].user_attrs.get("recipes_own") is True
    assert again[0].state == optuna.trial.TrialState.COMPLETE


def test_resume_from_checkpoint_given_to_a_search_is_refused_before_anything_is_written(tmp_path, capsys):
    from conftest import user_error

    from finetune.search import main as search_main

    out = tmp_path / "search"
    user_error(capsys, search_main, ["--budget", "60", "resume_from_checkpoint=latest", f"output_dir={out}"],
               "resume_from_checkpoint=latest is not a setting of a search: to continue one, run the same command",
               rule="tools.resume_in_search")  # fmt: skip
    assert not out.exists()


def test_the_trial_count_leaves_out_the_one_queued_for_a_continued_search(small_text_data, tmp_path, capsys):
    """Trial 1, queued from trial 0's curve when the command's trials are spent, is the next command's:
    `--trials 1` said "2 trials" with one run (a tester's --budget 1h --trials 1)."""
    import time

    from finetune.checks import Said
    from finetune.errors import UserError
    from finetune.search import _finish

    out = tmp_path / "search"
    (out / "trial-0").mkdir(parents=True)
    (out / "trial-0" / "results.json").write_text("{}")
    study = optuna.create_study(direction="maximize")
    with pytest.raises(UserError, match="no trial finished within the budget \\(0 started") as e:
        _finish(out, study, None, [f"train_file={small_text_data['train']}"], time.monotonic(), 60.0, Said())
    assert e.value.rule == "tools.no_trial_finished"
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.8))
    study.enqueue_trial({"learning_rate": 1e-4})
    record = _finish(out, study, None, [f"train_file={small_text_data['train']}"], time.monotonic(), 60.0, Said())
    assert record["trials"] == 1 and "(1 trials, 0 pruned" in capsys.readouterr().out
    assert "The best of 1 trials" in (out / "best_recipe.yaml").read_text()


def test_a_best_recipe_edited_since_the_search_wrote_it_is_not_written_over(small_text_data, tmp_path, capsys):
    """best_recipe.yaml is written again at the end of a continued search: one the user edited (notes, other
    settings) was lost without a word. Its sha256 is in search.json; another one is refused before any trial."""
    out = tmp_path / "search"
    args = ["--budget", "300", "--trials", "1", "--space", "learning_rate", *settings(small_text_data, out, "max_steps=2")]
    search(args)
    recipe = out / "best_recipe.yaml"
    recipe.write_text(recipe.read_text() + "# my notes\n")
    user_error(capsys, search, args, f"{recipe} is not the one this search wrote (edited since?)",
               "copy it out of the search's folder", untouched=out, rule="tools.best_recipe_edited")  # fmt: skip
    recipe.rename(out.parent / "mine.yaml")
    assert search(args)["trials"] == 2 and recipe.is_file()  # moved away: the search goes on
    # The training file edited in place (same name): the study's trials trained on other bytes.
    train = small_text_data["train"]
    kept = train.read_text()
    train.write_text(kept + "an added review,1\n")
    user_error(capsys, search, args, "holds a search whose trials trained on other bytes of", "put the file back",
               untouched=out, rule="tools.study_other_training_data")  # fmt: skip


def test_the_last_of_the_budget_continues_the_best_trial_if_it_was_still_improving(tmp_path):
    """Less than two more median trials left, but an epoch or more: the best trial, if its curve was still
    rising at its end, trains on from its export; otherwise (or with time for two trials, or its export
    gone) a new trial is drawn."""
    from finetune.search import IMPROVING, SETTINGS, _continuation

    def study_of(improving: bool):
        study = optuna.create_study(direction="maximize")
        own = {"learning_rate": 1e-4, "num_train_epochs": 3}
        study.add_trial(optuna.trial.create_trial(value=0.8, user_attrs={IMPROVING: improving, SETTINGS: own}))
        study.add_trial(optuna.trial.create_trial(value=0.7, user_attrs={IMPROVING: True, SETTINGS: own}))
        return study

    (tmp_path / "trial-0" / "model").mkdir(parents=True)
    assert _continuation(study_of(True), tmp_path, 100.0, [90.0], 2) == (0, {"learning_rate": 1e-4}, 3, 1.0)
    assert _continuation(study_of(False), tmp_path, 100.0, [90.0], 2) is None  # it had stopped improving
    assert _continuation(study_of(True), tmp_path, 190.0, [90.0], 2) is None  # two more trials fit: draw
    assert _continuation(study_of(True), tmp_path, 100.0, [90.0], 0) is None  # not one epoch
    # continued once already (a trial that EXTENDS it ended, below it): the same again is not run (a continued
    # study ran the identical continuation three times, each to the same value)
    from finetune.search import EXTENDS

    for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
        study = study_of(True)
        study.add_trial(optuna.trial.create_trial(state=state, value=0.75 if state.name == "COMPLETE" else None,
                                                  user_attrs={EXTENDS: 0}))  # fmt: skip
        again = _continuation(study, tmp_path, 100.0, [90.0], 2)
        assert (again is None) == (state != optuna.trial.TrialState.FAIL), state  # a signal's: decided again
    (tmp_path / "trial-0" / "model").rmdir()
    assert _continuation(study_of(True), tmp_path, 100.0, [90.0], 2) is None  # no export to train on from


@pytest.mark.parametrize(
    ("batch", "halved", "continued_at", "cost"),
    [
        (32, 2, 16, "half"),  # twice the updates an epoch, planned as slower epochs
        (32, 0, 32, 1.0),  # not one epoch fits at half the batch: the same batch
        (8, 2, 8, 1.0),  # half of 8 is not a batch the space holds
        (None, 2, None, 1.0),  # the batch is not searched: left as the recipe has it
    ],
)
def test_a_continuation_trains_at_half_the_batch_where_an_epoch_of_it_fits(tmp_path, batch, halved, continued_at,
                                                                            cost):
    """The best trial was still improving at its end: it needs more updates, as trial 0 does before trial 1
    (`the_next_step`), so its continuation runs at half its batch; its epochs are planned at
    HALF_BATCH_EPOCH times the measured ones."""
    from finetune.search import HALF_BATCH_EPOCH, IMPROVING, SETTINGS, _continuation

    own = {"learning_rate": 1e-4, "num_train_epochs": 3}
    if batch is not None:
        own["per_device_train_batch_size"] = batch
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=0.8, user_attrs={IMPROVING: True, SETTINGS: own}))
    (tmp_path / "trial-0" / "model").mkdir(parents=True)
    number, settings, epochs, slower = _continuation(study, tmp_path, 100.0, [90.0], 2, halved)
    assert (number, epochs) == (0, 3) and settings.get("per_device_train_batch_size") == continued_at
    assert slower == (HALF_BATCH_EPOCH if cost == "half" else cost) and HALF_BATCH_EPOCH > 1


def test_a_continuation_trains_on_from_the_trials_export_and_its_recipe_counts_every_epoch(
    small_text_data, tmp_path, monkeypatch, capsys
):
    """The continuation (forced here after trial 0) trains from trial 0's export for the epochs that fit;
    if it is the best, best_recipe.yaml holds trial 0's settings with the epochs of both."""
    import finetune.search as search_module

    real = search_module._continuation
    monkeypatch.setattr(search_module, "_continuation", lambda study, out, left, durations, fits, halved: real(
        study, out, 0.0 if len(study.trials) == 1 else left, [1.0], *((1, 1) if len(study.trials) == 1 else (0, 0))))  # fmt: skip
    out = tmp_path / "search"
    record = search(["--budget", "300", "--trials", "2", "--space",
                     "learning_rate,num_train_epochs,per_device_train_batch_size",
                     *tiny_text_args(small_text_data, out), "per_device_train_batch_size=16", "learning_rate=3e-4",
                     "num_train_epochs=2", "metric_for_best_model=loss"])  # fmt: skip  -- a loss that falls: improving
    study = optuna.load_study(study_name="finetune", storage=f"sqlite:///{out / STUDY}")
    first = study.trials[0]
    if not first.user_attrs["improving_at_its_end"]:
        pytest.skip("trial 0 of this tiny run was not improving at its end: nothing to continue")
    trained = yaml.safe_load((out / "trial-1" / "config.yaml").read_text())
    assert trained["model_name_or_path"] == str(out / "trial-0" / "model") and trained["model_config"] is None
    more = int(trained["num_train_epochs"])  # as many as the time left holds (the space's 5 here)
    assert more == 5 and study.trials[1].user_attrs["continues"] == 0
    assert trained["per_device_train_batch_size"] == 8  # half trial 0's: it needs more updates
    assert f"trial 1 (trial 0 was still improving at its end: {more} more epoch(s) from its export at half its " \
        "batch, 8)" in capsys.readouterr().out
    if record["best_trial"] == 1:
        best = yaml.safe_load((out / "best_recipe.yaml").read_text())
        assert best["num_train_epochs"] == 2 + more and best["learning_rate"] == 3e-4 and record["continues"] == 0
        assert best["per_device_train_batch_size"] == 8
        assert "at batch 8 (trial 0's was 16)" in (out / "best_recipe.yaml").read_text()


def test_a_warning_every_trial_meets_is_said_once(small_text_data, tmp_path, capsys, monkeypatch):
    """freeze_embeddings=true on a model built at random: each trial warns the same; the search says it once."""
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # the rule's id before each line
    search(["--budget", "300", "--trials", "2", "--space", "learning_rate",
            *settings(small_text_data, tmp_path / "s", "max_steps=2", "freeze_embeddings=true")])  # fmt: skip
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    said = [ln for ln in err if "freeze_embeddings=true freezes" in ln]
    # each trial's verdict stays in its results.json (its own line shows its value): 37 verdict warnings in a
    # one-minute search buried the rest
    assert "did not learn" not in captured.out and "\nlearned:" not in captured.out
    assert all(json.loads((tmp_path / "s" / f"trial-{n}" / "results.json").read_text())["learned"]["said"]
               for n in (0, 1))  # fmt: skip
    assert len(said) == 1 and "[launch.frozen_random_weights]" in said[0], said
    # two steps of a model built at random: no trial learned, and the search's last word says so of its best
    (best,) = [ln for ln in err if "the best trial did not learn beyond the trivial baseline (validation " in ln]
    rule = "tools.best_trial_did_not_learn"
    assert best.startswith(f"warning: [{rule}] "), best
    assert best.endswith("a longer --budget, other settings (a learning_rate the space does not hold, more steps: "
                         "max_steps) or more data may; see docs/your-own-data.md"), best  # max_steps=2 set the length


def test_warnings_are_said_once_by_a_run_and_not_at_all_when_quiet(capsys):
    """A run's Said (a search's trials share one) says a line once and records it with its rule; a quiet one
    (data read again to compare with, whose own run said its warnings) says none; another run says it again."""
    from finetune.checks import Said

    said = Said()
    said.warn("a", "x.a"), said.warn("a", "x.a"), said.warn("b", "x.b")
    Said(quiet=True).warn("c")
    Said().warn("a")
    assert capsys.readouterr().err.splitlines() == ["warning: a", "warning: b", "warning: a"]
    assert said.record() == [{"rule": "x.a", "line": "a"}, {"rule": "x.b", "line": "b"}]

