"""finetune.verify: the user-facing equivalence check, run for real on a tiny recipe."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ANIMALS, TOKENIZER, launch, multi_label_rows, rotten_rows, user_error, write_csv

from finetune import verify
from finetune.config import TrainConfig
from finetune.errors import UserError

HAS_DROPOUT_KEY = "dropout" in {f.name for f in dataclasses.fields(TrainConfig)}
HAS_FLIP_KEY = "random_flip" in {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.fixture
def recipe(tmp_path):
    """A user's recipe: a tiny BERT WITH dropout (verify must turn it off), batch 8, on 37 rows."""
    train = write_csv(tmp_path / "train.csv", rotten_rows(37))
    validation = write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100))
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "task: text-classification\n"
        "model_config: {model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4,\n"
        "  intermediate_size: 37, max_position_embeddings: 128, hidden_dropout_prob: 0.1,\n"
        "  attention_probs_dropout_prob: 0.1}\n"
        f"tokenizer_name: {TOKENIZER}\n"
        f"train_file: {train}\n"
        f"validation_file: {validation}\n"
        "test_file: null\n"
        "max_length: 32\n"
        "per_device_train_batch_size: 8\n"
        "learning_rate: 1.0e-3\n"
        "warmup_ratio: 0.2\n"
        f"output_dir: {tmp_path / 'never-written'}\n"
    )
    return path


def test_accumulation_agrees_with_one_big_batch(recipe, tmp_path, capsys):
    # the batch given as the docs show it: each variant sets its own, without a "given twice" warning
    assert verify.main(["--config", str(recipe), "--keep", str(tmp_path / "runs"), "per_device_train_batch_size=8"]) == 0
    printed, err = capsys.readouterr()
    assert "given twice" not in err and "fewer than the check's" not in err
    said = [line for line in err.splitlines() if line.startswith("warning:")]  # the variants read the same data:
    assert said and len(set(said)) == len(said), said  # what they find is said once, not once a variant
    assert "1 x 8 x 1" in printed and "1 x 4 x 2" in printed
    assert "; one process, so no DDP variant (launched with --num_processes 2 or more, it adds one)" in printed
    assert "OK: every variant agrees with one big batch within 1e-05" in printed
    assert not (tmp_path / "never-written").exists()  # the recipe's own output_dir is left alone
    # 3 steps on 3 x 8 - (4 + 1) = 19 samples: the last window is one micro-batch of 3.
    assert "on 19 samples" in printed
    config = (tmp_path / "runs" / "accumulation" / "config.yaml").read_text()
    assert "hidden_dropout_prob: 0.0" in config or "dropout: 0.0" in config
    # the same command again: the kept runs are refused, not replaced
    user_error(capsys, verify.main, ["--config", str(recipe), "--keep", str(tmp_path / "runs")],
               "already holds accumulation/, one_big_batch/", "give an empty or new folder",
               untouched=tmp_path / "runs", rule="tools.verify_keep_not_empty")  # fmt: skip


def test_a_check_longer_than_the_data_says_how_far_it_ran(recipe, capsys, monkeypatch):
    """6 steps of 8 want 6 x 8 - 5 = 43 samples; the file has 37: 5 steps ran, which is said, not hidden
    behind the header's plan."""
    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")  # the rule's id before the line
    assert verify.main(["--config", str(recipe), "--steps", "6"]) == 0
    printed, err = capsys.readouterr()
    assert "6 optimizer steps on 43 samples" in printed
    rule = "tools.verify_fewer_steps"
    assert f"warning: [{rule}] the training data gave fewer than the check's 43 samples: each variant ran 5 " \
           "optimizer step(s), not 6" in err and "--steps 5" in err  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("warmup", "exit_status"), [("warmup_ratio=0.2", 1), ("warmup_ratio=0", 0)])
def test_one_step_at_learning_rate_0_is_not_called_agreement(recipe, tmp_path, capsys, warmup, exit_status):
    """Eight rows hold one step of the check: inside a warm-up it runs at rate 0, the weights do not move,
    every variant equals the reference trivially, and the check says it checked nothing instead of OK."""
    few = write_csv(tmp_path / "few.csv", rotten_rows(8))
    assert verify.main(["--config", str(recipe), f"train_file={few}", warmup]) == exit_status
    printed = capsys.readouterr().out
    assert ("FAILED: the one optimizer step ran at learning rate 0" in printed) == bool(exit_status)
    assert ("OK: every variant agrees" in printed) != bool(exit_status)


