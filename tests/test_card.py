"""finetune/card.py: the model card (front matter the Hub reads, sections, secrets redacted, no machine
paths, a usage example that fits the task and runs on the export) and the Hub upload with a fake HfApi.
The cards are written into a copy of the factory's two-epoch run.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_card.py
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import huggingface_hub
import pytest
import yaml
from conftest import (
    REPO,
    predicted_by_evaluate,
    reset_accelerate,
    rotten_rows,
    save_tiny_bert,
    tiny_text_args,
    write_csv,
)

from finetune.card import check_hub_access, describe_data, push_to_hub, redact, write_model_card
from finetune.config import DataArgs, config_from_dict
from finetune.errors import UserError
from finetune.run import main

SECRET = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuV"


def _card(two_epoch_run, config_extra=None, **kwargs):
    """Write the card of the tiny run's export; returns its path."""
    out, results = two_epoch_run
    config = {**yaml.safe_load((out / "config.yaml").read_text()), **(config_extra or {})}
    return write_model_card(
        out / "model",
        config=config,
        labels=results["label_names"],
        results=results,
        # the data section as written (config_extra plants secrets no validation would let through)
        data_description=describe_data(DataArgs(**{f.name: config.get(f.name) for f in dataclasses.fields(DataArgs)})),
        **kwargs,
    )


SECTIONS = (
    "## Base model",
    "## Data",
    "## Training hyperparameters",
    "## Metrics",
    "## Labels",
    "## How to use",
    "## How it was trained",
)


def test_model_card_of_a_model_built_from_config(two_epoch_run):
    path = _card(
        two_epoch_run,
        base_model=None,
        num_processes=2,
        mixed_precision="no",
        command=f"accelerate launch finetune/run.py learning_rate=1e-3 secret={SECRET}",
    )
    assert path.name == "README.md" and path.read_text().startswith("---\n")
    card = huggingface_hub.ModelCard.load(path)  # the Hub's own parser reads the front matter back
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "text-classification"
    assert data.base_model is None and data.license is None and data.datasets is None
    assert data.tags == ["finetune", "text-classification", "bert"]
    assert data.metrics == ["accuracy", "f1"]
    _, results = two_epoch_run
    validation = results["validation"]
    assert data.model_name == "run"
    assert [(r.dataset_type, r.dataset_split, r.metric_type, r.metric_value) for r in data.eval_results] == [
        ("csv", "validation", "accuracy", validation["accuracy"]),
        ("csv", "validation", "f1", validation["macro_f1"]),
    ]
    assert data.eval_results[1].metric_args == {"average": "macro"}
    text = card.text  # the body, after the front matter
    assert [line for line in text.splitlines() if line.startswith("## ")] == list(SECTIONS)
    assert "A 2-class text classifier (`bert`) trained from random initialisation." in text
    assert "None: the weights were initialised at random from `model_config`:" in text
    assert "| learning_rate | 0.001 |" in text and "| global batch size | 16 |" in text
    assert "| mixed_precision | no |" in text and f"| optimizer steps | {results['step']} |" in text
    assert f"| validation | {validation['accuracy']:.4f} | {validation['macro_f1']:.4f} |" in text
    assert "with per-class validation metrics" in text and "| 0 | `0` |" in text
    assert 'pipeline("text-classification"' in text
    assert "accelerate launch finetune/run.py learning_rate=1e-3 secret=<redacted>" in text
    assert SECRET not in text
    assert "finetune 0.1.0" in text and "train.csv" in text
    # a blank line ends every table: Markdown otherwise reads the next line as one more of its rows (a run
    # without a best checkpoint had "These weights are ..." right under the metrics)
    out, results = two_epoch_run
    for kept in (results, {k: v for k, v in results.items() if k != "best"}):
        lines = _card((out, kept), base_model=None).read_text().splitlines()
        ends = [i for i, line in enumerate(lines[:-1]) if line.startswith("|") and not lines[i + 1].startswith("|")]
        assert ends and all(lines[i + 1] == "" for i in ends), [lines[i + 1] for i in ends]


