"""finetune/run.py: the training entry point and its loop, run for real on tiny models. Text and images
end to end, the layer split through the entry point, early stopping, non-finite losses, what the console
shows, and a whole run offline without a connection or a leaked token.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_run.py
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import yaml
from conftest import (
    REPO,
    TINY_VIT,
    logged_steps,
    multi_label_rows,
    recipe_text_args,
    rotten_rows,
    tiny_text_args,
    user_error,
    write_csv,
    write_jsonl,
)
from safetensors.torch import load_file
from transformers import pipeline

from finetune import checkpoint as ckpt
from finetune.config import CONFIGS_DIR
from finetune.run import main


def test_text_run_exports_a_model_that_pipeline_loads(small_text_data, tmp_path):
    out = tmp_path / "run"
    results = main(
        tiny_text_args(small_text_data, out, "num_train_epochs=1", "per_device_train_batch_size=8", "save_steps=3")
    )
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "results.json",
        "model/model.safetensors",
        "model/tokenizer.json",
    ):
        assert (out / name).exists(), name
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["per_device_train_batch_size"] == 8 and saved["output_dir"] == str(out)
    assert results["validation"]["num_samples"] == 13  # every validation row, none twice
    classifier = pipeline("text-classification", model=str(out / "model"), device="cpu")
    predictions = classifier(["a gorgeous , witty , seductive movie .", "a dull , lifeless mess ."])
    assert {p["label"] for p in predictions} <= {"0", "1"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"}
    umask = os.umask(0)
    os.umask(umask)  # safetensors writes 0600: the export's files get what the umask gives a new file
    assert {p.stat().st_mode & 0o777 for p in (out / "model").iterdir()} == {0o666 & ~umask}
    saved = [p for p in (out / "checkpoints").rglob("*") if p.is_file()]  # a checkpoint's weights too
    assert "model.safetensors" in {p.name for p in saved}
    assert {p.stat().st_mode & 0o777 for p in saved} == {0o666 & ~umask}


def test_image_run_on_bundled_fashion_mnist(tmp_path):
    out = tmp_path / "vit"
    results = main(
        [
            "--config",
            str(CONFIGS_DIR / "vit_fashion_mnist.yaml"),
            f"model_config={TINY_VIT}",
            "max_train_samples=96",
            "max_eval_samples=20",
            "max_test_samples=30",
            "num_train_epochs=1",
            "per_device_train_batch_size=16",
            f"output_dir={out}",
        ]
    )
    assert results["test"]["num_samples"] == 30
    assert results["label_names"][0] == "T-shirt/top" and len(results["label_names"]) == 10
    classifier = pipeline("image-classification", model=str(out / "model"), device="cpu")
    from PIL import Image

    image = Image.open(REPO / "data/fashion_mnist/sample_png/test/1_trouser/test_1_000.png")
    top = classifier(image, top_k=1)[0]
    assert top["label"] in results["label_names"]


def test_model_parallel_on_repeated_cpu_devices_equals_unsplit(small_text_data, tmp_path):
    """Through the real entry point: a 3-stage split, pipelined, trains to the unsplit weights."""
    common = ("num_train_epochs=1", "per_device_train_batch_size=6", "adam_epsilon=1e-6")
    main(tiny_text_args(small_text_data, tmp_path / "plain", *common))
    main(
        tiny_text_args(
            small_text_data,
            tmp_path / "split",
            *common,
            "model_parallel=true",
            "devices=cpu,cpu,cpu",
            "pipeline_chunks=2",
        )
    )
    plain = load_file(tmp_path / "plain" / "model" / "model.safetensors")
    split = load_file(tmp_path / "split" / "model" / "model.safetensors")
    worst = max((plain[k] - split[k]).abs().max().item() for k in plain)
    assert worst < 1e-5


def test_plan_only_prints_the_plan_and_trains_nothing(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "model_parallel=true", "devices=cpu,cpu", "--plan-only"))
    printed = capsys.readouterr().out
    assert "cpu" in printed and "embeddings" in printed
    assert not (out / "model").exists()
    # with --dry-run as well: two plans, one of them would be left out without a word
    user_error(capsys, main, tiny_text_args(small_text_data, out, "model_parallel=true", "devices=cpu,cpu",
                                            "--plan-only", "--dry-run"), "give one of them", rule="settings.modes_both")  # fmt: skip


# A learning rate of 1e30 from the first step: the weights overflow after one step, every loss after is NaN.
DIVERGING = ("max_steps=20", "per_device_train_batch_size=4", "warmup_ratio=0", "learning_rate=1e30")


def test_persistent_nan_loss_stops_the_run(small_text_data, tmp_path, capsys):
    """A learning rate of 1e30 makes the weights overflow after one step; every loss after is NaN."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(
            tiny_text_args(
                small_text_data,
                out,
                *DIVERGING,
                "max_nonfinite_loss_steps=3",
            )
        )
    assert exit_info.value.code == 3
    stopped = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "NaN or infinite for 3 optimizer steps in a row" in stopped[0]
    assert "(optimizer step 4)" in stopped[0] and "no checkpoint was saved" in stopped[0]
    assert logged_steps(out) == 4 and not (out / "model").exists()


