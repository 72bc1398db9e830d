"""Expected results: what the bundled pretrained MiniLM-L6 (and a ViT from scratch) reaches on a small
public task of each kind, each through the app's real command in a fresh process, as a user runs it.

    python -m benchmarks.expected_results --out benchmarks/results          # about 30 minutes on 2 AVX2 cores (fp32), quiet
    python -m benchmarks.expected_results --out /tmp/er --tasks regression multi_label
    python -m benchmarks.expected_results --smoke --out /tmp/er --tasks multi_label   # tiny models: the test's run

Writes `expected_results.json` and `expected_results.md` (one row a task: data, recipe and its key
settings, the command, the test metric, the trivial baseline, the wall time) into --out. Where each
number comes from:

- **the data**: the bundled sets in data/, and the tasks `python scripts/public_tasks.py` builds
  from public data (sentence pairs from rotten_tomatoes, an entity count and entity types from
  UNER English-EWT, patches of the photographs scikit-learn and matplotlib ship); its docstring
  says how and under which licence. They are built afresh into --data (default `runs/public_tasks`)
  before the runs, and each built folder's manifest (counts, a sha256 over its files) goes into the
  report.
- **the run**: `accelerate launch --config_file accelerate_configs/<file> finetune/run.py --config
  <recipe> key=value ...` in a subprocess from the repository root (as `accelerate launch -q`, with
  HF_HUB_OFFLINE=1), training into a temporary output_dir. Text tasks run under `cpu_bf16.yaml` where the CPU has native bf16 (else `cpu.yaml`)
  (native bf16, as the full-data recipe is tuned for), the ViTs under `cpu.yaml` (fp32, as their
  recipes were measured). `TASKS` lists each task's recipe and settings and how they were chosen:
  on the validation split, never the test split.
- **the metrics**: from the run's own `results.json`: the test split's metrics, the trivial baseline
  the app reports beside them (`test.baseline`, `validation.baseline`: the same prediction for every
  input, from the training labels alone) and the app's verdict `learned` (validation against its
  baseline, finetune/metrics.py's rule).
- **the time**: the wall time of the whole command (interpreter start to exit: imports, data,
  training, evaluations, export), and the run's own phase seconds. The machine's 1-minute load
  average is waited on before each task (below --max-load, at most --max-wait seconds) and recorded
  before and after it: wall times on a loaded machine are not comparable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.recipes import SMOKE
from benchmarks.report import machine, machine_line, write_report
from finetune.config import CONFIGS_DIR, REPO_DIR
from finetune.errors import UserError
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.runtime import native_bf16

BUILDER = REPO_DIR / "scripts" / "public_tasks.py"
SMOKE_STEPS = ["max_steps=4", "logging_steps=2"]
# --smoke for the EfficientNet photos recipe: a convolutional BatchNorm model of its kind in place of the image
# modality's ViT (2 blocks, 32x32: freeze_layers=1, the recipe's 8 being more blocks than it has).
TINY_EFFICIENTNET = (
    "{model_type: efficientnet, image_size: 32, num_channels: 3, width_coefficient: 0.25, depth_coefficient: 0.25, "
    "hidden_dim: 320, kernel_sizes: [3, 3], in_channels: [32, 16], out_channels: [16, 24], num_block_repeats: [1, 1], "
    "strides: [1, 2], expand_ratios: [1, 6], depthwise_padding: [], hidden_act: relu6, dropout_rate: 0.0, "
    "drop_connect_rate: 0.0}"
)


@dataclass(frozen=True)
class Task:
    """One row: a task of one kind, its data, its recipe and the settings the command adds."""

    name: str
    kind: str
    data: str  # what the data is, in a few words
    recipe: str  # file name under finetune/configs/
    accelerate_config: str  # file name under accelerate_configs/
    settings: tuple[str, ...] = ()  # key=value; {data} is the --data folder
    built: str | None = None  # the scripts/public_tasks.py task it needs
    metrics: tuple[str, ...] = ("accuracy",)  # the first is the headline
    modality: str = "text"  # which --smoke settings apply
    smoke: tuple[str, ...] = ()  # its own --smoke settings, in place of its modality's (a model of its recipe's kind)
    chosen: str = ""  # how the settings were chosen
    settings_shown: tuple[str, ...] = field(default=())  # config keys shown in the table


TEXT_SHOWN = ("num_train_epochs", "max_steps", "per_device_train_batch_size", "learning_rate", "max_length",
              "freeze_layers", "dropout")  # fmt: skip
IMAGE_SHOWN = ("num_train_epochs", "per_device_train_batch_size", "learning_rate", "random_flip", "augment")

TASKS = (
    Task(
        "single sentence", "single-label classification, one text",
        "data/rotten_tomatoes: 8,530 / 1,066 / 1,066 movie-review sentences, positive or negative",
        "bert_custom_files.yaml", "cpu_bf16.yaml",
        settings=("train_file=data/rotten_tomatoes/train.csv", "validation_file=data/rotten_tomatoes/validation.csv",
                  "test_file=data/rotten_tomatoes/test.csv", "max_length=64", "max_steps=180",
                  "per_device_train_batch_size=64", "learning_rate=2e-4", "freeze_embeddings=true", "freeze_layers=2",
                  "dropout=0.0", "warmup_ratio=0.1", "max_eval_samples=500", "eval_steps=null"),
        chosen="the recipe a user's own file starts from, with the settings of the full-data rotten_tomatoes "
               "recipe (bert_rotten_tomatoes_full.yaml, tuned for test accuracy per second)",
        settings_shown=TEXT_SHOWN,
    ),
    Task(
        "sentence pair", "single-label classification, two texts (text_pair_column)",
        "rt_pairs: pairs of rotten_tomatoes sentences, same or different polarity; 8,530 / 533 / 533 pairs",
        "bert_custom_files.yaml", "cpu_bf16.yaml",
        settings=("train_file={data}/rt_pairs/train.jsonl", "validation_file={data}/rt_pairs/validation.jsonl",
                  "test_file={data}/rt_pairs/test.jsonl", "text_pair_column=text_pair", "label_names=[different,same]",
                  "max_length=128", "num_train_epochs=2", "per_device_train_batch_size=64", "learning_rate=2e-4",
                  "freeze_embeddings=true", "freeze_layers=2", "dropout=0.0", "warmup_ratio=0.1", "eval_steps=null"),
        built="rt_pairs",
        chosen="the full-data rotten_tomatoes recipe's optimiser (batch 64, 2e-4, frozen embeddings and 2 "
               "layers, dropout off); epochs on validation accuracy",
        settings_shown=TEXT_SHOWN,
    ),
    Task(
        "regression", "regression (MSE), one number per text",
        "uner_entity_count: UNER English-EWT sentences -> their number of named entities (0-9); "
        "1,701 / 300 / 2,077 sentences",
        "bert_regression.yaml", "cpu_bf16.yaml",
        settings=("train_file={data}/uner_entity_count/train.jsonl",
                  "validation_file={data}/uner_entity_count/validation.jsonl",
                  "test_file={data}/uner_entity_count/test.jsonl", "label_column=entities", "num_train_epochs=5"),
        built="uner_entity_count", metrics=("mse", "pearson", "r2"),
        chosen="the recipe as shipped (lr 1e-4, batch 32); epochs on validation mse",
        settings_shown=TEXT_SHOWN,
    ),
    Task(
        "multi-label", "multi-label classification (BCE), a set of labels per text",
        "uner_entity_types: UNER English-EWT sentences -> the entity types in them (LOC, ORG, PER, or none); "
        "1,701 / 300 / 2,077 sentences",
        "bert_multi_label.yaml", "cpu_bf16.yaml",
        settings=("train_file={data}/uner_entity_types/train.jsonl",
                  "validation_file={data}/uner_entity_types/validation.jsonl",
                  "test_file={data}/uner_entity_types/test.jsonl", "label_column=labels", "num_train_epochs=5"),
        built="uner_entity_types", metrics=("micro_f1", "macro_f1", "subset_accuracy"),
        chosen="the recipe as shipped (lr 1e-4, batch 32, threshold tuned on validation); epochs on "
               "validation micro F1",
        settings_shown=TEXT_SHOWN,
    ),
    Task(
        "tagging", "token classification (named entities, IOB2)",
        "data/uner_english_ewt: 2,001 tagged sentences (90% train, 10% validation) / 2,077 test",
        "bert_ner.yaml", "cpu_bf16.yaml", metrics=("entity_f1", "word_accuracy"),
        chosen="the recipe as it is in the tree when measured (its settings are in the report)",
        settings_shown=TEXT_SHOWN,
    ),
    Task(
        "images: Fashion-MNIST", "image classification, a ViT from scratch",
        "data/fashion_mnist: 3,000 train (10% held out) / 1,000 test 28x28 product photos, 10 classes",
        "vit_fashion_mnist.yaml", "cpu.yaml", modality="image",
        chosen="the recipe as shipped", settings_shown=IMAGE_SHOWN,
    ),
    Task(
        "images: photos", "image classification, a ViT from scratch",
        "photos: 32x32 patches of 3 photographs that scikit-learn and matplotlib ship (a pagoda, a dahlia, "
        "Grace Hopper), a class each; test patches from regions no training patch touches; 1,200 / 300 / 300",
        "vit_photos.yaml", "cpu.yaml", settings=("data_dir={data}/photos",), built="photos", modality="image",
        smoke=(SMOKE["image"][0], "per_device_train_batch_size=8", "per_device_eval_batch_size=32"),  # as below
        chosen="augmentations and epochs on validation accuracy (finetune/configs/vit_photos.yaml says which)",
        settings_shown=IMAGE_SHOWN,
    ),
    Task(
        "images: pretrained photos", "image classification, the bundled pretrained EfficientNet-Lite0",
        "photos: the same patches of 3 photographs, a class each, as the row above; 1,200 / 300 / 300",
        "efficientnet_photos.yaml", "cpu.yaml", settings=("data_dir={data}/photos",), built="photos", modality="image",
        smoke=("model_name_or_path=null", f"model_config={TINY_EFFICIENTNET}", "freeze_layers=1",
               "per_device_train_batch_size=8", "per_device_eval_batch_size=32"),  # every sample: the first 64 are one class
        chosen="the recipe as shipped", settings_shown=IMAGE_SHOWN,
    ),
    Task(
        "images: pretrained Fashion-MNIST", "image classification, the bundled pretrained EfficientNet-Lite0",
        "data/fashion_mnist: the same 3,000 train (10% held out) / 1,000 test images as the ViT's row",
        "efficientnet_photos.yaml", "cpu.yaml", modality="image",
        settings=("data_dir=null", "dataset_name=null", "train_file=data/fashion_mnist/train.parquet",
                  "test_file=data/fashion_mnist/test.parquet", "image_column=image", "label_column=label",
                  "validation_split_percentage=10", "image_size=96", "random_flip=false"),
        smoke=("model_name_or_path=null", f"model_config={TINY_EFFICIENTNET}", "freeze_layers=1",
               "per_device_train_batch_size=8", "per_device_eval_batch_size=32"),
        chosen="the photos recipe at 96 pixels (the image-size lever: benchmarks/results/pretrained_images.md, "
               "image_levers.md), no flip, as the ViT's Fashion-MNIST recipe",
        settings_shown=(*IMAGE_SHOWN, "image_size"),
    ),
)  # fmt: skip
BY_NAME = {t.name.split(":")[-1].strip().replace(" ", "_").replace("-", "_").lower(): t for t in TASKS}


# --- the machine's load --------------------------------------------------------------------------------------


def wait_for_quiet(max_load: float, max_wait: float, poll: float = 15.0) -> dict[str, Any]:
    """Sleep until the 1-minute load average is below `max_load`, at most `max_wait` seconds."""
    start = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - start < max_wait:
        time.sleep(min(poll, max(0.0, max_wait - (time.monotonic() - start))))
    load = os.getloadavg()
    return {"waited_s": round(time.monotonic() - start, 1), "load_before": [round(x, 2) for x in load],
            "quiet": load[0] < max_load}  # fmt: skip


# --- one task -----------------------------------------------------------------------------------------------


def shown_path(path: Path) -> str:
    """A path as a user in the repository root would type it."""
    try:
        return str(path.resolve().relative_to(REPO_DIR))
    except ValueError:
        return str(path)


def accelerate_config_file(task: Task) -> Path:
    """The task's accelerate config; bf16 only where the CPU computes it natively (AMX, AVX512-BF16):
    emulated it is many times slower than fp32 (finetune.runtime.native_bf16), so cpu.yaml runs then.
    The row's command says which ran."""
    name = task.accelerate_config if task.accelerate_config != "cpu_bf16.yaml" or native_bf16() else "cpu.yaml"
    return REPO_DIR / "accelerate_configs" / name


