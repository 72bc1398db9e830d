"""finetune/rundir.py: the run directory. What a run does to its output_dir (a file, a folder of the
user's, a finished run, an overwrite that finishes or fails), what kind of path a user gave, and: an old
run directory still resumes and evaluates (issue 26: "old run directories still resume and evaluate").

    python -m pytest -q tests/test_rundir.py

(Refusals that must leave an earlier run's bytes as they were: tests/test_bad_input.py.) For the old
forms, a tiny run written by today's code is rewritten into the forms an older version wrote, then resumed
with `resume_from_checkpoint=latest output_dir=<run>` alone (its own old config.yaml is the recipe)
and evaluated with finetune/evaluate_checkpoint.py on its export and on a checkpoint. The old forms
are tests/fixtures/old_rundir/<commit>.json, read from runs that those commits' own code wrote
(`git archive <commit>`, the same tiny run, see "how" there): what each metadata file lacked then
(config.yaml, each checkpoint's manifest.json, results.json, metrics.jsonl, the export's
config.json), and the evaluations the old evaluate_checkpoint.py left inside the export and the
checkpoint (`model/eval/`, `checkpoints/step-N/eval/`). Text only: the weights are today's.
ba02c02 runs by default; the older 632949d with `-m slow`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import (
    EARLIER_RUN,
    EVALUATED_RUN,
    TWO_EPOCHS,
    file_hashes,
    recipe_text_args,
    tiny_text_args,
    user_error,
)
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune import checks
from finetune.errors import UserError
from finetune.evaluate_checkpoint import main as evaluate
from finetune.layout import RunDir
from finetune.run import main
from finetune.run import main as train

FIXTURES = Path(__file__).parent / "fixtures" / "old_rundir"
# ba02c02 (the last before the restructure) in every run; older ones, which lack a few more keys, with -m slow
NEWEST_OLD = "ba02c02"
VERSIONS = [
    pytest.param(p.stem, marks=() if p.stem == NEWEST_OLD else pytest.mark.slow)
    for p in sorted(FIXTURES.glob("*.json"))
]
CHECKPOINT = "checkpoints/step-00000002"  # of 2 and 4, in a 5-step run


@pytest.fixture(scope="module")
def today(finished_run, tmp_path_factory) -> dict:
    """The factory's run shared with tests/test_evaluate_checkpoint.py (read only): 37 train / 13
    validation / 11 test rows, batch 8, 5 optimizer steps, checkpoints at 2 and 4; and today's evaluation
    of step 2, kept outside the run."""
    out = finished_run(*EVALUATED_RUN, data="named+test")
    checkpoint_eval = evaluate([str(out / CHECKPOINT), "--output", str(tmp_path_factory.mktemp("step-2-eval"))])
    return {"dir": out, "checkpoint_eval": json.loads(Path(checkpoint_eval["metrics_file"]).read_text())}


@pytest.fixture(scope="module")
def today_multi_label(finished_run) -> dict:
    """A multi-label run: its export's config.json holds the thresholds tuned on validation."""
    out = finished_run("label_column=labels", "tune_threshold=per_label", "save_steps=2", "num_train_epochs=1",
                       "per_device_train_batch_size=8", data="multi_label+test")  # fmt: skip
    return {"dir": out}


def _keep(record: dict, keys: list[str], where: str) -> dict:
    """`record` with only `keys`, in their order: what an older version wrote. Each must still be written
    today: a renamed or removed key fails here, with the fixture to update."""
    missing = [key for key in keys if key not in record]
    assert not missing, f"{where} no longer holds {missing}: update tests/fixtures/old_rundir"
    return {key: record[key] for key in keys}


