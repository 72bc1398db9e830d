"""Image files: decoding (any mode, 16-bit too), checking before training, and the transform that
turns a batch of images into the model's `pixel_values` (finetune/tasks/images.py uses them).

The image column is cast to `Image(decode=False)` ({"bytes", "path"}) and decoded here, so that a
file that fails to decode is named in the error.
"""

from __future__ import annotations

import collections
import io
import os
import random
import warnings
from pathlib import Path
from typing import Any

import PIL.Image
import PIL.ImageOps
from datasets import Dataset as HFDataset
from datasets import Image

from finetune import checks
from finetune.checks import images as image_rules


def _image_name(value: dict[str, Any], index: int | None = None) -> str:
    if value.get("path"):
        return str(value["path"])
    return f"#{index}" if index is not None else "(an image stored in the data file)"


def _image_source(value: dict[str, Any]):
    """What PIL opens for an `Image(decode=False)` value: its bytes, else its path."""
    return io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value["path"]


def _open(value: dict[str, Any]) -> PIL.Image.Image:
    """PIL's open of an `Image(decode=False)` value. PIL warns of a "decompression bomb DOS attack" for a photo
    of 89 to 179 megapixels (a panorama, a scan), in a line of its own with its source file: a large photo is
    good data, decoded here at the fraction its JPEG allows; that warning is left out here alone (not in the
    process's filters). Twice that, PIL refuses to open it, and images.unreadable_image says so in one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PIL.Image.DecompressionBombWarning)
        return PIL.Image.open(_image_source(value))


def open_image(value: dict[str, Any], index: int | None = None, at_least: int | None = None) -> PIL.Image.Image:
    """Decode one image of an `Image(decode=False)` column ({"bytes", "path"}), naming it on failure,
    upright as its EXIF orientation says (a phone's portrait photo is stored on its side; transformers'
    `load_image`, and so `pipeline()`, turns it too). `at_least`: a JPEG is decoded at the smallest of
    1/2, 1/4, 1/8 of its size whose sides are still at least that (PIL's draft mode: a 12-megapixel
    photo for a 224-pixel model decodes at a quarter, about 10x faster; the processor resizes it anyway)."""
    try:
        image = _open(value)
        if at_least and image.format == "JPEG":
            image.draft(image.mode, (at_least, at_least))
        image.load()
        PIL.ImageOps.exif_transpose(image, in_place=True)
        return image
    except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError) as e:
        raise checks.explain(image_rules.UNDECODABLE, _image_name(value, index), e) from None


def undecoded(ds: HFDataset, column: str, split: str) -> HFDataset:
    try:
        return ds.cast_column(column, Image(decode=False))
    except (ValueError, TypeError, NotImplementedError) as e:  # pyarrow: no cast from numbers to an image
        raise checks.explain(image_rules.NOT_IMAGES, column, split, ds.features[column], e) from None


def shrunk(ds: HFDataset, column: str, at_least: int | None) -> HFDataset:
    """The split with each large photo decoded once, here, into a copy whose shorter side is `at_least` (the
    transform's: twice the model's side), which training and evaluation then read at every epoch. A
    12-megapixel phone JPEG costs 0.06-0.13 s to decode even at a quarter (PIL's draft), paid at every epoch
    and evaluation in the training process; its 597x448 copy, 3 ms (benchmarks/results/decode_once.md). Only
    an 8-bit RGB or grayscale JPEG larger than that is copied (upright, as `open_image` turns it; Lanczos;
    JPEG at quality 95 without chroma subsampling: 2 ms to encode, where a PNG took 72 ms and 4x the bytes):
    every other image (a PNG, 16-bit, palette, CMYK) keeps its cell byte for byte. A large JPEG that fails to
    decode (its scan data broken, which `verify_images` does not decode) is named here, before training, in
    images.undecodable's line, not at its first batch. The split is returned as it is when no image is large (headers
    read until the first large one).

    datasets' `map` writes the copies into its cache, keyed by the split's fingerprint, this module's source,
    PIL's version and each image file's size, modification and change times (`_stamps`: a photo edited in
    place with its modification time kept, as `cp -p` or `rsync -a` keep it, is copied anew, not read stale
    from the cache): a second run on the same folder reads them, as the main process's are read by the
    other processes (the caller runs it under `main_process_first`). Large splits use every usable core:
    before training, nothing else runs."""
    if not at_least or not any(_is_large(value, at_least) for value in _cells(ds, column)):
        return ds
    from datasets.fingerprint import Hasher

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    fingerprint = Hasher.hash((ds._fingerprint, column, at_least, Path(__file__).read_bytes(), PIL.__version__,
                               _stamps(ds, column)))
    return ds.map(_small_copies, fn_kwargs={"column": column, "at_least": at_least}, input_columns=[column], batched=True,
                  batch_size=8, writer_batch_size=64, features=ds.features, new_fingerprint=fingerprint,
                  num_proc=min(cores, len(ds) // 64) if cores > 1 and len(ds) >= 128 else None,
                  desc="decoding large photos once")  # fmt: skip


def _cells(ds: HFDataset, column: str):
    for batch in ds.select_columns([column]).iter(batch_size=256):
        yield from batch[column]


def _stamps(ds: HFDataset, column: str) -> list:
    """Each file-backed image's size, modification and change times (the change time moves at every write,
    even one whose modification time is then set back), for `shrunk`'s cache key; a file gone is None."""
    stamps = []
    for value in _cells(ds, column):
        if value and value.get("bytes") is None and value.get("path"):
            try:
                st = os.stat(value["path"])
                stamps.append((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            except OSError:
                stamps.append(None)
    return stamps


def _is_large(value: dict[str, Any], at_least: int) -> bool:
    """Whether `shrunk` copies this image, by its header: an 8-bit RGB or L JPEG whose shorter side is
    larger than `at_least`."""
    if not value:
        return False
    try:
        with _open(value) as image:
            return image.format in ("JPEG", "MPO") and image.mode in ("RGB", "L") and min(image.size) > at_least
    except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError):
        return False


def _small_copies(values: list[dict[str, Any]], column: str, at_least: int) -> dict[str, list]:
    return {column: [_small_copy(value, at_least) for value in values]}


def _small_copy(value: dict[str, Any], at_least: int) -> dict[str, Any]:
    if not _is_large(value, at_least):
        return value
    image = open_image(value, at_least=at_least)  # a broken one (its scan data) is named now, before training
    scale = at_least / min(image.size)
    size = (max(at_least, round(image.width * scale)), max(at_least, round(image.height * scale)))
    stored = io.BytesIO()
    image.resize(size, PIL.Image.Resampling.LANCZOS).save(stored, "JPEG", quality=95, subsampling=0)
    return {"bytes": stored.getvalue(), "path": value.get("path")}


def verify_images(ds: HFDataset, column: str, split: str, said: checks.Said | None = None) -> None:
    """Check every image before training starts, so a corrupt file stops the run before it writes anything.
    PIL's `verify()` reads the file without decoding the pixels (~40 us for a small PNG): it catches garbage,
    truncated PNGs and bad headers. A JPEG or GIF whose last bytes are not its end marker (a file cut short)
    and a format whose verify() reads its header alone (BMP, TIFF, ...) are decoded too, so that a file cut
    short is named now, not hours into training; so are the first few images with a transparency or float
    pixels, whose pixels the rules look at (checks/images.py, LOOKED). A JPEG whose scan data is broken, its
    file whole: `shrunk` names a large one before training, `open_image` a small one in the transform. Why an image does
    not open is checks/images.py's (UNREADABLE)."""
    ds = undecoded(ds, column, split).select_columns([column])
    looked = image_rules.Looked(split)
    for start, batch in enumerate(ds.iter(batch_size=256)):
        for offset, value in enumerate(batch[column]):
            index = start * 256 + offset
            checks.gate(image_rules.ROWS, value, split, index)
            try:
                with _open(value) as image:
                    looked.add(_image_name(value, index), image.size)
                    look, whole = _to_look_at(image, looked), _ends_whole(value, image.format)
                    image.verify()
                if look or not whole:
                    _look(value, index, look, looked)
            except (OSError, SyntaxError, ValueError, PIL.Image.DecompressionBombError) as e:
                raise checks.explain(image_rules.UNREADABLE, image_rules.Unopened(value, column, split, index, e)) from None
    checks.gate(image_rules.LOOKED, looked, said=said if said is not None else checks.Said())


def _to_look_at(image: PIL.Image.Image, looked: image_rules.Looked) -> str | None:
    """Which of the rules' samples an image, by its header, joins: "alpha", "float" or None (enough seen)."""
    if image.mode == "F" and len(looked.floats) < looked.SAMPLED:
        return "float"
    alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    return "alpha" if alpha and len(looked.with_alpha) < looked.SAMPLED else None


def _ends_whole(value: dict[str, Any], image_format: str | None) -> bool:
    """Whether a file's bytes end as its format's do: PNG and WebP, read through by verify(); a JPEG's end
    marker (FF D9), a GIF's trailer (3B). Any other format's verify() reads its header alone: False."""
    if image_format in ("PNG", "WEBP"):
        return True
    if image_format not in ("JPEG", "MPO", "GIF"):
        return False
    if value.get("bytes") is not None:
        tail = value["bytes"][-2:]
    else:
        with open(value["path"], "rb") as f:
            f.seek(max(0, f.seek(0, io.SEEK_END) - 2))
            tail = f.read()
    return tail.endswith(b"\x3b" if image_format == "GIF" else b"\xff\xd9")


def _look(value: dict[str, Any], index: int, look: str | None, looked: image_rules.Looked) -> None:
    """Decode one image (raising PIL's error if it does not) and add what `look` asks to `looked`."""
    with _open(value) as image:
        if image.format == "JPEG" and not look:
            image.draft(image.mode, (64, 64))  # decoded to the end all the same, at an eighth of the work
        image.load()
        name = _image_name(value, index)
        if look == "float":
            lo, hi = image.getextrema()
            looked.floats.append((name, float(lo), float(hi)))
        elif look == "alpha":
            rgba = image.convert("RGBA")
            spreads = [hi - lo for lo, hi in rgba.getextrema()]
            looked.with_alpha.append((name, max(spreads[:3]), spreads[3]))


def image_sizes(ds: HFDataset, column: str, limit: int = 256) -> collections.Counter:
    """Width x height of the first `limit` images (headers only), counted."""
    sizes: collections.Counter = collections.Counter()
    for value in undecoded(ds.select(range(min(limit, len(ds)))), column, "train")[column]:
        with _open(value) as image:  # the header: no pixels decoded
            sizes[image.size] += 1
    return sizes


def resize_notice(sizes: collections.Counter, processor) -> str | None:
    """One line when the image processor resizes the images, or None when they already fit."""
    size = getattr(processor, "size", None) or {}
    target = (size.get("width"), size.get("height"))
    if None in target or not sizes or set(sizes) == {target}:
        return None
    seen = ", ".join(f"{w}x{h}" for (w, h), _ in sizes.most_common(3)) + (", ..." if len(sizes) > 3 else "")
    return (
        f"note: the training images ({seen}) are resized to {target[0]}x{target[1]} by the image processor; "
        "for a model built from model_config, model_config.image_size sets the size it takes"
    )


def _to_8_bit(image: PIL.Image.Image) -> PIL.Image.Image:
    """16-bit images (PIL modes I;16*, and I, as some decoders give 16-bit PNGs) scaled to 8 bits.
    PIL's convert() to L or RGB clips every value above 255 instead: a 16-bit gradient came out 99.6%
    white. An I image whose values all fit in 8 bits is left as it is."""
    if not (image.mode.startswith("I;16") or image.mode == "I"):
        return image
    import numpy as np

    values = np.asarray(image).astype(np.int64)
    if image.mode == "I" and values.max(initial=0) <= 255:
        return image
    return PIL.Image.fromarray((values.clip(0, 65535) >> 8).astype(np.uint8))


class Augment:
    """Training augmentation of one image, drawn from a generator seeded by (seed, epoch, row): the same
    draws whatever the data workers, the processes or a resume in the middle of an epoch.

    Ops (PIL only; torchvision's transforms are not installable beside the CPU build of torch here):
        flip     horizontal flip, half the time (`random_flip`: only for mirror-invariant classes)
        crop     a random resized crop (8%..100% of the area, aspect 3/4..4/3, as torchvision's
                 RandomResizedCrop; here 35%..100%: small images keep their object), back to the size
        color    brightness, contrast and saturation each by a factor in [0.6, 1.4]
        trivial  one op of TrivialAugment-Wide (Müller & Hutter 2021) at a uniform random strength:
                 identity, shear, translate, rotate, brightness, colour, contrast, sharpness,
                 posterize, solarize, autocontrast, equalize
    """

    OPS = ("crop", "color", "trivial")

    def __init__(self, seed: int, flip: bool, ops: list[str]):
        self.seed, self.flip, self.ops = seed, flip, list(ops)

    def __bool__(self) -> bool:
        return self.flip or bool(self.ops)

    def __call__(self, image: PIL.Image.Image, epoch: int, row: int) -> PIL.Image.Image:
        rng = random.Random(f"{self.seed}:{epoch}:{row}")
        if "crop" in self.ops:
            image = _random_resized_crop(image, rng)
        if self.flip and rng.random() < 0.5:
            image = image.transpose(PIL.Image.Transpose.FLIP_LEFT_RIGHT)
        if "color" in self.ops:
            from PIL import ImageEnhance

            for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
                image = enhance(image).enhance(rng.uniform(0.6, 1.4))
        if "trivial" in self.ops:
            image = _trivial_augment(image, rng)
        return image


def _random_resized_crop(image: PIL.Image.Image, rng: random.Random) -> PIL.Image.Image:
    import math

    width, height = image.size
    for _ in range(10):  # torchvision's rejection sampling of a box that fits
        area = width * height * rng.uniform(0.35, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return image.resize((width, height), PIL.Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    return image


def _trivial_augment(image: PIL.Image.Image, rng: random.Random) -> PIL.Image.Image:
    """One op at a uniform random strength m in [0, 1], the wide ranges of TrivialAugment-Wide."""
    from PIL import ImageEnhance, ImageOps

    op, m = rng.choice(TRIVIAL_OPS), rng.random()
    sign = rng.choice((-1, 1))
    width, height = image.size
    if op == "shear_x":
        return image.transform(image.size, PIL.Image.Transform.AFFINE, (1, sign * 0.99 * m, 0, 0, 1, 0))
    if op == "shear_y":
        return image.transform(image.size, PIL.Image.Transform.AFFINE, (1, 0, 0, sign * 0.99 * m, 1, 0))
    if op == "translate_x":
        return image.transform(image.size, PIL.Image.Transform.AFFINE, (1, 0, sign * m * width / 3, 0, 1, 0))
    if op == "translate_y":
        return image.transform(image.size, PIL.Image.Transform.AFFINE, (1, 0, 0, 0, 1, sign * m * height / 3))
    if op == "rotate":
        return image.rotate(sign * 135 * m)
    if op in ("brightness", "color", "contrast", "sharpness"):
        enhance = {"brightness": ImageEnhance.Brightness, "color": ImageEnhance.Color,
                   "contrast": ImageEnhance.Contrast, "sharpness": ImageEnhance.Sharpness}[op]  # fmt: skip
        return enhance(image).enhance(1 + sign * 0.99 * m)
    if op == "posterize":
        return ImageOps.posterize(image, 8 - round(6 * m))
    if op == "solarize":
        return ImageOps.solarize(image, round(255 * (1 - m)))
    if op == "autocontrast":
        return ImageOps.autocontrast(image)
    if op == "equalize":
        return ImageOps.equalize(image)
    return image  # identity


TRIVIAL_OPS = ("identity", "shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness", "color",
               "contrast", "sharpness", "posterize", "solarize", "autocontrast", "equalize")  # fmt: skip


class ImageTransform:
    """Images → `pixel_values` through the image processor; the training augmentation (`Augment`).

    The transform decodes the images itself (the column is cast to `Image(decode=False)`), so that a
    file that fails to decode is named in the error. Every image is converted to the model's channel
    count first, so grayscale, palette and RGBA files mixed with RGB just work; images of any size,
    even smaller than a patch, are resized by the processor. The augmentation's draws are seeded by
    (seed, epoch, row): `set_epoch` is called as each epoch starts (the epoch sampler does it), and
    the dataset holds each sample's `row`.
    """

    def __init__(self, processor, column: str, num_channels: int, augment: Augment | None = None):
        self.processor, self.column, self.augment = processor, column, augment
        self.mode = "RGB" if num_channels == 3 else "L"
        self.epoch = 0
        # Twice the model's input side: a random crop of a third of the image still has its pixels.
        size = getattr(processor, "size", None) or {}  # a dict, or transformers 5's SizeDict
        sides = [size.get(k) if isinstance(size, dict) else getattr(size, k, None) for k in ("height", "width", "shortest_edge")]
        self.at_least = 2 * max((s for s in sides if isinstance(s, int)), default=0) or None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        images = []
        for i, value in enumerate(batch[self.column]):
            image = value if isinstance(value, PIL.Image.Image) else open_image(value, at_least=self.at_least)
            image = _to_8_bit(image).convert(self.mode)
            if self.augment:
                image = self.augment(image, self.epoch, batch["row"][i])
            images.append(image)
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "labels": batch["labels"]}