def task_settings(task: Task, data: Path) -> list[str]:
    return [s.replace("{data}", shown_path(data)) for s in task.settings]


def run_task(task: Task, data: Path, out: Path, smoke: bool) -> dict[str, Any]:
    """The task's command in a fresh process; its results.json, resolved config and wall time."""
    settings = task_settings(task, data)
    extra = [*(task.smoke or SMOKE[task.modality]), *SMOKE_STEPS] if smoke else []
    recipe = CONFIGS_DIR / task.recipe
    config_file = accelerate_config_file(task)
    shown = ["accelerate", "launch", "--config_file", shown_path(config_file), "finetune/run.py", "--config",
             shown_path(recipe), *settings]  # fmt: skip
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file", str(config_file),
           str(REPO_DIR / "finetune" / "run.py"), "--config", str(recipe), *settings, *extra,
           f"output_dir={out}", "overwrite_output_dir=true", "report_to=[]"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_DIR, env=env)
    wall = time.perf_counter() - t
    row: dict[str, Any] = {
        "command": shlex.join(shown), "exit_status": proc.returncode, "wall_s": round(wall, 1),
        "recipe_sha256": hashlib.sha256(recipe.read_bytes()).hexdigest(),
    }  # fmt: skip
    if smoke:
        row["smoke_settings"] = extra
    if proc.returncode != 0:
        row["error"] = (proc.stderr or proc.stdout)[-3000:]
        return row
    results = json.loads((out / "results.json").read_text())
    config = yaml.safe_load((out / "config.yaml").read_text())
    row["settings"] = {k: config.get(k) for k in task.settings_shown if config.get(k) is not None}
    row["model"] = shown_path(Path(config["model_name_or_path"])) if config.get("model_name_or_path") and not config.get(
        "model_config") else {"from config": config.get("model_config")}  # fmt: skip
    row["optimizer_steps"] = results["step"]
    row["exported"] = results["exported"]
    row["run_seconds"] = results.get("seconds")
    for split in ("validation", "test"):
        scores = results.get(split) or {}
        row[split] = {k: scores.get(k) for k in (*task.metrics, "loss", "num_samples", "num_sentences", "num_words")
                      if scores.get(k) is not None}  # fmt: skip
        row[f"{split}_baseline"] = {k: (scores.get("baseline") or {}).get(k) for k in task.metrics}
    if "validation_tuned" in results:
        row["validation_tuned"] = {k: results["validation_tuned"].get(k) for k in task.metrics}
    row["learned"] = results["learned"]
    row["last_line"] = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("test ")), None)
    return row


