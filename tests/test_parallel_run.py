"""Model parallelism composes with accumulation, checkpoints, exact resume, evaluation, DDP and LoRA."""

from __future__ import annotations

import json
import shutil

import pytest
from accelerate.utils import DistributedType
from conftest import REPO, launch_runs, tiny_text_args
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.run import main

SPLIT = ("model_parallel=true", "devices=cpu,cpu", "pipeline_chunks=2", "adam_epsilon=1e-6")
COMMON = ("num_train_epochs=1", "per_device_train_batch_size=4", "gradient_accumulation_steps=2", "save_steps=2")


def _weights(out):
    return load_file(out / "model" / "model.safetensors")


def _worst(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.slow
def test_split_with_accumulation_equals_unsplit_and_resumes_exactly(small_text_data, tmp_path):
    plain, split, resumed = tmp_path / "plain", tmp_path / "split", tmp_path / "resumed"
    main(tiny_text_args(small_text_data, plain, *COMMON, "adam_epsilon=1e-6"))
    results = main(tiny_text_args(small_text_data, split, *COMMON, *SPLIT))
    assert _worst(_weights(plain), _weights(split)) < 1e-5
    assert results["validation"]["num_samples"] == 13

    # Resume the split run from its first checkpoint: the same end as without the interruption.
    first = ckpt.list_checkpoints(split)[0]
    (resumed / ckpt.CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(first, resumed / ckpt.CHECKPOINTS / first.name)
    main(tiny_text_args(small_text_data, resumed, *COMMON, *SPLIT, "resume_from_checkpoint=latest"))
    assert _worst(_weights(split), _weights(resumed)) <= 1e-6

    # The export is an ordinary single-device model.
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(split / "model")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert not hasattr(model, "hf_device_map") or len(set(model.hf_device_map.values())) == 1


@pytest.mark.slow
def test_lora_split_over_two_devices_equals_unsplit_lora(small_text_data, tmp_path, capsys, monkeypatch):
    """LoRA, then the split of the model inside peft's wrapper: the adapters go with their layers. The
    same losses, merged export and adapter as the unsplit LoRA run, within 1e-5."""
    pytest.importorskip("peft")
    import finetune.parallel as parallel

    split_models, parallel_apply = [], parallel.apply_model_parallel

    def apply_and_keep(model, plan):
        split_models.append(parallel_apply(model, plan))
        return split_models[-1]

    monkeypatch.setattr("finetune.run.apply_model_parallel", apply_and_keep)  # run.py's name for it
    lora = ("peft={r: 4, alpha: 8, target_modules: [query, value]}", "learning_rate=1e-2")
    plain, split = tmp_path / "plain", tmp_path / "split"
    main(tiny_text_args(small_text_data, plain, *COMMON, *lora, "adam_epsilon=1e-6"))
    capsys.readouterr()
    main(tiny_text_args(small_text_data, split, *COMMON, *SPLIT, *lora))
    printed = capsys.readouterr().out
    assert "1,090 of 996,718 weights trained (LoRA r=4 and the head)" in printed
    assert "layer split into 2 stages in one process: cpu (" in printed
    [model] = split_models
    assert type(model).__name__ == "BertForSequenceClassification"  # the model inside peft's wrapper
    assert model.mp_state.total_handoffs > 0  # peft's forward went through the split's hooks
    assert _worst(_weights(plain), _weights(split)) < 1e-5
    assert _losses(split) == pytest.approx(_losses(plain), rel=0, abs=1e-5)
    adapters = [load_file(out / "adapter" / "adapter_model.safetensors") for out in (plain, split)]
    assert _worst(*adapters) < 1e-5
    lora_b = [t for k, t in adapters[1].items() if "lora_B" in k]
    assert len(lora_b) == 4 and min(t.abs().max().item() for t in lora_b) > 0  # B starts at 0: they trained


def _losses(out) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if '"loss"' in line]


@pytest.mark.slow
def test_ddp_x_layer_split_from_its_config_equals_one_unsplit_process(small_text_data, tmp_path):
    """accelerate_configs/ddp_model_parallel.yaml, run: 2 processes (DDP over gloo), each splitting its
    replica over `cpu,cpu` with 2 pipelined chunks, trains to the weights and losses of one unsplit
    process with the same global batch (8 = 2 x 4), within 1e-5. On a CPU both stages are one device,
    so DDP sees a one-device module; the multi-GPU case (DDP's device_ids=None over several GPUs) is
    not run here."""
    common = ("num_train_epochs=1", "adam_epsilon=1e-6", "max_grad_norm=0.1")
    plain, hybrid = tmp_path / "plain", tmp_path / "hybrid"
    main(tiny_text_args(small_text_data, plain, *common, "per_device_train_batch_size=8"))
    runs = [{"name": "hybrid", "fsdp": False, "argv": tiny_text_args(
        small_text_data, hybrid, *common, "per_device_train_batch_size=4", "model_parallel=true",
        "devices=cpu,cpu", "pipeline_chunks=2")}]  # fmt: skip
    records, output = launch_runs(REPO / "accelerate_configs/ddp_model_parallel.yaml", runs, tmp_path)
    for rank in (0, 1):
        r = records[("hybrid", rank)]
        assert DistributedType(r["distributed_type"]) == DistributedType.MULTI_CPU and r["num_processes"] == 2
        assert r["wrapper"] == "DistributedDataParallel" and r["device_ids"] is None  # Accelerate's bypass
        assert [s["device"] for s in r["stages"]] == ["cpu", "cpu"]
        assert r["stages"][0]["blocks"][0] == "embeddings" and r["stages"][1]["blocks"][-1] == "head"
        assert r["handoffs"] > 0  # every process ran its own split
    assert "layer split into 2 stages in each of 2 processes (DDP x layer split)" in output
    assert _worst(_weights(plain), _weights(hybrid)) < 1e-5
    assert _losses(hybrid) == pytest.approx(_losses(plain), rel=0, abs=1e-5)
    assert len(_losses(plain)) == 5
