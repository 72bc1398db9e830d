"""finetune/runtime.py: the processes of a run. CPU threads per process, OpenMP's wait policy, and a
process that fails, dies or hangs ending the whole DDP job (how processes agree on a failure).

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_runtime.py
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import (
    REPO,
    launch,
    launch_command,
    logged_steps,
    tiny_text_args,
)


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
    accelerator = runtime.make_accelerator(load_config(DEFAULT_RECIPE, [f"output_dir={tmp_path}"]))
    assert accelerator.device.type == "cpu"
    said = [line for line in capsys.readouterr().out.splitlines() if "torch sees none" in line]
    assert len(said) == int(warned)
    if warned:
        assert said[0].startswith("warning: the accelerate config is for a GPU") and "cpu.yaml" in said[0]