# --- the report ---------------------------------------------------------------------------------------------


def fmt(v: Any) -> str:
    return "–" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def named(values: dict[str, Any], metrics: tuple[str, ...]) -> str:
    return ", ".join(f"{m.replace('_', ' ')} {fmt(values.get(m))}" for m in metrics if m in values)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        machine_line(report["machine"]) + ".",
        f"Command: `{report['invocation']}`; {report['date']}.",
        "",
        "| task | data | recipe + key settings | command | test metric | trivial baseline (test) | learned | "
        "wall time (s) | load before |",
        "|---|---|---|---|---|---|---|---:|---:|",
    ]
    for row in report["tasks"]:
        task = BY_NAME[row["key"]]
        settings = ", ".join(f"{k}={v}" for k, v in (row.get("settings") or {}).items())
        if row.get("exit_status"):
            metric, baseline, learned = f"failed (exit {row['exit_status']})", "–", "–"
        else:
            metric = named(row["test"], task.metrics)
            baseline = (
                named({k: v for k, v in row["test_baseline"].items() if v is not None}, task.metrics) or "–"
            )
            learned = {True: "yes", False: "no", None: "–"}[row["learned"]["verdict"]]
        load = row["load_before"][0]
        lines.append(
            f"| {row['task']} ({row['kind']}) | {row['data']} | `{row['recipe']}`: {settings} | `{row['command']}` | "
            f"{metric} | {baseline} | {learned} | {row['wall_s']:.1f} | {load:.2f}{'' if row['quiet'] else ' (busy)'} |"
        )
    lines += [
        "",
        "Test metrics on the whole test split; `learned` is the app's verdict (its best validation value against "
        "the trivial baseline's). Wall time: the whole command, imports to export.",
    ]
    earlier = [row for row in report["tasks"] if row.get("measured_by")]
    if earlier:
        lines += ["", "Rows kept from an earlier run on this machine (`--keep-others`):", ""]
        lines += [f"- {row['task']}: `{row['measured_by'][0]}`; {row['measured_by'][1]}." for row in earlier]
    return "\n".join(lines) + "\n"


