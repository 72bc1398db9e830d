"""finetune/models.py: where the config meets the model. Frozen embeddings and lower layers, gradient
checkpointing, dropout, a mistake inside model_config, tokenizers without a padding token, and the
safe defaults (no remote code, safetensors only).

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_models.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import (
    REPO,
    TINY_BERT,
    TOKENIZER,
    recipe_text_args,
    reset_accelerate,
    rotten_rows,
    tiny_text_args,
    user_error,
    write_csv,
)
from safetensors.torch import load_file

import finetune.run as run_module
from finetune.config import load_config
from finetune.run import main


def _write_tokenizer(folder: Path, special: list[str]) -> Path:
    """A byte-level BPE tokenizer (GPT-2's kind) trained here on a few sentences, with only `special`:
    ["<|endoftext|>"] is GPT-2's case, a tokenizer with an end-of-text token and no padding token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator([row["text"] for row in rotten_rows(200)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=special[0] if special else None)
    assert fast.pad_token is None and fast.unk_token is None
    fast.save_pretrained(folder)
    return folder


TEXT = "text-classification"
GPT2 = "{model_type: gpt2, n_embd: 32, n_layer: 2, n_head: 4, n_positions: 64}"


@pytest.mark.parametrize("model", [GPT2, TINY_BERT], ids=["gpt2-config-without-pad", "bert-config-with-pad-0"])
def test_a_tokenizer_with_only_an_end_of_text_token_pads_with_it(model, small_text_data, tmp_path):
    """Whatever the model's config says of padding (GPT-2's: nothing; BERT's: id 0), the tokenizer pads
    the batches: without a padding token it pads with its end-of-text token, as transformers' examples
    do, and the model is told that id (instead of ValueError "Asking to pad..." at the first batch)."""
    tokenizer = _write_tokenizer(tmp_path / "tok", ["<|endoftext|>"])
    out = tmp_path / "run"
    results = main(recipe_text_args(small_text_data, out, f"model_config={model}", f"tokenizer_name={tokenizer}", "max_steps=2"))
    assert results["validation"]["num_samples"] == 13
    eos = json.loads((tokenizer / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    assert json.loads((out / "model" / "config.json").read_text())["pad_token_id"] == eos
    saved = json.loads((out / "model" / "tokenizer_config.json").read_text())
    assert saved["pad_token"] == "<|endoftext|>"


def test_a_model_without_a_padding_token_trains(small_text_data, tmp_path):
    """GPT-2's config has no padding token: the tokenizer's is set on it."""
    results = main(recipe_text_args(small_text_data, tmp_path / "run", f"model_config={GPT2}", "max_steps=2"))
    assert results["validation"]["num_samples"] == 13
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["pad_token_id"] == 0  # the BERT tokenizer's [PAD]


def test_a_tokenizer_that_cannot_pad_is_refused_before_anything_is_written(small_text_data, tmp_path, capsys):
    tokenizer = _write_tokenizer(tmp_path / "tok", [])
    out = tmp_path / "run"
    line = user_error(capsys, main, recipe_text_args(small_text_data, out, f"tokenizer_name={tokenizer}", "max_steps=2"),
                      rule="models.no_padding_token")
    assert "has no padding token, and no end-of-text or unknown token to pad with" in line
    assert not out.exists()


def test_trust_remote_code_is_off_and_weights_are_safetensors_by_default(monkeypatch, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.config import load_config
    from finetune.models import build_model, load_preprocessor

    calls = []
    for cls in (AutoModelForSequenceClassification, AutoTokenizer):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            calls.append((klass.__name__, kwargs))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    cfg = load_config(None, [f"output_dir={tmp_path}"])  # the default recipe: the bundled MiniLM
    assert cfg.trust_remote_code is False and cfg.allow_pickle_weights is False
    load_preprocessor(cfg.model_args)
    build_model(cfg.model_args, ["0", "1"])
    assert {name for name, _ in calls} == {"AutoModelForSequenceClassification", "AutoTokenizer"}
    assert all(kwargs["trust_remote_code"] is False for _, kwargs in calls)
    model_kwargs = [kw for name, kw in calls if name == "AutoModelForSequenceClassification"]
    assert all(kw["use_safetensors"] is True for kw in model_kwargs)


def test_frozen_embeddings_stay_as_built_and_the_rest_trains(small_text_data, tmp_path):
    from accelerate.utils import set_seed

    from finetune.models import build_model, load_preprocessor

    out = tmp_path / "run"
    args = tiny_text_args(small_text_data, out, "max_steps=3", "freeze_embeddings=true", "save_steps=3")
    cfg = load_config(None, args)
    set_seed(cfg.seed)  # as train() does before building: the same initial weights
    model = build_model(cfg.model_args, ["0", "1"], vocab_size=len(load_preprocessor(cfg.model_args)))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    main(args)
    trained = load_file(out / "model" / "model.safetensors")
    word = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(trained[word], initial[word])
    for name in (
        "bert.embeddings.position_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
    ):
        assert not torch.equal(trained[name], initial[name]), name
    # The optimizer holds state for the trainable weights only.
    optimizer = torch.load(next((out / "checkpoints").glob("step-*")) / "optimizer.bin", weights_only=True)
    assert len(optimizer["state"]) == len(list(model.parameters())) - 1


@pytest.mark.slow  # ~10 s
def test_gradient_checkpointing_recomputes_layers_and_changes_no_numbers(
    small_text_data, tmp_path, monkeypatch
):
    from transformers.models.bert import modeling_bert

    # Counted inside the layer: a checkpointed layer runs its feed-forward again in backward.
    calls = []
    original = modeling_bert.BertIntermediate.forward

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_bert.BertIntermediate, "forward", counting)
    runs = {}
    for flag in ("false", "true"):
        calls.clear()
        out = tmp_path / flag
        main(tiny_text_args(small_text_data, out, "max_steps=3", f"gradient_checkpointing={flag}"))
        runs[flag] = len(calls), load_file(out / "model" / "model.safetensors")
    # 3 steps x 2 layers run again in backward; evaluation calls the layers the same way in both runs.
    assert runs["true"][0] == runs["false"][0] + 3 * 2
    plain, checkpointed = runs["false"][1], runs["true"][1]
    assert max((plain[k] - checkpointed[k]).abs().max().item() for k in plain) <= 1e-6


def test_freeze_layers_keeps_embeddings_and_lower_layers_as_loaded(small_text_data, tmp_path, monkeypatch, capsys):
    initial = {}
    real_build = run_module.build_model

    def build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        initial.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(run_module, "build_model", build)
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=3", "freeze_layers=1"))
    trained = load_file(out / "model" / "model.safetensors")
    changed = {k for k in trained if not torch.equal(trained[k], initial[k])}
    frozen = {k for k in trained if k.startswith(("bert.embeddings.", "bert.encoder.layer.0."))}
    assert frozen and not frozen & changed, frozen & changed
    # the layer above and the head trained
    assert any(k.startswith("bert.encoder.layer.1.") for k in changed) and "classifier.weight" in changed
    # the model was built at random from model_config: its frozen layers stay random, which is said
    assert "warning: freeze_layers=1 freezes the embeddings and layers of a model built at random" in capsys.readouterr().err


def test_frozen_embeddings_of_a_model_built_at_random_are_said(small_text_data, tmp_path, capsys):
    """freeze_embeddings=true (the default recipe's) on a model from model_config: its random word embeddings
    would stay random; one warning, as for freeze_layers. Silent when they are not frozen."""
    main(tiny_text_args(small_text_data, tmp_path / "a", "max_steps=1", "freeze_embeddings=true"))
    assert "warning: freeze_embeddings=true freezes the word embeddings of a model built at random" in (
        capsys.readouterr().err)
    main(tiny_text_args(small_text_data, tmp_path / "b", "max_steps=1"))
    assert "freeze_embeddings" not in capsys.readouterr().err
    main(tiny_text_args(small_text_data, tmp_path / "c", "max_steps=1", "peft={r: 4}"))  # LoRA: the same
    assert "warning: peft (LoRA) freezes every weight but its adapters and the head of a model built at random" in (
        capsys.readouterr().err)


@pytest.mark.parametrize(
    ("extra", "message", "rule"),
    [
        (["freeze_layers=3"], "freeze_layers=3 but BertForSequenceClassification has 2 encoder layers",
         "models.freeze_layers_past_the_model"),
        (["freeze_layers=-1"], "freeze_layers must be >= 0", "settings.out_of_range"),
        (["freeze_layers=1", "peft={r: 4}"], "freeze_layers and peft together", "settings.freeze_layers_with_lora"),
    ],
)
def test_freeze_layers_mistakes(small_text_data, tmp_path, capsys, extra, message, rule):
    out = tmp_path / "run"
    assert message in user_error(capsys, main, tiny_text_args(small_text_data, out, "max_steps=1", *extra), rule=rule)
    assert not out.exists()


def test_freeze_layers_on_a_model_without_known_layers_is_one_line():
    from finetune.errors import UserError
    from finetune.models import freeze_layers

    with pytest.raises(UserError, match="freeze_layers: Linear has no embeddings and encoder layers") as e:
        freeze_layers(torch.nn.Linear(2, 2), 1)
    assert e.value.rule == "models.freeze_layers_unknown_model"


def test_dropout_override_reaches_the_model(small_text_data, tmp_path):
    out = tmp_path / "run"
    main(tiny_text_args(small_text_data, out, "max_steps=1", "dropout=0.3"))
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["hidden_dropout_prob"] == 0.3 and config["attention_probs_dropout_prob"] == 0.3


@pytest.mark.parametrize(
    "setting, message, rule",
    [
        ("model_config.image_sise=32", "ViTConfig has no setting 'image_sise'; did you mean image_size?",
         "models.model_config_unknown_key"),
        ("model_config.image_size=big", "cannot build a image-classification model from model_config: Validation "
                                        "error for field 'image_size': TypeError: Field 'image_size' with value "
                                        "'big'", "models.model_config_rejected"),
        # ViT itself would drop the remainder of 64 / 3 without a word
        ("model_config.num_attention_heads=3", "hidden_size 64 is not a multiple of num_attention_heads 3",
         "models.heads_do_not_divide"),
        ("model_config.patch_size=0", "model_config.patch_size=0: it must be 1 or more",
         "models.size_below_one"),
    ],
)
def test_a_mistake_inside_model_config_is_one_line(tmp_path, capsys, setting, message, rule):
    from conftest import user_error

    recipe = str(REPO / "finetune/configs/vit_imagefolder.yaml")
    assert message in user_error(capsys, main, ["--config", recipe, setting, f"output_dir={tmp_path / 'o'}"],
                                 rule=rule)
    assert not (tmp_path / "o").exists()


def test_a_local_model_folder_with_a_broken_config_has_no_download_hint(tmp_path, capsys):
    """HF_HUB_OFFLINE's "download it while online" is for a hub name, not for a folder on disk."""
    from finetune.errors import UserError
    from finetune.models import load_error

    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert",')
    line = user_error(capsys, main, [*tiny_text_args({"train": REPO / "data/rotten_tomatoes/train.csv",
                                                      "validation": REPO / "data/rotten_tomatoes/validation.csv"},
                                                     tmp_path / "out"), "model_config=null",
                                     f"model_name_or_path={folder}", f"tokenizer_name={REPO / 'data/bert_minilm_l6_uncased'}"],
                      str(folder), untouched=folder, rule="models.load_failed")  # fmt: skip
    assert "HF_HUB_OFFLINE" not in line and "download" not in line
    hub = load_error("model", "someone/not-here", OSError("not cached"))
    assert isinstance(hub, UserError) and "HF_HUB_OFFLINE is set" in str(hub) and hub.rule == "models.load_failed"


def _a_run_with_a_checkpoint(root: Path) -> Path:
    """A run's folder as finetune.run leaves it (its files empty: nothing here reads them): returns its
    training-state checkpoint."""
    step = root / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    for name in ("model.safetensors", "manifest.json", "COMPLETE", "optimizer.bin"):
        (step / name).write_text("")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    (root / "config.yaml").write_text("task: text-classification\n")
    return step


@pytest.mark.parametrize("what", ["model", "tokenizer", "image processor"])
def test_a_folder_that_holds_no_model_says_what_it_is_and_what_to_give(what, tmp_path):
    """A data folder, a run's training-state checkpoint or a run's folder given as a model, tokenizer or image
    processor: one line that says what the folder is, not transformers' first line ("Couldn't instantiate the
    backend tokenizer from one of:"), with what to give instead."""
    from finetune.models import load_error

    said = {}
    error = OSError("Couldn't instantiate the backend tokenizer from one of:\n(1) a `tokenizers` library file")

    def load_error_of(rule: str, name: str, e: Exception = error) -> str:
        found = load_error(what, name, e)
        assert found.rule == rule, (found.rule, rule)
        return str(found)

    for folder in (REPO / "data/fashion_mnist", REPO / "data/rotten_tomatoes"):
        said[folder] = load_error_of("models.holds_no_files", str(folder))
    needs = {"model": "(config.json)", "tokenizer": "(tokenizer.json, vocab.txt, tokenizer_config.json, ...)",
             "image processor": "(preprocessor_config.json)"}[what]  # fmt: skip
    instead = {"model": "a hub name", "tokenizer": "a tokenizer's folder",
               "image processor": "an image processor's folder"}[what]  # fmt: skip
    for folder, line in said.items():
        assert line == (f"{what} '{folder}' holds no {what} files {needs}: give a model folder (an export, "
                        f"<run>/model) or {instead}")  # fmt: skip
    step = _a_run_with_a_checkpoint(tmp_path / "run")
    assert load_error_of("models.training_state_checkpoint", str(step)) == (
        f"{what} '{step}' is a training-state checkpoint, not a model folder: give the run's export "
        f"({tmp_path / 'run' / 'model'}), or resume it with resume_from_checkpoint={step} output_dir={tmp_path / 'run'}"
    )
    moved = tmp_path / "elsewhere"
    step.rename(moved)
    assert load_error_of("models.training_state_checkpoint", str(moved)).endswith(
        "give the run's export (<run>/model), or resume it with resume_from_checkpoint=" + str(moved))
    assert load_error_of("models.run_folder", str(tmp_path / "run")) == (
        f"{what} '{tmp_path / 'run'}' is a run's folder, not a model folder: give its export ({tmp_path / 'run' / 'model'})")
    (tmp_path / "run" / "adapter").mkdir()
    (tmp_path / "run" / "adapter" / "adapter_config.json").write_text("{}")
    assert load_error_of("models.lora_adapter_alone", str(tmp_path / "run" / "adapter")) == (
        f"{what} '{tmp_path / 'run' / 'adapter'}' is a LoRA adapter alone (adapter_config.json), not a model folder: "
        f"give the run's export ({tmp_path / 'run' / 'model'})")
    # A folder that holds what it should, whose file is broken: transformers' own line says what is wrong inside.
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "bert",')
    if what == "model":
        broken = load_error_of("models.load_failed", str(tmp_path / "broken"), ValueError("bad json"))
        assert broken.startswith("could not load model")
    # An image model's export given to a text run (a tokenizer read from it), or a text model's to an image run.
    vision, text = tmp_path / "vit-export", tmp_path / "bert-export"
    for folder, file in ((vision, "preprocessor_config.json"), (text, "tokenizer.json")):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / file).write_text("{}")
    if what == "tokenizer":
        assert load_error_of("models.other_modality_folder", str(vision)) == (
            f"tokenizer '{vision}' is an image model's folder (an image processor, no tokenizer): a text run starts "
            "from a text model; give one as model_name_or_path")
    if what == "image processor":
        assert load_error_of("models.other_modality_folder", str(text)) == (
            f"image processor '{text}' is a text model's folder (a tokenizer, no image processor): an image run "
            "starts from an image model; give one as model_name_or_path")


def test_a_data_folder_as_the_tokenizer_is_one_line_from_the_command(small_text_data, tmp_path, capsys):
    line = user_error(capsys, main, [*tiny_text_args(small_text_data, tmp_path / "o"),
                                     f"tokenizer_name={REPO / 'data/fashion_mnist'}"],
                      f"tokenizer '{REPO / 'data/fashion_mnist'}' holds no tokenizer files (tokenizer.json, vocab.txt",
                      "give a model folder (an export, <run>/model) or a tokenizer's folder",
                      rule="models.holds_no_files")  # fmt: skip
    assert "Couldn't instantiate" not in line
    assert not (tmp_path / "o").exists()


def test_a_checkpoint_as_the_model_is_named_by_the_setting_the_user_gave(small_text_data, tmp_path, capsys):
    """model_name_or_path=<run>/checkpoints/step-N, no tokenizer_name: the tokenizer is read from it first,
    but the line names model_name_or_path, the setting the user gave, not a tokenizer they never set."""
    step = _a_run_with_a_checkpoint(tmp_path / "run")
    args = [a for a in tiny_text_args(small_text_data, tmp_path / "o") if not a.startswith(("model_config=", "tokenizer_name="))]
    line = user_error(capsys, main, [*args, f"model_name_or_path={step}"], rule="models.training_state_checkpoint")
    assert line.startswith(f"error: model_name_or_path '{step}' is a training-state checkpoint, not a model folder")


@pytest.mark.parametrize("model_type, message, rule", [
    ("vit", "model_config.model_type=vit has no text-classification head in transformers "
            "(AutoModelForSequenceClassification); choose a text model such as bert, distilbert, roberta",
     "models.no_head_for_the_task"),
    ("bret", "model_config.model_type=bret is not a model type that transformers knows; did you mean bert? "
             "choose a text model type such as bert, distilbert, roberta", "models.unknown_model_type"),
])  # fmt: skip
def test_a_model_type_without_the_tasks_head_is_refused_first(model_type, message, rule, small_text_data, tmp_path,
                                                              capsys):  # fmt: skip
    """model_config.model_type=vit on text: the type is blamed, not the vocab_size the text task adds to it."""
    config = TINY_BERT.replace("model_type: bert", f"model_type: {model_type}")
    line = user_error(capsys, main, [*tiny_text_args(small_text_data, tmp_path / "o"), f"model_config={config}"],
                      rule=rule)
    assert line == f"error: {message}"


def test_a_model_type_without_the_tasks_head_is_refused_for_images_and_tags():
    from finetune.config import ModelArgs
    from finetune.errors import UserError
    from finetune.models import build_model

    for task, model_type, message in [
        ("image-classification", "bert", "model_config.model_type=bert has no image-classification head in "
         "transformers (AutoModelForImageClassification); choose an image model such as vit, deit, convnext"),
        ("token-classification", "vit", "model_config.model_type=vit has no token-classification head in "
         "transformers (AutoModelForTokenClassification); choose a text model such as bert, distilbert, roberta"),
    ]:  # fmt: skip
        args = ModelArgs(task=task, model_config={"model_type": model_type, "hidden_size": 16}, model_name_or_path=None)
        with pytest.raises(UserError) as caught:
            build_model(args, ["a", "b"], vocab_size=100 if task != "image-classification" else None)
        assert str(caught.value) == message and caught.value.rule == "models.no_head_for_the_task"


def test_sentence_pairs_on_a_model_with_one_token_type_are_refused(tmp_path, capsys):
    """The second text of a pair has token type 1: a model built with type_vocab_size=1 has no row for it
    (an IndexError at the first batch, after config.yaml was written)."""
    rows = [{"s1": r["text"], "s2": r["text"][::-1], "label": r["label"]} for r in rotten_rows(20)]
    data = {"train": write_csv(tmp_path / "pairs.csv", rows), "validation": write_csv(tmp_path / "v.csv", rows[:8])}
    out = tmp_path / "run"
    args = tiny_text_args(data, out, "text_column=s1", "text_pair_column=s2", "model_config.type_vocab_size=1")
    assert "set model_config.type_vocab_size=2" in user_error(capsys, main, args, rule="models.pairs_without_token_types")
    assert not out.exists()


def test_the_same_labels_in_another_order_keep_their_head_outputs_by_name(finished_run, capsys):
    """label_names [1, 0] against a [0, 1] export: the head's rows are swapped, so each name keeps the
    output it was trained as (not the output at its place), and nothing is said: nothing changes."""
    from finetune.models import build_model

    export = finished_run() / "model"  # labels 0 and 1
    cfg = load_config(None, [f"model_name_or_path={export}", f"output_dir={export.parent / 'unused'}"])
    as_trained, swapped = build_model(cfg.model_args, ["0", "1"]), build_model(cfg.model_args, ["1", "0"])
    assert swapped.config.id2label == {0: "1", 1: "0"}
    assert torch.equal(swapped.classifier.weight, as_trained.classifier.weight[[1, 0]])
    assert torch.equal(swapped.classifier.bias, as_trained.classifier.bias[[1, 0]])
    assert not torch.equal(swapped.classifier.weight, as_trained.classifier.weight)
    assert "fine-tuned for" not in capsys.readouterr().err


def test_a_roberta_position_table_holds_two_positions_fewer_than_its_rows():
    """RoBERTa numbers positions from its padding id + 1: a table of 32 rows holds 30 positions, and a batch of
    31 tokens would index past it (an IndexError mid-run)."""
    from types import SimpleNamespace

    from transformers import RobertaConfig, RobertaForSequenceClassification

    from finetune import checks
    from finetune.checks import models as model_rules
    from finetune.errors import UserError

    model = RobertaForSequenceClassification(RobertaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                           intermediate_size=32, max_position_embeddings=32))  # fmt: skip

    def fit(max_length: int, multiple: int | None = None) -> model_rules.Fit:
        return model_rules.Fit(model, None, "roberta", SimpleNamespace(max_length=max_length, pad_to_multiple_of=multiple))

    checks.gate(model_rules.POSITIONS, fit(30))
    with pytest.raises(UserError, match="max_length 31 exceeds the model's position limit 30") as e:
        checks.gate(model_rules.POSITIONS, fit(31))
    assert e.value.rule == "models.max_length_past_positions"
    with pytest.raises(UserError, match="pad_to_multiple_of=8 pads batches of up to max_length=30 tokens to 32") as e:
        checks.gate(model_rules.POSITIONS, fit(30, 8))
    assert e.value.rule == "models.padded_past_positions"


def test_training_on_from_a_fine_tuned_export_with_other_labels_says_what_happens_to_its_head(
    finished_run, tmp_path, capsys
):
    """A 0/1 export trained on for three classes: its encoder kept, a new head (transformers raised on
    the head's shape); for two other names: its head trained on, with a line that says so. The same
    labels again: no word."""
    export = finished_run() / "model"  # labels 0 and 1
    rows = rotten_rows(24)
    three = [{**r, "label": ["a", "b", "c"][i % 3]} for i, r in enumerate(rows)]
    named = [{**r, "label": ["neg", "pos"][int(r["label"])]} for r in rows]
    for name, data, said in [
        ("three", three, "was fine-tuned for 2 labels (0, 1) and the data has 3 (a, b, c): its encoder is kept and "
                         "a new head is trained"),
        ("named", named, "was fine-tuned for the labels (0, 1); the data's are (neg, pos): its head's outputs are "
                         "trained on as the data's labels"),
        ("same", rows, None),
    ]:  # fmt: skip
        files = {s: write_csv(tmp_path / f"{name}-{s}.csv", data) for s in ("train", "validation")}
        out = tmp_path / name
        args = [a for a in tiny_text_args(files, out) if not a.startswith(("model_config=", "tokenizer_name="))]
        main([*args, f"model_name_or_path={export}", "max_steps=1"])
        reset_accelerate()
        heads = [line for line in capsys.readouterr().err.splitlines() if "was fine-tuned for" in line]
        assert len(heads) == (1 if said else 0) and all(h.startswith(f"warning: model '{export}' {said}") for h in heads)
        warned = [w["rule"] for w in json.loads((out / "results.json").read_text())["warnings"]]
        assert {"three": ["models.head_replaced"], "named": ["models.head_relabelled"], "same": []}[name] == [
            w for w in warned if w.startswith("models.head")]
        config = json.loads((out / "model" / "config.json").read_text())
        assert sorted(config["label2id"]) == sorted({r["label"] for r in data})


def test_a_pretrained_model_that_does_not_load_is_named_by_its_rule(tmp_path, monkeypatch):
    """build_model's refusals, each by the rule that found it: a path not there, weights that are a folder or
    damaged, pickle weights alone, a model that transformers cannot build from a good model_config."""
    import transformers
    from conftest import save_tiny_bert

    from finetune.config import ModelArgs
    from finetune.errors import UserError
    from finetune.models import build_model

    def refused(args: ModelArgs, rule: str, fragment: str) -> None:
        with pytest.raises(UserError, match=fragment) as e:
            build_model(args, ["0", "1"], vocab_size=None if args.model_config is None else 100)
        assert e.value.rule == rule

    folder = save_tiny_bert(tmp_path / "bert", tokenizer=False)
    refused(ModelArgs(task=TEXT, model_name_or_path=str(tmp_path / "nope")), "models.path_missing",
            "model path does not exist")
    (tmp_path / "pickled").mkdir()
    save_tiny_bert(tmp_path / "pickled", tokenizer=False, safetensors=False)
    refused(ModelArgs(task=TEXT, model_name_or_path=str(tmp_path / "pickled")), "models.pickle_weights_only",
            "allow_pickle_weights=true")
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    refused(ModelArgs(task=TEXT, model_name_or_path=str(folder)), "models.weights_damaged",
            "the weights of model .* are damaged")
    weights.unlink()
    weights.mkdir()
    refused(ModelArgs(task=TEXT, model_name_or_path=str(folder)), "models.weights_a_folder",
            "its model.safetensors is a folder")

    def fails(*args, **kwargs):
        raise ValueError("no such kernel")

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_config", fails)
    config = {"model_type": "bert", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1}
    refused(ModelArgs(task=TEXT, model_config=config, model_name_or_path=None), "models.model_not_built",
            "cannot build a text-classification model from model_config: no such kernel")


def test_a_text_model_from_model_config_without_a_tokenizer_is_refused():
    from finetune.config import ModelArgs
    from finetune.errors import UserError
    from finetune.models import load_preprocessor

    args = ModelArgs(task=TEXT, model_config={"model_type": "bert"}, model_name_or_path=None, tokenizer_name=None)
    with pytest.raises(UserError, match="a text model built from model_config needs tokenizer_name") as e:
        load_preprocessor(args)
    assert e.value.rule == "models.tokenizer_name_needed"


def test_the_task_of_a_saved_model_is_read_from_its_head():
    """A base model has no classifier to evaluate; a head of no task's, without --task, tells no task."""
    from transformers import BertConfig

    from finetune.errors import UserError
    from finetune.tasks import task_of_model

    assert task_of_model(BertConfig(architectures=["BertForTokenClassification"]), "m").name == "token-classification"
    with pytest.raises(UserError, match=r"m is a pretrained base model \(BertForMaskedLM\), not a fine-tuned one") as e:
        task_of_model(BertConfig(architectures=["BertForMaskedLM"]), "m")
    assert e.value.rule == "models.base_model_not_fine_tuned"
    assert task_of_model(BertConfig(architectures=["BertForQuestionAnswering"]), "m").name == "question-answering"
    assert task_of_model(BertConfig(architectures=["BertForMultipleChoice"]), "m").name == "multiple-choice"
    named = BertConfig(architectures=["BertForNextSentencePrediction"], id2label={0: "no", 1: "yes"})
    with pytest.raises(UserError, match=r"cannot tell the task of m from its config \(architectures "
                                        r"\['BertForNextSentencePrediction'\]\); pass --task") as e:  # fmt: skip
        task_of_model(named, "m")
    assert e.value.rule == "models.task_unknown"
    assert task_of_model(named, "m", "text-classification").name == "text-classification"


def test_a_model_with_code_of_its_own_names_trust_remote_code(small_text_data, tmp_path, capsys):
    """A local model folder whose config.json maps its classes to Python files beside it (auto_map): refused
    in the setting's words, not transformers' about "the repository"."""
    import shutil

    folder = tmp_path / "custom"
    folder.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "mybert", "architectures": ["MyBertForSequenceClassification"],
        "auto_map": {"AutoConfig": "configuration_mybert.MyBertConfig"}}))  # fmt: skip
    (folder / "configuration_mybert.py").write_text("raise SystemExit('this code ran')\n")
    args = tiny_text_args(small_text_data, tmp_path / "run", "model_config=null", f"model_name_or_path={folder}",
                          "tokenizer_name=null", "max_steps=1")  # fmt: skip
    user_error(capsys, main, args, "ships its own Python code (config.json's auto_map), which is run only with "
               "trust_remote_code=true", rule="models.custom_code")  # fmt: skip