def make_old(run: Path, version: str, dest: Path) -> Path:
    """A copy of `run` in the forms `version` wrote (tests/fixtures/old_rundir/<version>.json)."""
    old = json.loads((FIXTURES / f"{version}.json").read_text())
    shutil.copytree(run, dest)
    for path in [dest / "config.yaml", *dest.glob("checkpoints/*/manifest.json"), dest / "results.json"]:
        path.write_text(
            path.read_text().replace(str(run), str(dest))
        )  # the run's own paths, as written there
    settings = old["config.yaml"]["keys"]

    config = _keep(yaml.safe_load((dest / "config.yaml").read_text()), settings, "config.yaml")
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    for path in dest.glob("checkpoints/*/manifest.json"):
        manifest = _keep(json.loads(path.read_text()), old["manifest.json"]["keys"], str(path))
        manifest["config"] = _keep(manifest["config"], settings, f"{path}: config")
        path.write_text(json.dumps(manifest, indent=2))

    results = _keep(
        json.loads((dest / "results.json").read_text()), old["results.json"]["keys"], "results.json"
    )
    for split in ("validation", "test"):
        for key in old["results.json"]["absent_from_splits"]:
            assert results[split].pop(key, None) is not None, f"results.json {split} has no {key}"
    (dest / "results.json").write_text(json.dumps(results, indent=2))

    logged = set(old["metrics.jsonl"]["keys"])  # and eval_<metric>, whatever the problem's metrics
    records = [json.loads(line) for line in (dest / "metrics.jsonl").read_text().splitlines()]
    records = [{k: v for k, v in r.items() if k in logged or k.startswith("eval_")} for r in records]
    assert all("loss" in r or "eval_loss" in r for r in records)
    (dest / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    exported = json.loads((dest / "model" / "config.json").read_text())
    for key in old["model/config.json"]["absent"]:  # where today's export writes it (multi-label)
        exported.pop(key, None)
    (dest / "model" / "config.json").write_text(json.dumps(exported, indent=2))

    test_file = config["test_file"]
    for relative, record in old["files"].items():  # the old evaluate_checkpoint.py's outputs, in place
        text = json.dumps(record, indent=2).replace("{run}", str(dest)).replace("{test_file}", str(test_file))
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_text(text)
    return dest


def _weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_interrupted_run_resumes_with_its_own_recipe(today, version, tmp_path, capsys):
    """Killed after its step-4 checkpoint under the old version (no export, no results.json, the log up
    to step 4), resumed today from the run directory alone: it ends as the uninterrupted run did."""
    old = make_old(today["dir"], version, tmp_path / "old")
    shutil.rmtree(old / "model")
    for name in ("results.json", "training_curves.png"):
        (old / name).unlink()
    log = old / "metrics.jsonl"
    log.write_text(
        "".join(line + "\n" for line in log.read_text().splitlines() if json.loads(line)["step"] <= 4)
    )
    capsys.readouterr()

    train(["resume_from_checkpoint=latest", f"output_dir={old}"])

    out = capsys.readouterr().out
    assert f"resuming with the run's own recipe {old / 'config.yaml'}" in out, out[-2000:]
    assert _max_difference(_weights(old / "model"), _weights(today["dir"] / "model")) <= 1e-6
    now, then = (json.loads((d / "results.json").read_text()) for d in (old, today["dir"]))
    assert now["step"] == then["step"] == 5
    assert now["test"]["accuracy"] == then["test"]["accuracy"]
    assert now["test"]["loss"] == pytest.approx(then["test"]["loss"], abs=1e-6)
    # the old evaluation inside step 2 is left where it was
    assert (old / CHECKPOINT / "eval" / "test" / "metrics.json").is_file()


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_finished_run_evaluates_its_export_and_a_checkpoint(today, version, tmp_path):
    """The export and step 2 of an old finished run evaluate today as today's own run does; the old
    evaluations inside them are left as they were."""
    old = make_old(today["dir"], version, tmp_path / "old")
    kept = {p: p.read_bytes() for p in old.rglob("metrics.json")}  # the old evaluations' only
    for target in ("model", CHECKPOINT):
        record = json.loads(Path(evaluate([str(old / target)])["metrics_file"]).read_text())
        assert record["num_samples"] == 11 and record["split"] == "test"
        if target == "model":  # the same numbers as the run's own final evaluation
            final = json.loads((today["dir"] / "results.json").read_text())["test"]
            assert record["step"] == 5
        else:
            final = today["checkpoint_eval"]
            assert record["step"] == 2 and record["checkpoint_kind"] == "training-state"
        assert record["confusion_matrix"] == final["confusion_matrix"]
        assert record["loss"] == pytest.approx(final["loss"], abs=1e-6)
    assert len(kept) == 2 and {p: p.read_bytes() for p in kept} == kept


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_multi_label_export_without_tuned_thresholds_evaluates_at_its_threshold(
    today_multi_label, version, tmp_path
):
    """Before thresholds were tuned (63ca170), the export's config.json held none and config.yaml no
    tune_threshold: such an export is evaluated at the run's multi_label_threshold."""
    run = today_multi_label["dir"]
    assert json.loads((run / "model" / "config.json").read_text())["multi_label_thresholds"]
    old = make_old(run, version, tmp_path / "old")
    assert "multi_label_thresholds" not in json.loads((old / "model" / "config.json").read_text())
    threshold = yaml.safe_load((old / "config.yaml").read_text())["multi_label_threshold"]

    record = json.loads(Path(evaluate([str(old / "model")])["metrics_file"]).read_text())
    expected = json.loads(
        Path(evaluate([str(run / "model"), f"multi_label_threshold={threshold}", "--output", str(tmp_path / "today")])
             ["metrics_file"]).read_text()
    )  # fmt: skip
    assert record["threshold"] == expected["threshold"] == threshold
    for key in ("num_samples", "micro_f1", "macro_f1", "subset_accuracy", "loss"):
        assert record[key] == pytest.approx(expected[key], abs=1e-6), key


@pytest.mark.parametrize("thresholds", [[0.5, 0.5], [0.5, 1.5, 0.5], [0.5, -0.2, 0.5], "half", True])
def test_thresholds_edited_by_hand_into_the_exports_config_are_one_line(today_multi_label, thresholds, tmp_path,
                                                                         capsys):  # fmt: skip
    """config.json's multi_label_thresholds of another length than the labels ended in numpy's broadcast
    traceback; a value outside [0, 1] (a label never or always predicted) was scored without a word."""
    copy = tmp_path / "run"
    shutil.copytree(today_multi_label["dir"], copy, ignore=shutil.ignore_patterns("checkpoints", "eval"))
    config = json.loads((copy / "model" / "config.json").read_text())
    labels = len(config["id2label"])
    if isinstance(thresholds, list) and len(thresholds) == 3 and labels != 3:
        thresholds = thresholds + [0.5] * (labels - 3)  # one per label, one of them out of [0, 1]
    config["multi_label_thresholds"] = thresholds
    (copy / "model" / "config.json").write_text(json.dumps(config))
    user_error(capsys, evaluate, [str(copy / "model"), "--output", str(tmp_path / "eval")],
               f"config.json has multi_label_thresholds={json.dumps(thresholds)}", f"each of its {labels} labels",
               "between 0 and 1", untouched=copy)  # fmt: skip


# --- the output directory -------------------------------------------------------------------------------


def test_output_dir_that_is_a_file_or_holds_other_files(small_text_data, tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for target in (a_file, a_file / "sub"):
        user_error(capsys, main, tiny_text_args(small_text_data, target, "max_steps=2"), "is a file, not a folder",
                   rule="runs.output_dir_under_a_file")  # fmt: skip
    theirs = tmp_path / "project"
    (theirs / "project").mkdir(parents=True)
    (theirs / "project/keep.txt").write_text("mine")  # the tracker folder's name: never cleared here
    (theirs / "config.yaml").write_text("mine: true\n")
    user_error(capsys, main, tiny_text_args(small_text_data, theirs, "max_steps=2"), "not a run of this app",
               untouched=theirs, rule="runs.output_dir_holds_other_files")  # fmt: skip
    # Asked for: written into, nothing deleted, nothing written over (config.yaml is the user's here).
    user_error(capsys, main, tiny_text_args(small_text_data, theirs, "max_steps=1", "overwrite_output_dir=true"),
               "would write over them", untouched=theirs, rule="runs.files_in_the_way")  # fmt: skip
    (theirs / "config.yaml").rename(theirs / "my-config.yaml")
    main(tiny_text_args(small_text_data, theirs, "max_steps=1", "overwrite_output_dir=true"))
    assert (theirs / "project/keep.txt").read_text() == "mine" and (theirs / "results.json").exists()
    assert (theirs / "my-config.yaml").read_text() == "mine: true\n"


def test_results_mark_a_finished_run(finished_run):
    finished = finished_run(*EARLIER_RUN)
    results = json.loads((finished / "results.json").read_text())
    assert results["step"] == 2 and (finished / "model/README.md").exists()


def test_finished_run_is_not_overwritten(finished_run, tmp_path, capsys):
    out = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    args = tiny_text_args(finished_run.data(), out, *EARLIER_RUN, "warmup_ratio=0")
    before = (out / "model" / "model.safetensors").read_bytes()
    user_error(capsys, main, args, "already holds a finished run", untouched=out, rule="runs.output_dir_holds_a_run")
    main([*args, "overwrite_output_dir=true", "learning_rate=5e-2"])
    assert (out / "model" / "model.safetensors").read_bytes() != before


def test_overwrite_then_a_diverged_loss_keeps_the_earlier_run(finished_run, tmp_path, capsys):
    """Stopped at exit status 3 with no checkpoint of its own: the run that was there comes back."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    before = file_hashes(copy)
    argv = tiny_text_args(finished_run.data(), copy, "freeze_embeddings=true", "overwrite_output_dir=true", "max_steps=20",
                          "per_device_train_batch_size=4", "warmup_ratio=0", "learning_rate=1e30",
                          "max_nonfinite_loss_steps=2")  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 3
    assert "Traceback" not in capsys.readouterr().err
    assert file_hashes(copy) == before
    assert json.loads((copy / "results.json").read_text())["step"] == 2


def test_overwrite_that_finishes_replaces_only_the_run(finished_run, tmp_path):
    """The run's files go, its evaluations (eval/: the replaced model's scores) with them; a file of the
    user's beside them stays."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    (copy / "notes.txt").write_text("mine")
    (copy / "eval" / "test").mkdir(parents=True)
    (copy / "eval" / "test" / "metrics.json").write_text('{"accuracy": 0.5}')
    results = main(tiny_text_args(finished_run.data(), copy, *EARLIER_RUN, "overwrite_output_dir=true",
                                  "max_steps=1", "save_steps=1"))  # fmt: skip
    assert results["step"] == 1 and (copy / "notes.txt").read_text() == "mine"
    assert not (copy / "eval").exists()
    assert [p.name for p in ckpt.list_checkpoints(copy)] == ["step-00000001"]
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith(".")) == []  # nothing set aside is left


