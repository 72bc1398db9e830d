"""A fuzzer for the one rule: whatever a user gives, the run ends with exit 0 and a sane model, or with
exactly one `error:` line and exit 2 (a run stopped on purpose: one `stopped:` line and its status),
never a traceback, and every file of an earlier run unchanged.

Hypothesis draws the input: settings of every kind (wrong types, extremes, NaN, empty, unicode), on the
command line or in a recipe file (sometimes a broken one), data files (CSV, TSV, JSON Lines, parquet,
CoNLL, image folders) with random damage (truncated, another encoding, missing or extra columns, empty
cells, lists, huge values, stray bytes; labels written as a user may: leading zeros, words for booleans,
spaces, case, joined label sets, separators), checkpoint damage, files of an earlier run edited by hand
(its config, log, results, manifest, export config) and resumed or evaluated, an earlier run in output_dir with
overwrite_output_dir / resume_from_checkpoint drawn (so that a command that fails while replacing or
continuing it is caught if it changed a file of it), and `evaluate_checkpoint` on a damaged export or
checkpoint with odd --data files; then it runs the real entry point (`finetune.run.main`,
`finetune.evaluate_checkpoint.main`) in this process on a tiny model, a step or two each.

    python -m pytest -q tests/test_fuzz.py                                    # the short profile, ~1 min
    FUZZ_EXAMPLES=150 python -m pytest -q -m slow tests/test_fuzz.py -k many  # the long one

The default run draws a fixed, short profile (`derandomize`: the same cases every run, and one case of
each kind pinned with `@example`: images, a recipe file over an earlier run, an evaluation); `-m slow`
draws many more, at random (FUZZ_EXAMPLES of them, 300 by default).
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
from conftest import EARLIER_RUN, TINY_BERT, TINY_VIT, TOKENIZER, reset_accelerate, rotten_rows
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from finetune.config import EVAL_KEYS
from finetune.evaluate_checkpoint import main as evaluate
from finetune.run import main

# Settings worth drawing wrong values for, and values of every kind.
KEYS = ["learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
        "max_length", "label_column", "text_column", "label_names", "problem_type", "warmup_ratio", "warmup_steps",
        "seed", "dropout", "freeze_layers", "eval_steps", "save_steps", "logging_steps", "max_train_samples",
        "validation_split_percentage", "metric_for_best_model", "multi_label_threshold", "pad_to_multiple_of",
        "peft", "model_config.hidden_size", "lr_scheduler_type", "label_columns", "max_grad_norm", "weight_decay",
        "group_by_length", "augment", "text_pair_column", "tokens_column", "task", "label_smoothing", "class_weights",
        "load_best_model_at_end", "early_stopping_patience", "tune_threshold", "save_total_limit", "random_flip",
        "max_eval_samples", "gradient_checkpointing", "freeze_embeddings"]  # fmt: skip
# Values a setting takes that are valid but odd (tiny, huge, at an edge): past the settings' checks, into
# the data, the model and the loop. Three drawn settings in four take one of these.
PLAUSIBLE = {
    "learning_rate": ["1e-6", "0.5", "100"], "num_train_epochs": ["0.1", "1", "2.5"], "max_steps": ["1", "3"],
    "per_device_train_batch_size": ["1", "3", "100"], "gradient_accumulation_steps": ["2", "5", "50"],
    "max_length": ["1", "2", "3", "8", "512"], "label_names": ["[0, 1]", "[1, 0]", "[0, 1, 2]", "[a, b]"],
    "problem_type": ["regression", "multi_label_classification", "single_label_classification"],
    "warmup_ratio": ["0.99"], "warmup_steps": ["0", "1", "2"], "seed": ["0", "4294967295"], "dropout": ["0.0", "0.99"],
    "freeze_layers": ["1", "2", "3"], "eval_steps": ["1"], "save_steps": ["1"], "logging_steps": ["1", "1000"],
    "max_train_samples": ["1", "2", "5"], "validation_split_percentage": ["1", "50", "99"],
    "metric_for_best_model": ["loss", "macro_f1", "mse", "micro_f1"], "multi_label_threshold": ["0.01", "0.99"],
    "pad_to_multiple_of": ["1", "3", "64"], "peft": ["{r: 2}", "{r: 1, target_modules: [query]}"],
    "model_config.hidden_size": ["8", "33"], "lr_scheduler_type": ["cosine", "constant"],
    "label_columns": ["[label]", "[text, label]"], "max_grad_norm": ["0", "1e-9"], "weight_decay": ["0", "10"],
    "group_by_length": ["true", "false"], "augment": ["[crop, color, trivial]"], "text_pair_column": ["label"],
    "tokens_column": ["text"], "task": ["text-classification", "token-classification", "image-classification"],
    "label_smoothing": ["0.5", "0.99"], "class_weights": ["balanced"], "load_best_model_at_end": ["true"],
    "early_stopping_patience": ["1"], "tune_threshold": ["per_label", "off"], "save_total_limit": ["1", "null"],
    "random_flip": ["true"], "max_eval_samples": ["1", "2"], "gradient_checkpointing": ["true"],
    "freeze_embeddings": ["true"], "text_column": ["label", "tokens"], "label_column": ["text", "ner_tags"],
}  # fmt: skip
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


# How a user's labels may be written (each row's label 0/1 rewritten): twins that differ by leading zeros,
# spaces or case, booleans in words, joined label sets, numbers with separators, ids beside names.
LABEL_FORMATS = {
    "labels_leading_zeros": lambda label, i: f"0{label}" if i % 3 == 0 else label,
    "labels_booleans": lambda label, i: ["no", "yes", "False", "True"][int(label) + 2 * (i % 2)],
    "labels_spaces": lambda label, i: f" {label}" if i % 4 == 0 else label,
    "labels_case": lambda label, i: ["neg", "pos", "NEG", "Pos"][int(label) + 2 * (i % 3 == 0)],
    "labels_joined": lambda label, i: ["art", "film", "art,film", "art|film"][int(label) + 2 * (i % 2)],
    "labels_separators": lambda label, i: ["1,000", "2.5", "3,5", "1 000"][int(label) + 2 * (i % 2)],
    "labels_ids_and_names": lambda label, i: [label, ["neg", "pos"][int(label)]][i % 2],
}
DAMAGE = ["none", "truncate", "latin1", "drop_column", "empty_cells", "list_cells", "huge_values", "garbage",
          "empty_file", "bom", "extra_column", "only_header", "nan_labels", "duplicate_header", *LABEL_FORMATS]  # fmt: skip


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
def earlier_run(finished_run) -> Path:
    """A finished tiny run with checkpoints (the factory's, shared: a command copies it before it may touch
    it): what no failing command may change."""
    return finished_run(*EARLIER_RUN)


def _base_args(train: Path, out: Path) -> list[str]:
    return [f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}", f"train_file={train}", "validation_file=null",
            "test_file=null", "max_train_samples=null", "max_eval_samples=null", "label_names=null", "max_length=32",
            "max_steps=2", "per_device_train_batch_size=4", "freeze_embeddings=false", "dropout=null",
            "logging_steps=1", f"output_dir={out}"]  # fmt: skip


# Recipe files a user may give by mistake: empty, a list, unclosed, not UTF-8, an unknown key, a mapping of
# mappings, a mode flag written as a setting, a tab.
BROKEN_RECIPES = [b"", b"- a\n- b\n", b"learning_rate: [1e-3\n", b"\xff\xfe\x00l\x00r", b"learnin_rate: 1e-3\n",
                  b"model_config: 3\n", b"a:\n  b: c\n", b"dry_run: true\n", b"task: text-classification\n\t- x\n"]  # fmt: skip
# What a command says about the earlier run in output_dir: replace it, continue it, or point at its parts.
EARLIER_SETTINGS = ["overwrite_output_dir=true", "overwrite_output_dir=false", "resume_from_checkpoint=latest",
                    "resume_from_checkpoint={checkpoint}", "resume_from_checkpoint={export}",
                    "resume_from_checkpoint={run}", "resume_allow_topology_change=true"]  # fmt: skip
# What is done to an export or a checkpoint before it is evaluated.
# A run's files as a user may edit them by hand (a value changed, a line cut, a label renamed), then resume
# or evaluate: each is (file under the run, what is done to its text).
EDITS = {
    "edit_config_lr": ("config.yaml", lambda t: t.replace("learning_rate:", "learning_rate: 0.5 #")),
    "edit_config_labels": ("config.yaml", lambda t: t + "label_names: [b, a]\n"),
    "edit_config_garbage": ("config.yaml", lambda t: t[: len(t) // 2] + "\n: : [\n"),
    "edit_metrics_cut": ("metrics.jsonl", lambda t: t[: len(t) * 2 // 3]),
    "edit_metrics_garbage": ("metrics.jsonl", lambda t: "not json\n" + t),
    "edit_results_labels": ("results.json", lambda t: t.replace('"label_names": ["', '"label_names": ["x')),
    "edit_results_garbage": ("results.json", lambda t: t[:-10]),
    "edit_export_id2label": ("model/config.json", lambda t: t.replace('"0": "', '"0": "renamed-')),
    "edit_manifest_step": ("{checkpoint}/manifest.json", lambda t: t.replace('"step": ', '"step": 1', 1)),
    "edit_manifest_labels": ("{checkpoint}/manifest.json", lambda t: t.replace('"label_names": ["', '"label_names": ["x')),
}


def _edit(run: Path, how: str) -> None:
    name, change = EDITS[how]
    path = run / name.format(checkpoint=f"checkpoints/{sorted((run / 'checkpoints').iterdir())[-1].name}")
    if path.is_file():
        path.write_text(change(path.read_text()))


EVAL_DAMAGE = ["none", "none", "truncate_weights", "garbage_weights", "no_config", "garbage_config", "no_tokenizer",
               "no_manifest", "garbage_manifest", "no_complete", "no_labels", *EDITS]  # fmt: skip


@st.composite
def cases(draw):
    """One user's command: a data format and its damage, settings (maybe in a recipe file), maybe an
    earlier run in the way (and what the command says about it), or an evaluation of a saved model."""
    return {
        "format": draw(st.sampled_from(["csv", "tsv", "jsonl", "parquet", "conll", "images"])),
        "damage": draw(st.sampled_from(["none"] * 4 + DAMAGE)),  # whole data more often: deeper into the run
        "settings": draw(st.lists(st.sampled_from(KEYS).flatmap(
            lambda key: st.tuples(st.just(key), st.sampled_from([True, True, True, False]).flatmap(
                lambda odd: st.sampled_from(PLAUSIBLE[key]) if odd else VALUES))), max_size=3)),  # fmt: skip
        "target": draw(st.sampled_from(["fresh", "fresh", "earlier", "resume_damaged", "resume_edited", "evaluate"])),
        "edit": draw(st.sampled_from(sorted(EDITS))),
        "earlier": draw(st.lists(st.sampled_from(EARLIER_SETTINGS), max_size=2)),
        "recipe": draw(st.sampled_from(["none", "none", "settings", "broken"])),
        "broken_recipe": draw(st.sampled_from(BROKEN_RECIPES)),
        "evaluate": {
            "what": draw(st.sampled_from(["export", "checkpoint"])),
            "damage": draw(st.sampled_from(EVAL_DAMAGE)),
            "data": draw(st.booleans()),
            "predictions": draw(st.booleans()),
            "split": draw(st.sampled_from([None, None, "train", "validation", "test", "ünïcødé"])),
            "settings": draw(st.lists(st.tuples(st.sampled_from(EVAL_KEYS), VALUES), max_size=2)),
        },
        "seed": draw(st.integers(0, 2**16)),
    }


def _recipe(case: dict, tmp: Path) -> list[str]:
    """--config with a recipe file holding the drawn settings (then not on the command line), or a
    broken one; [] for the default recipe."""
    if case["recipe"] == "none":
        return []
    path = tmp / "recipe.yaml"
    if case["recipe"] == "broken":
        path.write_bytes(case["broken_recipe"])
    else:
        import yaml

        def value(text: str):
            try:
                return yaml.safe_load(text) if text != "" else None
            except yaml.YAMLError:
                return text

        path.write_text(yaml.safe_dump({key: value(v) for key, v in case["settings"]}, allow_unicode=True))
    return ["--config", str(path)]


def _data(case: dict, tmp: Path, rng: random.Random) -> tuple[list[str], Path]:
    """The command's data (the drawn format and damage): its arguments, and the file or folder."""
    data = tmp / "data"
    data.mkdir()
    if case["format"] == "images":  # none of the default recipe's files: its CSVs would be read
        folder = _images(data / "img", rng, case["damage"])
        return [f"model_config={TINY_VIT}", "task=image-classification", "model_name_or_path=null", "train_file=null",
                "validation_file=null", "test_file=null", f"data_dir={folder}", "label_names=null",
                "max_train_samples=null", "max_eval_samples=null", "max_steps=2", "per_device_train_batch_size=4",
                "freeze_embeddings=false", "dropout=null"], folder  # fmt: skip
    if case["format"] == "conll":
        train = _conll(data / "train.conll", rng)
        _damage(train, case["damage"], rng)
        return _base_args(train, tmp / "x")[:-1] + ["task=token-classification"], train
    rows = _text_rows(24, rng)
    if case["damage"] in LABEL_FORMATS:
        rows = [{**r, "label": LABEL_FORMATS[case["damage"]](str(r["label"]), i)} for i, r in enumerate(rows)]
    train = _write_rows(data / "train", rows, case["format"])
    _damage(train, case["damage"], rng)
    return _base_args(train, tmp / "x")[:-1], train