def test_a_label_with_a_pipe_or_a_line_break_stays_in_its_cell_of_the_labels_table(two_epoch_run):
    """A class named `n|e` or with a line break in it (label_names may say so) keeps the card's tables whole:
    every row of the labels table has the table's number of cells, each name written escaped."""
    out, results = two_epoch_run
    names = ["n|e: u", "ne\ng<b>"]
    path = write_model_card(out / "model", config=yaml.safe_load((out / "config.yaml").read_text()), labels=names,
                            results=results, base_model=None, data_description="data")  # fmt: skip
    text = path.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert rows == [line for line in rows if "n\\|e: u" in line or "ne\\ng<b>" in line] and len(rows) == 2
    header = next(line for line in text.splitlines() if line.startswith("| id |") or line.startswith("| Id |"))
    assert all(row.replace("\\|", "").count("|") == header.count("|") for row in rows), rows


def test_model_card_names_a_hub_base_model_and_leaks_no_secret(two_epoch_run, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("the card must not fetch anything from the Hub")

    monkeypatch.setattr(huggingface_hub.repocard, "hf_hub_download", no_download)
    extra = {
        "hub_token": SECRET,
        "wandb_api_key": "x" * 40,
        "report_to": [f"https://user:pw@example.com/{SECRET}"],
        "model_config": None,
        "model_name_or_path": "bert-base-uncased",
        "tokenizer_name": "bert-base-uncased",
    }
    path = _card(
        two_epoch_run,
        base_model="bert-base-uncased",
        license="apache-2.0",
        config_extra=extra,
        repo_id="someone/tiny-bert-sentiment",
    )
    card = huggingface_hub.ModelCard.load(path)
    assert card.data.base_model == "bert-base-uncased" and card.data.license == "apache-2.0"
    assert card.data.model_name == "tiny-bert-sentiment"
    assert "fine-tuned from [bert-base-uncased](https://huggingface.co/bert-base-uncased)." in card.text
    text = path.read_text()
    assert SECRET not in text and "hub_token" not in text and "wandb_api_key" not in text
    assert "user:pw" not in text and "<redacted>" in text
    assert "tokenizer_name: bert-base-uncased" in text  # 'token' inside a word is not a secret
    assert 'model="someone/tiny-bert-sentiment"' in text
    # Without a licence given, a Hub base model's card is not downloaded to find one.
    assert (
        huggingface_hub.ModelCard.load(_card(two_epoch_run, base_model="bert-base-uncased")).data.license is None
    )


def test_a_local_base_model_is_not_put_in_the_front_matter(two_epoch_run, tmp_path):
    local = tmp_path / "my-bert"
    local.mkdir()
    (local / "README.md").write_text("---\nlicense: mit\ntags: [bert]\n---\n# my bert\n")
    path = _card(two_epoch_run, base_model=str(local))
    card = huggingface_hub.ModelCard.load(path)
    assert card.data.base_model is None and card.data.license == "mit"  # licence read from its own card
    # a local path as the card travels: its last two parts, never the machine's absolute path
    assert f"fine-tuned from the local model `.../{local.parent.name}/my-bert`" in card.text and str(local) not in card.text
    assert "write the path of your own copy there" in card.text
    (local / "README.md").write_text("---\nlicense: [unclosed\n---\n")  # a broken card: no licence
    assert huggingface_hub.ModelCard.load(_card(two_epoch_run, base_model=str(local))).data.license is None


def test_model_card_with_a_test_split_hub_dataset_and_best_checkpoint(two_epoch_run):
    out, results = two_epoch_run
    results = {
        **results,
        "test": results["validation"],
        "best": {"metric": "accuracy", "value": 0.5, "step": 4},
    }
    config = {**yaml.safe_load((out / "config.yaml").read_text()), "dataset_name": "stanfordnlp/sst2"}
    config.update(dataset_config_name="default", train_file=None, validation_file=None)
    path = write_model_card(
        out / "model",
        config=config,
        labels=results["label_names"],
        results=results,
        base_model=None,
        data_description=describe_data(config_from_dict(config, saved=True).data_args),
    )
    card = huggingface_hub.ModelCard.load(path)
    assert card.data.datasets == ["stanfordnlp/sst2"]
    assert {(r.dataset_type, r.dataset_config, r.dataset_split) for r in card.data.eval_results} == {
        ("stanfordnlp/sst2", "default", "validation"),
        ("stanfordnlp/sst2", "default", "test"),
    }
    assert "| test | " in card.text and "with per-class test metrics" in card.text
    assert "Best checkpoint by validation accuracy: 0.5000 at step 4." in card.text
    assert "the Hub dataset `stanfordnlp/sst2` (config `default`)" in card.text


def test_redact_at_any_depth():
    config = {"model_config": {"api_key": "k", "hidden_size": 32}, "devices": [SECRET], "tokenizer_name": "t"}
    assert redact(config) == {
        "model_config": {"hidden_size": 32},
        "devices": ["<redacted>"],
        "tokenizer_name": "t",
    }


class FakeHfApi:
    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))


