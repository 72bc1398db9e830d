"""Shared fixtures: offline, tiny models from config, and runners for the real entry points."""

from __future__ import annotations

import csv
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # an accidental download fails loudly
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# datasets reads its cache location once, at import: a private one per test session.
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="finetune-tests-datasets-")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
TOKENIZER = DATA / "bert_minilm_l6_uncased"
ROTTEN = DATA / "rotten_tomatoes"

# A tiny BERT with no dropout, so that different batchings give the same math.
TINY_BERT = (
    "{model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
    "intermediate_size: 37, max_position_embeddings: 128, hidden_dropout_prob: 0.0, "
    "attention_probs_dropout_prob: 0.0}"
)
TINY_VIT = (
    "{model_type: vit, image_size: 28, patch_size: 7, num_channels: 3, hidden_size: 32, "
    "num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 37, hidden_dropout_prob: 0.0, "
    "attention_probs_dropout_prob: 0.0}"
)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each in-process run builds its own Accelerator from a clean slate."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def write_csv(path: Path, rows: list[dict], fieldnames: list[str] | None = None) -> Path:
    fieldnames = fieldnames or list(rows[0])
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    return path


def rotten_rows(n: int, start: int = 0) -> list[dict]:
    with (ROTTEN / "train.csv").open() as f:
        rows = list(csv.DictReader(f))
    return rows[start : start + n]


@pytest.fixture
def small_text_data(tmp_path) -> dict[str, Path]:
    """37 training rows (not a multiple of any global batch used in tests) and 13 validation rows."""
    return {
        "train": write_csv(tmp_path / "train.csv", rotten_rows(37)),
        "validation": write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100)),
    }


def tiny_text_args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "task=text-classification",
        f"model_config={TINY_BERT}",
        f"tokenizer_name={TOKENIZER}",
        f"train_file={data['train']}",
        f"validation_file={data['validation']}",
        "test_file=null",
        "max_train_samples=null",
        "max_eval_samples=null",
        "max_length=32",
        "label_names=null",
        "warmup_ratio=0.2",
        "learning_rate=1e-3",
        "logging_steps=1",
        # The default recipe freezes the embeddings and turns dropout off; tests choose for themselves.
        "freeze_embeddings=false",
        "dropout=null",
        f"output_dir={out}",
        *extra,
    ]


def user_error(capsys, main, argv: list[str]) -> str:
    """Run an entry point's `main(argv)` in-process; assert a user error (exit status 2, exactly one
    `error:` line, no traceback) and return that line."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]  # beside progress bars
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(num_processes: int = 1, launcher: str = "accelerate.commands.launch") -> list[str]:
    """`accelerate launch` (or `finetune.launch`) with every flag given, so it warns about no default."""
    cmd = [sys.executable, "-m", launcher, "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if num_processes > 1:
        return cmd + ["--multi_gpu", "--num_processes", str(num_processes), "--main_process_port", str(free_port())]
    return cmd + ["--num_processes", "1"]


def launch(args: list[str], num_processes: int = 1, script: str = "finetune/run.py", timeout: int = 300,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """Run an entry point with `accelerate launch`, as a user does; several processes form CPU DDP."""
    cmd = launch_command(num_processes)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd + [str(REPO / script), *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def launch_runs(
    config_file: Path,
    runs: list[dict],
    root: Path,
    env: dict | None = None,
    num_processes: int = 2,
    timeout: int = 400,
) -> tuple[dict, str]:
    """Several runs of finetune.run.main in one `accelerate launch --config_file <file>` of
    tests/multi_run_worker.py (see there why); returns {(run name, rank): record} and the output."""
    records_dir = root / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    plan = root / "plan.json"
    plan.write_text(json.dumps({"record_dir": str(records_dir), "runs": runs}))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
           "--num_processes", str(num_processes), "--main_process_port", str(free_port()),
           str(REPO / "tests" / "multi_run_worker.py"), str(plan)]  # fmt: skip
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}),
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = {
        (r["name"], rank): json.loads((records_dir / f"{r['name']}-{rank}.json").read_text())
        for r in runs
        for rank in range(num_processes)
    }
    return records, proc.stdout + proc.stderr


def logged_steps(out: Path) -> int:
    """Optimizer steps a run has logged a loss for so far."""
    path = out / "metrics.jsonl"
    return len([line for line in path.read_text().splitlines() if '"loss"' in line]) if path.exists() else 0


def wait_until(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Poll `condition` while `proc` runs; fail if it ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended before the fault was injected"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.005)


# Regression and multi-label data a tiny BERT can learn from in a few steps (finetune/problems.py).
def regression_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts of 4-10 words; the score is (#good - #bad) + 0.5: decimals, so it reads as a regression."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(["good", "bad", "movie", "film", "plot", "the"]) for _ in range(rng.randint(4, 10))]
        rows.append({"text": " ".join(words), "score": words.count("good") - words.count("bad") + 0.5})
    return rows


ANIMALS = ["cat", "dog", "bird"]


def multi_label_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts naming 1-3 animals among filler words; the labels are the animals named."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        present = [a for a in ANIMALS if rng.random() < 0.5] or [rng.choice(ANIMALS)]
        words = present + [rng.choice(["the", "a", "park", "house", "saw"]) for _ in range(rng.randint(2, 6))]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "labels": present})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
