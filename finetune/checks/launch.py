"""Launch: the launcher's arguments and accelerate config, the processes and devices a run was started on,
mixed precision, FSDP, torch.compile, the step plan, and what the model set-up asks of them
(finetune/launch.py, finetune/runtime.py, finetune/shapes.py, finetune/steps.py and finetune/run.py ask
these, in this order).

    CONFIG_FILE     --config_file: a folder, or a file that is not there
    CONFIG_FAILED   why accelerate could not read the config (the first that can tell)
    CONFIG          what --cpu drops from a config without a word; DeepSpeed (FSDP2 instead)
    VALUES          the config's and the flags' values accelerate takes as they come and fails on later
    SCRIPT          the training script
    USAGE           a launcher argument accelerate does not know (the first that can tell)
    DEFAULT_CONFIG  finetune-config: what is there already and does not parse: a folder, another file, a damaged config
    WRITE_FAILED    finetune-config: a default config it cannot write
    BEFORE          the processes before the Accelerator is built: DeepSpeed, FSDP with the layer split, FSDP without GPUs
    FORMED          the processes once it is: the group they formed, the precision on this device
    ON_CPU          a CPU's bf16
    COMPILE         torch_compile with FSDP, or with Accelerate's own compile
    ACCUMULATION    an epoch's batches against gradient_accumulation_steps
    WARMUP          a warm-up as long as the run
    ATTENTION*      the attention kernel asked for: one transformers cannot set, or one the model lacks
    MODEL           the model as training wants it: frozen weights built at random, gradient checkpointing, LoRA
    PLAN_ONLY       --plan-only without the layer split
    ONE_DEVICE      a layer split over one device
    LATER           a resume before this run's later checkpoints
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.checks import rule
from finetune.errors import first_line

# --- the launcher: its config file ----------------------------------------------------------------------


def _shortened(error: Exception, limit: int) -> str:
    """A library's message on one line, cut at a word (with ...) where it is longer than `limit`."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


@rule("launch.config_is_a_folder")
def config_is_a_folder(path: Path) -> str | None:
    """--config_file names a folder (accelerate_configs/ itself): accelerate would fail with a traceback."""
    if path.is_dir():
        return f"accelerate config {path} is a folder; pass the config file (see accelerate_configs/)"
    return None


@rule("launch.config_not_found")
def config_not_found(path: Path) -> str | None:
    """--config_file names a file that is not there: accelerate would fail with a traceback."""
    if not path.is_file():
        return (f"accelerate config {path} does not exist; pass an existing file (see accelerate_configs/), "
                "or leave out --config_file to use the one `accelerate config` wrote")
    return None


CONFIG_FILE = [config_is_a_folder, config_not_found]


@rule("launch.config_is_a_recipe")
def config_is_a_recipe(path: Path, error: Exception, recipe: bool) -> str | None:
    """A finetune recipe given as the accelerate config (`--config_file finetune/configs/<recipe>.yaml`): the line
    says which file goes where, not which key accelerate's config lacks."""
    if recipe:
        return (f"{path} is a finetune recipe, not an accelerate config: pass it to finetune/run.py "
                "as --config, and an accelerate config (accelerate_configs/) as --config_file")
    return None


@rule("launch.config_invalid")
def config_invalid(path: Path, error: Exception, recipe: bool) -> str | None:
    """An accelerate config that accelerate cannot read: YAML or JSON syntax, unknown keys, wrong values.
    Always answers: accelerate's own words, on one line."""
    return f"accelerate config {path} is not a valid accelerate config: {_shortened(error, 300)}"


CONFIG_FAILED = [config_is_a_recipe, config_invalid]


@rule("launch.fsdp_with_cpu")
def fsdp_with_cpu(args: Any, config: Any, path: Path) -> str | None:
    """`accelerate launch --cpu` with an FSDP config: accelerate drops the FSDP (and its processes) without
    a word, and the run would train in one process."""
    if args.cpu and getattr(config, "distributed_type", None) == "FSDP":
        return (f"accelerate config {path} asks for FSDP, which runs on GPUs only, and --cpu would train "
                "without it; use accelerate_configs/cpu_ddp.yaml on a CPU")
    return None


DEEPSPEED_INSTEAD = (
    "this app does not run DeepSpeed (its loop saves and resumes plain state dicts, which DeepSpeed's engine "
    "replaces with its own); for sharded training use FSDP2: accelerate_configs/fsdp.yaml (on GPUs), or "
    "accelerate_configs/cpu_ddp.yaml on a CPU"
)


