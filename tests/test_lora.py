"""LoRA through peft (finetune/lora.py): only the adapters and the head train; the export is an ordinary
merged model that pipeline() loads, and the adapter alone is saved beside it in peft's format; a resume is
exact; accumulation (and DDP, slow) equal one big batch."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch
from conftest import launch, save_tiny_bert, tiny_text_args, user_error
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.config import config_from_dict
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
    # The adapter alone is no whole model: the line names the export beside it.
    user_error(capsys, evaluate_main, [str(out / "adapter")], "is a run's LoRA adapter, not a whole model",
                   str(out / "model"))  # fmt: skip


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft asks transformers
@pytest.mark.parametrize("base", ["model_config", "pretrained"])
def test_the_adapter_alone_on_the_base_model_equals_the_merged_export(small_text_data, tmp_path, base):
    """<output_dir>/adapter is peft's own format: put back on the model the run started from, it gives the
    export's logits. A base built from model_config is rebuilt from the export's config.json with the
    run's seed (as run.py builds it); a pretrained one (here a tiny BertModel saved without a head) is
    loaded with the export's config and another seed: the new head comes from the adapter."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    out, extra = tmp_path / "run", []
    if base == "pretrained":
        save_tiny_bert(tmp_path / "base", model_class="BertModel", tokenizer=False, seed=0)
        extra = ["model_config=null", f"model_name_or_path={tmp_path / 'base'}"]
    results = main(tiny_text_args(small_text_data, out, LORA, "per_device_train_batch_size=8", "num_train_epochs=1",
                                  "learning_rate=1e-2", "seed=7", *extra))  # fmt: skip
    adapter = out / "adapter"
    assert results["adapter_dir"] == str(adapter)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    saved = load_file(adapter / "adapter_model.safetensors")
    assert sum(t.numel() for t in saved.values()) == LORA_TRAINED  # the adapters and the head, nothing frozen
    assert "base_model.model.classifier.weight" in saved
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in adapter.iterdir()} == {0o666 & ~umask}  # as the export's files

    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    inputs = tokenizer(["a gorgeous , witty movie .", "dull and far too long", "the best film of the year"],
                       padding=True, return_tensors="pt")  # fmt: skip
    config = AutoConfig.from_pretrained(out / "model")
    if base == "model_config":
        torch.manual_seed(7)
        started = AutoModelForSequenceClassification.from_config(config)
    else:
        torch.manual_seed(8)
        started = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base", config=config)
    merged = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    with torch.no_grad():
        before, expected = started.eval()(**inputs).logits, merged(**inputs).logits
        got = PeftModel.from_pretrained(started, adapter).eval()(**inputs).logits
    assert (before - expected).abs().max() > 1e-3  # the adapters changed the model...
    assert (got - expected).abs().max() < 1e-5  # ...and the adapter alone carries that change
    if base == "pretrained":
        return

    # An overwrite by a run without LoRA leaves no adapter of the earlier run beside its model.
    results = main(tiny_text_args(small_text_data, out, "max_steps=1", "overwrite_output_dir=true"))
    assert not adapter.exists() and "adapter_dir" not in results
    assert not (out / ".previous-run").exists()


@pytest.mark.slow
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


@pytest.mark.slow
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
        capsys, main, tiny_text_args(small_text_data, tmp_path / "out", "peft.target_modules=[q_proj]"),
        rule="models.lora_target_unknown",
    )
    assert "peft.target_modules ['q_proj'] are not linear layers of BertForSequenceClassification" in line
    assert "its linear layers are: dense, key, query, value" in line
    line = user_error(capsys, main, tiny_text_args(small_text_data, tmp_path / "out", "peft.target_modules=[classifier]"),
                      rule="models.lora_target_head")  # fmt: skip
    assert "the classification head is trained whole beside the adapters, so it takes no adapter" in line


def test_a_rank_above_the_width_of_the_adapted_layers_is_one_line():
    """peft.r past the layers' width trains more weights than the model has and adds no rank."""
    import transformers
    from conftest import tiny_bert_config

    from finetune.lora import apply_lora

    model = transformers.BertForSequenceClassification(tiny_bert_config())
    width = model.config.hidden_size
    with pytest.raises(UserError, match=rf"peft.r={width + 1} is above the width of the layers LoRA adapts "
                                        rf"\({width}: query, value\).* at most {width}") as e:  # fmt: skip
        apply_lora(model, {"r": width + 1})
    assert e.value.rule == "models.lora_rank_above_width"
    assert apply_lora(model, {"r": width}) is not None


def test_a_model_without_query_and_value_layers_needs_target_modules(monkeypatch):
    """target_modules unset on a model whose linear layers have no name LoRA's default knows: it names them."""
    from finetune.lora import apply_lora

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with pytest.raises(UserError, match=r"peft.target_modules: Sequential has no query/value layers of a known name; "
                                        r"set peft.target_modules=\[...\] from its linear layers: 0, 2") as e:  # fmt: skip
        apply_lora(model, {"r": 2})
    assert e.value.rule == "models.lora_no_query_value"
    monkeypatch.setitem(sys.modules, "peft", None)  # not installed: its import fails
    with pytest.raises(UserError, match=r"peft \(LoRA\) is not installed: pip install peft") as e:
        apply_lora(model, {"r": 2})
    assert e.value.rule == "models.peft_missing"


@pytest.mark.parametrize(
    ("spec", "message", "rule"),
    [
        (
            {"rank": 8},
            r"peft: unknown key\(s\) \['rank'\]; LoRA's settings are r, alpha, dropout, target_modules",
            "settings.peft_unknown_key",
        ),
        ({"r": 0}, "peft.r must be a positive integer", "settings.peft_value"),
        ({"dropout": 1.0}, r"peft.dropout must be in \[0, 1\)", "settings.peft_value"),
        ({"target_modules": []}, "peft.target_modules must be a list of module names", "settings.peft_value"),
    ],
)
def test_bad_peft_settings(spec, message, rule):
    with pytest.raises(UserError, match=message) as e:
        config_from_dict({"model_config": {"model_type": "bert"}, "train_file": "x.csv", "peft": spec})
    assert e.value.rule == rule


def test_peft_defaults_are_filled_in_and_saved():
    cfg = config_from_dict({"model_config": {"model_type": "bert"}, "train_file": "x.csv", "peft": {"r": 16}})
    assert cfg.peft == {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": None}


@pytest.mark.parametrize(("config", "names"), [("bert", ["query", "value"]), ("vit", ["q_proj", "v_proj"])])
def test_unset_target_modules_are_the_models_query_and_value_layers(config, names):
    """BERT's attention names them query/value, ViT's (transformers 5) q_proj/v_proj: the default fits both."""
    from conftest import tiny_bert_config, tiny_vit_config
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    from finetune.lora import apply_lora

    if config == "bert":
        model = AutoModelForSequenceClassification.from_config(tiny_bert_config(num_labels=2))
    else:
        model = AutoModelForImageClassification.from_config(tiny_vit_config(num_labels=2))
    wrapped = apply_lora(model, {"r": 4})
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in wrapped.named_parameters() if ".lora_A" in n}
    assert adapted == set(names)
