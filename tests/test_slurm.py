"""scripts/slurm_multinode.sbatch without SLURM: its logic, run by bash against stand-ins for srun,
scontrol, scancel, accelerate and nvidia-smi that record what they were given (no training; ~20 s,
most of it the requeue check's Python start-up).

What SLURM itself does is not simulated beyond this: the stand-in srun runs its command once per
node on this machine, all at once; scancel --signal=TERM sends SIGTERM to every stand-in launcher, as
slurmstepd signals every process of the job's steps; the test plays SLURM's part of
`--signal=B:USR1@300` by sending SIGUSR1 to the batch shell alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "slurm_multinode.sbatch"
JOB_ID = 123456
PORT = 10000 + JOB_ID % 50000  # 33456

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

FAKES = {
    "srun": r"""#!/bin/bash
# srun stand-in: record the arguments; run the command once per node, all at once; the highest status.
printf '%s\0' "$@" > "$FAKE_OUT/srun.args"
while [[ "$1" == -* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do wait "$pid" || { s=$?; (( s > status )) && status=$s; }; done
exit $status
""",
    "accelerate": r"""#!/bin/bash
# accelerate stand-in: record the arguments and the environment; "train" for FAKE_TRAIN_S seconds;
# on SIGTERM "save a checkpoint" and exit 143, as finetune/run.py does.
printf '%s\0' "$@" > "$FAKE_OUT/launch-$SLURM_NODEID"
env > "$FAKE_OUT/env-$SLURM_NODEID"
trap 'kill $sleeper 2>/dev/null; echo saved > "$FAKE_OUT/term-$SLURM_NODEID"; exit 143' TERM
sleep "${FAKE_TRAIN_S:-0}" & sleeper=$!
echo $$ > "$FAKE_OUT/pid-$SLURM_NODEID.tmp" && mv "$FAKE_OUT/pid-$SLURM_NODEID.tmp" "$FAKE_OUT/pid-$SLURM_NODEID"
wait $sleeper
""",
    "scancel": r"""#!/bin/bash
# scancel stand-in: record the arguments; --signal=TERM reaches every launcher of the job's steps.
printf '%s\0' "$@" > "$FAKE_OUT/scancel.args"
if [[ "$1" == --signal=TERM ]]; then
    for f in "$FAKE_OUT"/pid-?; do kill -TERM "$(cat "$f")"; done
fi
""",
    "scontrol": r"""#!/bin/bash
# scontrol stand-in: the allocation's hosts; a requeue is recorded with how many launchers still run.
case "$1" in
    show) printf 'gpu-node-a\ngpu-node-b\n' ;;
    requeue)
        printf '%s\0' "$@" > "$FAKE_OUT/requeue.args"
        alive=0
        for f in "$FAKE_OUT"/pid-?; do kill -0 "$(cat "$f")" 2>/dev/null && alive=$((alive + 1)); done
        echo "$alive" > "$FAKE_OUT/alive-at-requeue" ;;
    *) exit 1 ;;
esac
""",
    "nvidia-smi": r"""#!/bin/bash