@rule("launch.deepspeed_config")
def deepspeed_config(args: Any, config: Any, path: Path) -> str | None:
    """An accelerate config (or --use_deepspeed) that asks for DeepSpeed: the app's loop, checkpoints and
    layer split are written for Accelerate's DDP and FSDP2, not for DeepSpeed's engine, and accelerate would
    otherwise fail on a missing deepspeed package or later, in every process."""
    kind = getattr(config, "distributed_type", None)
    if getattr(args, "use_deepspeed", False) or str(getattr(kind, "value", kind)) == "DEEPSPEED":
        return f"accelerate config {path} asks for DeepSpeed: {DEEPSPEED_INSTEAD}"
    return None


CONFIG = [fsdp_with_cpu, deepspeed_config]


# --- the launcher: its values ----------------------------------------------------------------------------

WHOLE_NUMBERS = ("num_processes", "num_machines", "machine_rank", "main_process_port")


@dataclass
class Values:
    """A launch's values as accelerate would take them: a flag wins over the accelerate config (`config`,
    read from `path`; None where there is none), as in accelerate."""

    args: Any  # accelerate launch's arguments (argparse.Namespace)
    config: Any
    path: Path | None

    def value(self, name: str) -> tuple[Any, str]:
        """The value of `name` and where it was given (the flag, or the config)."""
        flag = getattr(self.args, name, None)
        if flag is not None:
            return flag, f"--{name}"
        return getattr(self.config, name, None), f"in accelerate config {self.path}"

    @property
    def kind(self) -> str:
        """The config's distributed_type, as written."""
        kind = getattr(self.config, "distributed_type", None)
        return str(getattr(kind, "value", kind))

    @property
    def several(self) -> bool:
        """Several processes asked for, and nothing (mpirun, --multi_gpu) that starts them all."""
        processes, _ = self.value("num_processes")
        mpirun = getattr(self.args, "mpirun_hostfile", None) or (getattr(self.config, "mpirun_config", None) or {}).get(
            "mpirun_hostfile")
        return (processes or 1) > 1 and not getattr(self.args, "multi_gpu", False) and not (
            self.kind == "MULTI_CPU" and mpirun)


@rule("launch.not_a_whole_number")
def not_a_whole_number(v: Values) -> str | None:
    """num_processes, num_machines, machine_rank or main_process_port written in the config as something
    other than a whole number (`num_processes: two`, `2.5`, `true`): accelerate fails on it later, with a
    traceback."""
    for name in WHOLE_NUMBERS:
        if getattr(v.args, name, None) is not None:
            continue
        held, where = v.value(name)
        if held is not None and (isinstance(held, bool) or not isinstance(held, int)):
            return f"{name} {held!r} ({where}) is not a whole number; write it as one (e.g. {name}: 2)"
    return None


@rule("launch.num_processes")
def num_processes(v: Values) -> str | None:
    """num_processes below 1: nothing would start. -1 in a config is accelerate's "not set" (the launcher
    then counts the GPUs)."""
    processes, where = v.value("num_processes")
    if processes is not None and processes < 1 and not (processes == -1 and where != "--num_processes"):
        return f"num_processes must be at least 1, got {processes} ({where})"
    return None


@rule("launch.multi_cpu_without_mpirun")
def multi_cpu_without_mpirun(v: Values) -> str | None:
    """distributed_type MULTI_CPU with several processes and no mpirun: accelerate starts them only through
    mpirun, so it would train in one process."""
    processes, _ = v.value("num_processes")
    if v.kind == "MULTI_CPU" and v.several:
        return (f"accelerate config {v.path} asks for MULTI_CPU with {processes} processes, which accelerate starts only "
                "through mpirun (mpirun_config): it would train in one process; for several CPU processes on one "
                "machine use accelerate_configs/cpu_ddp.yaml (distributed_type MULTI_GPU with use_cpu: true)")
    return None


@rule("launch.processes_without_distribution")
def processes_without_distribution(v: Values) -> str | None:
    """Several processes with distributed_type NO (a default config edited by hand): accelerate starts one,
    and it would train alone."""
    processes, where = v.value("num_processes")
    if v.kind == "NO" and v.several:
        return (f"num_processes {processes} ({where}) with distributed_type NO: accelerate starts one process and it "
                "would train alone; for several CPU processes use accelerate_configs/cpu_ddp.yaml (on GPUs, "
                "distributed_type MULTI_GPU), or set num_processes: 1")
    return None


