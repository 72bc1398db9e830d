"""Images: an image folder's layout, and the image files a split names (finetune/data.py and
finetune/images.py ask these).

    FOLDER     an image folder as datasets' loader would read it: what it would leave out without a word
    CLASSES    class folders with no readable image
    ROWS       a row without an image
    UNREADABLE why an image does not open (text in an image column, a URL, a path read from elsewhere)
    LOOKED     what the check before training saw of a split's images (`Looked`): their sizes, the pixels of a few
    CHANNELS   a model that reads neither 1 nor 3 channels
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from finetune.checks import rule
from finetune.formats import SPLIT_FOLDERS, UNREADABLE_PHOTOS, image_suffixes


def _levels(root: Path):
    """The entries of an image folder and of each folder in it (a split's classes, or the classes)."""
    return (root.iterdir(), *(p.iterdir() for p in root.iterdir() if p.is_dir()))


def _splits(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and p.name.lower() in SPLIT_FOLDERS] or [root]


@rule("images.folder_link")
def folder_link(root: Path, is_run) -> str | None:
    """A split or class folder that is a link: the loader follows links to files, not to folders, so its
    images would be left out."""
    for level in _levels(root):
        for path in sorted(level):
            if path.is_symlink() and path.is_dir():
                return (f"{path} is a link to a folder ({os.readlink(path)}), which the image folder loader does not "
                        "follow: its images would be left out; copy the folder in its place, or link each image file")
    return None


@rule("images.dangling_link")
def dangling_link(root: Path, is_run) -> str | None:
    """A link to an image that is gone: the loader would leave it out without a word."""
    for path in (*(p for level in _levels(root) for p in sorted(level)), *root.glob("*/*/*")):
        if path.is_symlink() and not path.exists():
            return (f"{path} is a link to {os.readlink(path)}, which does not exist: the image would be left out; fix "
                    "the link or delete it")
    return None


@rule("images.split_folder_in_capitals")
def split_folder_in_capitals(root: Path, is_run) -> str | None:
    """Train/, Validation/: read as class folders (the loader knows split folders by their lower-case names),
    so every split's images would be trained on."""
    cased = next((p for p in sorted(root.iterdir()) if p.is_dir() and p.name.lower() in SPLIT_FOLDERS
                  and p.name not in SPLIT_FOLDERS), None)  # fmt: skip
    if cased is not None:
        return (f"{cased} is not read as the {cased.name.lower()} split: the image folder loader knows split folders by "
                f"their lower-case names only; rename it to {cased.name.lower()}/")
    return None


@rule("images.images_beside_split_folders")
def images_beside_split_folders(root: Path, is_run) -> str | None:
    """train/ and bird/: the loader reads the split folders alone, so the other folder's images are left out."""
    splits = _splits(root)
    beside = next((p for p in sorted(root.iterdir()) if splits != [root] and p.is_dir() and p not in splits
                   and not p.name.startswith((".", "__"))  # __MACOSX/, .ipynb_checkpoints/: no one's images
                   and any(q.suffix.lower() in image_suffixes() for q in p.rglob("*"))), None)  # fmt: skip
    if beside is not None:
        into = next((p.name for p in splits if p.name in ("train", "training")), splits[0].name)
        return (f"{beside} holds images beside the split folders of {root} ({', '.join(sorted(p.name for p in splits))}): "
                "the image folder loader reads only the split folders, so they would be left out; move "
                f"{beside.name}/ into {into}/ (as a class) or out of {root}")
    return None


@rule("images.empty_split_folder")
def empty_split_folder(root: Path, is_run) -> str | None:
    """A validation or test folder beside train/ that holds no image (its class folders made, the photos not
    copied yet): the split would vanish without a word, validation then held out of train, and no test score."""
    splits = _splits(root)
    if not any(p.name in ("train", "training") for p in splits):
        return None
    for folder in (p for p in splits if p.name not in ("train", "training")):
        if not any(f.suffix.lower() in image_suffixes() and f.is_file() for f in folder.rglob("*")):
            instead = ("the run would hold out a share of train for validation instead" if folder.name in
                       ("validation", "valid", "val", "dev") else "the run would have no test score")  # fmt: skip
            return (f"{folder} holds no image, so its split would be left out: {instead}; add its images, or remove "
                    "the folder")
    return None


@rule("images.run_inside_the_folder")
def run_inside_the_folder(root: Path, is_run) -> str | None:
    """A run's output folder put inside the image folder: its files would be read as a class of images."""
    for folder in (f for split in _splits(root) for f in sorted(split.iterdir()) if f.is_dir()):
        if is_run(folder):
            return (f"{folder} is a run's output folder inside the image folder: its files would be read as a class of "
                    "images; move it out of the image folder")
    return None


@rule("images.image_beside_class_folders")
def image_beside_class_folders(root: Path, is_run) -> str | None:
    """An image beside the class folders of a split: it has no class (the loader drops every label for it)."""
    for folder in _splits(root):
        entries = sorted(folder.iterdir())
        loose = [p for p in entries if p.is_file() and p.suffix.lower() in image_suffixes()]
        if loose and any(p.is_dir() for p in entries):
            return (f"{loose[0]} is an image beside the class folders of {folder}: an image folder labels each image by "
                    "the folder it is in; move it into its class's folder, or delete it")
    return None


@rule("images.photos_not_read", warning=True)
def photos_not_read(root: Path, is_run) -> str | None:
    """Photos in formats PIL reads only with plugins (HEIC, RAW, AVIF): the loader leaves them out."""
    train = root / "train" if (root / "train").is_dir() else root  # its class folders of them alone: refused
    unread = sorted(p for p in root.rglob("*") if p.suffix.lower() in UNREADABLE_PHOTOS and p.is_file()
                    and (p.parent.parent != train or any(q.suffix.lower() in image_suffixes()
                                                         for q in p.parent.iterdir())))  # fmt: skip
    if unread:
        kinds = ", ".join(sorted({p.suffix.lower() for p in unread}))
        return (f"{len(unread)} photo(s) in {root} are {kinds} files, which cannot be read here and are left out (first: "
                f"{unread[0]}); convert them to JPEG or PNG to train on them")
    return None


# The first bytes of the image formats a photo comes in, and their names (not TIFF's: a camera's raw files, .pef
# or .srw, begin as a TIFF does, and are no TIFF to rename).
_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"))


def _image_by_its_bytes(path: Path) -> str | None:
    """The format of a file whose first bytes are an image's (WebP: RIFF....WEBP), else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return None
    return "WebP" if head[:4] == b"RIFF" and head[8:] == b"WEBP" else next((n for m, n in _MAGIC if head.startswith(m)), None)


@rule("images.images_under_other_names", warning=True)
def images_under_other_names(root: Path, is_run) -> str | None:
    """Image files whose names the loader skips (no suffix, photo.jpg_large, img.png~): their bytes are a JPEG's
    or a PNG's, and they would be left out without a word."""
    known = {*image_suffixes(), *UNREADABLE_PHOTOS}
    skipped = [(p, kind) for p in sorted(root.rglob("*")) if p.suffix.lower() not in known
               and not any(part.startswith(".") for part in p.relative_to(root).parts)  # hidden: no one's images
               and p.is_file() and (kind := _image_by_its_bytes(p))]  # fmt: skip
    if skipped:
        (first, kind), n = skipped[0], len(skipped)
        return (f"{n} file(s) in {root} are images by their bytes but not by their names, so the image folder loader "
                f"leaves them out (first: {first}, a {kind}); rename them with their format's suffix (.jpg, .png) to "
                "train on them")
    return None


# The subject: the image folder's root, and how a run's output folder is told (finetune/rundir.py).
FOLDER = [folder_link, dangling_link, split_folder_in_capitals, images_beside_split_folders, empty_split_folder,
          run_inside_the_folder, image_beside_class_folders, photos_not_read, images_under_other_names]  # fmt: skip


def _class_folders(data_dir: str) -> list[Path]:
    root = Path(data_dir) / "train" if (Path(data_dir) / "train").is_dir() else Path(data_dir)
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.lower() not in SPLIT_FOLDERS and not p.name.startswith("."))


