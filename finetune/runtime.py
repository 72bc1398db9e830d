"""The runtime: the Accelerator from the user's accelerate config, CPU threads, FSDP units, the
devices of each process of a DDP x layer split, the start summary's parameter layout, data workers,
how processes agree on a failure, fp16's skipped steps and the libraries' logging. What depends on
the hardware or the processes around the loop lives here; the loop (finetune/run.py) asks these
functions. Signals are finetune/signals.py's, the output folder finetune/rundir.py's.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
)

from finetune import checks
from finetune.checks import launch
from finetune.config import TrainConfig
from finetune.errors import PeerFailed
from finetune.parallel import process_devices
from finetune.tasks import task_of


def _fsdp_requested() -> bool:
    """The launcher sets ACCELERATE_USE_FSDP for an FSDP config (accelerate launch --use_fsdp)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def make_accelerator(cfg: TrainConfig, said: checks.Said | None = None) -> Accelerator:
    """The Accelerator, from the user's accelerate config; real DDP on CPU when several processes.

    `accelerate launch --multi_gpu --num_processes 2` on a machine without a GPU starts two
    processes that would each train alone (DistributedType.NO). Setting ACCELERATE_USE_CPU before
    the Accelerator is built makes them one DDP group over gloo.

    `model_parallel=true` under several processes is DDP x layer split (see `prepare_hybrid`).
    `said`: the run's warnings (a config for a GPU on a CPU, emulated bf16, ...).
    """
    said = said if said is not None else checks.Said()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # Accelerate keeps an upper-case precision as written and then neither autocasts nor scales.
    if os.environ.get("ACCELERATE_MIXED_PRECISION"):
        os.environ["ACCELERATE_MIXED_PRECISION"] = os.environ["ACCELERATE_MIXED_PRECISION"].lower()
    fsdp_on_cpu = _fsdp_on_cpu_for_tests(world_size)
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"  # --use_deepspeed
    processes = launch.Processes(world_size, _fsdp_requested(), torch.cuda.is_available(), fsdp_on_cpu,
                                 cfg.model_parallel, deepspeed)  # fmt: skip
    checks.gate(launch.BEFORE, processes)
    if cfg.model_parallel and world_size > 1:
        prepare_hybrid(cfg)
    if world_size > 1 and not torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"
    # A process that waits longer than this in a collective fails instead of hanging forever.
    init_kwargs = InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.ddp_timeout))
    if fsdp_on_cpu:
        _promote_cpu_group_to_fsdp(init_kwargs)
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step, below
        log_with=cfg.report_to or None,
        # Host-to-device copies of pinned batches overlap with compute (a no-op on CPU).
        dataloader_config=DataLoaderConfiguration(non_blocking=cfg.dataloader_pin_memory),
        project_dir=cfg.output_dir,
        kwargs_handlers=[
            init_kwargs,
            DistributedDataParallelKwargs(
                static_graph=cfg.ddp_static_graph, gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view
            ),
        ],
    )
    formed = launch.Formed(processes, accelerator, _one_of_several_started_alone(), _a_gpu_was_asked_for())
    checks.gate(launch.FORMED, formed, said=said)
    if accelerator.device.type == "cpu":
        torch.set_num_threads(cpu_threads(cfg.cpu_threads, accelerator.num_processes))
        native = accelerator.mixed_precision != "bf16" or native_bf16()
        checks.gate(launch.ON_CPU, accelerator, native, torch.backends.cpu.get_cpu_capability(), said=said)
    return accelerator


def _a_gpu_was_asked_for() -> bool:
    """Accelerate's launcher sets ACCELERATE_USE_CPU from the config's use_cpu (or --cpu): false there is
    a config written for a GPU (`accelerate config` on a machine without one writes use_cpu: true). Unset
    (plain python), nothing was asked for."""
    return os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("false", "0", "no")


