"""An old run directory still resumes and evaluates (issue 26: "old run directories still resume and
evaluate").

    python -m pytest -q tests/test_rundir.py

A tiny run written by today's code is rewritten into the forms an older version wrote, then resumed
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
from accelerate.state import AcceleratorState, GradientState
from conftest import multi_label_rows, rotten_rows, tiny_text_args, write_csv, write_jsonl
from safetensors.torch import load_file

from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import main as train

FIXTURES = Path(__file__).parent / "fixtures" / "old_rundir"
# ba02c02 (the last before the restructure) in every run; older ones, which lack a few more keys, with -m slow
NEWEST_OLD = "ba02c02"
VERSIONS = [
    pytest.param(p.stem, marks=() if p.stem == NEWEST_OLD else pytest.mark.slow)
    for p in sorted(FIXTURES.glob("*.json"))
]
CHECKPOINT = "checkpoints/step-00000002"  # of 2 and 4, in a 5-step run


def _reset() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def today(tmp_path_factory) -> dict:
    """37 train / 13 validation / 11 test rows, batch 8: 5 optimizer steps, checkpoints at 2 and 4."""
    root = tmp_path_factory.mktemp("rundir")
    data = {"train": write_csv(root / "train.csv", rotten_rows(37)),
            "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    test = write_csv(root / "test.csv", rotten_rows(11, start=200))
    out = root / "run"
    train(tiny_text_args(data, out, f"test_file={test}", "save_steps=2", "num_train_epochs=1",
                         "per_device_train_batch_size=8", "save_total_limit=null"))  # fmt: skip
    _reset()
    # today's evaluation of step 2, kept outside the run that the tests copy
    checkpoint_eval = evaluate([str(out / CHECKPOINT), "--output", str(root / "step-2-eval")])["metrics_file"]
    _reset()
    return {"dir": out, "test": test, "checkpoint_eval": json.loads(Path(checkpoint_eval).read_text())}


@pytest.fixture(scope="module")
def today_multi_label(tmp_path_factory) -> dict:
    """A multi-label run: its export's config.json holds the thresholds tuned on validation."""
    root = tmp_path_factory.mktemp("rundir-multi-label")
    data = {"train": write_jsonl(root / "train.jsonl", multi_label_rows(40, seed=0)),
            "validation": write_jsonl(root / "validation.jsonl", multi_label_rows(16, seed=1))}  # fmt: skip
    test = write_jsonl(root / "test.jsonl", multi_label_rows(12, seed=2))
    out = root / "run"
    train(tiny_text_args(data, out, f"test_file={test}", "label_column=labels", "tune_threshold=per_label",
                         "save_steps=2", "num_train_epochs=1", "per_device_train_batch_size=8"))  # fmt: skip
    _reset()
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
        _reset()
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
    _reset()
    expected = json.loads(
        Path(evaluate([str(run / "model"), f"multi_label_threshold={threshold}", "--output", str(tmp_path / "today")])
             ["metrics_file"]).read_text()
    )  # fmt: skip
    _reset()
    assert record["threshold"] == expected["threshold"] == threshold
    for key in ("num_samples", "micro_f1", "macro_f1", "subset_accuracy", "loss"):
        assert record[key] == pytest.approx(expected[key], abs=1e-6), key