def test_training_data_too_small_for_the_accumulation_variant_is_said_as_such(recipe, tmp_path, capsys):
    """Four rows: the accumulation variant (2 micro-batches of 4 a step) has one batch an epoch. The line
    is verify's, about the data, not the sub-run's "lower gradient_accumulation_steps" (a setting the user
    never gave)."""
    rows = rotten_rows(40)
    tiny = write_csv(tmp_path / "four.csv", [r for r in rows if r["label"] == "0"][:2] + [r for r in rows if r["label"] == "1"][:2])
    with pytest.raises(SystemExit) as stop:
        verify.main(["--config", str(recipe), f"train_file={tiny}"])
    assert stop.value.code == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: the training data is too small for finetune.verify: its accumulation variant takes "
                           "gradient_accumulation_steps=2 batches a step")  # fmt: skip
    assert stop.value.__context__.rule == "tools.verify_data_too_small"


def test_frozen_lower_layers_agree_with_one_big_batch(recipe, tmp_path, capsys):
    """freeze_layers (the full-data recipe's lever) keeps accumulation equal to one big batch."""
    assert verify.main(["--config", str(recipe), "freeze_layers=1", "--keep", str(tmp_path / "runs")]) == 0
    assert "freeze_layers: 1" in (tmp_path / "runs" / "one_big_batch" / "config.yaml").read_text()


@pytest.mark.slow
def test_a_broken_variant_is_detected(recipe, monkeypatch, capsys):
    """One variant trained with another learning rate must fail the check, with exit status 1."""
    original = verify.variant_args

    def broken(variant, *args, **kwargs):
        extra = ["learning_rate=2e-3"] if variant.name == "accumulation" else []
        return original(variant, *args, **kwargs) + extra

    monkeypatch.setattr(verify, "variant_args", broken)
    assert verify.main(["--config", str(recipe)]) == 1
    printed = capsys.readouterr().out
    assert "DIFFERENT" in printed and "FAILED: accumulation differs from one big batch" in printed


