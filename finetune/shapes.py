"""Shapes a compiled step sees once: length buckets chosen from the data, full batches, the model's
blocks compiled in place and warmed once per shape, and the compiler's counters.

    accelerate launch --config_file accelerate_configs/cpu_bf16.yaml finetune/run.py \\
        --config finetune/configs/bert_rotten_tomatoes_full.yaml torch_compile=true length_buckets=4

`torch.compile` specialises a graph to the shapes it sees; per-batch padding gives every batch its own
length and the epoch's short last batch its own row count, so a compiled run recompiles again and again
(each new shape costs seconds; past `recompile_limit` dynamo falls back to eager without a word). Here:

- **Length buckets** (`length_buckets=K`): text batches are padded to the smallest of K lengths, not to
  their own longest. The K lengths are chosen from the data (`choose_buckets`): the batches one epoch
  of the length-grouped sampler makes, and the evaluation splits' longest-first batches, padded to K
  multiples of `pad_to_multiple_of` that minimise their padded tokens; the largest covers the longest
  sample of every split, so no batch ever needs another length.
- **Full batches** (`fill_rows`): a batch with fewer rows than the loader's batch size (an epoch's or
  an evaluation's last) is filled with copies of its first row before the model and the extra rows
  are cut from the logits after it, so the loss, the predictions and the metrics never see them.
- **Compiled whole, in place** (`compile_model`): `model.compile()` (parameter names and checkpoints
  are unchanged), static shapes with buckets, `dynamic=True` without. Whole, not region by region:
  transformers checks a batch's attention mask for padding outside the layers (`padding_mask.all()`),
  which eagerly costs a host-device synchronisation every step on a GPU; compiled whole, the check is
  traced away. On the 2-core CPU the two scopes cost about the same; the whole model compiles in
  far fewer graphs (`benchmarks/results/compile_scope.md`).
- **Warmed once** (`warm_up`): before the first step each bucket's training step (forward and
  backward in training mode, no optimizer step, no gradient all-reduce) and evaluation forward run
  on real samples cut to that length, with padding and without (for a model whose attention takes
  another path when a batch has no padding: another graph); the random state and the gradients are put back, so the run trains as
  it would without it. The counters (`CompileCounter`) then say how many graphs were compiled before
  and after: after the warm-up, none should be.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from finetune import checks
from finetune.checks import launch


def _round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def choose_buckets(batches: list[tuple[int, int]], k: int, multiple: int, longest: int) -> list[int]:
    """K lengths, multiples of `multiple`, the largest covering `longest`, that minimise the padded
    tokens of `batches` — (rows, longest sample) pairs — when each is padded to the smallest length
    that holds it. Exact: a dynamic programme over the candidate lengths (O(K C^2), C <= 64 for 512
    tokens in steps of 8)."""
    top = _round_up(longest, multiple)
    candidates = sorted({min(_round_up(n, multiple), top) for _, n in batches} | {top})
    if k >= len(candidates):
        return candidates
    # rows[j]: rows of the batches whose rounded length is candidates[j]
    rows = [0] * len(candidates)
    for r, n in batches:
        rows[candidates.index(min(_round_up(n, multiple), top))] += r

    def cost(lo: int, hi: int) -> int:  # batches in candidates (lo, hi] padded to candidates[hi]
        return candidates[hi] * sum(rows[lo + 1 : hi + 1])

    inf = float("inf")
    # best[j][i]: the least cost of the batches up to candidates[i] with j buckets, the largest at i
    best = [[inf] * len(candidates) for _ in range(k + 1)]
    came = [[-1] * len(candidates) for _ in range(k + 1)]
    for i in range(len(candidates)):
        best[1][i] = cost(-1, i)
    for j in range(2, k + 1):
        for i in range(len(candidates)):
            for p in range(i):
                c = best[j - 1][p] + cost(p, i)
                if c < best[j][i]:
                    best[j][i], came[j][i] = c, p
    last = len(candidates) - 1
    j = min(range(1, k + 1), key=lambda j: (best[j][last], j))
    chosen, i = [], last
    while i >= 0 and j >= 1:
        chosen.append(candidates[i])
        i, j = came[j][i], j - 1
    return sorted(chosen)


def padded_ratio(batches: list[tuple[int, int, int]], buckets: list[int] | None, multiple: int | None) -> float:
    """Padded tokens per real one for (rows, longest, real tokens) batches: each padded to its bucket,
    or (buckets None) to its own longest rounded up to `multiple`."""
    padded = real = 0
    for rows, longest, tokens in batches:
        length = next(b for b in buckets if b >= longest) if buckets else _round_up(longest, multiple or 1)
        padded, real = padded + rows * length, real + tokens
    return padded / max(real, 1)


def batch_lengths(order: list[int], lengths: list[int], batch: int, filled: bool = True) -> list[tuple[int, int, int]]:
    """(rows, longest, real tokens) of each batch of `batch` consecutive samples of `order`; `filled`: a
    short last batch counts `batch` rows (a compiled model's full batches, `fill_rows`), else its own."""
    out = []
    for i in range(0, len(order), batch):
        chunk = [lengths[j] for j in order[i : i + batch]]
        out.append((batch if filled else len(chunk), max(chunk), sum(chunk)))
    return out


class Bucketed:
    """Pads a batch to the smallest bucket that holds its longest sample: a text task's collator
    (`pad(features, length)` pads to exactly `length`) wrapped; the task's own padding otherwise."""

    def __init__(self, collator, buckets: list[int]):
        self.collator, self.buckets = collator, buckets

    def __call__(self, features: list[dict[str, Any]]):
        longest = max(len(f["input_ids"]) for f in features)
        length = next((b for b in self.buckets if b >= longest), None)
        if length is None:  # our bug: the largest bucket covers every split's longest sample
            raise RuntimeError(f"a batch of {longest} tokens is longer than every bucket {self.buckets}")
        return self.collator.pad_to(features, length)


def fill_rows(inputs: dict[str, torch.Tensor], rows: int) -> tuple[dict[str, torch.Tensor], int]:
    """The model's inputs with `rows` rows (copies of the first row added), and the real row count."""
    n = len(next(iter(inputs.values())))
    if n >= rows:
        return inputs, n
    filled = {k: _same_layout(torch.cat([v, v[:1].expand(rows - n, *v.shape[1:])]), v) for k, v in inputs.items()}
    return filled, n


def _same_layout(filled: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`filled` in `like`'s memory layout: an image batch stays channels last (finetune/tasks/images.py's
    `stack_images`), which `torch.cat` with an expanded row does not keep, so a compiled model sees the
    layout it was warmed with (a stride is a guard: another layout compiles another graph)."""
    if like.dim() == 4 and not like.is_contiguous() and like.is_contiguous(memory_format=torch.channels_last):
        return filled.contiguous(memory_format=torch.channels_last)
    return filled


# --- compiling ----------------------------------------------------------------------------------------


def check_compile(accelerator) -> None:
    """torch_compile is for one process or DDP (the layer split is refused with the config), without
    Accelerate's own compile (the accelerate config's dynamo_backend)."""
    checks.gate(launch.COMPILE, accelerator)


def compile_model(model, dynamic: bool, mode: str = "default") -> None:
    """The model compiled whole and in place (`nn.Module.compile`: its parameters, their names and its
    checkpoints unchanged), in torch.compile's `mode` (reduce-overhead: replayed as CUDA graphs on a GPU)."""
    raise_recompile_limits()
    model.compile(dynamic=dynamic, mode=mode)


