"""Long texts read whole (text_windows, finetune/tasks/text.py): windows of max_length tokens
that overlap, each trained on its text's label; evaluation scores each text once from the mean of its
windows' logits (finetune/evaluation.py, per_text), under accumulation and DDP as in one big batch
(tests/test_ddp_equivalence.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY_BERT, TOKENIZER, rotten_rows, user_error, write_csv

from finetune.evaluation import per_text
from finetune.run import main


def _documents(n: int, start: int) -> list[dict]:
    """n texts of five reviews of one label each: 100-200 tokens, several windows of 32."""
    rows = rotten_rows(10 * n + 40, start)
    by_label = {label: [r["text"] for r in rows if r["label"] == label] for label in ("0", "1")}
    return [{"text": " ".join(by_label[str(i % 2)][5 * (i // 2) : 5 * (i // 2) + 5]), "label": str(i % 2)} for i in range(n)]


@pytest.fixture(scope="module")
def long_texts(tmp_path_factory) -> dict[str, Path]:
    """13 training and 7 validation texts (7 is uneven over 2 processes, and so are their windows)."""
    root = tmp_path_factory.mktemp("long")
    return {"train": write_csv(root / "train.csv", _documents(13, 0)),
            "validation": write_csv(root / "validation.csv", _documents(7, 2000))}  # fmt: skip


def window_args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["task=text-classification", f"model_config={TINY_BERT}", f"tokenizer_name={TOKENIZER}",
            f"train_file={data['train']}", f"validation_file={data['validation']}", "test_file=null", "max_length=32",
            "text_windows=8", "per_device_train_batch_size=8", "num_train_epochs=2", "learning_rate=1e-3", "seed=0",
            "logging_steps=1", "freeze_embeddings=false", "dropout=null", "max_grad_norm=null", "group_by_length=false",
            "label_names=null", f"output_dir={out}", "report_to=[]", *extra]  # fmt: skip


def test_a_long_text_becomes_overlapping_windows_with_its_label_and_index(long_texts):
    from transformers import AutoTokenizer

    from finetune.config import load_config
    from finetune.data import load_splits
    from finetune.tasks import task_of

    cfg = load_config(None, window_args(long_texts, Path("/tmp/unused")))
    raw, _ = load_splits(cfg.data_args)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    windows = task_of("text-classification").prepare(raw["train"], tokenizer, cfg.data_args, "train", 3)
    assert len(windows) > 3 * len(raw["train"]) and max(windows["length"]) == 32
    assert sorted(set(windows["example"])) == list(range(len(raw["train"])))
    for i in range(len(windows) - 1):
        a, b = windows[i], windows[i + 1]
        assert a["labels"] == raw["train"][a["example"]]["labels"]
        if a["example"] == b["example"]:  # the next window starts with the last 8 tokens of this one
            assert a["input_ids"][-9:-1] == b["input_ids"][1:9]
    whole = tokenizer(raw["train"][0]["text"])["input_ids"]
    read = [t for w in windows if w["example"] == 0 for t in w["input_ids"][1:-1]]
    assert set(whole[1:-1]) <= set(read)  # nothing of the text is left unread


def test_per_text_is_the_mean_of_a_texts_windows_in_text_order():
    logits = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0], [5.0, 5.0]])
    mean, labels = per_text(logits, torch.tensor([1, 0, 1, 0]), torch.tensor([2, 0, 2, 0]))
    assert torch.equal(mean, torch.tensor([[4.0, 3.5], [0.5, 2.0]])) and labels.tolist() == [0, 1]


@pytest.mark.parametrize(("setting", "rule", "fragment"), [
    ("text_windows=30", "inputs.windows_overlap_whole", "lower text_windows"),
    ("text_pair_column=text2", "inputs.windows_overlap_whole", "sentence pairs"),
    ("text_windows=-1", "settings.out_of_range", "text_windows must be >= 0"),
])  # fmt: skip
def test_windows_that_cannot_be_made_are_one_line(long_texts, tmp_path, capsys, setting, rule, fragment):
    pairs = [{**r, "text2": r["text"][::-1]} for r in _documents(6, 0)]
    data = long_texts if "text2" not in setting else {s: write_csv(tmp_path / f"{s}.csv", pairs) for s in long_texts}
    user_error(capsys, main, window_args(data, tmp_path / "run", setting), fragment, rule=rule)


def test_the_cut_texts_warning_advises_windows_that_run_and_a_resume_keeps_them(long_texts, tmp_path, capsys):
    """Texts cut at max_length: the warning's advice (text_windows=N) is a value a run takes; a resume with
    other windows (other samples at the checkpoint's place in the epoch) is refused, naming text_windows."""
    import re

    cut = [a for a in window_args(long_texts, tmp_path / "cut", "max_steps=1") if not a.startswith("text_windows=")]
    results = main(cut)
    [line] = [w["line"] for w in results["warnings"] if w["rule"] == "inputs.texts_cut"]
    advice = re.search(r"text_windows=\d+", line).group()
    out = tmp_path / "run"
    main([*window_args(long_texts, out, "max_steps=2", "save_steps=1"), advice])
    user_error(capsys, main, [*window_args(long_texts, out, "max_steps=4", "save_steps=1", "text_windows=10",
                                           "resume_from_checkpoint=latest", "overwrite_output_dir=false")],
               f"trained with {advice}, this run has text_windows=10", rule="runs.resume_changes_a_fixed_setting",
               untouched=out)  # fmt: skip


def test_windows_that_overlap_by_most_of_their_tokens_are_warned_of(long_texts, tmp_path):
    """text_windows=24 of 30 tokens a window: each moves on by 6, every token read 5 times; said once, with
    a quarter as the overlap that reads each text whole; a quarter itself is said nothing."""
    results = main(window_args(long_texts, tmp_path / "most", "text_windows=24", "max_steps=1"))
    [line] = [w["line"] for w in results["warnings"] if w["rule"] == "inputs.windows_overlap_most"]
    assert "moves on by 6" in line and "read about 5 times" in line and "text_windows=7" in line, line
    quarter = main(window_args(long_texts, tmp_path / "quarter", "text_windows=7", "max_steps=1"))
    assert "inputs.windows_overlap_most" not in [w["rule"] for w in quarter["warnings"]]



def test_the_trivial_baseline_counts_each_text_once_not_each_window(long_texts, tmp_path):
    """3 long texts of label 1 (many windows each) and 4 short ones of label 0 (one window each): by texts
    the most frequent label is 0, by windows 1. The baseline predicts the texts' 0: on the 7 validation
    texts (4 of label 0) its accuracy is 4/7."""
    long = [d for d in _documents(8, 0) if d["label"] == "1"][:3]
    short = [{"text": " ".join(r["text"].split()[:5]), "label": "0"} for r in rotten_rows(4, 500)]
    data = {"train": write_csv(tmp_path / "train.csv", long + short), "validation": long_texts["validation"]}
    results = main(window_args(data, tmp_path / "run", "max_steps=1", "per_device_train_batch_size=4"))
    assert results["validation"]["num_samples"] == 7
    assert results["validation"]["baseline"]["accuracy"] == pytest.approx(4 / 7)
