"""Where a MiniLM training step's time goes: torch.profiler over a few steps of the bundled model.

    python -m benchmarks.profile_step                          # bf16 autocast, eager attention, batch 32 x 32
    python -m benchmarks.profile_step --attention sdpa         # SDPA's fused kernels instead
    python -m benchmarks.profile_step --precision no --batch 64 --length 32

The step is the app's under its default recipe's choices: the model as `finetune.run.build_model_and_data`
builds it (word embeddings frozen, dropout off, the asked attention kernel), fused AdamW, on one
fixed-shape batch of real sentences (the recipe's first, collated by its task), after three warm-up steps. Prints the step time
and the ops that took the most time, grouped: weight GEMMs (mm, addmm), attention matmuls (bmm),
SDPA's kernels, autocast's casts (copy_, _to_copy), AdamW, and the rest.

With `--out DIR` it also writes `profile_step_<precision>_<attention>_<batch>x<length>.md` and `.json` (the machine named) with what bounds the
MFU (`python -m benchmarks.bench`'s figure): the step's model FLOPs (benchmarks/flops.py) over the
square-GEMM peak timed in the same run (benchmarks/peak.py), and the weight GEMMs' own FLOP/s at the
model's shapes (FLOPs of every `mm`/`addmm` as torch counts them, over their profiled time). The MFU
is about the GEMMs' share of the step times their FLOP/s over the peak; with nothing else taking time
(casts, elementwise ops, LayerNorm, AdamW) it would be their FLOP/s over the peak, its ceiling at
these shapes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.profiler import ProfilerActivity, profile

from benchmarks.flops import flop_model, token_flops, tokens_per_image
from benchmarks.peak import PEAK_DTYPES, gemm_peak
from benchmarks.recipes import RECIPES
from benchmarks.report import machine, machine_line, write_report
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
    p.add_argument("--recipe", choices=["bert", "vit"], default="bert", help="bert: the default recipe's MiniLM; "
                   "vit: the ViT of vit_fashion_mnist.yaml (its own image size: --length not read)")  # fmt: skip
    p.add_argument("--precision", choices=["bf16", "no"], default="bf16")
    p.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 warm-up steps)")
    p.add_argument("--out", type=Path, default=None, help="also write profile_step.md and .json here")
    p.add_argument("--gemm-size", type=int, default=2048, help="the square GEMM of the peak (with --out)")
    args = p.parse_args(argv)
    for name in ("batch", "length", "steps"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    return args


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    text = args.recipe == "bert"  # a ViT's samples are its patches and [CLS]: --length is not read
    cfg = load_config(RECIPES[args.recipe], [
        "output_dir=/nonexistent", f"attn_implementation={args.attention}", f"max_train_samples={args.batch}",
        "max_eval_samples=1", "test_file=null",
        *([f"max_length={args.length}", f"pad_to_multiple_of={args.length}"] if text else []),
    ])  # fmt: skip
    reset_accelerate()
    accelerator = Accelerator(mixed_precision="bf16" if args.precision == "bf16" else "no")
    set_seed(cfg.seed)
    built = build_model_and_data(cfg, accelerator)
    model, tokenizer, splits = built.model, built.preprocessor, built.splits
    model.train()
    # `length` tokens each: truncated to max_length, padded to a multiple of it
    batch = task_of(cfg.task).collator(tokenizer, args.length if text else None)(list(splits["train"]))
    args.length = args.length if text else tokens_per_image(model.config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)

    def step() -> None:
        with accelerator.autocast():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    peak_before = gemm_peak(PEAK_DTYPES[args.precision], args.gemm_size, 5, torch.device("cpu")) if args.out else None
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        seconds = (time.perf_counter() - t) / args.steps
    counted = gemm_flops(step) if args.out is not None else {}
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
    result = {"step_s": seconds, **shares}
    if args.out is not None:
        write_ceiling(args, result, events, counted, model, peak_before)
    return result


def gemm_flops(step) -> dict[str, float]:
    """FLOPs of one step by op, as torch counts them (`FlopCounterMode`), the step run once more."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return {str(op).split(".")[1]: n for op, n in counter.get_flop_counts()["Global"].items()}