def _holds_images(folder: Path) -> bool:
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    images = {e.lower() for e in ImageFolder.EXTENSIONS}
    return any(f.suffix.lower() in images and f.is_file() for f in folder.rglob("*"))


@rule("images.class_of_unreadable_photos")
def class_of_unreadable_photos(data_dir: str) -> str | None:
    """A class folder of photos PIL cannot read here (HEIC, RAW): its class would be left out."""
    for folder in (f for f in _class_folders(data_dir) if not _holds_images(f)):
        kinds = sorted({f.suffix.lower() for f in folder.rglob("*") if f.suffix.lower() in UNREADABLE_PHOTOS})
        if kinds:
            return f"class folder {folder} holds only {', '.join(kinds)} photos, which cannot be read here: convert them to JPEG or PNG"
    return None


@rule("images.empty_class_folder")
def empty_class_folder(data_dir: str) -> str | None:
    """A class folder with no image: datasets leaves its class out without a word, and a folder made for a
    class is not meant to vanish."""
    folder = next((f for f in _class_folders(data_dir) if not _holds_images(f)), None)
    if folder is not None:
        return f"class folder {folder} holds no image, so its class would be left out; add its images, or remove the folder"
    return None


CLASSES = [class_of_unreadable_photos, empty_class_folder]


