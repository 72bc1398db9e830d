"""An adversarial catalogue: every mistake gets one clear line, and nothing already written is lost.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_hostile.py

The rules each case checks: a user's mistake is exactly one line starting `error:` on stderr, exit
status 2, no traceback; and the files of an earlier finished run (and the user's own files) keep their
bytes, checked by sha256. One finished tiny run is made per module and copied for each case that
aims at it. Six classes: (1) settings without ranges, (2) the output directory, (3) signals outside
the training loop, (4) damaged checkpoints, (5) inputs that would silently train garbage, (6) the
launcher and the environment (a bad accelerate config, a full disk). Nearly everything calls the
entry points' `main` in-process; the one subprocess (marked slow) shows the launcher's command line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, TINY_BERT, TINY_VIT, TOKENIZER, rotten_rows, tiny_text_args, user_error, write_csv
from PIL import Image

import finetune.export as export
import finetune.run as run
from finetune import checkpoint as ckpt
from finetune.config import CONFIGS_DIR
from finetune.evaluate_checkpoint import main as evaluate_main
from finetune.launch import main as launch_main
from finetune.run import main

IMAGEFOLDER = str(CONFIGS_DIR / "vit_imagefolder.yaml")
SAMPLE_PNG = REPO / "data/fashion_mnist/sample_png/train"
LAST = "step-00000002"  # the finished run's checkpoints: step-00000001 and step-00000002
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# --- the module's finished run and the inputs ---------------------------------------------------------


@dataclass
class World:
    root: Path
    done: Path  # a finished run: config, metrics, results, export, checkpoints step 1 and 2
    train: Path
    validation: Path

    def __getattr__(self, name: str) -> Path:
        return self.root / name


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _tiny_bert_folder(path: Path, vocab_size: int = 30522) -> Path:
    """A model folder as `save_pretrained` leaves it without its tokenizer: config and weights only."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    return path


def _image_folder(root: Path, per_class: int = 6) -> Path:
    for folder in sorted(SAMPLE_PNG.iterdir())[:2]:
        dest = root / "train" / folder.name
        dest.mkdir(parents=True)
        for j, png in enumerate(sorted(folder.iterdir())[:per_class]):
            shutil.copy(png, dest / f"{j}.png")
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("hostile")
    rows = rotten_rows(37)
    w = World(
        root,
        root / "done",
        write_csv(root / "train.csv", rows),
        write_csv(root / "validation.csv", rotten_rows(13, start=100)),
    )
    # Frozen embeddings: no optimizer state for the 30522-row table, so a copy of the run is 12 MB, not 28.
    main(
        tiny_text_args(
            {"train": w.train, "validation": w.validation},
            w.done,
            "max_steps=2",
            "save_steps=1",
            "freeze_embeddings=true",
        )
    )
    _reset_accelerate()

    write_csv(root / "test.csv", rotten_rows(11, start=200))
    words = {"0": "neg", "1": "pos"}
    write_csv(root / "string_labels.csv", [{"text": r["text"], "label": words[r["label"]]} for r in rows])
    (root / "semicolon.csv").write_text("text;label\n" + "".join(f"{r['text']};{r['label']}\n" for r in rows))
    (root / "lists.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": [int(r["label"])]}) + "\n" for r in rows)
    )
    (root / "dicts.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "label": {"y": int(r["label"])}}) + "\n" for r in rows)
    )
    write_csv(root / "floats.csv", [{"text": r["text"], "label": 0.25 + 0.5 * int(r["label"])} for r in rows])
    (root / "empty_texts.jsonl").write_text(
        "".join(json.dumps({"text": "", "label": int(r["label"])}) + "\n" for r in rows)
    )
    (root / "latin1.csv").write_bytes(
        ("text,label\n" + "".join(f"caf\xe9 {r['text']},{r['label']}\n" for r in rows)).encode("latin-1")
    )
    _tiny_bert_folder(root / "model_without_tokenizer")
    small_vocab = root / "small_tokenizer"
    small_vocab.mkdir()
    vocab = (TOKENIZER / "vocab.txt").read_text().splitlines()[:1000]
    (small_vocab / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (small_vocab / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True})
    )
    (root / "recipe.yaml").write_text((CONFIGS_DIR / "bert_rotten_tomatoes.yaml").read_text())
    images = _image_folder(root / "images_cut_jpeg")
    victim = images / "train" / "1_trouser" / "cut.jpg"
    Image.open(images / "train" / "1_trouser" / "0.png").convert("RGB").resize((200, 200)).save(
        victim, quality=95
    )
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # found only when decoded
    return w


