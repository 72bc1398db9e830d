"""build_model: the one place where config meets the model.

Any checkpoint of the task's auto class (finetune/tasks.py) by hub name or local directory, or a model
built from a config (tiny models for tests, a small ViT offline).
Models know nothing of the runtime: no devices, ranks or dtypes here; Accelerate places them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from finetune.config import ModelArgs
from finetune import checks
from finetune.errors import UserError, first_line
from finetune.metrics import MULTI, REGRESSION, SINGLE
from finetune.rundir import CHECKPOINTS, COMPLETE, MANIFEST, RunDir, is_hub_name
from finetune.tasks import task_of


def load_error(what: str, name: str, e: Exception, setting: str | None = None) -> UserError:
    """One line for a model, tokenizer or image processor that does not load; under HF_HUB_OFFLINE, a hub
    name gets the hint to download it while online, a local folder not (it is read from disk). A local folder
    that is no such folder at all (a data folder, a run's checkpoint, folder or adapter) is said to be that,
    with what to give instead, not transformers' first line about it. `setting`: the setting the user gave
    the name in, where it is not `what`'s own (a tokenizer read from model_name_or_path)."""
    said = setting or what
    if not is_hub_name(name) and not Path(name).expanduser().exists():
        return UserError(f"{said} path does not exist: {name}")
    weights = Path(name).expanduser() / "model.safetensors"
    if weights.is_dir():
        return UserError(f"{said} '{name}': its model.safetensors is a folder, not a weights file; put back the "
                         "file it was saved with, or give another model")
    lacks = _what_the_folder_lacks(what, Path(name).expanduser())
    if lacks:
        return UserError(f"{said} '{name}' {lacks}")
    return UserError(f"could not load {what} '{name}'{f' ({setting})' if setting else ''}: {first_line(e)}"
                     f"{offline_hint(name)}")


# What a folder must hold for each kind of thing loaded from it (any one of them); the first three are named.
HOLDS = {
    "tokenizer": ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "vocab.json", "merges.txt",
                  "spiece.model", "sentencepiece.bpe.model", "tokenizer.model"),
    "image processor": ("preprocessor_config.json",),
    "model": ("config.json",),
}  # fmt: skip


def _what_the_folder_lacks(what: str, folder: Path) -> str | None:
    """Why a local folder that does not load is no `what` folder at all (a run's training-state checkpoint,
    a run's folder, a data folder), as the rest of the line after its name; None: it looks like one (its own
    error says what is wrong inside)."""
    if not folder.is_dir():
        return None
    if ((folder / MANIFEST).exists() or (folder / COMPLETE).exists()) and not (folder / "config.json").exists():
        run = RunDir(folder.resolve().parent.parent)  # <run>/checkpoints/step-N
        if folder.resolve().parent.name != CHECKPOINTS:  # moved out of its run
            run = RunDir(folder / "no-run")
        export = run.model if (run.model / "config.json").is_file() else "<run>/model"
        own = f" output_dir={run.root}" if run.config.is_file() else ""  # the run's own recipe, as it ran
        return (f"is a training-state checkpoint, not a model folder: give the run's export ({export}), or "
                f"resume it with resume_from_checkpoint={folder}{own}")
    needs = HOLDS.get(what, ())
    if not needs or any((folder / file).exists() for file in needs):
        return None
    if (folder / "adapter_config.json").is_file():  # <run>/adapter: peft's LoRA matrices, no base model
        export = RunDir(folder.resolve().parent).model
        export = export if (export / "config.json").is_file() else "<run>/model"
        return f"is a LoRA adapter alone (adapter_config.json), not a model folder: give the run's export ({export})"
    if (RunDir(folder).model / "config.json").is_file():
        return f"is a run's folder, not a model folder: give its export ({RunDir(folder).model})"
    other = {"tokenizer": ("image processor", "an image", "a text"), "image processor": ("tokenizer", "a text", "an image")}
    if what in other and (folder / "config.json").is_file() and any((folder / f).exists() for f in HOLDS[other[what][0]]):
        held, kind, wanted = other[what]  # a ViT export given to a text run, or a BERT export to an image run
        return (f"is {kind} model's folder ({'an' if held[0] in 'aeiou' else 'a'} {held}, no {what}): {wanted} run "
                f"starts from {wanted} model; give one as model_name_or_path")
    files = ", ".join(needs[:3]) + (", ..." if len(needs) > 3 else "")
    return (f"holds no {what} files ({files}): give a model folder (an export, <run>/model) or "
            + ("a hub name" if what == "model" else f"{'an' if what[0] in 'aeiou' else 'a'} {what}'s folder"))


