"""finetune/config.py and finetune/cli.py: the typed config. `--help` from the fields, nested keys,
every shipped recipe, the direction of metric_for_best_model, and a saved config of an old default.
(Settings out of range: the catalogue, tests/test_bad_input.py.)

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_config.py
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import EARLIER_RUN, REPO, recipe_text_args, tiny_text_args, user_error

from finetune import checks
from finetune.config import CONFIGS_DIR, load_config, read_yaml, resolved
from finetune.errors import UserError
from finetune.run import main

# Recipes for the user's own files: no data of their own (no regression or multi-label data is bundled).
OWN_FILES_RECIPES = {"bert_custom_files.yaml", "bert_regression.yaml", "bert_multi_label.yaml"}


def test_every_shipped_recipe_loads():
    recipes = sorted(CONFIGS_DIR.glob("*.yaml"))
    assert len(recipes) >= 6
    for recipe in recipes:
        first = recipe.read_text().splitlines()[0]
        # (an accelerate config may come first: the full-data recipe is tuned for cpu_bf16.yaml)
        assert first.startswith("# accelerate launch ") and " finetune/run.py" in first, recipe.name
        # A recipe for the user's own files has no data of its own: its command gives train_file, and
        # without it the recipe is refused rather than scoring bundled data.
        command = recipe.read_text().split("\n#\n")[0]
        own_files = "train_file=" in command
        assert own_files == (recipe.name in OWN_FILES_RECIPES)
        cfg = load_config(recipe, ["train_file=mine.csv"] if own_files else [])
        if own_files:
            assert (cfg.validation_file, cfg.test_file) == (None, None)
            with pytest.raises(UserError, match="no training data") as raised:
                load_config(recipe)
            assert raised.value.rule == "settings.no_training_data"
        for key in ("train_file", "validation_file", "test_file", "data_dir", "model_name_or_path"):
            value = getattr(cfg, key)
            if value and str(value).startswith("/"):
                from pathlib import Path

                assert Path(value).exists(), f"{recipe.name}: {key} {value} is missing"


def test_help_with_a_recipe_that_is_not_there_says_so(capsys, monkeypatch):
    """--help --config <a misspelt path>: the help prints (the defaults) and one warning says the recipe
    is not found, instead of a help that looks like the recipe's and sets nothing."""
    from finetune.run import main

    monkeypatch.setenv("FINETUNE_SHOW_RULES", "1")
    with pytest.raises(SystemExit) as stop:
        main(["--help", "--config", "finetune/configs/bert_custom.yaml"])
    assert stop.value.code == 0
    out, err = capsys.readouterr()
    assert "the recipe finetune/configs/bert_custom.yaml is not found: the defaults are shown" in out
    rule = "settings.help_recipe_unread"  # FINETUNE_SHOW_RULES=1: the line names the rule that said it
    assert err.strip() == (f"warning: [{rule}] --config finetune/configs/bert_custom.yaml is not found; the help "
                           "shows the defaults")