def test_nan_weights_are_never_checkpointed(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(
            tiny_text_args(
                small_text_data,
                out,
                *DIVERGING,
                "save_steps=1",
            )
        )
    assert exit_info.value.code == 3
    err = capsys.readouterr().err
    good = out / ckpt.CHECKPOINTS / "step-00000001"
    assert f"the last good checkpoint is {good}" in err
    assert [ckpt.read_manifest(p)["step"] for p in ckpt.list_checkpoints(out)] == [1]
    weights = load_file(good / "model.safetensors")
    assert all(t.isfinite().all() for t in weights.values())


def test_offline_run_opens_no_socket_and_writes_no_secret(small_text_data, tmp_path, monkeypatch, capsys):
    """HF_HUB_OFFLINE=1 (set by conftest): a whole run without one connection attempt. One process only:
    gloo's DDP would use sockets. A token in the environment appears in nothing the run writes."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    secret = "hf_SECRETtoken0123456789abcdefghij"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", secret)
    attempts = []

    def refuse(self, address, *a, **kw):
        attempts.append(address)
        raise OSError(f"test: no network ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=2", "save_steps=1"))
    assert attempts == []
    printed = capsys.readouterr()
    assert secret not in printed.out + printed.err
    for path in out.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_early_stopping_stops_when_the_metric_stalls(small_text_data, tmp_path):
    out = tmp_path / "run"
    # A learning rate of ~0 keeps accuracy flat: evaluation 1 sets the best, 2 and 3 do not improve.
    results = main(
        tiny_text_args(
            small_text_data,
            out,
            "per_device_train_batch_size=4",
            "num_train_epochs=3",
            "eval_steps=1",
            "early_stopping_patience=2",
            "learning_rate=1e-12",
        )
    )
    assert results["step"] == 3  # not the 30 planned steps


@pytest.mark.parametrize("level", ["error", pytest.param("info", marks=pytest.mark.slow)])
def test_console_shows_the_run_not_the_libraries(small_text_data, tmp_path, capsys, level):
    """By default: the start summary, the training bar, each validation as computed, the end.
    log_level=info brings back datasets' and transformers' own lines and bars."""
    args = tiny_text_args(
        small_text_data, tmp_path / "run", "max_steps=4", "eval_steps=2", f"log_level={level}"
    )
    main(args)
    captured = capsys.readouterr()
    console = captured.out + captured.err
    # 37 samples in batches of 32: 2 steps an epoch, each epoch's end evaluated (and eval_steps=2)
    assert "step 2 (epoch 1): validation accuracy" in console and "step 4 (epoch 2): validation" in console
    assert "model saved to" in console and "training:" in console
    chatter = ("Generating train split", "labels (train)", "tokenizing")
    if level == "error":
        assert not [c for c in chatter if c in console], console
    else:
        assert all(c in console for c in chatter)


def test_a_run_that_learned_nothing_says_so_and_its_card_too(small_text_data, tmp_path, capsys):
    out = tmp_path / "run"
    results = main(recipe_text_args(small_text_data, out, "learning_rate=1e-9", "max_steps=2"))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("did not learn beyond a trivial baseline" in line for line in lines), lines
    assert results["learned"]["verdict"] is False and "accuracy" in results["validation"]["baseline"]
    assert "**Warning:** the model did not learn beyond a trivial baseline" in (out / "model" / "README.md").read_text()


def test_a_validation_too_small_to_judge_says_so_not_learned(small_text_data, tmp_path, capsys):
    """One validation sample: a model scores 1.0 or 0.0 on it whatever it learned."""
    data = {**small_text_data, "validation": write_csv(tmp_path / "one.csv", rotten_rows(1, start=100))}
    out = tmp_path / "run"
    results = main(recipe_text_args(data, out, "max_steps=1"))
    lines = [line for line in "\n".join(capsys.readouterr()).splitlines() if line.startswith(("learned:", "warning:"))]
    assert results["learned"]["verdict"] is None and not any(line.startswith("learned:") for line in lines)
    assert any(line.startswith("warning: validation has 1 sample, too few to tell whether the model learned "
                               "(at least 10)") for line in lines), lines
    assert "too few to tell whether the model learned" in (out / "model" / "README.md").read_text()


def test_the_validation_line_shows_the_baseline_and_the_end_says_the_verdict(small_text_data, tmp_path, capsys):
    results = main(recipe_text_args(small_text_data, tmp_path / "run", "max_steps=2"))
    out, err = capsys.readouterr()
    assert "(trivial baseline: accuracy " in out
    assert "the model: whole, on cpu, in one process" in out  # the start summary's layout line says what it is
    said = [line for line in f"{out}\n{err}".splitlines() if line.startswith(("learned:", "warning: the model did not learn"))]
    verdict = results["learned"]["verdict"]
    assert len(said) == (verdict is not None) and (not said or said[0].startswith("learned:") == verdict), said


def test_the_verdict_value_is_the_best_of_the_runs_evaluations(small_text_data, tmp_path):
    """Every periodic evaluation counts: the judged value is the best one metrics.jsonl holds (or the
    export's, where that is better), not only the last step's."""
    out = tmp_path / "run"
    results = main(recipe_text_args(small_text_data, out, "max_steps=6", "eval_steps=1", "learning_rate=3e-3"))
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seen = [row["eval_accuracy"] for row in logged if "eval_accuracy" in row]
    assert len(seen) >= 6
    assert results["learned"]["value"] == max(*seen, results["validation"]["accuracy"])


def test_labels_never_predicted_on_validation_are_named_in_one_warning_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "train.jsonl", multi_label_rows(24))
    data = {"train": path, "validation": path}
    main(recipe_text_args(data, tmp_path / "run", "label_column=labels", "max_steps=1", "tune_threshold=off",
              "multi_label_threshold=0.99"))  # fmt: skip  -- nothing reaches 0.99 after one step
    lines = [line for line in capsys.readouterr().err.splitlines() if "never predicted" in line]
    assert lines == [
        "warning: 3 of 3 labels were never predicted on validation ('bird', 'cat', 'dog'); rare ones need more "
        "examples, class_weights=balanced, or more training"
    ]


def test_the_verdict_reads_the_tuned_validation_when_there_is_one():
    from types import SimpleNamespace

    from finetune.verdict import judge

    cfg = SimpleNamespace(problem_type="multi_label_classification", metric_for_best_model="micro_f1")
    fixed = {"micro_f1": 0.10, "num_samples": 400, "baseline": {"micro_f1": 0.40}}
    tuned = {"micro_f1": 0.80, "num_samples": 400, "baseline": {"micro_f1": 0.45}}
    best = {"metric": "micro_f1", "value": 0.12}
    assert judge(cfg, fixed, best)["verdict"] is False  # at 0.5 nothing is predicted: below the prior
    verdict = judge(cfg, fixed, best, tuned)
    assert verdict["verdict"] is True and verdict["value"] == 0.80 and verdict["baseline"] == 0.45
    # the final line shows validation at the fixed threshold: the verdict says which value it quotes
    assert "micro F1 0.8000 (at the tuned threshold)" in verdict["said"], verdict["said"]  # not "threshold 0.8"
    assert "tuned" not in judge(cfg, fixed, best)["said"]


def test_the_verdict_quotes_the_best_evaluation_and_says_when_the_export_is_not_it():
    """A run without load_best_model_at_end whose validation accuracy peaked at 0.7733 and ended at 0.75:
    "best validation accuracy 0.7500" was what it said (a new user's run on 500 movie reviews). The best
    evaluation is quoted, with its step, and the export's own value beside it."""
    from types import SimpleNamespace

    from finetune.verdict import judge

    cfg = SimpleNamespace(problem_type="single_label_classification", metric_for_best_model="accuracy")
    last = {"accuracy": 0.75, "num_samples": 300, "baseline": {"accuracy": 0.5}}
    verdict = judge(cfg, last, {}, top=(96, 0.7733))
    assert verdict["value"] == 0.7733 and verdict["verdict"] is True
    assert "0.7733" in verdict["said"] and "step 96" in verdict["said"] and "0.7500" in verdict["said"], verdict["said"]
    assert "load_best_model_at_end=true" in verdict["said"]
    # the export is the best one: nothing more is said
    assert "step" not in judge(cfg, {**last, "accuracy": 0.78}, {}, top=(96, 0.7733))["said"]
    # a loss judged by the problem's main metric; lower-is-better metrics compare the other way
    reg = SimpleNamespace(problem_type="regression", metric_for_best_model="mse")
    end = {"mse": 0.30, "num_samples": 300, "baseline": {"mse": 0.9}}
    assert judge(reg, end, {}, top=(10, 0.20))["value"] == 0.20
    assert judge(reg, end, {}, top=(10, 0.40))["value"] == 0.30
    assert "clearly below the trivial baseline's 0.9000" in judge(reg, end, {})["said"]  # an error: lower is better


def test_a_validation_too_small_for_any_score_to_clear_the_baseline_is_too_few_to_tell():
    """23 validation samples of a 0.913 majority: two standard errors put the bar above 1, so a model right
    on every one was told it "did not learn" and to train longer (a hostile round's run on 203 / 20
    reviews). It is too few to tell, said as a warning, as under 10 samples."""
    from types import SimpleNamespace

    from finetune.verdict import judge

    cfg = SimpleNamespace(problem_type="single_label_classification", metric_for_best_model="accuracy")
    small = {"accuracy": 1.0, "num_samples": 23, "baseline": {"accuracy": 0.913}}
    verdict = judge(cfg, small, {})
    assert verdict["verdict"] is None and verdict["warn"], verdict
    assert "validation has 23 samples, too few to tell" in verdict["said"] and "not even a perfect" in verdict["said"]
    assert "did not learn" not in verdict["said"]
    larger = {**small, "num_samples": 400, "baseline": {"accuracy": 0.913}}  # the bar is below 1 there
    assert judge(cfg, larger, {})["verdict"] is True and judge(cfg, {**larger, "accuracy": 0.92}, {})["verdict"] is False


def test_a_tagger_must_also_beat_every_word_o():
    """Entity F1 0.04 against a baseline's 0 passes the rate rule; a tagger whose word accuracy is below
    "every word O" has still learned nothing, and is told so (a new user's 2-step run, reproduced)."""
    from types import SimpleNamespace

    from finetune.verdict import judge

    cfg = SimpleNamespace(problem_type="token_classification", metric_for_best_model="entity_f1")
    best = {"metric": "entity_f1", "value": 0.041}
    baseline = {"entity_f1": 0.0, "word_accuracy": 0.667}
    worse = {"entity_f1": 0.041, "word_accuracy": 0.489, "num_samples": 40, "num_words": 400, "baseline": baseline}
    verdict = judge(cfg, worse, best)
    assert verdict["verdict"] is False and verdict["metric"] == "word_accuracy" and "did not learn" in verdict["said"]
    better = {**worse, "word_accuracy": 0.9}
    assert judge(cfg, better, best)["verdict"] is True
    # Entity F1 0.525 over a baseline's 0, its words 0.0197 above "every word O": it learned (the word-level
    # check vetoes a tagger worse than O, not one short of "clearly above" it).
    close = {"entity_f1": 0.525, "word_accuracy": 0.8867 + 0.0197, "num_samples": 200, "num_words": 3000,
             "baseline": {"entity_f1": 0.0, "word_accuracy": 0.8867}}  # fmt: skip
    assert judge(cfg, close, {"metric": "entity_f1", "value": 0.525})["verdict"] is True


def test_a_multi_label_label_without_a_positive_training_sample_is_one_warning(tmp_path, capsys):
    path = write_jsonl(tmp_path / "train.jsonl", multi_label_rows(24))
    results = main(recipe_text_args({"train": path, "validation": path}, tmp_path / "run", "label_column=labels",
                                    "max_steps=1", "label_names=[bird,cat,dog,fish]", "class_weights=balanced"))  # fmt: skip
    lines = [line for line in capsys.readouterr().err.splitlines() if "no positive training sample" in line]
    assert lines == ["warning: 1 of the 4 labels have no positive training sample ('fish'): the model cannot learn "
                     "to predict them; give them positive samples, or leave them out"]  # fmt: skip
    assert "labels.label_never_positive" in [w["rule"] for w in results["warnings"]]


def test_a_setting_given_twice_and_texts_cut_at_max_length_are_said(small_text_data, tmp_path, capsys):
    """max_length=32 and then max_length=8 on one command line: the last is used, with a word; and at 8 tokens
    most training texts are cut, which is said too. Both are kept in results.json."""
    results = main(tiny_text_args(small_text_data, tmp_path / "run", "max_steps=1", "max_length=8"))
    rules = [w["rule"] for w in results["warnings"]]
    assert "settings.given_twice" in rules and "inputs.texts_cut" in rules, rules
    err = capsys.readouterr().err
    assert "max_length is given twice on the command line (max_length=32, then max_length=8)" in err
    assert "of the training texts' tokens are lost at max_length=8: " in err and "reach it and are cut there" in err
    saved = json.loads((tmp_path / "run" / "results.json").read_text())["warnings"]
    assert [w["rule"] for w in saved] == rules


def test_a_train_file_of_ones_own_beside_the_recipes_evaluation_files_is_said(tmp_path):
    """The default recipe's validation and test files are rotten_tomatoes': a train_file of another folder is
    kept beside them, with a word each; none once they are given."""
    from finetune import checks
    from finetune.config import load_config

    train = write_csv(tmp_path / "train.csv", rotten_rows(8))
    said = checks.Said()
    load_config(None, [f"train_file={train}"], said=said)
    assert said.rules().count("settings.recipe_evaluation_file") == 2, said.lines
    said = checks.Said()
    load_config(None, [f"train_file={train}", "validation_file=null", f"test_file={train}"], said=said)
    assert "settings.recipe_evaluation_file" not in said.rules()


def test_a_file_of_ones_own_cut_by_the_recipes_sample_cap_is_said(tmp_path):
    """The default recipe's max_train_samples=2400 (and max_eval_samples=500) were set for rotten_tomatoes: a
    streamed train_file of one's own is cut by them with a word each (a stream's start summary counts its
    steps, not the file's rows); none once the cap is given, for the recipe's own file, or for a loaded run
    (whose start summary counts the samples kept)."""
    from finetune import checks
    from finetune.config import load_config

    train, dev = write_csv(tmp_path / "train.csv", rotten_rows(8)), write_csv(tmp_path / "dev.csv", rotten_rows(4))
    said = checks.Said(quiet=True)
    load_config(None, [f"train_file={train}", f"validation_file={dev}", "streaming=true", "max_steps=3"], said=said)
    assert said.rules().count("settings.recipe_sample_cap") == 2, said.lines
    assert any("max_train_samples=2,400 is the recipe's" in line and "max_train_samples=null" in line
               for _, line in said.lines), said.lines  # fmt: skip
    stream = ["streaming=true", "max_steps=3", f"validation_file={dev}"]
    for argv in ([f"train_file={train}", "max_train_samples=null", "max_eval_samples=null", *stream],
                 ["train_file=data/rotten_tomatoes/train.csv", *stream[:2]], [f"train_file={train}"]):  # fmt: skip
        said = checks.Said(quiet=True)
        load_config(None, argv, said=said)
        assert "settings.recipe_sample_cap" not in said.rules(), (argv, said.lines)


def test_a_console_that_cannot_print_the_labels_shows_them_escaped(tmp_path):
    """An ASCII-only console (PYTHONIOENCODING=ascii, a C locale) and class names in another script: every
    line is printed, the characters it cannot show as escapes, and the run ends well."""
    import subprocess
    import sys

    from conftest import REPO, rotten_rows, tiny_text_args, write_csv

    names = {"0": "négatif", "1": "positif ✓"}
    rows = [{"text": r["text"], "label": names[r["label"]]} for r in rotten_rows(40)]
    data = {"train": write_csv(tmp_path / "train.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows[:12])}
    env = {**__import__("os").environ, "PYTHONIOENCODING": "ascii", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(REPO / "finetune" / "run.py"),
                           *tiny_text_args(data, tmp_path / "run", "max_steps=1", "label_names=null")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "n\\xe9gatif" in done.stdout + done.stderr
