"""What `import finetune.run` costs beyond the libraries every run needs, in fresh interpreters.

    python -m benchmarks.import_time --out benchmarks/results
    python -m benchmarks.import_time --warm --out benchmarks/results/import_time_warm   # bytecode cached

Three imports, each in a fresh interpreter, in turn `--reps` times (so a shared machine's load falls
on all three alike): `torch` alone; the floor, the libraries a text run cannot start without (torch,
accelerate, datasets, transformers' auto classes and `PreTrainedModel`, whose modeling stack building
any model loads); and `finetune.run`. Reported: the median of each, the app's seconds over the floor's, and
which of the optional libraries (`OPTIONAL`: the search's, the plots', the metrics' extras, LoRA's, the
ONNX export's) `import finetune.run` loads: none should be, since a plain run needs none of them. What
that defers is paid at a run's first evaluation: `FIRST_EVALUATION` times each metric library's import
in a fresh interpreter that has imported `finetune.run` already (scikit-learn's, which loads
scipy.stats, for a classifier; seqeval's, which loads scikit-learn, for a tagger).
`--warm`: every interpreter reads the bytecode one untimed import of each statement cached first (in a
temporary `PYTHONPYCACHEPREFIX`, with `PYTHONDONTWRITEBYTECODE` unset), as a second run on a user's machine
does; without it, the environment's own setting holds (where it forbids bytecode, every import compiles).
Writes `import_time.json` and `import_time.md` into --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.recipes import check_arguments
from benchmarks.report import machine, machine_line, write_report
from finetune.exits import ArgumentParser, exit_on_user_error

FLOOR = (
    "import torch, accelerate, datasets; "
    "from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel"
)
IMPORTS = {"torch": "import torch", "floor": FLOOR, "finetune.run": "import finetune.run"}
# Libraries a plain training run does not need at import: each is loaded where it is used.
OPTIONAL = (
    "optuna",
    "matplotlib",
    "sklearn",
    "peft",
    "onnx",
    "onnxruntime",
    "seqeval",
    "torchvision",
    "scipy.stats",
)


# The metric libraries a run imports at its first evaluation (finetune/metrics.py), by the problem that imports them.
FIRST_EVALUATION = {
    "classes (sklearn.metrics)": "from sklearn.metrics import accuracy_score, precision_recall_fscore_support",
    "entities (seqeval)": "from seqeval.metrics.v1 import precision_recall_fscore_support; from seqeval.scheme import IOB2",
}


ENV = dict(os.environ)  # the interpreters' environment (`--warm` sets it)


def after_the_app(statement: str) -> float:
    """Seconds `statement` takes in a fresh interpreter that has imported finetune.run (what a run's first
    evaluation adds)."""
    probe = ("import time, finetune.run; t = time.perf_counter(); " + statement +
             "; print(time.perf_counter() - t)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=ENV)
    return float(out.stdout.split()[-1])


def optional_loaded() -> list[str]:
    """The `OPTIONAL` libraries a fresh `import finetune.run` leaves in sys.modules."""
    return loaded_after(["finetune.run"], OPTIONAL)[0]


def loaded_after(modules: Sequence[str], libraries: Sequence[str]) -> list[list[str]]:
    """One fresh interpreter imports each of `modules` in turn: after each, which of `libraries` (a package,
    or any module of it) are in sys.modules."""
    probe = (f"import importlib, sys\nfor name in {list(modules)!r}:\n    importlib.import_module(name)\n"
             f"    print(' '.join(lib for lib in {list(libraries)!r} "
             "if lib in sys.modules or any(m.startswith(lib + '.') for m in sys.modules)))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=ENV)
    return [line.split() for line in out.stdout.splitlines()[-len(modules):]]


def by_package(statement: str = "import finetune.run") -> dict[str, float]:
    """Where a fresh interpreter's import time goes: `python -X importtime`'s self time of every module it
    loads, summed by top-level package (seconds, largest first)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], check=True, capture_output=True,
                         text=True, env=ENV)  # fmt: skip
    spent: dict[str, float] = {}
    for line in out.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[0].strip().isdigit():
            package = fields[2].strip().split(".")[0]
            spent[package] = spent.get(package, 0.0) + int(fields[0]) / 1e6
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def seconds(statement: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True, capture_output=True, env=ENV)
    return time.perf_counter() - t


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = ArgumentParser(prog="python -m benchmarks.import_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("runs/import_time"))
    p.add_argument("--warm", action="store_true", help="bytecode cached by one untimed import of each first")
    args = p.parse_args(argv)
    check_arguments(p, args, ["reps"])  # before any interpreter is timed: --reps 0, an --out that is a file
    with tempfile.TemporaryDirectory(prefix="finetune-pycache-") as cache:
        if args.warm:
            ENV.pop("PYTHONDONTWRITEBYTECODE", None)
            ENV["PYTHONPYCACHEPREFIX"] = cache
            for statement in [*IMPORTS.values(), *FIRST_EVALUATION.values()]:
                seconds(statement)
        return _measure(args, argv)


def _measure(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(args.reps):
        for name, statement in IMPORTS.items():
            runs[name].append(seconds(statement))
    median = {name: statistics.median(v) for name, v in runs.items()}
    first = {name: statistics.median(after_the_app(s) for _ in range(args.reps)) for name, s in FIRST_EVALUATION.items()}
    report = {
        "command": "python -m benchmarks.import_time " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(), "reps": args.reps, "seconds": runs, "median_s": median,
        "app_over_floor": median["finetune.run"] / median["floor"],
        "app_minus_floor_s": median["finetune.run"] - median["floor"],
        "optional_loaded": optional_loaded(), "first_evaluation_import_s": first, "by_package_s": by_package(),
        "PYTHONDONTWRITEBYTECODE": ENV.get("PYTHONDONTWRITEBYTECODE"), "warm": args.warm,
    }  # fmt: skip
    rows = "\n".join(f"| `{IMPORTS[n]}` | {median[n]:.2f} | {min(runs[n]):.2f} |" for n in IMPORTS)
    table = (
        f"# Import time\n\n{machine_line(report['machine'])}. `{report['command']}`, {args.reps} rounds.\n\n"
        "| import (fresh interpreter) | median s | fastest s |\n|---|---|---|\n" + rows + "\n\n"
        f"`finetune.run` over the floor: **{report['app_over_floor']:.2f}×** "
        f"({report['app_minus_floor_s']:+.2f} s). Optional libraries it loads: "
        f"{', '.join(report['optional_loaded']) or 'none'} (of {', '.join(OPTIONAL)}). "
        + ("Bytecode: cached by one untimed import of each first (`--warm`).\n\n" if args.warm else
           f"PYTHONDONTWRITEBYTECODE: {report['PYTHONDONTWRITEBYTECODE'] or 'unset'} (set, every import compiles "
           "the app's sources anew).\n\n")
        + "Where `import finetune.run`'s time goes (`python -X importtime`, each module's own time summed by "
        "top-level package, one interpreter): "
        + ", ".join(f"{name} {t:.2f}" for name, t in list(report["by_package_s"].items())[:8]) + " s.\n\n"
        "Paid at a run's first evaluation instead (median seconds of the import, after `import finetune.run`): "
        + "; ".join(f"{name} {t:.2f}" for name, t in first.items()) + ".\n"
    )
    write_report(args.out, "import_time", report, table)
    return report


if __name__ == "__main__":
    main()