def one_class_folder(ds, split: str, args) -> str | None:
    """An image folder of one class (datasets labels the images only when there are two or more), or one with
    a folder inside a class folder: the line that says so, or None."""
    from datasets import Image

    column = args.image_column
    if column not in ds.column_names:
        return None
    paths = {v.get("path") for v in ds.cast_column(column, Image(decode=False))[column] if v}
    if args.data_dir:  # <data_dir>/<split>/<class>/x.png is the deepest layout: datasets drops the labels else
        root = Path(args.data_dir).resolve()
        deep = sorted(Path(p).resolve().parent for p in paths
                      if p and root in Path(p).resolve().parents and len(Path(p).resolve().relative_to(root).parts) > 3)
        if deep:
            return (f"{deep[0]} is a folder inside a class folder; an image folder is <data_dir>/train/<class>/*.png, one "
                    "level of class folders: move its images up into the class folder, or make it a class folder of its own")
    parents = {Path(p).parent for p in paths if p}
    if len(parents) != 1 or None in paths:
        return None
    folder, root = parents.pop().resolve(), Path(args.data_dir).resolve() if args.data_dir else None
    if root is None or root not in folder.parents:  # not an image folder's class
        return None
    if folder.parent == root and folder.name.lower() in SPLIT_FOLDERS:  # images straight in a split folder
        return None
    return (f"the {split} images are all in one class folder ({folder.name!r}, {folder}); a classifier needs two or more "
            "classes: add a folder of images for each class (<data_dir>/train/<class>/*.png)")


# --- the images a split names ----------------------------------------------------------------------------------


@rule("images.not_an_image_column")
def not_an_image_column(column: str, split: str, feature: Any, error: Exception) -> str:
    """An image column that does not hold images (datasets cannot read it as such)."""
    return f"column '{column}' in the {split} data does not hold images ({feature}): {error}; set image_column"


NOT_IMAGES = [not_an_image_column]


@rule("images.row_without_image")
def row_without_image(value: Any, split: str, index: int) -> str | None:
    """A row whose image has neither bytes nor a path."""
    if value is None or (value.get("bytes") is None and value.get("path") is None):
        return f"the {split} data has no image in row {index + 1} (no bytes and no path); give that row an image, or drop it"
    return None


ROWS = [row_without_image]


class Unopened:
    """An image that did not open: its cell ({"bytes", "path"}), the column, the split, its row, the error."""

    def __init__(self, value: dict, column: str, split: str, index: int, error: Exception):
        self.value, self.column, self.split, self.index, self.error = value, column, split, index, error
        self.path = value.get("path")
        self.missing_path = value.get("bytes") is None and isinstance(self.path, str) and not Path(self.path).exists()

    @property
    def name(self) -> str:
        return str(self.path) if self.path else f"#{self.index}"


