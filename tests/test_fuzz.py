"""A fuzzer for the one rule: whatever a user gives, the run ends with exit 0 and a sane model, or with
exactly one `error:` line and exit 2 (a run stopped on purpose: one `stopped:` line and its status),
never a traceback, and every file of an earlier run unchanged.

Hypothesis draws the input: settings of every kind (wrong types, extremes, NaN, empty, unicode), data
files (CSV, TSV, JSON Lines, parquet, CoNLL, image folders) with random damage (truncated, another
encoding, missing or extra columns, empty cells, lists, huge values, stray bytes), and checkpoint
damage, then runs the real entry point (`finetune.run.main`) in this process on a tiny model, a step
or two each. The default run draws a fixed, short profile (`derandomize`: the same cases every run);
`-m slow` draws many more, at random.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import random
import shutil
import string
from pathlib import Path

import PIL.Image
import pytest
from conftest import TINY_BERT, TINY_VIT, TOKENIZER, rotten_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune.run import main

# Settings worth drawing wrong values for, and values of every kind.
KEYS = ["learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
        "max_length", "label_column", "text_column", "label_names", "problem_type", "warmup_ratio", "warmup_steps",
        "seed", "dropout", "freeze_layers", "eval_steps", "save_steps", "logging_steps", "max_train_samples",
        "validation_split_percentage", "metric_for_best_model", "multi_label_threshold", "pad_to_multiple_of",
        "peft", "model_config.hidden_size", "lr_scheduler_type", "label_columns", "max_grad_norm", "weight_decay",
        "group_by_length", "augment", "text_pair_column", "tokens_column", "task"]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["", "null", "nan", "inf", "-inf", "-1", "0", "1", "2", "1e308", "-1e-9", "0.5", "true", "[]", "{}",
                     "[a, b]", "{r: 0}", "ünïcødé ☃", "'quoted'", "label", "text", "1.5", "99999999999", "tokens",
                     "token-classification", "image-classification", "regression", "accuracy", "[crop]"]),
    st.text(alphabet=string.printable, max_size=12),
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
)  # fmt: skip


def _text_rows(n: int, rng: random.Random) -> list[dict]:
    rows = rotten_rows(n, start=rng.randint(0, 500))
    return [{"text": r["text"], "label": r["label"]} for r in rows]


def _write_rows(path: Path, rows: list[dict], fmt: str) -> Path:
    import csv

    path = path.with_suffix(f".{fmt}")
    if fmt in ("csv", "tsv"):
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if fmt == "tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    return path


DAMAGE = ["none", "truncate", "latin1", "drop_column", "empty_cells", "list_cells", "huge_values", "garbage",
          "empty_file", "bom", "extra_column", "only_header", "nan_labels", "duplicate_header"]  # fmt: skip


def _damage(path: Path, how: str, rng: random.Random) -> None:
    data = path.read_bytes()
    if how == "truncate" and data:
        path.write_bytes(data[: rng.randint(0, len(data) - 1)])
    elif how == "latin1":
        path.write_bytes(data.replace(b"a", "\xe9".encode("latin-1"), 3))
    elif how == "garbage":
        cut = rng.randint(0, len(data))
        path.write_bytes(data[:cut] + bytes(rng.randrange(256) for _ in range(40)) + data[cut:])
    elif how == "empty_file":
        path.write_bytes(b"")
    elif how == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + data)
    elif path.suffix in (".csv", ".tsv", ".jsonl"):
        lines = data.decode("utf-8", "replace").splitlines()
        if how == "drop_column" and path.suffix == ".jsonl":
            lines = [json.dumps({k: v for k, v in json.loads(line).items() if k != "label"}) for line in lines]
        elif how == "drop_column":
            lines = [line.rsplit("," if path.suffix == ".csv" else "\t", 1)[0] for line in lines]
        elif how == "empty_cells" and len(lines) > 2:
            lines[rng.randint(1, len(lines) - 1)] = ","
        elif how == "list_cells" and path.suffix == ".jsonl":
            lines = [json.dumps({**json.loads(line), "label": [1, 2]}) if i % 2 else line for i, line in enumerate(lines)]
        elif how == "huge_values" and path.suffix == ".jsonl":
            lines = [json.dumps({**json.loads(line), "label": 10**30}) for line in lines]
        elif how == "extra_column":
            lines = [line + (",x" if path.suffix == ".csv" else "") for line in lines]
        elif how == "only_header":
            lines = lines[:1]
        elif how == "nan_labels" and path.suffix == ".jsonl":
            lines = [line.replace('"label": "1"', '"label": NaN') for line in lines]
        elif how == "duplicate_header":
            lines = lines[:1] + lines
        path.write_text("\n".join(lines) + "\n")


def _conll(path: Path, rng: random.Random) -> Path:
    words = "ada lovelace went to london with grace and alan".split()
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "B-PER", "O", "B-PER"]
    lines = []
    for _ in range(10):
        n = rng.randint(1, len(words))
        lines += [f"{w} {t}" for w, t in zip(words[:n], tags[:n], strict=True)] + [""]
    path.write_text("\n".join(lines))
    return path


def _images(root: Path, rng: random.Random, damage: str) -> Path:
    for split in ("train", "validation"):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(3):
                image = PIL.Image.new(rng.choice(["RGB", "L", "RGBA", "P"]), (rng.randint(1, 40), rng.randint(1, 40)))
                image.save(root / split / name / f"{i}.png")
    if damage != "none":
        victim = root / "train" / "cat" / "0.png"
        victim.write_bytes(victim.read_bytes()[: rng.randint(0, 20)])
    return root


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    """A finished tiny run with a checkpoint: what no failing command may change."""
    root = tmp_path_factory.mktemp("earlier")
    rows = _text_rows(24, random.Random(0))
    train = _write_rows(root / "train", rows, "csv")
    out = root / "run"
    main(_base_args(train, out) + ["save_steps=1", "max_steps=2"])
    _reset()
    return out


def _base_args(train: Path, out: Path) -> list[str]:
    return [f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}", f"train_file={train}", "validation_file=null",
            "test_file=null", "max_train_samples=null", "max_eval_samples=null", "label_names=null", "max_length=32",
            "max_steps=2", "per_device_train_batch_size=4", "freeze_embeddings=false", "dropout=null",
            "logging_steps=1", f"output_dir={out}"]  # fmt: skip


def _reset() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@st.composite
def cases(draw):
    """One user's command: a data format and its damage, settings, maybe an earlier run in the way."""
    return {
        "format": draw(st.sampled_from(["csv", "tsv", "jsonl", "parquet", "conll", "images"])),
        "damage": draw(st.sampled_from(DAMAGE)),
        "settings": draw(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=3)),
        "target": draw(st.sampled_from(["fresh", "fresh", "earlier", "resume_damaged"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _command(case: dict, tmp: Path, earlier: Path) -> tuple[list[str], Path]:
    rng = random.Random(case["seed"])
    data = tmp / "data"
    data.mkdir()
    if case["format"] == "images":
        args = [f"model_config={TINY_VIT}", "task=image-classification", "model_name_or_path=null", "train_file=null",
                "test_file=null", f"data_dir={_images(data / 'img', rng, case['damage'])}", "label_names=null",
                "max_train_samples=null", "max_eval_samples=null", "max_steps=2", "per_device_train_batch_size=4",
                "freeze_embeddings=false"]  # fmt: skip
    elif case["format"] == "conll":
        train = _conll(data / "train.conll", rng)
        _damage(train, case["damage"], rng)
        args = _base_args(train, tmp / "x")[:-1] + ["task=token-classification"]
    else:
        train = _write_rows(data / "train", _text_rows(24, rng), case["format"])
        _damage(train, case["damage"], rng)
        args = _base_args(train, tmp / "x")[:-1]
    out = tmp / "run"
    if case["target"] == "earlier":
        out = earlier  # a run is there: refused unless told to resume or overwrite
    elif case["target"] == "resume_damaged":
        out = tmp / "resumed"
        shutil.copytree(earlier, out)
        checkpoint = sorted((out / "checkpoints").iterdir())[-1]
        victim = rng.choice(sorted(p for p in checkpoint.iterdir() if p.is_file()))
        victim.write_bytes(victim.read_bytes()[: rng.randint(0, 64)])
        args.append("resume_from_checkpoint=latest")
    args.append(f"output_dir={out}")
    args += [f"{key}={value}" for key, value in case["settings"]]
    return args, out


def _check(case: dict, tmp: Path, earlier: Path) -> None:
    args, out = _command(case, tmp, earlier)
    before = _hashes(earlier)
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            results = main(args)
        except SystemExit as e:
            code = e.code
        finally:
            _reset()
    text = err.getvalue()
    assert "Traceback" not in text, (args, text[-3000:])
    if code == 0:
        assert (out / "results.json").is_file(), args
        loss = results["validation"].get("loss")
        assert loss is None or math.isfinite(loss), (args, results["validation"])
    else:
        kind = "error:" if code == 2 else "stopped:"
        lines = [line for line in text.splitlines() if line.startswith(("error:", "stopped:"))]
        assert code in (2, 3) and len(lines) == 1 and lines[0].startswith(kind), (args, code, text[-3000:])
    assert _hashes(earlier) == before, ("an earlier run changed", args)


FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow], max_examples=12, derandomize=True)  # fmt: skip


@FUZZ
@given(case=cases())
def test_the_one_rule_holds_for_drawn_inputs(case, earlier_run, tmp_path_factory):
    _check(case, tmp_path_factory.mktemp("case"), earlier_run)


@pytest.mark.slow  # ~2-4 s a case
@settings(FUZZ, max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), derandomize=False)
@given(case=cases())
def test_the_one_rule_holds_for_many_drawn_inputs(case, earlier_run, tmp_path_factory):
    _check(case, tmp_path_factory.mktemp("case"), earlier_run)