def _one_of_several_started_alone() -> bool:
    """Accelerate's one-process launcher sets ACCELERATE_USE_CPU always and MASTER_ADDR only when asked
    for several processes or machines (a MULTI_CPU config without mpirun starts one): both set, with no
    rank from torchrun or MPI, means the others were never started."""
    ranks = ("RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_RANK")
    return "ACCELERATE_USE_CPU" in os.environ and "MASTER_ADDR" in os.environ and not any(
        name in os.environ for name in ranks
    )


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AMX, AVX512-BF16): else bf16 matmuls are emulated."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def local_processes() -> int:
    """Processes on this machine (torchrun sets LOCAL_WORLD_SIZE; Accelerate does for CPU groups)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def prepare_hybrid(cfg: TrainConfig) -> None:
    """DDP x layer split: each process splits its replica over its own devices, DDP joins them.

    Accelerate 1.15 refuses to prepare a model with an `hf_device_map` of several entries in any
    distributed mode ("You can't train a model that has been loaded with `device_map='auto'`"),
    unless ACCELERATE_BYPASS_DEVICE_MAP=true; then it wraps the model in DDP with device_ids=None,
    the form torch's DDP requires for a module on several devices (`Accelerator._prepare_one`,
    `prepare_model`). On GPUs the process's own device (where Accelerate puts batches, and the
    current CUDA device NCCL uses) is the first of its stages, not cuda:<local rank>, which may
    belong to another process's split. Tested on CPU (tests/test_parallel_run.py); not yet run on
    several GPUs.
    """
    devices = process_devices(cfg.devices, local_rank(), local_processes())  # ParallelError: exit 2
    os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = "true"
    if devices[0].type == "cuda":
        os.environ["ACCELERATE_TORCH_DEVICE"] = str(devices[0])
        torch.cuda.set_device(devices[0])


def _fsdp_on_cpu_for_tests(world_size: int) -> bool:
    """TEST HOOK, used by tests/test_fsdp.py only; inert unless FINETUNE_TEST_FSDP_ON_CPU=1 and an
    FSDP config launched several processes on a machine without a GPU. See `_promote_cpu_group_to_fsdp`."""
    return (
        os.environ.get("FINETUNE_TEST_FSDP_ON_CPU") == "1"
        and _fsdp_requested()
        and world_size > 1
        and not torch.cuda.is_available()
    )


def _promote_cpu_group_to_fsdp(init_kwargs: InitProcessGroupKwargs) -> None:
    """TEST HOOK: make Accelerate run its real FSDP path in a gloo group of CPU processes.

    Accelerate 1.15 (`AcceleratorState.__init__`, state.py) turns a group into DistributedType.FSDP
    only when PartialState found an accelerator (MULTI_GPU, MULTI_XPU, ...); a CPU group is
    MULTI_CPU and keeps plain DDP. This builds the CPU group first (gloo, device cpu, exactly as
    Accelerate does for cpu_ddp.yaml) and then records it as MULTI_GPU, the state Accelerate starts
    from on GPUs, so the same `AcceleratorState` branch makes it FSDP with the plugin read from the
    launcher's FSDP_* variables. Everything after that — `fully_shard`, DTensor parameters, sharded
    `save_state`/`load_state`, `get_state_dict`, clipping — is Accelerate's and torch's own code,
    running on CPU tensors over gloo.
    """
    from accelerate.state import PartialState

    os.environ["ACCELERATE_USE_CPU"] = "true"
    PartialState(cpu=True, **init_kwargs.to_kwargs())
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU


def configure_fsdp(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """FSDP's units: each transformer layer (and the input embeddings, which Accelerate shards alone).

    With `fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` and no class list, Accelerate wraps every class
    in the model's `_no_split_modules` — for BERT and ViT that includes the embeddings block, and it
    then shards the input embeddings inside that block a second time, which `fully_shard` refuses.
    So the classes that hold the input embeddings are left out; a class list in the accelerate config
    (`fsdp_transformer_layer_cls_to_wrap`) is used as written.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    # FSDP2 warns, once for each unit and process, that a unit "returned a view tensor" (BERT's and ViT's
    # layers do): an in-place op on such an output would skip its all-gather. The models trained here apply
    # none to them, and the FSDP runs equal one big batch (tests/test_fsdp.py): four lines of noise a run.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
    plugin = accelerator.state.fsdp_plugin
    if plugin is None or plugin.transformer_cls_names_to_wrap is not None:
        return
    if getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy) is not transformer_auto_wrap_policy:
        return
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    embeddings = model.get_input_embeddings()
    plugin.transformer_cls_names_to_wrap = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if type(m).__name__ in no_split and not any(x is embeddings for x in m.modules())
        }
    )


