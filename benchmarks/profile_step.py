"""Where a MiniLM training step's time goes: torch.profiler over a few steps of the bundled model.

    python -m benchmarks.profile_step                          # bf16 autocast, eager attention, batch 32 x 32
    python -m benchmarks.profile_step --attention sdpa         # SDPA's fused kernels instead
    python -m benchmarks.profile_step --precision no --batch 64 --length 32

The step is the app's under its default recipe's choices (word embeddings frozen, dropout off, fused
AdamW), on one fixed-shape batch of real sentences, after three warm-up steps. Prints the step time
and the ops that took the most time, grouped: weight GEMMs (mm, addmm), attention matmuls (bmm),
SDPA's kernels, autocast's casts (copy_, _to_copy), AdamW, and the rest.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from finetune.config import CONFIGS_DIR, load_config
from finetune.data import load_splits
from finetune.errors import ArgumentParser, UserError, exit_on_user_error
from finetune.models import build_model, load_preprocessor

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
    cfg = load_config(CONFIGS_DIR / "bert_rotten_tomatoes.yaml", ["output_dir=/nonexistent"])
    raw, label_names = load_splits(cfg.data_args)
    tokenizer = load_preprocessor(cfg.model_args)
    torch.manual_seed(0)
    model = build_model(cfg.model_args, label_names, vocab_size=len(tokenizer))
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and args.length > limit:
        raise UserError(f"--length {args.length} exceeds the model's position limit {limit}")
    model.set_attn_implementation(args.attention)
    model.get_input_embeddings().requires_grad_(False)
    model.train()
    rows = raw["train"].select(range(args.batch)).to_dict()
    batch = tokenizer(
        rows["text"], padding="max_length", truncation=True, max_length=args.length, return_tensors="pt"
    )
    labels = torch.tensor(rows["labels"])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(**batch, labels=labels).loss
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
