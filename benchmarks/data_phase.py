"""The data phase of the default run against an earlier commit's, in one sitting on one machine: the `data`
seconds the run prints (every split read, checked, tokenized) and how many times each data file is opened,
the two trees taking turns.

    python -m benchmarks.data_phase --before ef07684 --runs 3 --out benchmarks/results

Each run is the README's main job, `finetune/run.py` with the default recipe, stopped after one optimizer
step (`max_steps=1`: the data phase is the same) in a fresh output folder with a fresh datasets cache (each
file parsed as on its first run). The opens are Python's `open` audit events under the data folder, counted
by a `sitecustomize` put ahead on the path; they include datasets' own reads. The ratio is the median
data seconds of this tree over the earlier one's; a time in seconds does not carry to another machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parents[1]
DATA = "data/rotten_tomatoes"
HOOK = """import os, sys
_log = os.environ.get("DATA_PHASE_OPENS")
def _hook(event, args):
    if event == "open" and _log and isinstance(args[0], str) and "rotten_tomatoes" in args[0]:
        with open(_log, "a") as f:
            f.write(os.path.basename(args[0]) + "\\n")
if _log:
    sys.addaudithook(_hook)
"""


def tree_of(commit: str, where: Path) -> Path:
    """The files of `commit`, data included, in `where` (git archive: no worktree to clean up)."""
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(where)], input=archive, check=True)
    return where


def one_run(tree: Path, scratch: Path, hook: Path, n: int) -> dict:
    """The default run in `tree`: its data seconds and the opens of each data file."""
    opens = scratch / f"opens-{n}.txt"
    env = {**os.environ, "PYTHONPATH": f"{hook}:{tree}", "HF_HUB_OFFLINE": "1", "DATA_PHASE_OPENS": str(opens),
           "HF_DATASETS_CACHE": str(scratch / f"cache-{n}")}  # fmt: skip
    args = [sys.executable, "finetune/run.py", f"output_dir={scratch / f'out-{n}'}", "max_steps=1"]
    done = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    seconds = re.search(r"^seconds: .*\bdata ([\d.]+)", done.stdout, re.M)
    if done.returncode or seconds is None:
        raise SystemExit(f"the run in {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    counted = Counter(opens.read_text().split()) if opens.exists() else Counter()
    return {"data_s": float(seconds.group(1)), "opens": dict(sorted(counted.items()))}


def _seconds(runs: list[dict]) -> str:
    return ", ".join(f"{r['data_s']:.2f}" for r in runs)


def _opens(run: dict) -> str:
    return ", ".join(f"{name} {n}" for name, n in run["opens"].items())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the earlier commit")
    p.add_argument("--runs", type=int, default=3, help="runs of each tree, taking turns")
    p.add_argument("--out", type=Path, default=None, help="write data_phase.json and .md here")
    args = p.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        hook = scratch / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        trees = {args.before: tree_of(args.before, scratch / "before"), head: tree_of("HEAD", scratch / "after")}
        found: dict[str, list[dict]] = {name: [] for name in trees}
        for i in range(args.runs):
            for j, (name, tree) in enumerate(trees.items()):
                found[name].append(one_run(tree, scratch, hook, 2 * i + j))
    median = {name: statistics.median(r["data_s"] for r in runs) for name, runs in found.items()}
    m = machine()
    report = {"machine": m, "before": args.before, "after": head, "runs": found, "median_data_s": median,
              "ratio_after_over_before": round(median[head] / median[args.before], 3)}  # fmt: skip
    table = "\n".join([
        f"# The data phase of the default run: {head} against {args.before}", "", machine_line(m), "",
        "| tree | data seconds (median of runs) | every run | opens of each data file (one run) |",
        "|---|---|---|---|",
        *(f"| {name} | {median[name]:.2f} | {_seconds(runs)} | {_opens(runs[-1])} |" for name, runs in found.items()),
        "", f"ratio of the medians, {head} over {args.before}: {report['ratio_after_over_before']}",
        "", "`python -m benchmarks.data_phase " + " ".join(argv if argv is not None else sys.argv[1:]) + "`", "",
    ])  # fmt: skip
    if args.out is not None:
        write_report(args.out, "data_phase", report, table)
    else:
        print(table)
    return report


if __name__ == "__main__":
    main()
