"""Findings of this round, each a behaviour that could fail: bf16 on a CPU without native bf16 is
named in one warning line."""

from __future__ import annotations

import pytest

from finetune import runtime
from finetune.config import DEFAULT_RECIPE, load_config


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_native_bf16_says_so(monkeypatch, capsys, tmp_path, native):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setattr(runtime, "native_bf16", lambda: native)
    accelerator = runtime.make_accelerator(load_config(DEFAULT_RECIPE, [f"output_dir={tmp_path}"]))
    assert accelerator.mixed_precision == "bf16"
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    if native:
        assert warnings == []
    else:
        (line,) = warnings
        assert "bf16 on a CPU without native bf16" in line and "accelerate_configs/cpu.yaml" in line


PREPARE = """
import json, os, sys
from finetune.cli import parse_command_line
from finetune.data import load_splits, prepare_splits
from finetune.models import load_preprocessor
cfg = parse_command_line(sys.argv[1:]).cfg
raw, _ = load_splits(cfg.data_args)
prepared = prepare_splits(cfg.data_args, raw, load_preprocessor(cfg.model_args))
files = {s: d.cache_files[0]["filename"] for s, d in prepared.items()}
print(json.dumps({s: [f, os.stat(f).st_mtime_ns] for s, f in files.items()}))
"""


@pytest.mark.slow
def test_tokenized_splits_are_cached_across_runs(small_text_data, tmp_path):
    """A second process on the same files reads datasets' cache of the tokenized splits (the same
    files, not written again): docs/speed.md."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import tiny_text_args

    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    args = tiny_text_args(small_text_data, tmp_path / "run")
    runs = [
        json.loads(subprocess.run([sys.executable, "-c", PREPARE, *args], capture_output=True, text=True, env=env,
                                  check=True).stdout.splitlines()[-1])  # fmt: skip
        for _ in range(2)
    ]
    assert set(runs[0]) == {"train", "validation"}
    assert runs[0] == runs[1]  # the same cache files, untouched by the second process
    assert all(str(tmp_path / "cache") in f for f, _ in runs[0].values())


@pytest.mark.slow
@pytest.mark.parametrize(("text", "warned"), [("ሰላም ለዓለም ጤና ይስጥልኝ", True), ("a fine film to see", False)])
def test_texts_the_tokenizer_reads_as_unknown_tokens_are_one_warning(tmp_path, capsys, text, warned):
    """Amharic through the bundled English vocabulary: every word is [UNK], the model reads nothing; one
    warning names the script's problem. English texts say nothing."""
    from conftest import tiny_text_args, write_csv

    from finetune.run import main

    rows = [{"text": f"{text} {'!' * (i % 4)}", "label": ["neg", "pos"][i % 2]} for i in range(24)]
    data = {"train": write_csv(tmp_path / "train.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows[:10])}
    main(tiny_text_args(data, tmp_path / "run", "max_steps=1"))
    said = [line for line in capsys.readouterr().err.splitlines() if "nothing but unknown tokens" in line]
    assert len(said) == int(warned), said


@pytest.mark.parametrize(("words", "warned"), [(40, True), (3, False)])
def test_texts_cut_at_max_length_are_one_warning(words, warned, capsys):
    """Reviews of 40 words at max_length=16: every text is cut, and the model reads only its start; one
    warning leads with the share of the texts' tokens lost, then says how many are cut and the setting to
    raise. Short texts say nothing."""
    from conftest import TOKENIZER
    from datasets import Dataset
    from transformers import AutoTokenizer

    from finetune.config import DataArgs
    from finetune.tasks import task_of

    rows = {"text": [" ".join(["film"] * words + [str(i)]) for i in range(20)], "labels": [i % 2 for i in range(20)]}
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    task_of("text-classification").prepare(Dataset.from_dict(rows), tokenizer, DataArgs(max_length=16), "train", 3)
    said = [line for line in capsys.readouterr().err.splitlines() if "are cut there" in line]
    whole = len(tokenizer(rows["text"][0])["input_ids"])  # every text tokenizes to as many tokens
    lost = f"{(whole - 16) / whole:.0%}"
    assert said == ([f"warning: {lost} of the training texts' tokens are lost at max_length=16: 20 of 20 training "
                     "texts (100%) reach it and are cut there, so the model reads only their start; raise max_length "
                     "(the model's limit is 512) to read more of each, at a cost in time, or read each whole in "
                     "overlapping windows (text_windows=4)"] if warned else []), said  # fmt: skip


def test_sentence_pairs_cut_at_max_length_are_said_without_the_windows_advice():
    """Pairs of 20-word texts at max_length=16: the warning leads with the share of the pairs' tokens lost and
    advises a larger max_length, not text_windows=N (windows refuse pairs); a run that then learned nothing
    says the same."""
    from conftest import TOKENIZER
    from datasets import Dataset
    from transformers import AutoTokenizer

    from finetune import checks
    from finetune.checks import tools
    from finetune.config import DataArgs
    from finetune.tasks import task_of

    rows = {"text": [" ".join(["film"] * 20 + [str(i)]) for i in range(20)],
            "text2": [" ".join(["plot"] * 20) for _ in range(20)], "labels": [i % 2 for i in range(20)]}  # fmt: skip
    tokenizer, said = AutoTokenizer.from_pretrained(TOKENIZER), checks.Said(quiet=True)
    task_of("text-classification").prepare(Dataset.from_dict(rows), tokenizer, DataArgs(max_length=16, text_pair_column="text2"),
                                           "train", 3, said)  # fmt: skip
    assert said.rules() == ["inputs.pairs_cut"]
    whole = len(tokenizer(rows["text"][0], rows["text2"][0])["input_ids"])  # every pair tokenizes to as many
    [(_, line)] = said.lines
    assert line.startswith(f"{(whole - 16) / whole:.0%} of the training pairs' tokens are lost at max_length=16: 20 of "
                           "20 training sentence pairs (100%) reach it and are cut there")  # fmt: skip
    assert "raise max_length" in line and "text_windows=" not in line
    from types import SimpleNamespace

    from finetune.verdict import judge

    verdict = checks.Said(quiet=True)
    cfg = SimpleNamespace(problem_type="single_label_classification", metric_for_best_model="accuracy")
    learned = judge(cfg, {"accuracy": 0.5, "num_samples": 400, "baseline": {"accuracy": 0.5}}, {})
    checks.gate(tools.VERDICT, learned, said.rules(), said=verdict)
    assert verdict.lines[0][1].endswith("the model read only their start, raise max_length")