def offline_hint(name: str) -> str:
    """Under HF_HUB_OFFLINE, for a hub name (a folder on disk: no download would help), what to do."""
    local = Path(name).expanduser().exists()
    if not local and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return " (HF_HUB_OFFLINE is set: download it while online, or give a local directory)"
    return ""


def load_preprocessor(args: ModelArgs, model_config: PretrainedConfig | None = None):
    """The tokenizer or image processor that goes with the model (the task's, finetune/tasks.py)."""
    return task_of(args.task).load_preprocessor(args, model_config)


def set_dropout(config: PretrainedConfig, p: float | None) -> None:
    """Every dropout probability in a model config (hidden, attention, classifier...) set to `p`.

    On the config, before the model is built: some layers copy the rate at construction (ViT's
    attention keeps its own float), so zeroing `nn.Dropout` modules afterwards is not enough.
    """
    if p is None:
        return
    for key, value in config.to_dict().items():
        if "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(config, key, p)


def build_model(args: ModelArgs, label_names: list[str], vocab_size: int | None = None,
                said: checks.Said | None = None) -> PreTrainedModel:  # fmt: skip
    """A classification model with `len(label_names)` outputs (one for regression), the names in
    id2label/label2id and `problem_type` in its config."""
    labels: dict[str, Any] = {
        "num_labels": len(label_names),
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
        # What the pipeline applies to the outputs (softmax, sigmoid, none); null: transformers' default
        # (transformers knows no problem_type for tags).
        **({"problem_type": args.problem_type} if args.problem_type in (SINGLE, MULTI, REGRESSION) else {}),
    }
    auto = task_of(args.task).auto_model()
    if args.model_config is not None:
        # The labels and problem type are the data's, whatever the config (a saved model's) says.
        spec = {k: v for k, v in args.model_config.items() if k not in labels}
        model_type = spec.pop("model_type")
        _check_has_head(model_type, args.task, auto)
        if vocab_size is not None:  # the tokenizer's: a model built for text
            spec.setdefault("vocab_size", vocab_size)
        try:
            config = AutoConfig.for_model(model_type, **spec, **labels)
        except Exception as e:  # ValueError, TypeError, huggingface_hub's strict-dataclass validation
            said = " ".join(line.strip() for line in str(e).splitlines()[:2] if line.strip())  # its field, its why
            raise UserError(f"cannot build a {args.task} model from model_config: {said or first_line(e)}") from None
        _check_config_keys(config, spec)
        _check_config_values(config)
        set_dropout(config, args.dropout)
        _check_image_config(config)
        try:
            return auto.from_config(config, trust_remote_code=args.trust_remote_code)
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"cannot build a {args.task} model from model_config: {e}") from None
    name = args.model_name_or_path
    assert name is not None  # TrainConfig.validate guarantees a name or a config
    try:
        # safetensors only, unless the user opts in: a pytorch_model.bin is a pickle that can run code
        # when loaded (transformers loads it with weights_only=True, still a wider surface).
        config = AutoConfig.from_pretrained(name, trust_remote_code=args.trust_remote_code, **labels)
        head = _fine_tuned_head(AutoConfig.from_pretrained(name, trust_remote_code=args.trust_remote_code))
        new_head = head is not None and len(head) != len(label_names)
        # The same labels in another order (label_names written otherwise): the head's outputs follow by name.
        order = [head.index(n) for n in label_names] if head and not new_head and sorted(head) == sorted(label_names) else None
        changes = head is not None and head != list(label_names) and order is None  # said once the model loads
        set_dropout(config, args.dropout)
        model = auto.from_pretrained(
            name,
            config=config,
            trust_remote_code=args.trust_remote_code,
            use_safetensors=None if args.allow_pickle_weights else True,
            ignore_mismatched_sizes=new_head,  # another number of labels: its encoder, a new head
        )
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise UserError(
                f"'{name}' is not a model that {auto.__name__} can load for {args.task}; "
                f"choose a model type that has {_a(args.task)} head (e.g. {', '.join(_types_with_head(auto))})"
            ) from None
        raise load_error("model", name, e) from None
    except OSError as e:
        if not args.allow_pickle_weights and _has_pickle_weights_only(name):
            raise UserError(
                f"model '{name}' has only pickle weights (pytorch_model.bin), which can run code "
                "when loaded; convert it to safetensors, or pass allow_pickle_weights=true if "
                "you trust its source"
            ) from None
        raise load_error("model", name, e) from None
    except SafetensorError as e:
        raise UserError(f"the weights of model '{name}' are damaged ({first_line(e)}): replace them") from None
    if changes or (order is not None and order != sorted(order) and not _reorder_head(model, order)):
        _say_the_head_changes(name, head, list(label_names), new_head, said or checks.Said())
    _check_image_config(model.config)
    return model