@rule("launch.num_machines")
def num_machines(v: Values) -> str | None:
    """num_machines below 1: accelerate's launcher divides by it."""
    machines, where = v.value("num_machines")
    if machines is not None and machines < 1:
        return f"num_machines must be at least 1, got {machines} ({where})"
    return None


@rule("launch.machine_rank")
def machine_rank(v: Values) -> str | None:
    """A machine_rank that is not one of the machines: the launcher would wait for a machine that never comes."""
    rank, where = v.value("machine_rank")
    machines = v.value("num_machines")[0] or 1
    if rank is not None and not 0 <= rank < machines:
        return f"machine_rank {rank} ({where}) is not one of the {machines} machines: give 0 to {machines - 1}"
    return None


@rule("launch.main_process_port")
def main_process_port(v: Values) -> str | None:
    """A main_process_port that is not a port (0 asks for a free one)."""
    port, where = v.value("main_process_port")
    if port is not None and not 0 <= port < 65536:
        return f"main_process_port {port} ({where}) is not a port: give one from 0 (any free one) to 65535"
    return None


@rule("launch.mixed_precision")
def mixed_precision(v: Values) -> str | None:
    """A mixed_precision accelerate does not know: every training process would fail on it."""
    from accelerate.utils import PrecisionType

    precision, where = v.value("mixed_precision")
    precisions = [p.value for p in PrecisionType]
    precision = getattr(precision, "value", precision)  # an enum member, or the string as written
    if precision is not None and str(precision).lower() not in precisions:
        return f"mixed_precision {precision!r} ({where}) is not one of {', '.join(precisions)}"
    return None


@rule("launch.dynamo_backend")
def dynamo_backend(v: Values) -> str | None:
    """A dynamo_backend in the config that accelerate does not know (and no --dynamo_backend over it)."""
    from accelerate.utils import DynamoBackend

    backend = (getattr(v.config, "dynamo_config", None) or {}).get("dynamo_backend")
    backend = getattr(backend, "value", backend)
    backends = [b.value for b in DynamoBackend]
    if v.args.dynamo_backend is None and backend is not None and str(backend).upper() not in backends:
        return (f"dynamo_backend {backend!r} (in accelerate config {v.path}) is not one of "
                f"{', '.join(b.lower() for b in backends)}")
    return None


VALUES = [not_a_whole_number, num_processes, multi_cpu_without_mpirun, processes_without_distribution, num_machines,
          machine_rank, main_process_port, mixed_precision, dynamo_backend]  # fmt: skip


@rule("launch.no_script")
def no_script(args: Any) -> str | None:
    """The training script is not there (a typo in finetune/run.py): accelerate would start a process that
    fails with a traceback."""
    script = args.training_script
    if not (args.module or args.no_python) and not Path(script).is_file():
        return f"script {script} does not exist; the training script is finetune/run.py"
    return None


SCRIPT = [no_script]


@rule("launch.recipe_flag")
def recipe_flag(message: str) -> str | None:
    """--config (the recipe, finetune/run.py's option) given to the launcher, before the script."""
    unknown = message.split(":", 1)[1].split() if message.startswith("unrecognized arguments:") else []
    if any(a == "--config" or a.startswith("--config=") for a in unknown):
        return ("--config (the recipe) is finetune/run.py's option: put it after the script, as in "
                "finetune-launch finetune/run.py --config finetune/configs/<recipe>.yaml; the "
                "launcher's own is --config_file (accelerate_configs/)")
    return None


@rule("launch.usage")
def usage(message: str) -> str | None:
    """An argument accelerate launch does not take, or one missing: its parser's words on one line, not its
    page of usage. Always answers."""
    return f"{message}; see finetune-launch --help (accelerate launch's arguments)"


USAGE = [recipe_flag, usage]


def _accelerate_keys() -> set[str]:
    import dataclasses

    from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig

    return {f.name for config in (ClusterConfig, SageMakerConfig) for f in dataclasses.fields(config)}