def describe_parameters(accelerator: Accelerator, model: torch.nn.Module, pipeline_chunks: int = 1) -> str:
    """How the prepared model's parameters are laid out, for the start summary: sharded by FSDP
    (along which dimension, what this process holds, the units), split over devices (in each
    process under DDP), or whole."""
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor, Shard

        params = list(model.parameters())
        sharded = [p for p in params if isinstance(p, DTensor)]
        dims = sorted({pl.dim for p in sharded for pl in p.placements if isinstance(pl, Shard)})
        held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
        units: dict[str, int] = {}
        for m in model.modules():
            if isinstance(m, FSDPModule):  # fully_shard's subclass FSDP<Class>
                name = type(m).__name__.removeprefix("FSDP") + (" (root)" if m is model else "")
                units[name] = units.get(name, 0) + 1
        plugin = accelerator.state.fsdp_plugin
        how = "full sharding, ZeRO-3" if plugin.reshard_after_forward else "ZeRO-2"
        return (
            f"FSDP{plugin.fsdp_version} ({how}) over {accelerator.num_processes} processes: {len(sharded)} of "
            f"{len(params)} parameter tensors sharded along dim {','.join(map(str, dims)) or '-'}; this process "
            f"holds {held:,} of {sum(p.numel() for p in params):,} weights; units: "
            f"{', '.join(f'{k} x{v}' for k, v in units.items())}; checkpoints {plugin.state_dict_type.name}"
        )
    split = getattr(accelerator.unwrap_model(model), "mp_state", None)
    if split is not None:
        stages = ", ".join(f"{s.device} ({s.num_parameters:,} weights)" for s in split.plan.stages)
        where = (
            f"in each of {accelerator.num_processes} processes (DDP x layer split)"
            if accelerator.num_processes > 1
            else "in one process"
        )
        chunks = f", {pipeline_chunks} pipelined chunks a batch" if pipeline_chunks > 1 else ""
        return f"layer split into {len(split.plan.stages)} stages {where}: {stages}{chunks}"
    if accelerator.num_processes > 1:
        return (f"the model: a whole copy in each of {accelerator.num_processes} processes (DDP: gradients "
                "averaged over them each step)")  # fmt: skip
    return f"the model: whole, on {accelerator.device}, in one process"


def data_workers(cfg: TrainConfig, accelerator: Accelerator) -> int:
    """`dataloader_num_workers`, or by default the task's choice for this device (finetune/tasks/)."""
    if cfg.dataloader_num_workers is not None:
        return cfg.dataloader_num_workers
    return task_of(cfg.task).default_workers(accelerator.device.type)


def pin_memory(cfg: TrainConfig, accelerator: Accelerator) -> bool:
    """Page-locked batches only where they are copied to a GPU (make_accelerator makes those copies
    non-blocking); on a CPU pinning is a wasted copy."""
    return cfg.dataloader_pin_memory and accelerator.device.type == "cuda"


def cpu_threads(requested: int | None, num_processes: int) -> int:
    """Torch threads for a process training on CPU: `requested`, else this process's share of the cores.

    `accelerate launch` on a machine without a GPU sets OMP_NUM_THREADS=1 unless told
    --num_cpu_threads_per_process: the default recipe then ran on one of the two cores of the dev
    machine (86.9 s vs 53.4 s with both). So unless `cpu_threads` says otherwise, a process takes
    the cores it may use divided by the processes on its machine, whatever OMP_NUM_THREADS says.
    """
    if requested is not None:
        return requested
    local = int(os.environ.get("LOCAL_WORLD_SIZE", num_processes))  # torchrun sets it; else all local
    return max(1, available_cores() // max(local, 1))


def available_cores() -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (containers)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):  # no cgroup v2, or no quota file
        pass
    return cores


