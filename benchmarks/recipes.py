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
    "vit": CONFIGS_DIR / "vit_fashion_mnist.yaml",
}
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
# What --seq-len sets: a task whose samples have a token length has these settings.
SEQ_LEN_SETTINGS = frozenset({"max_length", "pad_to_multiple_of"})
# Keys a benchmark sets itself, and why.
RESERVED_OVERRIDES = dict.fromkeys(
    ("output_dir", "overwrite_output_dir", "resume_from_checkpoint"),
    "the benchmark trains in a temporary directory; --out says where its report goes",
)


@functools.cache
def recipe_task(recipe: str) -> Task:
    """The task of a recipe of `RECIPES` (finetune/tasks.py): what its model reads."""
    return task_of(load_config(RECIPES[recipe]).task)


def recipe_overrides(recipe: str, args: argparse.Namespace) -> list[str]:
    """What the bench's options add to a recipe (--smoke, --seq-len, --steps, --override), as shown in
    its report."""
    task = recipe_task(recipe)
    extra = list(SMOKE[task.modality]) if args.smoke else []
    if args.seq_len and SEQ_LEN_SETTINGS <= task.own_settings:
        extra += [f"max_length={args.seq_len}", f"pad_to_multiple_of={args.seq_len}"]
    return extra + ([f"max_steps={args.steps}"] if args.steps else []) + list(args.override)


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
    for override in args.override:
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