def _not_an_accelerate_config(path: Path) -> str | None:
    """What a file is where it is no accelerate config at all (None: one, damaged or not). Its text names
    accelerate's keys where it does not parse (a tab in its YAML): a damaged accelerate config."""
    import json
    import re

    import yaml

    fmt = "JSON" if path.suffix == ".json" else "YAML"  # as accelerate reads it
    try:
        if path.stat().st_size > 1_000_000:
            return f"a file of {path.stat().st_size // 1_000_000} MB"
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return "not text"
    except OSError:
        return None
    keys = _accelerate_keys()
    try:
        value = json.loads(text) if fmt == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        named = re.search(rf"^\s*[\"']?({'|'.join(keys)})[\"']?\s*:", text, re.M)
        return None if named else f"not valid {fmt}"
    if value is None:
        return "empty"
    if not isinstance(value, dict):
        return f"not a {fmt} mapping of settings"
    if not keys & {str(k) for k in value}:
        some = ", ".join(str(k) for k in list(value)[:3]) + (", ..." if len(value) > 3 else "")
        return f"a {fmt} mapping of {some} without any of accelerate's keys (compute_environment, distributed_type, ...)"
    return None


@rule("launch.default_config_is_a_folder")
def default_config_is_a_folder(path: Path, error: Exception) -> str | None:
    """finetune-config's --config_file names a folder: accelerate's config is a file, and the folder (which
    may hold the user's data) is left as it is."""
    if path.is_dir():
        return (f"{path} is a folder; --config_file names a YAML file: give the path of the file to write, "
                f"e.g. {path / 'accelerate.yaml'}")
    return None


@rule("launch.default_config_not_accelerate")
def default_config_not_accelerate(path: Path, error: Exception) -> str | None:
    """finetune-config finds a file that is no accelerate config at all where it would write one: not text, not
    YAML (or JSON), not a mapping, or a mapping without any of accelerate's keys (a data file, a recipe). It is
    left as it is, and the line offers another path (it may be the user's file), not deleting it."""
    what = _not_an_accelerate_config(path)
    if what:
        return (f"{path} is {what}, not an accelerate config, and is left as it is; give --config_file a new path "
                "for finetune-config to write accelerate's config to, or write one with `accelerate config`")
    return None


@rule("launch.default_config_invalid")
def default_config_invalid(path: Path, error: Exception) -> str | None:
    """finetune-config finds an accelerate config already there that does not parse, or holds a value no
    launch can use: said now, not at the next launch, and the file is left as it is. Always answers."""
    return (f"accelerate config {path} exists but is not a valid accelerate config ({_shortened(error, 200)}); "
            "fix it, or move it aside and run finetune-config again")


DEFAULT_CONFIG = [default_config_is_a_folder, default_config_not_accelerate, default_config_invalid]


@rule("launch.cannot_write_config")
def cannot_write_config(path: Path, error: OSError) -> str | None:
    """finetune-config cannot write accelerate's default config (a read-only home, a full disk). Always
    answers."""
    return f"cannot write accelerate's config {path}: {error.strerror or error}"


WRITE_FAILED = [cannot_write_config]


# --- the processes ---------------------------------------------------------------------------------------

FSDP_NEEDS_GPUS = (
    "the accelerate config asks for FSDP, which Accelerate runs on GPUs only; use a DDP config "
    "(accelerate_configs/cpu_ddp.yaml on a CPU) or run on GPUs"
)


@dataclass
class Processes:
    """What a run was launched as, read from the environment before the Accelerator is built
    (finetune/runtime.py's `make_accelerator`)."""

    world_size: int
    fsdp: bool  # an FSDP config (the launcher's ACCELERATE_USE_FSDP)
    cuda: bool  # torch sees a GPU
    fsdp_on_cpu: bool  # the tests' FSDP on CPU processes (runtime._fsdp_on_cpu_for_tests)
    model_parallel: bool
    deepspeed: bool = False  # a DeepSpeed config (the launcher's ACCELERATE_USE_DEEPSPEED)


@rule("launch.deepspeed")
def deepspeed(p: Processes) -> str | None:
    """A run launched with a DeepSpeed config (`accelerate launch` straight, not finetune-launch): refused
    before the Accelerator builds DeepSpeed's engine, which the loop's checkpoints do not know."""
    if p.deepspeed:
        return f"the run was launched with DeepSpeed: {DEEPSPEED_INSTEAD}"
    return None


@rule("launch.model_parallel_with_fsdp")
def model_parallel_with_fsdp(p: Processes) -> str | None:
    """model_parallel=true under an FSDP config: the layer split and FSDP's sharding do not combine."""
    if p.model_parallel and p.fsdp:
        return ("model_parallel=true splits a replica of the model inside each process and FSDP shards the "
                "model across processes; use one: accelerate_configs/ddp_model_parallel.yaml (or "
                "model_parallel.yaml) for the split, or fsdp.yaml without model_parallel")
    return None


