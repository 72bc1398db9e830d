"""finetune/export.py: the end of a run. The curves and the model card, the best checkpoint exported
with load_best_model_at_end, and an export cut short that does not look finished.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_export.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_text_args, user_error

import finetune.export as export
from finetune.run import main


def test_an_export_cut_short_does_not_look_finished(small_text_data, tmp_path, monkeypatch, capsys):
    def broken_card(*args, **kwargs):
        raise RuntimeError("killed")  # as a kill in the middle of the export

    monkeypatch.setattr(export, "write_model_card", broken_card)
    out = tmp_path / "cut"
    with pytest.raises(RuntimeError, match="killed"):
        main(tiny_text_args(small_text_data, out, "max_steps=1"))
    # Nothing of the export is left (it is written aside and moved into place whole), no results.json
    assert not (out / "model").exists() and not (out / "results.json").exists()
    assert not (out / ".export-new").exists() and not (out / ".export-old").exists()
    monkeypatch.undo()
    user_error(capsys, main, tiny_text_args(small_text_data, out, "max_steps=2"), "already holds a started run",
               rule="runs.output_dir_holds_a_run")  # fmt: skip


def test_run_writes_curves_and_a_model_card(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=3", "per_device_train_batch_size=8"))
    png = (out / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    card = (out / "model" / "README.md").read_text()
    assert card.startswith("---") and "pipeline_tag: text-classification" in card
    assert "pipeline(" in card


@pytest.mark.slow
@pytest.mark.parametrize("load_best", [True, False])
def test_load_best_model_at_end_exports_the_best_checkpoint(small_text_data, tmp_path, capsys, load_best):
    """An evaluation (and, with load_best_model_at_end, a checkpoint) every 2 steps. The best is the
    HIGHEST validation loss (greater_is_better=true), so that it comes early while training lowers
    the loss: the export is that checkpoint's weights, and says so; without the setting, the last."""
    from safetensors.torch import load_file

    from finetune import checkpoint as ckpt

    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "num_train_epochs=6", "per_device_train_batch_size=8",
                        "eval_steps=2", "save_steps=2", "save_total_limit=null", "learning_rate=5e-3",
                        "metric_for_best_model=loss", "greater_is_better=true",
                        f"load_best_model_at_end={str(load_best).lower()}"))  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    best, last = results["best"], results["step"]
    evals = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line
    ]
    assert best["value"] == max(e["eval_loss"] for e in evals)
    exported = load_file(out / "model" / "model.safetensors")
    console = capsys.readouterr().out
    if load_best and best["step"] != last:
        weights = load_file(Path(best["path"]) / "model.safetensors")
        assert all(torch.equal(exported[k], weights[k]) for k in weights)
        assert results["exported"]["step"] == best["step"]
        assert results["validation"]["loss"] == pytest.approx(best["value"], abs=1e-6)
        assert f"the best checkpoint, step {best['step']}, by validation loss" in console
        assert "These weights are the best checkpoint" in (out / "model" / "README.md").read_text()
    else:
        last_weights = load_file(ckpt.list_checkpoints(out)[-1] / "model.safetensors")
        assert all(torch.equal(exported[k], last_weights[k]) for k in last_weights)
        assert results["exported"]["step"] == last and f"(the last step, {last}" in console
    assert best["step"] != last  # the setting above overfits: the test covers the interesting case