class _RunsCode:
    """A pickle that calls a function when loaded: what a hostile weights file would hold."""

    def __reduce__(self):
        return (print, ("this code ran",))


def test_pickle_weights_that_hold_code_are_one_line_when_allowed(small_text_data, tmp_path, capsys):
    """allow_pickle_weights=true on a pytorch_model.bin that holds code: torch's weights-only loading refuses
    to run it, and the run says so in one line (not torch's traceback); nothing of it ran."""
    from conftest import save_tiny_bert

    folder = tmp_path / "pickled"
    save_tiny_bert(folder, safetensors=False)
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.save({**weights, "extra": _RunsCode()}, folder / "pytorch_model.bin")
    args = tiny_text_args(small_text_data, tmp_path / "run", "model_config=null", f"model_name_or_path={folder}",
                          "allow_pickle_weights=true", "max_steps=1")  # fmt: skip
    user_error(capsys, main, args, "do not load as plain data (they hold code or objects other than tensors",
               rule="models.pickle_holds_code")  # fmt: skip
    assert "this code ran" not in capsys.readouterr().out


def test_an_imagenet_head_is_replaced_without_a_warning():
    """An image backbone's ImageNet head (1,000 classes) is its pretraining's: a new head for the user's
    classes is the usual fine-tune, not a surprise; a fine-tuned head of 3 labels is still said."""
    from finetune.checks.models import head_replaced

    assert head_replaced("efficientnet", [f"class {i}" for i in range(1000)], ["cat", "dog"], True) is None
    assert "a new head is trained" in head_replaced("sentiment", ["neg", "neu", "pos"], ["cat", "dog"], True)