@rule("launch.fsdp_without_gpus")
def fsdp_without_gpus(p: Processes) -> str | None:
    """An FSDP config where torch sees no GPU: Accelerate runs FSDP on GPUs only."""
    if p.fsdp and not p.cuda and not p.fsdp_on_cpu:
        return FSDP_NEEDS_GPUS
    return None


BEFORE = [deepspeed, model_parallel_with_fsdp, fsdp_without_gpus]


@dataclass
class Formed:
    """The processes once the Accelerator is built, and what the launcher's environment said of them."""

    processes: Processes
    accelerator: Any
    started_alone: bool  # one process of several asked for, started alone (runtime._one_of_several_started_alone)
    gpu_asked: bool  # a config written for a GPU (runtime._a_gpu_was_asked_for)


@rule("launch.fsdp_not_formed")
def fsdp_not_formed(f: Formed) -> str | None:
    """An FSDP config whose processes did not become an FSDP group (on CPUs: plain DDP, or one process)."""
    from accelerate.utils import DistributedType

    if f.processes.fsdp and f.accelerator.distributed_type != DistributedType.FSDP:
        return f"{FSDP_NEEDS_GPUS} (these processes run {f.accelerator.distributed_type})"
    return None


@rule("launch.group_not_formed")
def group_not_formed(f: Formed) -> str | None:
    """Several processes launched that did not form one group: each would train alone."""
    world = f.processes.world_size
    if world > 1 and f.accelerator.num_processes != world:
        return (f"{world} processes were launched but they did not form one group "
                f"({f.accelerator.distributed_type}); check the accelerate config")
    return None


@rule("launch.started_alone", warning=True)
def started_alone(f: Formed) -> str | None:
    """`accelerate launch` asked for several processes (MASTER_ADDR is set) started this one alone (a
    MULTI_CPU config without mpirun): it trains in one process."""
    if f.accelerator.num_processes == 1 and f.started_alone:
        return ("accelerate launch was asked for several processes (MASTER_ADDR is set) but started this "
                "one alone, so it trains in one process: a config with distributed_type MULTI_CPU starts several "
                "only through mpirun; for several CPU processes on one machine use accelerate_configs/cpu_ddp.yaml")
    return None


@rule("launch.fp16_on_cpu")
def fp16_on_cpu(f: Formed) -> str | None:
    """mixed precision fp16 on a CPU: Accelerate has no fp16 autocast there, so it would train in fp32 and
    report fp16."""
    if f.accelerator.mixed_precision == "fp16" and f.accelerator.device.type == "cpu":
        return "mixed precision fp16 needs a GPU; on a CPU use bf16 (accelerate_configs/cpu_bf16.yaml) or no"
    return None


@rule("launch.gpu_config_on_cpu", warning=True)
def gpu_config_on_cpu(f: Formed) -> str | None:
    """A config written for a GPU (use_cpu: false) where torch sees none: the run trains on the CPU."""
    if f.accelerator.device.type == "cpu" and f.processes.world_size == 1 and f.gpu_asked:
        return ("the accelerate config is for a GPU (use_cpu: false) but torch sees none, so this run trains "
                "on the CPU; on a machine without a GPU launch with --config_file accelerate_configs/cpu.yaml (or "
                "--cpu), else check the GPU's driver and CUDA_VISIBLE_DEVICES")
    return None


FORMED = [fsdp_not_formed, group_not_formed, started_alone, fp16_on_cpu, gpu_config_on_cpu]


@rule("launch.bf16_emulated", warning=True)
def bf16_emulated(accelerator: Any, native: bool, capability: str) -> str | None:
    """bf16 on a CPU without native bf16 (AMX, AVX512-BF16): emulated, several times slower than fp32."""
    if accelerator.mixed_precision == "bf16" and not native:
        return (f"bf16 on a CPU without native bf16 (this one: {capability}) "
                "is emulated and several times slower than fp32; use accelerate_configs/cpu.yaml here "
                "(cpu_bf16.yaml is for CPUs with AMX or AVX512-BF16)")
    return None


ON_CPU = [bf16_emulated]


# --- torch.compile ---------------------------------------------------------------------------------------


