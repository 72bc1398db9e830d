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
from conftest import (
    REPO,
    TINY_VIT,
    launch_runs,
    rotten_rows,
    tiny_text_args,
    user_error,
    write_csv,
    write_jsonl,
)
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
            # Augmentation on: its draws are seeded by (seed, epoch, row) (finetune/images.py), so FSDP equals
            # DDP and a resumed run, FSDP's or DDP's, equals the uninterrupted one, flips and crops included.
            "random_flip=true", "augment=[crop,color,trivial]"]  # fmt: skip


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory) -> dict:
    """ONE launch of accelerate_configs/fsdp.yaml with 2 processes on the CPU, which runs, for tiny
    BERT and tiny ViT (with image augmentation): FSDP with checkpoints every 2 steps; FSDP resumed from
    its step-2 checkpoint; the same processes as plain DDP; then a DDP checkpoint resumed under FSDP
    (refused), ViT's DDP run resumed under DDP, and load_best_model_at_end under FSDP.
    (tests/multi_run_worker.py says why one launch runs nine.)

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
    ddp_first = root / "{}_ddp" / "checkpoints" / "step-00000002"
    runs += [
        # A DDP checkpoint resumed under FSDP: refused in one line that names how each saved the state.
        {"name": "bert_ddp_under_fsdp", "fsdp": True, "expect_error": True,
         "argv": _argv("bert", text, root / "bert_ddp_under_fsdp", f"resume_from_checkpoint={str(ddp_first).format('bert')}")},
        # The images' augmentation resumed under 2-process DDP (FSDP's resume above has it too).
        {"name": "vit_ddp_resumed", "fsdp": False,
         "argv": _argv("vit", text, root / "vit_ddp_resumed", f"resume_from_checkpoint={str(ddp_first).format('vit')}")},
        # load_best_model_at_end under FSDP: the best checkpoint, saved by these processes, loaded by them
        # (accelerate #3896: load_state right after save_state with sharded state dicts). The "best" is the
        # highest loss, so that it is an earlier checkpoint than the last step's.
        {"name": "bert_fsdp_best", "fsdp": True,
         "argv": _argv("bert", text, root / "bert_fsdp_best", "load_best_model_at_end=true", "eval_steps=2",
                       "metric_for_best_model=loss", "greater_is_better=true", "save_total_limit=null")},
    ]  # fmt: skip
    # Question answering (windows of contexts, uneven over the processes) and texts read whole in windows.
    from test_question_answering import _rows, qa_args
    from test_text_windows import _documents, window_args

    qa = {"train": write_jsonl(root / "qa_train.jsonl", _rows("train", 23)),
          "validation": write_jsonl(root / "qa_validation.jsonl", _rows("validation", 11))}
    long = {"train": write_csv(root / "long_train.csv", _documents(13, 0)),
            "validation": write_csv(root / "long_validation.csv", _documents(7, 2000))}
    for kind, args, data in (("qa", qa_args, qa), ("windows", window_args, long)):
        runs += [{"name": f"{kind}_{engine}", "fsdp": engine == "fsdp",
                  "argv": args(data, root / f"{kind}_{engine}", "per_device_train_batch_size=2",
                               "gradient_accumulation_steps=2", "num_train_epochs=1", "max_grad_norm=null")}
                 for engine in ("fsdp", "ddp")]  # fmt: skip
    # The bundled EfficientNet's architecture (tiny), BatchNorm frozen as the photos recipe has it.
    from conftest import image_folder, save_tiny_efficientnet
    from test_efficientnet import _args as photo_args

    tiny, photos = save_tiny_efficientnet(root / "tiny-efficientnet", ("a", "b", "c")), image_folder(root / "photos", 3, 6)
    runs += [{"name": f"effnet_{engine}", "fsdp": engine == "fsdp", "expect_error": engine == "fsdp",
              "argv": photo_args(tiny, photos, root / f"effnet_{engine}", "per_device_train_batch_size=2",
                                 "max_grad_norm=null")}
             for engine in ("fsdp", "ddp")]  # fmt: skip
    records, output = launch_runs(REPO / "accelerate_configs/fsdp.yaml", runs, root,
                                  env={"FINETUNE_TEST_FSDP_ON_CPU": "1"})  # fmt: skip
    return {"root": root, "output": output, "records": records}


def _export(root: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(root / name / "model" / "model.safetensors")


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
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
    assert "returned a view tensor" not in fsdp_runs["output"]  # torch's FSDP2 warning, of no use to a run here


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
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


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
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


# --- resumes across topologies, merged shards, the best checkpoint loaded back -----------------------------


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
def test_a_ddp_checkpoint_resumed_under_fsdp_is_one_line(fsdp_runs):
    error = fsdp_runs["records"][("bert_ddp_under_fsdp", 0)]["error"]
    assert error.startswith("the checkpoint holds its state whole (one process or DDP); this run uses FSDP: resume "
                            "it with a non-FSDP accelerate config and 2 process(es)"), error  # fmt: skip
    assert not (fsdp_runs["root"] / "bert_ddp_under_fsdp").exists()  # refused before anything was written


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
def test_an_fsdp_checkpoint_resumed_by_one_process_is_one_line(fsdp_runs, tmp_path, capsys):
    root = fsdp_runs["root"]
    first = root / "bert_fsdp" / "checkpoints" / "step-00000002"
    text = {"train": root / "train.csv", "validation": root / "validation.csv"}
    line = user_error(capsys, run.main, _argv("bert", text, tmp_path / "one", f"resume_from_checkpoint={first}"))
    assert "the checkpoint holds its state sharded by FSDP over 2 processes; this run does not use FSDP: resume it " \
           "with the FSDP accelerate config (accelerate_configs/fsdp.yaml) and 2 process(es)" in line  # fmt: skip
    assert not (tmp_path / "one").exists()


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
def test_image_augmentation_resumes_exactly_under_ddp(fsdp_runs):
    root = fsdp_runs["root"]
    whole, resumed = _export(root, "vit_ddp"), _export(root, "vit_ddp_resumed")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
def test_load_best_model_at_end_under_fsdp_loads_the_best_sharded_checkpoint(fsdp_runs):
    """Saved and loaded back by the same FSDP processes (accelerate #3896): the export is the best step's
    weights, and its validation loss is the one that made it best."""
    results = json.loads((fsdp_runs["root"] / "bert_fsdp_best" / "results.json").read_text())
    best = results["best"]
    assert results["exported"]["step"] == best["step"] < results["step"], results["exported"]
    assert results["validation"]["loss"] == pytest.approx(best["value"], abs=1e-6)


@pytest.mark.slow  # the module's FSDP and DDP launches: ~25 s
def test_evaluating_an_fsdp_checkpoint_merges_its_shards_and_gives_the_export_s_loss(fsdp_runs, tmp_path):
    """evaluate_checkpoint on a training-state checkpoint of sharded state, in one process: the shards are
    merged with Accelerate's merge_fsdp_weights; the loss is the export's (the best step's, exported)."""
    from finetune.evaluate_checkpoint import main as evaluate

    out = fsdp_runs["root"] / "bert_fsdp_best"
    results = json.loads((out / "results.json").read_text())
    checkpoint = out / "checkpoints" / f"step-{results['exported']['step']:08d}"
    assert (checkpoint / "pytorch_model_fsdp_0").is_dir() and not (checkpoint / "model.safetensors").exists()
    of_checkpoint = evaluate([str(checkpoint), "--output", str(tmp_path / "checkpoint")])
    of_export = evaluate([str(out / "model"), "--output", str(tmp_path / "export")])
    assert of_checkpoint["num_samples"] == of_export["num_samples"] == 13
    assert of_checkpoint["loss"] == pytest.approx(of_export["loss"], abs=1e-5)
    assert of_export["loss"] == pytest.approx(results["validation"]["loss"], abs=1e-5)


@pytest.mark.slow  # the module's FSDP and DDP launches
@pytest.mark.parametrize(("kind", "metric", "questions"), [("qa", "f1", 11), ("windows", "accuracy", 7)])
def test_question_answering_and_windowed_texts_under_fsdp_equal_ddp_and_score_each_once(fsdp_runs, kind, metric,
                                                                                          questions):  # fmt: skip
    """Windows split unevenly over 2 processes: FSDP's weights equal DDP's within 1e-5 (QA's weights that
    shift every token's score alike aside: their gradient is float noise, test_question_answering.py), and
    validation scores each question or text once, with the same score."""
    from test_question_answering import SHIFTS

    root = fsdp_runs["root"]
    fsdp, ddp = _export(root, f"{kind}_fsdp"), _export(root, f"{kind}_ddp")
    assert fsdp.keys() == ddp.keys()
    skip = SHIFTS if kind == "qa" else set()
    worst = max((fsdp[k] - ddp[k]).abs().max().item() for k in fsdp if k not in skip)
    assert worst < 1e-5, f"{kind}: FSDP differs from DDP by {worst:.2e}"
    scored = [json.loads((root / f"{kind}_{r}" / "results.json").read_text())["validation"] for r in ("fsdp", "ddp")]
    assert scored[0]["num_samples"] == scored[1]["num_samples"] == questions
    assert scored[0][metric] == pytest.approx(scored[1][metric], abs=1e-9)


@pytest.mark.slow  # the module's FSDP and DDP launches
def test_efficientnet_with_frozen_batchnorm_under_ddp_equals_one_big_batch_and_fsdp_is_refused(fsdp_runs, tmp_path):
    """The photos recipe's network (tiny), BatchNorm frozen: 2 processes x 2 under DDP end with the weights of
    one process taking batches of 4, within 1e-5, and score the same validation. FSDP, which Accelerate
    cannot apply to a model without input embeddings, is one line, before anything is written."""
    from conftest import save_tiny_efficientnet
    from test_efficientnet import _args as photo_args

    root = fsdp_runs["root"]
    tiny = save_tiny_efficientnet(tmp_path / "tiny-efficientnet", ("a", "b", "c"))  # the same seed: the same weights
    run.main(photo_args(tiny, root / "photos", tmp_path / "one", "per_device_train_batch_size=4", "max_grad_norm=null"))
    one, ddp = load_file(tmp_path / "one" / "model" / "model.safetensors"), _export(root, "effnet_ddp")
    assert ddp.keys() == one.keys()
    worst = max((ddp[k].float() - one[k].float()).abs().max().item() for k in one)
    assert worst < 1e-5, f"EfficientNet under DDP differs from one big batch by {worst:.2e}"
    scored = [json.loads((out / "results.json").read_text())["validation"] for out in (root / "effnet_ddp", tmp_path / "one")]
    assert scored[0]["accuracy"] == scored[1]["accuracy"]
    refused = fsdp_runs["records"][("effnet_fsdp", 0)]
    assert refused["rule"] == "launch.fsdp_without_input_embeddings"
    assert refused["error"].startswith("FSDP cannot shard EfficientNetForImageClassification"), refused["error"]
    assert not (root / "effnet_fsdp").exists()
