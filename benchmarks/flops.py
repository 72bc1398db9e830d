"""The FLOP model: how many model FLOPs a training batch costs, for MFU (model FLOPs per second over
the matmul peak of benchmarks/peak.py).

Training FLOPs of a batch of B sequences padded to S tokens (padding is computed, so padded tokens
count): `B*S * (6*N + 12*L*H*S)`, N = parameters outside the embedding tables (word, position and
token type embeddings, ViT's position embedding and [CLS]; the ViT patch projection is a matmul and
counts), L layers, H hidden size; 6*N is forward + backward of every weight matmul, 12*L*H*S the
attention scores and weighted sums (QK^T and AV: 2 * 2*S*H per token per layer forward, x3). The
pooler and classifier see one token per sequence, so 6*N overcounts them slightly (<2% here).
`real_flops` counts the same at each sample's real length (MFU at real lengths: padding is no work).
Frozen weights count forward only (2 per weight, and attention x1 in a frozen layer): the app
freezes the lowest layers (`freeze_layers`), below which backward does not go. The recorder counts
them when the first step starts, after the freezing.
"""

from __future__ import annotations

from typing import Any

import torch


def flop_model(model: torch.nn.Module, batch: dict[str, Any] | None = None) -> dict[str, Any]:
    """N, L, H of the FLOP count (see `token_flops`): parameters outside the embedding tables,
    layers, hidden size; and how many of them are frozen (read when training starts). A model that is
    not a transformer (a convolutional network: EfficientNet) has its FLOPs counted by torch instead
    (`counted_flops`, on `batch`)."""
    if not hasattr(model.config, "num_attention_heads") and batch is not None and "pixel_values" in batch:
        return counted_flops(model, batch["pixel_values"])
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    excluded = {"position_embeddings", "cls_token", "mask_token"}
    counted = [
        p
        for name, p in model.named_parameters()
        if id(p) not in embedding and name.rsplit(".", 1)[-1] not in excluded
    ]
    cfg = model.config
    try:
        from finetune.parallel import find_blocks

        _, layers, _ = find_blocks(model)
        frozen_layers = sum(
            not any(p.requires_grad for p in model.get_submodule(name).parameters()) for name in layers
        )
    except ValueError:  # a model the layer split does not know: no frozen layers counted
        frozen_layers = 0
    return {
        "non_embedding_params": sum(p.numel() for p in counted),
        "frozen_non_embedding_params": sum(p.numel() for p in counted if not p.requires_grad),
        "layers": cfg.num_hidden_layers,
        "frozen_layers": frozen_layers,
        "hidden": cfg.hidden_size,
        "params": sum(p.numel() for p in model.parameters()),
    }


def token_flops(f: dict[str, Any], s: int) -> float:
    """Training FLOPs per (padded) token at length s: 6 per trained weight (forward + two backward
    matmuls), 2 per frozen one (the app freezes the lowest layers: backward stops above them), and
    attention's QK^T and AV, 4*S*H a layer forward, x3 where the layer trains."""
    n, frozen = f["non_embedding_params"], f["frozen_non_embedding_params"]
    layers, frozen_layers = f["layers"], f["frozen_layers"]
    return (
        6 * (n - frozen) + 2 * frozen + 4 * f["hidden"] * s * (3 * (layers - frozen_layers) + frozen_layers)
    )


def sequences(mask: torch.Tensor) -> torch.Tensor:
    """A batch's token inputs as (sequences, tokens): a multiple-choice batch's (samples, candidates, tokens)
    is each candidate a sequence of its own, as the model reads it."""
    return mask.flatten(0, -2) if mask.dim() > 2 else mask


def batch_counts(batch: dict[str, torch.Tensor], tokens_per_image: int | None) -> tuple[int, int, int, int]:
    """(samples, real tokens, padded tokens, padded length) of a collated batch."""
    if "attention_mask" in batch:
        samples, mask = batch["attention_mask"].shape[0], sequences(batch["attention_mask"])
        return samples, int(mask.sum()), mask.numel(), mask.shape[1]
    if "input_ids" in batch:
        ids = batch["input_ids"]
        return ids.shape[0], ids.numel(), ids.numel(), ids.shape[1]
    b = batch["pixel_values"].shape[0]
    t = tokens_per_image or 1
    return b, b * t, b * t, t


def tokens_per_image(config) -> int | None:
    """A ViT's sequence length: its patches and [CLS]; None for a model without patches."""
    if getattr(config, "image_size", None) and getattr(config, "patch_size", None):
        return (config.image_size // config.patch_size) ** 2 + 1
    return None


def real_flops(batch: dict[str, torch.Tensor], f: dict[str, Any]) -> float:
    """Training FLOPs of a text batch at each sample's real length (its attention mask's count), as if
    nothing were padded: what MFU "at real lengths" counts, so that padding (a length bucket's, or the
    rows that fill a compiled model's batch) never reads as useful work."""
    if "attention_mask" not in batch:
        return 0.0
    return float(sum(n * token_flops(f, n) for n in sequences(batch["attention_mask"]).sum(1).tolist()))


def mfu(model_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: the share of the measured matmul peak the model's FLOPs reach."""
    return model_flops_per_s / peak_flops_per_s


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape, **kwargs) -> int:
    """A convolution's backward FLOPs: each gradient it computes (`output_mask`: the input's, the
    weight's) costs what its forward does. torch's own formula (torch 2.13) leaves out the groups in the
    weight's gradient, so a depthwise convolution's counted C times over (EfficientNet's: 32x the
    model's FLOPs)."""
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def counted_flops(model: torch.nn.Module, pixel_values: torch.Tensor) -> dict[str, Any]:
    """Training FLOPs of one image, counted by torch (`torch.utils.flop_counter.FlopCounterMode`: every
    convolution and matmul of a forward and backward, as the model runs them; a convolution's backward
    by `conv_backward_flops`) on a copy of `model`, so
    that the run's own weights, gradients and BatchNorm statistics are untouched. The copy keeps what
    is frozen, so a frozen block counts its forward only; two images, in the model's own mode
    (BatchNorm in training mode needs more than one value per channel), per image after."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    twin = copy.deepcopy(model).to("cpu")
    images = pixel_values[:2].detach().to("cpu", torch.float32)
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops}) as counter:
        twin(pixel_values=images).logits.float().sum().backward()
    return {
        "flops_per_sample": counter.get_total_flops() / len(images),
        "params": sum(p.numel() for p in model.parameters()),
        "frozen_params": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        "counted_by": "torch.utils.flop_counter.FlopCounterMode, forward and backward of two images",
    }