def test_help_lists_every_setting_with_type_default_help_and_the_recipes_value(capsys):
    import dataclasses

    from finetune.config import TrainConfig
    from finetune.run import main

    with pytest.raises(SystemExit) as stop:
        main(["--config", str(REPO / "finetune/configs/vit_fashion_mnist.yaml"), "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert f"  {f.name}: " in out and f.metadata["help"] in out, f.name
    assert "  learning_rate: float = 5e-05" in out
    assert (
        "task: question-answering | multiple-choice | token-classification | image-classification | text-classification | null = null    "
        "(recipe: image-classification)"
        in out
    )
    assert out.index("\ndata:\n") < out.index("  train_file:") < out.index("\noptimisation:\n")
    from finetune.metrics import PROBLEMS

    metric_help = out[out.index("  metric_for_best_model:") :].split("\n  greater_is_better")[0]
    flat = " ".join(metric_help.split())
    assert all(f"{p}: {', '.join(m.reported)}" in flat for p, m in PROBLEMS.items())


def test_nested_keys_set_one_key_of_a_mapping(tmp_path):
    from finetune.config import load_config
    from finetune.errors import UserError

    recipe = REPO / "finetune/configs/vit_fashion_mnist.yaml"
    cfg = load_config(recipe, ["model_config.image_size=32", "max_memory.cpu=1GiB", "model_parallel=true"])
    assert cfg.model_config["image_size"] == 32 and cfg.model_config["model_type"] == "vit"
    assert cfg.max_memory == {"cpu": "1GiB"}
    with pytest.raises(UserError, match="max_memory caps each device of the layer split and needs model_parallel"):
        load_config(recipe, ["max_memory.cuda:0=2GiB"])  # else ignored without a word
    with pytest.raises(UserError, match="learning_rate is not a mapping") as raised:
        load_config(recipe, ["learning_rate.x=1"])
    assert raised.value.rule == "settings.subkey_of_no_mapping"
    with pytest.raises(UserError, match="unknown config key 'model_confg'; did you mean model_config"):
        load_config(recipe, ["model_confg.image_size=32"])
    with pytest.raises(UserError, match=r"^unknown config key 'defaults': a recipe is one flat YAML file, not a Hydra "
                                        r"config") as raised:  # Hydra's key: no far-fetched guess (peft)
        load_config(recipe, ["defaults=[]"])
    assert raised.value.rule == "settings.hydra_defaults"
    for short, setting in [("lr", "learning_rate"), ("epochs", "num_train_epochs"), ("batch_size",
                           "per_device_train_batch_size"), ("model", "model_name_or_path"),
                           ("model_type", "model_config.model_type")]:  # fmt: skip
        with pytest.raises(UserError, match=rf"^unknown config key '{short}': the setting is {setting}") as raised:
            load_config(recipe, [f"{short}=1"])
        assert raised.value.rule == "settings.short_name"
    # Another tool's nested layout (training_args: {learning_rate: ...}): the fix is to flatten it.
    with pytest.raises(UserError, match=r"^unknown config key 'training_args': a recipe is flat: move the settings "
                                        r"under it \(learning_rate, seed\) to the top level") as raised:  # fmt: skip
        load_config(recipe, ["training_args={learning_rate: 1e-4, seed: 3, colour: red}"])
    assert raised.value.rule == "settings.nested_block"
    # transformers' TrainingArguments habits: what does their work here
    with pytest.raises(UserError, match=r"^unknown config key 'bf16': the precision is accelerate's: launch with "
                                        r"--mixed_precision bf16") as raised:  # fmt: skip
        load_config(recipe, ["bf16=true"])
    assert raised.value.rule == "settings.other_tools_key"
    with pytest.raises(UserError, match=r"^unknown config key 'evaluation_strategy': validation runs at each epoch's end, and every eval_steps"):
        load_config(recipe, ["evaluation_strategy=steps"])
    assert load_config(recipe, ["report_to=none"]).report_to == []
    # run_glue's and Trainer's: what does their work here, not a near name
    with pytest.raises(UserError, match=r"^unknown config key 'task_name': .* dataset_name=glue dataset_config_name="):
        load_config(recipe, ["task_name=mnli"])
    with pytest.raises(UserError, match=r"^unknown config key 'pad_to_max_length': each batch is padded to its longest"):
        load_config(recipe, ["pad_to_max_length=true"])
    with pytest.raises(UserError, match=r"^unknown config key 'logging_dir': the logs are written into output_dir"):
        load_config(recipe, ["logging_dir=runs/logs"])  # not logging_steps, the near name: a folder, not a count
    included = tmp_path / "mine.yaml"  # another tool's way to build on a file (Hydra's defaults, mmengine's _base_)
    included.write_text("include: finetune/configs/bert_custom_files.yaml\ntrain_file: t.csv\n")
    with pytest.raises(UserError, match=r"^unknown config key 'include': a recipe does not include another; give the "
                                        r"base recipe to --config and your settings after it as key=value"):  # fmt: skip
        load_config(included, [])
    with pytest.raises(UserError, match=r"^text_column is one column, got \['premise', 'hypothesis'\]; for sentence "
                                        r"pairs set text_column=premise text_pair_column=hypothesis$") as raised:
        load_config(recipe, ["text_column=[premise, hypothesis]"])
    assert raised.value.rule == "settings.text_column_pair"
    # A metric name before the data says the problem type: the ones it may mean, with their problem types
    with pytest.raises(UserError, match=r"got 'f1'; the ones it may mean: macro_f1 \(single_label_classification\), "
                                        r"micro_f1 \(multi_label_classification\), macro_f1 \(multi_label_classification\)$"):  # a text task's only
        load_config("finetune/configs/bert_custom_files.yaml", ["metric_for_best_model=f1", "train_file=x.csv"])
    with pytest.raises(UserError, match=r"^save_total_limit=None is the text 'None'; to leave save_total_limit unset "
                                        r"write save_total_limit=null") as raised:  # fmt: skip
        load_config(recipe, ["save_total_limit=None"])
    assert raised.value.rule == "settings.none_as_text"
    with pytest.raises(UserError, match=r"^resume_from_checkpoint=true is not a value here: to resume from "
                                        r"output_dir's newest checkpoint, set resume_from_checkpoint=latest") as raised:  # fmt: skip
        load_config(recipe, ["resume_from_checkpoint=true"])
    assert raised.value.rule == "settings.resume_true"
    with pytest.raises(UserError, match=r"unknown tracker 'nothing'.*\(none, or \[\], for no tracker\)") as raised:
        load_config(recipe, ["report_to=nothing"])
    assert raised.value.rule == "settings.unknown_tracker"


def test_metric_loss_means_lower_is_better(small_text_data, tmp_path):
    """metric_for_best_model=loss: the best checkpoint is the one with the LOWEST loss, as in transformers'
    Trainer (greater_is_better unset: a metric that ends in "loss" is better lower)."""
    from finetune.config import load_config

    def greater(*settings: str) -> bool | None:
        return load_config(None, [f"output_dir={tmp_path}", *settings]).greater_is_better

    assert greater("metric_for_best_model=loss") is False
    assert greater("metric_for_best_model=accuracy") is True
    assert greater() is None  # until the labels say which problem, hence which metric (accuracy here)
    assert greater("metric_for_best_model=loss", "greater_is_better=true") is True  # as told
    out = tmp_path / "run"
    results = main(
        tiny_text_args(
            small_text_data,
            out,
            "max_steps=4",
            "eval_steps=1",
            "save_steps=1",
            "save_total_limit=null",
            "per_device_train_batch_size=8",
            "metric_for_best_model=loss",
            "learning_rate=3e-3",
        )
    )
    losses = {
        r["step"]: r["eval_loss"]
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if "eval_loss" in r
    }
    assert min(losses, key=losses.get) != max(losses, key=losses.get), losses  # the direction matters here
    assert results["best"]["step"] == min(losses, key=losses.get), losses
    assert results["best"]["value"] == pytest.approx(min(losses.values()))


def test_a_saved_config_of_the_old_default_still_loads(finished_run):
    """Saved configs hold greater_is_better: true (the old default): they load as they are."""
    from finetune.config import config_from_dict

    raw = yaml.safe_load((finished_run(*EARLIER_RUN) / "config.yaml").read_text())
    raw["greater_is_better"] = True
    assert config_from_dict(raw, saved=True).greater_is_better is True


def test_transformers_style_flags_and_fractional_epochs(small_text_data, tmp_path):
    out = tmp_path / "run"
    results = main([*recipe_text_args(small_text_data, out), "--num_train_epochs", "1.5", "--per_device_train_batch_size=8"])
    assert results["step"] == 8  # 37 samples in batches of 8: 5 steps an epoch, 1.5 epochs: 8
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["num_train_epochs"] == 1.5
    epochs = {json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert epochs == {1, 2}  # counted from 1, as the console counts them


def test_a_flag_without_its_value_is_one_line(capsys):
    """`--output_dir` with nothing after it was read as output_dir=true; a bare flag is true only for a yes/no
    setting (`--group_by_length`)."""
    from finetune.config import settings_from_flags

    assert settings_from_flags(["--group_by_length", "--max_steps", "3"]) == ["group_by_length=true", "max_steps=3"]
    user_error(capsys, main, ["--output_dir"], "--output_dir needs a value: --output_dir VALUE",
               rule="settings.flag_without_value")
    user_error(capsys, main, ["--max_steps", "--dry-run"], "--max_steps needs a value")


def test_setting_flags_with_hyphens_read_and_mistyped_ones_get_the_nearest(capsys):
    """`--max-steps 3` is HfArgumentParser's other spelling of --max_steps; a mistyped `--num_train_epoch`
    or an upper-case key gets the nearest setting, not argparse's "unrecognized arguments"."""
    from finetune.config import settings_from_flags

    assert settings_from_flags(["--max-steps", "3", "--group-by-length", "--dry-run"]) == [
        "max_steps=3", "group_by_length=true", "--dry-run"]  # fmt: skip
    user_error(capsys, main, ["--num_train_epoch", "1"], "unknown setting --num_train_epoch; did you mean "
               "--num_train_epochs (num_train_epochs=VALUE)?", rule="settings.flag_misspelt")  # fmt: skip
    user_error(capsys, main, ["--MAX_STEPS", "1"], "did you mean --max_steps")
    user_error(capsys, main, ["--lr", "1e-4"], "unknown setting --lr: the setting is learning_rate (learning_rate=VALUE)",
               rule="settings.flag_short_name")
    user_error(capsys, main, ["MAX_STEPS=1"], "unknown config key 'MAX_STEPS'; did you mean max_steps?")


def test_a_train_file_of_ones_own_beside_the_recipe_s_test_file_is_said(tmp_path, monkeypatch, capsys):
    """The NER recipe with only train_file set keeps the bundled test set: kept, but said in one line with
    the fix; naming the evaluation files (or null) says nothing; a file beside the recipe's own neither."""
    recipe = CONFIGS_DIR / "bert_ner.yaml"
    mine = tmp_path / "train.jsonl"
    cfg = load_config(recipe, [f"train_file={mine}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "test_file is the recipe's" in lines[0] and "test_file=null" in lines[0], lines
    assert cfg.test_file.endswith("uner_english_ewt/test.jsonl")  # kept: a bigger file of the same data is fair
    load_config(recipe, [f"train_file={mine}", "test_file=null"])
    bundled = REPO / "data" / "uner_english_ewt" / "validation.jsonl"
    load_config(recipe, [f"train_file={bundled}"])
    assert "warning:" not in capsys.readouterr().err
    # A resume reads the run's own config.yaml: its evaluation files are the user's, not a recipe's.
    saved = tmp_path / "config.yaml"
    saved.write_text(recipe.read_text())
    load_config(saved, [f"train_file={mine}"], saved=True)
    assert "warning:" not in capsys.readouterr().err


def test_a_key_set_twice_in_a_recipe_is_refused_with_its_lines(tmp_path):
    """YAML forbids it, PyYAML keeps the last without a word: refused, naming the key and both lines, at any
    depth and on the command line."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 4\nlearning_rate: 1.0e-3\nmax_steps: 6\n")
    with pytest.raises(UserError, match="line 3.*max_steps is set twice, on line 1 and line 3"):
        load_config(recipe)
    recipe.write_text("model_config:\n  model_type: bert\n  hidden_size: 32\n  hidden_size: 64\n")
    with pytest.raises(UserError, match="hidden_size is set twice, on line 3 and line 4"):
        load_config(recipe)
    with pytest.raises(UserError, match="model_config=.*model_type is set twice") as raised:
        load_config(None, ["model_config={model_type: bert, model_type: vit}"])
    assert raised.value.rule == "settings.value_key_twice"
    recipe.write_text("base: &base {max_steps: 4}\nother:\n  <<: *base\n  max_steps: 6\n")  # a merge key overridden
    assert read_yaml(recipe.read_text()) == yaml.safe_load(recipe.read_text())


def test_model_name_or_path_on_the_command_line_replaces_the_recipe_s_model_config(capsys, monkeypatch):
    """The ViT recipes build a random model from model_config; naming pretrained weights on the command line
    must train those weights, not the recipe's random model with the weights ignored. Both named: both kept,
    with one warning that the weights are not read."""
    recipe = CONFIGS_DIR / "vit_fashion_mnist.yaml"
    assert load_config(recipe).model_config is not None
    weights = str(REPO / "data" / "bert_minilm_l6_uncased")
    cfg = load_config(recipe, [f"model_name_or_path={weights}"])
    assert cfg.model_config is None and cfg.model_name_or_path == weights
    assert "warning" not in capsys.readouterr().err
    said = checks.Said()
    both = load_config(recipe, [f"model_name_or_path={weights}", "model_config.image_size=32"], said=said)  # both: kept
    assert both.model_config["image_size"] == 32 and said.rules() == ["settings.model_config_beside_name"]
    assert capsys.readouterr().err == (f"warning: model_config builds the model at random, so model_name_or_path="
                                       f"{weights} gives only the tokenizer, not its weights; to fine-tune {weights}, "
                                       "set model_config=null\n")  # fmt: skip


def test_an_empty_output_dir_says_what_to_give():
    with pytest.raises(UserError, match=r"output_dir is empty; give the folder the run writes to \(output_dir=runs/") as raised:
        load_config(None, ["output_dir="])
    assert raised.value.rule == "settings.output_dir_empty"


def test_integers_yaml_1_1_would_read_otherwise_are_taken_as_written():
    """YAML 1.1 reads 010 as octal 8 and 01 as 1: label names keep the text as written (01 and 1 are two
    names, 010 is not '8'), an integer setting reads it in base 10, and one it cannot read is refused."""
    cfg = load_config(None, ["label_names=[01, 1, 010, 0x1f, '7']", "max_steps=010", "seed=1_000"])
    assert cfg.label_names == ["01", "1", "010", "0x1f", "7"]
    assert (cfg.max_steps, cfg.seed) == (10, 1000)
    with pytest.raises(UserError, match="max_steps must be an integer, got '0x10'"):
        load_config(None, ["max_steps=0x10"])


def test_a_path_under_home_written_with_a_tilde_is_read_as_the_card_shows_it(tmp_path, monkeypatch):
    """The card shows paths under home as ~/..., and quotes them, so no shell expands the ~: the app does."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("text,label\na,0\n")
    cfg = load_config(None, ["train_file=~/data/train.csv"])
    assert cfg.train_file == str(tmp_path / "data" / "train.csv")


def test_an_option_given_twice_and_a_setting_without_a_key_are_refused(tmp_path):
    """argparse keeps the last of two --config; the first recipe would be dropped without a word."""
    from finetune.cli import parse_command_line as parse_args

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("max_steps: 2\n")
    second.write_text("learning_rate: 1.0e-3\n")
    with pytest.raises(UserError, match=f"--config is given twice \\({first} and {second}\\); give it once") as raised:
        parse_args(["--config", str(first), "--config", str(second)])
    assert raised.value.rule == "settings.option_twice"
    with pytest.raises(UserError, match="expected key=value, got '=5': the key before '=' is empty") as raised:
        parse_args(["=5"])
    assert raised.value.rule == "settings.empty_key"
    dash = re.escape("'\u2013-config' starts with '\u2013' (U+2013), a dash that is not")
    with pytest.raises(UserError, match=dash) as raised:
        parse_args(["\u2013-config", str(first)])  # an en dash pasted from a web page
    assert raised.value.rule == "settings.option_dashes"
    with pytest.raises(UserError, match="'max_steps\uff1d2' has '\uff1d' \\(U\\+FF1D, a full-width equals "
                                        "sign\\)") as raised:
        parse_args(["max_steps\uff1d2"])
    assert raised.value.rule == "settings.full_width_equals"


@pytest.mark.parametrize("text, fragment", [
    ("max_steps: 2\nlearning_rate: !!python/object/apply:os.system ['true']\n",
     "a recipe holds plain values: remove the tag"),
    ("max_steps: 2\n---\nlearning_rate: 1.0e-3\n", "a recipe is one YAML document: remove the '---' line"),
    ("max_steps: 2\nmodel_config:\n\thidden_size: 8\n", "indent with spaces: YAML allows no tabs there"),
])  # fmt: skip
def test_a_recipe_with_a_python_tag_or_two_documents_says_the_fix(text, fragment, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(UserError, match=re.escape(fragment)):
        load_config(recipe)


def test_a_resume_names_the_runs_saved_config_when_it_was_edited(tmp_path):
    """The user never typed the bad value: the line names the file it is in, and the way out."""
    from finetune.cli import parse_command_line as parse_args

    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    resume = [f"output_dir={run}", "resume_from_checkpoint=latest"]
    (run / "config.yaml").write_text("task: text-classification\nlearning_rate: abc\n")
    with pytest.raises(UserError, match=re.escape(f"{run / 'config.yaml'}, the run's saved config: learning_rate must "
                                                  "be a number, got 'abc'; repair it there, or delete it")) as raised:  # fmt: skip
        parse_args(resume)
    assert raised.value.rule == "settings.saved_config_value"
    with pytest.raises(UserError, match="^learning_rate must be a number, got 'xyz'$"):  # the command line's own
        parse_args([*resume, "learning_rate=xyz"])
    # A check across settings that names one the command line gave (both set to null there): its own too.
    (run / "config.yaml").write_text("task: text-classification\nmodel_config: {model_type: bert}\n")
    with pytest.raises(UserError, match="^set model_name_or_path .* or model_config$") as raised:
        parse_args([*resume, "model_config=null", "model_name_or_path=null"])
    assert raised.value.rule == "settings.no_model"
    (run / "config.yaml").write_text("task: [text-classification\n")
    with pytest.raises(UserError, match="is not valid YAML .*; repair it, or delete it: a resume then reads the "
                                        "config saved in its checkpoint's manifest.json"):  # fmt: skip
        parse_args(resume)


def test_help_into_a_pipe_closed_early_ends_quietly(monkeypatch):
    """`finetune/run.py --help | head -1`: the reader leaves before the help is written; exit 0, no
    BrokenPipeError traceback (and none at exit, when Python flushes stdout again)."""
    import os
    import sys

    from finetune.cli import parse_command_line as parse_args

    read, write = os.pipe()
    os.close(read)
    out = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", out)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    out.write("x" * 100_000)
    out.flush()  # stdout now goes nowhere: a later flush cannot fail
    out.close()


OTHER = "settings.other_tasks_setting"


@pytest.mark.parametrize("settings, fragment, rule", [
    (["random_flip=true"], "random_flip=true augments training images; a text-classification run has none",
     "settings.augment_without_images"),
    (["label_all_tokens=true"], "label_all_tokens=true is a setting of token-classification runs, which a "
                                "text-classification run does not read: leave it out", OTHER),
    (["task=image-classification", "freeze_embeddings=false", "group_by_length=true", "max_length=32"],
     "group_by_length=true, max_length=32 are settings of multiple-choice, question-answering, text-classification and token-classification runs, "
     "which an image-classification run does not read: leave them out (or, if the task is wrong, set task=)", OTHER),
    (["augment=[crop]"], "augment=[crop] augments training images", "settings.augment_without_images"),
    (["task=image-classification", "freeze_embeddings=false", "tokenizer_name=data/bert_minilm_l6_uncased"],
     "is a setting of multiple-choice, question-answering, text-classification and token-classification runs, which an image-classification run does",
     OTHER),
    (["task=image-classification", "freeze_embeddings=false", "data_dir=/tmp/imgs", "output_dir=/tmp/imgs/train/run"],
     "output_dir /tmp/imgs/train/run is inside data_dir /tmp/imgs, where the image folder loader reads",
     "settings.output_inside_image_folder"),
    (["task=token-classification", "text_pair_column=tokens"], "a token-classification run tags one list of words",
     "settings.pair_for_tagging"),
    (["task=token-classification", "tags_column=tokens"], "tags_column is the tokens_column ('tokens')",
     "settings.tags_are_the_words"),
    (["label_columns=[pos,text]"], "label_columns holds 'text', an input column of the run",
     "settings.input_among_label_columns"),
    (["image_column=img"], "image_column=img is a setting of image-classification runs, which a text-classification "
                           "run does not read", OTHER),
    (["task=image-classification", "freeze_embeddings=false", "text_pair_column=foo"],
     "text_pair_column=foo is a setting of text-classification runs, which an image-classification run does not",
     OTHER),
    (["task=token-classification", "image_column=img"], "image_column=img is a setting of image-classification runs, "
                                                        "which a token-classification run does not read", OTHER),
    (["task=token-classification", "text_column=sentence"], "text_column=sentence is a setting of "
                                                            "text-classification runs", OTHER),
    (["task=token-classification", "label_column=foo"], "label_column=foo is a setting of image-classification, "
                                                        "multiple-choice and text-classification runs, which a "
                                                        "token-classification run",
     OTHER),
])  # fmt: skip
def test_settings_of_another_task_or_that_read_the_answer_are_refused(settings, fragment, rule):
    with pytest.raises(UserError, match=re.escape(fragment)) as raised:
        load_config(None, ["task=text-classification", *settings])
    assert raised.value.rule == rule


def test_a_multi_label_threshold_that_tuning_replaces_says_so(capsys):
    """multi_label_threshold=0.3 with tune_threshold on (the default): the tuned threshold replaces it after
    training, said in one line; with tune_threshold=off it is kept, and nothing is said."""
    for tune, said in (("global", True), ("off", False)):
        cfg = load_config(None, ["multi_label_threshold=0.3", f"tune_threshold={tune}", "metric_for_best_model=null"])
        told = checks.Said()
        resolved(cfg, told, problem_type="multi_label_classification")
        assert ("settings.threshold_replaced_by_tuning" in told.rules()) is said, told.rules()
        err = capsys.readouterr().err
        assert ("warning: multi_label_threshold=0.3 decides the labels while training; after it, tune_threshold=global "
                "replaces it" in err) is said, err


def test_a_list_written_as_one_string_reads_as_a_yaml_list(tmp_path):
    """label_names: neg, pos (a recipe line without brackets) is the list [neg, pos], not [neg, ' pos']."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("label_names: neg, pos\nreport_to: tensorboard,\nmodel_name_or_path: m\ntrain_file: t.csv\n")
    cfg = load_config(recipe, [])
    assert cfg.label_names == ["neg", "pos"] and cfg.report_to == ["tensorboard"]


def test_a_text_recipe_under_an_image_task_leaves_its_frozen_embeddings_out():
    """task=image-classification over the default (text) recipe: the recipe's freeze_embeddings has nothing
    to freeze and is left out; given on the command line, it is refused with how to turn it off."""
    assert load_config(None, ["task=image-classification"]).freeze_embeddings is False
    with pytest.raises(UserError, match="freeze_embeddings is for models with a word-embedding table, not "
                                        "image-classification: set freeze_embeddings=false"):  # fmt: skip
        load_config(None, ["task=image-classification", "freeze_embeddings=true"])


def test_a_key_given_twice_on_the_command_line_is_used_with_its_last_value_and_said(capsys):
    """As argparse, the last value wins, but with one warning line naming both; the same value twice is
    no mistake."""
    from finetune.cli import parse_command_line

    parse_command_line(["learning_rate=1e-4", "seed=3", "learning_rate=2e-4", "seed=3"])
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "learning_rate is given twice on the command line (learning_rate=1e-4, then learning_rate=2e-4); the last, 2e-4, is used" in err


def test_validation_split_percentage_beside_a_validation_file_is_said_not_read(capsys):
    """A share is held out only without a validation_file: given beside one, it would be ignored without a
    word; with validation_file=null it is read, and says nothing."""
    from finetune.cli import parse_command_line

    for settings, said in ((["validation_file=v.csv", "validation_split_percentage=20"], True),
                           (["validation_file=null", "validation_split_percentage=20"], False)):  # fmt: skip
        told = checks.Said()
        parse_command_line(["--config", "finetune/configs/bert_custom_files.yaml", "train_file=t.csv", *settings], told)
        assert told.rules() == (["settings.split_share_unread"] if said else []), told.rules()
        err = capsys.readouterr().err
        assert ("validation_split_percentage=20 is not read: a share of the training data is held out only without "
                "a validation_file (this run's: ") in err if said else err == ""


def test_transformers_flags_are_answered_wherever_they_stand(capsys):
    """`--do_train` before other settings: its own line, not "unrecognized arguments: --do_train output_dir=..."."""
    from finetune.cli import parse_command_line as parse_args

    for argv in (["--do_train", "output_dir=runs/x"], ["learning_rate=1e-4", "--do_eval", "seed=3"]):
        with pytest.raises(UserError, match=r"^--do_(train|eval) is a flag of transformers' scripts, not of this one: "
                                            r"a run (always trains|evaluates on validation_file)") as raised:  # fmt: skip
            parse_args(argv)
        assert raised.value.rule == "settings.flag_of_other_tools"


@pytest.mark.parametrize(
    ("spec", "hint", "rule"),
    [
        ("last", "; the newest checkpoint is resume_from_checkpoint=latest (lower case)", "runs.latest_misspelt"),
        ("runs/x/checkpoint-2", "; a run's checkpoints are <output_dir>/checkpoints/step-<step, 8 digits> (Trainer's "
                                "checkpoint-N): resume_from_checkpoint=<output_dir>/checkpoints/step-00000002, or latest",
         "runs.trainer_checkpoint_name"),
        ("step-2", "; a run's checkpoints are <output_dir>/checkpoints/step-<step, 8 digits>: give the path, "
                   "resume_from_checkpoint=<output_dir>/checkpoints/step-00000002, or latest",
         "runs.checkpoint_name_not_found"),
    ],
)  # fmt: skip
def test_a_checkpoint_named_the_trainers_way_gets_the_apps_name(spec, hint, rule, small_text_data, tmp_path, capsys):
    argv = tiny_text_args(small_text_data, tmp_path / "run", f"resume_from_checkpoint={spec}")
    line = user_error(capsys, main, argv, rule=rule)
    assert line.endswith(f"checkpoint not found: {spec}{hint}")


def test_model_config_keys_beside_a_pretrained_model_say_what_model_config_is():
    """model_config.hidden_dropout_prob=0.2 with the MiniLM: the user meant to change the pretrained
    model's config; the line says model_config builds a new model, and where its dropout is set."""
    with pytest.raises(UserError, match=r"^model_config.hidden_dropout_prob beside model_name_or_path: model_config "
                                        r"builds a new model .* its dropout is set with "
                                        r"dropout=0.2$") as raised:  # fmt: skip
        load_config(None, ["model_config.hidden_dropout_prob=0.2"])
    assert raised.value.rule == "settings.model_config_key_beside_name"
    with pytest.raises(UserError, match=r"^model_config needs a model_type") as raised:
        load_config(None, ["model_name_or_path=null", "model_config.hidden_size=32"])
    assert raised.value.rule == "settings.model_config_without_type"


def test_a_share_where_a_count_of_steps_goes_names_the_setting_of_the_share():
    """warmup_steps=0.1: transformers' Trainer reads a number below 1 as a share of the training; here it
    is a count, and the share has its own setting."""
    with pytest.raises(UserError, match=r"^warmup_steps=0.1 is a count of optimizer steps here, .*: "
                                        r"set warmup_ratio=0.1$") as raised:
        load_config(None, ["warmup_steps=0.1"])
    assert raised.value.rule == "settings.steps_as_a_share"
    with pytest.raises(UserError, match=r"^eval_steps=0.25 is a count of optimizer steps here, .*: give a count of"):
        load_config(None, ["eval_steps=0.25"])
    with pytest.raises(UserError, match=r"^warmup_steps must be an integer, got 2.5$"):
        load_config(None, ["warmup_steps=2.5"])


def test_a_list_the_shell_split_at_its_space_says_to_quote_it_and_a_broken_one_to_check_it():
    """label_names=[negative, positive] unquoted reaches the app as 'label_names=[negative,' and 'positive]':
    the line says the shell split it and how to quote it; a list that closes but does not parse is checked."""
    with pytest.raises(UserError, match=r"^label_names=\[negative,: the value opens a YAML list with '\[' and never "
                                        r"closes it: the shell splits a value at its spaces; quote it "
                                        r"\(label_names='\[negative, \.\.\.\]'\) or leave out the "
                                        r"spaces$") as raised:  # fmt: skip
        load_config(None, ["label_names=[negative,", "positive]"])
    assert raised.value.rule == "settings.value_unclosed"
    with pytest.raises(UserError, match=r"that does not parse .*; check the closing '\]' and the commas$") as raised:
        load_config(None, ["label_names=[a, [b]"])
    assert raised.value.rule == "settings.value_not_yaml"


def test_a_data_file_and_an_image_folder_both_named_are_refused():
    """train_file and data_dir (an image folder) on one command line: the loader would read one and leave the
    other unread while config.yaml recorded both; one line names both and the fix."""
    recipe = CONFIGS_DIR / "vit_imagefolder.yaml"
    with pytest.raises(UserError, match=r"^train_file=r.csv and data_dir=imgs both name the training data; give one: "
                                        r"train_file= for a data file \(data_dir=null\), data_dir= for an image folder "
                                        r"\(train_file=null\)$") as raised:  # fmt: skip
        load_config(recipe, ["data_dir=imgs", "train_file=r.csv"])
    assert raised.value.rule == "settings.file_and_image_folder"
    assert load_config(recipe, ["train_file=r.csv"]).data_dir is None  # one named: the recipe's other is dropped
