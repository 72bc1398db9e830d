"""The NER peer benchmark's smoke run: tiny BERTs from config on a slice of the tagging recipe's data,
the app's loop and run_ner_no_trainer's, each with its test-F1 curve; and the two scorings of word
predictions it reports. No timing or F1 figures asserted."""

from __future__ import annotations

import json

import pytest

from benchmarks.ner_peer import main, scores, time_to


@pytest.mark.slow
def test_smoke_run_writes_both_curves_the_table_and_the_plot(tmp_path):
    report = main(["--smoke", "--precision", "no", "--no-command", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "ner_peer.json").read_text()) == json.loads(json.dumps(report, default=str))
    (app,), peer = report["app"]["runs"], report["peer"]
    for curve in (app["curve"], peer["curve"]):
        seconds = [p["seconds"] for p in curve]
        assert seconds == sorted(seconds) and seconds[0] > 0
        assert all(0 <= p["f1"] <= 1 and 0 <= p["f1_strict"] <= 1 for p in curve)
    # every word of the test slice is scored once by both loops, at every point
    words = {p["words"] for p in app["curve"] + peer["curve"]}
    assert len(words) == 1 and words.pop() > 0
    assert app["curve"][-1]["step"] == app["optimizer_steps"] and peer["curve"][-1]["step"] == peer["optimizer_steps"]
    # the target is the peer's best F1 and the time it got there; the ratio is peer seconds / app seconds
    best = max(peer["curve"], key=lambda p: p["f1"])
    assert report["target"]["f1"] == best["f1"]
    if app["time_to_target_s"] is not None:
        assert app["ratio"] == report["target"]["peer_seconds"] / app["time_to_target_s"]
    assert (tmp_path / "ner_peer.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "time to the peer's best (s)" in (tmp_path / "ner_peer.md").read_text()


def test_the_peer_metric_starts_an_entity_at_a_stray_i_tag_and_strict_iob2_does_not():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    stray = [["B-PER", "I-PER", "O", "I-LOC"]]  # an I-LOC after O
    scored = scores(stray, gold)
    assert scored["words"] == 4
    assert scored["f1"] == 1.0  # conlleval's default: the I-LOC starts the LOC entity
    assert scored["f1_strict"] == 2 / 3  # strict IOB2: no LOC entity predicted (P 1/1, R 1/2)


def test_time_to_the_target_is_the_first_point_at_or_above_it():
    curve = [{"seconds": 1.0, "f1": 0.3}, {"seconds": 2.0, "f1": 0.5}, {"seconds": 3.0, "f1": 0.6}]
    assert time_to(curve, 0.5) == 2.0 and time_to(curve, 0.7) is None


def test_the_app_curve_thins_out_past_its_dense_seconds(monkeypatch):
    """--app-dense-s: a point every --app-eval-steps while the clock is at or below it, every
    --app-eval-steps-after past it, and always at the last step."""
    from types import SimpleNamespace

    from benchmarks.ner_peer import TestCurve

    curve = TestCurve(2, gold=[], dense_s=10.0, then_every=6)
    curve.mark("prepared", SimpleNamespace(plan=SimpleNamespace(total_steps=21)))
    scored: list[int] = []
    monkeypatch.setattr(curve, "score", scored.append)
    for step in range(1, 22):
        monkeypatch.setattr(curve, "now", lambda step=step: float(step))  # one second a step
        curve.mark("step", step)
    assert scored == [2, 4, 6, 8, 10, 12, 18, 21]
    dense = TestCurve(2, gold=[])  # no dense_s: every 2nd step throughout
    dense.mark("prepared", SimpleNamespace(plan=SimpleNamespace(total_steps=7)))
    monkeypatch.setattr(dense, "score", scored.append)
    scored.clear()
    for step in range(1, 8):
        dense.mark("step", step)
    assert scored == [2, 4, 6, 7]
