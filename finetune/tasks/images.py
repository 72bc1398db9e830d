"""Image classification: an image in, a label per image out (transformers' run_image_classification.py)."""

from __future__ import annotations

from typing import Any

from finetune import checks
from finetune.checks import images as image_rules
from finetune.checks import models as model_rules
from finetune.tasks.base import DataArgs, ModelArgs, Task


class ImageClassification(Task):
    name = "image-classification"
    modality = "image"
    auto_class = "AutoModelForImageClassification"
    architecture_suffix = "ForImageClassification"
    own_settings = frozenset({"random_flip", "augment", "image_processor_name", "image_column", "label_column",
                              "label_columns", "image_size"})  # fmt: skip

    def input_columns(self, data: DataArgs) -> list[str]:
        return [data.image_column]

    def holds(self, features, data: DataArgs) -> bool:
        from datasets import Image

        return isinstance(features.get(data.image_column), Image)

    def prepare(self, ds, preprocessor, data: DataArgs, split: str, num_channels: int,
                said: checks.Said | None = None):
        """Large photos decoded once into small copies (`shrunk`), then run through the image processor on the
        fly (a transform), with the augmentation the recipe asks for (per epoch and row: `epoch_listener`)."""
        from finetune.images import Augment, ImageTransform, shrunk, undecoded  # PIL's: only for images

        column = data.image_column
        ds = undecoded(ds.remove_columns([c for c in ds.column_names if c not in (column, "labels")]), column, split)
        augment = Augment(data.seed, data.random_flip, data.augment) if split == "train" else None
        checks.gate(image_rules.CHANNELS, num_channels)
        transform = ImageTransform(preprocessor, column, num_channels, augment)
        ds = shrunk(ds, column, transform.at_least).add_column("row", list(range(len(ds))))
        prepared = ds.with_transform(transform)
        prepared.epoch_listener = transform.set_epoch if augment else None
        return prepared

    def collator(self, preprocessor, pad_to_multiple_of: int | None):
        return stack_images

    def sample_inputs(self, ds, data: DataArgs) -> list[dict[str, Any]]:
        """The image's file path (an image folder, a column of paths) or the name stored with its bytes
        (parquet), None when it has none: then `index`, its row, tells it."""
        from datasets import Image

        images = ds.select_columns([data.image_column]).cast_column(data.image_column, Image(decode=False))
        return [{"image": (value or {}).get("path") or None} for value in images[data.image_column]]

    def load_preprocessor(self, args: ModelArgs, model_config=None):
        from transformers import AutoImageProcessor

        name = args.image_processor_name or (args.model_name_or_path if args.model_config is None else None)
        checks.gate(model_rules.IMAGE_SIZE_SETTING, args.image_size, model_config)
        if name is None:  # a ViT built from a config: resize to its image size, scale to [-1, 1]
            size = getattr(model_config, "image_size", 224)
            channels = getattr(model_config, "num_channels", 3)
            try:  # the PIL backend: no torchvision needed, and no warning about its absence
                from transformers import ViTImageProcessorPil as ViTImageProcessor
            except ImportError:
                from transformers import ViTImageProcessor
            return ViTImageProcessor(
                size={"height": size, "width": size}, image_mean=[0.5] * channels, image_std=[0.5] * channels
            )
        try:
            processor = AutoImageProcessor.from_pretrained(name, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as e:
            setting = None if args.image_processor_name else "model_name_or_path"
            raise checks.explain(model_rules.LOAD_FAILED, model_rules.Loading("image processor", name, e, setting)) from None
        if args.image_size is not None:  # a convolutional model's trade of accuracy for time
            for key in ("size", "crop_size"):
                if getattr(processor, key, None) is not None:  # a dict, or transformers 5's SizeDict
                    setattr(processor, key, {"height": args.image_size, "width": args.image_size})
        return processor

    def load_saved_preprocessor(self, source: str):
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(source)

    def notices(self, raw, preprocessor, data: DataArgs) -> list[str]:
        from finetune.images import image_sizes, resize_notice  # PIL: only for images

        notice = resize_notice(image_sizes(raw["train"], data.image_column), preprocessor)
        return [notice] if notice else []

    def export_inputs(self, model, preprocessor) -> dict[str, Any]:
        """Two images at the size the processor makes (image_size: the run's own)."""
        import torch
        from PIL import Image  # images only

        made = preprocessor(images=[Image.new("RGB", (300, 200), (90, 120, 150))] * 2, return_tensors="pt")
        return {"pixel_values": torch.rand(2, model.config.num_channels, *made["pixel_values"].shape[-2:])}

    def export_axes(self, sample: dict[str, Any]) -> dict[str, dict[int, str]]:
        return {"pixel_values": {0: "batch"}}

    def usage_example(self, where: str, problem: Any, data: DataArgs) -> str:
        arguments = ", top_k=None" if problem.lists else ""
        return (
            f'classify = pipeline("{self.pipeline_tag}", model="{where}"{arguments})\n'
            'classify("path/to/image.png")  # a path, URL or PIL image (8-bit: pipeline() clips a 16-bit one)'
        )


def stack_images(features: list[dict[str, Any]]):
    """An image batch: pixel values stacked, channels last in memory; labels as class ids (int64), numbers
    or multi-hot vectors. A convolution fed channels last computes in that layout on a CPU (oneDNN) and
    passes it on, the weights and their gradients staying as they are: an EfficientNet training step took
    0.93 of its time (benchmarks/results/image_levers.md); a ViT's patch embedding flattens to its
    tokens' layout without a copy."""
    import torch

    pixels = torch.stack([torch.as_tensor(f["pixel_values"]) for f in features])
    return {
        "pixel_values": pixels.contiguous(memory_format=torch.channels_last) if pixels.dim() == 4 else pixels,
        "labels": torch.tensor([f["labels"] for f in features]),
    }