def _reorder_head(model: PreTrainedModel, order: list[int]) -> bool:
    """Output i of the model becomes its output `order[i]`: the rows of the head's last layer (the one
    linear layer outside the base model with an output per label) permuted. False where there is not
    exactly one such layer."""
    import torch

    prefix = getattr(model, "base_model_prefix", "")
    last = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(order)
            and not (prefix and (n == prefix or n.startswith(prefix + ".")))]  # fmt: skip
    if len(last) != 1:
        return False
    with torch.no_grad():
        last[0].weight.copy_(last[0].weight[order])
        if last[0].bias is not None:
            last[0].bias.copy_(last[0].bias[order])
    return True


def _fine_tuned_head(config: PretrainedConfig) -> list[str] | None:
    """The labels a fine-tuned model's head was trained for (an export of a run, a classifier from the
    Hub), in id order; None for a pretrained base model (its labels are transformers' LABEL_0, ...)."""
    names = [str(v) for _, v in sorted((int(k), v) for k, v in (config.id2label or {}).items())]
    heads = [a for a in (config.architectures or []) if "For" in a and not a.endswith(("MaskedLM", "PreTraining"))]
    if not heads or all(re.fullmatch(r"LABEL_\d+", n) for n in names):
        return None
    return names


def _say_the_head_changes(name: str, head: list[str], labels: list[str], new_head: bool, said: checks.Said) -> None:
    """One warning when a fine-tuned model is trained on for other labels than its head's."""
    def shown(names: list[str]) -> str:
        return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")

    if new_head:
        said.warn(f"model '{name}' was fine-tuned for {len(head)} labels ({shown(head)}) and the data has {len(labels)} "
             f"({shown(labels)}): its encoder is kept and a new head is trained from random weights")
    else:
        said.warn(f"model '{name}' was fine-tuned for the labels ({shown(head)}); the data's are ({shown(labels)}): its "
             "head's outputs are trained on as the data's labels, in that order; if they mean other things, start "
             "from its base model")


def freeze_layers(model: PreTrainedModel, n: int) -> None:
    """Freeze the embeddings and the first `n` encoder layers (BERT-like models and ViT: the blocks the
    layer split knows, finetune/parallel.py)."""
    from finetune.parallel import ParallelError, find_blocks

    try:
        embeddings, layers, _ = find_blocks(model)
    except ParallelError:
        raise UserError(
            f"freeze_layers: {type(model).__name__} has no embeddings and encoder layers that finetune can find"
        ) from None
    if n > len(layers):
        has = f"{len(layers)} encoder layer" + ("s" if len(layers) != 1 else "")
        raise UserError(f"freeze_layers={n} but {type(model).__name__} has {has}: set freeze_layers={len(layers)} or less")
    for name in [*embeddings, *layers[:n]]:
        model.get_submodule(name).requires_grad_(False)


# The model types named when one has no head for the task: the first three that have one.
KNOWN_TYPES = ("bert", "distilbert", "roberta", "vit", "deit", "convnext")


def _head_types(auto) -> dict[str, str] | None:
    """transformers' model types that `auto` (AutoModelForSequenceClassification...) builds a model for, from
    its mapping (MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES); None where transformers names none."""
    import re

    from transformers.models.auto import modeling_auto

    head = re.sub(r"(?<!^)(?=[A-Z])", "_", auto.__name__.removeprefix("AutoModelFor")).upper()
    return getattr(modeling_auto, f"MODEL_FOR_{head}_MAPPING_NAMES", None)


