"""Where a MiniLM training step's time goes: torch.profiler over a few steps of the bundled model.

    python -m benchmarks.profile_step                          # bf16 autocast, eager attention, batch 32 x 32
    python -m benchmarks.profile_step --attention sdpa         # SDPA's fused kernels instead
    python -m benchmarks.profile_step --precision no --batch 64 --length 32

The step is the app's under its default recipe's choices: the model as `finetune.run.build_model_and_data`
builds it (word embeddings frozen, dropout off, the asked attention kernel), fused AdamW, on one
fixed-shape batch of real sentences (the recipe's first, collated by its task), after three warm-up steps. Prints the step time
and the ops that took the most time, grouped: weight GEMMs (mm, addmm), attention matmuls (bmm),
SDPA's kernels, autocast's casts (copy_, _to_copy), AdamW, and the rest.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.profiler import ProfilerActivity, profile

from benchmarks.recipes import RECIPES
from benchmarks.runs import reset_accelerate
from finetune.config import load_config
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.run import build_model_and_data
from finetune.tasks import task_of

GROUPS = {
    "weight GEMMs (mm, addmm)": ("aten::mm", "aten::addmm"),
    "attention matmuls (bmm)": ("aten::bmm",),
    "SDPA kernels": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "casts (copy_)": ("aten::copy_",),
    "AdamW": ("aten::_fused_adamw_",),
}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__.split("\n")[0])
    p.add_argument("--precision", choices=["bf16", "no"], default="bf16")
    p.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 warm-up steps)")
    args = p.parse_args(argv)
    for name in ("batch", "length", "steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    cfg = load_config(RECIPES["bert"], [
        "output_dir=/nonexistent", f"attn_implementation={args.attention}", f"max_train_samples={args.batch}",
        "max_eval_samples=1", "test_file=null", f"max_length={args.length}", f"pad_to_multiple_of={args.length}",
    ])  # fmt: skip
    reset_accelerate()
    accelerator = Accelerator(mixed_precision="bf16" if args.precision == "bf16" else "no")
    set_seed(cfg.seed)
    built = build_model_and_data(cfg, accelerator)
    model, tokenizer, splits = built.model, built.preprocessor, built.splits
    model.train()
    # `length` tokens each: truncated to max_length, padded to a multiple of it
    batch = task_of(cfg.task).collator(tokenizer, args.length)(list(splits["train"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)

    def step() -> None:
        with accelerator.autocast():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        seconds = (time.perf_counter() - t) / args.steps
    reset_accelerate()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    shares = {
        group: sum(e.self_cpu_time_total for e in events if e.key in names) / total
        for group, names in GROUPS.items()
    }
    shares["the rest"] = 1 - sum(shares.values())
    print(
        f"{args.precision}, {args.attention} attention, batch {args.batch} x {args.length} tokens: "
        f"{seconds * 1e3:.0f} ms a step (profiled; {args.batch / seconds:.0f} samples/s)"
    )
    for group, share in shares.items():
        print(f"  {group:28s} {share:6.1%}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))
    return {"step_s": seconds, **shares}


if __name__ == "__main__":
    main()
