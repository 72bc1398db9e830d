"""The speed levers of the photos recipe, one training step of the bundled EfficientNet-Lite0 each: batches
laid out channels last (what `finetune/tasks/images.py`'s `stack_images` collates), the stem and first 8 of 16
blocks frozen (the recipe's `freeze_layers=8`), and a smaller `image_size`. Every variant runs in this
one process, round after round in turn, so a busy machine slows them alike: the figures are each one's
fastest step and its ratio to the plain step (224x224, channels first, every block trained). BatchNorm
is frozen as the recipe has it; batch 16, AdamW, random pixels (a step's time does not depend on them).

    python -m benchmarks.image_levers --out benchmarks/results [--rounds 3]

Writes `image_levers.json` and `image_levers.md` in --out, the machine first.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parent.parent
VARIANTS = [  # (image size, channels last, blocks frozen)
    (224, False, 0), (224, True, 0), (224, True, 8), (160, True, 0), (160, True, 8),
]


def _model():
    from transformers import AutoModelForImageClassification

    from finetune.models import freeze_batchnorm

    model = AutoModelForImageClassification.from_pretrained(
        REPO / "data" / "efficientnet_lite0", num_labels=10, ignore_mismatched_sizes=True)
    model.train()
    freeze_batchnorm(model)
    return model


def _step(model, optimizer, size: int, channels_last: bool, frozen: int) -> float:
    blocks = model.efficientnet.encoder.blocks
    model.efficientnet.embeddings.requires_grad_(frozen == 0)
    for i, block in enumerate(blocks):
        block.requires_grad_(i >= frozen)
    pixels, labels = torch.randn(16, 3, size, size), torch.randint(0, 10, (16,))
    if channels_last:
        pixels = pixels.contiguous(memory_format=torch.channels_last)
    started = time.perf_counter()
    model(pixel_values=pixels, labels=labels).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.image_levers", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    for variant in VARIANTS:  # a warm-up step each: kernels chosen, memory allocated
        _step(model, optimizer, *variant)
    seconds: dict[tuple, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            seconds[variant].append(_step(model, optimizer, *variant))
    plain = min(seconds[VARIANTS[0]])
    rows = [{"image_size": s, "channels_last": c, "frozen_blocks": f, "step_seconds": round(min(seconds[(s, c, f)]), 3),
             "ratio": round(min(seconds[(s, c, f)]) / plain, 2)} for s, c, f in VARIANTS]  # fmt: skip
    m = machine()
    table = "\n".join([
        "# The photos recipe's speed levers: one EfficientNet-Lite0 training step (batch 16)", "",
        machine_line(m), "",
        "| image size | channels last | blocks frozen | fastest step, s | against the plain step |", "|---|---|---|---|---|",
        *(f"| {r['image_size']} | {'yes' if r['channels_last'] else 'no'} | {r['frozen_blocks']} | {r['step_seconds']:.2f} | "
          f"{r['ratio']:.2f} |" for r in rows), "",
        f"The fastest of {args.rounds} rounds, the variants in turn in one process; BatchNorm frozen, AdamW.", "",
        f"`python -m benchmarks.image_levers --out {args.out} --rounds {args.rounds}`",
    ])  # fmt: skip
    write_report(args.out, "image_levers", {"machine": m, "rows": rows, "rounds": args.rounds}, table)


if __name__ == "__main__":
    main()
