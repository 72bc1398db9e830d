"""LoRA through peft (finetune/lora.py): only the adapters and the head train; the export is an ordinary
merged model that pipeline() loads; a resume is exact; accumulation (and DDP, slow) equal one big batch."""

from __future__ import annotations

import shutil

import pytest
from conftest import launch, tiny_text_args, user_error
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.config import TrainConfig
from finetune.errors import UserError
from finetune.evaluate_checkpoint import main as evaluate_main
from finetune.run import main

pytest.importorskip("peft")

LORA = "peft={r: 4, alpha: 8, target_modules: [query, value]}"
# 2 layers x (query, value) x (A: 4 x 32 + B: 32 x 4), and the head (32 x 2 + 2).
LORA_TRAINED = 2 * 2 * (4 * 32 + 32 * 4) + 32 * 2 + 2


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_lora_trains_the_adapters_and_exports_a_merged_model(small_text_data, tmp_path, capsys):
    from transformers import pipeline

    out = tmp_path / "run"
    results = main(tiny_text_args(small_text_data, out, LORA, "per_device_train_batch_size=8", "num_train_epochs=1",
                                  "learning_rate=1e-2", "save_steps=5"))  # fmt: skip
    printed = capsys.readouterr().out
    assert "BertForSequenceClassification, train 37" in printed
    assert f"{LORA_TRAINED:,} of 996,718 weights trained (LoRA r=4 and the head)" in printed
    exported = load_file(out / "model" / "model.safetensors")
    assert not [k for k in exported if "lora" in k or "base_model" in k or "modules_to_save" in k]
    assert "classifier.weight" in exported
    # The merged export and the training-state checkpoint (adapters put back, then merged) score the same.
    for path in (out / "model", out / "checkpoints" / "step-00000005"):
        evaluated = evaluate_main([str(path)])
        assert evaluated["accuracy"] == results["validation"]["accuracy"], path
        assert evaluated["loss"] == pytest.approx(results["validation"]["loss"], abs=1e-5), path
    [answer] = pipeline("text-classification", model=str(out / "model"))(["a gorgeous , witty movie ."])
    assert answer["label"] in ("0", "1")


def test_lora_resume_is_exact(small_text_data, tmp_path):
    """LoRA's own dropout on: the resume also restores the RNG."""
    args = [LORA.replace("target_modules", "dropout: 0.1, target_modules"), "num_train_epochs=1",
            "per_device_train_batch_size=4", "save_steps=3", "save_total_limit=null"]  # fmt: skip
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    main(tiny_text_args(small_text_data, full, *args))
    first = ckpt.list_checkpoints(full)[0]
    shutil.copytree(first, resumed / ckpt.CHECKPOINTS / first.name)
    main(tiny_text_args(small_text_data, resumed, *args, "resume_from_checkpoint=latest"))
    worst = _worst(
        load_file(full / "model" / "model.safetensors"), load_file(resumed / "model" / "model.safetensors")
    )
    assert worst <= 1e-6, f"resumed LoRA weights differ by {worst:.2e}"


def _lora_run(data, out, processes: int, batch: int, accumulation: int) -> dict:
    args = tiny_text_args(data, out, LORA, f"per_device_train_batch_size={batch}",
                          f"gradient_accumulation_steps={accumulation}", "num_train_epochs=1", "max_grad_norm=null",
                          "learning_rate=1e-2")  # fmt: skip
    if processes == 1:
        main(args)
    else:
        result = launch(args, num_processes=processes)
        assert result.returncode == 0, result.stderr[-3000:]
    return load_file(out / "model" / "model.safetensors")


def test_lora_accumulation_equals_one_big_batch(small_text_data, tmp_path):
    reference = _lora_run(small_text_data, tmp_path / "a", 1, 8, 1)
    worst = _worst(_lora_run(small_text_data, tmp_path / "b", 1, 2, 4), reference)
    assert worst < 1e-5, f"LoRA with accumulation differs from one big batch by {worst:.2e}"


@pytest.mark.slow  # a launch of 2 processes
def test_lora_ddp_equals_one_big_batch(small_text_data, tmp_path):
    reference = _lora_run(small_text_data, tmp_path / "a", 1, 8, 1)
    worst = _worst(_lora_run(small_text_data, tmp_path / "d", 2, 2, 2), reference)
    assert worst < 1e-5, f"LoRA under DDP differs from one big batch by {worst:.2e}"


def test_unknown_target_modules_are_one_line(small_text_data, tmp_path, capsys):
    line = user_error(
        capsys, main, tiny_text_args(small_text_data, tmp_path / "out", "peft.target_modules=[q_proj]")
    )
    assert "peft.target_modules ['q_proj'] are not linear layers of BertForSequenceClassification" in line
    assert "its linear layers are: dense, key, query, value" in line


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"rank": 8},
            r"peft: unknown key\(s\) \['rank'\]; LoRA's settings are r, alpha, dropout, target_modules",
        ),
        ({"r": 0}, "peft.r must be a positive integer"),
        ({"dropout": 1.0}, r"peft.dropout must be in \[0, 1\)"),
        ({"target_modules": []}, "peft.target_modules must be a list of module names"),
    ],
)
def test_bad_peft_settings(spec, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(model_config={"model_type": "bert"}, train_file="x.csv", peft=spec)


def test_peft_defaults_are_filled_in_and_saved():
    cfg = TrainConfig(model_config={"model_type": "bert"}, train_file="x.csv", peft={"r": 16})
    assert cfg.peft == {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": ["query", "value"]}
