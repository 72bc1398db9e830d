"""The shipped photos recipe, as a new user runs it, on a phone's photos: the whole command's wall time (issue 49:
about 2,000 phone photos in 10 classes, within 15 minutes on 2 cores).

    python -m benchmarks.phone_photos --out benchmarks/results --photos 2000

Makes N synthetic 12-megapixel phone photos in 10 class folders (`benchmarks.decode_once.make_photos`: 4032x3024
JPEGs of ~4 MB, every fourth stored on its side with EXIF orientation 6), or reads them from --photos-dir, then
runs `accelerate launch finetune/run.py --config finetune/configs/efficientnet_photos.yaml data_dir=DIR` from the
repository root, as docs/your-own-data.md tells a user (its 3 epochs, a seeded 10% held out for validation),
with a fresh datasets cache (so the one-time decode of large photos, finetune/images.py's `shrunk`, is paid).
Reported: the wall time of the whole command, the run's phase seconds (results.json), its steps and the
machine's load before and after. The photos are synthetic (a class-coloured shape on a textured gradient): the
accuracy says only that the run learned; the time is what a real set of that size and format costs.

Writes `phone_photos.json` and `phone_photos.md` in --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.decode_once import RECIPE, launch_recipe, make_photos
from benchmarks.report import machine, machine_line, write_report

REPO = Path(__file__).resolve().parent.parent


def run_recipe(folder: Path, out: Path, cache: Path, extra: list[str]) -> dict:
    """The recipe on `folder` in a fresh process (`decode_once.launch_recipe`): wall seconds and what results.json says."""
    results, wall = launch_recipe(REPO, folder, out, cache, *extra)
    return {"command": "accelerate launch finetune/run.py --config " + RECIPE + f" data_dir=DIR {' '.join(extra)}".rstrip(),
            "wall_s": round(wall, 1), "seconds": results.get("seconds"), "steps": results.get("step"),
            "validation": {k: results["validation"][k] for k in ("accuracy", "num_samples")}}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.phone_photos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--photos-dir", type=Path, default=None, help="photos made before (make_photos' layout)")
    parser.add_argument("--override", action="append", default=[], help="KEY=VALUE over the recipe (a smoke run)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        folder = args.photos_dir or make_photos(Path(work) / "photos", args.photos)
        photos = sum(1 for _ in folder.glob("train/*/*.jpg"))
        load_before = os.getloadavg()
        run = run_recipe(folder, Path(work) / "run", Path(work) / "cache", args.override)
        load_after = os.getloadavg()
    report = {"command": "python -m benchmarks.phone_photos " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": machine(), "photos": photos, "run": run,
              "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after]}  # fmt: skip
    phases = ", ".join(f"{k} {v:.1f}" for k, v in (run["seconds"] or {}).items())
    table = (
        f"# The photos recipe on {photos:,} synthetic 12-megapixel phone photos, 10 classes\n\n"
        f"{machine_line(report['machine'])}. `{report['command']}`.\n\n"
        f"Load average (1, 5, 15 min) before: {', '.join(map(str, report['load_before']))}; after: "
        f"{', '.join(map(str, report['load_after']))} (2 cores: a load above 0 is another job's share).\n\n"
        f"| | |\n|---|---|\n| command | `{run['command']}` |\n| whole command, wall | **{run['wall_s'] / 60:.1f} min** "
        f"({run['wall_s']:.0f} s) |\n| phases (s) | {phases} |\n| optimizer steps | {run['steps']} |\n"
        f"| validation accuracy | {run['validation']['accuracy']:.3f} on {run['validation']['num_samples']} photos "
        "(synthetic: says only that it learned) |\n\n"
        "4032x3024 JPEGs, quality 90, ~4 MB each, every fourth on its side (EXIF 6); a fresh datasets cache, so the "
        "one-time decode of the large photos is in the data phase.\n"
    )
    write_report(args.out, "phone_photos", report, table)
    return report


if __name__ == "__main__":
    main()