def test_push_to_hub_creates_a_private_repo_and_uploads_the_export(two_epoch_run, monkeypatch):
    out, _ = two_epoch_run
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    FakeHfApi.calls = []
    url = push_to_hub(out / "model", "someone/tiny-bert", token="t0k")
    assert url == "https://huggingface.co/someone/tiny-bert"
    init, create, upload = FakeHfApi.calls
    assert init == ("init", "t0k")
    assert create == (
        "create_repo",
        "someone/tiny-bert",
        {"private": True, "repo_type": "model", "exist_ok": True},
    )
    assert upload[1]["repo_id"] == "someone/tiny-bert" and upload[1]["folder_path"] == out / "model"


def test_push_to_hub_offline_refuses_before_any_network(two_epoch_run, monkeypatch):
    out, _ = two_epoch_run
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    class NoApi:
        def __init__(self, *args, **kwargs):
            raise AssertionError("HfApi must not be built offline")

    monkeypatch.setattr(huggingface_hub, "HfApi", NoApi)
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set.*hf upload someone/tiny-bert") as e:
        push_to_hub(out / "model", "someone/tiny-bert")
    assert e.value.rule == "tools.hub_offline"
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set"):  # the early check, before training
        check_hub_access("someone/tiny-bert")


def test_push_to_hub_needs_an_export(tmp_path):
    with pytest.raises(UserError, match="not an exported model") as e:
        push_to_hub(tmp_path, "someone/x")
    assert e.value.rule == "tools.not_an_export"


@pytest.mark.parametrize(
    ("error", "rule", "fragment"),
    [("token", "tools.hub_not_logged_in", "cannot push to 'someone/tiny-bert': not logged in to the Hub"),
     ("refused", "tools.hub_push_failed", "cannot push to the Hub repo 'someone/tiny-bert': 403 Forbidden")],
)  # fmt: skip
def test_a_push_the_hub_refuses_is_one_line(two_epoch_run, monkeypatch, error, rule, fragment):
    """No token, or the Hub's refusal (a fake HfApi raises what huggingface_hub would): one line each."""
    from huggingface_hub.errors import LocalTokenNotFoundError

    out, _ = two_epoch_run
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    class Refusing(FakeHfApi):
        def create_repo(self, repo_id, **kwargs):
            raise LocalTokenNotFoundError("no token") if error == "token" else ConnectionError("403 Forbidden\nmore")

    monkeypatch.setattr(huggingface_hub, "HfApi", Refusing)
    with pytest.raises(UserError, match=re.escape(fragment)) as e:
        push_to_hub(out / "model", "someone/tiny-bert")
    assert e.value.rule == rule


def test_the_verdict_is_a_warning_of_the_run_and_of_its_card(two_epoch_run):
    """The tiny run's 10 steps do not beat the trivial baseline: a warning of the run, kept in results.json
    with its rule, and the card's **Warning:** line says the same."""
    out, results = two_epoch_run
    learned = results["learned"]
    assert learned["warn"], learned
    rule = "tools.did_not_learn" if learned["verdict"] is False else "tools.too_few_to_judge"
    (said,) = [w["line"] for w in results["warnings"] if w["rule"] in ("tools.did_not_learn", "tools.too_few_to_judge")]
    assert [w["rule"] for w in results["warnings"] if w["line"] == said] == [rule]
    assert said == learned["said"] and f"**Warning:** {said}." in (out / "model" / "README.md").read_text()


