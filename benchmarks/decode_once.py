"""Large photos decoded once (finetune/images.py's `shrunk`) against decoded at every epoch (issue 49).

Makes N synthetic phone photos (4032x3024, smooth gradients, a class-coloured shape, texture and noise,
JPEG quality 90, every fourth stored on its side with EXIF orientation 6) in 10 class folders, then times:

    encodings   the small copy's format: PNG, JPEG 95 (4:2:0 and 4:4:4): encode and decode ms, size,
                and how far the 224-pixel input differs from one made from the full decode
    per epoch   the transform over the split as today (each photo decoded at PIL's draft) against the
                one-time pass plus the same transform over the small copies; a second pass, cached
    runs        (--runs) the photos recipe for one epoch before (a copy of the app from git, --before)
                and after, wall clock and results.json's phase seconds

and estimates from the measured costs what 2,000 photos x 3 epochs take.

    python -m benchmarks.decode_once --out benchmarks/results --photos 240 [--runs --before REV]

Writes `decode_once.json` and `decode_once.md` in --out, the machine and its load first.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import PIL.Image

from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parent.parent
CLASSES = [f"class_{i}" for i in range(10)]
W, H = 4032, 3024
RECIPE = "finetune/configs/efficientnet_photos.yaml"


def make_photos(root: Path, n: int, seed: int = 0) -> Path:
    """`root/train/<class>/<i>.jpg`: n photo-like JPEGs, ~4-6 MB each."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 11, (H, W + 64, 3)).astype(np.int16)  # rolled per photo
    y, x = np.mgrid[0:H // 4, 0:W // 4].astype(np.float32)
    for i in range(n):
        label = i % len(CLASSES)
        hue = np.array([(label * 37) % 256, (label * 91) % 256, (label * 53 + 80) % 256], np.float32)
        a, b = rng.uniform(-0.5, 0.5, 2)
        small = (hue * 0.5 + 60)[None, None] + 80 * (a * x / (W // 4) + b * y / (H // 4))[..., None]
        cx, cy, r = rng.uniform(200, W // 4 - 200), rng.uniform(200, H // 4 - 200), rng.uniform(80, 180)
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r**2
        small[inside] = hue
        texture = rng.normal(0, 25, (H // 16, W // 16)).astype(np.float32)
        small += np.asarray(PIL.Image.fromarray(texture).resize((W // 4, H // 4), PIL.Image.BICUBIC))[..., None]
        full = np.asarray(PIL.Image.fromarray(small.clip(0, 255).astype(np.uint8)).resize((W, H), PIL.Image.BICUBIC))
        shift = int(rng.integers(0, 64))
        pixels = (full.astype(np.int16) + noise[:, shift:shift + W]).clip(0, 255).astype(np.uint8)
        image, exif = PIL.Image.fromarray(pixels), PIL.Image.Exif()
        if i % 4 == 3:  # a portrait photo, stored on its side
            image = image.transpose(PIL.Image.Transpose.ROTATE_90)
            exif[0x0112] = 6
        folder = root / "train" / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:04d}.jpg", "JPEG", quality=90, exif=exif.tobytes())
    return root


def _processor():
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(REPO / "data" / "efficientnet_lite0")


def encodings(paths: list[Path], processor) -> list[dict]:
    """Each candidate format of the small copy over a few photos: ms to encode, ms to decode, KB, and the
    mean absolute difference of the model's input (pixel_values, about [-1, 1]) from the full decode's."""
    from finetune.images import open_image

    formats = {"PNG": {"format": "PNG"}, "JPEG 95, 4:2:0": {"format": "JPEG", "quality": 95},
               "JPEG 95, 4:4:4": {"format": "JPEG", "quality": 95, "subsampling": 0}}  # fmt: skip
    rows = {name: {"encode_ms": [], "decode_ms": [], "kb": [], "input_difference": []} for name in formats}
    for path in paths:
        value = {"path": str(path), "bytes": None}
        reference = processor(images=[open_image(value).convert("RGB")], return_tensors="pt")["pixel_values"]
        image = open_image(value, at_least=448)
        scale = 448 / min(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), PIL.Image.LANCZOS)
        for name, how in formats.items():
            t = time.perf_counter()
            stored = io.BytesIO()
            image.save(stored, **how)
            encoded = time.perf_counter() - t
            t = time.perf_counter()
            back = PIL.Image.open(io.BytesIO(stored.getvalue()))
            back.load()
            decoded = time.perf_counter() - t
            seen = processor(images=[back.convert("RGB")], return_tensors="pt")["pixel_values"]
            row = rows[name]
            row["encode_ms"].append(1000 * encoded)
            row["decode_ms"].append(1000 * decoded)
            row["kb"].append(len(stored.getvalue()) / 1024)
            row["input_difference"].append((seen - reference).abs().mean().item())
    return [{"format": name, **{k: round(float(np.median(v)), 4 if k == "input_difference" else 1) for k, v in r.items()}}
            for name, r in rows.items()]  # fmt: skip


def _epoch(ds, transform, batch: int = 16) -> float:
    t = time.perf_counter()
    for start in range(0, len(ds), batch):
        transform(ds[start:start + batch])
    return time.perf_counter() - t


def per_epoch(folder: Path, processor, cache: Path) -> dict:
    """The transform over every photo as today, against the one-time pass plus the transform over the copies."""
    import datasets

    from finetune.images import ImageTransform, open_image, shrunk, undecoded

    datasets.config.HF_DATASETS_CACHE = cache
    ds = datasets.load_dataset("imagefolder", data_dir=str(folder), cache_dir=str(cache))["train"]
    ds = undecoded(ds, "image", "train").rename_column("label", "labels")
    transform = ImageTransform(processor, "image", 3)
    values = ds["image"][:40]
    t = time.perf_counter()
    for value in values:
        open_image(value, at_least=transform.at_least)
    decode_s = (time.perf_counter() - t) / len(values)
    today = _epoch(ds, transform)
    t = time.perf_counter()
    small = shrunk(ds, "image", transform.at_least)
    once = time.perf_counter() - t
    t = time.perf_counter()
    shrunk(ds, "image", transform.at_least)  # a second run on the same folder: datasets' cache
    cached = time.perf_counter() - t
    after = _epoch(small, transform)
    t = time.perf_counter()
    for value in small["image"][:40]:
        open_image(value, at_least=transform.at_least)
    small_decode_s = (time.perf_counter() - t) / 40
    sizes = [len(v["bytes"]) for v in small["image"][:40]]
    return {"photos": len(ds), "mb_per_photo": round(np.mean([os.path.getsize(v["path"]) for v in values]) / 2**20, 2),
            "draft_decode_s_per_photo": round(decode_s, 4), "epoch_today_s": round(today, 2),
            "epoch_today_s_per_photo": round(today / len(ds), 4), "shrink_pass_s": round(once, 2),
            "shrink_pass_s_per_photo": round(once / len(ds), 4), "shrink_pass_cached_s": round(cached, 2),
            "epoch_after_s": round(after, 2), "epoch_after_s_per_photo": round(after / len(ds), 4),
            "copy_decode_s_per_photo": round(small_decode_s, 4), "copy_kb": round(np.mean(sizes) / 1024, 1),
            "copy_size": list(open_image(small["image"][0]).size)}  # fmt: skip


def launch_recipe(app: Path, folder: Path, out: Path, cache: Path, *settings: str) -> tuple[dict, float]:
    """The photos recipe on `folder` with `settings`, the app in `app`, in a fresh process with its own datasets
    cache, as `accelerate launch` runs it: its results.json and the command's wall seconds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(app), "HF_DATASETS_CACHE": str(cache)}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "finetune/run.py", "--config", RECIPE,
               f"data_dir={folder}", f"output_dir={out}", *settings]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(command, cwd=app, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads((out / "results.json").read_text()), wall


def _run(app: Path, folder: Path, out: Path, cache: Path) -> dict:
    results, wall = launch_recipe(app, folder, out, cache, f"model_name_or_path={REPO / 'data' / 'efficientnet_lite0'}",
                                  "num_train_epochs=1")  # fmt: skip
    evaluations = sum('"eval_' in line for line in (out / "metrics.jsonl").read_text().splitlines())
    return {"wall_s": round(wall, 1), "seconds": results.get("seconds"), "steps": results.get("step"),
            "validation_photos": results["validation"]["num_samples"], "evaluations": evaluations,
            "accuracy": {"validation": round(results["validation"]["accuracy"], 3)}}  # fmt: skip


def runs(folder: Path, before: str, work: Path) -> dict:
    """The photos recipe for one epoch: the app at `before` (git archive into a temporary folder), then this one."""
    old = work / "before"
    old.mkdir()
    archive = subprocess.run(["git", "archive", before], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    return {"before": {"rev": before, **_run(old, folder, work / "run_before", work / "cache_before")},
            "after": _run(REPO, folder, work / "run_after", work / "cache_after")}


def estimate(e: dict, step_s: float, eval_s: float, decode_s: float | None = None, photos: int = 2000,
             epochs: int = 3) -> dict:
    """2,000 photos x 3 epochs at 16 a step (a seeded 10% held out, evaluated once an epoch), from the
    measured per-photo costs, a step's compute and a held-out photo's evaluation compute. The data of a
    step is paid in the training process, before the step computes. `decode_s`: a photo's draft decode
    in place of this set's (the issue measured 0.13 s for real 12-megapixel phone photos), the rest of each
    cost as measured; the pass's decodes shared by its 2 processes."""
    train = round(photos * 0.9)
    held = photos - train
    steps = epochs * -(-train // 16)
    today_pp, pass_pp, after_pp = e["epoch_today_s_per_photo"], e["shrink_pass_s_per_photo"], e["epoch_after_s_per_photo"]
    if decode_s is not None:
        today_pp = round(today_pp + decode_s - e["draft_decode_s_per_photo"], 4)
        pass_pp = round(pass_pp + (decode_s - e["draft_decode_s_per_photo"]) / 2, 4)
    compute = steps * step_s + epochs * held * eval_s
    today = epochs * (train + held) * today_pp + compute
    after = photos * pass_pp + epochs * (train + held) * after_pp + compute
    same = f"{steps} steps x {step_s} s + {epochs} x {held} x {eval_s} s (evaluation's compute)"
    arithmetic = {
        "today": f"{epochs} x ({train} + {held}) x {today_pp} s + {same} = {today:.0f} s = {today / 60:.1f} min",
        "after": f"{photos} x {pass_pp} s (once) + {epochs} x ({train} + {held}) x {after_pp} s + {same} "
                 f"= {after:.0f} s = {after / 60:.1f} min",
    }  # fmt: skip
    return {"photos": photos, "epochs": epochs, "steps": steps, "step_s": step_s, "eval_s": eval_s, "decode_s": decode_s,
            "today_min": round(today / 60, 1), "after_min": round(after / 60, 1), "arithmetic": arithmetic}  # fmt: skip


def _costs(report: dict, step_s: float) -> tuple[float, float, str]:
    """A step's and a held-out photo's compute: from the recipe's run after the change when there is one
    (its train phase less its photos' reads, over its steps), else --step-s and a third of a step's photo."""
    e, run = report["per_epoch"], report.get("runs", {}).get("after")
    if run is None:
        return step_s, round(step_s / 16 / 3, 4), "--step-s"
    train_photos = e["photos"] - run["validation_photos"]
    step = (run["seconds"]["train"] - train_photos * e["epoch_after_s_per_photo"]) / run["steps"]
    held = run["seconds"]["evaluate"] / (run["evaluations"] * run["validation_photos"]) - e["epoch_after_s_per_photo"]
    return round(step, 3), round(held, 4), "the recipe's run after the change"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode_once", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--photos", type=int, default=240)
    parser.add_argument("--runs", action="store_true", help="also the recipe for one epoch, before and after")
    parser.add_argument("--before", default="HEAD~1", help="the app's revision without the pass (--runs)")
    parser.add_argument("--step-s", type=float, default=1.35, help="a training step's compute, s (image_levers)")
    parser.add_argument("--work", type=Path, default=None, help="where the photos go (a temporary folder)")
    args = parser.parse_args(argv)
    load = {"before": os.getloadavg()}
    work = args.work or Path(tempfile.mkdtemp(prefix="decode_once_"))
    folder = work / "photos"
    t = time.perf_counter()
    if not (folder / "train").is_dir():
        make_photos(folder, args.photos)
    made_s = time.perf_counter() - t
    processor = _processor()
    paths = sorted((folder / "train").rglob("*.jpg"))
    report = {"machine": machine(), "made_s": round(made_s, 1),
              "encodings": encodings(paths[:6], processor), "per_epoch": per_epoch(folder, processor, work / "cache")}
    report["load_after_epochs"] = os.getloadavg()
    if args.runs:
        report["runs"] = runs(folder, args.before, work)
    report["load"] = {**load, "after": os.getloadavg()}
    step_s, eval_s, source = _costs(report, args.step_s)
    report["estimate"] = estimate(report["per_epoch"], step_s, eval_s)
    report["estimate_real_photos"] = estimate(report["per_epoch"], step_s, eval_s, decode_s=0.13)
    report["costs_from"] = source
    write_report(args.out, "decode_once", report, _table(report, args))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


def _table(r: dict, args) -> str:
    e, est = r["per_epoch"], r["estimate"]
    lines = ["# Large photos decoded once, not at every epoch (issue 49)", "", machine_line(r["machine"]), "",
             f"Load average (1, 5, 15 min): {', '.join(f'{v:.2f}' for v in r['load']['before'])} before, "
             f"{', '.join(f'{v:.2f}' for v in r['load']['after'])} after (2 cores; another job may share them).", "",
             f"{e['photos']} synthetic 4032x3024 JPEGs (quality 90, {e['mb_per_photo']} MB each on average, a quarter "
             "with EXIF orientation 6), the EfficientNet-Lite0 processor (224 pixels; copies at 448 on the shorter side).",
             "", "## The small copy's format (median of 6 photos)", "",
             "| format | encode, ms | decode, ms | KB | input difference from the full decode's |", "|---|---|---|---|---|",
             *(f"| {x['format']} | {x['encode_ms']} | {x['decode_ms']} | {x['kb']} | {x['input_difference']} |"
               for x in r["encodings"]), "",
             "## An epoch's images (the transform: decode, convert, the processor; batches of 16, one process)", "",
             "| | seconds | per photo, s |", "|---|---|---|",
             f"| an epoch as before (each photo decoded at PIL's draft) | {e['epoch_today_s']} | {e['epoch_today_s_per_photo']} |",
             f"| the one-time pass (`shrunk`, every usable core) | {e['shrink_pass_s']} | {e['shrink_pass_s_per_photo']} |",
             f"| the pass again on the same folder (datasets' cache) | {e['shrink_pass_cached_s']} | |",
             f"| an epoch over the copies | {e['epoch_after_s']} | {e['epoch_after_s_per_photo']} |", "",
             f"A photo's decode alone: {e['draft_decode_s_per_photo']} s at PIL's draft; its copy's "
             f"({e['copy_size'][0]}x{e['copy_size'][1]}, {e['copy_kb']} KB): {e['copy_decode_s_per_photo']} s.", ""]  # fmt: skip
    if "runs" in r:
        lines += ["## The photos recipe, one epoch (`accelerate launch finetune/run.py`, 1 process)", "",
                  "| | wall, s | phase seconds (results.json) | validation accuracy |", "|---|---|---|---|",
                  *(f"| {name}{' (' + run['rev'] + ')' if 'rev' in run else ''} | {run['wall_s']} | "
                    f"{', '.join(f'{k} {v:.1f}' for k, v in (run['seconds'] or {}).items())} | "
                    f"{run['accuracy']['validation']:.3f} |"
                    for name, run in r["runs"].items()),
                  "", "After, the data phase holds the one-time pass (each split's photos; 2 processes for a split of "
                  "128 or more); the train and evaluate phases read the copies. Another job's tests shared the 2 cores "
                  "at times (the load above): a pass, a run's phases and the step's compute can take longer then.",
                  ""]  # fmt: skip
    real = r["estimate_real_photos"]
    lines += [f"## Estimate: {est['photos']:,} photos x {est['epochs']} epochs, batch 16", "",
              f"A step's compute {est['step_s']} s and a held-out photo's evaluation {est['eval_s']} s, from "
              f"{r['costs_from']} (benchmarks/results/image_levers.md: 1.35 s a step); the data's per-photo costs "
              "are this machine's above, paid in the training process (no data workers on a CPU).", "",
              f"- before: {est['arithmetic']['today']}", f"- after: {est['arithmetic']['after']}", "",
              f"These photos decode faster than a real phone's (the issue measured {real['decode_s']} s at PIL's "
              f"draft, here {e['draft_decode_s_per_photo']} s); with that decode, the rest as measured:", "",
              f"- before: {real['arithmetic']['today']}", f"- after: {real['arithmetic']['after']}", "",
              f"`python -m benchmarks.decode_once --out {args.out} --photos {args.photos}"
              f"{' --runs --before ' + args.before if args.runs else ''}`", ""]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
