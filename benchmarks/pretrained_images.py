"""The bundled pretrained EfficientNet-Lite0 against the same network from scratch, and frozen BatchNorm
against live statistics, on the bundled Fashion-MNIST subset: test accuracy and wall time of each.

    python -m benchmarks.pretrained_images --out benchmarks/results
    python -m benchmarks.pretrained_images --out benchmarks/results --train 600 --epochs 3 --image-size 64

Each row is the real `finetune.run` on finetune/configs/efficientnet_photos.yaml (the photos recipe, as a
user runs it) with the data files and the sizes given here: the first `--train` training images
(stratified in the file: 300 a class in order, so the first N are taken per class), all 1,000 test images,
at `--image-size` pixels (28x28 grayscale, upscaled and converted to RGB). "from scratch" is
`model_config` = the bundled config (same architecture, random weights, BatchNorm live: there are no
statistics to keep). Writes `pretrained_images.json` and `pretrained_images.md` in --out, the machine first.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "data" / "efficientnet_lite0"
RECIPE = "finetune/configs/efficientnet_photos.yaml"


def _subset(train: int, folder: Path) -> Path:
    """The first `train // 10` training images of each class, as a parquet file."""
    from datasets import load_dataset

    ds = load_dataset("parquet", data_files={"train": str(REPO / "data/fashion_mnist/train.parquet")})["train"]
    per_class, seen, keep = train // 10, {}, []
    for i, label in enumerate(ds["label"]):
        if seen.get(label, 0) < per_class:
            seen[label] = seen.get(label, 0) + 1
            keep.append(i)
    path = folder / "train.parquet"
    ds.select(keep).to_parquet(str(path))
    return path


def _scratch_config() -> str:
    config = json.loads((BUNDLED / "config.json").read_text())
    for key in ("id2label", "label2id", "architectures", "transformers_version", "dtype", "torch_dtype"):
        config.pop(key, None)
    import yaml  # YAML's flow style: 1e-06 as JSON writes it would be read back as a string

    return yaml.safe_dump(config, default_flow_style=True, width=10**6).strip()


ROWS = {
    "pretrained, BatchNorm, stem and first 8 of 16 blocks frozen (the recipe)": [],
    "pretrained, BatchNorm frozen, every block trained": ["freeze_layers=0"],
    "pretrained, BatchNorm live, every block trained": ["freeze_batchnorm=false", "freeze_layers=0"],
    "from scratch (same network)": ["freeze_batchnorm=false", "freeze_layers=0", "model_name_or_path=null",
                                    f"image_processor_name={BUNDLED}", f"model_config={_scratch_config()}"],  # fmt: skip
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pretrained_images", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--rows", default=None, help="comma-separated row numbers to run (0: the recipe); all by default")
    args = parser.parse_args(argv)
    chosen = list(ROWS.items()) if args.rows is None else [list(ROWS.items())[int(i)] for i in args.rows.split(",")]
    from finetune.run import main as run

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        train = _subset(args.train, Path(tmp))
        for name, settings in chosen:
            out = Path(tmp) / f"run-{len(rows)}"
            started = time.perf_counter()
            results = run(["--config", RECIPE, "dataset_name=null", "data_dir=null", f"train_file={train}",
                           f"test_file={REPO / 'data/fashion_mnist/test.parquet'}", "validation_split_percentage=10",
                           "random_flip=true", f"num_train_epochs={args.epochs}", f"image_size={args.image_size}",
                           "logging_steps=50", f"output_dir={out}", *settings])  # fmt: skip
            rows.append({"run": name, "settings": [x for x in settings if not x.startswith("model_config=")],
                         "test_accuracy": results["test"]["accuracy"], "seconds": round(time.perf_counter() - started, 1)})
    m = machine()
    table = "\n".join([
        f"# Pretrained EfficientNet-Lite0 against from scratch: Fashion-MNIST, {args.train} training images",
        "", machine_line(m), "",
        "| run | test accuracy (1,000 images) | wall seconds |", "|---|---|---|",
        *(f"| {r['run']} | {r['test_accuracy']:.4f} | {r['seconds']:.1f} |" for r in rows), "",
        f"{args.epochs} epochs at {args.image_size}x{args.image_size}, batch 16, learning rate 5e-4 (the recipe's), "
        "random flip and crop; 10% of the training images held out for validation; one seed (42).", "",
        f"`python -m benchmarks.pretrained_images --out {args.out} --train {args.train} --epochs {args.epochs} "
        f"--image-size {args.image_size}" + (f" --rows {args.rows}`" if args.rows else "`"),
    ])  # fmt: skip
    write_report(args.out, "pretrained_images", {"machine": m, "rows": rows, **vars(args) | {"out": str(args.out)}},
                 table)


if __name__ == "__main__":
    main()
