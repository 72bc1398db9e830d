"""build_model: the one place where config meets the model.

Any checkpoint of the task's auto class (finetune/tasks/) by hub name or local directory, or a model
built from a config (tiny models for tests, a small ViT offline).
Models know nothing of the runtime: no devices, ranks or dtypes here; Accelerate places them.
What would not load, build or train is found by the rules of finetune/checks/models.py.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

from safetensors import SafetensorError
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from finetune import checks
from finetune.checks import models as model_rules
from finetune.config import ModelArgs
from finetune.errors import UserError
from finetune.parallel import ParallelError, find_blocks
from finetune.problems import Labels, problem_of
from finetune.tasks import task_of


def load_error(what: str, name: str, e: Exception, setting: str | None = None) -> UserError:
    """One line for a model, tokenizer or image processor that does not load (finetune/checks/models.py's
    LOAD_FAILED: a path not there, a folder that is no such folder, transformers' first line). `setting`: the
    setting the user gave the name in, where it is not `what`'s own (a tokenizer read from model_name_or_path)."""
    return checks.explain(model_rules.LOAD_FAILED, model_rules.Loading(what, name, e, setting))


def offline_hint(name: str) -> str:
    """Under HF_HUB_OFFLINE, for a hub name (a folder on disk: no download would help), what to do."""
    return model_rules.offline_hint(name)


def load_preprocessor(args: ModelArgs, model_config: PretrainedConfig | None = None):
    """The tokenizer or image processor that goes with the model (the task's, finetune/tasks/)."""
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


def build_model(args: ModelArgs, names: Labels, vocab_size: int | None = None,
                said: checks.Said | None = None) -> PreTrainedModel:  # fmt: skip
    """A model with the head the task's labels ask for (`Labels.head`: one output per name, the names in
    id2label/label2id) and `problem_type` in its config."""
    labels: dict[str, Any] = {
        **Labels(names).head(),
        # What the pipeline applies to the outputs (softmax, sigmoid, none); null: transformers' default
        # (transformers knows no problem_type for tags).
        **({"problem_type": hf} if (hf := problem_of(args.problem_type).hf_problem_type) and args.problem_type else {}),
    }
    if args.model_config is not None:
        return _from_config(args, labels, vocab_size)
    return _from_pretrained(args, labels, list(names), said or checks.Said())


def _from_config(args: ModelArgs, labels: dict[str, Any], vocab_size: int | None) -> PreTrainedModel:
    """A model at random from `model_config`, its values checked before the build."""
    task = task_of(args.task)
    auto = task.auto_model()
    # The labels and problem type are the data's, whatever the config (a saved model's) says.
    spec = {k: v for k, v in args.model_config.items() if k not in labels}
    model_type = spec.pop("model_type")
    # The type first: the settings the task adds (a tokenizer's vocab_size) would be blamed instead.
    checks.gate(model_rules.MODEL_TYPE, model_type, args.task, auto, task.modality)
    if vocab_size is not None:  # the tokenizer's: a model built for text
        spec.setdefault("vocab_size", vocab_size)
    try:
        config = AutoConfig.for_model(model_type, **spec, **labels)
    except Exception as e:  # ValueError, TypeError, huggingface_hub's strict-dataclass validation
        raise checks.explain(model_rules.CONFIG_REJECTED, args.task, e) from None
    checks.gate(model_rules.CONFIG_KEYS, config, spec)
    checks.gate(model_rules.CONFIG_VALUES, config)
    set_dropout(config, args.dropout)
    try:
        return auto.from_config(config, trust_remote_code=args.trust_remote_code)
    except (ValueError, KeyError, TypeError) as e:
        raise checks.explain(model_rules.NOT_BUILT, args.task, e) from None


def _from_pretrained(args: ModelArgs, labels: dict[str, Any], names: list[str], said: checks.Said):
    """A pretrained model with a head for `names`: a fine-tuned model's own head where its labels are
    the data's (reordered by name where they come in another order), a new one where their number differs."""
    auto = task_of(args.task).auto_model()
    name = args.model_name_or_path
    assert name is not None  # TrainConfig.validate guarantees a name or a config
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=args.trust_remote_code, **labels)
        head = _fine_tuned_head(AutoConfig.from_pretrained(name, trust_remote_code=args.trust_remote_code))
        new_head = head is not None and len(head) != len(names)
        # The same labels in another order (the names written otherwise): the head's outputs follow by name.
        order = [head.index(n) for n in names] if head and not new_head and sorted(head) == sorted(names) else None
        changes = head is not None and head != names and order is None  # said once the model loads
        set_dropout(config, args.dropout)
        # safetensors only, unless the user opts in: a pytorch_model.bin is a pickle that can run code
        # when loaded (transformers loads it with weights_only=True, still a wider surface).
        model = auto.from_pretrained(name, config=config, trust_remote_code=args.trust_remote_code,
                                     use_safetensors=None if args.allow_pickle_weights else True,
                                     ignore_mismatched_sizes=new_head)  # another number of labels: a new head
    except (ValueError, OSError, SafetensorError, pickle.UnpicklingError) as e:  # torch's weights-only refusal last
        loading = model_rules.Loading("model", name, e, task=args.task, auto=auto, allow_pickle=args.allow_pickle_weights)
        raise checks.explain(model_rules.PRETRAINED, loading) from None
    if changes or (order is not None and order != sorted(order) and not _reorder_head(model, order)):
        checks.gate(model_rules.HEAD, name, head, names, new_head, said=said)
    checks.gate(model_rules.IMAGE_SIZES, model.config)
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


