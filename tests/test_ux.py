"""What a user sees around a run: dry run, early stop, dropout override, curves and model card."""

from __future__ import annotations

import json
import os
import types
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import REPO, launch, tiny_text_args

from finetune.config import load_config
from finetune.run import main


def test_dry_run_prints_the_plan_and_writes_nothing(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    plan = main(
        tiny_text_args(
            small_text_data,
            out,
            "--dry-run",
            "per_device_train_batch_size=4",
            "gradient_accumulation_steps=3",
            "num_train_epochs=2",
            "lr_scheduler_type=linear",
        )
    )
    # 37 samples / batch 4 = 10 batches; 3 accumulation steps -> 4 optimizer steps an epoch.
    assert plan["optimizer_steps_per_epoch"] == 4 and plan["total_optimizer_steps"] == 8
    assert plan["global_batch_size"] == 12 and plan["warmup_steps"] == 2  # ceil(0.2 * 8)
    assert plan["first_learning_rate"] == 0.0
    assert plan["last_learning_rate"] == pytest.approx(1e-3 * (8 - 7) / (8 - 2))
    printed = capsys.readouterr().out
    assert "total_optimizer_steps" in printed and "last_learning_rate" in printed
    assert not out.exists()


def test_early_stopping_stops_when_the_metric_stalls(small_text_data, tmp_path):
    out = tmp_path / "run"
    # A learning rate of ~0 keeps accuracy flat: evaluation 1 sets the best, 2 and 3 do not improve.
    results = main(
        tiny_text_args(
            small_text_data,
            out,
            "per_device_train_batch_size=4",
            "num_train_epochs=3",
            "eval_steps=1",
            "early_stopping_patience=2",
            "learning_rate=1e-12",
        )
    )
    assert results["step"] == 3  # not the 30 planned steps


def test_dropout_override_reaches_the_model(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=1", "dropout=0.3"))
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["hidden_dropout_prob"] == 0.3 and config["attention_probs_dropout_prob"] == 0.3


def test_run_writes_curves_and_a_model_card(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=3", "per_device_train_batch_size=8"))
    png = (out / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    card = (out / "model" / "README.md").read_text()
    assert card.startswith("---") and "pipeline_tag: text-classification" in card
    assert "pipeline(" in card


def _cores() -> int:
    from finetune.runtime import available_cores

    return available_cores()


@pytest.mark.skipif(_cores() < 2, reason="needs 2 or more cores")
def test_accelerate_launch_on_cpu_uses_every_core_unless_told(small_text_data, tmp_path):
    """`accelerate launch` gives a CPU process OMP_NUM_THREADS=1; the app takes its share of the cores
    (one process: all of them; two: half each), and `cpu_threads=N` is obeyed."""

    def threads(result) -> list[int]:
        assert result.returncode == 0, result.stderr[-2000:]
        return [
            int(line.split()[-1]) for line in result.stdout.splitlines() if line.startswith("cpu_threads")
        ]

    args = tiny_text_args(small_text_data, tmp_path / "o", "--dry-run")
    env = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}  # on the CPU also where a GPU exists
    assert threads(launch(args, env=env)) == [_cores()]
    assert threads(launch([*args, "cpu_threads=1"], env=env)) == [1]
    assert threads(launch(args, num_processes=2, env=env)) == [max(1, _cores() // 2)]  # main process prints


def test_help_lists_every_setting_with_type_default_help_and_the_recipes_value(capsys):
    import dataclasses

    from finetune.config import TrainConfig
    from finetune.run import main

    with pytest.raises(SystemExit) as stop:
        main(["--config", str(REPO / "finetune/configs/vit_fashion_mnist.yaml"), "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert f"  {f.name}: " in out and f.metadata["help"] in out, f.name
    assert "  learning_rate: float = 5e-05" in out
    assert (
        "task: token-classification | image-classification | text-classification | null = null    "
        "(recipe: image-classification)"
        in out
    )
    assert out.index("\ndata:\n") < out.index("  train_file:") < out.index("\noptimisation:\n")
    from finetune.metrics import PROBLEMS

    metric_help = out[out.index("  metric_for_best_model:") :].split("\n  greater_is_better")[0]
    flat = " ".join(metric_help.split())
    assert all(f"{p}: {', '.join(m.reported)}" in flat for p, m in PROBLEMS.items())


def test_nested_keys_set_one_key_of_a_mapping(tmp_path):
    from finetune.config import load_config
    from finetune.errors import UserError

    recipe = REPO / "finetune/configs/vit_fashion_mnist.yaml"
    cfg = load_config(recipe, ["model_config.image_size=32", "max_memory.cpu=1GiB"])
    assert cfg.model_config["image_size"] == 32 and cfg.model_config["model_type"] == "vit"
    assert cfg.max_memory == {"cpu": "1GiB"}
    with pytest.raises(UserError, match="learning_rate is not a mapping"):
        load_config(recipe, ["learning_rate.x=1"])
    with pytest.raises(UserError, match="unknown config key 'model_confg'; did you mean model_config"):
        load_config(recipe, ["model_confg.image_size=32"])


@pytest.mark.parametrize("level", ["error", "info"])
def test_console_shows_the_run_not_the_libraries(small_text_data, tmp_path, capsys, level):
    """By default: the start summary, the training bar, each validation as computed, the end.
    log_level=info brings back datasets' and transformers' own lines and bars."""
    args = tiny_text_args(
        small_text_data, tmp_path / "run", "max_steps=4", "eval_steps=2", f"log_level={level}"
    )
    main(args)
    captured = capsys.readouterr()
    console = captured.out + captured.err
    # 37 samples in batches of 32: 2 steps an epoch, each epoch's end evaluated (and eval_steps=2)
    assert "step 2 (epoch 1): validation accuracy" in console and "step 4 (epoch 2): validation" in console
    assert "model saved to" in console and "training:" in console
    chatter = ("Generating train split", "labels (train)", "tokenizing")
    if level == "error":
        assert not [c for c in chatter if c in console], console
    else:
        assert all(c in console for c in chatter)


def test_resized_images_are_noticed_once(tmp_path, capsys):
    """32x32 images into a ViT built for 28: one line says so and how to change it; 28x28: silence."""
    from PIL import Image

    from finetune.images import resize_notice
    from finetune.models import load_preprocessor

    for label in ("a", "b"):
        (tmp_path / "train" / label).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (32, 32), (40 * i, 0, 0) if label == "a" else (0, 40 * i, 0)).save(
                tmp_path / "train" / label / f"{i}.png"
            )
    recipe = str(REPO / "finetune/configs/vit_imagefolder.yaml")  # a ViT built for 28x28 images
    settings = [
        f"data_dir={tmp_path}",
        "validation_split_percentage=34",
        "max_steps=1",
        f"output_dir={tmp_path / 'run'}",
    ]
    args = ["--config", recipe, *settings]
    main(args)
    out = capsys.readouterr().out
    assert out.count("are resized to 28x28") == 1 and "(32x32)" in out and "model_config.image_size" in out
    image_size_32 = types.SimpleNamespace(image_size=32, num_channels=3)  # a model config with 32
    processor = load_preprocessor(load_config(recipe, settings).model_args, image_size_32)
    assert resize_notice(Counter({(32, 32): 6}), processor) is None


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


def test_only_an_evaluated_checkpoint_carries_metrics_or_can_be_best(small_text_data, tmp_path):
    """Checkpoints every 2 steps, evaluations every 3: a checkpoint at a step without an evaluation
    (4) holds no metrics, so it cannot be named best on the strength of step 3's evaluation."""
    from finetune import checkpoint as ckpt

    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "num_train_epochs=2", "per_device_train_batch_size=8",
                        "eval_steps=3", "save_steps=2", "save_total_limit=null"))  # fmt: skip
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = {e["step"] for e in lines if "eval_loss" in e}
    saved = {int(p.name.split("-")[1]): p for p in ckpt.list_checkpoints(out)}
    assert 4 in saved and 4 not in evaluated and 3 in evaluated  # the case this test is about
    for step, path in saved.items():
        metrics = json.loads((path / ckpt.MANIFEST).read_text())["metrics"]
        assert bool(metrics) == (step in evaluated), step
    best = json.loads((out / "results.json").read_text())["best"]
    assert best["step"] in evaluated and best["step"] in saved


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model_config.image_sise=32", "ViTConfig has no setting 'image_sise'; did you mean image_size?"),
        ("model_config.image_size=big", "cannot build a image-classification model from model_config"),
    ],
)
def test_a_mistake_inside_model_config_is_one_line(tmp_path, capsys, setting, message):
    from conftest import user_error

    recipe = str(REPO / "finetune/configs/vit_imagefolder.yaml")
    assert message in user_error(capsys, main, ["--config", recipe, setting, f"output_dir={tmp_path / 'o'}"])
    assert not (tmp_path / "o").exists()


def test_an_image_folder_without_class_folders_says_how_to_lay_it_out(tmp_path, capsys):
    """Images straight in data_dir: datasets finds no labels; the line says where the classes go."""
    from conftest import user_error
    from PIL import Image

    for i in range(4):
        Image.new("RGB", (20, 20), (60 * i, 0, 0)).save(tmp_path / f"{i}.png")
    recipe = str(REPO / "finetune/configs/vit_imagefolder.yaml")
    line = user_error(capsys, main, ["--config", recipe, f"data_dir={tmp_path}", f"output_dir={tmp_path / 'o'}"])
    assert "column 'label' not found" in line and "<data_dir>/train/<class>/" in line


@pytest.mark.parametrize("module", ["finetune.run", "finetune.evaluate_checkpoint"])
def test_openmp_threads_sleep_when_they_wait_unless_the_user_says(module):
    """The entry points set OMP_WAIT_POLICY=PASSIVE before torch loads libgomp, which then spins 0
    times (its default: 300,000); a policy of the user's own is kept. libgomp prints what it read."""
    import subprocess
    import sys

    def spincount(**env: str) -> str:
        environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        code = f"import {module}, torch; torch.ones(4).sum()"
        run = subprocess.run([sys.executable, "-c", code], env={**environ, "OMP_DISPLAY_ENV": "VERBOSE", **env},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        return next(line.split("=")[1].strip() for line in run.stderr.splitlines() if "GOMP_SPINCOUNT" in line)

    assert spincount() == "'0'"
    if module == "finetune.run":
        assert spincount(OMP_WAIT_POLICY="ACTIVE") != "'0'"


def test_own_labels_under_the_default_recipe_say_how_to_take_them_from_the_data(tmp_path, capsys):
    """The default recipe names the bundled data's labels ("0", "1"); a user's own files with other
    labels get a line that says label_names=null (or the recipe for one's own files)."""
    from conftest import user_error, write_csv

    rows = [{"text": f"text {i}", "label": ["pos", "neg"][i % 2]} for i in range(8)]
    train = write_csv(tmp_path / "train.csv", rows)
    line = user_error(capsys, main, [f"train_file={train}", "validation_file=null", "test_file=null",
                                     f"output_dir={tmp_path / 'o'}"])  # fmt: skip
    assert "training labels ['neg', 'pos'] are not in label_names ['0', '1']" in line
    assert "label_names=null" in line and "bert_custom_files.yaml" in line
