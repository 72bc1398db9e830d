"""Build small public tasks of the kinds the bundled data lacks, from public data only, offline and
deterministic (the same bytes on every machine): what `python -m benchmarks.expected_results` measures.

    python scripts/public_tasks.py runs/public_tasks                     # all five, a few seconds
    python scripts/public_tasks.py runs/public_tasks --tasks photos      # one
    accelerate launch finetune/run.py --config finetune/configs/vit_photos.yaml data_dir=runs/public_tasks/photos

What each folder holds, where it comes from and its licence (each folder also gets a SOURCE.md saying
the same, and a manifest.json with its counts and the sha256 of every file):

- `rt_pairs/{train,validation,test}.jsonl`, sentence pairs: {"text", "text_pair", "label"}, label
  "same" when both reviews have the same polarity, else "different". From the bundled
  data/rotten_tomatoes (Pang & Lee 2005, CC BY 4.0), each split paired within itself (no sentence
  crosses splits): the split's sentences in a seeded shuffle, paired off consecutively; train twice
  over (two shuffles, so each training sentence is in two pairs with two partners), validation and
  test once. Labels come out about half and half.
- `rt_few/{train,validation,test}.jsonl`, single sentences from few examples: {"text", "label"}, 500
  training and 300 validation sentences of data/rotten_tomatoes (the same licence), half of each
  polarity, drawn in a seeded shuffle from its train and validation splits; test is its whole test
  split (1,066). A user's own small labelled set, for the generic recipe (bert_custom_files.yaml).
- `uner_entity_count/{train,validation,test}.jsonl`, regression: {"text", "entities"}, the sentence's
  words joined by spaces and the number of named entities in it (its B- tags) as a float.
- `uner_entity_types/{train,validation,test}.jsonl`, multi-label: {"text", "labels"}, the entity
  types in the sentence (a sorted subset of LOC, ORG, PER), ["none"] for a sentence without one.
  Both from the bundled data/uner_english_ewt (Universal NER over UD English-EWT, CC BY-SA 4.0: the
  derived files are CC BY-SA 4.0 too). It has no train split: train and validation are a seeded
  85/15 split of its validation file (1,701 / 300 sentences), test is its test file (2,077).
- `photos/{train,validation,test}/<photo>/<n>.png`, image classification from scratch: 32x32 RGB
  patches of three real photographs that allowed packages ship inside their wheels (no download):
  scikit-learn's `china.jpg` and `flower.jpg` (`sklearn/datasets/images`, CC BY 2.0, as its
  README.txt states) and matplotlib's `grace_hopper.jpg` (`mpl-data/sample_data`, the official U.S.
  Navy portrait, public domain: its JPEG comment names Wikimedia Commons' File:Grace_Hopper.jpg).
  `PHOTOS` below gives each one's author and licence, and so does the SOURCE.md written beside the
  data; the derived patches of the CC BY photos are CC BY 2.0 too. Left out: the rest of
  matplotlib's sample data (an icon, a logo, an MRI slice, elevation grids: not photographs, or no
  stated licence). The class is the photo a patch was cut from. Each photo is scaled to a shorter
  side of 384 px and cut into 48x48 blocks; blocks with almost no texture (grey-level std < 8: flat
  sky, out-of-focus background) are dropped, and each photo's remaining blocks are dealt, in a seeded
  shuffle, 20% to test, 20% to validation and the rest to train, so no pixel of a test patch was ever
  in a training patch. A sample is a random square of 32-48 px inside a block of its split, turned by
  a random multiple of 90 degrees and scaled to 32x32: 400 per class in train, 100 in validation and
  100 in test. The folder is an `imagefolder` (`data_dir=`): folder names are the labels. The bytes
  are the same wherever the same Pillow decodes the same wheels' photos (the manifest records each
  source file's sha256 and the Pillow version).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROTTEN = REPO / "data" / "rotten_tomatoes"
UNER = REPO / "data" / "uner_english_ewt"
SPLITS = ("train", "validation", "test")
TASKS = ("rt_pairs", "rt_few", "uner_entity_count", "uner_entity_types", "photos")
ENTITY_TYPES = ("LOC", "ORG", "PER")
UNER_VALIDATION_SHARE = 0.15
RT_FEW = {"train": 500, "validation": 300}  # sentences of rt_few; its test is the whole test split
BUILT_BY = "scripts/public_tasks.py"

# The photographs that allowed packages ship, each: (package, path inside it, what it is and its licence).
PHOTOS = {
    "china": ("sklearn", "datasets/images/china.jpg",
              "a pagoda above a lake and trees; by danielbuechele on Flickr "
              "(flickr.com/photos/danielbuechele/6061409035), CC BY 2.0, as scikit-learn's "
              "datasets/images/README.txt states"),
    "flower": ("sklearn", "datasets/images/flower.jpg",
               "a dahlia; by vultilion on Flickr (flickr.com/photos/vultilion/6056698931; the JPEG's own "
               "metadata names www.vultilion.de), CC BY 2.0, as scikit-learn's datasets/images/README.txt states"),
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg",
                     "Commodore Grace M. Hopper, her official U.S. Navy portrait: public domain, a work "
                     "of the U.S. federal government; the JPEG's comment names its source, "
                     "commons.wikimedia.org/wiki/File:Grace_Hopper.jpg"),
}  # fmt: skip
SHORT_SIDE, BLOCK, PATCH = 384, 48, 32
MIN_BLOCK_STD = 8.0  # grey levels: a block flatter than this belongs to no photo in particular
PHOTO_SAMPLES = {"train": 400, "validation": 100, "test": 100}  # per class
PHOTO_BLOCK_SHARE = {"test": 0.2, "validation": 0.2}  # of each photo's blocks; train gets the rest


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_rotten(split: str) -> list[dict]:
    with (ROTTEN / f"{split}.csv").open(encoding="utf-8", newline="") as f:
        return [{"text": r["text"], "label": int(r["label"])} for r in csv.DictReader(f)]


def read_uner(name: str) -> list[dict]:
    return [json.loads(line) for line in (UNER / name).read_text(encoding="utf-8").splitlines() if line]


# --- the text tasks ---------------------------------------------------------------------------------------


def rt_pairs(split: str) -> list[dict]:
    """The split's sentences paired off in a seeded shuffle (train: twice, two shuffles)."""
    sentences = read_rotten(split)
    rows = []
    for rep in range(2 if split == "train" else 1):
        order = list(range(len(sentences)))
        random.Random(f"rt_pairs:{split}:{rep}").shuffle(order)
        for a, b in zip(order[0::2], order[1::2], strict=False):  # an odd one out is left out
            same = sentences[a]["label"] == sentences[b]["label"]
            rows.append({"text": sentences[a]["text"], "text_pair": sentences[b]["text"],
                         "label": "same" if same else "different"})  # fmt: skip
    return rows