def test_the_verdict_rules_say_what_judge_found():
    """A verdict of False is `tools.did_not_learn`; a validation too small to tell, `tools.too_few_to_judge`;
    learned, nothing; classes never predicted on validation, `tools.never_predicted`."""
    from types import SimpleNamespace

    from finetune import checks
    from finetune.checks import tools
    from finetune.verdict import judge

    cfg = SimpleNamespace(problem_type="single_label_classification", metric_for_best_model="accuracy")
    for value, n, rules in [(0.5, 400, ["tools.did_not_learn"]), (1.0, 5, ["tools.too_few_to_judge"]), (0.9, 400, [])]:
        said = checks.Said()
        checks.gate(tools.VERDICT, judge(cfg, {"accuracy": value, "num_samples": n, "baseline": {"accuracy": 0.5}}, {}),
                    said=said)  # fmt: skip
        assert said.rules() == rules
    said = checks.Said()  # a run whose texts were cut: the verdict says how to read more of them
    checks.gate(tools.VERDICT, judge(cfg, {"accuracy": 0.5, "num_samples": 400, "baseline": {"accuracy": 0.5}}, {}),
                ["inputs.texts_cut"], said=said)  # fmt: skip
    assert "raise max_length or read them whole in windows (text_windows" in said.lines[0][1]
    said = checks.Said()
    checks.gate(tools.PREDICTED, ["cat"], ["cat", "dog"], "single_label_classification", said=said)
    checks.gate(tools.PREDICTED, [], ["cat", "dog"], "single_label_classification", said=said)
    assert said.lines == [("tools.never_predicted", "1 of 2 classes were never predicted on validation ('cat'); rare "
                           "ones need more examples, class_weights=balanced, or more training")]  # fmt: skip


def test_describe_data_names_an_image_folder_and_the_held_out_split():
    image = config_from_dict(
        {"task": "image-classification", "model_config": {"model_type": "vit"}, "data_dir": "/x/imgs"}
    )
    assert "the `imagefolder` directory `.../x/imgs`" in describe_data(image.data_args)  # no absolute path
    text = config_from_dict(
        {"task": "text-classification", "model_name_or_path": "m", "train_file": "/x/t.csv", "text_pair_column": "b",
         "max_train_samples": 9}
    )
    described = describe_data(text.data_args)
    assert "text column `text` paired with `b`" in described and "stratified 10.0%" in described
    assert "train 9" in described


def usage_code(card_text: str) -> str:
    """The Python block under "## How to use"."""
    return card_text.split("## How to use", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"text_pair_column": "hypothesis"},
         ['classify({"text": "the first sentence", "text_pair": "the second sentence"})']),
        ({"problem_type": "regression", "label_column": "score"},
         ['function_to_apply="none")', "the predicted number"]),
        ({"problem_type": "multi_label_classification", "multi_label_threshold": 0.3},
         ["top_k=None)", "[scores] = classify([", 'labels = [s["label"] for s in scores if s["score"] >= 0.3]']),
        ({"task": "image-classification", "image_column": "image", "text_column": None},
         ['pipeline("image-classification"', 'classify("path/to/image.png")']),
        ({"task": "token-classification", "problem_type": "token_classification", "label_all_tokens": False},
         ['pipeline("token-classification"', 'aggregation_strategy="first"', 'tag("Ada Lovelace']),
    ],
    ids=["sentence pair", "regression", "multi-label", "image", "tokens"],
)  # fmt: skip
def test_the_usage_example_fits_the_task(two_epoch_run, extra, expected):
    code = usage_code(_card(two_epoch_run, config_extra=extra, base_model=None).read_text())
    for piece in expected:
        assert piece in code, code
    if "task" not in extra and "problem_type" not in extra:  # the movie-review line is for single texts only
        assert "a text like those of" not in code
    compile(code, "usage", "exec")  # it is Python


@pytest.mark.parametrize("extra", [{"text_pair_column": "hypothesis"}, {"problem_type": "regression"}],
                         ids=["sentence pair", "regression"])  # fmt: skip
def test_the_usage_example_runs_on_the_export(two_epoch_run, extra, monkeypatch):
    """The card's own code, as a reader copies it, loads the export and calls it (the tiny model is a
    2-class one: the call runs, whatever the head means)."""
    out, _ = two_epoch_run
    code = usage_code(_card(two_epoch_run, config_extra=extra, base_model=None).read_text())
    monkeypatch.chdir(out.parent)  # the card names an export outside the repository as "run/model"
    namespace: dict = {}
    exec(code.replace("classify(", "result = classify(").replace("result = classify = ", "classify = "),
         namespace)  # fmt: skip
    assert namespace["result"], code


