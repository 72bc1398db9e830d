"""Every file in accelerate_configs/ loads with Accelerate's own loader and is the topology it names.

    python -m pytest tests/test_accelerate_configs.py -q

The checks go through Accelerate's code, not a YAML reader of our own: `load_config_from_file` (what
`accelerate launch` reads), the launcher's own argument resolution (which decides how many processes
start), the FSDP plugin built from the launcher's environment, and one real two-process CPU launch.
A new file in accelerate_configs/ is tested automatically and fails until it is added to EXPECTED.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # an accidental download fails loudly

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.utils import DistributedType

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "accelerate_configs"
CONFIG_FILES = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
SBATCH = REPO / "scripts" / "slurm_multinode.sbatch"


@dataclass(frozen=True)
class Expected:
    """What the app relies on in one topology. num_processes None: several (at least 2)."""

    distributed_type: DistributedType
    num_processes: int | None
    use_cpu: bool = False
    num_machines: int = 1


NO, MULTI_GPU, FSDP = DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.FSDP
EXPECTED = {
    "cpu.yaml": Expected(NO, 1, use_cpu=True),
    "cpu_bf16.yaml": Expected(NO, 1, use_cpu=True),
    # MULTI_GPU, not MULTI_CPU: only the torchrun launcher starts several processes (see the file).
    "cpu_ddp.yaml": Expected(MULTI_GPU, 2, use_cpu=True),
    "single_gpu.yaml": Expected(NO, 1),
    "single_gpu_bf16.yaml": Expected(NO, 1),
    "single_gpu_fp16.yaml": Expected(NO, 1),
    "multi_gpu.yaml": Expected(MULTI_GPU, None),
    "multi_gpu_bf16.yaml": Expected(MULTI_GPU, None),
    "multi_gpu_fp16.yaml": Expected(MULTI_GPU, None),
    "multi_node.yaml": Expected(MULTI_GPU, None, num_machines=2),
    # One process: the app spreads the layers itself.
    "model_parallel.yaml": Expected(NO, 1),
    # Several processes, each splitting its replica; run by tests/test_parallel_run.py.
    "ddp_model_parallel.yaml": Expected(MULTI_GPU, None),
    "fsdp.yaml": Expected(FSDP, None),
}


def expected_for(name: str) -> Expected:
    if name not in EXPECTED:
        pytest.fail(
            f"accelerate_configs/{name} is not classified: add it to EXPECTED in {Path(__file__).name}"
        )
    return EXPECTED[name]


def precision_in_name(name: str) -> str:
    """The precision a file's name promises: `*_bf16.yaml`, `*_fp16.yaml`, otherwise full precision."""
    for precision in ("bf16", "fp16"):
        if f"_{precision}" in name:
            return precision
    return "no"


def resolve_launch_args(config_file: Path, *flags: str):
    """What `accelerate launch --config_file <file> [flags] x.py` resolves to, by accelerate's own code.

    `_validate_launch_command` is private, but it is exactly the step that merges the file with the
    flags and chooses the launcher; testing anything else would test our reading of it.
    """
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(config_file), *flags, "train.py"])
    args, _, _ = _validate_launch_command(args)
    return args