def _types_with_head(auto) -> list[str]:
    types = _head_types(auto) or {}
    return [t for t in KNOWN_TYPES if t in types][:3] or ["bert", "vit"]


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _check_has_head(model_type: str, task: str, auto) -> None:
    """A model type that has no head for the task (model_type=vit on text) is refused before its config is
    built: the settings the task adds (a tokenizer's vocab_size) would be blamed instead. A type transformers
    does not know at all is named with the closest that has one (not transformers' list of several hundred)."""
    import difflib

    from transformers import CONFIG_MAPPING

    types = _head_types(auto)
    if types is None or model_type in types:
        return
    kind = task_of(task).modality
    examples = ", ".join(_types_with_head(auto))
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), sorted(types), n=1, cutoff=0.6)
        raise UserError(
            f"model_config.model_type={model_type} is not a model type that transformers knows; "
            + (f"did you mean {close[0]}? " if close else "") + f"choose {_a(kind)} model type such as {examples}"
        )
    raise UserError(
        f"model_config.model_type={model_type} has no {task} head in transformers ({auto.__name__}); choose "
        f"{_a(kind)} model such as {examples}"
    )


def _check_config_keys(config: PretrainedConfig, spec: dict[str, Any]) -> None:
    """A key the model's config class does not know (a typo: image_sise) would be stored and ignored."""
    import difflib

    known = set(type(config)().to_dict())
    for key in spec:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UserError(f"model_config: {type(config).__name__} has no setting '{key}'{hint}")


# Sizes a model built from model_config needs at 1 or more: at 0 or below it fails mid-build (a division
# by zero, an empty table) or, for num_hidden_layers, trains a model with no layers without a word.
POSITIVE = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
            "max_position_embeddings", "type_vocab_size", "image_size", "patch_size", "num_channels", "dim",
            "hidden_dim", "n_heads", "n_layers")  # fmt: skip


def _check_config_values(config: PretrainedConfig) -> None:
    """A model_config value the model cannot be built or trained with, said before the build: a size below
    1, a hidden size the heads do not divide (ViT would silently drop the remainder), an activation
    transformers does not have, a pad token outside the vocabulary."""
    from transformers.activations import ACT2FN

    values = config.to_dict()
    for key in POSITIVE:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise UserError(f"model_config.{key}={value}: it must be 1 or more")
    hidden = values.get("hidden_size", values.get("dim"))
    heads = values.get("num_attention_heads", values.get("n_heads"))
    if isinstance(hidden, int) and isinstance(heads, int) and hidden % heads:
        raise UserError(
            f"model_config: hidden_size {hidden} is not a multiple of num_attention_heads {heads} (each head "
            f"takes an equal share); choose num_attention_heads among "
            f"{', '.join(str(n) for n in range(1, hidden + 1) if hidden % n == 0 and n <= 64)}"
        )
    act = values.get("hidden_act", values.get("activation"))
    if isinstance(act, str) and act not in ACT2FN:
        known = ", ".join(sorted(k for k in ACT2FN if k in ("gelu", "relu", "silu", "swish", "tanh", "gelu_new")))
        raise UserError(f"model_config.hidden_act={act!r} is not an activation transformers has; choose one of {known}")
    pad, vocab = values.get("pad_token_id"), values.get("vocab_size")
    if isinstance(pad, int) and isinstance(vocab, int) and not 0 <= pad < vocab:
        raise UserError(
            f"model_config.pad_token_id={pad} is outside the vocabulary (ids 0 to {vocab - 1}); leave it out, "
            "or give the tokenizer's padding id"
        )


def _has_pickle_weights_only(name: str) -> bool:
    path = Path(name).expanduser()
    if not path.is_dir():
        return False
    names = {p.name for p in path.iterdir()}
    return not any(
        n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names
    ) and any(n.startswith("pytorch_model") and n.endswith((".bin", ".bin.index.json")) for n in names)