def _command(case: dict, tmp: Path, earlier: Path) -> tuple[list[str], Path, Path | None]:
    """The training command, its output_dir, and the copy of the earlier run it may touch (or None)."""
    rng = random.Random(case["seed"])
    args, _ = _data(case, tmp, rng)
    out, copy = tmp / "run", None
    if case["target"] in ("earlier", "resume_damaged", "resume_edited"):  # a copy: a command that succeeds may replace it
        copy = out = tmp / "earlier"
        shutil.copytree(earlier, copy)
    if case["target"] == "resume_damaged":
        checkpoint = sorted((out / "checkpoints").iterdir())[-1]
        victim = rng.choice(sorted(p for p in checkpoint.iterdir() if p.is_file()))
        victim.write_bytes(victim.read_bytes()[: rng.randint(0, 64)])
        args.append("resume_from_checkpoint=latest")
    if case["target"] == "resume_edited":
        _edit(out, case["edit"])
        args.append("resume_from_checkpoint=latest")
    places = {"checkpoint": f"checkpoints/{sorted((earlier / 'checkpoints').iterdir())[0].name}", "export": "model",
              "run": ""}  # fmt: skip
    args += [item.format(**{k: (copy or earlier) / v for k, v in places.items()}) for item in case["earlier"]]
    args.append(f"output_dir={out}")
    recipe = _recipe(case, tmp)
    if case["recipe"] != "settings":
        args += [f"{key}={value}" for key, value in case["settings"]]
    return recipe + args, out, copy


