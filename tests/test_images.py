"""finetune/images.py: image files as the model sees them. Mixed and odd modes and sizes, 16-bit
images, the resize notice, and augmentation that resumes exactly (also with data-loader workers).

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_images.py
"""

from __future__ import annotations

import json
import re
import shutil
import types
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import TINY_VIT, class_folders, drawn_images, image_folder, tiny_image_args, user_error
from PIL import Image
from safetensors.torch import load_file

from finetune import checks
from finetune.config import CONFIGS_DIR, load_config
from finetune.run import main

IMAGEFOLDER = str(CONFIGS_DIR / "vit_imagefolder.yaml")  # a ViT built for 28x28 images


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_image_augmentation_resumes_exactly(workers, tmp_path):
    """The flip, crop, colour and TrivialAugment draws are seeded by (seed, epoch, row): a run resumed
    mid-epoch trains the weights of the uninterrupted one, also when data-loader workers (which read
    ahead) decode and augment the images. (Under 2-process DDP and FSDP: tests/test_fsdp.py.)"""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog", "owl"], "validation": ["cat", "dog", "owl"]})
    args = ("num_train_epochs=2", "save_steps=2", "save_total_limit=null", "random_flip=true",
            "augment=[crop,color,trivial]", f"dataloader_num_workers={workers}")  # fmt: skip
    main(tiny_image_args(folder, tmp_path / "full", *args))
    first = sorted((tmp_path / "full" / "checkpoints").iterdir())[0]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, resumed / "checkpoints" / first.name)
    main(tiny_image_args(folder, resumed, *args, "resume_from_checkpoint=latest"))
    a, b = load_file(tmp_path / "full" / "model" / "model.safetensors"), load_file(resumed / "model" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0.0


def test_imagefolder_mixed_image_modes(tmp_path):
    """Grayscale, palette and RGBA files mixed with RGB just work; folder names are the labels."""
    image_folder(tmp_path / "images", classes=3, mode=lambda i, j: ["L", "RGB", "P", "RGBA"][(i + j) % 4])
    out = tmp_path / "run"
    results = main(
        [
            "--config",
            IMAGEFOLDER,
            f"model_config={TINY_VIT}",
            f"data_dir={tmp_path / 'images'}",
            "num_train_epochs=1",
            "validation_split_percentage=33.3",
            f"output_dir={out}",
        ]
    )
    assert results["label_names"] == ["0_tshirt_top", "1_trouser", "2_pullover"]
    assert results["validation"]["num_samples"] == 6


def test_a_test_split_that_copies_the_training_images_is_warned_of(tmp_path, capsys):
    """An image folder whose test/ is a copy of train/ (renamed files too): its scores would measure images
    the model trained on. One line, as for text; a test split of other images: silence."""
    from finetune.data import load_splits

    root = image_folder(tmp_path / "images", classes=2, per_class=6)
    shutil.copytree(root / "train", root / "test")
    for png in (root / "test").rglob("*.png"):
        png.rename(png.with_name(f"copy-{png.name}"))
    load_splits(load_config(IMAGEFOLDER, [f"model_config={TINY_VIT}", f"data_dir={root}"]), said := checks.Said())
    assert "12 of the 12 test samples are also training samples (the same image" in capsys.readouterr().err
    assert "splits.test_of_training_samples" in said.rules()
    shutil.rmtree(root / "test")
    drawn_images(root, {"0_tshirt_top": [(9, 9, 9)], "1_trouser": [(200, 9, 9)]}, split="test")
    load_splits(load_config(IMAGEFOLDER, [f"model_config={TINY_VIT}", f"data_dir={root}"]))
    assert "also training samples" not in capsys.readouterr().err


def test_resized_images_are_noticed_once(tmp_path, capsys):
    """32x32 images into a ViT built for 28: one line says so and how to change it; 28x28: silence."""
    from finetune.images import resize_notice
    from finetune.models import load_preprocessor

    colors = {"a": [(40 * i, 0, 0) for i in range(6)], "b": [(0, 40 * i, 0) for i in range(6)]}
    drawn_images(tmp_path, colors, size=(32, 32))
    recipe = IMAGEFOLDER
    settings = [
        f"data_dir={tmp_path}",
        "validation_split_percentage=34",
        "max_steps=1",
        f"output_dir={tmp_path / 'run'}",
    ]
    args = ["--config", recipe, *settings]
    main(args)
    out = capsys.readouterr().out
    assert out.count("are resized to 28x28") == 1 and "(32x32)" in out and "model_config.image_size" in out
    image_size_32 = types.SimpleNamespace(image_size=32, num_channels=3)  # a model config with 32
    processor = load_preprocessor(load_config(recipe, settings).model_args, image_size_32)
    assert resize_notice(Counter({(32, 32): 6}), processor) is None


@pytest.mark.parametrize("fmt", ["png", "tiff"])
def test_16_bit_images_keep_their_contrast(tmp_path, fmt):
    """A 16-bit grayscale image (PIL mode I;16) read as 8-bit clips every value above 255 to white: a
    gradient became 99.6% white. It must give what its 8-bit version gives."""
    from transformers import ViTImageProcessor

    from finetune.images import ImageTransform

    wide = (np.arange(28 * 28, dtype=np.uint32).reshape(28, 28) * 83).astype(np.uint16)
    Image.fromarray(wide).save(tmp_path / f"wide.{fmt}")
    Image.fromarray((wide >> 8).astype(np.uint8)).save(tmp_path / "narrow.png")
    assert Image.open(tmp_path / f"wide.{fmt}").mode.startswith("I")
    processor = ViTImageProcessor(size={"height": 28, "width": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    transform = ImageTransform(processor, "image", num_channels=3)

    def pixels(name: str) -> torch.Tensor:
        return transform({"image": [{"path": str(tmp_path / name), "bytes": None}], "labels": [0]})[
            "pixel_values"
        ]

    wide_pixels, narrow_pixels = pixels(f"wide.{fmt}"), pixels("narrow.png")
    assert (wide_pixels - narrow_pixels).abs().max() <= 2 / 255 * 2 + 1e-6
    assert wide_pixels.std() > 0.3  # a gradient, not a white page


def test_odd_images_just_work(tmp_path):
    """Grayscale, palette, RGBA and RGB mixed, and images far smaller than a patch (resized)."""
    # the 12 files in sorted order (class i, file j: the (6 i + j)-th) take the modes in turn
    root = image_folder(tmp_path / "images", mode=lambda i, j: ["L", "RGB", "P", "RGBA", "LA"][(6 * i + j) % 5])
    Image.new("RGB", (3, 3), (200, 10, 10)).save(root / "train" / "1_trouser" / "tiny.png")
    Image.new("L", (1, 5), 128).save(root / "train" / "0_tshirt_top" / "sliver.png")
    results = main(
        [
            "--config",
            IMAGEFOLDER,
            f"model_config={TINY_VIT}",
            f"data_dir={root}",
            "max_steps=2",
            "per_device_train_batch_size=7",
            "validation_split_percentage=25",
            f"output_dir={tmp_path / 'o'}",
        ]
    )
    assert results["step"] == 2 and results["validation"]["num_samples"] >= 3


@pytest.mark.parametrize(("value", "fragment", "rule"), [
    ({"bytes": None, "path": None}, "the train data has no image in row 1 (no bytes and no path)",
     "images.row_without_image"),
    ({"bytes": None, "path": "file:///tmp/x.png"}, "is a URL; give the path without file://", "images.file_url"),
    ({"bytes": None, "path": "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAI"}, "holds images written as base64 text",
     "images.base64_text"),  # a PNG
    ({"bytes": None, "path": "/9j/4AAQSkZJRgABAQAAAQABAAD"}, "decode them (base64.b64decode)",
     "images.base64_text"),  # a JPEG
])  # fmt: skip
def test_an_image_cell_with_nothing_or_a_url_is_one_line(value, fragment, rule):
    from datasets import Dataset, Features, Value

    from finetune.errors import UserError
    from finetune.images import verify_images

    stored = Features({"image": {"bytes": Value("binary"), "path": Value("string")}, "label": Value("int64")})
    ds = Dataset.from_dict({"image": [value], "label": [0]}, features=stored)  # as a parquet file holds it
    with pytest.raises(UserError, match=re.escape(fragment)) as raised:
        verify_images(ds, "image", "train")
    assert raised.value.rule == rule


def test_an_image_folder_without_a_train_split_says_where_training_images_go(tmp_path):
    from finetune.data import load_raw
    from finetune.errors import UserError

    class_folders(tmp_path / "imgs", {"validation": ["cat", "dog"], "test": ["cat", "dog"]})
    with pytest.raises(UserError, match=r"no 'train' split \(found: .*\); an image folder trains on .*/train/<label>/<image>") as raised:
        load_raw({}, None, None, str(tmp_path / "imgs"))
    assert raised.value.rule == "files.no_train_split"


def test_a_damaged_image_in_the_first_row_is_named_as_any_other(tmp_path, capsys):
    """The column checks read a split's first row with its images left out: a damaged first image is the
    images' own line, as it is in any other row, not a traceback from a column check that decoded it."""
    folder = class_folders(tmp_path / "img", {"train": ["cat", "dog"], "validation": ["cat", "dog"]})
    first = folder / "train" / "cat" / "0.png"
    first.write_bytes(first.read_bytes()[:7])
    user_error(capsys, main, tiny_image_args(folder, tmp_path / "run", "max_steps=1"), str(first),
               rule="images.unreadable_image")  # fmt: skip


@pytest.mark.parametrize("cell", [3, 2.5, True, {"bytes": 3, "path": 4}])
def test_an_image_column_of_numbers_is_refused_by_its_rule(cell, tmp_path, capsys):
    """pyarrow cannot cast numbers to an image (a NotImplementedError, not a ValueError): one line."""
    rows = [{"image": cell, "label": ["cat", "dog"][i % 2]} for i in range(8)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["task=image-classification", f"model_config={TINY_VIT}", "model_name_or_path=null", f"train_file={path}",
            "validation_file=null", "test_file=null", "label_names=null", f"output_dir={tmp_path / 'run'}"]  # fmt: skip
    user_error(capsys, main, args, "image", rule="images.not_an_image_column")


def test_a_phone_photo_is_decoded_upright_and_no_larger_than_the_model_needs():
    """A portrait photo is stored on its side with EXIF orientation 6: it trains upright, as pipeline()
    shows it. A 12-megapixel JPEG for a 224-pixel model decodes at a quarter of its size (PIL's draft),
    never below twice the model's side, and the pixels the model sees are those of a full decode,
    within resampling noise."""
    import io

    import PIL.Image
    from conftest import DATA
    from transformers import AutoImageProcessor

    from finetune.images import ImageTransform, open_image

    y, x = np.mgrid[0:3024, 0:4032]
    pixels = np.stack([x * 255 // 4032, y * 255 // 3024, (x // 300 + y // 300) % 2 * 255], -1).astype(np.uint8)
    exif = PIL.Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to show it
    stored = io.BytesIO()
    PIL.Image.fromarray(pixels).save(stored, "JPEG", quality=90, exif=exif.tobytes())
    value = {"bytes": stored.getvalue(), "path": None}
    full = open_image(value)
    assert full.size == (3024, 4032)  # upright: portrait
    top = np.asarray(full)[0]  # the stored left column (red 0), its bottom (green 255) on the left
    assert top[0, 0] < 40 and top[0, 1] > 200 and top[-1, 0] < 40 and top[-1, 1] < 40, (top[0], top[-1])
    processor = AutoImageProcessor.from_pretrained(DATA / "efficientnet_lite0")
    transform = ImageTransform(processor, "image", 3)
    assert transform.at_least == 448
    small = open_image(value, at_least=transform.at_least)
    assert small.size == (756, 1008) and min(small.size) >= 448
    seen = transform({"image": [value], "labels": [0]})["pixel_values"]
    reference = processor(images=[full.convert("RGB")], return_tensors="pt")["pixel_values"]
    assert seen.shape == reference.shape and (seen - reference).abs().mean().item() < 0.02


# --- a new user's photo folders on the photos recipe (the tiny EfficientNet in place of the bundled one) ---------

PHOTOS = str(CONFIGS_DIR / "efficientnet_photos.yaml")


def _photos(model, data, out, *extra: str) -> list[str]:
    """The photos recipe as a new user runs it on their folder, on the tiny EfficientNet: one step."""
    return ["--config", PHOTOS, f"model_name_or_path={model}", f"data_dir={data}", "freeze_layers=0", "max_steps=1",
            "per_device_train_batch_size=4", "validation_split_percentage=34", f"output_dir={out}", *extra]  # fmt: skip


def _image_warnings(results: dict) -> list[str]:
    """The images rules' warnings of a run (a run this small also hears that it is too small to judge)."""
    return [w["rule"] for w in results["warnings"] if w["rule"].startswith("images.")]


def _photo_folder(root, per_class: int = 4):
    """`root/train/{cat,dog}/<i>.jpg`: noisy 48x40 RGB photos, red cats and green dogs."""
    rng = np.random.default_rng(0)
    for label, color in (("cat", (200, 30, 30)), ("dog", (30, 200, 30))):
        (root / "train" / label).mkdir(parents=True)
        for i in range(per_class):
            noise = rng.integers(0, 40, (40, 48, 3))
            Image.fromarray((np.array(color) + noise).clip(0, 255).astype(np.uint8)).save(root / "train" / label / f"{i}.jpg")
    return root


@pytest.mark.parametrize("fmt", ["JPEG", "GIF", "BMP", "TIFF"])
def test_an_image_cut_short_is_named_before_training(fmt, tiny_efficientnet_folder, tmp_path, capsys):
    """A file cut short (a copy or a download that stopped) passes PIL's verify(), which reads the header alone:
    a JPEG or GIF without its end marker, and a BMP or TIFF, are decoded before training, so the line comes before
    the run writes anything, not at the step that first decodes it."""
    folder = _photo_folder(tmp_path / "photos")
    victim = folder / "train" / "cat" / f"cut.{fmt.lower()}"
    Image.open(folder / "train" / "cat" / "0.jpg").resize((200, 160)).save(victim, fmt)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size * 2 // 3])
    out = tmp_path / "run"
    user_error(capsys, main, _photos(tiny_efficientnet_folder, folder, out), f"cannot read image {victim} in the train data",
               untouched=folder, rule="images.unreadable_image")  # fmt: skip
    assert not out.exists()


def test_icons_drawn_in_their_transparency_alone_are_refused(tiny_efficientnet_folder, tmp_path, capsys):
    """Black icons on a transparent background: once the alpha channel is dropped (as training and pipeline() do)
    every image is one flat black. Photos with a real transparency (a fade to transparent) train."""
    from PIL import ImageDraw

    icons = tmp_path / "icons"
    for label in ("circle", "square"):
        (icons / "train" / label).mkdir(parents=True)
        for i in range(4):
            icon = Image.new("RGBA", (48, 48), (0, 0, 0, 0))
            (ImageDraw.Draw(icon).ellipse if label == "circle" else ImageDraw.Draw(icon).rectangle)(
                (8 + i, 8, 40, 40 - i), fill=(0, 0, 0, 255))
            icon.save(icons / "train" / label / f"{i}.png")
    line = user_error(capsys, main, _photos(tiny_efficientnet_folder, icons, tmp_path / "run"), "8 of the 8 train images",
                      "drawn in it alone", "alpha_composite", rule="images.drawing_in_transparency")  # fmt: skip
    assert str(icons / "train" / "circle" / "0.png") in line
    faded = _photo_folder(tmp_path / "faded")
    for jpg in sorted((faded / "train").rglob("*.jpg")):
        photo = Image.open(jpg).convert("RGBA")
        photo.putalpha(Image.linear_gradient("L").resize(photo.size))
        photo.save(jpg.with_suffix(".png"))
        jpg.unlink()
    results = main(_photos(tiny_efficientnet_folder, faded, tmp_path / "faded-run"))
    assert results["step"] == 1 and _image_warnings(results) == []


def test_float_images_on_a_scale_of_0_to_1_are_refused(tiny_efficientnet_folder, tmp_path, capsys):
    """Float TIFFs (PIL mode F) of values 0-1: PIL's conversion to 8 bits clips them, so the model would see black.
    Float images on the 0-255 scale convert as they are, and train."""
    for scale, name in ((1 / 255, "unit"), (1.0, "bytes")):
        folder = _photo_folder(tmp_path / name)
        for jpg in sorted((folder / "train").rglob("*.jpg")):
            gray = np.asarray(Image.open(jpg).convert("L"), dtype=np.float32) * scale
            Image.fromarray(gray).save(jpg.with_suffix(".tiff"))
            jpg.unlink()
    first = tmp_path / "unit" / "train" / "cat" / "0.tiff"
    user_error(capsys, main, _photos(tiny_efficientnet_folder, tmp_path / "unit", tmp_path / "run"),
               "8 train image(s) hold float pixels from", f"(first: {first})", rule="images.float_pixels")  # fmt: skip
    results = main(_photos(tiny_efficientnet_folder, tmp_path / "bytes", tmp_path / "bytes-run"))
    assert results["step"] == 1 and _image_warnings(results) == []


def test_a_pixel_and_a_strip_among_photos_are_warned_of(tiny_efficientnet_folder, tmp_path, capsys):
    """A 1x1 image (a tracking pixel, a placeholder of a download that failed) and a 2000x5 strip: resized to the
    model's square, a flat colour and a smear; said once, and the run goes on."""
    folder = _photo_folder(tmp_path / "photos")
    Image.new("RGB", (1, 1), (200, 30, 30)).save(folder / "train" / "cat" / "pixel.png")
    Image.new("RGB", (2000, 5), (30, 200, 30)).save(folder / "train" / "dog" / "strip.png")
    results = main(_photos(tiny_efficientnet_folder, folder, tmp_path / "run"))
    assert _image_warnings(results) == ["images.degenerate_size"]
    said = [ln for ln in capsys.readouterr().err.splitlines() if "flat colour or a smear" in ln]
    assert len(said) == 1 and "2 of the 10 train images are 1x1, 2000x5 pixels" in said[0], said


def test_images_the_loader_skips_by_their_names_are_warned_of(tiny_efficientnet_folder, tmp_path, capsys):
    """A JPEG saved without a suffix, or as photo.jpg_large (a browser's), is left out by the image folder loader:
    counted by its bytes in one warning. Notes, .DS_Store and Thumbs.db are no one's images: not counted."""
    folder = _photo_folder(tmp_path / "photos")
    Image.open(folder / "train" / "cat" / "0.jpg").save(folder / "train" / "cat" / "IMG_0001", "JPEG")
    Image.open(folder / "train" / "dog" / "0.jpg").save(folder / "train" / "dog" / "photo.jpg_large", "JPEG")
    (folder / "train" / "dog" / "notes.txt").write_text("more to come")
    (folder / "train" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(32))
    (folder / "train" / "cat" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0" + bytes(32))
    results = main(_photos(tiny_efficientnet_folder, folder, tmp_path / "run"))
    assert _image_warnings(results) == ["images.images_under_other_names"]
    assert next(w for w in results["warnings"] if w["rule"].startswith("images."))["line"].startswith(
        f"2 file(s) in {folder} are images by their bytes but not by their names, so the image folder loader leaves "
        f"them out (first: {folder / 'train' / 'cat' / 'IMG_0001'}, a JPEG)")


def test_a_class_folder_named_in_another_unicode_form_is_said_to_be_one(tiny_efficientnet_folder, tmp_path, capsys):
    """macOS writes a folder's name decomposed (café: e and a combining accent), most other systems composed: a
    validation/café/ copied from a Mac beside train/café/ reads the same and is another class. The line says so,
    its accent written out, rather than that train/café/ has no images."""
    import unicodedata

    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    folder = class_folders(tmp_path / "photos", {"train": [composed, "dog"]}, per_class=4)
    class_folders(folder, {"validation": [decomposed, "dog"]}, per_class=2)
    user_error(capsys, main, _photos(tiny_efficientnet_folder, folder, tmp_path / "run"),
               "class 'cafe\\u0301' of label column 'label' has no training sample; 'cafe\\u0301' (train: 'café') differ "
               "from the training labels only by Unicode form or invisible characters", untouched=folder,
               rule="labels.class_without_training_sample")  # fmt: skip


def test_pipeline_clips_a_16_bit_image_that_training_scales_as_the_docs_say(tmp_path):
    """docs/recipes-and-data.md: transformers' pipeline() reads a 16-bit PNG by PIL's convert("RGB"), which
    clips it white; the docs' shift to 8 bits gives it the pixels training saw."""
    from transformers.image_utils import load_image

    from finetune.images import _to_8_bit, open_image

    gradient = (np.linspace(0, 65535, 64 * 48).reshape(48, 64)).astype(np.uint16)
    Image.fromarray(gradient).save(tmp_path / "deep.png")
    assert np.asarray(load_image(str(tmp_path / "deep.png"))).mean() > 250  # what pipeline() sees: white
    trained = np.asarray(_to_8_bit(open_image({"path": str(tmp_path / "deep.png"), "bytes": None})).convert("RGB"))
    docs = np.asarray(Image.fromarray((np.asarray(Image.open(tmp_path / "deep.png")) >> 8).astype("uint8")).convert("RGB"))
    assert (trained == docs).all() and docs.std() > 60


def test_a_photo_of_more_megapixels_than_pil_warns_of_trains_without_its_warning(tiny_efficientnet_folder, tmp_path,
                                                                                 capsys, monkeypatch):  # fmt: skip
    """PIL warns of a "decompression bomb DOS attack" above 89 megapixels (a panorama, a scan: good data), in a
    Python warning line naming its own source file; the app decodes such a photo as any other, without it: the
    real command in a process of its own (pytest records warnings its own way). Above twice that, PIL will not
    open it: one line. PIL's limit lowered so that a small photo stands in."""
    import subprocess
    import sys

    from conftest import REPO

    folder = _photo_folder(tmp_path / "photos")
    Image.new("RGB", (60, 60), (200, 30, 30)).save(folder / "train" / "cat" / "panorama.jpg")  # 3600 pixels
    run = ("import sys, PIL.Image; PIL.Image.MAX_IMAGE_PIXELS = 3000; from finetune.run import main; "
           "main(sys.argv[1:])")  # warns above 3000 pixels, refuses above 6000

    def command(out):
        return subprocess.run([sys.executable, "-c", run, *_photos(tiny_efficientnet_folder, folder, out)], cwd=REPO,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    done = command(tmp_path / "run")
    assert done.returncode == 0 and "DecompressionBomb" not in done.stderr, done.stderr[-2000:]
    Image.new("RGB", (80, 80), (200, 30, 30)).save(folder / "train" / "cat" / "huge.jpg")  # 6400 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)
    user_error(capsys, main, _photos(tiny_efficientnet_folder, folder, tmp_path / "run2"), "huge.jpg",
               "could be decompression bomb")  # fmt: skip


def test_the_decompression_bomb_warning_is_left_out_where_the_app_opens_an_image_alone(tmp_path, monkeypatch):
    """Not by a filter of the process's: a program that imports the app keeps PIL's warning for its own images."""
    import warnings

    import finetune.images as images

    Image.new("RGB", (60, 60)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        images.open_image({"path": str(tmp_path / "big.png"), "bytes": None})
        assert not seen  # the app's own open: quiet
        with Image.open(tmp_path / "big.png"):
            pass
    assert [w.category for w in seen] == [Image.DecompressionBombWarning]  # anyone else's: PIL's warning


@pytest.mark.parametrize(("split", "instead"), [("validation", "hold out a share of train for validation instead"),
                                                ("test", "have no test score")])  # fmt: skip
def test_a_split_folder_without_images_is_refused(split, instead, tiny_efficientnet_folder, tmp_path, capsys):
    """validation/ or test/ beside train/ with its class folders made and no photo copied yet (a .DS_Store
    alone): the loader left the split out without a word, and the run held out train or had no test score."""
    folder = _photo_folder(tmp_path / "photos")
    for label in ("cat", "dog"):
        (folder / split / label).mkdir(parents=True)
    (folder / split / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    user_error(capsys, main, _photos(tiny_efficientnet_folder, folder, tmp_path / "run"),
               f"{folder / split} holds no image, so its split would be left out: the run would {instead}",
               untouched=folder, rule="images.empty_split_folder")  # fmt: skip


def test_a_class_folder_copied_into_another_is_refused(tiny_efficientnet_folder, tmp_path, capsys):
    """cat/'s photos copied into dog/ beside dog's own: every cat is also a dog, so the model cannot learn cat (it
    trained, with a warning that some images have two labels): refused, as a text file whose every text of a
    class is also another's is. A photo or two in both folders (noisy labels) is still the warning of images with
    two labels, and the run goes on."""
    folder = _photo_folder(tmp_path / "photos")
    for jpg in sorted((folder / "train" / "cat").iterdir()):
        shutil.copy(jpg, folder / "train" / "dog" / f"copy-{jpg.name}")
    user_error(capsys, main, _photos(tiny_efficientnet_folder, folder, tmp_path / "run"),
               "all 4 training images (the same bytes) of class 'cat' are also in class 'dog'", untouched=folder,
               rule="splits.class_within_another")  # fmt: skip
    assert not (tmp_path / "run").exists()
    for copy in sorted((folder / "train" / "dog").glob("copy-*"))[1:]:
        copy.unlink()
    results = main(_photos(tiny_efficientnet_folder, folder, tmp_path / "run"))
    assert "splits.one_sample_two_labels" in [w["rule"] for w in results["warnings"]]


def test_a_large_photo_is_decoded_once_and_a_small_image_keeps_its_bytes(monkeypatch):
    """The image task's preparation decodes a large 8-bit JPEG once (finetune/images.py `shrunk`) into an
    upright copy whose shorter side is twice the model's (448 for the 224-pixel EfficientNet): two epochs of
    training read the copy, never the photo. A small image, a large PNG and a CMYK JPEG keep their cells
    byte for byte (what every other test's pixels rest on); the copy's pixels are the photo's, resampled."""
    import io

    from conftest import DATA
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature
    from transformers import AutoImageProcessor

    import finetune.images as images
    from finetune.config import DataArgs
    from finetune.tasks import TASKS

    def encoded(image, fmt, **how):
        stored = io.BytesIO()
        image.save(stored, fmt, **how)
        return stored.getvalue()

    y, x = np.mgrid[0:900, 0:1200]
    photo = Image.fromarray(np.stack([x * 255 // 1200, y * 255 // 900, (x // 50 + y // 50) % 2 * 200], -1).astype(np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored on its side: upright it is 900x1200
    cells = {"photo": encoded(photo, "JPEG", quality=90, exif=exif.tobytes()), "small": encoded(photo.resize((120, 90)), "JPEG"),
             "png": encoded(photo, "PNG"), "cmyk": encoded(photo.convert("CMYK"), "JPEG")}  # fmt: skip
    ds = Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in cells.values()], "labels": [0, 1, 0, 1]},
                           features=Features({"image": ImageFeature(), "labels": Value("int64")}))  # fmt: skip
    opened = []
    real = images.open_image
    monkeypatch.setattr(images, "open_image", lambda value, *a, **k: opened.append(value["bytes"]) or real(value, *a, **k))
    processor = AutoImageProcessor.from_pretrained(DATA / "efficientnet_lite0")
    data = DataArgs(image_column="image", random_flip=True, augment=["crop"])
    prepared = TASKS["image-classification"].prepare(ds, processor, data, "train", 3)
    for epoch in range(2):
        prepared.epoch_listener(epoch)
        assert prepared[:4]["pixel_values"].shape == (4, 3, 224, 224)
    assert opened.count(cells["photo"]) == 1  # the preparation's decode; the epochs read the copy
    stored = prepared.with_format(None)["image"]
    copy = real(stored[0])
    assert copy.size == (448, 597) and stored[0]["bytes"] != cells["photo"]
    assert [cell["bytes"] for cell in stored[1:]] == [cells["small"], cells["png"], cells["cmyk"]]
    upright = real({"bytes": cells["photo"], "path": None}).resize(copy.size, Image.Resampling.LANCZOS)
    assert np.abs(np.asarray(copy, np.int16) - np.asarray(upright, np.int16)).mean() < 3


def test_a_photo_edited_in_place_is_copied_anew_not_read_stale_from_the_cache(tmp_path, monkeypatch):
    """`shrunk`'s copies live in datasets' cache: a photo rewritten under the same name with its modification time
    set back (`cp -p`, `rsync -a` over the folder) was read as the old copy, the new pixels never trained on. Its
    change time moves, and with it the cache key: the new pixels are copied; an untouched folder reads the cache."""
    import os

    from datasets import load_dataset

    from finetune.images import open_image, shrunk, undecoded

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "photos" / "train"
    for name, shade in (("a", 10), ("b", 200)):
        (folder / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (400, 300), (shade,) * 3).save(folder / name / f"{i}.jpg")

    def red_of_a0():
        ds = load_dataset("imagefolder", data_dir=str(folder.parent), cache_dir=str(tmp_path / "cache"))["train"]
        ds = shrunk(undecoded(ds, "image", "train"), "image", 128)
        (cell,) = [v for v in ds["image"] if v["path"].endswith(os.path.join("a", "0.jpg"))]
        return ds._fingerprint, int(np.asarray(open_image(cell))[..., 0].mean())

    first, red = red_of_a0()
    assert red < 20 and red_of_a0()[0] == first
    photo = folder / "a" / "0.jpg"
    st = photo.stat()
    Image.new("RGB", (400, 300), (250, 0, 0)).save(photo)
    os.utime(photo, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert red_of_a0()[1] > 240


@pytest.mark.parametrize("rows", [4, 128])  # 128: datasets' map runs it in worker processes (2 cores or more)
def test_a_large_jpeg_whose_scan_data_is_broken_is_named_before_training(rows, tmp_path, monkeypatch):
    """`verify_images` does not decode a JPEG that ends whole; `shrunk` decodes every large one all the same: a
    broken one is named there, in images.undecodable's line (rule and all, from a map worker too), not at the
    first batch of training."""
    import io

    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    from finetune.errors import UserError
    from finetune.images import shrunk

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    stored = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(stored, "JPEG")
    good = stored.getvalue()
    start = good.find(b"\xff\xda") + 200
    broken = good[:start] + bytes(np.random.default_rng(1).integers(0, 256, 20000, dtype=np.uint8)) + good[start + 20000:]
    cells = [{"bytes": good, "path": f"{i}.jpg"} for i in range(rows - 1)] + [{"bytes": broken, "path": "broken.jpg"}]
    ds = Dataset.from_dict({"image": cells, "labels": [0] * rows},
                           features=Features({"image": ImageFeature(decode=False), "labels": Value("int64")}))  # fmt: skip
    with pytest.raises(UserError, match=r"cannot read image broken\.jpg: broken data stream") as raised:
        shrunk(ds, "image", 128)
    assert raised.value.rule == "images.undecodable"