for i in 0 1 2 3; do echo "GPU $i: Fake GPU (UUID: GPU-$i)"; done
""",
}

# User arguments as a shell passes them to sbatch: values with spaces and braces stay single arguments.
OUTPUT_DIR_NAME = "my run"


def user_args(out: Path) -> list[str]:
    return [
        "--config", "finetune/configs/bert_rotten_tomatoes.yaml",
        f"output_dir={out}",
        "model_config={model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4}",
        "learning_rate=3e-5",
    ]  # fmt: skip


def fake_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for tool, text in FAKES.items():
            (bin_dir / tool).write_text(text)
            (bin_dir / tool).chmod(0o755)
        # The requeue check runs `python3`: this interpreter, through a script (a symlink to a venv's
        # interpreter starts the base interpreter, outside the venv, where the app is not installed).
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / "python3").chmod(0o755)
    knobs = (
        "ACCELERATE_CONFIG",
        "GPUS_PER_NODE",
        "MASTER_PORT",
        "MIXED_PRECISION",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    )
    env = {k: v for k, v in os.environ.items() if k not in knobs and not k.startswith("SLURM_")}
    return {
        **env,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "FAKE_OUT": str(tmp_path),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu-node-[a-b]",
        "SLURM_JOB_ID": str(JOB_ID),
        "SLURM_CPUS_PER_TASK": "32",
        **extra,
    }


def run_script(tmp_path: Path, args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SBATCH), *args], cwd=REPO, env=fake_env(tmp_path, **extra),
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def recorded(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def launcher_args(tmp_path: Path, node: int) -> tuple[dict[str, str], list[str]]:
    """The `accelerate launch` flags of one node (as a dict) and the arguments after finetune/run.py."""
    argv = recorded(tmp_path / f"launch-{node}")
    assert argv[0] == "launch"
    script_at = argv.index("finetune/run.py")
    flags = argv[1:script_at]
    return dict(zip(flags[::2], flags[1::2], strict=True)), argv[script_at + 1 :]


def test_script_parses():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


def test_srun_gets_cpus_per_task_the_port_comes_from_the_job_id_and_arguments_pass_untouched(tmp_path):
    args = user_args(tmp_path / OUTPUT_DIR_NAME)
    proc = run_script(tmp_path, args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    srun = recorded(tmp_path / "srun.args")
    assert srun[:4] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=32", "--kill-on-bad-exit=1"], (
        srun
    )
    for node in (0, 1):
        flags, run_args = launcher_args(tmp_path, node)
        assert flags["--main_process_port"] == str(PORT)
        assert flags["--machine_rank"] == str(node) and flags["--main_process_ip"] == "gpu-node-a"
        assert (flags["--num_machines"], flags["--num_processes"]) == ("2", "8")  # 4 GPUs from nvidia-smi
        assert run_args == args  # spaces, braces and the order kept; nothing added on a first start
        env = dict(
            line.split("=", 1) for line in (tmp_path / f"env-{node}").read_text().splitlines() if "=" in line
        )
        assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "240"
    assert not (tmp_path / "scancel.args").exists() and not (tmp_path / "requeue.args").exists()


def test_master_port_and_a_missing_cpus_per_task_are_the_users(tmp_path):
    env_without_cpus = fake_env(tmp_path, MASTER_PORT="29999")
    del env_without_cpus["SLURM_CPUS_PER_TASK"]
    proc = subprocess.run(["bash", str(SBATCH), "learning_rate=1e-4"], cwd=REPO, env=env_without_cpus,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(a.startswith("--cpus-per-task") for a in recorded(tmp_path / "srun.args"))
    assert launcher_args(tmp_path, 0)[0]["--main_process_port"] == "29999"


def test_time_limit_signal_checkpoints_every_node_then_requeues(tmp_path):
    """SIGUSR1 to the batch shell: SIGTERM to the steps (scancel), wait for every launcher to exit 143
    (the checkpoint), then `scontrol requeue`; the script exits with srun's status."""
    args = user_args(tmp_path / OUTPUT_DIR_NAME)
    log = tmp_path / "batch.log"  # a file, not a pipe: a launcher left running must not hold the test up
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", str(SBATCH), *args], cwd=REPO, env=fake_env(tmp_path, FAKE_TRAIN_S="60"),
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"pid-{n}").exists() for n in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the launchers did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # SLURM's --signal=B:USR1@300: the batch shell only
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid_file in tmp_path.glob("pid-?"):  # launchers still "training" after a failure
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
    output = log.read_text()
    assert proc.returncode == 143, output
    assert recorded(tmp_path / "scancel.args") == ["--signal=TERM", str(JOB_ID)]
    assert all((tmp_path / f"term-{n}").read_text().strip() == "saved" for n in (0, 1))
    assert recorded(tmp_path / "requeue.args") == ["requeue", str(JOB_ID)]
    assert (tmp_path / "alive-at-requeue").read_text().strip() == "0"  # requeued after the checkpoints
    assert "requeueing job" in output, output


def _checkpoint(out: Path) -> None:
    """What finetune.checkpoint counts as a complete checkpoint."""
    step = out / "checkpoints" / "step-00000010"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"step": 10, "epoch": 0, "samples_in_epoch": 320}))
    (step / "COMPLETE").write_text("10")


@pytest.mark.parametrize(
    "restart_count, checkpoint, own_resume, resumes",
    [
        ("1", True, False, True),  # requeued with a checkpoint: continue it
        ("1", False, False, False),  # requeued before the first checkpoint: latest would be refused
        (None, True, False, False),  # a first start never resumes on its own (the app refuses a started run)
        ("2", True, True, False),  # the arguments name their own resume_from_checkpoint
    ],
    ids=["requeued", "requeued-no-checkpoint", "first-start", "own-resume"],
)
def test_a_requeued_job_resumes_from_its_latest_checkpoint(
    tmp_path, restart_count, checkpoint, own_resume, resumes
):
    out = tmp_path / OUTPUT_DIR_NAME
    if checkpoint:
        _checkpoint(out)
    args = user_args(out) + (
        [f"resume_from_checkpoint={out / 'checkpoints' / 'step-00000010'}"] if own_resume else []
    )
    extra = {"SLURM_RESTART_COUNT": restart_count} if restart_count else {}
    proc = run_script(tmp_path, args, **extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in (0, 1):
        assert launcher_args(tmp_path, node)[1] == args + (
            ["resume_from_checkpoint=latest"] if resumes else []
        )