def _hashes(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def copy(world, tmp_path) -> Path:
    """A private copy of the finished run, for a case to aim at."""
    dest = tmp_path / "run"
    shutil.copytree(world.done, dest)
    return dest


def _text(w: World, out: Path, *extra: str) -> list[str]:
    """A tiny text run into `out`, told to overwrite it (so that the mistake under test is what stops it),
    with the finished run's settings (so that it may resume that run's checkpoints)."""
    data = {"train": w.train, "validation": w.validation}
    return tiny_text_args(
        data, out, "max_steps=1", "overwrite_output_dir=true", "freeze_embeddings=true", *extra
    )


def _refused(capsys, entry: Callable, argv: list[str], *fragments: str) -> str:
    capsys.readouterr()
    line = user_error(capsys, entry, argv)
    for fragment in fragments:
        assert fragment in line, line
    return line


def _assert_untouched(copy: Path, before: dict[str, str]) -> None:
    after = _hashes(copy)
    assert after == before, (
        f"the finished run's files changed: {sorted(set(after.items()) ^ set(before.items()))[:6]}"
    )


# --- (1) settings without ranges ---------------------------------------------------------------------

SETTINGS: dict[str, tuple[list[str], str]] = {
    "max_grad_norm_negative": (["max_grad_norm=-1"], "max_grad_norm must be >= 0"),
    "max_grad_norm_nan": (["max_grad_norm=.nan"], "max_grad_norm must be a finite number"),
    "seed_negative": (["seed=-1"], "seed must be in [0, 4294967295]"),
    "seed_past_2_32": (["seed=4294967296"], "seed must be in [0, 4294967295]"),
    "adam_beta1_one": (["adam_beta1=1.0"], "adam_beta1 must be in [0, 1)"),
    "adam_beta1_negative": (["adam_beta1=-0.1"], "adam_beta1 must be in [0, 1)"),
    "adam_beta2_above_one": (["adam_beta2=1.5"], "adam_beta2 must be in [0, 1)"),
    "adam_epsilon_negative": (["adam_epsilon=-1e-8"], "adam_epsilon must be > 0"),
    "adam_epsilon_zero": (["adam_epsilon=0"], "adam_epsilon must be > 0"),
    "weight_decay_negative": (["weight_decay=-1"], "weight_decay must be >= 0"),
    "weight_decay_infinite": (["weight_decay=.inf"], "weight_decay must be a finite number"),
    "learning_rate_infinite": (["learning_rate=.inf"], "learning_rate must be a finite number"),
    "learning_rate_nan": (["learning_rate=.nan"], "learning_rate must be"),
    "ddp_timeout_past_timedelta": (["ddp_timeout=100000000000000"], "ddp_timeout must be at most 604800"),
    "cpu_threads_100000": (["cpu_threads=100000"], "cpu_threads=100000"),
    "cpu_threads_zero": (["cpu_threads=0"], "cpu_threads must be positive"),
    "label_names_duplicated": (["label_names=[0,0,1]"], "label_names lists '0' twice"),
    "label_names_empty": (["label_names=[]"], "label_names is empty"),
    "warmup_steps_past_max_steps": (["warmup_steps=5"], "warmup_steps=5 exceeds max_steps=1"),
    "warmup_steps_past_the_run": (
        ["max_steps=null", "num_train_epochs=1", "warmup_steps=500"],
        "warmup_steps=500 exceeds the 2 optimizer steps of the run",
    ),
    "logging_steps_zero": (["logging_steps=0"], "logging_steps must be a positive integer"),
    "eval_steps_zero": (["eval_steps=0"], "eval_steps must be positive"),
    "save_steps_negative": (["save_steps=-5"], "save_steps must be positive"),
    "save_total_limit_zero": (["save_total_limit=0"], "save_total_limit must be positive"),
    "eval_batch_size_zero": (
        ["per_device_eval_batch_size=0"],
        "per_device_eval_batch_size must be a positive",
    ),
    "early_stopping_patience_zero": (
        ["early_stopping_patience=0"],
        "early_stopping_patience must be positive",
    ),
    "max_length_one": (["max_length=1", "pad_to_multiple_of=null"], "max_length=1 leaves no room for text"),
    "metric_with_eval_prefix": (
        ["metric_for_best_model=eval_accuracy"],
        "metric_for_best_model must be one of",
    ),
    "greater_is_better_not_a_bool": (["greater_is_better=maybe"], "greater_is_better must be true or false"),
    "text_column_is_the_label_column": (["text_column=label"], "'label' is both the label column and a text"),
    "text_pair_is_the_text_column": (["text_pair_column=text"], "text_pair_column is the text_column"),
    "model_config_heads_do_not_divide": (
        [f"model_config={TINY_BERT.replace('hidden_size: 32', 'hidden_size: 30')}"],
        "cannot build a text-classification model from model_config",
    ),
}


@pytest.mark.parametrize("case", list(SETTINGS))
def test_a_setting_out_of_range_is_one_line(case, world, copy, capsys):
    extra, fragment = SETTINGS[case]
    before = _hashes(copy)
    _refused(capsys, main, _text(world, copy, *extra), fragment)
    _assert_untouched(copy, before)


def test_metric_loss_means_lower_is_better(world, tmp_path):
    """metric_for_best_model=loss: the best checkpoint is the one with the LOWEST loss, as in transformers'
    Trainer (greater_is_better unset: a metric that ends in "loss" is better lower)."""
    from finetune.config import load_config

    def greater(*settings: str) -> bool | None:
        return load_config(None, [f"output_dir={tmp_path}", *settings]).greater_is_better

    assert greater("metric_for_best_model=loss") is False
    assert greater("metric_for_best_model=accuracy") is True
    assert greater() is None  # until the labels say which problem, hence which metric (accuracy here)
    assert greater("metric_for_best_model=loss", "greater_is_better=true") is True  # as told
    out = tmp_path / "run"
    results = main(
        tiny_text_args(
            {"train": world.train, "validation": world.validation},
            out,
            "max_steps=4",
            "eval_steps=1",
            "save_steps=1",
            "save_total_limit=null",
            "per_device_train_batch_size=8",
            "metric_for_best_model=loss",
            "learning_rate=3e-3",
        )
    )
    losses = {
        r["step"]: r["eval_loss"]
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if "eval_loss" in r
    }
    assert min(losses, key=losses.get) != max(losses, key=losses.get), losses  # the direction matters here
    assert results["best"]["step"] == min(losses, key=losses.get), losses
    assert results["best"]["value"] == pytest.approx(min(losses.values()))


def test_a_saved_config_of_the_old_default_still_loads(copy):
    """Saved configs hold greater_is_better: true (the old default): they load as they are."""
    import yaml

    from finetune.config import config_from_dict

    raw = yaml.safe_load((copy / "config.yaml").read_text())
    raw["greater_is_better"] = True
    assert config_from_dict(raw, saved=True).greater_is_better is True


# --- (2) the output directory ------------------------------------------------------------------------


def _user_folder(path: Path) -> dict[str, str]:
    (path / "notes").mkdir(parents=True)
    (path / "notes" / "todo.txt").write_text("mine")
    (path / "data.csv").write_text("a,b\n1,2\n")
    return _hashes(path)


@pytest.mark.parametrize("spelling", ["''", "."])
def test_output_dir_that_is_the_current_folder_of_user_files(world, tmp_path, monkeypatch, capsys, spelling):
    folder = tmp_path / "mine"
    before = _user_folder(folder)
    monkeypatch.chdir(folder)
    data = {"train": world.train, "validation": world.validation}
    _refused(
        capsys,
        main,
        tiny_text_args(data, Path("x"), "max_steps=1", f"output_dir={spelling}"),
        "holds files that are not a run of this app",
    )
    assert _hashes(folder) == before


def test_overwrite_into_a_folder_whose_files_a_run_would_write_over(world, tmp_path, capsys):
    """overwrite_output_dir=true writes into a folder of other files, deleting nothing: so a file of the
    user's that has a run file's name (config.yaml, model/) is refused, not written over."""
    folder = tmp_path / "mine"
    _user_folder(folder)
    (folder / "config.yaml").write_text("my: settings\n")
    (folder / "model").mkdir()
    (folder / "model" / "weights.bin").write_bytes(b"mine")
    before = _hashes(folder)
    _refused(capsys, main, _text(world, folder), "config.yaml", "model", "would write over")
    assert _hashes(folder) == before


def test_output_dir_that_is_a_checkpoint(world, copy, capsys):
    before = _hashes(copy)
    data = {"train": world.train, "validation": world.validation}
    _refused(
        capsys,
        main,
        tiny_text_args(data, copy / "checkpoints" / LAST, "max_steps=1"),
        "holds files that are not a run of this app",
    )
    _assert_untouched(copy, before)


def _previous_run_kept(copy: Path, before: dict[str, str]) -> None:
    _assert_untouched(copy, before)
    assert json.loads((copy / "results.json").read_text())["step"] == 2


def test_overwrite_then_a_mistake_found_mid_run_keeps_the_earlier_run(world, copy, capsys):
    """A JPEG cut short passes the check before training and fails when it is decoded, in training: by
    then the overwrite has begun. The earlier run, and the user's file beside it, come back whole."""
    (copy / "notes.txt").write_text("mine")
    before = _hashes(copy)
    argv = [
        "--config",
        IMAGEFOLDER,
        f"model_config={TINY_VIT}",
        f"data_dir={world.images_cut_jpeg}",
        "num_train_epochs=1",
        "per_device_train_batch_size=4",
        f"output_dir={copy}",
        "overwrite_output_dir=true",
    ]
    _refused(capsys, main, argv, "cut.jpg")
    _previous_run_kept(copy, before)


def test_overwrite_then_a_diverged_loss_keeps_the_earlier_run(world, copy, capsys):
    """Stopped at exit status 3 with no checkpoint of its own: the run that was there comes back."""
    before = _hashes(copy)
    with pytest.raises(SystemExit) as exit_info:
        main(
            _text(
                world,
                copy,
                "max_steps=20",
                "per_device_train_batch_size=4",
                "warmup_ratio=0",
                "learning_rate=1e30",
                "max_nonfinite_loss_steps=2",
            )
        )
    assert exit_info.value.code == 3
    assert "Traceback" not in capsys.readouterr().err
    _previous_run_kept(copy, before)


def test_overwrite_that_finishes_replaces_only_the_run(world, copy):
    (copy / "notes.txt").write_text("mine")
    results = main(_text(world, copy, "max_steps=1", "save_steps=1"))
    assert results["step"] == 1 and (copy / "notes.txt").read_text() == "mine"
    assert [p.name for p in ckpt.list_checkpoints(copy)] == ["step-00000001"]
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith(".")) == []  # nothing set aside is left