def test_every_config_is_classified():
    assert CONFIG_FILES, f"no *.yaml in {CONFIG_DIR}"
    unclassified = sorted(set(CONFIG_FILES) - set(EXPECTED))
    missing = sorted(set(EXPECTED) - set(CONFIG_FILES))
    assert not unclassified, f"add these accelerate configs to EXPECTED: {unclassified}"
    assert not missing, f"EXPECTED names configs that do not exist: {missing}"


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_loads_and_is_its_topology(name: str):
    expected = expected_for(name)
    cfg = load_config_from_file(str(CONFIG_DIR / name))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.compute_environment.value == "LOCAL_MACHINE"
    assert isinstance(cfg.distributed_type, DistributedType)
    assert cfg.distributed_type == expected.distributed_type
    if expected.num_processes is None:
        assert cfg.num_processes >= 2, "a distributed topology needs at least 2 processes"
    else:
        assert cfg.num_processes == expected.num_processes
    assert cfg.use_cpu is expected.use_cpu
    # A string: a bare `no` in YAML would be the boolean False.
    assert isinstance(cfg.mixed_precision, str) and cfg.mixed_precision in {"no", "fp16", "bf16"}
    assert cfg.mixed_precision == precision_in_name(name)
    assert cfg.num_machines == expected.num_machines
    assert 0 <= cfg.machine_rank < cfg.num_machines
    if cfg.num_machines > 1:
        assert cfg.num_processes % cfg.num_machines == 0, "num_processes is the total over all machines"
        assert cfg.main_process_ip and cfg.main_process_port, "multi-node needs the main machine's address"
    if cfg.gpu_ids is not None:
        assert cfg.gpu_ids == "all", "pinning GPU ids in a shared file overrides the scheduler's choice"


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_config_opens_with_its_launch_command(name: str):
    text = (CONFIG_DIR / name).read_text()
    header = text.split("\ncompute_environment:")[0]
    assert all(line.startswith("#") or not line.strip() for line in header.splitlines()), (
        "the explanation belongs in the comments at the top"
    )
    assert f"accelerate launch --config_file accelerate_configs/{name} finetune/run.py" in header


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_launcher_starts_the_promised_processes(name: str):
    """Several processes only come from the torchrun launcher (multi_gpu/fsdp), never from --cpu."""
    expected = expected_for(name)
    args = resolve_launch_args(CONFIG_DIR / name)
    torchrun = (args.multi_gpu or args.use_fsdp) and not args.cpu
    assert torchrun == (expected.num_processes != 1)
    assert args.num_processes == load_config_from_file(str(CONFIG_DIR / name)).num_processes
    assert args.mixed_precision == precision_in_name(name)


def test_multi_node_flags_override_the_file_per_machine():
    for rank in (0, 1):
        args = resolve_launch_args(CONFIG_DIR / "multi_node.yaml", "--machine_rank", str(rank))
        assert (args.machine_rank, args.num_machines, args.num_processes) == (rank, 2, 16)
        assert args.multi_gpu


def test_model_parallel_is_one_plain_process():
    cfg = load_config_from_file(str(CONFIG_DIR / "model_parallel.yaml"))
    assert cfg.distributed_type == DistributedType.NO and cfg.num_processes == 1 and not cfg.use_cpu


def test_fsdp_config_is_full_sharding():
    fsdp = load_config_from_file(str(CONFIG_DIR / "fsdp.yaml")).fsdp_config
    assert fsdp["fsdp_version"] == 2
    # FSDP2 spells FULL_SHARD as reshard_after_forward=True (FSDP1: fsdp_reshard_after_forward: FULL_SHARD).
    assert fsdp["fsdp_reshard_after_forward"] is True
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_state_dict_type"] in {"SHARDED_STATE_DICT", "FULL_STATE_DICT"}


