"""The training entry point, run for real on tiny models: text, images, schedules, model parallel."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, TINY_VIT, rotten_rows, tiny_text_args, user_error, write_csv
from safetensors.torch import load_file
from transformers import get_scheduler, pipeline

import finetune.run as run_module
from finetune.config import CONFIGS_DIR, load_config
from finetune.errors import UserError
from finetune.run import main


def _records(out, key):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if key in r]


def test_text_run_exports_a_model_that_pipeline_loads(small_text_data, tmp_path):
    out = tmp_path / "run"
    results = main(
        tiny_text_args(small_text_data, out, "num_train_epochs=1", "per_device_train_batch_size=8")
    )
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "results.json",
        "model/model.safetensors",
        "model/tokenizer.json",
    ):
        assert (out / name).exists(), name
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["per_device_train_batch_size"] == 8 and saved["output_dir"] == str(out)
    assert results["validation"]["num_samples"] == 13  # every validation row, none twice
    classifier = pipeline("text-classification", model=str(out / "model"), device="cpu")
    predictions = classifier(["a gorgeous , witty , seductive movie .", "a dull , lifeless mess ."])
    assert {p["label"] for p in predictions} <= {"0", "1"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"}
    umask = os.umask(0)
    os.umask(umask)  # safetensors writes 0600: the export's files get what the umask gives a new file
    assert {p.stat().st_mode & 0o777 for p in (out / "model").iterdir()} == {0o666 & ~umask}


def test_frozen_embeddings_stay_as_built_and_the_rest_trains(small_text_data, tmp_path):
    from accelerate.utils import set_seed

    from finetune.models import build_model, load_preprocessor

    out = tmp_path / "run"
    args = tiny_text_args(small_text_data, out, "max_steps=3", "freeze_embeddings=true", "save_steps=3")
    cfg = load_config(None, args)
    set_seed(cfg.seed)  # as train() does before building: the same initial weights
    model = build_model(cfg.model_args, ["0", "1"], vocab_size=len(load_preprocessor(cfg.model_args)))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    main(args)
    trained = load_file(out / "model" / "model.safetensors")
    word = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(trained[word], initial[word])
    for name in (
        "bert.embeddings.position_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
    ):
        assert not torch.equal(trained[name], initial[name]), name
    # The optimizer holds state for the trainable weights only.
    optimizer = torch.load(next((out / "checkpoints").glob("step-*")) / "optimizer.bin", weights_only=True)
    assert len(optimizer["state"]) == len(list(model.parameters())) - 1


def test_gradient_checkpointing_recomputes_layers_and_changes_no_numbers(
    small_text_data, tmp_path, monkeypatch
):
    from transformers.models.bert import modeling_bert

    # Counted inside the layer: a checkpointed layer runs its feed-forward again in backward.
    calls = []
    original = modeling_bert.BertIntermediate.forward

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_bert.BertIntermediate, "forward", counting)
    runs = {}
    for flag in ("false", "true"):
        calls.clear()
        out = tmp_path / flag
        main(tiny_text_args(small_text_data, out, "max_steps=3", f"gradient_checkpointing={flag}"))
        runs[flag] = len(calls), load_file(out / "model" / "model.safetensors")
    # 3 steps x 2 layers run again in backward; evaluation calls the layers the same way in both runs.
    assert runs["true"][0] == runs["false"][0] + 3 * 2
    plain, checkpointed = runs["false"][1], runs["true"][1]
    assert max((plain[k] - checkpointed[k]).abs().max().item() for k in plain) <= 1e-6


def test_string_labels_and_sentence_pairs_from_jsonl(tmp_path):
    rows = rotten_rows(24)
    names = {"0": "negative", "1": "positive"}
    train = tmp_path / "pairs.jsonl"
    with train.open("w") as f:
        for i, r in enumerate(rows):
            f.write(
                json.dumps(
                    {"premise": r["text"], "hypothesis": rows[-i - 1]["text"], "sentiment": names[r["label"]]}
                )
                + "\n"
            )
    out = tmp_path / "run"
    args = tiny_text_args(
        {"train": train, "validation": train},
        out,
        "validation_file=null",
        "text_column=premise",
        "text_pair_column=hypothesis",
        "label_column=sentiment",
        "max_steps=2",
        "per_device_train_batch_size=4",
        "validation_split_percentage=25",
    )
    results = main(args)
    assert results["label_names"] == ["negative", "positive"]
    assert results["validation"]["num_samples"] == 6  # a stratified 25% of 24 rows
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["label2id"] == {"negative": 0, "positive": 1}


@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
@pytest.mark.parametrize("accumulation", [1, 3])
def test_schedule_ends_where_planned(small_text_data, tmp_path, scheduler, accumulation):
    """The LR schedule is planned in optimizer steps: the last step's LR is the schedule's end."""
    out = tmp_path / "run"
    main(
        tiny_text_args(
            small_text_data,
            out,
            "num_train_epochs=2",
            "per_device_train_batch_size=4",
            f"gradient_accumulation_steps={accumulation}",
            f"lr_scheduler_type={scheduler}",
        )
    )
    batches = math.ceil(37 / 4)
    total = 2 * math.ceil(batches / accumulation)
    logged = _records(out, "learning_rate")
    assert [r["step"] for r in logged] == list(range(1, total + 1))
    # The expected curve, from an independent scheduler on a dummy optimizer.
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    reference = get_scheduler(
        scheduler, opt, num_warmup_steps=math.ceil(0.2 * total), num_training_steps=total
    )
    expected = []
    for _ in range(total):
        opt.step()
        reference.step()
        expected.append(reference.get_last_lr()[0])
    assert [r["learning_rate"] for r in logged] == pytest.approx(expected, abs=1e-12)
    assert logged[-1]["learning_rate"] == pytest.approx(0.0, abs=1e-12)


def test_image_run_on_bundled_fashion_mnist(tmp_path):
    out = tmp_path / "vit"
    results = main(
        [
            "--config",
            str(CONFIGS_DIR / "vit_fashion_mnist.yaml"),
            f"model_config={TINY_VIT}",
            "max_train_samples=96",
            "max_eval_samples=20",
            "max_test_samples=30",
            "num_train_epochs=1",
            "per_device_train_batch_size=16",
            f"output_dir={out}",
        ]
    )
    assert results["test"]["num_samples"] == 30
    assert results["label_names"][0] == "T-shirt/top" and len(results["label_names"]) == 10
    classifier = pipeline("image-classification", model=str(out / "model"), device="cpu")
    from PIL import Image

    image = Image.open(REPO / "data/fashion_mnist/sample_png/test/1_trouser/test_1_000.png")
    top = classifier(image, top_k=1)[0]
    assert top["label"] in results["label_names"]


def test_imagefolder_mixed_image_modes(tmp_path):
    """Grayscale, palette and RGBA files mixed with RGB just work; folder names are the labels."""
    from PIL import Image

    src = REPO / "data/fashion_mnist/sample_png/train"
    for i, folder in enumerate(sorted(src.iterdir())[:3]):
        dest = tmp_path / "images" / "train" / folder.name
        dest.mkdir(parents=True)
        for j, png in enumerate(sorted(folder.iterdir())[:6]):
            image = Image.open(png)
            mode = ["L", "RGB", "P", "RGBA"][(i + j) % 4]
            image.convert(mode).save(dest / f"{j}.png")
    out = tmp_path / "run"
    results = main(
        [
            "--config",
            str(CONFIGS_DIR / "vit_imagefolder.yaml"),
            f"model_config={TINY_VIT}",
            f"data_dir={tmp_path / 'images'}",
            "num_train_epochs=1",
            "validation_split_percentage=33.3",
            f"output_dir={out}",
        ]
    )
    assert results["label_names"] == ["0_tshirt_top", "1_trouser", "2_pullover"]
    assert results["validation"]["num_samples"] == 6


def test_model_parallel_on_repeated_cpu_devices_equals_unsplit(small_text_data, tmp_path):
    """Through the real entry point: a 3-stage split, pipelined, trains to the unsplit weights."""
    common = ("num_train_epochs=1", "per_device_train_batch_size=6", "adam_epsilon=1e-6")
    main(tiny_text_args(small_text_data, tmp_path / "plain", *common))
    main(
        tiny_text_args(
            small_text_data,
            tmp_path / "split",
            *common,
            "model_parallel=true",
            "devices=cpu,cpu,cpu",
            "pipeline_chunks=2",
        )
    )
    plain = load_file(tmp_path / "plain" / "model" / "model.safetensors")
    split = load_file(tmp_path / "split" / "model" / "model.safetensors")
    worst = max((plain[k] - split[k]).abs().max().item() for k in plain)
    assert worst < 1e-5


def test_plan_only_prints_the_plan_and_trains_nothing(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "model_parallel=true", "devices=cpu,cpu", "--plan-only"))
    printed = capsys.readouterr().out
    assert "cpu" in printed and "embeddings" in printed
    assert not (out / "model").exists()


# Recipes for the user's own files: no data of their own (no regression or multi-label data is bundled).
OWN_FILES_RECIPES = {"bert_custom_files.yaml", "bert_regression.yaml", "bert_multi_label.yaml"}


def test_every_shipped_recipe_loads():
    recipes = sorted(CONFIGS_DIR.glob("*.yaml"))
    assert len(recipes) >= 6
    for recipe in recipes:
        first = recipe.read_text().splitlines()[0]
        # (an accelerate config may come first: the full-data recipe is tuned for cpu_bf16.yaml)
        assert first.startswith("# accelerate launch ") and " finetune/run.py" in first, recipe.name
        # A recipe for the user's own files has no data of its own: its command gives train_file, and
        # without it the recipe is refused rather than scoring bundled data.
        command = recipe.read_text().split("\n#\n")[0]
        own_files = "train_file=" in command
        assert own_files == (recipe.name in OWN_FILES_RECIPES)
        cfg = load_config(recipe, ["train_file=mine.csv"] if own_files else [])
        if own_files:
            assert (cfg.validation_file, cfg.test_file) == (None, None)
            with pytest.raises(UserError, match="no training data"):
                load_config(recipe)
        for key in ("train_file", "validation_file", "test_file", "data_dir", "model_name_or_path"):
            value = getattr(cfg, key)
            if value and str(value).startswith("/"):
                from pathlib import Path

                assert Path(value).exists(), f"{recipe.name}: {key} {value} is missing"


@pytest.mark.slow  # six subprocesses; tests/test_bad_input.py covers these in-process and via the CLI
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["learnig_rate=1e-4"], "unknown config key 'learnig_rate'; did you mean learning_rate?"),
        (["per_device_train_batch_size=two"], "per_device_train_batch_size must be an integer"),
        (["per_device_train_batch_size=0"], "per_device_train_batch_size must be a positive integer"),
        (["train_file=/nonexistent/train.csv"], "train file not found: /nonexistent/train.csv"),
        (["text_column=review"], "column 'review' not found in the train data; columns are: text, label"),
        (["--config", "/nonexistent.yaml"], "config file not found"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args, message, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "finetune/run.py"), *args, f"output_dir={tmp_path / 'o'}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_single_class_labels_are_refused(tmp_path):
    rows = [r for r in rotten_rows(60) if r["label"] == "1"]
    train = write_csv(tmp_path / "one.csv", rows)
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_text_args({"train": train, "validation": train}, tmp_path / "o"))
    assert exit_info.value.code == 2


def test_finished_run_is_not_overwritten(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    args = tiny_text_args(small_text_data, out, "max_steps=2", "warmup_ratio=0")
    main(args)
    before = (out / "model" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert (out / "model" / "model.safetensors").read_bytes() == before
    main([*args, "overwrite_output_dir=true", "learning_rate=5e-2"])
    assert (out / "model" / "model.safetensors").read_bytes() != before


def test_each_split_file_may_have_its_own_format(small_text_data, tmp_path):
    """A .csv train, a .jsonl validation and a .parquet test: datasets loads each split on its own."""
    import pandas as pd

    validation = tmp_path / "dev.jsonl"
    validation.write_text("".join(json.dumps(r) + "\n" for r in rotten_rows(13, start=100)))
    test = tmp_path / "test.parquet"
    pd.DataFrame(rotten_rows(9, start=200)).to_parquet(test)
    data = {"train": small_text_data["train"], "validation": validation}
    results = main(tiny_text_args(data, tmp_path / "run", "max_steps=2", f"test_file={test}"))
    assert results["validation"]["num_samples"] == 13 and results["test"]["num_samples"] == 9


def test_freeze_layers_keeps_embeddings_and_lower_layers_as_loaded(small_text_data, tmp_path, monkeypatch):
    initial = {}
    real_build = run_module.build_model

    def build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        initial.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(run_module, "build_model", build)
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=3", "freeze_layers=1"))
    trained = load_file(out / "model" / "model.safetensors")
    changed = {k for k in trained if not torch.equal(trained[k], initial[k])}
    frozen = {k for k in trained if k.startswith(("bert.embeddings.", "bert.encoder.layer.0."))}
    assert frozen and not frozen & changed, frozen & changed
    # the layer above and the head trained
    assert any(k.startswith("bert.encoder.layer.1.") for k in changed) and "classifier.weight" in changed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["freeze_layers=3"], "freeze_layers=3 but BertForSequenceClassification has 2 encoder layers"),
        (["freeze_layers=-1"], "freeze_layers must be >= 0"),
        (["freeze_layers=1", "peft={r: 4}"], "freeze_layers and peft together"),
    ],
)
def test_freeze_layers_mistakes(small_text_data, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert message in user_error(capsys, main, tiny_text_args(small_text_data, out, "max_steps=1", *extra))
    assert not out.exists()