def raise_recompile_limits() -> None:
    """Buckets x (the training variants of frozen and trained layers, evaluation): more than dynamo's
    default of 8 graphs a code object, after which it would run eagerly without a word."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)


class CompileCounter:
    """The compiler's own counters (dynamo's `counters`): graphs compiled until `warmed()` and after."""

    def __init__(self) -> None:
        self.at_warm_up: int | None = None

    @staticmethod
    def graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    def warmed(self) -> None:
        self.at_warm_up = self.graphs()

    def summary(self) -> dict[str, int]:
        now = self.graphs()
        warm = self.at_warm_up if self.at_warm_up is not None else 0
        return {"graphs_compiled_in_warm_up": warm, "graphs_compiled_after_warm_up": now - warm}


@dataclass
class Shapes:
    """The shapes of a run with length buckets or a compiled model."""

    buckets: list[int] | None  # text lengths; None: images, or text at each batch's own length
    train_rows: int | None  # batches filled to these rows for the model (torch_compile), else None
    eval_rows: int | None
    example: dict | None  # a collated batch of training samples at the largest length: the warm-up's
    padding: tuple[float, float] | None  # padded tokens per real one: bucketed, and per-batch padding
    counter: CompileCounter

    @property
    def dynamic(self) -> bool:
        """Compile for dynamic shapes: text without buckets."""
        return self.buckets is None and self.padding is not None

    def record(self) -> dict[str, Any]:
        """What results.json keeps: the buckets, the padding, the compile counts."""
        record: dict[str, Any] = {"length_buckets": self.buckets}
        if self.padding is not None:
            record["padded_per_real_token"], record["padded_per_real_token_per_batch"] = self.padding
        if self.train_rows is not None:
            record.update(self.counter.summary())
        return record

    def describe(self) -> str:
        if self.buckets is None:
            return "torch_compile: dynamic shapes" if self.dynamic else "torch_compile: one shape"
        bucketed, own = self.padding
        said = (
            f"length buckets {', '.join(map(str, self.buckets))}: {bucketed:.2f} padded tokens per real one "
            f"({own:.2f} padded to each batch's longest)"
        )
        return said + (", batches filled to full rows, compiled" if self.train_rows else "")


def plan_shapes(
    buckets: int | None,
    compiled: bool,
    multiple: int | None,
    train_rows: int,
    eval_rows: int,
    train: tuple[list[int], list[int] | None],
    evaluations: list[list[int] | None],
    collate,
    train_set,
) -> tuple[Shapes, Any]:
    """The run's shapes and its collator (with `buckets`, one that pads to them): `train` is (one
    epoch's sample order, the samples' lengths or None for images), `evaluations` each evaluation
    split's lengths (longest first, as they are read). Called only with buckets or the compiler on."""
    order, lengths = train
    padding = chosen = None
    if lengths is not None:
        batches = batch_lengths(order, lengths, train_rows, filled=compiled)
        for split in evaluations:
            if split:
                longest_first = sorted(range(len(split)), key=lambda i: -split[i])
                batches += batch_lengths(longest_first, split, eval_rows, filled=compiled)
        if buckets:
            longest = max([max(lengths)] + [max(split) for split in evaluations if split])
            chosen = choose_buckets([(r, n) for r, n, _ in batches], buckets, multiple or 8, longest)
            collate = Bucketed(collate, chosen)
        padding = (padded_ratio(batches, chosen, multiple), padded_ratio(batches, None, multiple))
    example = None
    if compiled:
        features = [train_set[i] for i in range(min(train_rows, len(train_set)))]
        example = collate.collator.pad_to(features, chosen[-1]) if chosen else collate(features)
    rows = (train_rows, eval_rows) if compiled else (None, None)
    return Shapes(chosen, *rows, example, padding, CompileCounter()), collate


