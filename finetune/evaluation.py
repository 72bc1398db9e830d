"""The evaluation loop, shared by training (validation and test splits) and
finetune/evaluate_checkpoint.py: logits (through model-parallel stages when asked), gathered over
processes without Accelerate's duplicated samples, reported by finetune/metrics.py.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from finetune.metrics import report
from finetune.problems import per_sample_loss, predictions


def longest_first(lengths: list[int]) -> list[int]:
    """Sample indices by decreasing length (ties in dataset order): a sampler for evaluation."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def forward(model, batch: dict[str, torch.Tensor], chunks: int = 1) -> torch.Tensor:
    """Logits of a batch; with `chunks` > 1, GPipe-style micro-batches through model-parallel stages."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if chunks > 1:
        from finetune.parallel import pipelined_forward

        return pipelined_forward(model, inputs, chunks)
    return model(**inputs).logits


@torch.no_grad()
def evaluate_model(
    model,
    loader,
    accelerator: Accelerator,
    label_names: list[str],
    chunks: int = 1,
    problem_type: str | None = None,
    threshold: float = 0.5,
) -> dict:
    """The problem type's metrics (finetune/problems.py: accuracy and per-class metrics; mse,
    pearson...; micro F1 at `threshold`...) and loss over exactly the dataset: `gather_for_metrics`
    drops the samples Accelerate duplicated to even out the last batch, and the count is asserted."""
    model.eval()
    preds, refs, losses = [], [], []
    for batch in loader:
        logits = forward(model, batch, chunks)
        labels = batch["labels"].to(logits.device)
        loss = per_sample_loss(logits, labels, problem_type)
        p, r, lo = accelerator.gather_for_metrics((predictions(logits, problem_type), labels, loss))
        preds.append(p.cpu())
        refs.append(r.cpu())
        losses.append(lo.float().cpu())
    model.train()
    preds_t, refs_t = torch.cat(preds), torch.cat(refs)
    expected = len(loader.dataset)
    if len(refs_t) != expected:
        raise RuntimeError(f"evaluated {len(refs_t)} samples, the dataset has {expected}")
    metrics = report(problem_type, preds_t, refs_t, label_names, threshold)
    metrics["loss"] = torch.cat(losses).mean().item()
    return metrics