# --- what kind of path a user gave ------------------------------------------------------------------------


def test_an_export_or_a_run_given_to_resume_from_says_what_it_is(finished_run, tmp_path, capsys):
    data, out = finished_run.data(), finished_run(*EARLIER_RUN)
    user_error(capsys, main, recipe_text_args(data, tmp_path / "next", f"resume_from_checkpoint={out / 'model'}"),
               "is an exported model, not a training-state checkpoint", untouched=out,
               rule="runs.resume_is_an_export")  # fmt: skip
    user_error(capsys, main, recipe_text_args(data, tmp_path / "next", f"resume_from_checkpoint={out}"),
               "is a run directory; resume it with resume_from_checkpoint=latest", untouched=out,
               rule="runs.resume_is_a_run")  # fmt: skip
    with pytest.raises(UserError, match="is a run's checkpoints folder; name one of its step-N folders") as refused:
        ckpt.resolve_checkpoint(str(out / "checkpoints"), tmp_path / "next")
    assert refused.value.rule == "runs.resume_is_a_checkpoints_folder"


def test_latest_in_a_run_without_checkpoints_offers_the_overwrite(finished_run, tmp_path):
    """A finished run that kept no checkpoint: leaving the resume out is refused too (it holds a run), so the
    line offers overwrite_output_dir=true, the fix that works."""
    out = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    shutil.rmtree(out / "checkpoints")
    with pytest.raises(UserError, match="no complete checkpoint in .*; to start again there, pass "
                                        "overwrite_output_dir=true instead") as refused:  # fmt: skip
        ckpt.resolve_checkpoint("latest", out)
    assert refused.value.rule == "runs.no_checkpoint_to_resume"
    from finetune.rundir import check_output_dir  # and leaving the resume out offers no resume

    with pytest.raises(UserError, match=r"already holds a finished run; pass overwrite_output_dir=true to replace "
                                        r"it, or choose another output_dir$"):  # fmt: skip
        check_output_dir(out, overwrite=False, resume_from=None, trackers=False)


