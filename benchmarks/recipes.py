"""The recipes the benchmarks run, their `--smoke` versions, and what a benchmark's `--override` may
not set. A benchmark trains in a temporary directory; only its report goes to `--out`.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Mapping
from pathlib import Path

from finetune.config import CONFIGS_DIR, TrainConfig, load_config
from finetune.tasks import Task, task_of

RECIPES = {
    "bert": CONFIGS_DIR / "bert_rotten_tomatoes.yaml",
    "bert_full": CONFIGS_DIR / "bert_rotten_tomatoes_full.yaml",
    "ner": CONFIGS_DIR / "bert_ner.yaml",
    "qa": CONFIGS_DIR / "bert_qa.yaml",
    "choices": CONFIGS_DIR / "bert_choices.yaml",
    "vit": CONFIGS_DIR / "vit_fashion_mnist.yaml",
    "efficientnet": CONFIGS_DIR / "efficientnet_photos.yaml",
}
# `--recipe all`: one recipe of each task the app trains (text and image classification, tagging,
# question answering, multiple choice) and each image architecture (a ViT from a config, the pretrained
# EfficientNet).
EVERY_TASK = ["bert", "ner", "qa", "choices", "vit", "efficientnet"]
# --smoke, by the recipe's task modality: tiny models built from config on a slice of the bundled
# data (the tests' runs).
SMOKE = {
    "text": [
        "model_config={model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
        "intermediate_size: 37, max_position_embeddings: 128}",
        "max_train_samples=64", "max_eval_samples=16", "max_test_samples=32", "max_length=32",
        "per_device_train_batch_size=8", "per_device_eval_batch_size=32",
    ],
    "image": [
        "model_config={model_type: vit, image_size: 28, patch_size: 7, num_channels: 3, hidden_size: 32, "
        "num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 37}",
        "max_train_samples=64", "max_eval_samples=16", "max_test_samples=32",
        "per_device_train_batch_size=8", "per_device_eval_batch_size=32",
    ],
}  # fmt: skip
# --smoke, a recipe's own on top of its modality's: QA's overlap fits the smoke max_length; the photos
# recipe keeps a convolutional BatchNorm model (a tiny EfficientNet, 2 blocks, 32x32), none frozen.
SMOKE_OWN = {
    "qa": ["doc_stride=8"],
    "efficientnet": [
        "model_config={model_type: efficientnet, image_size: 32, num_channels: 3, width_coefficient: 0.25, "
        "depth_coefficient: 0.25, hidden_dim: 320, kernel_sizes: [3, 3], in_channels: [32, 16], "
        "out_channels: [16, 24], num_block_repeats: [1, 1], strides: [1, 2], expand_ratios: [1, 6], "
        "depthwise_padding: [], hidden_act: relu6, dropout_rate: 0.0, drop_connect_rate: 0.0}",
        "freeze_layers=0", "max_train_samples=64", "max_eval_samples=16", "max_test_samples=32",
        "per_device_train_batch_size=8", "per_device_eval_batch_size=32",
    ],
}  # fmt: skip
# What --seq-len sets: a task whose samples have a token length has these settings.
SEQ_LEN_SETTINGS = frozenset({"max_length", "pad_to_multiple_of"})
# Keys a benchmark sets itself, and why.
RESERVED_OVERRIDES = dict.fromkeys(
    ("output_dir", "overwrite_output_dir", "resume_from_checkpoint"),
    "the benchmark trains in a temporary directory; --out says where its report goes",
)


@functools.cache
def recipe_task(recipe: str) -> Task:
    """The task of a recipe of `RECIPES` (finetune/tasks/): what its model reads."""
    return task_of(load_config(RECIPES[recipe]).task)


def recipe_overrides(recipe: str, args: argparse.Namespace) -> list[str]:
    """What the bench's options add to a recipe (--smoke, --seq-len, --steps, --override), as shown in
    its report."""
    task = recipe_task(recipe)
    extra = smoke_settings(recipe) if args.smoke else []
    if args.seq_len and SEQ_LEN_SETTINGS <= task.own_settings:
        extra += [f"max_length={args.seq_len}", f"pad_to_multiple_of={args.seq_len}"]
    return extra + ([f"max_steps={args.steps}"] if args.steps else []) + list(args.override)


def smoke_settings(recipe: str) -> list[str]:
    """The --smoke settings of a recipe: its own (`SMOKE_OWN`) where it has them (a model of its
    kind), else its modality's, then its own additions."""
    own = SMOKE_OWN.get(recipe, [])
    if any(setting.startswith("model_config=") for setting in own):
        return list(own)
    return [*SMOKE[recipe_task(recipe).modality], *own]


def recipe_config(recipe: str, args: argparse.Namespace, out: Path, extra: list[str] = ()) -> TrainConfig:
    """The recipe with the bench's options, training in `out` without trackers, plus `extra`."""
    own = [f"output_dir={out}", "overwrite_output_dir=true", "report_to=[]"]
    return load_config(RECIPES[recipe], own + recipe_overrides(recipe, args) + list(extra))


def check_arguments(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    positive: list[str],
    reserved: Mapping[str, str] = RESERVED_OVERRIDES,
) -> None:
    """Mistakes in a benchmark's arguments, found before any run: `positive` options must be > 0,
    `--override` may not set a `reserved` key (each with why), and --out must be a directory this
    user can write."""
    for name in positive:
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    for override in getattr(args, "override", []):
        key = override.split("=", 1)[0].strip()
        if key in reserved:
            p.error(f"--override {key}: {reserved[key]}")
    out = args.out
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file; give a directory for the report")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--out {out}: cannot create it ({e.strerror})")
    if not os.access(out, os.W_OK):
        p.error(f"--out {out}: not writable")