def _evaluation(case: dict, tmp: Path, earlier: Path) -> tuple[list[str], Path]:
    """An evaluate_checkpoint command on a copy of the earlier run's export or last checkpoint, damaged as
    drawn, maybe on the drawn data file (--data) and with drawn evaluation settings."""
    rng, drawn = random.Random(case["seed"]), case["evaluate"]
    copy = tmp / "earlier"
    shutil.copytree(earlier, copy)
    target = copy / "model" if drawn["what"] == "export" else sorted((copy / "checkpoints").iterdir())[-1]
    damage, weights = drawn["damage"], target / "model.safetensors"
    if damage == "truncate_weights":
        weights.write_bytes(weights.read_bytes()[: rng.randint(0, 200)])
    elif damage == "garbage_weights":
        weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    elif damage == "no_config":
        (target / "config.json").unlink(missing_ok=True)
    elif damage == "garbage_config" and (target / "config.json").exists():
        (target / "config.json").write_text("{not json")
    elif damage == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
            (target / name).unlink(missing_ok=True)
    elif damage == "no_manifest":
        (target / "manifest.json").unlink(missing_ok=True)
    elif damage == "garbage_manifest" and (target / "manifest.json").exists():
        (target / "manifest.json").write_text('{"step": "x"}')
    elif damage == "no_complete":
        (target / "COMPLETE").unlink(missing_ok=True)
    elif damage == "no_labels":
        (copy / "results.json").write_text("{}")
    elif damage in EDITS:
        _edit(copy, damage)
    args = [str(target)]
    if drawn["data"]:
        args += ["--data", str(_data(case, tmp, rng)[1])]
    if drawn["split"] is not None:
        args += ["--split", drawn["split"]]
    if drawn["predictions"]:
        args.append("--predictions")
    args += [f"{key}={value}" for key, value in drawn["settings"]]
    return args, copy