# --- the user's files inside a run, and runs inside a run ------------------------------------------------


def test_overwrite_refuses_a_run_whose_folders_hold_files_of_the_user_s(finished_run, tmp_path, capsys):
    """overwrite_output_dir=true moves checkpoints/ and model/ aside whole, then deletes them: a note or a
    backup of the user's inside them is refused before anything moves, named, never deleted."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    argv = tiny_text_args(finished_run.data(), copy, *EARLIER_RUN, "overwrite_output_dir=true")
    (copy / "model" / "MY_NOTES.txt").write_text("n")
    user_error(capsys, main, argv, "model/MY_NOTES.txt", "move it out", untouched=copy, rule="runs.files_inside_a_run")
    (copy / "checkpoints" / "keep.txt").write_text("k")
    shutil.copytree(copy / "checkpoints" / "step-00000001", copy / "checkpoints" / "step-00000001-mybackup")
    user_error(capsys, main, argv, "checkpoints/keep.txt", "and 2 more", "move it out", untouched=copy)
    assert [p.name for p in ckpt.list_checkpoints(copy)] == ["step-00000001", "step-00000002"]  # not the backup
    shutil.rmtree(copy / "checkpoints" / "step-00000001-mybackup")
    for name in ("MY_NOTES.txt", "keep.txt"):
        next(copy.rglob(name)).unlink()
    (copy / "eval" / "test").mkdir(parents=True)  # an evaluation's folder goes with the run; a note in it not
    (copy / "eval" / "test" / "metrics.json").write_text("{}")
    (copy / "eval" / "test" / "thoughts.md").write_text("t")
    user_error(capsys, main, argv, "eval/test/thoughts.md", "the run replaces eval/ whole", untouched=copy)


def test_a_file_of_the_users_inside_a_checkpoint_is_refused_before_retention_could_delete_it(
    finished_run, tmp_path, capsys
):
    """NOTES.txt put inside checkpoints/step-N: a resume's checkpoint retention deletes step-N whole. The
    checkpoint's manifest names the files it was saved with; anything else is refused by name."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    step = sorted((copy / "checkpoints").iterdir())[-1]
    assert "manifest.json" in json.loads((step / "manifest.json").read_text())["files"]
    (step / "NOTES.txt").write_text("n")
    argv = tiny_text_args(finished_run.data(), copy, *EARLIER_RUN, "resume_from_checkpoint=latest", "max_steps=4")
    user_error(capsys, main, argv, f"{step / 'NOTES.txt'}", "move it out", untouched=copy, rule="runs.files_inside_a_run")


def test_overwrite_refuses_to_delete_the_evaluation_of_a_model_it_keeps(finished_run, tmp_path, capsys):
    """model/ renamed model_v1 to keep it, then evaluated (into the run's eval/): the overwrite keeps model_v1
    but would delete its evaluation with the replaced run's eval/. Refused, naming both; with the
    evaluation moved out, the overwrite goes on and model_v1 stays."""
    from finetune.evaluate_checkpoint import main as evaluate

    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    (copy / "model").rename(copy / "model_v1")
    evaluate([str(copy / "model_v1"), "--data", str(finished_run.data()["validation"])])
    evaluated = next((copy / "eval").glob("*/metrics.json")).parent
    argv = tiny_text_args(finished_run.data(), copy, *EARLIER_RUN, "overwrite_output_dir=true")
    user_error(capsys, main, argv, f"holds {evaluated}, the evaluation of ", "model_v1, which the overwrite keeps",
               untouched=copy, rule="runs.evaluation_of_a_kept_model")  # fmt: skip
    shutil.move(evaluated, tmp_path / "kept-eval")
    main(argv)
    assert (copy / "model_v1" / "config.json").is_file() and (tmp_path / "kept-eval" / "metrics.json").is_file()