# --- (3) signals outside the training loop -----------------------------------------------------------


def _signal_when(monkeypatch, owner, name: str, sig: signal.Signals, when=lambda *a, **k: True) -> None:
    """Make `owner.name` send `sig` to this process (as a scheduler would) when `when(...)`, then go on."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if when(*args, **kwargs):
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def _stopped(capsys, argv: list[str], status: int) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == status, err[-2000:]
    assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")]
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1, err[-2000:]
    return stopped[0]


def _complete_export(out: Path, step: int) -> None:
    results = json.loads((out / "results.json").read_text())
    assert results["step"] == step and (out / "model" / "README.md").is_file()
    assert (out / "model" / "model.safetensors").is_file() and (out / "training_curves.png").is_file()


@pytest.mark.parametrize(
    "moment, sig",
    [
        ("test evaluation", signal.SIGTERM),
        ("model card", signal.SIGTERM),
        ("model card", signal.SIGINT),
        pytest.param("training curves", signal.SIGTERM, marks=pytest.mark.slow),
    ],
    ids=["sigterm-in-final-test-evaluation", "sigterm-in-export", "sigint-in-export", "sigterm-in-curves"],
)
def test_a_signal_after_the_loop_ends_in_a_complete_export(world, tmp_path, monkeypatch, capsys, moment, sig):
    out = tmp_path / "run"
    if moment == "test evaluation":  # the test split has 11 samples, validation 13
        _signal_when(
            monkeypatch, run, "evaluate_model", sig, lambda model, loader, *a, **k: len(loader.dataset) == 11
        )
    elif moment == "model card":
        _signal_when(monkeypatch, export, "write_model_card", sig)
    else:
        _signal_when(monkeypatch, export, "plot_training_curves", sig)
    data = {"train": world.train, "validation": world.validation}
    line = _stopped(
        capsys, tiny_text_args(data, out, "max_steps=2", f"test_file={world.root / 'test.csv'}"), 128 + sig
    )
    assert sig.name in line and "complete" in line
    _complete_export(out, 2)


def test_sigterm_in_the_last_evaluation_of_the_loop_leaves_a_resumable_checkpoint(
    world, tmp_path, monkeypatch, capsys
):
    """The validation at the last step runs inside the loop: the stop saves that step, and the resume
    trains nothing more and exports."""
    out = tmp_path / "run"
    data = {"train": world.train, "validation": world.validation}
    with monkeypatch.context() as m:
        _signal_when(m, run, "evaluate_model", signal.SIGTERM)
        line = _stopped(capsys, tiny_text_args(data, out, "max_steps=2"), 143)
    assert "resume_from_checkpoint=latest" in line and not (out / "results.json").exists()
    assert [p.name for p in ckpt.list_checkpoints(out)] == [LAST]
    _reset_accelerate()
    assert main(tiny_text_args(data, out, "max_steps=2", "resume_from_checkpoint=latest"))["step"] == 2
    _complete_export(out, 2)


def test_sigterm_during_a_checkpoint_save_finishes_the_save_then_stops(world, tmp_path, monkeypatch, capsys):
    from accelerate import Accelerator

    out = tmp_path / "run"
    _signal_when(monkeypatch, Accelerator, "save_state", signal.SIGTERM)
    data = {"train": world.train, "validation": world.validation}
    _stopped(
        capsys, tiny_text_args(data, out, "max_steps=3", "save_steps=1", "per_device_train_batch_size=8"), 143
    )
    (only,) = ckpt.list_checkpoints(out)
    assert only.name == "step-00000001" and ckpt.checkpoint_problem(only) is None
    assert not list((out / ckpt.CHECKPOINTS).glob(".tmp-*"))


# --- (4) damaged checkpoints -------------------------------------------------------------------------


def _cut(name: str, keep: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[: keep(len(data))])

    return damage


def _manifest(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        manifest = json.loads((path / ckpt.MANIFEST).read_text())
        result = edit(manifest)
        (path / ckpt.MANIFEST).write_text(json.dumps(manifest if result is None else result))

    return damage


def _header_garbage(path: Path) -> None:
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(b"\xff" * 8 + data[8:])


# id -> (the file the line must name, the damage)
DAMAGES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "weights_truncated": ("model.safetensors", _cut("model.safetensors", lambda n: n // 2)),
    "weights_zero_bytes": ("model.safetensors", _cut("model.safetensors", lambda n: 0)),
    "weights_header_garbage": ("model.safetensors", _header_garbage),
    "weights_missing": ("model.safetensors", lambda p: (p / "model.safetensors").unlink()),
    "optimizer_zero_bytes": ("optimizer.bin", _cut("optimizer.bin", lambda n: 0)),
    "optimizer_truncated": ("optimizer.bin", _cut("optimizer.bin", lambda n: n - 100)),
    "optimizer_missing": ("optimizer.bin", lambda p: (p / "optimizer.bin").unlink()),
    "scheduler_zero_bytes": ("scheduler.bin", _cut("scheduler.bin", lambda n: 0)),
    "scheduler_missing": ("scheduler.bin", lambda p: (p / "scheduler.bin").unlink()),
    "random_states_missing": ("random_states_0.pkl", lambda p: (p / "random_states_0.pkl").unlink()),
    "random_states_truncated": ("random_states_0.pkl", _cut("random_states_0.pkl", lambda n: n // 2)),
    "manifest_not_json": ("manifest.json", lambda p: (p / ckpt.MANIFEST).write_text("{not json")),
    "manifest_zero_bytes": ("manifest.json", _cut(ckpt.MANIFEST, lambda n: 0)),
    "manifest_missing_a_key": ("manifest.json", _manifest(lambda m: m.pop("world_size"))),
    "manifest_wrong_type": ("manifest.json", _manifest(lambda m: m.update(step="two"))),
    "manifest_a_list": ("manifest.json", _manifest(lambda m: [1, 2])),
    "manifest_missing": ("manifest.json", lambda p: (p / ckpt.MANIFEST).unlink()),
}


def _damage(copy: Path, case: str, name: str = LAST) -> Path:
    path = copy / ckpt.CHECKPOINTS / name
    DAMAGES[case][1](path)
    return path


@pytest.mark.parametrize("case", list(DAMAGES))
def test_resuming_a_damaged_checkpoint_is_one_line_naming_the_file(case, world, copy, capsys):
    path = _damage(copy, case)
    before = _hashes(copy)
    _refused(
        capsys,
        main,
        _text(world, copy, "max_steps=2", f"resume_from_checkpoint={path}"),
        str(path / DAMAGES[case][0]),
    )
    _assert_untouched(copy, before)


@pytest.mark.parametrize("case", list(DAMAGES))
def test_latest_skips_a_damaged_checkpoint_and_says_so(case, copy, capsys):
    path = _damage(copy, case)
    assert ckpt.resolve_checkpoint("latest", copy).name == "step-00000001"
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and str(path) in skipped[0] and DAMAGES[case][0] in skipped[0], err


def test_latest_resumes_from_the_newest_checkpoint_that_loads(world, copy, capsys):
    _damage(copy, "weights_truncated")
    (copy / "results.json").unlink()  # a run cut short after its last checkpoint
    results = main(
        _text(world, copy, "max_steps=2", "resume_from_checkpoint=latest", "overwrite_output_dir=false")
    )
    out = capsys.readouterr()
    assert results["step"] == 2 and "resumed from" in out.out and "step-00000001" in out.out
    assert f"skipped {copy / ckpt.CHECKPOINTS / LAST}" in out.err


def test_latest_with_every_checkpoint_damaged_is_one_line(world, copy, capsys):
    _damage(copy, "weights_truncated")
    _damage(copy, "manifest_not_json", "step-00000001")
    before = _hashes(copy)
    _refused(
        capsys,
        main,
        _text(world, copy, "max_steps=2", "resume_from_checkpoint=latest"),
        "no checkpoint in",
        "loads",
        "step-00000001",
        LAST,
    )
    _assert_untouched(copy, before)


EVALUATED = [c for c in DAMAGES if c.startswith(("weights", "manifest"))]


@pytest.mark.parametrize("case", EVALUATED)
def test_evaluating_a_damaged_checkpoint_is_one_line_naming_the_file(case, copy, capsys):
    """Evaluation reads the manifest and the weights only. (A checkpoint without its manifest is named as
    "no COMPLETE marker or manifest": hence the file's stem.)"""
    path = _damage(copy, case)
    before = _hashes(copy)
    _refused(capsys, evaluate_main, [str(path)], DAMAGES[case][0].split(".")[0])
    _assert_untouched(copy, before)


# --- (5) inputs that would silently train garbage ---------------------------------------------------

GARBAGE: dict[str, tuple[Callable[[World], list[str]], str]] = {
    "model_folder_without_tokenizer_files": (
        lambda w: [
            "model_config=null",
            f"model_name_or_path={w.model_without_tokenizer}",
            "tokenizer_name=null",
        ],
        "has no vocabulary, only its 5 special tokens",
    ),
    "tokenizer_folder_without_tokenizer_files": (
        lambda w: [f"tokenizer_name={w.model_without_tokenizer}"],
        "has no vocabulary, only its 5 special tokens",
    ),
    "tokenizer_larger_than_the_embedding_table": (
        lambda w: [f"model_config={TINY_BERT[:-1]}, vocab_size: 1000}}"],
        "30522 tokens, more than the 1000 rows of the model's embedding table",
    ),
    "tokenizer_smaller_than_the_embedding_table": (
        lambda w: [
            "model_config=null",
            f"model_name_or_path={w.model_without_tokenizer}",
            f"tokenizer_name={w.small_tokenizer}",
        ],
        "1000 tokens for the 30522 rows of the model's embedding table",
    ),
    "labels_that_are_lists": (
        lambda w: [f"train_file={w.root / 'lists.jsonl'}", "validation_file=null",
                   "problem_type=single_label_classification"],  # fmt: skip
        "label column 'label' holds lists of labels, a multi-label problem",
    ),
    "labels_that_are_mappings": (
        lambda w: [f"train_file={w.root / 'dicts.jsonl'}", "validation_file=null"],
        "label column 'label' holds {'",
    ),
    "labels_that_are_fractions": (
        lambda w: [f"train_file={w.root / 'floats.csv'}", "validation_file=null",
                   "problem_type=single_label_classification"],  # fmt: skip
        "holds numbers with decimals (e.g. 0.25); single_label_classification needs classes",
    ),
    "semicolon_separated_csv": (
        lambda w: [f"train_file={w.root / 'semicolon.csv'}", "validation_file=null"],
        "looks semicolon-separated",
    ),
    "texts_all_empty": (
        lambda w: [f"train_file={w.root / 'empty_texts.jsonl'}", "validation_file=null"],
        "text column 'text' in the train data holds only empty strings",
    ),
    "latin1_csv": (
        lambda w: [f"train_file={w.root / 'latin1.csv'}", "validation_file=null"],
        "latin1.csv",
    ),
    "string_labels_read_as_text": (
        lambda w: [f"train_file={w.root / 'string_labels.csv'}", "validation_file=null", "text_column=label"],
        "'label' is both the label column and a text",
    ),
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_an_input_that_would_train_garbage_is_refused(case, world, copy, capsys):
    make_args, fragment = GARBAGE[case]
    before = _hashes(copy)
    _refused(capsys, main, _text(world, copy, *make_args(world)), fragment)
    _assert_untouched(copy, before)


@pytest.mark.parametrize("fmt", ["png", "tiff"])
def test_16_bit_images_keep_their_contrast(tmp_path, fmt):
    """A 16-bit grayscale image (PIL mode I;16) read as 8-bit clips every value above 255 to white: a
    gradient became 99.6% white. It must give what its 8-bit version gives."""
    from transformers import ViTImageProcessor

    from finetune.images import ImageTransform

    wide = (np.arange(28 * 28, dtype=np.uint32).reshape(28, 28) * 83).astype(np.uint16)
    Image.fromarray(wide).save(tmp_path / f"wide.{fmt}")
    Image.fromarray((wide >> 8).astype(np.uint8)).save(tmp_path / "narrow.png")
    assert Image.open(tmp_path / f"wide.{fmt}").mode.startswith("I")
    processor = ViTImageProcessor(size={"height": 28, "width": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    transform = ImageTransform(processor, "image", num_channels=3)

    def pixels(name: str) -> torch.Tensor:
        return transform({"image": [{"path": str(tmp_path / name), "bytes": None}], "labels": [0]})[
            "pixel_values"
        ]

    wide_pixels, narrow_pixels = pixels(f"wide.{fmt}"), pixels("narrow.png")
    assert (wide_pixels - narrow_pixels).abs().max() <= 2 / 255 * 2 + 1e-6
    assert wide_pixels.std() > 0.3  # a gradient, not a white page


@pytest.mark.skipif(AS_ROOT, reason="root reads files whatever their mode")
@pytest.mark.parametrize("what", ["train file", "image", "recipe"])
def test_an_unreadable_file_is_one_line(what, world, copy, tmp_path, capsys):
    if what == "train file":
        victim = shutil.copy(world.train, tmp_path / "train.csv")
        argv = _text(world, copy, f"train_file={victim}")
    elif what == "image":
        root = _image_folder(tmp_path / "images")
        victim = root / "train" / "1_trouser" / "2.png"
        argv = [
            "--config",
            IMAGEFOLDER,
            f"model_config={TINY_VIT}",
            f"data_dir={root}",
            f"output_dir={copy}",
            "overwrite_output_dir=true",
            "max_steps=1",
        ]
    else:
        victim = shutil.copy(world.root / "recipe.yaml", tmp_path / "recipe.yaml")
        argv = ["--config", str(victim), f"output_dir={copy}"]
    Path(victim).chmod(0)
    before = _hashes(copy)
    try:
        _refused(capsys, main, argv, Path(victim).name)
    finally:
        Path(victim).chmod(0o644)
    _assert_untouched(copy, before)


@pytest.mark.parametrize("what", ["train file", "recipe"])
def test_a_permission_refused_is_one_line_also_as_root(what, world, copy, monkeypatch, capsys):
    """As root nothing is unreadable, so here the refusal is simulated where the file is checked or read."""
    if what == "train file":
        access = os.access

        def refuse(path, mode, *args, **kwargs):
            return (
                False
                if str(path) == str(world.train) and mode == os.R_OK
                else access(path, mode, *args, **kwargs)
            )

        monkeypatch.setattr(os, "access", refuse)
        argv = _text(world, copy)
    else:
        read_text = Path.read_text

        def refuse(self, *args, **kwargs):
            if self == world.root / "recipe.yaml":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refuse)
        argv = ["--config", str(world.root / "recipe.yaml"), f"output_dir={copy}"]
    before = _hashes(copy)
    _refused(capsys, main, argv, "train.csv" if what == "train file" else "recipe.yaml", "ermission")
    _assert_untouched(copy, before)


# --- (6) the launcher and the environment ------------------------------------------------------------

ACCELERATE_BASE = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "NO",
    "num_machines": 1,
    "machine_rank": 0,
    "num_processes": 1,
    "use_cpu": True,
    "mixed_precision": "no",
}

# id -> (changes to a valid one-process CPU config, or the file's raw text; extra flags; fragment)
LAUNCHER: dict[str, tuple[dict | str, list[str], str]] = {
    "num_processes_zero": ({"num_processes": 0}, [], "num_processes must be at least 1, got 0"),
    "num_processes_negative": ({"num_processes": -3}, [], "num_processes must be at least 1, got -3"),
    "mixed_precision_fp8x": ({"mixed_precision": "fp8x"}, [], "mixed_precision 'fp8x'"),
    "distributed_type_unknown": ({"distributed_type": "BOGUS"}, [], "not a valid accelerate config"),
    "num_machines_zero": ({"num_machines": 0}, [], "num_machines must be at least 1, got 0"),
    "machine_rank_past_the_machines": ({"num_machines": 2, "machine_rank": 2}, [], "machine_rank 2"),
    "main_process_port_past_65535": ({"main_process_port": 70000}, [], "main_process_port 70000"),
    "dynamo_backend_unknown": ({"dynamo_config": {"dynamo_backend": "BOGUS"}}, [], "dynamo_backend 'BOGUS'"),
    "config_empty": ("", [], "not a valid accelerate config"),
    "config_a_list": ("- a\n- b\n", [], "not a valid accelerate config"),
    "config_a_folder": ("<folder>", [], "is a folder"),
    "flag_num_processes_zero": ({}, ["--num_processes", "0"], "num_processes must be at least 1, got 0"),
    "flag_num_machines_zero": ({}, ["--num_machines", "0"], "num_machines must be at least 1, got 0"),
    "flag_machine_rank_negative": ({}, ["--machine_rank", "-1"], "machine_rank -1"),
}


@pytest.mark.parametrize("case", list(LAUNCHER))
def test_a_bad_launch_is_one_line_before_anything_starts(case, tmp_path, capsys):
    import yaml

    changes, flags, fragment = LAUNCHER[case]
    config = tmp_path / "accelerate.yaml"
    if changes == "<folder>":
        config.mkdir()
    elif isinstance(changes, str):
        config.write_text(changes)
    else:
        config.write_text(yaml.safe_dump({**ACCELERATE_BASE, **changes}))
    script = tmp_path / "would_train.py"  # had the launcher started it, it would leave this mark
    script.write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    _refused(capsys, launch_main, ["--config_file", str(config), *flags, str(script)], fragment)
    assert not (tmp_path / "started").exists()


@pytest.mark.slow  # a launcher process of its own: ~10 s
def test_a_bad_accelerate_config_from_the_command_line(tmp_path):
    import yaml

    config = tmp_path / "accelerate.yaml"
    config.write_text(yaml.safe_dump({**ACCELERATE_BASE, "num_processes": 0}))
    result = subprocess.run(
        [sys.executable, "-m", "finetune.launch", "--config_file", str(config), "finetune/run.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(errors) == 1 and "num_processes" in errors[0]


def _disk_full(path: str = "") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def test_disk_full_during_a_checkpoint_save(world, tmp_path, monkeypatch, capsys):
    """The second save runs out of space half-way: one line, the half-written save is removed, the
    first checkpoint is whole (it loads: tests/test_reliability.py resumes after a save cut short)."""
    from accelerate import Accelerator

    out = tmp_path / "run"
    original, calls = Accelerator.save_state, []

    def save_state(self, output_dir=None, **kwargs):
        calls.append(output_dir)
        result = original(self, output_dir, **kwargs)
        if len(calls) == 2:
            raise _disk_full(str(Path(output_dir) / "optimizer.bin"))
        return result

    monkeypatch.setattr(Accelerator, "save_state", save_state)
    data = {"train": world.train, "validation": world.validation}
    argv = tiny_text_args(data, out, "max_steps=3", "save_steps=1", "per_device_train_batch_size=8")
    _refused(capsys, main, argv, "No space left on device", "step-00000001")
    assert sorted(p.name for p in (out / ckpt.CHECKPOINTS).iterdir()) == ["step-00000001"]
    assert ckpt.checkpoint_problem(out / ckpt.CHECKPOINTS / "step-00000001") is None


def test_disk_full_writing_the_manifest(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    original, calls = ckpt._fsync_tree, []

    def fsync_tree(path):
        calls.append(path)
        if len(calls) == 3:  # twice a save: the second save's first flush
            raise _disk_full(str(path / ckpt.MANIFEST))
        return original(path)

    monkeypatch.setattr(ckpt, "_fsync_tree", fsync_tree)
    data = {"train": world.train, "validation": world.validation}
    _refused(
        capsys,
        main,
        tiny_text_args(data, out, "max_steps=3", "save_steps=1", "per_device_train_batch_size=8"),
        "No space left on device",
    )
    assert sorted(p.name for p in (out / ckpt.CHECKPOINTS).iterdir()) == ["step-00000001"]


@pytest.mark.parametrize("where", ["export", "metrics log"])
def test_disk_full_in_an_overwrite_keeps_the_earlier_run(where, world, copy, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise _disk_full(str(copy / ("model/README.md" if where == "export" else "metrics.jsonl")))

    if where == "export":
        monkeypatch.setattr(export, "write_model_card", full)
    else:
        monkeypatch.setattr(run.MetricsLog, "log", full)
    before = _hashes(copy)
    _refused(capsys, main, _text(world, copy, "max_steps=1"), "No space left on device")
    _previous_run_kept(copy, before)
