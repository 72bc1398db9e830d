"""FSDP: the settings the app chooses on its own, and the real FSDP path run by two CPU processes.

    python -m pytest tests/test_fsdp.py -q

The two-process tests run Accelerate's own FSDP2 path (fully_shard, DTensor parameters, sharded
save_state/load_state, get_state_dict, clip_grad_norm_) on CPU tensors over gloo; it was also run on
an H100 with one process (README, "On a GPU").
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from conftest import REPO, TINY_VIT, launch_runs, rotten_rows, tiny_text_args, user_error, write_csv
from safetensors.torch import load_file
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


# --- the real FSDP path on two CPU processes --------------------------------------------------------

MAX_GRAD_NORM = 0.1  # below the tiny models' gradient norms (0.3-0.6), so clipping acts
RUNS = ("fsdp", "fsdp_resumed", "ddp")


def _argv(kind: str, data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    common = ("num_train_epochs=1", "per_device_train_batch_size=4", "save_steps=2",
              f"max_grad_norm={MAX_GRAD_NORM}", *extra)  # fmt: skip
    if kind == "bert":
        return tiny_text_args(data, out, *common)
    return ["--config", str(REPO / "finetune/configs/vit_fashion_mnist.yaml"), f"model_config={TINY_VIT}",
            "max_train_samples=37", "max_eval_samples=13", "test_file=null", "learning_rate=1e-3",
            "warmup_ratio=0.2", "logging_steps=1", f"output_dir={out}", *common,
            # The flip draws from Python's `random`, whose state Accelerate saves after its data loader
            # has already fetched the next batch (it reads one ahead): a resumed run flips other images,
            # with or without FSDP. Off here, so that the resume checks FSDP's part exactly.
            "random_flip=false"]  # fmt: skip


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory) -> dict:
    """ONE launch of accelerate_configs/fsdp.yaml with 2 processes on the CPU, which runs, for tiny
    BERT and tiny ViT: FSDP with checkpoints every 2 steps; FSDP resumed from its step-2 checkpoint;
    the same processes as plain DDP. (tests/multi_run_worker.py says why one launch runs six.)

    How FSDP runs on a CPU: Accelerate makes a group FSDP only where it found an accelerator, and
    without one the app refuses the FSDP config (tested above). FINETUNE_TEST_FSDP_ON_CPU=1, a test
    hook in finetune/runtime.py (`_promote_cpu_group_to_fsdp`), builds the gloo CPU group as for
    cpu_ddp.yaml and records it as MULTI_GPU, the state Accelerate starts from on GPUs, so Accelerate's
    own FSDP branch takes it from there. Chosen over calling torch's `fully_shard` directly because
    what needs testing is the app's path through Accelerate: its wrapping (with the app's unit
    classes), sharded checkpoints, the full state dict for the export, DTensor-aware clipping.
    """
    root = tmp_path_factory.mktemp("fsdp")
    text = {"train": write_csv(root / "train.csv", rotten_rows(37)),
            "validation": write_csv(root / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    runs = []
    for kind in ("bert", "vit"):
        first = root / f"{kind}_fsdp" / "checkpoints" / "step-00000002"
        runs += [
            {"name": f"{kind}_fsdp", "fsdp": True, "argv": _argv(kind, text, root / f"{kind}_fsdp")},
            {"name": f"{kind}_fsdp_resumed", "fsdp": True,
             "argv": _argv(kind, text, root / f"{kind}_fsdp_resumed", f"resume_from_checkpoint={first}")},
            {"name": f"{kind}_ddp", "fsdp": False, "argv": _argv(kind, text, root / f"{kind}_ddp")},
        ]  # fmt: skip
    records, output = launch_runs(REPO / "accelerate_configs/fsdp.yaml", runs, root,
                                  env={"FINETUNE_TEST_FSDP_ON_CPU": "1"})  # fmt: skip
    return {"root": root, "output": output, "records": records}


def _export(root: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(root / name / "model" / "model.safetensors")


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_fsdp_on_two_cpu_processes_shards_every_parameter(fsdp_runs, kind):
    records = fsdp_runs["records"]
    for rank in (0, 1):
        fsdp, ddp = records[(f"{kind}_fsdp", rank)], records[(f"{kind}_ddp", rank)]
        assert DistributedType(fsdp["distributed_type"]) == DistributedType.FSDP
        assert DistributedType(ddp["distributed_type"]) == DistributedType.MULTI_CPU
        assert fsdp["params"].keys() == ddp["params"].keys()
        for name, p in fsdp["params"].items():
            assert p["class"] == "DTensor" and p["placements"] == ["Shard(dim=0)"], (name, p)
            rows = p["shape"][0]
            mine = math.ceil(rows / 2) if rank == 0 else rows - math.ceil(rows / 2)  # torch.chunk's split
            assert p["local_shape"] == [mine, *p["shape"][1:]], (name, p)
            assert ddp["params"][name]["class"] == "Parameter"
            assert ddp["params"][name]["local_shape"] == p["shape"]  # DDP: every process holds it all
    held = [sum(math.prod(p["local_shape"]) for p in records[(f"{kind}_fsdp", r)]["params"].values())
            for r in (0, 1)]  # fmt: skip
    total = sum(math.prod(p["shape"]) for p in records[(f"{kind}_fsdp", 0)]["params"].values())
    assert sum(held) == total and max(held) < 0.55 * total  # halves, less the odd rows' remainders
    # The start summary says so.
    assert f"this process holds {held[0]:,} of {total:,} weights" in fsdp_runs["output"]
    assert "FSDP2 (full sharding, ZeRO-3) over 2 processes" in fsdp_runs["output"]
    layer = {"bert": "BertLayer x2", "vit": "ViTLayer x2"}[kind]
    assert layer in fsdp_runs["output"]


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_fsdp_checkpoint_is_sharded_and_resumes_exactly(fsdp_runs, kind):
    root = fsdp_runs["root"]
    first = root / f"{kind}_fsdp" / "checkpoints" / "step-00000002"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        # one file per process, and torch.distributed.checkpoint's index
        files = sorted(p.name for p in (first / part).iterdir())
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (first / "model.safetensors").exists()
    whole, resumed = _export(root, f"{kind}_fsdp"), _export(root, f"{kind}_fsdp_resumed")
    assert whole.keys() == resumed.keys()
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
    steps = [json.loads(line)["step"] for line in (root / f"{kind}_fsdp_resumed" / "metrics.jsonl")
             .read_text().splitlines() if '"loss"' in line]  # fmt: skip
    assert steps == [3, 4, 5]  # it went on from step 2, it did not start again


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_fsdp_equals_ddp_and_exports_one_device_model(fsdp_runs, kind):
    root, records = fsdp_runs["root"], fsdp_runs["records"]
    fsdp, ddp = _export(root, f"{kind}_fsdp"), _export(root, f"{kind}_ddp")
    assert fsdp.keys() == ddp.keys()
    worst = max((fsdp[k] - ddp[k]).abs().max().item() for k in fsdp)
    assert worst < 1e-5, f"FSDP export differs from DDP by {worst:.2e}"
    # Clipping acted (norms above max_grad_norm) and FSDP's DTensor-aware norm equals DDP's.
    norms_fsdp, norms_ddp = (records[(f"{kind}_{r}", 0)]["grad_norms"] for r in ("fsdp", "ddp"))
    assert len(norms_fsdp) == len(norms_ddp) == 5
    assert max(norms_fsdp) > MAX_GRAD_NORM
    assert norms_fsdp == pytest.approx(norms_ddp, rel=0, abs=1e-5)
    # The metrics of the evaluation on sharded parameters equal DDP's.
    results = [json.loads((root / f"{kind}_{r}" / "results.json").read_text()) for r in ("fsdp", "ddp")]
    assert results[0]["validation"]["accuracy"] == results[1]["validation"]["accuracy"]
    assert results[0]["validation"]["loss"] == pytest.approx(results[1]["validation"]["loss"], abs=1e-5)
    # The export is an ordinary model on one device.
    auto = AutoModelForSequenceClassification if kind == "bert" else AutoModelForImageClassification
    model = auto.from_pretrained(root / f"{kind}_fsdp" / "model")
    assert {type(p).__name__ for p in model.parameters()} == {"Parameter"}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