def test_overwrite_refuses_a_file_of_the_users_where_it_sets_the_run_aside(finished_run, tmp_path, capsys):
    """A file named .previous-run (or .previous-run.tmp) in a run's folder: the overwrite would move the run
    into a folder there and fail half-way, the run's files stranded. Refused before anything moves."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    argv = tiny_text_args(finished_run.data(), copy, *EARLIER_RUN, "overwrite_output_dir=true")
    for name in (".previous-run", ".previous-run.tmp"):
        (copy / name).write_text("mine\n")
        user_error(capsys, main, argv, f"holds {name}, a file no run of this app wrote", untouched=copy,
                   rule="runs.set_aside_name_taken")  # fmt: skip
        (copy / name).unlink()


@pytest.mark.parametrize("inside", ["checkpoints/step-00000002", "checkpoints", "checkpoints/.tmp-step-00000009",
                                    "model", "model/sub", "eval/mine"])  # fmt: skip
@pytest.mark.parametrize("overwrite", [False, True])
def test_output_dir_inside_a_run_s_checkpoints_or_export_is_refused(finished_run, inside, overwrite, capsys):
    """A run there would be deleted by the outer run's checkpoint retention, resume or next export."""
    out = finished_run(*EARLIER_RUN)
    argv = tiny_text_args(finished_run.data(), out / inside, "max_steps=1", f"overwrite_output_dir={overwrite}")
    what = {"model": "the export of the run in", "checkpoints": "the checkpoints folder of the run in",
            "eval": "the eval/ folder of the run in"}
    fragments = (["it is checkpoint step-00000002 of the run in", f"resume_from_checkpoint={out / inside}"]
                 if inside.endswith("step-00000002") else [what[inside.split("/")[0]]])  # fmt: skip
    rule = ("runs.output_dir_in_a_checkpoint" if inside.endswith("step-00000002") else "runs.output_dir_in_an_eval_folder"
            if inside.startswith("eval") else "runs.output_dir_in_a_replaced_folder")  # fmt: skip
    user_error(capsys, main, argv, *fragments, str(out), untouched=out, rule=rule)
    assert not (out / "checkpoints" / ".tmp-step-00000009").exists() and not (out / "model" / "sub").exists()
    assert not (out / "eval").exists()


def test_a_resume_whose_config_yaml_is_gone_uses_the_checkpoint_s_config(finished_run, tmp_path, capsys):
    """Not the default recipe, refused one setting at a time: the manifest's config, said in a warning; a run
    with no config anywhere is one line that says config.yaml is missing."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    (copy / "config.yaml").unlink()
    (copy / "results.json").unlink()
    capsys.readouterr()
    results = main(["resume_from_checkpoint=latest", f"output_dir={copy}"])
    err = capsys.readouterr().err
    assert f"{copy / 'config.yaml'} is missing; resuming with the config saved in" in err, err[-2000:]
    assert results["step"] == 2 and (copy / "config.yaml").is_file()
    assert "runs.config_from_a_manifest" in [said["rule"] for said in results["warnings"]]

    bare = finished_run.copy(tmp_path / "bare", *EARLIER_RUN)
    (bare / "config.yaml").unlink()
    for manifest in bare.glob("checkpoints/*/manifest.json"):
        record = json.loads(manifest.read_text())
        del record["config"]
        manifest.write_text(json.dumps(record))
    user_error(capsys, main, ["resume_from_checkpoint=latest", f"output_dir={bare}"], "config.yaml is missing",
               "--config", untouched=bare, rule="runs.no_config_to_resume")  # fmt: skip


def test_a_metrics_log_of_the_users_is_not_a_run_an_overwrite_may_set_aside(finished_run, tmp_path, capsys):
    """overwrite_output_dir=true replaces a run; a folder holding a metrics.jsonl of the user's (or another
    tool's) holds none, so the run refuses to write over that file instead of setting it aside and deleting it."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.3}\n')
    (folder / "notes.txt").write_text("mine\n")
    assert RunDir(folder).holds_run() is None
    argv = tiny_text_args(finished_run.data(), folder, "max_steps=1", "overwrite_output_dir=true")
    user_error(capsys, main, argv, "holds metrics.jsonl, which no run of this app wrote there", untouched=folder,
               rule="runs.files_in_the_way")  # fmt: skip
    # A run's own log beside its config is a started run, as before (empty: stopped before its first line).
    shutil.copy(finished_run(*EARLIER_RUN) / "config.yaml", folder / "config.yaml")
    for log in ('{"step": 1, "loss": 0.5}\n', ""):
        (folder / "metrics.jsonl").write_text(log)
        assert RunDir(folder).holds_run() == "a started run"


