"""The speed levers: the app's loop as shipped against the same loop with one thing changed, on short
runs, interleaved (on, off, on, off, ...) so that a shared machine's changing load hits both alike.

    python -m benchmarks.bench --levers                          # every lever of the recipe
    python -m benchmarks.bench --levers-only attention_kernel fp32 --lever-steps 40 --lever-reps 2

A lever is turned off by recipe overrides, by Accelerate's environment variables (precision, the
compiler), or, for AdamW's implementation, which no setting chooses, by replacing torch's AdamW for
the changed run (`adamw_with`). on / off = the shipped setting's samples/s over the changed one's.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.recipes import RECIPES, recipe_config, recipe_task
from benchmarks.runs import environment, run_app
from finetune.data import load_splits, prepare_splits
from finetune.models import load_preprocessor
from finetune.runtime import attention_kernel

LEVERS: dict[str, dict[str, Any]] = {
    # name: what "on" is (the app's default) and how "off" differs; "task" and "recipes": where it applies
    "group_by_length": {
        "on": "batches of similar length (recipe)",
        "off": "random batches",
        "overrides": ["group_by_length=false"],
        "task": lambda task: "group_by_length" in task.own_settings,
    },
    "frozen_embeddings": {
        "on": "freeze_embeddings=true (recipe)",
        "off": "word embeddings trained",
        "overrides": ["freeze_embeddings=false"],
        "task": lambda task: task.has_word_embeddings,
    },
    "no_dropout": {
        "on": "dropout=0 (recipe)",
        "off": "the model's dropout (0.1)",
        "overrides": ["dropout=null"],
        "recipes": ["bert", "bert_full"],
    },
    "batch_32": {
        "on": "per_device_train_batch_size=32, learning_rate=2e-4 (recipe)",
        "off": "batch 16, learning_rate=1e-4 (the same samples in twice the steps)",
        "overrides": ["per_device_train_batch_size=16", "learning_rate=1e-4"],
        "steps_scale": 2,
        "recipes": ["bert"],
    },
    "batch_64": {
        "on": "per_device_train_batch_size=64, learning_rate=2e-4 (recipe)",
        "off": "batch 32, learning_rate=1e-4 (the same samples in twice the steps)",
        "overrides": ["per_device_train_batch_size=32", "learning_rate=1e-4"],
        "steps_scale": 2,
        "recipes": ["bert_full"],
    },
    "frozen_layers": {
        "on": "freeze_layers=2 (recipe): backward stops at layer 2",
        "off": "freeze_layers=0: only the word embeddings frozen",
        "overrides": ["freeze_layers=0"],
        "recipes": ["bert_full"],
    },
    "no_gradient_checkpointing": {
        "on": "activations kept for backward (gradient_checkpointing=false)",
        "off": "gradient_checkpointing=true: recomputed in backward, less memory",
        "overrides": ["gradient_checkpointing=true"],
    },
    "no_host_sync_per_step": {
        "on": "loss read back every logging_steps (10)",
        "off": "read back and logged every step",
        "overrides": ["logging_steps=1"],
    },
    "attention_kernel": {
        "on": "attn_implementation=null: eager under bf16/fp16 on a CPU, else SDPA",
        "off": "the other kernel",
        # the one the app does not choose (its choice: finetune.runtime.attention_kernel; None is SDPA)
        "overrides": lambda chosen: ["attn_implementation=" + ("sdpa" if chosen == "eager" else "eager")],
    },
    "fused_adamw": {
        "on": "AdamW(fused=True)",
        "off": "AdamW(foreach=True)",
        "adamw": {"fused": False, "foreach": True},
    },
    "fused_adamw_vs_default": {
        "on": "AdamW(fused=True)",
        "off": "AdamW() default (for-loop on CPU)",
        "adamw": {"fused": None, "foreach": None},
    },
    "in_process_data": {
        "on": "dataloader_num_workers=null (0 on a CPU)",
        "off": "dataloader_num_workers=1",
        "overrides": ["dataloader_num_workers=1"],
    },
    "fp32": {
        "on": "mixed_precision=no",
        "off": "mixed_precision=bf16 (autocast)",
        "env": {"ACCELERATE_MIXED_PRECISION": "bf16"},
    },
    "ddp_no_static_graph": {
        "on": "ddp_static_graph=false",
        "off": "ddp_static_graph=true",
        "overrides": ["ddp_static_graph=true"],
        "ddp": True,
    },
    "ddp_no_bucket_view": {
        "on": "ddp_gradient_as_bucket_view=false",
        "off": "ddp_gradient_as_bucket_view=true",
        "overrides": ["ddp_gradient_as_bucket_view=true"],
        "ddp": True,
    },
    "cpu_threads": {
        "on": "cpu_threads=null: this process's share of the cores",
        "off": "cpu_threads=1 (what `accelerate launch` leaves a CPU process)",
        "overrides": ["cpu_threads=1"],
        "cpu": True,
    },
    "eager_mode": {
        "on": "no torch.compile",
        "off": "Accelerate's whole-model torch.compile (ACCELERATE_DYNAMO_BACKEND=INDUCTOR), per-batch padding",
        "env": {"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"},
        "optional": True,
    },
    "per_batch_padding": {
        "on": "length_buckets=null: each batch padded to its own longest",
        "off": "length_buckets=4: each batch padded to one of 4 lengths (eager)",
        "overrides": ["length_buckets=4"],
        "task": lambda task: "length_buckets" in task.own_settings,
    },
    "eager_vs_compiled_buckets": {
        "on": "no torch.compile",
        "off": "torch_compile=true length_buckets=4: whole-model compile, static shapes (warm-up outside the timing)",
        "overrides": ["torch_compile=true", "length_buckets=4"],
        "task": lambda task: "length_buckets" in task.own_settings,
        "optional": True,
    },
    "eager_vs_compiled_dynamic": {
        "on": "no torch.compile",
        "off": "torch_compile=true: whole-model compile, dynamic shapes (warm-up outside the timing)",
        "overrides": ["torch_compile=true"],
        "optional": True,
    },
}


def lever_overrides(spec: dict[str, Any], device: torch.device) -> list[str]:
    """The overrides that turn a lever off; a callable one is given the attention kernel the app
    chooses unasked on this device and precision (the attention kernel's case)."""
    overrides = spec.get("overrides", [])
    if callable(overrides):
        return overrides(attention_kernel(None, device, os.environ.get("ACCELERATE_MIXED_PRECISION", "no")))
    return overrides


@contextlib.contextmanager
def adamw_with(**forced: Any) -> Iterator[None]:
    """torch.optim.AdamW with `forced` keyword arguments, for the block. The app has no setting for its
    AdamW implementation (it asks for the fused kernel on CPU and CUDA), so the changed run gets torch's
    class replaced: this changes what is measured; it observes nothing."""
    original = torch.optim.AdamW

    def make(*args, **kwargs):
        return original(*args, **{**kwargs, **forced})

    torch.optim.AdamW = make
    try:
        yield
    finally:
        torch.optim.AdamW = original


@contextlib.contextmanager
def lever_off(spec: dict[str, Any]) -> Iterator[None]:
    """What a lever changes besides the recipe: Accelerate's environment, AdamW's arguments."""
    with (
        environment(spec.get("env", {})),
        adamw_with(**spec["adamw"]) if "adamw" in spec else contextlib.nullcontext(),
    ):
        yield


def lever_skipped(
    spec: dict[str, Any], recipe: str, args: argparse.Namespace, device: torch.device, processes: int
) -> str | None:
    """Why a lever does not apply to this recipe and setup, or None."""
    if spec.get("optional") and not args.compile:
        return "it needs --compile"
    if not spec.get("task", bool)(recipe_task(recipe)) or recipe not in spec.get("recipes", RECIPES):
        return f"it is not a lever of --recipe {recipe}"
    if spec.get("cpu") and device.type != "cpu":
        return "it is a CPU lever"
    if spec.get("ddp") and processes < 2:
        return "it needs several processes"
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def bench_levers(
    recipe: str, args: argparse.Namespace, tmp: Path, device: torch.device, processes: int
) -> list[dict]:
    """Each lever off against the app as shipped, `--lever-reps` interleaved pairs of `--lever-steps`
    steps. Ratio = app default / lever off."""
    rows = []
    short = ["max_eval_samples=64", "test_file=null"]
    for name, spec in LEVERS.items():
        if lever_skipped(spec, recipe, args, device, processes):
            continue
        if args.levers_only and name not in args.levers_only:
            continue
        steps = spec.get("steps", args.lever_steps)
        off_steps = steps * spec.get("steps_scale", 1)  # the same samples when the batch differs
        on_cfg = recipe_config(recipe, args, tmp / f"lever-{name}", short + [f"max_steps={steps}"])
        off_cfg = recipe_config(recipe, args, tmp / f"lever-{name}",
                                short + [f"max_steps={off_steps}"] + lever_overrides(spec, device))  # fmt: skip
        on_runs, off_runs = [], []
        for _ in range(args.lever_reps):
            on_runs.append(run_app(on_cfg, args.warmup, device))
            with lever_off(spec):
                off_runs.append(run_app(off_cfg, args.warmup, device))

        def med(runs, key):
            values = sorted(r[key] for r in runs)
            return values[len(values) // 2]

        pairs = list(zip(on_runs, off_runs, strict=True))
        row = {
            "lever": name, "on": spec["on"], "off": spec["off"], "steps": steps,
            "on_samples_per_s": [r["samples_per_s"] for r in on_runs],
            "off_samples_per_s": [r["samples_per_s"] for r in off_runs],
            "on_padded_tokens": med(on_runs, "padded_tokens"), "off_padded_tokens": med(off_runs, "padded_tokens"),
            "on_phases_s": on_runs[-1]["phases_s"], "off_phases_s": off_runs[-1]["phases_s"],
            "on_first_step_s": [r["first_step_s"] for r in on_runs],
            "off_first_step_s": [r["first_step_s"] for r in off_runs],
            # the run's "data" phase: loading and preparing (tokenizing) the splits
            "on_data_s": on_runs[-1]["stages_s"].get("data"), "off_data_s": off_runs[-1]["stages_s"].get("data"),
            "ratio_per_rep": [a["samples_per_s"] / b["samples_per_s"] for a, b in pairs],
            "cpu_ratio_per_rep": [ratio(a["samples_per_cpu_s"], b["samples_per_cpu_s"]) for a, b in pairs],
            "other_processes_cpu_cores": [r["other_processes_cpu_cores"] for r in on_runs + off_runs],
            "load_avg": [r["load_avg_before"][0] for r in on_runs + off_runs],
        }  # fmt: skip
        row["ratio"] = geomean(row["ratio_per_rep"])
        row["cpu_ratio"] = geomean([x for x in row["cpu_ratio_per_rep"] if x])
        rows.append(row)
        print(
            f"lever {name}: on/off = {row['ratio']:.2f}x wall, {row['cpu_ratio'] or 0:.2f}x CPU; first step "
            f"{max(row['on_first_step_s']):.1f} s on, {max(row['off_first_step_s']):.1f} s off",
            flush=True,
        )
    return rows


def tokenize_cache(recipe: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """Seconds to prepare (tokenize) the recipe's splits with datasets' cache warm and with caching off."""
    import datasets

    cfg = recipe_config(recipe, args, tmp / "tokenize")
    raw, _ = load_splits(cfg.data_args)
    tokenizer = load_preprocessor(cfg.model_args)
    out = {}
    for label, enabled in (("cached", True), ("uncached", False), ("cached_again", True)):
        (datasets.enable_caching if enabled else datasets.disable_caching)()
        t = time.perf_counter()
        prepare_splits(cfg.data_args, raw, tokenizer)
        out[label + "_s"] = time.perf_counter() - t
    datasets.enable_caching()
    return out
