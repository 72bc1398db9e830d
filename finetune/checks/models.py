"""Models: model folders, configs built from model_config, tokenizers and image processors, pretrained
weights, LoRA's target modules and the layer split's plan (finetune/models.py, finetune/tasks/,
finetune/lora.py and finetune/parallel.py ask these).

    LOAD_FAILED     why a model, tokenizer or image processor does not load (the last rule always answers)
    PRETRAINED      why a pretrained model does not load: another task's model, pickle weights, damaged ones
    MODEL_TYPE      a model_config type transformers does not know, or without the task's head
    CONFIG_KEYS     a model_config key its config class does not know
    CONFIG_VALUES   a model_config value the model cannot be built or trained with
    IMAGE_SIZES     an image size no patch fits, or that the patches do not tile
    HEAD            a fine-tuned model trained on for other labels (warnings)
    TEXT_MODEL      a tokenizer that does not fit its model (Task.check_model, after the pad token is fitted)
    SAVED_TASK      a saved model with no head to evaluate, or whose task its config does not tell
    LORA_*          LoRA's targets and rank
    DEVICE*, PROCESS_*, MEMORY_*, PLAN, UNSPLITTABLE, NO_FIT, SPLIT: the layer split's devices and plan

Nothing of the core is imported here: what a rule reads comes in its subject (the built model, its config,
a `Loading`, a `Fit`, an `Adapters`, an `Unfit`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.checks import rule
from finetune.errors import first_line
from finetune.layout import CHECKPOINTS, COMPLETE, MANIFEST, RunDir, is_hub_name
from finetune.text import a, pasted

# --- loading: a model, a tokenizer, an image processor ----------------------------------------------------

# What a folder must hold for each kind of thing loaded from it (any one of them); the first three are named.
HOLDS = {
    "tokenizer": ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "vocab.json", "merges.txt",
                  "spiece.model", "sentencepiece.bpe.model", "tokenizer.model"),
    "image processor": ("preprocessor_config.json",),
    "model": ("config.json",),
}  # fmt: skip


@dataclass
class Loading:
    """What failed to load: `what` ("model", "tokenizer", "image processor") by `name`, the library's
    `error`, and `setting`, the setting the user gave the name in where it is not `what`'s own (a tokenizer
    read from model_name_or_path). For a model: its `task`, the auto class (`auto`) and whether pickle
    weights are allowed."""

    what: str
    name: str
    error: BaseException
    setting: str | None = None
    task: str | None = None
    auto: Any = None
    allow_pickle: bool = False

    @property
    def said(self) -> str:
        return self.setting or self.what

    @property
    def folder(self) -> Path:
        return Path(self.name).expanduser()

    def lacks_its_files(self) -> bool:
        """A local folder without any of the files a `what` folder holds (and not a checkpoint's)."""
        needs = HOLDS.get(self.what, ())
        return self.folder.is_dir() and bool(needs) and not any((self.folder / f).exists() for f in needs)


def offline_hint(name: str) -> str:
    """Under HF_HUB_OFFLINE, for a hub name (a folder on disk: no download would help), what to do."""
    local = Path(name).expanduser().exists()
    if not local and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return " (HF_HUB_OFFLINE is set: download it while online, or give a local directory)"
    return ""


@rule("models.path_missing")
def path_missing(load: Loading) -> str | None:
    """A model, tokenizer or image processor path that is not there (and is no hub name)."""
    if not is_hub_name(load.name) and not load.folder.exists():
        return f"{load.said} path does not exist: {load.name}"
    return None


@rule("models.weights_a_folder")
def weights_a_folder(load: Loading) -> str | None:
    """A model folder whose model.safetensors is a folder: transformers would say the weights are missing."""
    if (load.folder / "model.safetensors").is_dir():
        return (f"{load.said} '{load.name}': its model.safetensors is a folder, not a weights file; put back the "
                "file it was saved with, or give another model")
    return None


@rule("models.training_state_checkpoint")
def training_state_checkpoint(load: Loading) -> str | None:
    """A run's training-state checkpoint (<run>/checkpoints/step-N) given as a model: it is resumed, not
    loaded; the line names the run's export and the resume."""
    folder = load.folder
    if not folder.is_dir() or not ((folder / MANIFEST).exists() or (folder / COMPLETE).exists()):
        return None
    if (folder / "config.json").exists():
        return None
    run = RunDir(folder.resolve().parent.parent)  # <run>/checkpoints/step-N
    if folder.resolve().parent.name != CHECKPOINTS:  # moved out of its run
        run = RunDir(folder / "no-run")
    export = run.model if (run.model / "config.json").is_file() else "<run>/model"
    own = f" output_dir={pasted(run.root)}" if run.config.is_file() else ""  # the run's own recipe, as it ran
    return (f"{load.said} '{load.name}' is a training-state checkpoint, not a model folder: give the run's export "
            f"({export}), or resume it with resume_from_checkpoint={pasted(folder)}{own}")


@rule("models.lora_adapter_alone")
def lora_adapter_alone(load: Loading) -> str | None:
    """A run's LoRA adapter (<run>/adapter: peft's matrices, no base model) given as a model."""
    if not load.lacks_its_files() or not (load.folder / "adapter_config.json").is_file():
        return None
    export = RunDir(load.folder.resolve().parent).model
    export = export if (export / "config.json").is_file() else "<run>/model"
    return (f"{load.said} '{load.name}' is a LoRA adapter alone (adapter_config.json), not a model folder: give the "
            f"run's export ({export})")


@rule("models.run_folder")
def run_folder(load: Loading) -> str | None:
    """A run's folder given as a model: its export (<run>/model) is the model."""
    if load.lacks_its_files() and (RunDir(load.folder).model / "config.json").is_file():
        return f"{load.said} '{load.name}' is a run's folder, not a model folder: give its export ({RunDir(load.folder).model})"
    return None


# For a tokenizer or an image processor not found: the other kind, and the words for each kind of model.
OTHER_KIND = {"tokenizer": ("image processor", "an image", "a text"),
              "image processor": ("tokenizer", "a text", "an image")}  # fmt: skip


@rule("models.other_modality_folder")
def other_modality_folder(load: Loading) -> str | None:
    """An image model's export given to a text run (its tokenizer read from it), or a text model's to an
    image run."""
    if load.what not in OTHER_KIND or not load.lacks_its_files() or not (load.folder / "config.json").is_file():
        return None
    held, kind, wanted = OTHER_KIND[load.what]
    if not any((load.folder / f).exists() for f in HOLDS[held]):
        return None
    return (f"{load.said} '{load.name}' is {kind} model's folder ({a(held)}, no {load.what}): {wanted} run starts "
            f"from {wanted} model; give one as model_name_or_path")


@rule("models.holds_no_files")
def holds_no_files(load: Loading) -> str | None:
    """A local folder with none of the files of what is loaded from it (a data folder as the model): said
    so, with what to give, not transformers' first line about a file it looked for."""
    if not load.lacks_its_files():
        return None
    needs = HOLDS[load.what]
    files = ", ".join(needs[:3]) + (", ..." if len(needs) > 3 else "")
    return (f"{load.said} '{load.name}' holds no {load.what} files ({files}): give a model folder (an export, "
            f"<run>/model) or " + ("a hub name" if load.what == "model" else f"{a(load.what)}'s folder"))


@rule("models.custom_code")
def custom_code(load: Loading) -> str | None:
    """A model (or its tokenizer) that ships its own Python code (config.json's `auto_map`, or transformers'
    words about remote code) and trust_remote_code is off: said in the setting's words, not transformers'."""
    config = load.folder / "config.json"
    try:
        mapped = "auto_map" in config.read_text() if config.is_file() else False
    except OSError:
        mapped = False
    if mapped or "trust_remote_code" in str(load.error):
        return (f"{load.said} '{load.name}' ships its own Python code (config.json's auto_map), which is run only with "
                "trust_remote_code=true: set it if you trust where the model comes from, or give a model that "
                "transformers builds without code of its own")
    return None


@rule("models.load_failed")
def load_failed(load: Loading) -> str:
    """A model, tokenizer or image processor that does not load for another reason: transformers' first
    line, and under HF_HUB_OFFLINE for a hub name the hint to download it while online."""
    return (f"could not load {load.what} '{load.name}'{f' ({load.setting})' if load.setting else ''}: "
            f"{first_line(load.error)}{offline_hint(load.name)}")


LOAD_FAILED = [path_missing, weights_a_folder, training_state_checkpoint, lora_adapter_alone, run_folder,
               other_modality_folder, holds_no_files, custom_code, load_failed]  # fmt: skip


# --- a pretrained model ----------------------------------------------------------------------------------

# The model types named when one has no head for the task: the first three that have one.
KNOWN_TYPES = ("bert", "distilbert", "roberta", "vit", "deit", "convnext")


def head_types(auto) -> dict[str, str] | None:
    """transformers' model types that `auto` (AutoModelForSequenceClassification...) builds a model for, from
    its mapping (MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES); None where transformers names none."""
    import re

    from transformers.models.auto import modeling_auto

    head = re.sub(r"(?<!^)(?=[A-Z])", "_", auto.__name__.removeprefix("AutoModelFor")).upper()
    return getattr(modeling_auto, f"MODEL_FOR_{head}_MAPPING_NAMES", None)


def types_with_head(auto) -> list[str]:
    types = head_types(auto) or {}
    return [t for t in KNOWN_TYPES if t in types][:3] or ["bert", "vit"]


@rule("models.not_a_model_for_the_task")
def not_a_model_for_the_task(load: Loading) -> str | None:
    """A pretrained model of a type without the task's head (a tokenizer-only folder, an image model for
    text): transformers' "Unrecognized configuration class" names its classes, not what to choose."""
    if isinstance(load.error, ValueError) and "Unrecognized configuration class" in str(load.error):
        return (f"'{load.name}' is not a model that {load.auto.__name__} can load for {load.task}; "
                f"choose a model type that has {a(load.task)} head (e.g. {', '.join(types_with_head(load.auto))})")
    return None


def has_pickle_weights_only(name: str) -> bool:
    path = Path(name).expanduser()
    if not path.is_dir():
        return False
    names = {p.name for p in path.iterdir()}
    return not any(
        n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names
    ) and any(n.startswith("pytorch_model") and n.endswith((".bin", ".bin.index.json")) for n in names)


@rule("models.pickle_weights_only")
def pickle_weights_only(load: Loading) -> str | None:
    """A model folder with only pickle weights (pytorch_model.bin), which can run code when loaded:
    refused unless the user opts in (allow_pickle_weights=true)."""
    if isinstance(load.error, OSError) and not load.allow_pickle and has_pickle_weights_only(load.name):
        return (f"model '{load.name}' has only pickle weights (pytorch_model.bin), which can run code when loaded; "
                "convert it to safetensors, or pass allow_pickle_weights=true if you trust its source")
    return None


@rule("models.weights_damaged")
def weights_damaged(load: Loading) -> str | None:
    """A model.safetensors that safetensors cannot read (cut short, its header garbage)."""
    from safetensors import SafetensorError

    if isinstance(load.error, SafetensorError):
        return f"the weights of model '{load.name}' are damaged ({first_line(load.error)}): replace them"
    return None


@rule("models.pickle_holds_code")
def pickle_holds_code(load: Loading) -> str | None:
    """Pickle weights (allow_pickle_weights=true) that do not load as plain data: they hold code or objects
    other than tensors, which torch's weights-only loading refuses to run. Nothing of them ran."""
    import pickle

    if isinstance(load.error, pickle.UnpicklingError):
        return (f"the pickle weights of model '{load.name}' do not load as plain data (they hold code or objects other "
                "than tensors, which were not run): convert a copy you trust to safetensors, or give another model")
    return None


PRETRAINED = [not_a_model_for_the_task, pickle_weights_only, pickle_holds_code, weights_damaged, *LOAD_FAILED]


# --- a model built from model_config ------------------------------------------------------------------


@rule("models.unknown_model_type")
def unknown_model_type(model_type: Any, task: str, auto, modality: str) -> str | None:
    """A model_config.model_type transformers does not know: named with the closest that has the task's
    head, not transformers' list of several hundred."""
    import difflib

    from transformers import CONFIG_MAPPING

    types = head_types(auto)
    if types is None or model_type in types or (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        return None
    close = difflib.get_close_matches(str(model_type), sorted(types), n=1, cutoff=0.6)
    return (f"model_config.model_type={model_type} is not a model type that transformers knows; "
            + (f"did you mean {close[0]}? " if close else "") + f"choose {a(modality)} model type such as "
            f"{', '.join(types_with_head(auto))}")


@rule("models.no_head_for_the_task")
def no_head_for_the_task(model_type: Any, task: str, auto, modality: str) -> str | None:
    """A model type that has no head for the task (model_config.model_type=vit on text), refused before its
    config is built: the settings the task adds (a tokenizer's vocab_size) would be blamed instead."""
    types = head_types(auto)
    if types is None or model_type in types:
        return None
    return (f"model_config.model_type={model_type} has no {task} head in transformers ({auto.__name__}); choose "
            f"{a(modality)} model such as {', '.join(types_with_head(auto))}")


MODEL_TYPE = [unknown_model_type, no_head_for_the_task]


@rule("models.model_config_rejected")
def model_config_rejected(task: str, error: BaseException) -> str:
    """A model_config its config class refuses (a value of the wrong type, transformers' own validation):
    its field and its why, from the library's first two lines."""
    said = " ".join(line.strip() for line in str(error).splitlines()[:2] if line.strip())
    return f"cannot build a {task} model from model_config: {said or first_line(error)}"


CONFIG_REJECTED = [model_config_rejected]


@rule("models.model_not_built")
def model_not_built(task: str, error: BaseException) -> str:
    """A model_config whose config is made but whose model transformers cannot build from it."""
    return f"cannot build a {task} model from model_config: {error}"


NOT_BUILT = [model_not_built]


@rule("models.model_config_unknown_key")
def model_config_unknown_key(config, spec: dict[str, Any]) -> str | None:
    """A model_config key the model's config class does not know (a typo: image_sise): transformers would
    store it and ignore it."""
    import difflib

    known = set(type(config)().to_dict())
    key = next((key for key in spec if key not in known), None)
    if key is None:
        return None
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"model_config: {type(config).__name__} has no setting '{key}'{hint}"


CONFIG_KEYS = [model_config_unknown_key]

# Sizes a model built from model_config needs at 1 or more: at 0 or below it fails mid-build (a division
# by zero, an empty table) or, for num_hidden_layers, trains a model with no layers without a word.
POSITIVE = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
            "max_position_embeddings", "type_vocab_size", "image_size", "patch_size", "num_channels", "dim",
            "hidden_dim", "n_heads", "n_layers")  # fmt: skip


@rule("models.size_below_one")
def size_below_one(config) -> str | None:
    """A model_config size below 1 (hidden_size=0, num_hidden_layers=-1): the build fails midway, or a
    model with no layers trains without a word."""
    values = config.to_dict()
    for key in POSITIVE:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            return f"model_config.{key}={value}: it must be 1 or more"
    return None


@rule("models.heads_do_not_divide")
def heads_do_not_divide(config) -> str | None:
    """A hidden size the attention heads do not divide: each head takes an equal share, and ViT would
    silently drop the remainder."""
    values = config.to_dict()
    hidden = values.get("hidden_size", values.get("dim"))
    heads = values.get("num_attention_heads", values.get("n_heads"))
    if not (isinstance(hidden, int) and isinstance(heads, int) and hidden % heads):
        return None
    return (f"model_config: hidden_size {hidden} is not a multiple of num_attention_heads {heads} (each head "
            f"takes an equal share); choose num_attention_heads among "
            f"{', '.join(str(n) for n in range(1, hidden + 1) if hidden % n == 0 and n <= 64)}")


@rule("models.unknown_activation")
def unknown_activation(config) -> str | None:
    """A hidden_act transformers does not have: the build would fail with its KeyError."""
    from transformers.activations import ACT2FN

    values = config.to_dict()
    act = values.get("hidden_act", values.get("activation"))
    if not isinstance(act, str) or act in ACT2FN:
        return None
    known = ", ".join(sorted(k for k in ACT2FN if k in ("gelu", "relu", "silu", "swish", "tanh", "gelu_new")))
    return f"model_config.hidden_act={act!r} is not an activation transformers has; choose one of {known}"


@rule("models.pad_token_outside_vocabulary")
def pad_token_outside_vocabulary(config) -> str | None:
    """A model_config.pad_token_id outside the vocabulary: the embedding table has no row for it."""
    values = config.to_dict()
    pad, vocab = values.get("pad_token_id"), values.get("vocab_size")
    if isinstance(pad, int) and isinstance(vocab, int) and not 0 <= pad < vocab:
        return (f"model_config.pad_token_id={pad} is outside the vocabulary (ids 0 to {vocab - 1}); leave it out, "
                "or give the tokenizer's padding id")
    return None


def _image_sizes(config) -> tuple[Any, Any, list[int]]:
    image_size, patch_size = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    return image_size, patch_size, [v if isinstance(v, int) else min(v) for v in (image_size, patch_size) if v is not None]


@rule("models.image_smaller_than_patch")
def image_smaller_than_patch(config) -> str | None:
    """An image model whose image_size is below its patch_size: no patch fits."""
    image_size, patch_size, sizes = _image_sizes(config)
    if len(sizes) == 2 and sizes[0] < sizes[1]:
        return (f"the model's image_size {image_size} is smaller than its patch_size {patch_size}: "
                "no patch fits; raise image_size or lower patch_size")
    return None


@rule("models.image_not_a_multiple_of_patch")
def image_not_a_multiple_of_patch(config) -> str | None:
    """An image_size the patches do not tile: the last rows and columns of pixels are never seen."""
    image_size, patch_size, sizes = _image_sizes(config)
    if len(sizes) != 2 or not sizes[0] % sizes[1]:
        return None
    fits = sizes[0] // sizes[1] * sizes[1]
    return (f"the model's image_size {image_size} is not a multiple of its patch_size {patch_size}: the last "
            f"{sizes[0] - fits} rows and columns of pixels would fall outside every patch; set "
            f"model_config.image_size to {fits} or {fits + sizes[1]}, or a patch_size that divides it")


IMAGE_SIZES = [image_smaller_than_patch, image_not_a_multiple_of_patch]


@rule("models.image_size_of_a_patch_model")
def image_size_of_a_patch_model(image_size: int | None, config) -> str | None:
    """image_size for a model that cuts images into patches (ViT): its position embeddings are for the size
    it was built for, so another size fails at the first batch; the setting is for convolutional models."""
    if image_size is None or getattr(config, "patch_size", None) is None:
        return None
    return (f"image_size={image_size}: {type(config).__name__.removesuffix('Config')} cuts images into patches and "
            f"takes only its own size ({getattr(config, 'image_size', '?')}); drop image_size (for a ViT built from a "
            "config, set model_config.image_size)")


@rule("models.image_size_below_the_convolutions")
def image_size_below_the_convolutions(image_size: int | None, config) -> str | None:
    """An image_size smaller than a convolutional model takes: its stem and stride-2 blocks (EfficientNet's
    `strides`) halve the image until a kernel is larger than what is left, and the first batch fails."""
    strides = getattr(config, "strides", None)
    if image_size is None or not isinstance(strides, (list, tuple)) or not all(isinstance(s, int) for s in strides):
        return None
    smallest = 2 * math.prod(strides)  # the stem's stride 2, then each stage's
    if image_size < smallest:
        return (f"image_size={image_size} is below the {smallest} pixels {type(config).__name__.removesuffix('Config')} "
                f"takes: its stem and blocks shrink an image {smallest} times, leaving less than a kernel; set "
                f"image_size={smallest} or more (a multiple of {smallest}), or drop it for the processor's own size")
    return None


IMAGE_SIZE_SETTING = [image_size_of_a_patch_model, image_size_below_the_convolutions]
CONFIG_VALUES = [size_below_one, heads_do_not_divide, unknown_activation, pad_token_outside_vocabulary, *IMAGE_SIZES]


# --- a fine-tuned model's head ----------------------------------------------------------------------------


def _names(names: list[str]) -> str:
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


IMAGENET_HEADS = (1000, 1001, 21841, 21843)  # ImageNet-1k (with a background class), ImageNet-21k: a pretraining's


@rule("models.head_replaced", warning=True)
def head_replaced(name: str, head: list[str], labels: list[str], new_head: bool) -> str | None:
    """A fine-tuned model trained on for another number of labels: its encoder is kept and its head
    replaced by a random one, which the user may not expect. Not said of an ImageNet head (1,000 or
    21,841 classes): that is how image backbones are pretrained, and replacing it is the usual fine-tune."""
    if not new_head or len(head) in IMAGENET_HEADS:
        return None
    return (f"model '{name}' was fine-tuned for {len(head)} labels ({_names(head)}) and the data has {len(labels)} "
            f"({_names(labels)}): its encoder is kept and a new head is trained from random weights")


@rule("models.head_relabelled", warning=True)
def head_relabelled(name: str, head: list[str], labels: list[str], new_head: bool) -> str | None:
    """A fine-tuned model trained on for as many labels of other names: its head's outputs are trained as
    the data's labels, in order, which is wrong if they mean other things."""
    if new_head:
        return None
    return (f"model '{name}' was fine-tuned for the labels ({_names(head)}); the data's are ({_names(labels)}): its "
            "head's outputs are trained on as the data's labels, in that order; if they mean other things, start "
            "from its base model")


HEAD = [head_replaced, head_relabelled]


# --- freezing layers ---------------------------------------------------------------------------------------


@rule("models.freeze_layers_unknown_model")
def freeze_layers_unknown_model(model_class: str) -> str:
    """freeze_layers on a model whose embeddings and encoder layers (or stem and blocks) cannot be found."""
    return f"freeze_layers: {model_class} has no embeddings and encoder layers (or stem and blocks) that finetune can find"


FREEZE_UNKNOWN = [freeze_layers_unknown_model]


@rule("models.freeze_layers_past_the_model")
def freeze_layers_past_the_model(n: int, layers: int, model_class: str) -> str | None:
    """freeze_layers above the model's number of encoder layers."""
    if n <= layers:
        return None
    has = f"{layers} encoder layer" + ("s" if layers != 1 else "")
    return f"freeze_layers={n} but {model_class} has {has}: set freeze_layers={layers} or less"


FREEZE = [freeze_layers_past_the_model]


# --- a text model and its tokenizer ------------------------------------------------------------------------


@rule("models.tokenizer_name_needed")
def tokenizer_name_needed(name: str | None) -> str | None:
    """A text model built from model_config with no tokenizer named: there is no folder to read one from."""
    return "a text model built from model_config needs tokenizer_name" if name is None else None


TOKENIZER_SOURCE = [tokenizer_name_needed]


@dataclass
class Fit:
    """A built text model and its tokenizer, as `Task.check_model` asks about them: `name`, where the
    tokenizer came from; `data`, the data settings (max_length, pad_to_multiple_of, text_pair_column);
    `exported`: the tokenizer is a saved model's own (evaluation), which no setting replaces."""

    model: Any
    tokenizer: Any
    name: str | None
    data: Any
    exported: bool = False

    @property
    def built(self) -> bool:
        """From model_config: its sizes are the user's to set."""
        return not getattr(self.model, "name_or_path", "")

    @property
    def positions(self) -> int | None:
        """The model's position limit. RoBERTa-style embeddings number positions from the padding id + 1,
        so their last rows are fewer than the table's size (roberta-base: 514 rows, 512 positions)."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        padding = getattr(getattr(self.model.base_model, "embeddings", None), "padding_idx", None)
        return limit - (padding + 1) if limit is not None and isinstance(padding, int) else limit

    @property
    def sizes(self) -> tuple[int, int]:
        """The tokenizer's size and the rows of the model's embedding table."""
        return len(self.tokenizer), self.model.get_input_embeddings().num_embeddings


@rule("models.no_padding_token")
def no_padding_token(fit: Fit) -> str | None:
    """A tokenizer with no padding token and none to pad with (no end-of-text or unknown token): batches
    could not be padded; said before anything is written, not at the first batch."""
    if fit.tokenizer.pad_token_id is not None:
        return None
    return (f"the tokenizer of {fit.name} has no padding token, and no end-of-text or unknown token to pad "
            "with; use a tokenizer that has one (tokenizer_name), or add a pad_token to its "
            "tokenizer_config.json / special_tokens_map.json")


@rule("models.max_length_past_positions")
def max_length_past_positions(fit: Fit) -> str | None:
    """A max_length past the model's position table: the longest batch would index past it (an IndexError
    mid-run)."""
    limit, max_length = fit.positions, fit.data.max_length
    if limit is not None and max_length > limit:
        return f"max_length {max_length} exceeds the model's position limit {limit}; set max_length={limit} or less"
    return None


@rule("models.padded_past_positions")
def padded_past_positions(fit: Fit) -> str | None:
    """A pad_to_multiple_of that rounds the longest batch up past the model's position table."""
    limit, max_length, multiple = fit.positions, fit.data.max_length, fit.data.pad_to_multiple_of
    if limit is None or not multiple:
        return None
    longest = -(-max_length // multiple) * multiple  # the longest batch after rounding up
    if longest <= limit:
        return None
    return (f"pad_to_multiple_of={multiple} pads batches of up to max_length={max_length} tokens to {longest}, past "
            f"the model's position limit {limit}; choose a multiple that divides a length of at most {limit}, or null")


@rule("models.tokenizer_without_vocabulary")
def tokenizer_without_vocabulary(fit: Fit) -> str | None:
    """A tokenizer with only its special tokens: a model folder without tokenizer files still loads one,
    and every word becomes [UNK]."""
    size = len(fit.tokenizer)
    if size > len(set(fit.tokenizer.all_special_ids)):
        return None
    return (f"the tokenizer of {fit.name} has no vocabulary, only its {size} special tokens: the folder holds no "
            "tokenizer files (vocab.txt, tokenizer.json); "
            + ("copy the tokenizer files of the model it was trained from into it" if fit.exported else
               "set tokenizer_name to the model's tokenizer"))  # fmt: skip


@rule("models.tokenizer_larger_than_the_table")
def tokenizer_larger_than_the_table(fit: Fit) -> str | None:
    """A tokenizer larger than the model's embedding table: its last ids have no row (an IndexError in
    training)."""
    size, rows = fit.sizes
    if size <= rows:
        return None
    return (f"the tokenizer of {fit.name} has {size} tokens, more than the {rows} rows of the model's embedding "
            f"table (ids from {rows} on have none): "
            + (f"set model_config.vocab_size={size} (or leave it out: the tokenizer's size is the default)"
               if fit.built else "it is not the model's tokenizer; use the model's own"))  # fmt: skip


@rule("models.tokenizer_smaller_than_the_table")
def tokenizer_smaller_than_the_table(fit: Fit) -> str | None:
    """A tokenizer far smaller than the model's embedding table: another model's (a table padded to a round
    size is a few percent larger than its tokenizer, and passes)."""
    size, rows = fit.sizes
    if size >= 0.9 * rows:
        return None
    return (f"the tokenizer of {fit.name} has {size} tokens for the {rows} rows of the model's embedding table: "
            + (f"set model_config.vocab_size={size} (or leave it out)" if fit.built else
               "it is not the model's tokenizer (a padded table is a few percent larger, not more); use the "
               "model's own"))  # fmt: skip


@rule("models.pairs_without_token_types")
def pairs_without_token_types(fit: Fit) -> str | None:
    """Sentence pairs on a model with one token type: the second text's type 1 has no row (an IndexError
    at the first batch)."""
    types = getattr(fit.model.config, "type_vocab_size", None)
    pair = fit.data.text_pair_column is not None
    if not (pair and isinstance(types, int) and types < 2 and "token_type_ids" in fit.tokenizer.model_input_names):
        return None
    return (f"sentence pairs mark their second text with token type 1, but the model has {types} token type: "
            + ("set model_config.type_vocab_size=2" if fit.built else "this model was not made for pairs; choose one "
               "that was, or one whose tokenizer gives no token types (roberta)"))  # fmt: skip


@rule("models.max_length_without_room")
def max_length_without_room(fit: Fit) -> str | None:
    """A max_length that the special tokens the tokenizer adds fill: no room is left for text."""
    added = fit.tokenizer.num_special_tokens_to_add(pair=fit.data.text_pair_column is not None)
    if fit.data.max_length > added:
        return None
    return (f"max_length={fit.data.max_length} leaves no room for text: the tokenizer adds {added} special tokens "
            "to every sample; raise max_length")


POSITIONS = [max_length_past_positions, padded_past_positions]
TOKENIZER = [tokenizer_without_vocabulary, tokenizer_larger_than_the_table, tokenizer_smaller_than_the_table,
             pairs_without_token_types, max_length_without_room]  # fmt: skip
TEXT_MODEL = [no_padding_token, *POSITIONS, *TOKENIZER]


# --- the task of a saved model ----------------------------------------------------------------------------


@rule("models.base_model_not_fine_tuned")
def base_model_not_fine_tuned(spec: str, architectures: list[str], id2label: dict, suffixes: list[str]) -> str | None:
    """A pretrained base model (BertModel, BertForMaskedLM: no head of ours, transformers' default labels)
    to evaluate: its classifier would be random weights."""
    import re

    heads = [x for x in architectures if x.endswith(tuple(suffixes))]
    defaults = all(re.fullmatch(r"LABEL_\d+", str(v)) for v in id2label.values())
    if not architectures or heads or not defaults:
        return None
    return (f"{spec} is a pretrained base model ({', '.join(architectures)}), not a fine-tuned one: it has no "
            f"classifier to evaluate; fine-tune it first (finetune/run.py model_name_or_path={pasted(spec)}) and evaluate "
            "the run's export (<output_dir>/model)")


SAVED_TASK = [base_model_not_fine_tuned]


@rule("models.task_unknown")
def task_unknown(spec: str, architectures: list[str], task_names: tuple[str, ...]) -> str:
    """A saved model whose config's architectures name no task's head, evaluated without --task."""
    return (f"cannot tell the task of {spec} from its config (architectures {architectures}); "
            f"pass --task {' or --task '.join(task_names)}")


TASK_UNKNOWN = [task_unknown]


# --- LoRA ----------------------------------------------------------------------------------------------------


@rule("models.peft_missing")
def peft_missing() -> str:
    """peft= given without peft installed (an optional extra)."""
    return "peft (LoRA) is not installed: pip install peft (or pip install -e '.[peft]')"


PEFT_MISSING = [peft_missing]


@rule("models.lora_no_query_value")
def lora_no_query_value(model_class: str, linear: list[str], fits: list[str] | None) -> str | None:
    """peft.target_modules unset on a model with no query and value layers by a name LoRA's default knows."""
    if fits is not None:
        return None
    return (f"peft.target_modules: {model_class} has no query/value layers of a known name; set "
            f"peft.target_modules=[...] from its linear layers: {', '.join(linear)}")


LORA_DEFAULT = [lora_no_query_value]


@dataclass
class Adapters:
    """What LoRA is asked to adapt: the model's class name, the names of its linear layers outside the head
    (`linear`), `targets`, the rank `r`, the widths of the layers targeted and the head modules' names."""

    model_class: str
    linear: list[str]
    targets: list[str]
    r: int
    widths: set[int] = field(default_factory=set)
    heads: tuple[str, ...] = ()


@rule("models.lora_target_head")
def lora_target_head(lora: Adapters) -> str | None:
    """The classification head among peft.target_modules: it is trained whole beside the adapters
    (modules_to_save), so it takes no adapter."""
    heads = [t for t in lora.targets if t in lora.heads and t not in lora.linear]
    if not heads:
        return None
    return (f"peft.target_modules {heads}: the classification head is trained whole beside the adapters, so it takes "
            f"no adapter; leave it out (the layers LoRA can adapt: {', '.join(lora.linear)})")


@rule("models.lora_target_unknown")
def lora_target_unknown(lora: Adapters) -> str | None:
    """peft.target_modules that are not linear layers of the model (another model's names: q_proj on BERT)."""
    missing = [t for t in lora.targets if t not in lora.linear]
    if not missing:
        return None
    return (f"peft.target_modules {missing} are not linear layers of {lora.model_class}; "
            f"its linear layers are: {', '.join(lora.linear)}")


@rule("models.lora_rank_above_width")
def lora_rank_above_width(lora: Adapters) -> str | None:
    """peft.r above the width of the layers it adapts: a low-rank update has rank at most that width, so the
    rest adds weights and nothing else."""
    if not lora.widths or lora.r <= min(lora.widths):
        return None
    width = min(lora.widths)
    return (f"peft.r={lora.r} is above the width of the layers LoRA adapts ({width}: {', '.join(lora.targets)}), "
            f"where a low-rank update has rank at most {width}; use peft.r of at most {width} (LoRA's usual ranks "
            "are 4 to 64)")


LORA_TARGETS = [lora_target_head, lora_target_unknown, lora_rank_above_width]


# --- the layer split: devices ------------------------------------------------------------------------------


@rule("models.device_unknown")
def device_unknown(item: str, spec: str) -> str:
    """A name in devices= that torch does not read as a device (tpu:0, a blank between commas)."""
    return f"unknown device {item.strip()!r} in devices={spec!r}; use e.g. cuda:0,cuda:1 or cuda:0,cpu"


DEVICE_UNKNOWN = [device_unknown]


@rule("models.device_missing")
def device_missing(device, name: str, spec: str, gpus: int) -> str | None:
    """A GPU in devices= that this machine does not have."""
    index = 0 if device.index is None else device.index
    if device.type != "cuda" or index < gpus:
        return None
    have = f"only cuda:0..cuda:{gpus - 1}" if gpus else "no CUDA GPU"
    return f"device {name} does not exist: this machine has {have}; fix devices={spec!r}"


@rule("models.device_unsupported")
def device_unsupported(device, name: str, spec: str, gpus: int) -> str | None:
    """A device the layer split does not place layers on (mps, meta): only cuda:N and cpu."""
    if device.type in ("cuda", "cpu"):
        return None
    return f"device {name} is not supported for model parallelism; use cuda:N or cpu in devices={spec!r}"


DEVICE = [device_missing, device_unsupported]


@rule("models.device_lists_per_process")
def device_lists_per_process(spec: str, lists: int, processes: int) -> str | None:
    """Device lists separated by ';' that are not one per process on this machine."""
    if lists == processes:
        return None
    return (f"devices={spec!r} gives {lists} device lists for {processes} processes on this machine; give one list "
            "per process, separated by ';'")


PROCESS_LISTS = [device_lists_per_process]


@rule("models.gpus_do_not_divide")
def gpus_do_not_divide(gpus: int, processes: int) -> str | None:
    """DDP x layer split with no devices given: the visible GPUs must split evenly among the processes."""
    if not gpus % processes:
        return None
    return (f"{gpus} visible GPUs do not split evenly among {processes} processes on this machine; launch a number "
            f"of processes that divides {gpus}, or give devices per process (cuda:0,cuda:1;cuda:2)")


PROCESS_GPUS = [gpus_do_not_divide]


@rule("models.gpus_shared")
def gpus_shared(spec: str, devices: list, processes: int) -> str | None:
    """One device list naming GPUs for several processes: two processes of an NCCL group cannot share a GPU."""
    if not any(d.type == "cuda" for d in devices):
        return None
    return (f"devices={spec!r} would put each of the {processes} processes on this machine on the same GPUs; leave "
            "devices unset to split the visible GPUs evenly, or give one list per process separated by ';' "
            "(cuda:0,cuda:1;cuda:2,cuda:3)")


PROCESS_SHARED = [gpus_shared]


@rule("models.memory_size_unreadable")
def memory_size_unreadable(value: Any) -> str:
    """A max_memory size that is neither bytes nor a number with a unit (2GiB, 500MB)."""
    return f"cannot read memory size {value!r}; use bytes or a unit, e.g. 2GiB or 500MB"


MEMORY_SIZE = [memory_size_unreadable]


@rule("models.memory_key_not_a_device")
def memory_key_not_a_device(key: Any) -> str:
    """A max_memory key that is not a device (cuda:0, cpu, or a GPU's index)."""
    return f"max_memory key {key!r} is not a device; use e.g. cuda:0 or cpu"


MEMORY_KEY = [memory_key_not_a_device]


# --- the layer split: the plan -------------------------------------------------------------------------------


@rule("models.mixed_precision_unknown")
def mixed_precision_unknown(devices: list, mixed_precision: str, known: tuple[str, ...]) -> str | None:
    """A mixed precision the memory estimate has no element size for."""
    if mixed_precision in known:
        return None
    return f"mixed_precision must be one of {', '.join(known)}, got {mixed_precision!r}"


@rule("models.no_devices")
def no_devices(devices: list, mixed_precision: str, known: tuple[str, ...]) -> str | None:
    """A layer split asked of no device at all."""
    return None if devices else "model parallelism needs at least one device"


PLAN = [mixed_precision_unknown, no_devices]


@rule("models.no_encoder_layers")
def no_encoder_layers(model_class: str, error) -> str | None:
    """A model to split whose list of encoder layers is empty."""
    return f"cannot split {model_class}: it has no encoder layers" if error.why == "no layers" else None


@rule("models.parameters_outside_layers")
def parameters_outside_layers(model_class: str, error) -> str | None:
    """A model to split with weights of its own between its blocks, which no stage would hold."""
    if error.why != "outside":
        return None
    return f"cannot split {model_class}: {error.where or 'the model'} holds parameters outside its layers"


@rule("models.config_without_size")
def config_without_size(model_class: str, error) -> str | None:
    """A model whose config names no size the memory estimate reads (hidden_size, num_attention_heads...)."""
    if error.why != "config":
        return None
    return f"cannot estimate memory: the model config has none of {error.where}"


@rule("models.not_layered")
def not_layered(model_class: str, error) -> str:
    """A model the layer split does not know: it splits BERT-like models, with `embeddings` and a list of
    encoder layers."""
    return (f"cannot split {model_class}: model parallelism supports BERT-like models with "
            "`embeddings` and a list of encoder layers (BERT, RoBERTa, DistilBERT, ViT, DeiT)")


UNSPLITTABLE = [no_encoder_layers, parameters_outside_layers, config_without_size, not_layered]


@rule("models.more_devices_than_blocks")
def more_devices_than_blocks(devices: int, blocks: int) -> str | None:
    """More devices than blocks to place (embeddings, each encoder layer, the head): a stage would be empty."""
    if devices <= blocks:
        return None
    return (f"{devices} devices but only {blocks} layers to place (embeddings, {blocks - 2} encoder layers, head); "
            f"use at most {blocks} devices")


BLOCKS = [more_devices_than_blocks]


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class Unfit:
    """A layer split that fits no device's capacity: the devices, their capacities, what each stage of the
    most even split needs, and what the estimate was made for."""

    devices: list
    capacities: list[int]
    needs: list[int]
    micro_batch_size: int
    seq_len: int


@rule("models.does_not_fit")
def does_not_fit(unfit: Unfit) -> str:
    """A model whose training memory (weights, gradients, AdamW state, activations) fits no split over the
    devices: said with what the most even split needs where, before anything is placed."""
    over = ", ".join(f"{format_bytes(need)} on {device} (stage {k}, capacity {format_bytes(cap)})" for k, (need, device, cap)
                     in enumerate(zip(unfit.needs, unfit.devices, unfit.capacities, strict=True)) if need > cap)  # fmt: skip
    return (f"the model does not fit for training on {','.join(map(str, unfit.devices))} at "
            f"micro_batch_size={unfit.micro_batch_size}, seq_len={unfit.seq_len}: about {format_bytes(sum(unfit.needs))} "
            f"in all, and the most even split needs {over}; lower per_device_train_batch_size or max_length, raise "
            "max_memory, or add devices")


NO_FIT = [does_not_fit]


@rule("models.already_split")
def already_split(model, plan) -> str | None:
    """A model split a second time: its hooks would move every input twice."""
    return "the model is already split for model parallelism" if hasattr(model, "mp_state") else None


@rule("models.tied_across_devices")
def tied_across_devices(model, plan) -> str | None:
    """A parameter shared by blocks on different devices (an MLM head tied to the word embeddings): it
    would live on one device and be used on another. Sequence classifiers have none."""
    where: dict[int, tuple[str, Any]] = {}
    for stage in plan.stages:
        for block in (b for b in plan.blocks if b.name in stage.blocks):
            for m in block.modules:
                for pname, p in model.get_submodule(m).named_parameters():
                    if id(p) in where and where[id(p)][1] != stage.device:
                        return (f"{m}.{pname} is tied to {where[id(p)][0]}, which is on {where[id(p)][1]} but this "
                                f"stage is on {stage.device}; untie the weights or use devices that keep them together")
                    where.setdefault(id(p), (f"{m}.{pname}", stage.device))
    return None


SPLIT = [already_split, tied_across_devices]


@rule("models.pipeline_chunks_below_one")
def pipeline_chunks_below_one(chunks: int) -> str | None:
    """A pipelined forward asked for fewer than one micro-batch."""
    return f"pipeline_chunks must be at least 1, got {chunks}" if chunks < 1 else None


CHUNKS = [pipeline_chunks_below_one]