def rt_few(split: str) -> list[dict]:
    """RT_FEW[split] sentences of the split, half of each polarity, in a seeded shuffle (test: all)."""
    sentences = read_rotten(split)
    if split not in RT_FEW:
        return sentences
    rng = random.Random(f"rt_few:{split}")
    halves = [[s for s in sentences if s["label"] == label] for label in (0, 1)]
    for half in halves:
        rng.shuffle(half)
    rows = [s for half in halves for s in half[: RT_FEW[split] // 2]]
    rng.shuffle(rows)
    return rows


def uner_sentences() -> dict[str, list[dict]]:
    """train / validation: a seeded 85/15 split of UNER's validation file; test: its test file."""
    dev = read_uner("validation.jsonl")
    order = list(range(len(dev)))
    random.Random("uner:validation-split").shuffle(order)
    held = set(order[: round(len(dev) * UNER_VALIDATION_SHARE)])
    return {
        "train": [s for i, s in enumerate(dev) if i not in held],  # file order kept
        "validation": [s for i, s in enumerate(dev) if i in held],
        "test": read_uner("test.jsonl"),
    }


def entity_types(sentence: dict) -> list[str]:
    return sorted({tag[2:] for tag in sentence["ner_tags"] if tag.startswith("B-")})


def uner_entity_count(sentence: dict) -> dict:
    count = sum(tag.startswith("B-") for tag in sentence["ner_tags"])
    return {"text": " ".join(sentence["tokens"]), "entities": float(count)}


def uner_entity_types(sentence: dict) -> dict:
    return {"text": " ".join(sentence["tokens"]), "labels": entity_types(sentence) or ["none"]}


# --- the photos --------------------------------------------------------------------------------------------


def photo_file(name: str) -> Path:
    """Where the installed package keeps the photo (importlib finds the package; nothing is imported
    from it)."""
    import importlib.util

    package, inside, _ = PHOTOS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"error: the photos task needs {package} installed (pip install {package})")
    return Path(spec.origin).parent / inside


def photo(name: str):
    """The photo as an 8-bit RGB PIL image, scaled to a shorter side of SHORT_SIDE."""
    import PIL.Image

    with PIL.Image.open(photo_file(name)) as opened:
        image = opened.convert("RGB")
    w, h = image.size
    scale = SHORT_SIDE / min(w, h)
    return image.resize((round(w * scale), round(h * scale)), PIL.Image.Resampling.LANCZOS)


def photo_blocks(name: str, image) -> dict[str, list[tuple[int, int]]]:
    """The textured BLOCK x BLOCK blocks of the photo (top-left corners), dealt to the splits."""
    import numpy as np

    grey = np.asarray(image.convert("L"), dtype=np.float64)
    corners = [(x, y) for y in range(0, image.height - BLOCK + 1, BLOCK) for x in range(0, image.width - BLOCK + 1, BLOCK)
               if grey[y : y + BLOCK, x : x + BLOCK].std() >= MIN_BLOCK_STD]  # fmt: skip
    random.Random(f"photos:{name}:blocks").shuffle(corners)
    n_test = max(1, round(len(corners) * PHOTO_BLOCK_SHARE["test"]))
    n_val = max(1, round(len(corners) * PHOTO_BLOCK_SHARE["validation"]))
    return {
        "test": corners[:n_test],
        "validation": corners[n_test : n_test + n_val],
        "train": corners[n_test + n_val :],
    }


def photo_patches(name: str, image, blocks: list[tuple[int, int]], split: str, n: int) -> list:
    """`n` patches: a random square of PATCH..BLOCK px inside a random block, turned by k x 90
    degrees, scaled to PATCH x PATCH."""
    import PIL.Image

    rng = random.Random(f"photos:{name}:{split}:patches")
    patches = []
    for _ in range(n):
        bx, by = rng.choice(blocks)
        side = rng.randint(PATCH, BLOCK)
        x, y = bx + rng.randint(0, BLOCK - side), by + rng.randint(0, BLOCK - side)
        patch = image.crop((x, y, x + side, y + side)).resize((PATCH, PATCH), PIL.Image.Resampling.LANCZOS)
        turns = rng.randrange(4)
        patches.append(patch.rotate(90 * turns) if turns else patch)
    return patches


def build_photos(root: Path) -> dict:
    """`root`/{train,validation,test}/<photo>/<n>.png; returns the blocks and samples per photo."""
    kept: dict[str, dict] = {}
    for name in PHOTOS:
        image = photo(name)
        blocks = photo_blocks(name, image)
        kept[name] = {"file": f"{PHOTOS[name][0]}/{PHOTOS[name][1]}", "sha256": sha256(photo_file(name)),
                      "scaled_size": list(image.size), "blocks": {s: len(b) for s, b in blocks.items()}}  # fmt: skip
        for split in SPLITS:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i, patch in enumerate(photo_patches(name, image, blocks[split], split, PHOTO_SAMPLES[split])):
                patch.save(folder / f"{i:04d}.png", optimize=False)
    return kept


# --- writing -----------------------------------------------------------------------------------------------

SOURCES = {
    "rt_pairs": "data/rotten_tomatoes (Sentence Polarity Dataset v1.0, Pang & Lee 2005): CC BY 4.0, "
    "Copyright (C) 2005 Bo Pang and Lillian Lee. Pairs of its sentences, labelled same/different polarity.",
    "rt_few": "data/rotten_tomatoes (Sentence Polarity Dataset v1.0, Pang & Lee 2005): CC BY 4.0, "
    "Copyright (C) 2005 Bo Pang and Lillian Lee. 500 / 300 of its train / validation sentences, and its test split.",
    "uner_entity_count": "data/uner_english_ewt (Universal NER, English-EWT; Mayhew et al., NAACL 2024): "
    "CC BY-SA 4.0; this derived file is shared under CC BY-SA 4.0 as well. Sentence -> number of entities.",
    "uner_entity_types": "data/uner_english_ewt (Universal NER, English-EWT; Mayhew et al., NAACL 2024): "
    "CC BY-SA 4.0; this derived file is shared under CC BY-SA 4.0 as well. Sentence -> entity types present.",
    "photos": "three photographs shipped inside scikit-learn's and matplotlib's wheels, one class each:\n\n"
    + "".join(f"- `{k}` ({package}/{path}): {what}.\n" for k, (package, path, what) in PHOTOS.items())
    + "\nThe patches of the CC BY 2.0 photos are shared under CC BY 2.0, with the same attribution.",
}  # fmt: skip


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clear(folder: Path) -> None:
    """An earlier build of the task goes (a stale class folder would be a class); anything else is refused."""
    import shutil

    if not folder.exists():
        return
    manifest = folder / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("built_by") == BUILT_BY:
        shutil.rmtree(folder)
    elif any(folder.iterdir()):
        raise SystemExit(f"error: {folder} holds files this script did not build; give another output folder")


def build(task: str, out: Path) -> dict:
    """Write one task into `out`/`task` and return its manifest (also written as manifest.json)."""
    folder = out / task
    clear(folder)
    manifest: dict = {"task": task, "source": SOURCES[task], "built_by": BUILT_BY}
    if task in ("rt_pairs", "rt_few"):
        for split in SPLITS:
            rows = rt_pairs(split) if task == "rt_pairs" else rt_few(split)
            write_jsonl(folder / f"{split}.jsonl", rows)
            manifest[split] = {
                "rows": len(rows),
                "labels": dict(sorted(Counter(r["label"] for r in rows).items())),
            }
    elif task in ("uner_entity_count", "uner_entity_types"):
        make = uner_entity_count if task == "uner_entity_count" else uner_entity_types
        for split, sentences in uner_sentences().items():
            rows = [make(s) for s in sentences]
            write_jsonl(folder / f"{split}.jsonl", rows)
            counted = Counter(r["entities"] for r in rows) if task == "uner_entity_count" else Counter(
                label for r in rows for label in r["labels"])  # fmt: skip
            manifest[split] = {"rows": len(rows), "labels": {str(k): v for k, v in sorted(counted.items())}}
    elif task == "photos":
        import PIL

        manifest["photos"], manifest["pillow"] = build_photos(folder), PIL.__version__
        for split in SPLITS:
            manifest[split] = {"rows": PHOTO_SAMPLES[split] * len(PHOTOS), "per_class": PHOTO_SAMPLES[split]}
    else:
        raise ValueError(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and p.name not in ("manifest.json", "SOURCE.md")
    )
    manifest["sha256_of_files"] = hashlib.sha256(
        "".join(f"{p.relative_to(folder)} {sha256(p)}\n" for p in files).encode()
    ).hexdigest()
    (folder / "SOURCE.md").write_text(f"# {task}\n\nBuilt by `python scripts/public_tasks.py` from {SOURCES[task]}\n\n"
                                      "See that script's docstring for how.\n")  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> dict[str, dict]:
    p = argparse.ArgumentParser(prog="python scripts/public_tasks.py", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="the folder to write the tasks into (one subfolder each)")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    args = p.parse_args(argv)
    built = {}
    for task in args.tasks:
        built[task] = build(task, args.out)
        print(f"{args.out / task}: " + ", ".join(f"{s} {built[task][s]['rows']}" for s in SPLITS))
    return built


if __name__ == "__main__":
    main()
