"""FSDP settings the app chooses on its own; the real FSDP path needs a GPU (Accelerate runs FSDP only
there) and was run on an H100 (README, "On a GPU")."""

from __future__ import annotations

import types

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from conftest import REPO, tiny_text_args, user_error
from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification

import finetune.run as run
import finetune.runtime as runtime


def _fake_accelerator(plugin):
    return types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin))


def _tiny(kind: str):
    if kind == "bert":
        config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=37)  # fmt: skip
        return AutoModelForSequenceClassification.from_config(config)
    config = AutoConfig.for_model("vit", image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=37)  # fmt: skip
    return AutoModelForImageClassification.from_config(config)


@pytest.mark.parametrize("kind, layer", [("bert", "BertLayer"), ("vit", "ViTLayer")])
def test_fsdp_units_leave_out_the_block_holding_the_input_embeddings(kind, layer):
    """Accelerate would shard the embeddings block and then the input embeddings inside it again,
    which fully_shard refuses ("Invariant encountered"); the app wraps the layers only."""
    model = _tiny(kind)
    assert any("Embeddings" in name for name in model._no_split_modules)  # what Accelerate would wrap
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    runtime.configure_fsdp(_fake_accelerator(plugin), model)
    assert plugin.transformer_cls_names_to_wrap == [layer]
    # a class list written in the accelerate config is used as written
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Custom"]
    )
    runtime.configure_fsdp(_fake_accelerator(plugin), model)
    assert plugin.transformer_cls_names_to_wrap == ["Custom"]


def test_fsdp_asked_for_where_it_cannot_run_is_an_error(small_text_data, tmp_path, monkeypatch, capsys):
    """The launcher sets ACCELERATE_USE_FSDP for an FSDP config; on a CPU Accelerate would run
    without FSDP, so the app stops with one line instead of training as something else."""
    if torch.cuda.is_available():
        pytest.skip("the CPU case")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    out = tmp_path / "run"
    assert "asks for FSDP" in user_error(
        capsys, run.main, tiny_text_args(small_text_data, out, "max_steps=2")
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "device, task, setting, expected",
    [
        ("cuda", "text-classification", None, 2),
        ("cpu", "text-classification", None, 0),
        ("cuda", "image-classification", None, 0),
        ("cpu", "text-classification", 3, 3),
    ],
)
def test_data_workers_default(device, task, setting, expected):
    cfg = types.SimpleNamespace(dataloader_num_workers=setting, task=task)
    accelerator = types.SimpleNamespace(device=torch.device(device))
    assert runtime.data_workers(cfg, accelerator) == expected


def test_finetune_launch_refuses_fsdp_with_cpu(capsys):
    """`accelerate launch --cpu` drops an FSDP config's FSDP and its processes without a word."""
    from finetune.launch import main as launch_main

    argv = [
        "--config_file",
        str(REPO / "accelerate_configs/fsdp.yaml"),
        "--cpu",
        str(REPO / "finetune/run.py"),
    ]
    assert "asks for FSDP" in user_error(capsys, launch_main, argv)