def _no_machine_paths(text: str, *roots) -> None:
    for root in (*roots, REPO, Path.home()):
        assert str(root) not in text, f"{root} in the card"
    # no absolute path of any machine: a "/" right after a space, quote, "=" or "(" starts one
    assert not re.findall(r"(?:^|[\s`'\"=(\[])/[A-Za-z0-9_.~-]", text, flags=re.MULTILINE), re.findall(
        r"(?:^|[\s`'\"=(\[])/[^\s`'\"]*", text, flags=re.MULTILINE)


def test_the_card_holds_no_absolute_path_and_keeps_the_first_command_after_a_resume(tmp_path, monkeypatch):
    """Data files, a local base model and the command, all given as absolute paths outside the repository:
    the card names none of them absolutely. A run stopped after its step-2 checkpoint and resumed with
    another command line: the card shows the first command, which trained the model."""
    base = save_tiny_bert(tmp_path / "base-bert")  # a local pretrained model, as a user's own folder
    data = {"train": write_csv(tmp_path / "train.csv", rotten_rows(37)),
            "validation": write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100))}  # fmt: skip
    out = tmp_path / "run"
    first = [*tiny_text_args(data, out), "model_config=null", f"model_name_or_path={base}", "tokenizer_name=null",
             "max_steps=4", "save_steps=2", "per_device_train_batch_size=8"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["finetune/run.py", *first])
    monkeypatch.setenv("FINETUNE_TEST_FAIL_RANK", "0")
    monkeypatch.setenv("FINETUNE_TEST_FAIL_STEP", "3")  # a crash after step 3: the step-2 checkpoint is kept
    with pytest.raises(RuntimeError, match="injected failure"):
        main(first)
    reset_accelerate()  # the crashed run left its Accelerator behind
    monkeypatch.delenv("FINETUNE_TEST_FAIL_RANK")
    monkeypatch.delenv("FINETUNE_TEST_FAIL_STEP")
    again = [*first, "resume_from_checkpoint=latest"]
    monkeypatch.setattr(sys, "argv", ["finetune/run.py", *again])
    results = main(again)
    assert results["step"] == 4
    text = (out / "model" / "README.md").read_text()
    launched = text.split("The training command", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert launched.startswith("accelerate launch finetune/run.py task=text-classification")
    assert "resume_from_checkpoint" not in launched and "save_steps=2" in launched
    # the config to train it again from is a fresh run's: with `latest` in it, it looked for checkpoints
    resolved = yaml.safe_load(text.split("```yaml\n", 1)[1].split("\n```", 1)[0])
    assert resolved["resume_from_checkpoint"] is None and resolved["save_steps"] == 2
    # Shortened paths are marked, and the card says to write one's own there: the command is not run as printed.
    assert "train_file=run/train.csv" not in launched and f"train_file=.../{tmp_path.name}/train.csv" in launched
    assert f"the local model `.../{tmp_path.name}/base-bert`" in text
    assert "shown by their last two parts after `.../`:\nwrite the path of your own copy there." in text
    _no_machine_paths(text, tmp_path)


def test_the_cards_multi_label_example_applies_the_tuned_thresholds(multi_label_export, tmp_path, monkeypatch):
    """A pipeline() applies no threshold; the card's example applies config.multi_label_thresholds, and
    its labels are the ones finetune/evaluate_checkpoint.py predicts."""
    card = (multi_label_export / "README.md").read_text()
    code = card.split("## How to use", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "config.multi_label_thresholds" in code
    text = "the cat saw a dog"
    code = code.replace('"a text like those of the `text` column"', repr(text))
    monkeypatch.chdir(multi_label_export.parent.parent)  # the card names an export outside the repository "run/model"
    namespace: dict = {}
    exec(code, namespace)
    thresholds = json.loads((multi_label_export / "config.json").read_text())["multi_label_thresholds"]
    assert thresholds != [0.5] * 3  # else the example's thresholds could not be told from a pipeline's 0.5
    expected = predicted_by_evaluate(multi_label_export, [{"text": text, "labels": ["cat"]}], tmp_path / "ev")
    assert sorted(namespace["labels"]) == expected
