"""Naive layer-wise model parallelism: consecutive layers on consecutive devices, in each process.

    accelerate launch --config_file accelerate_configs/model_parallel.yaml finetune/run.py \
        model_parallel=true devices=cuda:0,cuda:1 pipeline_chunks=4
    accelerate launch --config_file accelerate_configs/ddp_model_parallel.yaml finetune/run.py \
        model_parallel=true                      # DDP x layer split: 2 processes x 2 GPUs each
    python -m benchmarks.bench_parallel --devices cuda:0,cuda:1 --chunks 4

A transform applied to a model that is already built (the model classes know nothing of it):

    devices = parse_devices("cuda:0,cuda:1")                # or None: every visible GPU
    plan = plan_model_parallel(model, devices, micro_batch_size=32, seq_len=128)
    print(plan.format_table())
    model = apply_model_parallel(model, plan)               # then accelerator.prepare(model, ...)
    logits = pipelined_forward(model, inputs, 4, problem.outputs)  # optional GPipe-style micro-batches

The model is cut into ordered blocks (embeddings, each encoder layer, the head), the blocks are
split into one contiguous stage per device so that the largest stage's *training* memory (weights,
gradients, AdamW state and activations) is as small as possible, and forward pre-hooks move each
block's inputs to its device. Autograd records those moves, so gradients flow back across devices
by themselves. Why not `accelerate.dispatch_model`: see `apply_model_parallel`.

Under DDP every process splits its own replica over its own devices (`process_devices`), and DDP,
told by ACCELERATE_BYPASS_DEVICE_MAP (finetune/runtime.py) to take a model spread over several
devices, averages the gradients of the replicas.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil  # an accelerate dependency
import torch
from torch import nn

from finetune import checks
from finetune.checks import models as model_rules
from finetune.checks.models import format_bytes  # the rules say sizes as the plan's table does


class ParallelError(ValueError):
    """A model the layer split cannot cut into blocks (`find_blocks`), or whose config lacks a size the memory
    estimate reads: a signal inside the app, not a line for the user. `plan_model_parallel` and
    `models.freeze_layers` turn it into the user's line (finetune/checks/models.py's UNSPLITTABLE);
    benchmarks/flops.py counts no frozen layers. `why`: "layout", "no layers", "outside" (parameters outside
    the layers, `where`: whose) or "config" (`where`: the sizes looked for)."""

    def __init__(self, why: str, where: str = ""):
        super().__init__(f"{why}: {where}" if where else why)
        self.why, self.where = why, where


# --- devices and sizes ---------------------------------------------------------------------------


def parse_devices(spec: str | None) -> list[torch.device]:
    """`None`/"auto": every visible CUDA GPU, or CPU when there is none; else a comma list such as
    "cuda:0,cuda:1", "cuda:0,cpu" or "cpu,cpu,cpu" (repeats are allowed: that is how the CPU tests
    exercise the hand-offs). A device this machine does not have is refused (finetune/checks/models.py)."""
    if spec is None or spec.strip().lower() == "auto":
        n = torch.cuda.device_count()
        return [torch.device("cuda", i) for i in range(n)] if n else [torch.device("cpu")]
    devices = []
    for item in spec.split(","):
        name = item.strip().lower()
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError):
            raise checks.explain(model_rules.DEVICE_UNKNOWN, item, spec) from None
        checks.gate(model_rules.DEVICE, device, name, spec, torch.cuda.device_count() if device.type == "cuda" else 0)
        devices.append(torch.device("cuda", device.index or 0) if device.type == "cuda" else device)
    return devices


def process_devices(spec: str | None, local_rank: int = 0, local_processes: int = 1) -> list[torch.device]:
    """The devices this process splits its model over: `parse_devices(spec)` for one process; for
    several processes on one machine (DDP x layer split, the hybrid), this process's share:

    - no `devices` (or "auto"): the visible GPUs in equal consecutive groups, one per local process
      (4 GPUs, 2 processes: cuda:0,cuda:1 and cuda:2,cuda:3); a count that does not divide is
      refused; no GPU: the CPU, unsplit.
    - one list per local process, separated by ";" ("cuda:0,cuda:1;cuda:2,cuda:3"): this process's.
    - one list ("cpu,cpu"): every process uses it. CPU devices only: two processes of an NCCL group
      cannot share a GPU, so a list naming GPUs must be given per process.
    """
    if local_processes <= 1:
        return parse_devices(spec)
    if spec is not None and ";" in spec:
        groups = spec.split(";")
        checks.gate(model_rules.PROCESS_LISTS, spec, len(groups), local_processes)
        return parse_devices(groups[local_rank])
    if spec is None or spec.strip().lower() == "auto":
        n = torch.cuda.device_count()
        if n == 0:
            return [torch.device("cpu")]
        checks.gate(model_rules.PROCESS_GPUS, n, local_processes)
        k = n // local_processes
        return [torch.device("cuda", i) for i in range(local_rank * k, (local_rank + 1) * k)]
    devices = parse_devices(spec)
    checks.gate(model_rules.PROCESS_SHARED, spec, devices, local_processes)
    return devices


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string like "2GiB", "500MB", "1.5 GB" (decimal and binary units).
    Unlike accelerate's `convert_file_size_to_int`, case does not turn bytes into bits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if match is None or match.group(2).lower() not in _UNITS:
        raise checks.explain(model_rules.MEMORY_SIZE, value)
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _device_key(key: int | str | torch.device) -> str:
    """max_memory keys as device strings: 0 and "cuda" mean cuda:0, as in accelerate."""
    if isinstance(key, int):
        return f"cuda:{key}"
    try:
        device = torch.device(key)
    except (RuntimeError, ValueError):
        raise checks.explain(model_rules.MEMORY_KEY, key) from None
    return "cuda:0" if device.type == "cuda" and device.index is None else str(device)


def device_capacity(device: torch.device, max_memory: Mapping[int | str, int | str] | None = None) -> int:
    """The cap from `max_memory` if it names the device, else the device's total memory.
    Total, not free: CUDA context and allocator slack are not counted, so leave headroom with max_memory."""
    caps = {_device_key(k): parse_size(v) for k, v in (max_memory or {}).items()}
    if str(device) in caps:
        return caps[str(device)]
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    return psutil.virtual_memory().total


# --- blocks: the units the plan places -----------------------------------------------------------


@dataclass
class Block:
    """One unit of placement: the embeddings, one encoder layer, or the head (several modules)."""

    name: str  # "embeddings", "layer.3", "head"
    modules: list[str]  # module names in the model, as in hf_device_map
    num_parameters: int
    state_bytes: int  # weights + gradients + AdamW state
    activation_bytes: int  # kept for backward at the planned batch and sequence length


def find_blocks(model: nn.Module) -> tuple[list[str], list[str], list[str]]:
    """Names of (embeddings, [encoder layers], [head modules]) for BERT-like models: a base model
    with `embeddings` and a ModuleList of layers at `encoder.layer` (BERT, RoBERTa), `layers` (ViT,
    DeiT in transformers 5) or `transformer.layer` (DistilBERT). The head is every other module:
    the pooler, dropout, classifier, a final LayerNorm; modules registered before the layers (Electra's
    `embeddings_project`) go with the embeddings, which is where they run."""
    prefix = getattr(model, "base_model_prefix", "")
    base_name = prefix if prefix and isinstance(getattr(model, prefix, None), nn.Module) else ""
    base = model.get_submodule(base_name)
    candidates = ("encoder.layer", "encoder.layers", "transformer.layer", "layers", "layer")
    layers_name = next((c for c in candidates if isinstance(_get(base, c), nn.ModuleList)), None)
    if not isinstance(getattr(base, "embeddings", None), nn.Module) or layers_name is None:
        raise ParallelError("layout")
    join = (lambda n: f"{base_name}.{n}") if base_name else (lambda n: n)
    embeddings, layers = join("embeddings"), join(layers_name)
    n_layers = len(model.get_submodule(layers))
    if n_layers == 0:
        raise ParallelError("no layers")

    # Walk down from the root, stepping into the ancestors of the embeddings and layers (model,
    # model.bert, model.bert.encoder) and taking every other child whole, in registration order.
    before: list[str] = []  # registered before the layers: they run with the embeddings
    head: list[str] = []
    ancestors = {""} | {
        n for n, _ in model.named_modules() if embeddings.startswith(n + ".") or layers.startswith(n + ".")
    }

    def walk(name: str, module: nn.Module) -> None:
        nonlocal seen_layers
        if any(True for _ in module.parameters(recurse=False)):
            raise ParallelError("outside", name)
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if full == layers:
                seen_layers = True
            elif full in ancestors:
                walk(full, child)
            elif full != embeddings:
                (head if seen_layers else before).append(full)

    seen_layers = False
    walk("", model)
    return [embeddings, *before], [f"{layers}.{i}" for i in range(n_layers)], head


def _get(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part, None)
    return module


def _config_value(config: Any, *names: str, default: int | None = None) -> int:
    for name in names:
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    if default is None:
        raise ParallelError("config", ", ".join(names))
    return default


def default_seq_len(config: Any) -> int:
    """Tokens per sample when the caller does not say: patches + [CLS] for an image model, the
    longest position the embeddings allow for a text model."""
    if isinstance(getattr(config, "image_size", None), int) and isinstance(
        getattr(config, "patch_size", None), int
    ):
        return (config.image_size // config.patch_size) ** 2 + 1
    return _config_value(config, "max_position_embeddings")


_ACTIVATION_BYTES = {"no": 4, "fp16": 2, "bf16": 2, "fp8": 2}


def _activation_bytes(kind: str, config: Any, b: int, s: int, e: int) -> int:
    """Activations one block keeps for backward, in bytes; b samples of s tokens, e bytes an element.

    Encoder layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", sec. 4.1, written for any element size e and intermediate width i instead of e=2, i=4h):

        b*s*(h*(8e + 2) + 2*e*i) + b*a*s*s*(2e + 1)

    h*8e: the QKV input, Q, K, V, the attention output, the output-projection input, the two
    LayerNorm inputs; 2*e*i: the fc1 and GELU outputs; h*2: two dropout masks at one byte; the s*s
    term: attention scores, softmax output and its dropout mask, per head. With e=2, i=4h this is
    their 34*b*s*h + 5*a*s^2*b. Conservative: the s^2 term is counted although SDPA/flash kernels do
    not keep it, and dropout masks are counted even at dropout 0.
    Embeddings: b*s*h*(2e + 1) (the summed embeddings, the LayerNorm input, a dropout mask).
    Head: b*(s + 2)*h*e (a final LayerNorm over the sequence, as in ViT, plus pooler in and out).
    """
    h = _config_value(config, "hidden_size", "dim")
    if kind == "embeddings":
        return b * s * h * (2 * e + 1)
    if kind == "head":
        return b * (s + 2) * h * e
    a = _config_value(config, "num_attention_heads", "n_heads")
    i = _config_value(config, "intermediate_size", "hidden_dim", default=4 * h)
    return b * s * (h * (8 * e + 2) + 2 * e * i) + b * a * s * s * (2 * e + 1)


def _state_bytes(params: list[nn.Parameter], mixed_precision: str) -> int:
    """Per trainable parameter: the weight, its gradient and AdamW's exp_avg and exp_avg_sq, all in
    the parameter's dtype (16 bytes in fp32); under fp16/bf16 autocast also the half-precision weight
    copy autocast caches during forward (2 bytes). Frozen parameters only hold their weight."""
    total = 0
    for p in params:
        n = p.numel() * p.element_size()
        total += 4 * n if p.requires_grad else n
        if mixed_precision != "no":
            total += 2 * p.numel()
    return total


def model_blocks(
    model: nn.Module, *, micro_batch_size: int, seq_len: int, mixed_precision: str = "no"
) -> list[Block]:
    """The ordered blocks of `model` with their training-memory estimates (see `_activation_bytes`)."""
    embeddings, layers, head = find_blocks(model)
    e = _ACTIVATION_BYTES[mixed_precision]
    seen: set[int] = set()  # a parameter shared by two blocks (tied weights) is counted once

    def block(name: str, modules: list[str], kind: str) -> Block:
        params = [p for m in modules for p in model.get_submodule(m).parameters() if id(p) not in seen]
        params = list({id(p): p for p in params}.values())
        seen.update(id(p) for p in params)
        return Block(
            name=name,
            modules=modules,
            num_parameters=sum(p.numel() for p in params),
            state_bytes=_state_bytes(params, mixed_precision),
            activation_bytes=_activation_bytes(kind, model.config, micro_batch_size, seq_len, e),
        )

    return [
        block("embeddings", embeddings, "embeddings"),
        *(block(f"layer.{i}", [name], "layer") for i, name in enumerate(layers)),
        block("head", head, "head"),
    ]


def estimate_stage_bytes(blocks: list[Block]) -> int:
    """Training memory of a stage: its blocks' state and kept activations, plus the largest block's
    activations once more for the gradients and temporaries of the backward pass in flight."""
    if not blocks:
        return 0
    return sum(b.state_bytes + b.activation_bytes for b in blocks) + max(b.activation_bytes for b in blocks)


# --- the plan ------------------------------------------------------------------------------------


@dataclass
class Stage:
    index: int
    device: torch.device
    blocks: list[str]  # block names, e.g. ["embeddings", "layer.0", "layer.1"]
    num_parameters: int
    estimated_bytes: int
    capacity_bytes: int


@dataclass
class Plan:
    stages: list[Stage]
    device_map: dict[str, str]  # module name -> device, the `hf_device_map` format
    blocks: list[Block] = field(repr=False)
    micro_batch_size: int
    seq_len: int
    mixed_precision: str

    @property
    def devices(self) -> list[torch.device]:
        return [s.device for s in self.stages]

    def format_table(self) -> str:
        """A table for `plan_only`: one row per stage."""
        rows = [("stage", "device", "layers", "parameters", "est. memory", "capacity")]
        for s in self.stages:
            rows.append(
                (str(s.index), str(s.device), _compress(s.blocks), f"{s.num_parameters:,}",
                 format_bytes(s.estimated_bytes), format_bytes(s.capacity_bytes))
            )  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(
                c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(
            f"training memory at micro_batch_size={self.micro_batch_size}, seq_len={self.seq_len}, "
            f"mixed_precision={self.mixed_precision}: weights + gradients + AdamW state + activations"
        )
        return "\n".join(lines)


def _compress(names: list[str]) -> str:
    """["embeddings", "layer.0", "layer.1", "layer.2"] -> "embeddings, layer.0-2"."""
    out: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            out.append(f"layer.{run[0]}" if len(run) == 1 else f"layer.{run[0]}-{run[-1]}")
            run.clear()

    for name in names:
        if name.startswith("layer.") and (not run or int(name[6:]) == run[-1] + 1):
            run.append(int(name[6:]))
            continue
        flush()
        if name.startswith("layer."):
            run.append(int(name[6:]))
        else:
            out.append(name)
    flush()
    return ", ".join(out)


def _split(cost: Callable[[int, int], int], n: int, caps: list[float], limit: float) -> list[int] | None:
    """Cut points [0, c1, ..., n] of a contiguous split of n blocks into len(caps) non-empty stages,
    every stage within min(its cap, limit), minimising the sum of squared stage costs (the most even
    split among those); None if no split fits. Dynamic programming, O(stages * n^2) cost calls."""
    S, inf = len(caps), math.inf
    best = [[inf] * (n + 1) for _ in range(S + 1)]
    back = [[0] * (n + 1) for _ in range(S + 1)]
    best[0][0] = 0
    for k in range(1, S + 1):
        for j in range(k, n - (S - k) + 1):
            for i in range(k - 1, j):
                c = cost(i, j)
                if (
                    best[k - 1][i] < inf
                    and c <= min(caps[k - 1], limit)
                    and best[k - 1][i] + c * c < best[k][j]
                ):
                    best[k][j], back[k][j] = best[k - 1][i] + c * c, i
    if best[S][n] == inf:
        return None
    cuts = [n]
    for k in range(S, 0, -1):
        cuts.append(back[k][cuts[-1]])
    return cuts[::-1]


def _balanced_split(cost: Callable[[int, int], int], n: int, caps: list[float]) -> list[int] | None:
    """The split with the smallest largest stage (binary search over the candidate bottlenecks),
    evened out below that bottleneck by `_split`."""
    candidates = sorted({cost(i, j) for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(candidates) - 1
    if _split(cost, n, caps, candidates[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _split(cost, n, caps, candidates[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    return _split(cost, n, caps, candidates[lo])


def plan_model_parallel(
    model: nn.Module,
    devices: list[torch.device],
    *,
    micro_batch_size: int,
    seq_len: int | None,
    max_memory: Mapping[int | str, int | str] | None = None,
    mixed_precision: str = "no",
    local_processes: int = 1,
) -> Plan:
    """Split `model` into one contiguous stage per device, balanced by estimated training memory.

    micro_batch_size: the samples whose activations are alive at once. With `pipelined_forward` that
        is still the whole batch: GPipe keeps every chunk's activations until the backward pass.
    seq_len: tokens per sample (max_length for text; None or 0: from the model config, which for
        ViT is the patches plus [CLS]).
    max_memory: per-device caps, e.g. {"cuda:0": "2GiB", "cpu": 10**11}; devices not named use their
        total memory. Stages that share a device (cpu,cpu) share its capacity equally.
    mixed_precision: accelerate's value ("no", "fp16", "bf16", "fp8"); halves activation bytes.
    local_processes: processes on this machine, each splitting its own replica (DDP x layer split):
        they share the machine's CPU memory, so a "cpu" stage gets its share of that.

    Embeddings are on the first stage and the head on the last (blocks stay in order). One device
    gives a single-stage plan; the caller then trains unsplit.
    """
    checks.gate(model_rules.PLAN, devices, mixed_precision, tuple(_ACTIVATION_BYTES))
    try:
        find_blocks(model)  # a clear error for a model we cannot split, before reading its config
        seq_len = seq_len or default_seq_len(model.config)
        blocks = model_blocks(model, micro_batch_size=micro_batch_size, seq_len=seq_len, mixed_precision=mixed_precision)
    except ParallelError as e:
        raise checks.explain(model_rules.UNSPLITTABLE, type(model).__name__, e) from None
    n, S = len(blocks), len(devices)
    checks.gate(model_rules.BLOCKS, S, n)
    shares = {str(d): sum(str(x) == str(d) for x in devices) for d in devices}
    per_process = {"cpu": max(local_processes, 1)}  # a GPU belongs to one process, the RAM to all
    caps = [device_capacity(d, max_memory) // shares[str(d)] // per_process.get(d.type, 1) for d in devices]

    def cost(i: int, j: int) -> int:
        return estimate_stage_bytes(blocks[i:j])

    cuts = _balanced_split(cost, n, caps)
    if cuts is None:
        need = _balanced_split(cost, n, [math.inf] * S)
        assert need is not None
        needs = [cost(need[k], need[k + 1]) for k in range(S)]
        raise checks.explain(model_rules.NO_FIT, model_rules.Unfit(devices, caps, needs, micro_batch_size, seq_len))
    return _plan(blocks, devices, cuts, caps, cost, micro_batch_size, seq_len, mixed_precision)


def _plan(blocks: list[Block], devices: list[torch.device], cuts: list[int], caps: list[float],
          cost: Callable[[int, int], int], micro_batch_size: int, seq_len: int, mixed_precision: str) -> Plan:  # fmt: skip
    """The plan of stage k holding `blocks[cuts[k]:cuts[k + 1]]` on `devices[k]`."""
    stages, device_map = [], {}
    for k in range(len(devices)):
        part = blocks[cuts[k] : cuts[k + 1]]
        stages.append(
            Stage(
                index=k,
                device=devices[k],
                blocks=[b.name for b in part],
                num_parameters=sum(b.num_parameters for b in part),
                estimated_bytes=cost(cuts[k], cuts[k + 1]),
                capacity_bytes=caps[k],
            )
        )
        device_map.update({m: str(devices[k]) for b in part for m in b.modules})
    if len(devices) == 1:
        # {"": device} is the hf_device_map of a model on one device: `accelerator.prepare` then
        # places it as usual, where a map with several entries would make it leave the model alone.
        device_map = {"": str(devices[0])}
    return Plan(stages, device_map, blocks, micro_batch_size, seq_len, mixed_precision)


# --- applying the plan ---------------------------------------------------------------------------


@dataclass
class ModelParallelState:
    """What `apply_model_parallel` leaves on the model as `model.mp_state`, for tests and benchmarks."""

    plan: Plan
    handoffs: int = 0  # stage-to-stage transfers in the last forward (stages - 1 when all run)
    total_handoffs: int = 0  # since the model was split
    forwards: int = 0  # model calls since the model was split (chunks count one each)
    hooks: list[Any] = field(default_factory=list, repr=False)
    _stage: int | None = field(default=None, repr=False)  # the stage that ran last in this forward
    _in_forward: bool = field(default=False, repr=False)  # False in a gradient-checkpoint recompute
    _moved: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, repr=False
    )

    def to(self, obj: Any, device: torch.device) -> Any:
        """`obj` with every tensor inside (tuples, lists, dicts) on `device`. A tensor already moved
        there in this forward is reused: the attention mask is built once on the first stage and
        passed to every layer, and would otherwise be copied again for each layer of a later stage."""
        if isinstance(obj, torch.Tensor):
            if obj.device == device or not self._in_forward:
                return obj.to(device)
            key = (id(obj), device)
            if key not in self._moved or self._moved[key][0] is not obj:
                self._moved[key] = (obj, obj.to(device))  # differentiable: autograd copies grads back
            return self._moved[key][1]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*(self.to(x, device) for x in obj))
        if isinstance(obj, tuple | list):
            return type(obj)(self.to(x, device) for x in obj)
        if isinstance(obj, dict):
            return {k: self.to(v, device) for k, v in obj.items()}
        return obj


def apply_model_parallel(model: nn.Module, plan: Plan) -> nn.Module:
    """Move each block to its stage's device and hook it so its inputs follow; returns `model`.

    Why not `accelerate.dispatch_model(model, plan.device_map)` (checked against accelerate 1.15):
    - it attaches no hooks at all when every entry names the same device (cpu,cpu,cpu), so the CPU
      tests would not exercise a single hand-off (force_hooks=True works around that one);
    - with a GPU in the map, "cpu" entries mean *offload*: those weights go to the meta device and are
      copied to the GPU for every forward, so the optimizer's parameters are not the ones used and a
      cuda:0,cpu split would neither run on the CPU nor train;
    - it replaces each module's forward and wraps `model.to`, and has no hand-off count.
    A forward pre-hook per block is all that training needs: `Tensor.to` is differentiable, so the
    backward pass returns each gradient to the device its activation came from.

    `model.hf_device_map = plan.device_map`: `Accelerator.prepare_model` (accelerate 1.15) sees a map
    with more than one entry (`verify_device_map`) and then neither moves the model to its own device
    nor allows a distributed launch, which is what a split model needs. Do not `.to()` the model after.
    Inputs may come on any device (they go to stage 0; `labels` to the last stage, where HF's loss
    is computed); logits come out on the last stage's device.
    """
    checks.gate(model_rules.SPLIT, model, plan)
    state = ModelParallelState(plan)
    first, last = plan.stages[0].device, plan.stages[-1].device
    if len(plan.stages) == 1:
        model.to(first)
    for stage in plan.stages:
        for name in (m for b in plan.blocks if b.name in stage.blocks for m in b.modules):
            module = model.get_submodule(name)
            module.to(stage.device)
            if len(plan.stages) > 1:
                state.hooks.append(
                    module.register_forward_pre_hook(
                        _block_hook(state, stage.index, stage.device), with_kwargs=True
                    )
                )

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        state.handoffs, state._stage, state._in_forward, state.forwards = 0, None, True, state.forwards + 1
        state._moved.clear()
        kwargs = {k: state.to(v, last if k == "labels" else first) for k, v in kwargs.items()}
        return state.to(args, first), kwargs

    def leave(module: nn.Module, args: tuple, output: Any) -> None:
        state._in_forward = False
        state._moved.clear()  # the backward pass keeps what it needs; do not pin the inputs

    state.hooks.append(model.register_forward_pre_hook(enter, with_kwargs=True))
    state.hooks.append(model.register_forward_hook(leave))
    model.hf_device_map = dict(plan.device_map)
    model.mp_state = state
    return model


def _block_hook(state: ModelParallelState, stage: int, device: torch.device) -> Callable:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if state._in_forward and state._stage is not None and state._stage != stage:
            state.handoffs += 1
            state.total_handoffs += 1
        state._stage = stage
        return state.to(args, device), state.to(kwargs, device)

    return hook


# --- GPipe-style micro-batches -------------------------------------------------------------------


def pipelined_forward(model: nn.Module, batch: Mapping[str, Any], chunks: int,
                      outputs: Callable[[Any, Mapping[str, Any]], torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """The outputs of `batch` (`outputs` of each chunk's model output and inputs: the problem's, finetune/problems/),
    run as `chunks` micro-batches one after the other (GPipe).

    Every tensor is split along dim 0 (sizes differ by at most one; chunks > batch size means one
    sample a chunk); other values are passed to every chunk; `labels` are left out (compute the loss
    on the returned logits: with a summed loss over the batch, gradients equal the unsplit step's up to
    float summation order). CUDA runs kernels asynchronously per device, so issuing the chunks in order
    lets stage i work on chunk j+1 while stage i+1 works on chunk j; a CPU stage blocks the Python
    thread and does not overlap. In train mode each chunk draws its own dropout masks. The logits are
    concatenated on the last stage's device.
    """
    checks.gate(model_rules.CHUNKS, chunks)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    sizes = {v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"pipelined_forward needs tensors with one batch size, got sizes {sorted(sizes)}")
    n = min(chunks, sizes.pop())
    parts = {k: torch.tensor_split(v, n) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    chunked = [{k: parts[k][j] if k in parts else v for k, v in inputs.items()} for j in range(n)]
    logits = [outputs(model(**chunk), chunk) for chunk in chunked]
    return torch.cat(logits)
