"""The expected-results benchmark's smoke run: one built task (multi-label, from UNER) through the real
command with a tiny BERT from config for a few steps; the report's structure, no figures asserted. And
the task builder: deterministic, from the bundled data alone."""

from __future__ import annotations

import json

import pytest

from benchmarks.expected_results import BUILDER, BY_NAME, earlier_report, kept_rows, main, markdown
from finetune.errors import UserError
from finetune.runtime import native_bf16


@pytest.mark.slow
def test_smoke_run_writes_the_report(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    report = main(["--smoke", "--out", str(out), "--data", str(data), "--tasks", "multi_label"])
    assert json.loads((out / "expected_results.json").read_text()) == json.loads(
        json.dumps(report, default=str)
    )
    (row,) = report["tasks"]
    assert row["exit_status"] == 0, row.get("error")
    assert row["key"] == "multi_label" and row["recipe"] == "finetune/configs/bert_multi_label.yaml"
    # the command a user types: accelerate launch with the recipe and the built files, nothing of the smoke
    # (bf16 where this CPU computes it natively, else fp32: emulated bf16 is many times slower)
    config = "cpu_bf16.yaml" if native_bf16() else "cpu.yaml"
    assert row["command"].startswith(f"accelerate launch --config_file accelerate_configs/{config} finetune/run.py")
    assert (
        f"train_file={data}/uner_entity_types/train.jsonl" in row["command"]
        and "model_config" not in row["command"]
    )
    assert any(s.startswith("model_config=") for s in row["smoke_settings"])
    assert row["optimizer_steps"] == 4 and row["wall_s"] > 0
    for split in ("validation", "test"):  # every metric of the task, and the app's trivial baseline beside it
        assert set(BY_NAME["multi_label"].metrics) <= set(row[split]), row[split]
        assert all(0 <= v <= 1 for v in row[f"{split}_baseline"].values()), row[f"{split}_baseline"]
    assert row["test"]["num_samples"] == 32
    assert set(row["learned"]) >= {"metric", "value", "baseline", "verdict"}
    assert row["quiet"] in (True, False) and len(row["load_before"]) == 3 and len(row["load_after"]) == 3
    # the built data: its manifest, with the split sizes the docs state
    manifest = report["data"]["uner_entity_types"]
    assert [manifest[s]["rows"] for s in ("train", "validation", "test")] == [1701, 300, 2077]
    assert len(manifest["sha256_of_files"]) == 64
    table = (out / "expected_results.md").read_text()
    assert (
        "| task | data | recipe + key settings | command | test metric | trivial baseline (test) |" in table
    )
    assert "| multi-label (" in table and "micro f1 " in table


@pytest.mark.slow  # ~5 s: builds every public task's files twice
def test_the_public_tasks_build_the_same_bytes_twice_without_scikit_image(tmp_path, monkeypatch):
    """Two builds of every task, in two folders: the same sha256 over each task's files. The photos come
    from scikit-learn's and matplotlib's wheels (scikit-image, not an allowed dependency, is kept out)."""
    import sys

    sys.path.insert(0, str(BUILDER.parent))
    try:
        import public_tasks
    finally:
        sys.path.remove(str(BUILDER.parent))
    monkeypatch.setitem(sys.modules, "skimage", None)  # any import of scikit-image fails
    first = public_tasks.main([str(tmp_path / "a")])
    second = public_tasks.main([str(tmp_path / "b")])
    assert set(first) == set(public_tasks.TASKS)
    for task in public_tasks.TASKS:
        assert first[task]["sha256_of_files"] == second[task]["sha256_of_files"], task
    photos = first["photos"]
    assert sorted(photos["photos"]) == ["china", "flower", "grace_hopper"]
    assert [photos[s]["rows"] for s in ("train", "validation", "test")] == [1200, 300, 300]
    assert sorted(p.name for p in (tmp_path / "a" / "photos" / "test").iterdir()) == ["china", "flower", "grace_hopper"]
    source = (tmp_path / "a" / "photos" / "SOURCE.md").read_text()
    assert source.count("CC BY 2.0") >= 2 and "public domain" in source
    # a rebuild replaces its own earlier build (a stale class folder would be a class); a folder it did not
    # build is refused
    (tmp_path / "a" / "photos" / "train" / "stale").mkdir()
    public_tasks.main([str(tmp_path / "a"), "--tasks", "photos"])
    assert not (tmp_path / "a" / "photos" / "train" / "stale").exists()
    (tmp_path / "c" / "photos").mkdir(parents=True)
    (tmp_path / "c" / "photos" / "mine.txt").write_text("x")
    with pytest.raises(SystemExit, match="did not build"):
        public_tasks.main([str(tmp_path / "c"), "--tasks", "photos"])


def test_rt_few_is_a_small_balanced_draw_of_the_reviews_that_the_search_benchmark_reads(tmp_path):
    """The generic recipe's small set: 500 / 300 sentences of rotten_tomatoes' own train / validation,
    half of each polarity, and its whole test split; the search benchmark's task names these files."""
    import csv
    import os
    import sys

    from benchmarks.search_vs_defaults import REGISTRY, TASKS, data_settings

    sys.path.insert(0, str(BUILDER.parent))
    try:
        import public_tasks
    finally:
        sys.path.remove(str(BUILDER.parent))
    manifest = public_tasks.main([str(tmp_path), "--tasks", "rt_few"])["rt_few"]
    assert [manifest[s]["rows"] for s in ("train", "validation", "test")] == [500, 300, 1066]
    assert manifest["train"]["labels"] == {0: 250, 1: 250} and manifest["validation"]["labels"] == {0: 150, 1: 150}
    source = BUILDER.parents[1] / "data" / "rotten_tomatoes"
    for split in ("train", "validation"):
        own = {r["text"] for r in csv.DictReader((source / f"{split}.csv").open(encoding="utf-8"))}
        drawn = [json.loads(line)["text"] for line in (tmp_path / "rt_few" / f"{split}.jsonl").open(encoding="utf-8")]
        assert len(set(drawn)) == len(drawn) and set(drawn) <= own
    keys = [s.split("=", 1) for s in data_settings(REGISTRY["few_reviews"], tmp_path)]
    assert [k for k, _ in keys] == ["train_file", "validation_file", "test_file"] and TASKS["few_reviews"] == "accuracy"
    assert all((BUILDER.parents[1] / v).is_file() or os.path.isfile(v) for _, v in keys)


def test_keep_others_replaces_the_rerun_rows_and_says_where_the_others_come_from(tmp_path):
    """--keep-others: the tasks run now replace theirs, the others keep their figures with the command and date
    that measured them (the table says so); a report from another machine, or none, is refused first."""
    def row(key, wall):
        return {"key": key, "task": BY_NAME[key].name, "kind": BY_NAME[key].kind, "data": "d", "recipe": "r",
                "command": "c", "exit_status": 0, "wall_s": wall, "settings": {}, "test": {}, "test_baseline": {},
                "learned": {"verdict": True}, "load_before": [0.1, 0.1, 0.1], "quiet": True}  # fmt: skip

    machine = {"cpu": "this CPU", "cpu_count": 2, "torch_threads": 2, "torch": "t", "transformers": "t",
               "accelerate": "a", "gpu": None}  # fmt: skip
    old = {"invocation": "python -m benchmarks.expected_results --out x", "date": "2026-11-20", "machine": machine,
           "smoke": False, "tasks": [row("single_sentence", 1.0), row("tagging", 2.0)]}  # fmt: skip
    new = {**old, "invocation": "... --tasks tagging --keep-others", "date": "2026-11-26", "tasks": [row("tagging", 3.0)]}
    with pytest.raises(UserError, match="does not exist"):
        earlier_report(tmp_path, new)
    (tmp_path / "expected_results.json").write_text(json.dumps(old))
    with pytest.raises(UserError, match="another machine"):
        earlier_report(tmp_path, {**new, "machine": {**machine, "cpu": "another CPU"}})
    rows = kept_rows(earlier_report(tmp_path, new), new)
    assert [(r["key"], r["wall_s"], r.get("measured_by")) for r in rows] == [
        ("single_sentence", 1.0, ["python -m benchmarks.expected_results --out x", "2026-11-20"]), ("tagging", 3.0, None)]
    table = markdown({**new, "tasks": rows})
    assert "- single sentence: `python -m benchmarks.expected_results --out x`; 2026-11-20." in table
    assert "tagging: `" not in table.split("Rows kept")[1]


@pytest.mark.slow  # ~25 s: builds the photos task, then runs two tiny models on it
def test_the_photo_rows_run_in_smoke_mode_each_with_a_model_of_its_kind(tmp_path):
    """The photos rows, each with its own --smoke settings: the ViT row a tiny ViT, the EfficientNet row a tiny
    EfficientNet from config in place of the bundled one (the image modality's ViT clashes with its
    freeze_layers=8), both on every sample (the photos' first 64 are one class, which max_train_samples would
    keep)."""
    out, data = tmp_path / "out", tmp_path / "data"
    report = main(["--smoke", "--out", str(out), "--data", str(data), "--tasks", "photos", "pretrained_photos"])
    rows = {row["key"]: row for row in report["tasks"]}
    for key in ("photos", "pretrained_photos"):
        assert rows[key]["exit_status"] == 0, rows[key].get("error")
        assert rows[key]["optimizer_steps"] == 4 and rows[key]["test"]["num_samples"] == 300
    assert rows["pretrained_photos"]["model"]["from config"]["model_type"] == "efficientnet"
    assert rows["pretrained_photos"]["recipe"] == "finetune/configs/efficientnet_photos.yaml"
    assert "model_config" not in rows["pretrained_photos"]["command"]  # the command a user types: the recipe's model