def test_a_results_json_of_the_users_is_not_a_finished_run(finished_run, tmp_path, capsys):
    """The same for results.json: the user's own, in a folder of other files, is refused, not set aside and
    deleted; a run's (a record with its step), or one damaged beside the run's config.yaml, is a finished run."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.json").write_text('{"mine": 1}\n')
    assert RunDir(folder).holds_run() is None
    argv = tiny_text_args(finished_run.data(), folder, "max_steps=1", "overwrite_output_dir=true")
    user_error(capsys, main, argv, "holds results.json, which no run of this app wrote there", untouched=folder,
               rule="runs.files_in_the_way")  # fmt: skip
    (folder / "results.json").write_text('{"step": 3}\n')
    assert RunDir(folder).holds_run() == "a finished run"
    (folder / "results.json").write_text('{"step": 3')  # cut short: a run's only beside its config
    assert RunDir(folder).holds_run() is None
    shutil.copy(finished_run(*EARLIER_RUN) / "config.yaml", folder / "config.yaml")
    assert RunDir(folder).holds_run() == "a finished run"


def test_overwrite_beside_a_resume_is_said_to_be_unused(tmp_path, capsys):
    from finetune.rundir import check_output_dir

    said = checks.Said()
    check_output_dir(tmp_path / "run", overwrite=True, resume_from="latest", trackers=False, said=said)
    assert said.rules() == ["runs.overwrite_beside_resume"]
    assert capsys.readouterr().err.splitlines() == [
        f"warning: overwrite_output_dir=true is not used: resume_from_checkpoint continues the run in {tmp_path / 'run'}, "
        "nothing there is replaced (leave one of them out)"]
    check_output_dir(tmp_path / "run", overwrite=False, resume_from="latest", trackers=False)
    assert capsys.readouterr().err == ""


def test_a_copied_run_resumed_by_checkpoint_path_continues_in_the_copy(finished_run, tmp_path):
    """The saved config names the original's output_dir; a resume by path with no output_dir continues the
    run that holds the checkpoint (the copy), and the original is not touched (the factory checks it)."""
    original = finished_run(*EARLIER_RUN)
    copy = tmp_path / "moved copy"
    shutil.copytree(original, copy)
    results = main([f"resume_from_checkpoint={copy / 'checkpoints' / 'step-00000001'}"])
    assert results["step"] == 2 and json.loads((copy / "results.json").read_text())["step"] == 2
    assert (copy / "metrics.jsonl").read_text() != (original / "metrics.jsonl").read_text()  # the copy went on


def test_a_copied_runs_resume_keeps_and_exports_its_own_best_checkpoint(finished_run, tmp_path, capsys):
    """The manifests name the best checkpoint by the original's path: a resume of the copy keeps the copy's
    own best through retention and exports it (load_best_model_at_end), never reading the original; a best
    checkpoint that is gone from the copy is said, and the best chosen again. Here the best is the first
    step's (the highest validation loss, greater_is_better=true), with one checkpoint kept besides."""
    best_first = ("max_steps=3", "save_steps=1", "eval_steps=1", "save_total_limit=1", "metric_for_best_model=loss",
                  "greater_is_better=true", "load_best_model_at_end=true")  # fmt: skip
    original = finished_run(*best_first)
    assert json.loads((original / "results.json").read_text())["exported"]["step"] == 1
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    results = main([f"output_dir={copy}", "resume_from_checkpoint=latest", "max_steps=5"])
    kept = sorted(p.name for p in (copy / "checkpoints").iterdir())
    assert "step-00000001" in kept and results["exported"]["step"] == 1, (kept, results["exported"])
    manifest = json.loads((copy / "checkpoints" / kept[-1] / "manifest.json").read_text())
    assert manifest["best"]["path"] == str(copy / "checkpoints" / "step-00000001")
    again = tmp_path / "without-its-best"
    shutil.copytree(original, again)
    shutil.rmtree(again / "checkpoints" / "step-00000001")
    capsys.readouterr()
    results = main([f"output_dir={again}", "resume_from_checkpoint=latest", "max_steps=5"])
    said = [line for line in capsys.readouterr().err.splitlines() if "best checkpoint so far" in line]
    assert len(said) == 1 and "(step 1, validation loss" in said[0] and results["exported"]["step"] > 1, said
    assert "runs.best_checkpoint_missing" in [w["rule"] for w in results["warnings"]]


def test_a_resume_refuses_a_run_whose_export_holds_a_file_of_the_users(finished_run, tmp_path, capsys):
    """A resume's export replaces model/ whole: a note of the user's there is refused, named, kept."""
    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    (copy / "model" / "my_notes.txt").write_text("mine\n")
    user_error(capsys, main, [f"output_dir={copy}", "resume_from_checkpoint=latest"], "model/my_notes.txt",
               "the run replaces model/ whole", untouched=copy, rule="runs.files_inside_a_run")  # fmt: skip


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_search_folder_given_to_a_run_is_named_as_a_search(tmp_path, overwrite):
    """A search's folder (study.db, trials, model/: the best trial's export) is neither a run to replace
    nor a folder of other files: the line names the search, and nothing there changes."""
    from finetune.rundir import check_output_dir

    out = tmp_path / "search"
    (out / "model").mkdir(parents=True)
    (out / "trial-0").mkdir()
    (out / "study.db").write_bytes(b"SQLite format 3\0")
    before = file_hashes(out)
    with pytest.raises(UserError, match=r"holds a hyperparameter search \(study.db, its trials, and model/") as refused:
        check_output_dir(out, overwrite=overwrite, resume_from=None, trackers=False)
    assert refused.value.rule == "runs.output_dir_holds_a_search"
    assert file_hashes(out) == before


@pytest.mark.parametrize("how", ["overwrite_output_dir=true", "resume_from_checkpoint=latest"])
def test_a_run_still_going_is_neither_overwritten_nor_resumed_beside(finished_run, tmp_path, how, capsys):
    """While a run's main process holds its folder (rundir.in_use, a flock: here on another open file,
    as another process would), an overwrite would delete its checkpoints under it and a resume would
    write beside it: both refused before anything moves, holding nothing after. (A run releases its
    folder when it ends: the resume tests run twice in one process.)"""
    from finetune.rundir import in_use

    copy = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    argv = tiny_text_args(finished_run.data(), copy, *EARLIER_RUN, how)
    with in_use(RunDir(copy)):
        user_error(capsys, main, argv, f"output_dir {copy} is in use by a run still going", untouched=copy,
                   rule="runs.output_dir_in_use")  # fmt: skip
    with in_use(RunDir(copy)):  # the refused command holds nothing
        pass