def build_data(tasks: list[Task], data: Path) -> dict[str, Any]:
    """scripts/public_tasks.py for the tasks that need it; their manifests."""
    needed = sorted({t.built for t in tasks if t.built})
    if not needed:
        return {}
    subprocess.run([sys.executable, str(BUILDER), str(data), "--tasks", *needed], check=True, cwd=REPO_DIR,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return {name: json.loads((data / name / "manifest.json").read_text()) for name in needed}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m benchmarks.expected_results", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/expected_results"))
    p.add_argument(
        "--tasks", nargs="+", choices=list(BY_NAME), default=list(BY_NAME), help="which tasks (default all)"
    )
    p.add_argument("--keep-others", action="store_true",
                   help="keep the rows of the other tasks in --out's report (measured on this machine; each row "
                        "names the command that measured it and its date)")  # fmt: skip
    return parse_run_options(p, argv)


def earlier_report(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """--keep-others: --out's report, checked before anything runs: refused where it was measured on
    another machine, or by a smoke run where this is none (or the other way round)."""
    path = out / "expected_results.json"
    if not path.is_file():
        raise UserError(f"--keep-others: {path} does not exist; run without it first")
    old = json.loads(path.read_text())
    if old["machine"].get("cpu") != report["machine"].get("cpu") or old["smoke"] != report["smoke"]:
        raise UserError(f"--keep-others: {path} was measured on another machine or as another kind of run; "
                        "rerun every task instead")  # fmt: skip
    return old


def kept_rows(old: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the earlier report for the tasks not run now, each with the command and date that
    measured it, and the new rows, in the benchmark's order of tasks."""
    rows = {row["key"]: {"measured_by": [old["invocation"], old["date"]], **row} for row in old["tasks"]}
    rows.update({row["key"]: row for row in report["tasks"]})
    return [rows[key] for key in BY_NAME if key in rows]


def parse_run_options(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options this benchmark shares with benchmarks/search_vs_defaults.py (--data, the quiet-machine
    wait, --smoke) added to `p`, then the command line parsed and checked."""
    p.add_argument("--data", type=Path, default=REPO_DIR / "runs" / "public_tasks",
                   help="where scripts/public_tasks.py builds the tasks (default runs/public_tasks)")  # fmt: skip
    p.add_argument("--max-load", type=float, default=0.8, help="wait for a 1-minute load average below this")
    p.add_argument("--max-wait", type=float, default=900.0, help="seconds to wait for it before each task")
    p.add_argument("--smoke", action="store_true", help="tiny models from config, a few steps, no waiting")
    args = p.parse_args(argv)
    if args.max_load <= 0 or args.max_wait < 0:
        p.error("--max-load must be positive and --max-wait at least 0")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} is a file; give a directory for the report")
    if args.smoke:
        args.max_wait = 0.0
    return args


def report_head(module: str, argv: list[str] | None, args: argparse.Namespace, tasks: list) -> dict[str, Any]:
    """A report's first keys: the invocation, date, machine, the wait's settings and the built data."""
    return {
        "invocation": f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d"), "machine": machine(), "smoke": args.smoke,
        "max_load": args.max_load, "max_wait_s": args.max_wait,
        "data": build_data(tasks, args.data), "tasks": [],
    }  # fmt: skip


@exit_on_user_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    tasks = [BY_NAME[name] for name in args.tasks]
    report = report_head("benchmarks.expected_results", argv, args, tasks)
    old = earlier_report(args.out, report) if args.keep_others else None
    with tempfile.TemporaryDirectory(prefix="finetune-expected-") as tmp:
        for key, task in zip(args.tasks, tasks, strict=True):
            load = wait_for_quiet(args.max_load, args.max_wait)
            print(f"{task.name}: load {load['load_before'][0]:.2f}, running", flush=True)
            row = {"key": key, "task": task.name, "kind": task.kind, "data": task.data,
                   "recipe": f"finetune/configs/{task.recipe}", "chosen": task.chosen, **load}  # fmt: skip
            row.update(run_task(task, args.data, Path(tmp) / key, args.smoke))
            row["load_after"] = [round(x, 2) for x in os.getloadavg()]
            report["tasks"].append(row)
            print(
                f"{task.name}: {row.get('last_line') or row.get('error', '')[-300:]} ({row['wall_s']:.1f} s)",
                flush=True,
            )
    if old is not None:
        report["tasks"] = kept_rows(old, report)
    write_report(args.out, "expected_results", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
