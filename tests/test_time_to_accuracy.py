"""The time-to-accuracy benchmark's smoke run: tiny BERT from config on a slice of the full-data recipe,
the app's loop and the textbook loop, each with its accuracy curve. No timing assertions."""

from __future__ import annotations

import json

import pytest

from benchmarks.time_to_accuracy import Curve, main, time_to


@pytest.mark.slow
def test_smoke_run_writes_both_curves_and_the_plot(tmp_path):
    main(["--smoke", "--precision", "no", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "time_to_accuracy.json").read_text())
    app, ref = report["app"], report["reference"]
    # the app: 64 samples / batch of 8 = 8 steps, evaluated every 2 (the last step's is the end's)
    assert [p["step"] for p in app["curve"]] == [2, 4, 6, 8], app["curve"]
    # the reference: batch 8 over 64 samples, one epoch = 8 steps, evaluated at step 4 and at the end
    assert [p["step"] for p in ref["curve"]] == [4, 8], ref["curve"]
    for run in (app, ref):
        seconds = [p["seconds"] for p in run["curve"]]
        assert seconds == sorted(seconds) and seconds[0] > 0
        assert all(0 <= p["accuracy"] <= 1 for p in run["curve"])
        # the clock leaves the evaluations out: it is below the run's wall time
        assert seconds[-1] < run["train_wall_s"]
        assert run["best"]["accuracy"] == max(p["accuracy"] for p in run["curve"])
        # the hooks of both loops saw their phases (the app's, from train() itself)
        assert {"data", "build", "train", "evaluate"} <= set(run["phases_s"]), run["phases_s"]
    assert {"start-up", "export"} <= set(app["phases_s"])
    assert (tmp_path / "time_to_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "time_to_accuracy.md").read_text()
    assert "| time to test accuracy 0.81 (s) |" in table and "command" not in report


def test_time_to_target_is_the_first_point_at_or_above_it():
    curve = [
        {"seconds": 1.0, "accuracy": 0.7},
        {"seconds": 2.0, "accuracy": 0.81},
        {"seconds": 3.0, "accuracy": 0.9},
    ]
    assert time_to(curve, 0.81) == 2.0
    assert time_to(curve, 0.95) is None


def test_the_curves_clock_leaves_out_evaluations_and_gives_each_its_step():
    """An evaluation belongs to the step after the last one marked done (the loop evaluates a step
    before it marks it); its time is left out of the clock."""
    import time

    curve = Curve()
    curve.mark("step", 1)
    with curve.phase("evaluate"):
        time.sleep(0.2)
    with curve.phase("data"):  # other phases count
        time.sleep(0.01)
    assert curve.now() < 0.1 and curve.excluded >= 0.2 and list(curve.at) == [2]
    point = {"seconds": curve.at[2], "step": 2, "accuracy": 0.5}
    assert curve.curve([{"step": 2, "accuracy": 0.5}]) == [point]
    assert curve.seconds["evaluate"] >= 0.2  # the app's own phase seconds kept (Hooks)


@pytest.mark.parametrize(
    "bad",
    [
        ["--app-eval-steps", "0"],
        ["--target", "1.5"],
        ["--target", "nan"],
        ["--reference-epochs", "-1"],
        ["--override", "test_file=null"],
        ["--override", "resume_from_checkpoint=latest"],
    ],
)
def test_bad_arguments_exit_2(bad, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main([*bad, "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and not (tmp_path / "time_to_accuracy.json").exists()


def test_override_of_the_output_dir_is_refused_and_a_finished_run_kept(tmp_path, capsys):
    """The benchmark trains in a temporary directory; an --override output_dir would aim its
    overwrite_output_dir=true at a user's run."""
    victim = tmp_path / "finished"
    victim.mkdir()
    (victim / "results.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--override", f"output_dir={victim}", "--out", str(tmp_path / "report")])
    assert exit_info.value.code == 2 and "--override output_dir" in capsys.readouterr().err
    assert (victim / "results.json").read_text() == "{}" and list(victim.iterdir()) == [victim / "results.json"]


def test_out_that_is_a_file_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    import benchmarks.time_to_accuracy as tta

    monkeypatch.setattr(tta, "run_app", lambda *a, **k: pytest.fail("trained before checking --out"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--out", str(tmp_path / "afile")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --out"), err