@rule("launch.compile_with_fsdp")
def compile_with_fsdp(accelerator: Any) -> str | None:
    """torch_compile=true under FSDP: the app compiles one process's or DDP's model only."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.FSDP:
        return "torch_compile works with one process or DDP, not FSDP; choose another accelerate config"
    return None


@rule("launch.compile_twice")
def compile_twice(accelerator: Any) -> str | None:
    """torch_compile=true and the accelerate config's dynamo_backend: both would compile the model."""
    backend = getattr(accelerator.state, "dynamo_plugin", None)
    if backend is not None and str(getattr(backend, "backend", "no")).lower() not in ("no", "dynamobackend.no"):
        return "torch_compile=true and the accelerate config's dynamo_backend both compile the model; use one of them"
    return None


COMPILE = [compile_with_fsdp, compile_twice]


# --- the step plan ---------------------------------------------------------------------------------------


@rule("launch.accumulation_over_epoch")
def accumulation_over_epoch(accumulation: int, batches: int) -> str | None:
    """gradient_accumulation_steps above the batches a process has in an epoch: no optimizer step would
    hold the accumulation asked for."""
    if accumulation > batches:
        return (f"gradient_accumulation_steps={accumulation} exceeds the {batches} batches per process in an epoch; "
                "lower gradient_accumulation_steps or per_device_train_batch_size")
    return None


ACCUMULATION = [accumulation_over_epoch]


@rule("launch.warmup_steps_cover_the_run")
def warmup_steps_cover_the_run(cfg: Any, warmup: int, total_steps: int, manifest: dict | None) -> str | None:
    """warmup_steps as many as the run's optimizer steps (from its epochs): the learning rate would never
    reach learning_rate."""
    if warmup >= total_steps and cfg.warmup_steps is not None:
        return (f"warmup_steps={warmup} covers all {total_steps} optimizer step(s) of the run: the learning rate would "
                "never reach learning_rate; lower warmup_steps")
    return None


@rule("launch.all_warmup", warning=True)
def all_warmup(cfg: Any, warmup: int, total_steps: int, manifest: dict | None) -> str | None:
    """A warmup_ratio that makes every optimizer step a warm-up step: the first step's rate is 0, so one
    step trains nothing. Not said again by a resume past the warm-up."""
    if warmup >= total_steps and (manifest is None or manifest["step"] < total_steps):
        return (f"warmup_ratio={cfg.warmup_ratio:g} makes all {total_steps} optimizer step(s) warm-up steps: the "
                "learning rate never reaches learning_rate (the first step's is 0, so one step trains nothing); train "
                "more steps, or set warmup_ratio=0")
    return None


WARMUP = [warmup_steps_cover_the_run, all_warmup]


# --- the model as training wants it ----------------------------------------------------------------------


@rule("launch.attention_kernel")
def attention_kernel(attn: str, error: Exception) -> str | None:
    """An attn_implementation the model has no kernel for (flash_attention_2 without its package, sdpa on
    a model without it): transformers' reason, on one line. Always answers."""
    return f"attn_implementation={attn}: {first_line(error)}"


ATTENTION_FAILED = [attention_kernel]


@rule("launch.attention_needs_newer_transformers")
def attention_needs_newer_transformers(asked: str | None, model: Any) -> str | None:
    """attn_implementation asked of a transformers without `set_attn_implementation`: it cannot be set on a
    built model."""
    if asked and not hasattr(model, "set_attn_implementation"):
        return "attn_implementation needs a newer transformers (PreTrainedModel.set_attn_implementation)"
    return None


ATTENTION = [attention_needs_newer_transformers]


@rule("launch.frozen_random_weights", warning=True)
def frozen_random_weights(cfg: Any, model: Any, fsdp: bool) -> str | None:
    """Weights frozen (freeze_embeddings, freeze_layers, LoRA) in a model built at random from model_config:
    they stay random and only the rest learns; freezing is for pretrained weights."""
    if not ((cfg.freeze_embeddings or cfg.freeze_layers or cfg.peft is not None) and cfg.model_config is not None
            and not cfg.resume_from_checkpoint):  # fmt: skip
        return None
    what, fix = (("peft (LoRA) freezes every weight but its adapters and the head", "peft=null")
                 if cfg.peft is not None else
                 (f"freeze_layers={cfg.freeze_layers} freezes the embeddings and layers", "freeze_layers=0")
                 if cfg.freeze_layers else ("freeze_embeddings=true freezes the word embeddings",
                                            "freeze_embeddings=false"))  # fmt: skip
    return (f"{what} of a model built at random from model_config: they stay random and only the rest learns; "
            f"freezing is for pretrained weights (model_name_or_path): set {fix}")