def _check_image_config(config: PretrainedConfig) -> None:
    image_size, patch_size = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    sizes = [v if isinstance(v, int) else min(v) for v in (image_size, patch_size) if v is not None]
    if len(sizes) == 2 and sizes[0] < sizes[1]:
        raise UserError(
            f"the model's image_size {image_size} is smaller than its patch_size {patch_size}: "
            "no patch fits; raise image_size or lower patch_size"
        )
    if len(sizes) == 2 and sizes[0] % sizes[1]:  # the patches tile what they cover; the rest is never seen
        fits = sizes[0] // sizes[1] * sizes[1]
        raise UserError(
            f"the model's image_size {image_size} is not a multiple of its patch_size {patch_size}: the last "
            f"{sizes[0] - fits} rows and columns of pixels would fall outside every patch; set "
            f"model_config.image_size to {fits} or {fits + sizes[1]}, or a patch_size that divides it"
        )


def check_max_length(model: PreTrainedModel, max_length: int, pad_to_multiple_of: int | None) -> None:
    """A text model's position table holds the longest batch: `max_length`, rounded up. RoBERTa-style
    embeddings number positions from the padding id + 1, so their last rows are fewer than the table's size
    (roberta-base: 514 rows, 512 positions)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    padding = getattr(getattr(model.base_model, "embeddings", None), "padding_idx", None)
    if limit is not None and isinstance(padding, int):
        limit -= padding + 1
    if limit is not None and max_length > limit:
        raise UserError(
            f"max_length {max_length} exceeds the model's position limit {limit}; "
            f"set max_length={limit} or less"
        )
    multiple = pad_to_multiple_of
    if limit is not None and multiple:
        longest = -(-max_length // multiple) * multiple  # the longest batch after rounding up
        if longest > limit:
            raise UserError(
                f"pad_to_multiple_of={multiple} pads batches of up to max_length={max_length} tokens to "
                f"{longest}, past the model's position limit {limit}; choose a multiple that divides a "
                f"length of at most {limit}, or null"
            )


def check_tokenizer(
    tokenizer, model: PreTrainedModel, name: str | None, max_length: int, pair: bool, exported: bool = False
) -> None:
    """A tokenizer that does not fit the model trains garbage without an error, or fails mid-run.

    A model folder without tokenizer files still loads a tokenizer (transformers builds one with only
    the special tokens: every word becomes [UNK]); a tokenizer larger than the embedding table makes ids
    with no row (an IndexError in training); one far smaller is another model's. Tables padded to a
    round size are at most a few percent larger than their tokenizer, and pass. And `max_length` must
    leave room for text after the special tokens the tokenizer adds. `exported`: the tokenizer is a
    saved model's own (evaluation), which no setting replaces."""
    size, special = len(tokenizer), len(set(tokenizer.all_special_ids))
    if size <= special:
        raise UserError(
            f"the tokenizer of {name} has no vocabulary, only its {size} special tokens: the folder holds no "
            "tokenizer files (vocab.txt, tokenizer.json); "
            + ("copy the tokenizer files of the model it was trained from into it" if exported else
               "set tokenizer_name to the model's tokenizer")
        )
    rows = model.get_input_embeddings().num_embeddings
    built = not getattr(model, "name_or_path", "")  # from model_config: its vocab_size is the user's to set
    if size > rows:
        raise UserError(
            f"the tokenizer of {name} has {size} tokens, more than the {rows} rows of the model's embedding "
            f"table (ids from {rows} on have none): "
            + (f"set model_config.vocab_size={size} (or leave it out: the tokenizer's size is the default)"
               if built else "it is not the model's tokenizer; use the model's own")
        )
    if size < 0.9 * rows:
        raise UserError(
            f"the tokenizer of {name} has {size} tokens for the {rows} rows of the model's embedding table: "
            + (f"set model_config.vocab_size={size} (or leave it out)" if built else
               "it is not the model's tokenizer (a padded table is a few percent larger, not more); use the "
               "model's own")
        )
    types = getattr(model.config, "type_vocab_size", None)
    if pair and isinstance(types, int) and types < 2 and "token_type_ids" in tokenizer.model_input_names:
        raise UserError(
            f"sentence pairs mark their second text with token type 1, but the model has {types} token type: "
            + ("set model_config.type_vocab_size=2" if built else "this model was not made for pairs; choose one "
               "that was, or one whose tokenizer gives no token types (roberta)")
        )
    added = tokenizer.num_special_tokens_to_add(pair=pair)
    if max_length <= added:
        raise UserError(
            f"max_length={max_length} leaves no room for text: the tokenizer adds {added} special tokens "
            "to every sample; raise max_length"
        )