def freeze_layers(model: PreTrainedModel, n: int) -> None:
    """Freeze the embeddings and the first `n` encoder layers: BERT-like models and ViT (the blocks the
    layer split knows, finetune/parallel.py), and a convolutional backbone's stem and first `n` blocks
    (EfficientNet's `encoder.blocks`: 16 in Lite0). No gradient flows through what is frozen, so its
    backward is not computed: the early blocks, at the highest resolution, cost the most of it."""
    try:
        embeddings, layers, _ = find_blocks(model)
    except ParallelError:
        embeddings, layers = _convolutional_blocks(model)
    if not layers:
        raise checks.explain(model_rules.FREEZE_UNKNOWN, type(model).__name__) from None
    checks.gate(model_rules.FREEZE, n, len(layers), type(model).__name__)
    for name in [*embeddings, *layers[:n]]:
        model.get_submodule(name).requires_grad_(False)


def _convolutional_blocks(model) -> tuple[list[str], list[str]]:
    """([the stem], [the blocks]) of a backbone with `embeddings` and a ModuleList at `encoder.blocks`
    (EfficientNet), else ([], [])."""
    import torch

    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None)
    blocks = getattr(getattr(base, "encoder", None), "blocks", None)
    if not isinstance(getattr(base, "embeddings", None), torch.nn.Module) or not isinstance(blocks, torch.nn.ModuleList):
        return [], []
    return [f"{prefix}.embeddings"], [f"{prefix}.encoder.blocks.{i}" for i in range(len(blocks))]


def batchnorm_layers(model) -> list[str]:
    """The names of the model's BatchNorm layers (EfficientNet's; none in BERT or ViT)."""
    import torch

    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def _stay_in_eval(module, mode: bool = True):
    """`train()` of a frozen BatchNorm: it stays in eval mode, normalising by its running statistics."""
    module.training = False
    return module


def freeze_batchnorm(model) -> None:
    """Every BatchNorm layer of `model` in eval mode for good, also after `model.train()`: it normalises by
    the loaded running statistics and no longer updates them; its weight and bias still train. A per-module
    `train` (nn.Module.train calls each child's), so the model class and its state dict are unchanged."""
    import functools

    for name in batchnorm_layers(model):
        module = model.get_submodule(name)
        module.train = functools.partial(_stay_in_eval, module)
        module.training = False