@rule("launch.gradient_checkpointing")
def gradient_checkpointing(cfg: Any, model: Any, fsdp: bool) -> str | None:
    """gradient_checkpointing=true for a model class that does not support it."""
    if cfg.gradient_checkpointing and not model.supports_gradient_checkpointing:
        return f"{type(model).__name__} does not support gradient_checkpointing"
    return None


@rule("launch.lora_with_fsdp")
def lora_with_fsdp(cfg: Any, model: Any, fsdp: bool) -> str | None:
    """peft (LoRA) under an FSDP config: the app trains adapters with one process or DDP only."""
    if cfg.peft is not None and fsdp:
        return "peft (LoRA) trains with one process or DDP, not FSDP; choose another accelerate config"
    return None


@rule("launch.sync_batchnorm_on_cpu")
def sync_batchnorm_on_cpu(cfg: Any, device: str, layers: list[str], model_name: str) -> str | None:
    """sync_batchnorm=true on a CPU: torch's SyncBatchNorm gathers its statistics on GPUs only."""
    if cfg.sync_batchnorm and device == "cpu":
        return ("sync_batchnorm=true needs GPUs (torch.nn.SyncBatchNorm does not run on a CPU); on a CPU set "
                "freeze_batchnorm=true to make DDP equal one big batch, or sync_batchnorm=false")
    return None


@rule("launch.batchnorm_setting_without_batchnorm")
def batchnorm_setting_without_batchnorm(cfg: Any, device: str, layers: list[str], model_name: str) -> str | None:
    """freeze_batchnorm or sync_batchnorm for a model with no BatchNorm layer (BERT, ViT): it would do nothing."""
    named = [n for n in ("freeze_batchnorm", "sync_batchnorm") if getattr(cfg, n)]
    if named and not layers:
        return f"{model_name} has no BatchNorm layer: {' and '.join(n + '=true' for n in named)} would do nothing; drop it"
    return None


@rule("launch.fsdp_without_input_embeddings")
def fsdp_without_input_embeddings(cfg: Any, model: Any, fsdp: bool) -> str | None:
    """An FSDP config for a model transformers gives no input embeddings (EfficientNet): Accelerate's FSDP2
    asks every model for them, and transformers raises for such a one."""
    if not fsdp:
        return None
    try:
        model.get_input_embeddings()
    except NotImplementedError:
        return (f"FSDP cannot shard {type(model).__name__}: Accelerate's FSDP2 asks a model for its input embeddings, "
                "which this one has not; it is small enough for one device: use DDP (accelerate_configs/cpu_ddp.yaml, "
                "or a multi-GPU config), where freeze_batchnorm=true makes it equal one big batch")
    return None


MODEL = [frozen_random_weights, gradient_checkpointing, lora_with_fsdp, fsdp_without_input_embeddings]
BATCHNORM = [sync_batchnorm_on_cpu, batchnorm_setting_without_batchnorm]


# --- the layer split and a resume ------------------------------------------------------------------------


@rule("launch.plan_only_needs_model_parallel")
def plan_only_needs_model_parallel(cfg: Any) -> str | None:
    """--plan-only prints the layer split's plan: without model_parallel=true there is none."""
    if not cfg.model_parallel:
        return "--plan-only needs model_parallel=true"
    return None


PLAN_ONLY = [plan_only_needs_model_parallel]


@rule("launch.model_parallel_one_device", warning=True)
def model_parallel_one_device(stages: int) -> str | None:
    """model_parallel=true whose plan puts every layer on one device: the model trains unsplit."""
    if stages == 1:
        return "model parallelism with one device: training unsplit"
    return None


ONE_DEVICE = [model_parallel_one_device]


@rule("launch.later_checkpoints", warning=True)
def later_checkpoints(path: Path, later: list[str], model: Path, step: int) -> str | None:
    """A resume from a checkpoint before this run's later ones: they, and the export, are replaced as the
    run goes on from that step."""
    if later:
        return (f"resuming from {path.name}, before this run's later checkpoint(s) {', '.join(later)}: they, and the "
                f"export in {model}, are replaced as the run goes on from step {step} (copy them "
                "elsewhere first to keep them)")
    return None


LATER = [later_checkpoints]