@rule("images.base64_text")
def base64_text(u: Unopened) -> str | None:
    """Images written as base64 text in an image column."""
    if u.missing_path and u.path.startswith(("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "data:image/")):
        return (f"column '{u.column}' of the {u.split} data holds images written as base64 text ({u.path[:24]!r}... in "
                f"row {u.index + 1}); decode them (base64.b64decode) into image files, or into an image column of bytes "
                "(datasets' Image feature, or {'bytes': ...} records in parquet)")
    return None


@rule("images.text_not_paths")
def text_not_paths(u: Unopened) -> str | None:
    """Text in an image column (an image model given a text task's data): a 'file' without an image suffix."""
    if u.missing_path and Path(u.path).suffix.lower() not in image_suffixes():
        return (f"column '{u.column}' of the {u.split} data holds text, not image paths ({u.path[:60]!r} in row "
                f"{u.index + 1}); an image model needs image files (a column of their paths, or an image folder as "
                "data_dir); for text, use a text model")
    return None


@rule("images.file_url")
def file_url(u: Unopened) -> str | None:
    """An image path written as a file:// URL."""
    if isinstance(u.path, str) and u.path.startswith("file://"):
        return f"image {u.path!r} (row {u.index + 1} of the {u.split} data) is a URL; give the path without file://"
    return None


@rule("images.relative_path")
def relative_path(u: Unopened) -> str | None:
    """A relative image path that is not there: it is read from the current folder, not the data file's."""
    if u.missing_path and not Path(u.path).is_absolute():
        return (f"image {u.path!r} (row {u.index + 1} of the {u.split} data) not found: a relative path is read from the "
                f"current folder ({Path.cwd()}), not the data file's; write the paths from there, or absolute")
    return None


@rule("images.unreadable_image")
def unreadable_image(u: Unopened) -> str:
    """An image file that does not open or decode (garbage, a bad header, a file cut short: a JPEG or GIF without
    its end marker, and a format whose header alone PIL's verify() reads, BMP or TIFF, is decoded to tell)."""
    return f"cannot read image {u.name} in the {u.split} data: {u.error}; remove or replace the file"


UNREADABLE = [base64_text, text_not_paths, file_url, relative_path, unreadable_image]


@rule("images.undecodable", local=True)
def undecodable(name: str, error: Exception) -> str:
    """An image that opened before training and fails to decode (a JPEG whose scan data is broken, its file
    whole): a large JPEG is named by the pass that copies it before training (images.shrunk), a small one in
    training, by the process whose share of the data holds it."""
    return f"cannot read image {name}: {error}; remove or replace the file"


UNDECODABLE = [undecodable]


class Looked:
    """What the check before training saw of a split's images: each image's size (its header's), and the
    pixels of the first few that have a transparency (`with_alpha`: each one's name, the spread of its colour
    channels and of its alpha, 0-255) or float pixels (`floats`: each one's name, its lowest and highest value)."""

    SAMPLED = 64  # images of each kind decoded: a folder of icons or of float TIFFs shows in its first few

    def __init__(self, split: str):
        self.split = split
        self.sizes: Counter = Counter()  # (width, height): how many images have it
        self.first_of: dict[tuple[int, int], str] = {}  # (width, height): the first image of that size
        self.with_alpha: list[tuple[str, int, int]] = []
        self.floats: list[tuple[str, float, float]] = []

    def add(self, name: str, size: tuple[int, int]) -> None:
        self.sizes[size] += 1
        self.first_of.setdefault(size, name)


@rule("images.drawing_in_transparency")
def drawing_in_transparency(s: Looked) -> str | None:
    """Images drawn in their transparency alone (black icons on a transparent background): their colour
    channels one flat colour. Training, and transformers' pipeline(), drop the alpha channel, so each is one
    flat colour to the model and nothing can be learned from it."""
    flat = [name for name, color, alpha in s.with_alpha if color <= 16 and alpha >= 128]
    if flat and len(flat) * 2 >= len(s.with_alpha):
        return (f"{len(flat)} of the {len(s.with_alpha)} {s.split} images with a transparency checked are drawn in it "
                f"alone (first: {flat[0]}): their colours are one flat colour, which is all the model sees once the "
                "transparency is dropped; flatten them onto a background (PIL's Image.alpha_composite onto white) and "
                "save them as RGB")
    return None


@rule("images.float_pixels")
def float_pixels(s: Looked) -> str | None:
    """Images of 32-bit float pixels (PIL mode F, a float TIFF) on a scale other than 0-255 (0-1, most often):
    PIL's conversion to 8 bits, the model's and transformers' pipeline()'s, clips them, so 0-1 is all black."""
    off = [(name, lo, hi) for name, lo, hi in s.floats if hi <= 1.0 or lo < 0 or hi > 255]
    if off:
        name, lo, hi = off[0]
        return (f"{len(off)} {s.split} image(s) hold float pixels from {lo:g} to {hi:g} (first: {name}), which the "
                "conversion to 8-bit colour clips to 0-255: the model would see them flat; save them as 8-bit (or "
                "16-bit) PNGs, their values scaled to 0-255 (0-65535)")
    return None


@rule("images.degenerate_size", warning=True)
def degenerate_size(s: Looked) -> str | None:
    """Images of a pixel or two on a side, or 16 times longer than wide (a tracking pixel, a placeholder, a
    banner): resized to the model's square they are a flat colour or a smear."""
    odd = sorted((size for size in s.sizes if min(size) <= 2 or max(size) >= 16 * min(size)), key=min)
    if odd:
        n = sum(s.sizes[size] for size in odd)
        shown = ", ".join(f"{w}x{h}" for w, h in odd[:3]) + (", ..." if len(odd) > 3 else "")
        return (f"{n} of the {s.sizes.total()} {s.split} images are {shown} pixels (first: {s.first_of[odd[0]]}): resized to the "
                "model's input they are a flat colour or a smear; remove them, or crop them to what they show")
    return None


LOOKED = [drawing_in_transparency, float_pixels, degenerate_size]


@rule("images.channels")
def channels(num_channels: int) -> str | None:
    """A model that reads neither 1 (grayscale) nor 3 (RGB) channels."""
    if num_channels not in (1, 3):
        return (f"the model's num_channels is {num_channels}: images are read as 1 (grayscale) or 3 (RGB) channels; set "
                "model_config.num_channels to 1 or 3, or give a model that has one of them")
    return None


CHANNELS = [channels]


@rule("images.one_image_as_data")
def one_image_as_data(path: Path) -> str | None:
    """`--data` that names one image, where a folder of them is read."""
    if path.is_file() and path.suffix.lower() in (*image_suffixes(), *UNREADABLE_PHOTOS):
        return f"--data {path} is one image; give a folder of images (an image folder: a subfolder per class, as in training)"
    return None


ONE_IMAGE = [one_image_as_data]
