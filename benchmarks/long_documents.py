"""Long texts read whole in windows (`text_windows`) against texts cut at `max_length`, on two long-text sets
built from the bundled data, with the bundled MiniLM and the default recipe's optimisation; and, for the
windowed model, its texts scored by the mean of their windows' logits (the app's) against the max.

    python -m benchmarks.long_documents --out benchmarks/results

The sets (no long-text classification set is bundled, so they are built, seeded, from bundled ones):
- `long reviews`: each text is `--reviews` rotten_tomatoes reviews of one sentiment, the label that sentiment
  (about 150 tokens: a cut text keeps its first review or two, a windowed one all of them);
- `needle`: each text is one review put at a random place among sentences of squad_shifts_wiki contexts
  (neutral prose, about as long), labelled with that review's sentiment: a cut text often loses it.
Each run is `finetune/run.py` with the default recipe (bert_rotten_tomatoes.yaml) on those files, in its own
process; its test accuracy comes from results.json, its time is the whole command's. The mean and max are
computed from the windowed export's window logits on the test split with a plain `model.eval()` loop, and
the app's own test accuracy must equal the mean's (a check of the benchmark against the app).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parents[1]
ROTTEN, SQUAD = REPO / "data" / "rotten_tomatoes", REPO / "data" / "squad_shifts_wiki"


def _reviews(split: str) -> dict[str, list[str]]:
    with (ROTTEN / f"{split}.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {label: [r["text"] for r in rows if r["label"] == label] for label in ("0", "1")}


def _sentences() -> list[str]:
    contexts = {json.loads(line)["context"] for line in (SQUAD / "train.jsonl").open()}
    return [s.strip() + "." for c in sorted(contexts) for s in c.split(". ") if len(s.split()) > 5]


def long_reviews(split: str, n: int, k: int, rng: random.Random) -> list[dict]:
    by_label = _reviews(split)
    return [{"text": " ".join(rng.sample(by_label[label], k)), "label": label}
            for label in (rng.choice("01") for _ in range(n))]  # fmt: skip


def needles(split: str, n: int, words: int, rng: random.Random, sentences: list[str]) -> list[dict]:
    by_label, rows = _reviews(split), []
    for _ in range(n):
        label = rng.choice("01")
        start, filler = rng.randrange(len(sentences) - 40), []
        while sum(len(s.split()) for s in filler) < words:
            filler.append(sentences[start + len(filler)])
        filler.insert(rng.randrange(len(filler) + 1), rng.choice(by_label[label]))
        rows.append({"text": " ".join(filler), "label": label})
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def train(files: dict[str, Path], out: Path, args: argparse.Namespace, windows: int | None) -> dict:
    cmd = [sys.executable, "finetune/run.py", "--config", "finetune/configs/bert_rotten_tomatoes.yaml",
           *(f"{s}_file={p}" for s, p in files.items()), "max_train_samples=null", "max_eval_samples=null",
           f"max_length={args.max_length}", f"num_train_epochs={args.epochs}", f"text_windows={windows if windows is not None else 'null'}",
           f"output_dir={out}", "report_to=[]"]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - t
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    return {"seconds": round(seconds, 1), "test_accuracy": results["test"]["accuracy"]}


def mean_and_max(export: Path, rows: list[dict], max_length: int, overlap: int) -> dict:
    """Test accuracy of each text's prediction from its windows' logits: their mean, and their max."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForSequenceClassification.from_pretrained(export).eval()
    right = {"mean": 0, "max": 0}
    with torch.no_grad():
        for row in rows:
            enc = tokenizer(row["text"], truncation=True, max_length=max_length, stride=overlap,
                            return_overflowing_tokens=True, padding=True, return_tensors="pt")  # fmt: skip
            enc.pop("overflow_to_sample_mapping")
            logits = model(**enc).logits
            label = model.config.label2id.get(row["label"], int(row["label"]))
            right["mean"] += int(logits.mean(0).argmax()) == label
            right["max"] += int(logits.max(0).values.argmax()) == label
    return {k: v / len(rows) for k, v in right.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--train", type=int, default=240, help="training texts per set")
    parser.add_argument("--test", type=int, default=200, help="validation and test texts per set")
    parser.add_argument("--reviews", type=int, default=6, help="reviews per long review")
    parser.add_argument("--max_length", type=int, default=48)
    parser.add_argument("--overlap", type=int, default=8, help="text_windows: tokens consecutive windows share")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    rng, sentences = random.Random(0), _sentences()
    makers = {"long reviews": lambda split, n: long_reviews(split, n, args.reviews, rng),
              "needle": lambda split, n: needles(split, n, 100, rng, sentences)}  # fmt: skip
    report: dict = {"machine": machine(), "settings": vars(args) | {"out": str(args.out)}, "sets": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name, make in makers.items():
            root = Path(scratch) / name.replace(" ", "_")
            root.mkdir()
            rows = {s: make(s, args.train if s == "train" else args.test) for s in ("train", "validation", "test")}
            files = {s: write(root / f"{s}.csv", r) for s, r in rows.items()}
            cut = train(files, root / "cut", args, None)
            whole = train(files, root / "windows", args, args.overlap)
            pooled = mean_and_max(root / "windows" / "model", rows["test"], args.max_length, args.overlap)
            report["sets"][name] = {"cut": cut, "windows": whole, "pooled": pooled,
                                    "app_equals_mean": abs(pooled["mean"] - whole["test_accuracy"]) < 1e-9}  # fmt: skip
    lines = ["# Long texts: windows against cutting at max_length", "", machine_line(report["machine"]), "",
             f"Command: `python -m benchmarks.long_documents` ({args.train} training, {args.test} validation and test texts "
             f"a set; max_length={args.max_length}, text_windows={args.overlap}, {args.epochs} epochs; the default "
             "recipe's optimisation, bundled MiniLM). Seconds are the whole command's, on this machine, in this sitting.", "",
             "| set | cut: test accuracy | cut: s | windows: test accuracy | windows: s | windows, max of logits | "
             "app = mean |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in report["sets"].items():
        lines.append(f"| {name} | {r['cut']['test_accuracy']:.3f} | {r['cut']['seconds']:.0f} | "
                     f"{r['windows']['test_accuracy']:.3f} | {r['windows']['seconds']:.0f} | {r['pooled']['max']:.3f} | "
                     f"{'yes' if r['app_equals_mean'] else 'NO'} |")  # fmt: skip
    write_report(args.out, "long_documents", report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