def test_a_checkpoint_of_one_run_resumed_into_another_run_s_folder_is_refused(finished_run, tmp_path, capsys):
    """resume_from_checkpoint=<run A's checkpoint> output_dir=<run B>: B is not the run resumed, and the
    resume would write over it without setting it aside. Refused, B untouched."""
    a = finished_run.copy(tmp_path / "a", *EARLIER_RUN)
    b = finished_run.copy(tmp_path / "b", *EARLIER_RUN)
    argv = tiny_text_args(finished_run.data(), b, *EARLIER_RUN, f"resume_from_checkpoint={a / 'checkpoints' / 'step-00000001'}",
                          "max_steps=4")  # fmt: skip
    user_error(capsys, main, argv, f"output_dir {b} holds a finished run of its own", "choose a new output_dir",
               untouched=[a, b], rule="runs.resume_over_another_run")  # fmt: skip
    # told to replace B: B is set aside as by a fresh run's overwrite, A (the checkpoint's run) untouched
    before = file_hashes(a)
    main([*argv, "overwrite_output_dir=true"])
    assert file_hashes(a) == before and not (b / ".previous-run").exists()
    assert json.loads((b / "results.json").read_text())["step"] == 4
    # a mistyped checkpoint is no other run's: its own line (not found), not this one
    typo = tiny_text_args(finished_run.data(), b, *EARLIER_RUN, "resume_from_checkpoint=Latest")
    user_error(capsys, main, typo, "checkpoint not found: Latest; the newest checkpoint is resume_from_checkpoint=latest",
               untouched=[a, b], rule="runs.latest_misspelt")  # fmt: skip


def test_a_run_set_aside_by_a_killed_overwrite_is_named_wherever_it_could_be_lost(finished_run, tmp_path, capsys):
    """An overwrite killed before it finished (no checkpoint of its own: nothing could put the earlier run
    back) leaves that run in .previous-run beside its own started files. A plain run there and a resume of the
    latest checkpoint name it and how to keep it; a second overwrite, which would delete it, is refused until
    the user moves it back or deletes it. The refusals touch nothing."""
    out = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    aside = out / ".previous-run"
    aside.mkdir()
    for path in list(out.iterdir()):
        if path != aside:
            path.rename(aside / path.name)
    (out / "config.yaml").write_text((aside / "config.yaml").read_text())  # the killed run's start
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.7}\n')
    args = tiny_text_args(finished_run.data(), out, *EARLIER_RUN, "warmup_ratio=0")
    note = ".previous-run holds the run an earlier overwrite set aside and did not finish replacing"
    line = user_error(capsys, main, args, "already holds a started run", note, untouched=out,
                      rule="runs.output_dir_holds_a_run")  # fmt: skip
    assert "pass overwrite_output_dir=true" not in line  # it would be refused: not offered
    user_error(capsys, main, [*args, "resume_from_checkpoint=latest"], "no complete checkpoint", note, untouched=out,
               rule="runs.no_checkpoint_to_resume")  # fmt: skip
    user_error(capsys, main, [*args, "overwrite_output_dir=true"], "holds .previous-run: the run an earlier overwrite "
               "set aside", "or delete .previous-run to let this overwrite replace it", untouched=out,
               rule="runs.overwrite_over_a_set_aside_run")  # fmt: skip
    shutil.rmtree(aside)  # the user's choice: that run may go
    main([*args, "overwrite_output_dir=true", "max_steps=1"])
    assert not aside.exists() and (out / "model").is_dir()


def test_a_resume_from_an_earlier_checkpoint_says_which_later_ones_it_replaces(finished_run, tmp_path, capsys):
    """Going on from step 5 of a run that reached step 10 redoes steps 6-10: their checkpoint and the export
    are replaced as the run goes on, said before it starts (asked for, so not refused)."""
    out = finished_run.copy(tmp_path / "run", *TWO_EPOCHS)
    early = f"resume_from_checkpoint={out / 'checkpoints' / 'step-00000005'}"
    # a resume that a check refuses replaces nothing, and says nothing of it
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(tiny_text_args(finished_run.data(), out, *TWO_EPOCHS, early, "seed=7"))
    err = capsys.readouterr().err
    assert "the checkpoint was trained with seed=42" in err and "later checkpoint" not in err, err
    main(tiny_text_args(finished_run.data(), out, *TWO_EPOCHS, early))
    err = capsys.readouterr().err
    assert "warning: resuming from step-00000005, before this run's later checkpoint(s) step-00000010" in err, err
    main(tiny_text_args(finished_run.data(), out, *TWO_EPOCHS, "num_train_epochs=3", "resume_from_checkpoint=latest"))
    assert "later checkpoint" not in capsys.readouterr().err  # the newest: nothing is redone
    # the newest damaged (its manifest gone): latest skips it, goes on from the one before, and says that the
    # damaged one is replaced too
    newest = sorted((out / "checkpoints").iterdir())[-1]
    (newest / "manifest.json").unlink()
    main(tiny_text_args(finished_run.data(), out, *TWO_EPOCHS, "num_train_epochs=3", "resume_from_checkpoint=latest"))
    err = capsys.readouterr().err
    assert f"before this run's later checkpoint(s) {newest.name}" in err, err


