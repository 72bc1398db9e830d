"""The evaluation loop, shared by training (validation and test splits) and
finetune/evaluate_checkpoint.py: logits (through model-parallel stages when asked), gathered over
processes without Accelerate's duplicated samples, reported by finetune/metrics.py.

A batch may carry `meta` (what its rows are, for the metrics; the model does not read it): word
windows say which sentence and first word they hold, so that tags are put back into sentences and
each word of the data is scored once, whatever the batching and the processes.

`evaluate_with_predictions` is the same loop keeping each sample's probabilities (or numbers, or a
sentence's tags) for evaluate_checkpoint.py's predictions.jsonl, which `write_predictions` writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from finetune.metrics import classification_report
from finetune.parallel import pipelined_forward
from finetune.problems import Problem, problem_of
from finetune.shapes import fill_rows

NOT_INPUTS = ("labels", "meta")  # batch keys the model does not take


def longest_first(lengths: list[int]) -> list[int]:
    """Sample indices by decreasing length (ties in dataset order): a sampler for evaluation."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def forward(model, batch: dict[str, torch.Tensor], problem: Problem, chunks: int = 1, rows: int | None = None) -> torch.Tensor:
    """The problem's outputs of a batch (`Problem.outputs`: the logits); with `chunks` > 1, GPipe-style
    micro-batches through model-parallel stages; with `rows`, a shorter batch is filled to that many rows
    for the model and its outputs cut back (finetune/shapes.py: the shapes a compiled model sees)."""
    inputs = {k: v for k, v in batch.items() if k not in NOT_INPUTS}
    if chunks > 1:
        return pipelined_forward(model, inputs, chunks, problem.outputs)
    if rows is None:
        return problem.outputs(model(**inputs), inputs)

    inputs, real = fill_rows(inputs, rows)
    # A compiled model in CUDA-graph mode (torch_compile_mode=reduce-overhead) writes every call's
    # outputs into the same memory: a new step is marked, and the logits are copied out of it.
    torch.compiler.cudagraph_mark_step_begin()
    return problem.outputs(model(**inputs), inputs)[:real].clone()


@torch.no_grad()
def evaluate_model(
    model,
    loader,
    accelerator: Accelerator,
    names: list[str],
    chunks: int = 1,
    problem_type: str | None = None,
    threshold: float | list[float] = 0.5,
    keep_predictions: bool = False,
    trivial=None,
    rows: int | None = None,
    data=None,
) -> dict:
    """The problem type's metrics (finetune/metrics.py) and loss over exactly the dataset:
    `gather_for_metrics` drops the samples Accelerate duplicated to even out the last batch, and the
    count is asserted. The loss is the mean over the loss's terms (samples; labelled tokens for tags).
    `keep_predictions=True` adds `predictions` and `references` (for tags each sentence's predicted tag
    ids), in the data's order. With `trivial` (`Problem.trivial`), `baseline` holds the metrics of always
    predicting it (plain tags: of each word's most frequent training tag). `rows`: each batch filled to
    that many rows for the model (`forward`)."""
    problem = problem_of(problem_type)
    if problem.windowed:
        metrics, gold = _evaluate_windows(model, loader, accelerator, names, problem, chunks, rows, data, threshold)
        if trivial is not None:
            metrics["baseline"] = problem.baseline(trivial, gold, names, dataset=loader.dataset)
        if keep_predictions:
            metrics["references"] = gold
        else:
            metrics.pop("predictions")
        return metrics
    model.eval()
    outputs, refs, losses, texts = [], [], [], []
    for batch in loader:
        logits = forward(model, batch, problem, chunks, rows)
        labels = batch["labels"].to(logits.device)
        loss = problem.loss(logits, labels)
        example = (batch["meta"]["example"].to(logits.device),) if "meta" in batch else ()  # text_windows only
        o, r, lo, *e = accelerator.gather_for_metrics((logits.float(), labels, loss, *example))
        outputs.append(o.cpu())
        refs.append(r.cpu())
        losses.append(lo.float().cpu())
        texts += [t.cpu() for t in e]
    model.train()
    logits_t, refs_t = torch.cat(outputs), torch.cat(refs)
    expected = len(loader.dataset)
    if len(refs_t) != expected:
        raise RuntimeError(f"evaluated {len(refs_t)} samples, the dataset has {expected}")
    if "example" in loader.dataset.column_names:  # a long text's windows (text_windows): scored once, together
        logits_t, refs_t = per_text(logits_t, refs_t, torch.cat(texts))
    preds_t = problem.predictions(logits_t)
    metrics = problem.report(preds_t, refs_t, names, threshold)
    metrics["loss"] = torch.cat(losses).mean().item()
    if trivial is not None:
        metrics["baseline"] = problem.baseline(trivial, refs_t, names, threshold)
    if keep_predictions:
        metrics["predictions"], metrics["references"] = preds_t, refs_t
        metrics["scores"] = problem.scores(logits_t)
    return metrics


