"""finetune/runtime.py: the processes of a run. CPU threads per process, OpenMP's wait policy, and a
process that fails, dies or hangs ending the whole DDP job (how processes agree on a failure).

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_runtime.py
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import torch
from conftest import (
    REPO,
    launch,
    launch_command,
    logged_steps,
    tiny_text_args,
    user_error,
)

from finetune import checks
from finetune.errors import UserError


def _ddp_fault(small_text_data, tmp_path, mode: str, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """Two CPU processes; process 1 fails after optimizer step 2. Returns the result and the seconds
    from the failure (step 1 logged, step 2 not) to the end of the whole job."""
    out = tmp_path / "run"
    cmd = [
        *launch_command(2),
        str(REPO / "finetune/run.py"),
        *tiny_text_args(small_text_data, out, "max_steps=20", "per_device_train_batch_size=2", *extra),
    ]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "FINETUNE_TEST_FAIL_RANK": "1",
        "FINETUNE_TEST_FAIL_STEP": "2",
        "FINETUNE_TEST_FAIL_MODE": mode,
    }
    log = tmp_path / "log"
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=log.with_suffix(".out").open("w"),
        stderr=log.with_suffix(".err").open("w"),
        text=True,
    )
    deadline = time.monotonic() + 240
    while logged_steps(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    failed_at = time.monotonic()
    proc.wait(timeout=240)
    elapsed = time.monotonic() - failed_at
    result = subprocess.CompletedProcess(
        cmd, proc.returncode, log.with_suffix(".out").read_text(), log.with_suffix(".err").read_text()
    )
    assert logged_steps(out) == 1, "process 1 did not fail at step 2"
    return result, elapsed


@pytest.mark.slow
def test_a_process_that_raises_ends_the_ddp_job(small_text_data, tmp_path):
    result, elapsed = _ddp_fault(small_text_data, tmp_path, "raise")
    assert result.returncode != 0
    assert "injected failure on process 1" in result.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


@pytest.mark.slow
def test_a_process_that_dies_ends_the_ddp_job(small_text_data, tmp_path):
    result, elapsed = _ddp_fault(small_text_data, tmp_path, "exit")
    assert result.returncode != 0
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


@pytest.mark.slow
def test_a_hung_process_ends_the_ddp_job_after_ddp_timeout(small_text_data, tmp_path):
    """Process 0 waits ddp_timeout=10 s in a collective, fails; the launcher then stops process 1
    (SIGTERM, which a hung process ignores, then SIGKILL after torchrun's 30 s)."""
    result, elapsed = _ddp_fault(small_text_data, tmp_path, "hang", "ddp_timeout=10")
    assert result.returncode != 0
    assert "Timed out" in result.stderr or "timed out" in result.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


def _cores() -> int:
    from finetune.runtime import available_cores

    return available_cores()


@pytest.mark.slow
@pytest.mark.skipif(_cores() < 2, reason="needs 2 or more cores")
def test_accelerate_launch_on_cpu_uses_every_core_unless_told(small_text_data, tmp_path):
    """`accelerate launch` gives a CPU process OMP_NUM_THREADS=1; the app takes its share of the cores
    (one process: all of them; two: half each), and `cpu_threads=N` is obeyed."""

    def threads(result) -> list[int]:
        assert result.returncode == 0, result.stderr[-2000:]
        return [
            int(line.split()[-1]) for line in result.stdout.splitlines() if line.startswith("cpu_threads")
        ]

    args = tiny_text_args(small_text_data, tmp_path / "o", "--dry-run")
    env = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}  # on the CPU also where a GPU exists
    assert threads(launch(args, env=env)) == [_cores()]
    assert threads(launch([*args, "cpu_threads=1"], env=env)) == [1]
    assert threads(launch(args, num_processes=2, env=env)) == [max(1, _cores() // 2)]  # main process prints


@pytest.mark.slow
@pytest.mark.parametrize("module", ["finetune.run", "finetune.evaluate_checkpoint"])
def test_openmp_threads_sleep_when_they_wait_unless_the_user_says(module):
    """The entry points set OMP_WAIT_POLICY=PASSIVE before torch loads libgomp, which then spins 0
    times (its default: 300,000); a policy of the user's own is kept. libgomp prints what it read."""
    import subprocess
    import sys

    def spincount(**env: str) -> str:
        environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        code = f"import {module}, torch; torch.ones(4).sum()"
        run = subprocess.run([sys.executable, "-c", code], env={**environ, "OMP_DISPLAY_ENV": "VERBOSE", **env},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        return next(line.split("=")[1].strip() for line in run.stderr.splitlines() if "GOMP_SPINCOUNT" in line)

    assert spincount() == "'0'"
    if module == "finetune.run":
        assert spincount(OMP_WAIT_POLICY="ACTIVE") != "'0'"


@pytest.mark.parametrize(("use_cpu", "warned"), [("False", True), ("true", False), (None, False)])
def test_a_gpu_config_on_a_machine_without_a_gpu_says_it_trains_on_the_cpu(monkeypatch, capsys, tmp_path,
                                                                             use_cpu, warned):
    """The launcher sets ACCELERATE_USE_CPU from the config's use_cpu: false (single_gpu.yaml) where torch
    sees no GPU is one warning that names cpu.yaml; a CPU config, or plain python, none."""
    from finetune import runtime
    from finetune.config import DEFAULT_RECIPE, load_config

    if use_cpu is None:
        monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_USE_CPU", use_cpu)
    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: False)
    warnings = checks.Said()
    accelerator = runtime.make_accelerator(load_config(DEFAULT_RECIPE, [f"output_dir={tmp_path}"]), warnings)
    assert accelerator.device.type == "cpu"
    said = [line for line in capsys.readouterr().err.splitlines() if "torch sees none" in line]
    assert len(said) == int(warned)
    assert ("launch.gpu_config_on_cpu" in warnings.rules()) == warned
    if warned:
        assert said[0].startswith("warning: the accelerate config is for a GPU") and "cpu.yaml" in said[0]


# --- the launch's rules met by the run (finetune/checks/launch.py) ----------------------------------------


def test_bf16_on_a_cpu_without_native_bf16_is_a_warning_of_the_run(monkeypatch, tmp_path, capsys):
    from finetune import runtime
    from finetune.config import DEFAULT_RECIPE, load_config

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setattr(runtime, "native_bf16", lambda: False)
    said = checks.Said()
    runtime.make_accelerator(load_config(DEFAULT_RECIPE, [f"output_dir={tmp_path}"]), said)
    assert said.rules() == ["launch.bf16_emulated"]
    assert "warning: bf16 on a CPU without native bf16" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "settings", "rule", "fragment"),
    [
        ({"ACCELERATE_USE_FSDP": "true"}, ["model_parallel=true"], "launch.model_parallel_with_fsdp",
         "splits a replica of the model inside each process"),
        ({"ACCELERATE_USE_FSDP": "true"}, [], "launch.fsdp_without_gpus", "which Accelerate runs on GPUs only"),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, [], "launch.deepspeed", "use FSDP2: accelerate_configs/fsdp.yaml"),
        ({"ACCELERATE_MIXED_PRECISION": "fp16"}, [], "launch.fp16_on_cpu", "mixed precision fp16 needs a GPU"),
    ],
)  # fmt: skip
def test_what_the_processes_cannot_run_is_refused_as_the_accelerator_is_built(env, settings, rule, fragment,
                                                                             monkeypatch, tmp_path):  # fmt: skip
    from finetune import runtime
    from finetune.config import load_config

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: False)
    cfg = load_config(None, tiny_text_args({"train": tmp_path / "t.csv", "validation": tmp_path / "v.csv"},
                                           tmp_path / "o", *settings))  # fmt: skip
    with pytest.raises(UserError, match=fragment) as e:
        runtime.make_accelerator(cfg)
    assert e.value.rule == rule


