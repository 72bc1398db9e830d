"""Evaluating a training-state checkpoint of a model fine-tuned from pretrained weights: the model is
rebuilt from its config, so transformers prints no load report about a "newly initialized" head, and
the metrics are those the run recorded at that step.

    python -m pytest tests/test_evaluate_pretrained.py -q
"""

from __future__ import annotations

import json

import pytest
from accelerate.state import AcceleratorState, GradientState
from conftest import TOKENIZER, rotten_rows, tiny_text_args, write_csv
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForMaskedLM
from transformers.utils import logging

from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import main as train

# What transformers' load report says of weights the checkpoint lacks or does not use.
LOAD_REPORT = ("newly initialized", "MISSING", "UNEXPECTED", "LOAD REPORT", "were not initialized")


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """A tiny masked-LM BERT saved as a 'pretrained' folder (no classification head, an MLM head the
    classifier does not use), fine-tuned for 2 optimizer steps: evaluated and saved at step 2."""
    root = tmp_path_factory.mktemp("pretrained")
    base = root / "tiny-bert-mlm"
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    BertForMaskedLM(config).save_pretrained(base)
    AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(base)
    data = {
        "train": write_csv(root / "train.csv", rotten_rows(37)),
        "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100)),
    }
    out = root / "run"
    train(
        tiny_text_args(
            data,
            out,
            "model_config=null",
            f"model_name_or_path={base}",
            "tokenizer_name=null",
            "max_steps=2",
            "save_steps=2",
            "per_device_train_batch_size=8",
        )
    )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return {"base": base, "checkpoint": out / "checkpoints" / "step-00000002"}


@pytest.fixture
def transformers_log(caplog):
    """What transformers logs, in caplog: its loggers do not propagate to the root logger, where caplog
    listens, and their handler holds the stderr of the moment transformers was imported."""
    logging.enable_propagation()
    caplog.set_level("WARNING", logger="transformers")  # what a user sees
    yield caplog
    logging.disable_propagation()


def test_checkpoint_loads_without_a_load_report_and_gives_the_recorded_metrics(
    pretrained_run, transformers_log, capsys
):
    transformers_log.clear()
    capsys.readouterr()
    # log_level=warning: transformers' warnings shown (the default, error, would hide a report anyway)
    result = evaluate([str(pretrained_run["checkpoint"]), "--split", "validation", "log_level=warning"])
    out, err = capsys.readouterr()
    printed = out + err + transformers_log.text
    for text in LOAD_REPORT:
        assert text not in printed, printed[-3000:]
    assert "validation: accuracy" in out

    recorded = json.loads((pretrained_run["checkpoint"] / "manifest.json").read_text())["metrics"]
    assert result["num_samples"] == recorded["num_samples"] == 13
    assert result["confusion_matrix"] == recorded["confusion_matrix"]
    assert result["accuracy"] == recorded["accuracy"] and result["macro_f1"] == recorded["macro_f1"]
    assert result["loss"] == pytest.approx(recorded["loss"], abs=1e-6)  # another batch order, same rows

    # The check can see a report: loading the pretrained folder as a classifier logs one.
    AutoModelForSequenceClassification.from_pretrained(pretrained_run["base"])
    assert "MISSING" in transformers_log.text and "newly initialized" in transformers_log.text