def per_text(logits: torch.Tensor, labels: torch.Tensor, texts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each text's logits, the mean of its windows' (the mean, not the max: a window that only mentions a
    class does not outvote the rest of the text; benchmarks/long_documents.py measures both), and its label,
    in text order."""
    order, at = torch.unique(texts, sorted=True, return_inverse=True)
    sums = torch.zeros(len(order), *logits.shape[1:], dtype=logits.dtype).index_add_(0, at, logits)
    counts = torch.bincount(at, minlength=len(order)).to(logits.dtype)
    first = torch.full((len(order),), len(texts), dtype=torch.long).scatter_reduce_(
        0, at, torch.arange(len(texts)), reduce="amin")  # fmt: skip
    return sums / counts.view(-1, *[1] * (logits.dim() - 1)), labels[first]


def _evaluate_windows(model, loader, accelerator: Accelerator, names: list[str], problem: Problem, chunks: int,
                      rows: int | None, data, threshold=None) -> tuple[dict, list]:  # fmt: skip
    """A windowed problem (tags, spans): each window's predictions, labels and meta, gathered over processes
    (padded to one length first: windows differ in length), put back into their samples by the problem
    (`Problem.assemble`). The loss is the mean over the loss's terms."""
    model.eval()
    windows, loss_sum, terms = [], 0.0, 0
    for batch in loader:
        logits = forward(model, batch, problem, chunks, rows)
        labels = batch["labels"].to(logits.device)
        loss, weight = problem.loss(logits, labels), problem.loss_weights(labels)
        preds = accelerator.pad_across_processes(problem.predictions(logits), dim=1, pad_index=problem.pad_value)
        labels = accelerator.pad_across_processes(labels, dim=1, pad_index=-100)
        meta = {k: accelerator.pad_across_processes(v.to(logits.device), dim=1, pad_index=-1) if v.dim() > 1 else v.to(logits.device)
                for k, v in batch["meta"].items()}  # fmt: skip
        preds, labels, loss, weight, meta = accelerator.gather_for_metrics((preds, labels, loss, weight, meta))
        loss_sum, terms = loss_sum + loss.double().sum().item(), terms + int(weight.sum())
        meta = {k: v.cpu() for k, v in meta.items()}
        windows += [({k: v[i] for k, v in meta.items()}, p, g) for i, (p, g) in enumerate(zip(preds.cpu(), labels.cpu(), strict=True))]
    model.train()
    if len(windows) != len(loader.dataset):
        raise RuntimeError(f"evaluated {len(windows)} windows, the dataset has {len(loader.dataset)}")
    predicted, gold = problem.assemble(windows, loader.dataset, data)
    metrics = problem.report(predicted, gold, names, threshold)
    metrics["loss"] = loss_sum / max(terms, 1)
    metrics["predictions"] = predicted
    return metrics, gold


# --- predictions, per sample (finetune/evaluate_checkpoint.py's predictions.jsonl) ------------------------


class RecordProbabilities(torch.nn.Module):
    """The model, also keeping every batch's class probabilities (or predicted numbers) for
    predictions.jsonl.

    Called by `evaluate_model` inside its loop over the prepared loader, where Accelerate still
    knows which rows of the last batch are padding: `gather_for_metrics` here drops exactly the rows
    that evaluate_model's own gather drops, so the kept rows are the dataset's, in order, once each.
    """

    def __init__(self, model: torch.nn.Module, accelerator: Accelerator, problem: Problem):
        super().__init__()
        self.model, self.accelerator, self.problem = model, accelerator, problem
        self.probabilities: list[torch.Tensor] = []

    def forward(self, **inputs):
        output = self.model(**inputs)
        probabilities = self.problem.scores(self.problem.outputs(output, inputs))
        self.probabilities.append(self.accelerator.gather_for_metrics(probabilities).cpu())
        return output


def write_predictions(
    path: Path,
    probabilities: torch.Tensor | list,
    labels: list,
    names: list[str],
    inputs: list[dict[str, Any]] | None = None,
    problem_type: str | None = None,
    threshold: float | list[float] = 0.5,
    labelled: bool = True,
) -> None:
    """One line per sample, in dataset order: index, its input (`sample_inputs`), then
    single-label: label, prediction, per-class probabilities; regression: label, prediction (numbers);
    multi-label: labels, predictions (the names at or above `threshold`), per-label probabilities;
    tags: one line per sentence, its words, their gold tags (`labels`) and predicted tags (`predictions`).
    Data without labels (`labelled=False`): no `label`/`labels`, which would be the loader's placeholders."""
    inputs, problem = inputs if inputs is not None else [{} for _ in labels], problem_of(problem_type)
    rows = probabilities.tolist() if isinstance(probabilities, torch.Tensor) else probabilities
    per_label = threshold if isinstance(threshold, list) else [threshold] * len(names)
    with path.open("w") as f:
        for i, (p, label, given) in enumerate(zip(rows, labels, inputs, strict=True)):
            record: dict[str, Any] = {"index": i, **given}
            record.update(problem.record(p, label, names, per_label))
            if not labelled:
                record.pop("label", None), record.pop("labels", None), record.pop("answers", None)
            f.write(json.dumps(record) + "\n")


def evaluate_with_predictions(model, loader, accelerator: Accelerator, names: list[str], problem: str, keep: bool,
                              threshold: float | list[float] = 0.5, data=None) -> tuple[dict, torch.Tensor | list | None]:
    """The metrics, and with `keep` what predictions.jsonl needs: per sample, the gathered probabilities
    (or numbers); per sentence, the predicted tag ids."""
    if problem_of(problem).windowed:
        report = evaluate_model(model, loader, accelerator, names, problem_type=problem, keep_predictions=keep,
                                threshold=threshold, data=data)  # fmt: skip
        report.pop("references", None)
        return report, report.pop("predictions", None)
    if "example" in loader.dataset.column_names:  # a text read in windows: its scores from them all
        report = evaluate_model(model, loader, accelerator, names, problem_type=problem, threshold=threshold,
                                keep_predictions=keep)  # fmt: skip
        report.pop("predictions", None), report.pop("references", None)
        return report, report.pop("scores", None)
    recorder = RecordProbabilities(model, accelerator, problem_of(problem)) if keep else None
    report = evaluate_model(
        recorder if recorder is not None else model, loader, accelerator, names,
        problem_type=problem, threshold=threshold,
    )  # fmt: skip
    if recorder is None:
        return report, None
    probabilities = torch.cat(recorder.probabilities)
    agrees = len(probabilities) == len(loader.dataset)
    if problem_of(problem).classes:
        labels = list(loader.dataset["labels"])
        check = classification_report(probabilities.argmax(-1).tolist(), labels, names)
        agrees = check["confusion_matrix"] == report["confusion_matrix"]
    if not agrees:  # our bug, not the user's
        raise RuntimeError("the gathered predictions disagree with the gathered metrics")
    return report, probabilities