@contextlib.contextmanager
def _same_randomness():
    """The random state put back after the block (dropout in a warm-up draws from it)."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _with_and_without_padding(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """A text batch as one with padding (its last row's last token masked) and one without (no token
    masked); an image batch as it is. Only the compiled graphs see these, not the training."""
    mask = batch.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return [batch]
    padded, full = mask.clone(), torch.ones_like(mask)
    padded[-1, -1] = 0
    return [{**batch, "attention_mask": padded}, {**batch, "attention_mask": full}]


def warm_up(model, accelerator, optimizer, forward, shapes: Shapes) -> None:
    """Compile every shape the run will see before its first step: per bucket (or once, without
    buckets) a training forward and backward at `train_rows` rows, in training mode as the loop runs
    it (a model loaded with from_pretrained starts in eval mode), and an evaluation forward at
    `eval_rows` (fewer rows than the example's cut to them, more filled), from the shapes' `example` (a collated batch at the largest length) cut to the bucket.
    Text runs twice a bucket: with padding and without, for a model whose attention takes another path
    when a batch has no padding (another graph). No optimizer step, no gradient all-reduce; the
    gradients and the random state are put back."""
    lengths = shapes.buckets or [None]
    inputs = {k: v.to(accelerator.device) for k, v in shapes.example.items() if isinstance(v, torch.Tensor)}
    with _same_randomness():
        for length in lengths:
            cut = {k: v[:, :length].contiguous() if length is not None and v.dim() > 1 else v for k, v in inputs.items()}
            for variant in _with_and_without_padding(cut):
                model.train()
                with accelerator.no_sync(model):  # DDP: no all-reduce of these gradients
                    forward(model, variant, rows=shapes.train_rows).float().sum().backward()
                optimizer.zero_grad(set_to_none=True)
            # The evaluation's rows, cut before the mask variants (the padded one masks its last row).
            for variant in _with_and_without_padding({k: v[: shapes.eval_rows] for k, v in cut.items()}):
                model.eval()
                with torch.no_grad():
                    forward(model, variant, rows=shapes.eval_rows)
    model.train()
    shapes.counter.warmed()