@pytest.mark.parametrize(
    ("fsdp", "world", "rule"),
    [(True, 1, "launch.fsdp_not_formed"), (False, 2, "launch.group_not_formed")],
)
def test_processes_that_did_not_form_the_group_asked_for_are_refused(fsdp, world, rule):
    """What the Accelerator formed, against what was launched (a CPU group that stayed DDP under an FSDP
    config; processes that each train alone): the Accelerator's state stands in for a real launch."""
    import types

    from accelerate.utils import DistributedType

    from finetune.checks import launch

    accelerator = types.SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, num_processes=1,
                                        mixed_precision="no", device=torch.device("cpu"))  # fmt: skip
    formed = launch.Formed(launch.Processes(world, fsdp, False, True, False), accelerator, False, False)
    with pytest.raises(UserError) as e:
        checks.gate(launch.FORMED, formed, said=checks.Said())
    assert e.value.rule == rule


def _training_model(tmp_path, *settings: str, fsdp: bool = False, said: checks.Said | None = None):
    """`run.build_for_training` on the tiny BERT of a config, with an Accelerator's device, precision and
    distributed type stood in for."""
    import types

    from accelerate.utils import DistributedType

    from finetune import run
    from finetune.config import load_config

    data = {"train": tmp_path / "t.csv", "validation": tmp_path / "v.csv"}
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), mixed_precision="no",
                                        distributed_type=DistributedType.FSDP if fsdp else DistributedType.NO)  # fmt: skip
    cfg = load_config(None, tiny_text_args(data, tmp_path / "o", *settings))
    return run.build_for_training(cfg, accelerator, ["neg", "pos"], said or checks.Said())


