"""kill -9 a training run at random moments, resume each from its latest checkpoint, count exact endings.

    python scripts/kill_resume.py                       # 20 kills, a tiny BERT, ~6 min on 2 CPU cores
    python scripts/kill_resume.py --trials 5 --seed 1 --save-steps 1

One uninterrupted run is the reference. Each trial starts the same run afresh, waits until a random
optimizer step has been logged, sleeps a random fraction of the time a step takes (measured on the
reference, saves included), sends SIGKILL — wherever the process is: a forward pass, an optimizer
step, halfway through writing a checkpoint — and then runs `resume_from_checkpoint=latest` (or
starts over, when no checkpoint was complete yet) to the end. It prints one line per trial and a summary:

    kill_resume: 20 kills (N during a checkpoint write, M before the first checkpoint): K/20 ended
    bit-exact, worst |difference| D

A checkpoint write is recognised by the hidden `.tmp-step-*` directory it leaves behind. CPU, fp32,
one process, dropout on (so the RNG state must come back too). Offline, like the tests.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BERT = (
    "{model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 37, "
    "max_position_embeddings: 128, hidden_dropout_prob: 0.1, attention_probs_dropout_prob: 0.0}"
)


def _data(root: Path) -> dict[str, Path]:
    with (REPO / "data/rotten_tomatoes/train.csv").open() as f:
        rows = list(csv.DictReader(f))
    files = {}
    for split, part in (("train", rows[:37]), ("validation", rows[100:113])):
        files[split] = root / f"{split}.csv"
        with files[split].open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "label"])
            writer.writeheader()
            writer.writerows(part)
    return files


def _args(files: dict[str, Path], out: Path, steps: int, save_steps: int) -> list[str]:
    return [
        f"model_config={BERT}",
        f"tokenizer_name={REPO / 'data/bert_minilm_l6_uncased'}",
        f"train_file={files['train']}",
        f"validation_file={files['validation']}",
        "test_file=null",
        "max_train_samples=null",
        "max_eval_samples=null",
        "max_length=32",
        "label_names=null",
        "learning_rate=1e-3",
        "warmup_ratio=0.2",
        "logging_steps=1",
        "dropout=null",  # the model's own (on), not the default recipe's 0
        "freeze_embeddings=false",
        "per_device_train_batch_size=4",
        f"max_steps={steps}",
        f"save_steps={save_steps}",
        "save_total_limit=2",
        f"output_dir={out}",
    ]


def _run(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "finetune/run.py"), *args],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def _logged_steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum('"loss"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def _weights(out: Path):
    from safetensors.torch import load_file

    return load_file(out / "model" / "model.safetensors")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of the run")
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="kept afterwards when given")
    opts = parser.parse_args()

    root = opts.workdir or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_CACHE": str(root / "datasets-cache"),
    }
    files = _data(root)
    rng = random.Random(opts.seed)

    reference = root / "reference"
    shutil.rmtree(reference, ignore_errors=True)
    proc = _run(_args(files, reference, opts.steps, opts.save_steps), root / "reference.log", env)
    seen = {}  # logged step -> when it was seen
    while proc.poll() is None:
        seen.setdefault(_logged_steps(reference), time.monotonic())
        time.sleep(0.002)
    if proc.returncode != 0 or _logged_steps(reference) != opts.steps:
        print(f"the reference run failed; see {root / 'reference.log'}")
        return 1
    seen.pop(0, None)
    step_s = (max(seen.values()) - min(seen.values())) / max(len(seen) - 1, 1)  # saves included
    expected = _weights(reference)
    print(f"reference: {opts.steps} steps of {step_s:.2f} s; killing {opts.trials} runs at random moments")

    exact, during_save, before_first, worst = 0, 0, 0, 0.0
    for trial in range(opts.trials):
        out = root / f"trial-{trial:02d}"
        shutil.rmtree(out, ignore_errors=True)
        args = _args(files, out, opts.steps, opts.save_steps)
        proc = _run(args, out.with_suffix(".log"), env)
        # A random step, then a random moment inside the next one (its forward, backward, update, save).
        target, delay = rng.randrange(opts.steps), rng.uniform(0, step_s)
        while _logged_steps(out) < target and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        saving = any((out / "checkpoints").glob(".tmp-step-*"))
        complete = sorted(p.name for p in (out / "checkpoints").glob("step-*") if (p / "COMPLETE").exists())
        during_save += saving
        before_first += not complete
        again = [*args, "resume_from_checkpoint=latest"] if complete else [*args, "overwrite_output_dir=true"]
        resumed = _run(again, out.with_suffix(".resume.log"), env)
        if resumed.wait() != 0:
            print(f"trial {trial}: the resumed run failed; see {out.with_suffix('.resume.log')}")
            worst = float("inf")
            continue
        got = _weights(out)
        diff = max((expected[k] - got[k]).abs().max().item() for k in expected)
        worst = max(worst, diff)
        exact += diff == 0.0
        where = (
            "during a checkpoint write" if saving else f"after {complete[-1]}" if complete else "before any"
        )
        print(
            f"trial {trial:2d}: killed {delay:4.2f} s after step {target} was logged, {where}: "
            f"max |difference| {diff:.3g}"
        )

    print(
        f"kill_resume: {opts.trials} kills ({during_save} during a checkpoint write, {before_first} before the "
        f"first checkpoint): {exact}/{opts.trials} ended bit-exact, worst |difference| {worst:.3g}"
    )
    if opts.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if exact == opts.trials else 1


if __name__ == "__main__":
    sys.exit(main())
