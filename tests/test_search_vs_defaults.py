"""The search-against-defaults benchmark's smoke run: the multi-label task (built from UNER) through the
recipe's default command and through finetune.search, each in a fresh process with a tiny BERT from
config for a few steps; the report's structure, no figures asserted."""

from __future__ import annotations

import json

import pytest

from benchmarks.search_vs_defaults import main
from finetune.runtime import native_bf16


@pytest.mark.slow
def test_smoke_run_writes_the_report(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    report = main(["--smoke", "--out", str(out), "--data", str(data), "--tasks", "multi_label"])
    assert json.loads((out / "search_vs_defaults.json").read_text()) == json.loads(json.dumps(report, default=str))
    (row,) = report["tasks"]
    defaults, search = row["defaults"], row["search"]
    assert defaults["exit_status"] == 0, defaults.get("error")
    assert search["exit_status"] == 0, search.get("error")
    # the commands a user types: the recipe with the data keys alone, then the search with the same budget
    config = "cpu_bf16.yaml" if native_bf16() else "cpu.yaml"  # bf16 only where this CPU has it natively
    assert defaults["command"].startswith(f"accelerate launch --config_file accelerate_configs/{config} "
                                          "finetune/run.py --config finetune/configs/bert_multi_label.yaml")  # fmt: skip
    assert "num_train_epochs" not in defaults["command"] and "model_config" not in defaults["command"]
    assert " -m finetune.search --config finetune/configs/bert_multi_label.yaml --budget " in search["command"]
    assert search["budget_s"] >= defaults["wall_s"] and search["wall_s"] > 0
    record = search["search"]
    assert record["trials"] == 1 and {"pruned", "cut_at_budget", "seconds", "params"} <= set(record)
    for run in (defaults, search):  # validation at the tuned threshold (the recipe tunes one), and test
        assert run["validation_at"] == "tuned threshold"
        assert 0 <= run["validation"]["micro_f1"] <= 1 and run["test"]["num_samples"] == 32
    # the other way to spend the budget: the same command with the recipe's training times the factor
    longer = row["defaults_longer"]
    assert longer["exit_status"] == 0, longer.get("error")
    assert longer["command"] == defaults["command"] + " max_steps=8"  # the smoke run's 4 steps, times 2
    assert longer["optimizer_steps"] == 2 * defaults["optimizer_steps"] == 8
    assert longer["validation_at"] == "tuned threshold" and longer["test"]["num_samples"] == 32
    assert row["quiet"] in (True, False) and len(row["load_before"]) == 3 and len(row["load_after"]) == 3
    assert report["data"]["uner_entity_types"]["sha256_of_files"]
    table = (out / "search_vs_defaults.md").read_text()
    assert "| task | metric | defaults: validation / test |" in table and "| multi-label (" in table
    assert "| defaults given the budget: validation / test |" in table and "max_steps=8`" in table