@pytest.mark.parametrize("frozen", ["freeze_layers=1", "freeze_embeddings=true", "peft={}"])
def test_weights_frozen_in_a_model_built_at_random_are_a_warning(frozen, tmp_path):
    said = checks.Said()
    _training_model(tmp_path, frozen, said=said)
    assert said.rules() == ["launch.frozen_random_weights"]


def test_lora_under_fsdp_is_refused(tmp_path):
    with pytest.raises(UserError, match="peft \\(LoRA\\) trains with one process or DDP, not FSDP") as e:
        _training_model(tmp_path, "peft={}", fsdp=True)
    assert e.value.rule == "launch.lora_with_fsdp"


def test_gradient_checkpointing_of_a_model_without_it_is_refused(tmp_path, monkeypatch):
    from transformers import BertPreTrainedModel

    monkeypatch.setattr(BertPreTrainedModel, "supports_gradient_checkpointing", False)
    with pytest.raises(UserError, match="does not support gradient_checkpointing") as e:
        _training_model(tmp_path, "gradient_checkpointing=true")
    assert e.value.rule == "launch.gradient_checkpointing"


def test_an_attention_kernel_the_model_cannot_set_is_one_line(tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    def refuse(model, attn):
        raise ValueError(f"{attn} is not available here\nand more lines")

    monkeypatch.setattr(PreTrainedModel, "set_attn_implementation", refuse)
    with pytest.raises(UserError, match="^attn_implementation=sdpa: sdpa is not available here$") as e:
        _training_model(tmp_path, "attn_implementation=sdpa")
    assert e.value.rule == "launch.attention_kernel"
    monkeypatch.delattr(PreTrainedModel, "set_attn_implementation")  # a transformers before it
    with pytest.raises(UserError, match="attn_implementation needs a newer transformers") as e:
        _training_model(tmp_path, "attn_implementation=sdpa")
    assert e.value.rule == "launch.attention_needs_newer_transformers"


def test_plan_only_without_model_parallel_is_one_line(small_text_data, tmp_path, capsys):
    from finetune.run import main

    user_error(capsys, main, [*tiny_text_args(small_text_data, tmp_path / "o"), "--plan-only"],
               "--plan-only needs model_parallel=true", rule="launch.plan_only_needs_model_parallel")  # fmt: skip


def test_a_layer_split_over_one_device_is_a_warning(tmp_path):
    from finetune import run, runtime
    from finetune.config import load_config

    data = {"train": tmp_path / "t.csv", "validation": tmp_path / "v.csv"}
    cfg = load_config(None, tiny_text_args(data, tmp_path / "o", "model_parallel=true", "devices=cpu"))
    accelerator = runtime.make_accelerator(cfg)
    model, _ = run.build_for_training(cfg, accelerator, ["neg", "pos"], checks.Said())
    said = checks.Said()
    assert run.split_model(cfg, accelerator, model, said) is model
    assert said.rules() == ["launch.model_parallel_one_device"]


def test_a_resume_before_later_checkpoints_is_a_warning(tmp_path):
    from finetune import run
    from finetune.layout import RunDir

    out = RunDir(tmp_path / "run")
    for step in (5, 10):
        (out.checkpoints / f"step-{step:08d}").mkdir(parents=True)
    said = checks.Said()
    run.warn_of_later_checkpoints(out, out.checkpoints / "step-00000005", {"step": 5}, said)
    assert said.rules() == ["launch.later_checkpoints"] and "step-00000010" in said.lines[0][1]
    later = checks.Said()
    run.warn_of_later_checkpoints(out, out.checkpoints / "step-00000010", {"step": 10}, later)
    assert later.rules() == []
