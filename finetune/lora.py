"""LoRA: train low-rank adapters beside frozen weights, through `peft` (an optional extra).

    pip install -e ".[peft]"        # or: pip install peft
    accelerate launch finetune/run.py peft='{r: 8, alpha: 16, target_modules: [query, value]}'
    accelerate launch finetune/run.py peft.r=16 peft.target_modules=[query,key,value]

A transform applied to a built model, like model parallelism (finetune/parallel.py): `apply_lora`
wraps every linear layer named in `target_modules` (the last part of its module name: BERT's attention
has query, key, value; ViT's, in transformers 5, q_proj, k_proj, v_proj; unset, the model's query and
value layers by whichever of those names it has) with W + (alpha / r) B A, A and B of rank r, and keeps the
classification head (`classifier`, `score`, `pre_classifier`; a QA model's `qa_outputs`) trainable beside them; every other
weight is frozen, so the optimizer holds only those (the start line's "weights trained"). Nothing
else in the loop changes: the per-sample loss, its masking and scaling, DDP and accumulation, and
checkpoints (Accelerate saves the wrapped model's state, adapters included, so a resume is exact).

The export is an ordinary model: `merge_lora` folds each B A into its W (peft's `merge_and_unload`)
and takes the trained head, so `pipeline()` loads it without peft; before the merge, finetune/export.py
saves the adapters and the head alone, in peft's format, to <output_dir>/adapter. A training-state
checkpoint is evaluated the same way: the adapters put back on the built model, its state loaded, then
merged. With model_parallel=true, LoRA comes first and the split places the model inside peft's wrapper
(`get_base_model()`), the adapters with their layers (run.py's `split_model`).
"""

from __future__ import annotations

import warnings
from typing import Any

from finetune import checks
from finetune.checks import models as model_rules

# The settings of `peft`, with their defaults (peft's LoraConfig names them r, lora_alpha, lora_dropout).
# target_modules null: the model's attention query and value layers, by the names it has (`QUERY_VALUE`).
DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": None}
# BERT's; ViT's (transformers 5), and most others'; EfficientNet's pointwise (1x1) convolutions of each block.
QUERY_VALUE = (["query", "value"], ["q_proj", "v_proj"], ["expand_conv", "project_conv"])

HEADS = ("classifier", "score", "pre_classifier", "qa_outputs")  # the heads of transformers' classification and QA models


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` completed with the defaults, `target_modules` written as a list (`query,value` on the command
    line); its values are checked by the settings' rules (finetune/checks/settings.py)."""
    full = {**DEFAULTS, **spec}
    if isinstance(full["target_modules"], str):
        full["target_modules"] = [t for t in full["target_modules"].split(",") if t]
    return full


def adaptable(module) -> bool:
    """A layer LoRA adapts: a linear layer, or a convolution that is not grouped (peft's LoRA Conv2d: a
    depthwise convolution, EfficientNet's, has one filter a channel and no low-rank update to speak of)."""
    import torch

    return isinstance(module, torch.nn.Linear) or (isinstance(module, torch.nn.Conv2d) and module.groups == 1)


def _width(module) -> int:
    import torch

    if isinstance(module, torch.nn.Linear):
        return min(module.in_features, module.out_features)
    return min(module.in_channels, module.out_channels)


def linear_names(model) -> list[str]:
    """The last parts of the names of the model's linear layers and ungrouped convolutions (outside the head):
    what LoRA can target."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if adaptable(module) and name.split(".")[0] not in HEADS
        }
    )


def apply_lora(model, spec: dict[str, Any]):
    """The model wrapped by peft: adapters on the target modules, the head trainable, the rest frozen; the
    targets and rank checked against the model first (finetune/checks/models.py's LORA_*)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise checks.explain(model_rules.PEFT_MISSING) from None
    spec = with_defaults(spec)
    known = linear_names(model)
    if spec["target_modules"] is None:
        fits = next((names for names in QUERY_VALUE if set(names) <= set(known)), None)
        checks.gate(model_rules.LORA_DEFAULT, type(model).__name__, known, fits)
        spec = {**spec, "target_modules": fits}
    widths = {_width(m) for name, m in model.named_modules()
              if adaptable(m) and name.rsplit(".", 1)[-1] in spec["target_modules"]}  # fmt: skip
    checks.gate(model_rules.LORA_TARGETS,
                model_rules.Adapters(type(model).__name__, known, spec["target_modules"], spec["r"], widths, HEADS))
    config = LoraConfig(
        r=spec["r"],
        lora_alpha=spec["alpha"],
        lora_dropout=spec["dropout"],
        target_modules=spec["target_modules"],
        modules_to_save=[name for name, _ in model.named_children() if name in HEADS],
    )
    with (
        warnings.catch_warnings()
    ):  # peft asks transformers a deprecated question (is_gradient_checkpointing)
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing.*", FutureWarning)
        return get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def merge_lora(model):
    """An ordinary transformers model: each adapter folded into its weight, the trained head kept.
    In place: the adapters are gone afterwards (called when training is over)."""
    return model.merge_and_unload() if is_lora(model) else model
