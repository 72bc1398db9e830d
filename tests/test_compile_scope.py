"""The compile-scope benchmark's smoke run: the full-data recipe with a tiny BERT from config, compiled
whole (the app) and region by region (accelerate's regional compilation), each in a fresh process; the
report's structure, and that the two scopes really differ: no figures asserted."""

from __future__ import annotations

import json

import pytest

from benchmarks.compile_scope import main


@pytest.mark.slow
def test_smoke_run_writes_the_report_for_both_scopes(tmp_path):
    report = main(["--smoke", "--steps", "3", "--precision", "no", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "compile_scope.json").read_text()) == report
    whole, regional = report["rows"]
    assert (whole["scope"], regional["scope"]) == ("whole", "regional")
    for row in (whole, regional):
        assert row["shapes"]["length_buckets"] and row["shapes"]["graphs_compiled_after_warm_up"] == 0
        assert row["seconds"]["compile"] > 0 and 0 <= row["test_accuracy"] <= 1
    # regional compilation compiles each region apart: more graphs than the model compiled whole
    assert regional["shapes"]["graphs_compiled_in_warm_up"] > whole["shapes"]["graphs_compiled_in_warm_up"] > 0
    assert "| whole |" in (tmp_path / "compile_scope.md").read_text()