def injected_fault() -> Callable[[int, int], None] | None:
    """TEST HOOK, used by tests/test_reliability.py only; inert unless both variables are set.

    FINETUNE_TEST_FAIL_RANK=r FINETUNE_TEST_FAIL_STEP=s make process r fail right after optimizer step
    s, as FINETUNE_TEST_FAIL_MODE says: `raise` an exception (default), `exit` (os._exit(1), a crash)
    or `hang` — to show that the other processes do not wait forever.
    """
    rank, at = os.environ.get("FINETUNE_TEST_FAIL_RANK"), os.environ.get("FINETUNE_TEST_FAIL_STEP")
    if rank is None or at is None:
        return None
    mode = os.environ.get("FINETUNE_TEST_FAIL_MODE", "raise")

    def fail(step: int, process_index: int) -> None:
        if process_index != int(rank) or step != int(at):
            return
        if mode == "exit":
            os._exit(1)
        if mode == "hang":
            while True:
                time.sleep(3600)
        raise RuntimeError(f"injected failure on process {rank} after step {step} (FINETUNE_TEST_FAIL_*)")

    return fail


class ScalerSkips:
    """fp16: whether the gradient scaler skipped the last optimizer step (inf/NaN gradients).

    Accelerate's `optimizer_step_was_skipped` notices a skip by the optimizer's `step()` not being
    called, but the scaler calls a fused optimizer's `step()` every time (the fused kernel skips
    itself on inf), so with `AdamW(fused=True)` it always reads False. The scale only goes down on a
    skipped step, so a lower scale than after the last step is a skip. One host sync per optimizer
    step, only with a scaler (fp16).
    """

    def __init__(self, scaler):
        self.scaler = scaler
        self.scale = scaler.get_scale() if scaler is not None else None

    def __call__(self) -> bool:
        if self.scaler is None:
            return False
        before, self.scale = self.scale, self.scaler.get_scale()
        return self.scale < before


def quiet_libraries(level: str) -> None:
    """The libraries' logging at `level` ("debug", "info", "warning", "error"); their progress bars
    (datasets' "Generating split", map and cast bars; transformers' shard loading) only at info and
    below. The app's own lines and its training bar are printed whatever the level."""
    import logging

    import datasets
    import transformers

    number = getattr(logging, level.upper())
    transformers.utils.logging.set_verbosity(number)
    datasets.utils.logging.set_verbosity(number)
    logging.getLogger("accelerate").setLevel(number)
    # DDP warns, once a process with its own multi-line report, that a gradient's strides differ from its bucket's:
    # a 1x1 convolution's weight (a [1280, 320, 1, 1] stride-1 view either way) fed a channels-last image batch
    # (tasks.stack_images). The reducer copies it into its bucket; the step is the same.
    warnings.filterwarnings("ignore", message=r"Grad strides do not match bucket view strides", category=UserWarning)
    if number <= logging.INFO:
        transformers.utils.logging.enable_progress_bar()
        datasets.enable_progress_bars()
    else:
        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()


@contextlib.contextmanager
def agreed(accelerator: Accelerator):
    """Run the block, then let every process know whether one failed in it: that one raises its error
    and says it (whatever its rank), the others end quietly (`PeerFailed`). Where a process would
    otherwise wait at a barrier that a failed one never reaches, die on a closed connection, and have
    the launcher print its traceback after the one line. Every process enters the block (work for one
    goes under `if accelerator.is_main_process`); the agreement is also a barrier."""
    if accelerator.num_processes == 1:  # no one to tell
        yield
        return
    error = None
    try:
        yield
    except Exception as e:  # a user's mistake, a full disk, or our bug: the others must hear of it
        error = e
    from accelerate.utils import gather_object

    failed = gather_object([error is not None])
    if not any(failed):
        return
    if error is not None and failed.index(True) == accelerator.process_index:
        with contextlib.suppress(AttributeError):
            error.local = True  # type: ignore[attr-defined]  # this process says it, whatever its rank
        raise error
    raise PeerFailed(f"process {failed.index(True)} failed")


