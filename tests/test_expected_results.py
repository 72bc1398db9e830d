"""The expected-results benchmark's smoke run: one built task (multi-label, from UNER) through the real
command with a tiny BERT from config for a few steps; the report's structure, no figures asserted. And
the task builder: deterministic, from the bundled data alone."""

from __future__ import annotations

import json

from benchmarks.expected_results import BY_NAME, main


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
    assert row["command"].startswith(
        "accelerate launch --config_file accelerate_configs/cpu_bf16.yaml finetune/run.py"
    )
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