def write_ceiling(args, result: dict[str, float], events, counted: dict[str, float], model, peak_before: dict) -> None:
    """profile_step.md/json: the step's MFU against the square-GEMM peak, and the ceiling its weight
    GEMMs' FLOP/s at the model's shapes and share of the step put on it (the module docstring)."""
    dtype = PEAK_DTYPES[args.precision]
    # the best of two, one before the steps and one after: on a shared machine the best is the hardware's limit
    peak = max(peak_before, gemm_peak(dtype, args.gemm_size, 5, torch.device("cpu")), key=lambda p: p["flops_per_s"])
    model_flops = args.batch * args.length * token_flops(flop_model(model), args.length)
    gemm_s = sum(e.self_cpu_time_total for e in events if e.key in GROUPS["weight GEMMs (mm, addmm)"]) / 1e6 / args.steps
    weight_gemm_flops = counted.get("mm", 0.0) + counted.get("addmm", 0.0)
    gemm_rate = weight_gemm_flops / gemm_s if gemm_s else 0.0
    # the profiler's times are CPU time over both threads' ops; the GEMMs' share is of that total
    share = result["weight GEMMs (mm, addmm)"]
    report = {
        "command": "python -m benchmarks.profile_step " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "machine": machine(), "precision": args.precision, "attention": args.attention,
        "batch": args.batch, "length": args.length, "step_s": result["step_s"], "shares": {k: v for k, v in result.items() if k != "step_s"},
        "peak": peak, "model_flops_per_step": model_flops, "mfu": model_flops / result["step_s"] / peak["flops_per_s"],
        "flops_counted_by_torch": counted, "weight_gemm_s_per_step": gemm_s,
        "weight_gemm_flops_per_s": gemm_rate, "weight_gemm_over_peak": gemm_rate / peak["flops_per_s"],
        "mfu_ceiling": share * gemm_rate / peak["flops_per_s"],  # ~ the MFU: the GEMMs' share x their efficiency
    }  # fmt: skip
    lines = [
        f"{machine_line(report['machine'])}; {args.precision}, {args.attention} attention, batch {args.batch} x {args.length} tokens.",
        f"Command: `{report['command']}`", "",
        f"Step: {result['step_s'] * 1e3:.0f} ms; model FLOPs {model_flops / 1e9:.1f} G a step "
        f"({model_flops / result['step_s'] / 1e9:.0f} GFLOP/s); square-GEMM peak ({peak['dtype']}, {args.gemm_size}^3) "
        f"{peak['flops_per_s'] / 1e9:.0f} GFLOP/s: **MFU {report['mfu']:.3f}**.", "",
        "| group of ops | share of the step's op time |", "|---|---:|",
        *[f"| {k} | {v:.1%} |" for k, v in report["shares"].items()], "",
        f"Weight GEMMs (`mm`, `addmm`): {weight_gemm_flops / 1e9:.1f} GFLOP a step as torch counts them, in "
        f"{gemm_s * 1e3:.0f} ms of op time: {gemm_rate / 1e9:.0f} GFLOP/s at the model's shapes, "
        f"**{report['weight_gemm_over_peak']:.2f} of the square-GEMM peak**: the MFU if nothing but them took time. "
        f"At {share:.1%} of the step they give an MFU of about {share:.2f} x {report['weight_gemm_over_peak']:.2f} = "
        f"{report['mfu_ceiling']:.3f} (measured: {report['mfu']:.3f}); an MFU of 0.35 at these shapes needs them to "
        f"take {min(0.35 / max(report['weight_gemm_over_peak'], 1e-9), 9.99):.0%} of the step.",
    ]  # fmt: skip
    recipe = "" if args.recipe == "bert" else f"{args.recipe}_"
    write_report(args.out, f"profile_step_{recipe}{args.precision}_{args.attention}_{args.batch}x{args.length}", report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
