"""Two machines on one host: a multi-node run refuses an output_dir the machines do not share.

Each "machine" is its own `finetune-launch --num_machines 2 --machine_rank r` (static rendezvous on
127.0.0.1, gloo, one process each), as on two real nodes. A folder local to each machine is
simulated without a hook in the app: the two launchers run in different working directories and
output_dir is relative, which each process resolves against its own working directory, so the two
processes' output_dir are two different folders, as a node-local /local/scratch/run is on two nodes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_port, tiny_text_args

from finetune import checkpoint as ckpt
from finetune.layout import SHARED_PROBE_PREFIX


def _two_machines(
    tmp_path: Path, output_dir: str, *extra: str, data: dict
) -> list[subprocess.CompletedProcess]:
    """Start machine 0 and machine 1 at once, each from its own folder, and wait for both."""
    port, procs = free_port(), []
    for rank in (0, 1):
        cwd = tmp_path / f"machine{rank}"
        cwd.mkdir()
        cmd = [
            sys.executable, "-m", "finetune.launch", "--multi_gpu", "--num_machines", "2",
            "--machine_rank", str(rank), "--num_processes", "2", "--main_process_ip", "127.0.0.1",
            "--main_process_port", str(port), "--rdzv_backend", "static", "--mixed_precision", "no",
            "--dynamo_backend", "no", str(REPO / "finetune" / "run.py"),
            *tiny_text_args(data, Path(output_dir), "cpu_threads=1", *extra),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "ACCELERATE_USE_CPU": "true"}
        log = (tmp_path / f"machine{rank}.out").open("w"), (tmp_path / f"machine{rank}.err").open("w")
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log[0], stderr=log[1]))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [
        subprocess.CompletedProcess(p.args, code, (tmp_path / f"machine{r}.out").read_text(),
                                    (tmp_path / f"machine{r}.err").read_text())
        for r, (p, code) in enumerate(zip(procs, codes, strict=True))
    ]  # fmt: skip


@pytest.mark.slow
def test_output_dir_local_to_each_machine_is_one_error_line(small_text_data, tmp_path):
    """Relative output_dir, different working directories: process 1 cannot see what process 0 wrote.
    Both machines exit 2, machine 0 prints one line naming process 1, and nothing is left anywhere."""
    machine0, machine1 = _two_machines(tmp_path, "run", data=small_text_data)
    assert (machine0.returncode, machine1.returncode) == (2, 2), (
        machine0.stderr[-3000:] + machine1.stderr[-3000:]
    )
    for result in (machine0, machine1):
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in machine0.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, machine0.stderr[-3000:]
    # Machine 0's output_dir, as its process resolved it; the one process that cannot see it, by name.
    main_view = tmp_path / "machine0" / "run"
    assert f"output_dir {main_view} is not shared by all machines: process 1 on machine 1 (" in errors[0], (
        errors[0]
    )
    assert "RNG state" in errors[0] and "filesystem that every machine mounts" in errors[0], errors[0]
    assert not [line for line in machine1.stderr.splitlines() if line.startswith("error:")]
    for rank in (0, 1):  # no output_dir, no probe: the working directories are as the launchers found them
        assert list((tmp_path / f"machine{rank}").iterdir()) == [], rank


@pytest.mark.slow  # ~40 s on the 2-core machine: two launchers that train, checkpoint and export
def test_shared_output_dir_trains_and_every_rank_writes_its_state(small_text_data, tmp_path):
    """The same two machines with an absolute output_dir (one folder for both) train, checkpoint and
    export; the checkpoint holds both processes' RNG states; no probe is left behind."""
    out = tmp_path / "shared" / "run"  # its parent does not exist yet either: the probe goes to tmp_path
    machine0, machine1 = _two_machines(
        tmp_path, str(out), "max_steps=2", "save_steps=2", data=small_text_data
    )
    assert (machine0.returncode, machine1.returncode) == (0, 0), (
        machine0.stderr[-3000:] + machine1.stderr[-3000:]
    )
    assert "DistributedType.MULTI_CPU" in machine0.stdout and "2 process(es)" in machine0.stdout, (
        machine0.stdout
    )
    assert (out / "results.json").is_file() and (out / "model").is_dir()
    (checkpoint,) = ckpt.list_checkpoints(out)
    assert sorted(p.name for p in checkpoint.glob("random_states_*.pkl")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
    assert not [p for p in tmp_path.rglob(f"{SHARED_PROBE_PREFIX}*")]