def test_a_run_without_a_checkpoint_is_not_told_to_resume_and_its_paths_paste(finished_run, tmp_path, capsys):
    """A run kept without its checkpoints, in a folder whose name has a space: given to resume from (the run, its
    export) or to the ONNX export without its model/, no line offers resume_from_checkpoint=latest, which
    runs.no_checkpoint_to_resume would refuse; the paths a line offers in a setting or a command are quoted
    for the shell. The same run with its checkpoints is offered the resume, quoted."""
    import shlex

    from finetune.onnx_export import main as onnx_main

    kept = finished_run.copy(tmp_path / "my runs" / "kept", *EARLIER_RUN)
    bare = Path(shutil.copytree(kept, tmp_path / "my runs" / "bare"))
    shutil.rmtree(bare / "checkpoints")
    args = recipe_text_args(finished_run.data(), tmp_path / "next")
    line = user_error(capsys, main, [*args, f"resume_from_checkpoint={bare}"], "is a run directory without a "
                      "checkpoint to resume from; leave resume_from_checkpoint out", rule="runs.resume_is_a_run")
    assert "=latest" not in line and f"model_name_or_path={shlex.quote(str(bare / 'model'))})" in line
    line = user_error(capsys, main, [*args, f"resume_from_checkpoint={bare / 'model'}"], "is an exported model",
                      rule="runs.resume_is_an_export")  # fmt: skip
    assert "=latest" not in line and line.endswith(f"model_name_or_path={shlex.quote(str(bare / 'model'))}")
    line = user_error(capsys, main, [*args, f"resume_from_checkpoint={kept}"], rule="runs.resume_is_a_run")
    assert f"resume_from_checkpoint=latest output_dir={shlex.quote(str(kept))}, or name" in line
    line = user_error(capsys, main, [*args, f"resume_from_checkpoint={kept / 'model'}"], rule="runs.resume_is_an_export")
    assert f"resume_from_checkpoint=latest output_dir={shlex.quote(str(kept))} (or" in line
    for run in (bare, kept):
        shutil.rmtree(run / "model")
    line = user_error(capsys, onnx_main, [str(bare)], "saved no checkpoint to resume from: train it again",
                      rule="runs.onnx_without_export")  # fmt: skip
    assert "resume_from_checkpoint" not in line
    line = user_error(capsys, onnx_main, [str(kept)], rule="runs.onnx_without_export")
    assert f"(resume_from_checkpoint=latest output_dir={shlex.quote(str(kept))})" in line


def test_a_runs_own_folder_as_the_checkpoint_to_resume_is_named_as_such(finished_run, tmp_path, capsys):
    """resume_from_checkpoint=<the run's folder> with output_dir=<the same folder>: the line says it is a run
    directory and how to resume it, not that it is "a checkpoint of another run"; the same for a file of the
    run given as the checkpoint."""
    out = finished_run.copy(tmp_path / "run", *EARLIER_RUN)
    args = tiny_text_args(finished_run.data(), out, *EARLIER_RUN)
    line = user_error(capsys, main, [*args, f"resume_from_checkpoint={out}"], "is a run directory; resume it with "
                      "resume_from_checkpoint=latest", untouched=out, rule="runs.resume_is_a_run")  # fmt: skip
    assert "another run" not in line
    user_error(capsys, main, [*args, f"resume_from_checkpoint={out / 'config.yaml'}"], "is a file, not a checkpoint "
               "folder", untouched=out, rule="runs.resume_is_a_file")  # fmt: skip


def test_an_output_dir_this_user_may_not_write_into_is_refused(tmp_path, monkeypatch):
    import os

    from finetune.rundir import check_output_dir

    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as for a folder of another user's (root may write)
    with pytest.raises(UserError, match=f"output_dir {tmp_path / 'run'}: {tmp_path} is not writable") as refused:
        check_output_dir(tmp_path / "run", overwrite=False, resume_from=None, trackers=False)
    assert refused.value.rule == "runs.output_dir_not_writable"


class _Machines:
    """Two processes on two machines, as check_shared_output_dir asks them (this one the main process)."""

    num_processes, process_index, is_main_process = 2, 0, True


@pytest.mark.parametrize("rule", ["runs.output_dir_not_shared", "runs.probe_not_written"])
def test_an_output_dir_the_machines_of_a_run_do_not_share_is_refused(rule, tmp_path, monkeypatch):
    """The other machine does not see the probe file (its output_dir is a folder of its own); or the main
    process cannot write it. The gather and the broadcast stand in for accelerate's."""
    import accelerate.utils

    from finetune.rundir import check_shared_output_dir

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    unwritten = [None, 0, None, (str(tmp_path), "Read-only file system")]
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list",
                        lambda sent, from_process: unwritten if rule == "runs.probe_not_written" else sent)  # fmt: skip
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda mine: [*mine, (1, "1", "other-host", False)])
    with pytest.raises(UserError) as refused:
        check_shared_output_dir(_Machines(), tmp_path / "run")
    assert refused.value.rule == rule
    said = {"runs.output_dir_not_shared": "process 1 on machine 1 (other-host) cannot see the probe file",
            "runs.probe_not_written": f"cannot write a probe file in {tmp_path} (Read-only file system)"}
    assert said[rule] in str(refused.value) and not list(tmp_path.iterdir())  # the probe is gone
