"""What the launcher itself costs: `accelerate launch` against `accelerate-launch`, the same launcher.

    python -m benchmarks.launcher --out benchmarks/results        # about a minute on 2 cores
    python -m benchmarks.launcher --reps 1 --out /tmp/launcher     # the test's run

Times, alternately and `--reps` times each, three commands that start `finetune/run.py --help` (answered
before torch is imported, so what is timed is the interpreter and the launcher):

- `accelerate launch --config_file <file> finetune/run.py --help`: the `accelerate` command imports every
  subcommand before it parses one, and its `estimate-memory` imports transformers' auto classes (and timm,
  where it is installed).
- `accelerate-launch --config_file <file> finetune/run.py --help`: the console script accelerate installs
  for the launcher alone (`accelerate.commands.launch:main`, the module the test suite launches with).
- `python finetune/run.py --help`: no launcher, the floor.

Writes `launcher.json` and `launcher.md` into --out: the median seconds of each and the saving.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    """The console script beside this interpreter (a virtual environment's), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name) or name


def commands(config_file: str) -> dict[str, list[str]]:
    script = ["finetune/run.py", "--help"]
    return {
        "accelerate launch": [_tool("accelerate"), "launch", "--config_file", config_file, *script],
        "accelerate-launch": [_tool("accelerate-launch"), "--config_file", config_file, *script],
        "python (no launcher)": [sys.executable, *script],
    }


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if done.returncode != 0 or "usage:" not in done.stdout:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return seconds


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--config-file", default="accelerate_configs/cpu.yaml")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = commands(args.config_file)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, cmd in runs.items():
            seconds[name].append(timed(cmd))
    median = {name: statistics.median(s) for name, s in seconds.items()}
    m = machine()
    report = {"machine": m, "argv": sys.argv[1:] if argv is None else argv, "seconds": seconds, "median": median}
    lines = [
        machine_line(m) + ".",
        f"Command: `python -m benchmarks.launcher {' '.join(report['argv'])}`",
        "",
        f"Each command starts `finetune/run.py --help`, {args.reps} time(s), alternately; median seconds.",
        "",
        "| command | median (s) | each (s) |",
        "|---|---:|---|",
        *(f"| `{n}` | {median[n]:.2f} | {', '.join(f'{s:.2f}' for s in seconds[n])} |"
          for n in runs),  # fmt: skip
        "",
        f"`accelerate-launch` saves {median['accelerate launch'] - median['accelerate-launch']:.2f} s a command "
        f"against `accelerate launch`; the launcher itself costs "
        f"{median['accelerate-launch'] - median['python (no launcher)']:.2f} s over plain python.",
        "",
    ]
    write_report(args.out, "launcher", report, "\n".join(lines))
    return report


if __name__ == "__main__":
    main()