@contextlib.contextmanager
def main_process_first(accelerator: Accelerator):
    """`accelerator.main_process_first()` (the main process fills datasets' cache, the others then read
    it), where a failure inside is one line for the whole run (`agreed`)."""
    if not accelerator.is_main_process:
        with agreed(accelerator):  # waits for the main process's turn
            pass
    with agreed(accelerator):
        yield
    if accelerator.is_main_process:
        with agreed(accelerator):  # the others' turn
            pass


def end_processes() -> None:
    """Leave the process group a run formed (Accelerate's `end_training` does this too, with the
    trackers): at the end of an entry point, not of each `train()`, which a search calls many times."""
    from accelerate.state import PartialState

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        PartialState().destroy_process_group()


# --- the attention kernel ---------------------------------------------------------------------------------

# Up to this many tokens a sample, eager attention trains faster than SDPA under bf16 on a CPU (SDPA's fused
# backward is the slow part there); past it SDPA does. MiniLM, batches of 16, a 2-core Xeon with AMX, ms a step
# eager / SDPA: 128 tokens 334 / 441, 192: 505 / 514, 256: 969 / 684, 384: 2097 / 1034
# (benchmarks/results/profile_step_bf16_<attention>_16x<tokens>.md, `python -m benchmarks.profile_step`).
EAGER_UP_TO_TOKENS = 192


def attention_kernel(asked: str | None, device: torch.device, mixed_precision: str, tokens: int | None = None) -> str | None:
    """The attention implementation to set, or None for the model's default: what the config asks;
    unasked, eager for reduced precision on a CPU where a sample has up to `EAGER_UP_TO_TOKENS` tokens (`tokens`:
    `sequence_tokens`; None: unknown, eager), SDPA past that (see TrainConfig.attn_implementation)."""
    if asked is not None:
        return asked
    if device.type == "cpu" and mixed_precision in ("bf16", "fp16"):
        return "eager" if tokens is None or tokens <= EAGER_UP_TO_TOKENS else "sdpa"
    return None


def sequence_tokens(task, cfg: TrainConfig, model_config) -> int | None:
    """Tokens of a training sample as the attention sees them: a text's max_length, a ViT's patches and [CLS]."""
    size, patch = getattr(model_config, "image_size", None), getattr(model_config, "patch_size", None)
    return task.sequence_length(cfg.data_args) or ((size // patch) ** 2 + 1 if size and patch else None)


@contextlib.contextmanager
def evaluation_attention(cfg: TrainConfig, accelerator: Accelerator, model):
    """Evaluation with SDPA where training's kernel was chosen eager (unasked, on a CPU under reduced
    precision: `attention_kernel`). Eager is chosen for SDPA's slow backward there; evaluation has none, so it
    reads with transformers' default kernel, as `evaluate_checkpoint.py` and `pipeline()` read the export. A
    compiled model, or one without SDPA, keeps its kernel."""
    inner = accelerator.unwrap_model(model)
    trained = attention_kernel(cfg.attn_implementation, accelerator.device, accelerator.mixed_precision,
                               sequence_tokens(task_of(cfg.task), cfg, inner.config))  # fmt: skip
    if cfg.attn_implementation is not None or trained != "eager" or cfg.torch_compile or not hasattr(inner, "set_attn_implementation"):
        yield
        return
    try:
        inner.set_attn_implementation("sdpa")
    except (ValueError, ImportError):  # a model without SDPA (EfficientNet: no attention at all)
        yield
        return
    try:
        yield
    finally:
        inner.set_attn_implementation(trained)