@pytest.mark.slow  # ~20-40 s; DDP equivalence of the loop itself is in test_ddp_equivalence.py
def test_ddp_on_two_cpu_processes_agrees(recipe):
    result = launch(
        ["--config", str(recipe), "per_device_train_batch_size=4"],
        num_processes=2,
        script="finetune/verify.py",
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "DistributedType.MULTI_CPU" in output and "no DDP variant" not in output
    ddp = [line for line in output.splitlines() if line.startswith("DDP ")]
    assert len(ddp) == 1 and "2 x 4 x 1" in ddp[0] and ddp[0].endswith("ok"), output[-3000:]
    assert "OK: every variant agrees" in output


@pytest.mark.skipif(HAS_DROPOUT_KEY, reason="the config has a dropout key: pretrained models can be verified")
def test_pretrained_model_without_a_dropout_key_is_a_clear_error(recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        verify.main(["--config", str(recipe), "model_config=null", f"model_name_or_path={TOKENIZER}"])
    assert exit_info.value.code == 2
    assert "verify needs dropout off" in capsys.readouterr().err


@pytest.mark.slow  # the 22M-parameter MiniLM, three runs
@pytest.mark.skipif(not HAS_DROPOUT_KEY, reason="needs the `dropout` config key")
def test_pretrained_model_with_dropout_turned_off_agrees(recipe, capsys):
    args = [
        "--config",
        str(recipe),
        "model_config=null",
        f"model_name_or_path={TOKENIZER}",
        "per_device_train_batch_size=4",
        "learning_rate=1e-4",  # at 1e-3, AdamW lifts rounding in near-zero gradients to ~1.4e-5 (see report())
        "--steps",
        "2",
    ]
    assert verify.main(args) == 0
    assert "OK: every variant agrees" in capsys.readouterr().out


def test_plan_and_slice():
    a, b = verify.plan_variants(1, 8, 1)
    assert (a.shape, b.shape) == ("1 x 8 x 1", "1 x 4 x 2")
    a, b, c = verify.plan_variants(2, 4, 2)
    assert (a.shape, b.shape, c.shape) == ("1 x 16 x 1", "1 x 4 x 4", "2 x 4 x 2")
    assert verify.plan_variants(1, 7, 1)[1].shape == "1 x 1 x 7"
    with pytest.raises(UserError, match="global batch of 1") as e:
        verify.plan_variants(1, 1, 1)
    assert e.value.rule == "tools.verify_batch_of_one"
    assert verify.train_samples(3, 8, 4) == 19  # windows 8, 8, 3
    assert verify.train_samples(3, 2, 1) == 5  # windows 2, 2, 1


def test_zero_dropout_covers_the_model_types_defaults():
    spec = verify.zero_dropout({"model_type": "vit", "hidden_size": 32, "hidden_dropout_prob": 0.1})
    assert spec["hidden_dropout_prob"] == 0.0 and spec["attention_probs_dropout_prob"] == 0.0
    assert spec["hidden_size"] == 32


@pytest.mark.skipif(HAS_FLIP_KEY, reason="the config can turn the random flip off")
def test_image_recipes_under_ddp_need_the_flip_off():
    cfg = TrainConfig(task="image-classification", model_config={"model_type": "vit"}, train_file="x.parquet")
    assert any(o.startswith("model_config=") for o in verify.fixed_randomness(cfg, 1))
    with pytest.raises(UserError, match="flips its images"):
        verify.fixed_randomness(cfg, 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--tolerance", "abc"], "--tolerance must be a number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors(argv, message):
    with pytest.raises(UserError, match=message):
        verify.parse_args(argv)


def test_keep_naming_a_file_is_one_line(tmp_path):
    (tmp_path / "runs").write_text("")
    with pytest.raises(UserError, match="--keep .* is a file; give a folder for the runs") as e:
        verify.parse_args(["--keep", str(tmp_path / "runs")])
    assert e.value.rule == "tools.verify_keep_is_a_file"


@pytest.mark.parametrize(
    ("held", "named"),
    [
        ({"one_big_batch/notes.txt": "mine"}, "one_big_batch/"),  # the user's file where a variant writes
        ({"accumulation/results.json": "{}", "accumulation/model/config.json": "{}"}, "accumulation/"),  # a run
        ({"a.csv": "text,label", "b.csv": "", "c.csv": "", "d.csv": ""}, "a.csv, b.csv, c.csv and 1 more"),
        ({".hidden": ""}, ".hidden"),
    ],
)
def test_keep_naming_a_folder_that_holds_anything_is_refused_before_anything_runs(tmp_path, capsys, held, named):
    """Nothing already written is replaced: a --keep folder that holds anything (an earlier verify's runs, a
    finished run where a variant writes, the user's files) is refused, naming what is there, before the recipe
    is read; an empty or new folder is taken."""
    keep = tmp_path / "runs"
    for name, text in held.items():
        (keep / name).parent.mkdir(parents=True, exist_ok=True)
        (keep / name).write_text(text)
    line = user_error(capsys, verify.main, ["--config", str(tmp_path / "not-read.yaml"), "--keep", str(keep)],
                      f"--keep {keep} already holds {named}", "give an empty or new folder", untouched=keep,
                      rule="tools.verify_keep_not_empty")  # fmt: skip
    assert "not-read.yaml" not in line
    (tmp_path / "empty").mkdir()
    for free in (tmp_path / "empty", tmp_path / "new"):
        assert verify.parse_args(["--keep", str(free)]).keep == str(free)


def test_a_pretrained_model_needs_a_dropout_key_to_be_verified():
    """A config without a `dropout` key (an earlier version's) can turn dropout off only in a model built
    from model_config: a pretrained one is refused (here the keys stand in for such a config)."""
    from finetune import checks
    from finetune.checks import tools

    cfg = TrainConfig(model_name_or_path="some/model")
    with pytest.raises(UserError, match="verify needs dropout off") as e:
        checks.gate(tools.VERIFY_DROPOUT, cfg, set())
    assert e.value.rule == "tools.verify_needs_dropout_off"
    checks.gate(tools.VERIFY_DROPOUT, cfg, {"dropout"})  # the config turns it off


@pytest.mark.slow  # two short runs of a tiny BERT
def test_a_multi_label_recipe_with_label_columns_agrees(recipe, tmp_path, capsys):
    """verify runs any problem type: here multi-label from 0/1 columns, BCE per sample."""
    rows = [{"text": r["text"], **{a: int(a in r["labels"]) for a in ANIMALS}} for r in multi_label_rows(37)]
    train = write_csv(tmp_path / "animals.csv", rows)
    args = [
        "--config",
        str(recipe),
        f"train_file={train}",
        "validation_file=null",
        "label_columns=[cat,dog,bird]",
    ]
    assert verify.main([*args, "--keep", str(tmp_path / "runs")]) == 0
    assert "OK: every variant agrees with one big batch within 1e-05" in capsys.readouterr().out
    assert (
        "problem_type: multi_label_classification"
        in (tmp_path / "runs" / "accumulation" / "config.yaml").read_text()
    )
