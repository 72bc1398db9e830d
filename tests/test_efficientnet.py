"""A pretrained BatchNorm backbone (EfficientNet, as the bundled data/efficientnet_lite0) through the app, on a
tiny EfficientNet saved as a model folder (tests/conftest.py): a new head, training, resume, the export in
`pipeline()`, evaluation, and what BatchNorm does to "one big batch = accumulation" (frozen: equal).

    HF_HUB_OFFLINE=1 python -m pytest -q -n 0 tests/test_efficientnet.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO, image_folder, user_error
from safetensors.torch import load_file

from finetune.config import CONFIGS_DIR, load_config
from finetune.run import main

RECIPE = str(CONFIGS_DIR / "efficientnet_photos.yaml")


def _args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """The photos recipe on `model` (a tiny EfficientNet folder: 2 blocks, none frozen) and an image folder, batch 4."""
    return ["--config", RECIPE, f"model_name_or_path={model}", f"data_dir={data}", "per_device_train_batch_size=4", "freeze_layers=0",
            "per_device_eval_batch_size=8", "num_train_epochs=2", "logging_steps=1", "augment=[]",
            "random_flip=false", "validation_split_percentage=34", f"output_dir={out}", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """18 grayscale 28x28 Fashion-MNIST images of 3 classes (converted to RGB for the model)."""
    return image_folder(tmp_path_factory.mktemp("photos"), classes=3, per_class=6)


def _bn_buffers(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.endswith(("running_mean", "running_var"))}


def test_the_recipe_fine_tunes_the_bundled_backbone():
    """The photos recipe starts from the bundled EfficientNet-Lite0 with BatchNorm frozen; its folder holds
    weights, config, image processor and SOURCE.md (origin, licence)."""
    cfg = load_config(RECIPE)
    assert Path(cfg.model_name_or_path) == REPO / "data" / "efficientnet_lite0"
    assert cfg.model_config is None and cfg.freeze_batchnorm and cfg.freeze_layers == 8
    names = {p.name for p in (REPO / "data" / "efficientnet_lite0").iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "SOURCE.md"} <= names
    assert "Apache-2.0" in (REPO / "data" / "efficientnet_lite0" / "SOURCE.md").read_text()


@pytest.mark.parametrize("frozen", [True, False])
def test_training_a_new_head_and_the_export_in_a_pipeline(frozen, tiny_efficientnet_folder, photos, tmp_path):
    """A new head for the data's 3 classes (the folder's own head has 5), trained end to end; the
    export classifies an image in transformers' `pipeline`. Frozen BatchNorm keeps the loaded running
    statistics exactly; unfrozen, training updates them."""
    from transformers import pipeline

    out = tmp_path / "run"
    main(_args(tiny_efficientnet_folder, photos, out, f"freeze_batchnorm={str(frozen).lower()}"))
    exported = load_file(out / "model" / "model.safetensors")
    loaded = load_file(tiny_efficientnet_folder / "model.safetensors")
    same = [torch.equal(v, loaded[k]) for k, v in _bn_buffers(exported).items()]
    assert same and all(same) == frozen and (any(same) is False or frozen)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["EfficientNetForImageClassification"]
    assert sorted(config["id2label"].values()) == ["0_tshirt_top", "1_trouser", "2_pullover"]
    classify = pipeline("image-classification", model=str(out / "model"))
    png = next((photos / "train" / "1_trouser").iterdir())
    assert {p["label"] for p in classify(str(png), top_k=3)} == {"0_tshirt_top", "1_trouser", "2_pullover"}


def _train(model: Path, data: Path, out: Path, *extra: str) -> dict:
    main(_args(model, data, out, "max_grad_norm=null", *extra))
    return load_file(out / "model" / "model.safetensors")


def _worst(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a if not k.endswith("num_batches_tracked"))


def test_batchnorm_frozen_makes_accumulation_equal_one_big_batch(tiny_efficientnet_folder, photos, tmp_path):
    """Frozen BatchNorm: batch 8 and batch 2 x 4 accumulation train the same weights (within 1e-5). Not
    frozen, each micro-batch normalises by its own statistics: the two differ, by design (docs/topologies.md)."""
    big, acc = (("per_device_train_batch_size=8",), ("per_device_train_batch_size=2", "gradient_accumulation_steps=4"))
    frozen = [_train(tiny_efficientnet_folder, photos, tmp_path / f"f{i}", "freeze_batchnorm=true", *a)
              for i, a in enumerate((big, acc))]  # fmt: skip
    assert _worst(*frozen) < 1e-5
    assert _worst(frozen[0], load_file(tiny_efficientnet_folder / "model.safetensors") | {
        k: v for k, v in frozen[0].items() if k.startswith("classifier")}) > 1e-4  # training moved the weights
    live = [_train(tiny_efficientnet_folder, photos, tmp_path / f"l{i}", "freeze_batchnorm=false", *a)
            for i, a in enumerate((big, acc))]  # fmt: skip
    assert _worst(*live) > 1e-4


@pytest.mark.parametrize("frozen", [True, False])
def test_a_resume_is_bit_exact(frozen, tiny_efficientnet_folder, photos, tmp_path):
    """A run resumed mid-way (running statistics and the crop and flip draws included) trains the weights and
    BatchNorm buffers of the uninterrupted one, bit for bit."""
    args = ("save_steps=2", "save_total_limit=null", "random_flip=true", "augment=[crop]",
            f"freeze_batchnorm={str(frozen).lower()}")  # fmt: skip
    main(_args(tiny_efficientnet_folder, photos, tmp_path / "full", *args))
    first = sorted((tmp_path / "full" / "checkpoints").iterdir())[0]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    main(_args(tiny_efficientnet_folder, photos, resumed, *args, "resume_from_checkpoint=latest"))
    a, b = load_file(tmp_path / "full" / "model" / "model.safetensors"), load_file(resumed / "model" / "model.safetensors")
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) == 0.0


def test_batchnorm_settings_refused_where_they_cannot_act(capsys, tiny_efficientnet_folder, photos, tmp_path):
    """sync_batchnorm on a CPU (torch's SyncBatchNorm runs on GPUs only): one line that says what to do."""
    user_error(capsys, main, _args(tiny_efficientnet_folder, photos, tmp_path / "o", "sync_batchnorm=true",
                                   "freeze_batchnorm=false"),
               "sync_batchnorm=true needs GPUs", rule="launch.sync_batchnorm_on_cpu")  # fmt: skip


@pytest.mark.parametrize("frozen", [False, True])
def test_verify_says_which_equalities_a_batchnorm_model_keeps(frozen, tiny_efficientnet_folder, tmp_path, capsys):
    """`finetune.verify` on a BatchNorm model: live statistics, accumulation differs by design and says why
    (exit 0, not a failure); frozen, every variant agrees within 1e-5."""
    from finetune import verify

    data = image_folder(tmp_path / "photos", classes=3, per_class=14)
    argv = ["--config", RECIPE, f"model_name_or_path={tiny_efficientnet_folder}", f"data_dir={data}",
            "per_device_train_batch_size=8", "augment=[]", "validation_split_percentage=20", "freeze_layers=0",
            f"freeze_batchnorm={str(frozen).lower()}"]  # fmt: skip
    assert verify.main(argv) == 0
    printed = capsys.readouterr().out
    if frozen:
        assert "OK: every variant agrees with one big batch within 1e-05" in printed
    else:
        assert "differs by design" in printed
        assert "note: accumulation is not expected to equal one big batch: BatchNorm normalises each micro-batch " \
               "of 4 by its own statistics (freeze_batchnorm=true makes it equal)" in printed
        assert "OK: accumulation differs by design (BatchNorm)" in printed


def test_lora_on_its_convolutions_and_every_checkpoint_kind_evaluates(tiny_efficientnet_folder, photos, tmp_path):
    """LoRA (peft's Conv2d) on the blocks' pointwise convolutions by default; the training-state checkpoint
    (adapters put back, then merged) and the merged export evaluate to the run's own last validation score."""
    from finetune.evaluate_checkpoint import main as evaluate

    out = tmp_path / "run"
    results = main(_args(tiny_efficientnet_folder, photos, out, "peft.r=4", "save_steps=6"))
    assert (out / "adapter" / "adapter_config.json").exists()
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["expand_conv", "project_conv"]
    checkpoint = sorted((out / "checkpoints").iterdir())[-1]
    for target in (checkpoint, out / "model"):
        record = json.loads(Path(evaluate([str(target), "--split", "validation"])["metrics_file"]).read_text())
        assert record["accuracy"] == pytest.approx(results["validation"]["accuracy"])


def test_the_layer_split_refuses_in_one_line_and_freeze_layers_freezes_the_stem_and_first_blocks(
        capsys, tiny_efficientnet_folder, photos, tmp_path):  # fmt: skip
    """The layer split knows BERT-like encoders only: for EfficientNet, one line. freeze_layers=1 freezes
    its stem and first block (they end as they began), the rest trains; past its 2 blocks, one line."""
    from safetensors.torch import load_file

    user_error(capsys, main, _args(tiny_efficientnet_folder, photos, tmp_path / "a", "model_parallel=true",
                                   "devices=cpu,cpu"), "cannot split EfficientNetForImageClassification")  # fmt: skip
    main(_args(tiny_efficientnet_folder, photos, tmp_path / "b", "freeze_layers=1"))
    before = load_file(tiny_efficientnet_folder / "model.safetensors")
    after = load_file(tmp_path / "b" / "model" / "model.safetensors")
    weights = [k for k in before if k in after and not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    frozen = [k for k in weights if k.startswith(("efficientnet.embeddings.", "efficientnet.encoder.blocks.0."))]
    trained = [k for k in weights if k.startswith("efficientnet.encoder.blocks.1.")]
    assert frozen and trained
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in trained)
    user_error(capsys, main, _args(tiny_efficientnet_folder, photos, tmp_path / "c", "freeze_layers=3"),
               "freeze_layers", rule="models.freeze_layers_past_the_model")


@pytest.mark.slow  # about 90 s of compilation on 2 cores
def test_torch_compile_trains_it(tiny_efficientnet_folder, photos, tmp_path):
    """torch_compile=true: every shape compiled in the warm-up, none after it."""
    results = main(_args(tiny_efficientnet_folder, photos, tmp_path / "run", "torch_compile=true"))
    assert results["shapes"]["graphs_compiled_after_warm_up"] == 0


def test_image_size_trades_size_for_time_and_the_export_keeps_it(tiny_efficientnet_folder, photos, tmp_path):
    """image_size=48: training and the export's processor resize to 48x48 (a convolutional model takes any
    size), so pipeline() sees what training saw."""
    out = tmp_path / "run"
    main(_args(tiny_efficientnet_folder, photos, out, "image_size=48"))
    saved = json.loads((out / "model" / "preprocessor_config.json").read_text())
    assert saved["size"] == {"height": 48, "width": 48}


def test_image_size_of_a_vit_is_refused(capsys, tmp_path):
    """A ViT takes only the size its position embeddings were built for: image_size is refused in one line."""
    from conftest import tiny_image_args

    data = image_folder(tmp_path / "img", classes=2, per_class=6)
    user_error(capsys, main, tiny_image_args(data, tmp_path / "o", "image_size=48", "validation_split_percentage=34"),
               "image_size=48: ViT cuts images into patches", rule="models.image_size_of_a_patch_model")  # fmt: skip


def test_an_image_size_below_what_the_convolutions_take_is_refused(tiny_efficientnet_folder, photos, tmp_path, capsys):
    """The bundled EfficientNet halves an image 5 times (its stem and four stride-2 stages): image_size=24 left a
    kernel larger than the map and the first batch raised a traceback from torch; now one line with the least
    size, 32, before anything is written. The tiny EfficientNet (one stride-2 block) takes 4, and trains at it."""
    user_error(capsys, main, ["--config", RECIPE, f"data_dir={photos}", "image_size=24", "validation_split_percentage=34",
                              f"output_dir={tmp_path / 'o'}"],
               "image_size=24 is below the 32 pixels EfficientNet takes", "set image_size=32 or more",
               rule="models.image_size_below_the_convolutions")  # fmt: skip
    assert not (tmp_path / "o").exists()
    user_error(capsys, main, _args(tiny_efficientnet_folder, photos, tmp_path / "tiny", "image_size=3"),
               "image_size=3 is below the 4 pixels", rule="models.image_size_below_the_convolutions")  # fmt: skip
    results = main(_args(tiny_efficientnet_folder, photos, tmp_path / "tiny", "image_size=4", "max_steps=1"))
    assert results["step"] == 1


def test_a_held_out_share_without_a_photo_of_each_class_is_refused(tiny_efficientnet_folder, photos, tmp_path, capsys):
    """3 classes of 6 photos and no validation/ folder: the default 10% holds out 2 photos, fewer than the classes.
    The line was datasets' stratification error (scikit-learn's words) first; now the app's, with what to do, and
    the share it names trains."""
    user_error(capsys, main, _args(tiny_efficientnet_folder, photos, tmp_path / "run", "validation_split_percentage=10"),
               "validation_split_percentage=10 holds out 2 of the 18 training images, fewer than the 3 classes",
               f"add a validation/ folder beside {photos}/train/", "or set validation_split_percentage=12 or more",
               untouched=photos)  # fmt: skip
    assert not (tmp_path / "run").exists()
    results = main(_args(tiny_efficientnet_folder, photos, tmp_path / "run", "validation_split_percentage=12",
                         "max_steps=1"))  # fmt: skip
    assert results["step"] == 1


def test_an_image_size_whose_one_batch_cannot_fit_in_memory_is_refused(tiny_efficientnet_folder, photos, tmp_path,
                                                                       capsys):  # fmt: skip
    """image_size=100000 was killed for memory at the first batch, without a line: now refused with the estimate
    before any data or model is read. Sizes a machine trains at are never refused: 1024 at batch 16 (and the
    recipe's evaluation batch of 64) on a machine of 4 GiB."""
    import types

    from finetune.checks import settings

    user_error(capsys, main, _args(tiny_efficientnet_folder, photos, tmp_path / "run", "image_size=100000"),
               "image_size=100000: one batch of 8 images of 100000x100000 pixels (per_device_eval_batch_size=8) needs "
               "at least 1,788.1 GiB for its pixels alone", "leave image_size out",
               rule="settings.image_batch_beyond_memory")  # fmt: skip
    assert not (tmp_path / "run").exists()
    fits = types.SimpleNamespace(image_size=1024, per_device_train_batch_size=16, per_device_eval_batch_size=64)
    assert settings.image_batch_beyond_memory(fits, 4 * 2**30) is None
    assert settings.image_batch_beyond_memory(types.SimpleNamespace(**{**vars(fits), "image_size": 4096}), 4 * 2**30)