def test_fsdp_plugin_wraps_bert_and_vit_layers():
    """The launcher's FSDP environment, read by Accelerate's plugin, wraps each block of both families."""
    from accelerate.utils import FullyShardedDataParallelPlugin, patch_environment
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from accelerate.utils.launch import prepare_multi_gpu_env
    from conftest import tiny_bert_config, tiny_vit_config
    from transformers import BertForSequenceClassification, ViTForImageClassification

    args = resolve_launch_args(CONFIG_DIR / "fsdp.yaml")
    args.main_process_port = 0  # a free port: the check for a busy one is not under test
    env = {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    with patch_environment(**env):
        plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True

    bert = BertForSequenceClassification(tiny_bert_config(num_labels=2))
    vit = ViTForImageClassification(tiny_vit_config(image_size=8, patch_size=4, num_labels=3))
    for model, layer in ((bert, "BertLayer"), (vit, "ViTLayer")):
        policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
        wrapped = [type(m).__name__ for m in model.modules() if policy(m)]
        assert wrapped.count(layer) == 2, wrapped


TINY_DDP_SCRIPT = """
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState

accelerator = Accelerator()
state = PartialState()
total = torch.tensor([float(state.process_index + 1)])
if dist.is_initialized():
    dist.all_reduce(total)
result = {
    "distributed_type": str(state.distributed_type),
    "num_processes": state.num_processes,
    "process_index": state.process_index,
    "world_size": dist.get_world_size() if dist.is_initialized() else 1,
    "backend": dist.get_backend() if dist.is_initialized() else None,
    "device": accelerator.device.type,
    "all_reduce": total.item(),
}
# One file per process: the ranks share one stdout, where their lines can interleave.
out = Path(sys.argv[1]) / f"rank-{state.process_index}-pid-{os.getpid()}.json"
out.write_text(json.dumps(result))
# Without this, gloo's teardown at exit aborts a rank now and then ("terminate called without an
# active exception"), failing the launch after the work is done.
accelerator.end_training()
"""


@pytest.mark.slow
def test_cpu_ddp_launch_forms_one_gloo_group(tmp_path: Path):
    """The real launch: 2 processes, one MULTI_CPU group over gloo, all_reduce of rank+1 == 3 (~5 s)."""
    script = tmp_path / "tiny_ddp.py"
    script.write_text(TINY_DDP_SCRIPT)
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    # finetune/run.py sets ACCELERATE_USE_CPU itself when no GPU is visible; a bare script must be told.
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    config = CONFIG_DIR / "cpu_ddp.yaml"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(script)]
    proc = subprocess.run(
        [*cmd, str(results_dir)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    assert sorted(r["process_index"] for r in results) == [0, 1], (results, proc.stdout + proc.stderr)
    for r in results:
        assert r["distributed_type"] == "DistributedType.MULTI_CPU"
        assert r["num_processes"] == 2 and r["world_size"] == 2
        assert r["backend"] == "gloo" and r["device"] == "cpu"
        assert r["all_reduce"] == 3.0


FAKE_SRUN = """#!/bin/bash
# srun stand-in: run the command once per node, as SLURM would, with that node's id.
while [[ "$1" == -* ]]; do shift; done
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" || exit $?; done
"""
FAKE_SCONTROL = """#!/bin/bash
printf 'gpu-node-a\\ngpu-node-b\\n'
"""
FAKE_ACCELERATE = """#!/bin/bash
# accelerate stand-in: record the arguments it was given, NUL-separated.
printf '%s\\0' "$@" > "$FAKE_OUT/launch-$SLURM_NODEID"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_script_starts_one_launcher_per_node(tmp_path: Path):
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("accelerate", FAKE_ACCELERATE)):
        (bin_dir / tool).write_text(text)
        (bin_dir / tool).chmod(0o755)
    knobs = ("ACCELERATE_CONFIG", "GPUS_PER_NODE", "MASTER_PORT", "MIXED_PRECISION")  # the script's own
    env = {
        **{k: v for k, v in os.environ.items() if k not in knobs},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_OUT": str(tmp_path),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu-node-[a-b]",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_ID": "4242",  # the port is 10000 + SLURM_JOB_ID % 50000 (tests/test_slurm.py)
    }
    recipe_args = ["--config", "finetune/configs/bert_rotten_tomatoes.yaml", "learning_rate=3e-5"]
    proc = subprocess.run(
        ["bash", str(SBATCH), *recipe_args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        argv = (tmp_path / f"launch-{rank}").read_text().split("\0")[:-1]
        assert argv[0] == "launch"
        script_at = argv.index("finetune/run.py")
        assert argv[script_at + 1 :] == recipe_args
        # Resolve the node's launcher flags with accelerate's own code, as `accelerate launch` would.
        flags = argv[1:script_at]
        config_file = flags[flags.index("--config_file") + 1]
        assert config_file == "accelerate_configs/multi_node.yaml"
        args = resolve_launch_args(REPO / config_file, *flags[2:])
        assert args.multi_gpu
        assert (args.num_machines, args.num_processes, args.machine_rank) == (2, 8, rank)
        assert (args.main_process_ip, args.main_process_port) == ("gpu-node-a", 14242)