def _run(entry, args: list[str]) -> tuple[int, str, dict | None]:
    err, code, results = io.StringIO(), 0, None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            results = entry(args)
        except SystemExit as e:
            code = e.code
        finally:
            reset_accelerate()  # many runs in one test: each builds its own Accelerator
    return code, err.getvalue(), results


def _one_rule(args: list[str], code: int, text: str) -> None:
    assert "Traceback" not in text, (args, text[-3000:])
    if code != 0:
        kind = "error:" if code == 2 else "stopped:"
        lines = [line for line in text.splitlines() if line.startswith(("error:", "stopped:"))]
        assert code in (2, 3) and len(lines) == 1 and lines[0].startswith(kind), (args, code, text[-3000:])


def _kept(before: dict[str, str], folder: Path, args: list[str]) -> None:
    """A refused command left the earlier run's files as they were: in place, or (an overwrite that failed
    after its own first checkpoint, as documented) set aside in .previous-run/."""
    after = _hashes(folder)
    aside = {k.removeprefix(".previous-run/"): v for k, v in after.items() if k.startswith(".previous-run/")}
    assert after == before or aside == before, ("a failing command changed the earlier run", args)


def _check(case: dict, tmp: Path, earlier: Path) -> tuple[int, str]:
    """The one rule for `case`; returns the exit status and the first error/stopped line (for a survey)."""
    before = _hashes(earlier)
    if case["target"] == "evaluate":
        args, copy = _evaluation(case, tmp, earlier)
        kept = _hashes(copy)
        code, text, results = _run(evaluate, args)
        _one_rule(args, code, text)
        if code == 0:
            assert Path(results["metrics_file"]).is_file(), args
            assert results.get("loss") is None or math.isfinite(results["loss"]), (args, results)
        # what was evaluated keeps its bytes (the drawn damage included); only its run's eval/ is new
        assert {k: v for k, v in _hashes(copy).items() if not k.startswith("eval/")} == kept, args
    else:
        args, out, copy = _command(case, tmp, earlier)
        kept = _hashes(copy) if copy is not None else None
        code, text, results = _run(main, args)
        _one_rule(args, code, text)
        if code == 0:
            assert (out / "results.json").is_file(), args
            loss = results["validation"].get("loss")
            assert loss is None or math.isfinite(loss), (args, results["validation"])
        elif code == 2 and copy is not None:
            _kept(kept, copy, args)
    assert _hashes(earlier) == before, ("the earlier run changed", args)
    return code, next((line for line in text.splitlines() if line.startswith(("error:", "stopped:"))), "")


FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow], max_examples=15, derandomize=True)  # fmt: skip


def _pinned(**changes) -> dict:
    """A case of a kind the short profile must hold whatever it draws."""
    base = {"format": "csv", "damage": "none", "settings": [], "target": "fresh", "earlier": [], "recipe": "none",
            "edit": "edit_config_lr",
            "broken_recipe": b"", "seed": 1, "evaluate": {"what": "export", "damage": "none", "data": False,
            "predictions": False, "split": None, "settings": []}}  # fmt: skip
    return {**base, **changes}


@FUZZ
@given(case=cases())
@example(case=_pinned(format="images", damage="truncate"))
@example(case=_pinned(format="jsonl", damage="labels_case"))
@example(case=_pinned(target="resume_edited", edit="edit_manifest_labels"))
@example(case=_pinned(recipe="settings", settings=[("learning_rate", "1e-3"), ("max_steps", "1")], target="earlier",
                      earlier=["overwrite_output_dir=true"]))  # fmt: skip
@example(case=_pinned(target="evaluate", format="tsv", evaluate={"what": "checkpoint", "damage": "none", "data": True,
                                                                  "predictions": True, "split": None, "settings": []}))  # fmt: skip
def test_the_one_rule_holds_for_drawn_inputs(case, earlier_run, tmp_path_factory):
    _check(case, tmp_path_factory.mktemp("case"), earlier_run)


@pytest.mark.slow  # ~2-4 s a case
@settings(FUZZ, max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), derandomize=False)
@given(case=cases())
def test_the_one_rule_holds_for_many_drawn_inputs(case, earlier_run, tmp_path_factory):
    """FUZZ_SURVEY=FILE: every case is run and its outcome appended to FILE (JSON Lines), failures too,
    instead of stopping at the first failure: a survey of what the fuzzer finds."""
    survey = os.environ.get("FUZZ_SURVEY")
    if not survey:
        _check(case, tmp_path_factory.mktemp("case"), earlier_run)
        return
    try:
        code, line = _check(case, tmp_path_factory.mktemp("case"), earlier_run)
        outcome = f"held: exit {code} {line[:300]}"
    except AssertionError as e:
        outcome = f"FAILED: {str(e)[:1500]}"
    except Exception as e:  # a traceback out of the entry point
        outcome = f"RAISED: {type(e).__name__}: {str(e)[:1500]}"
    with open(survey, "a") as f:
        f.write(json.dumps({"case": {k: v for k, v in case.items() if k != "broken_recipe"}, "outcome": outcome},
                           default=str) + "\n")  # fmt: skip
