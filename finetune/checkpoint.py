"""The checkpoint format: save, find the latest complete one, load.

    <output_dir>/checkpoints/step-00000120/
        model.safetensors, optimizer.bin, scheduler.bin, random_states_<rank>.pkl   (Accelerate)
        manifest.json    step, epoch, samples consumed in the epoch, seed, world size, accumulation,
                         precision, label names, metrics, versions, the resolved config
        COMPLETE         written last; a directory without it is ignored

A checkpoint is written into a hidden temporary directory, flushed to disk, marked complete and
only then renamed into place, so a process killed in the middle of a save leaves the previous
checkpoint as "latest" and loadable.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

from finetune.errors import UserError

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
PREFIX = "step-"


def package_versions() -> dict[str, str]:
    import accelerate
    import datasets
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": accelerate.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(accelerator, output_dir: str | Path, step: int, manifest: dict[str, Any]) -> Path:
    """Save the full training state at optimizer step `step`, atomically. All processes call this."""
    root = Path(output_dir) / CHECKPOINTS
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))  # each process writes its own RNG state
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
        _fsync_tree(tmp)
        (tmp / COMPLETE).write_text(str(step))
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (a resumed run): swap, never leave a gap
            old = root / f".old-{PREFIX}{step:08d}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    accelerator.wait_for_everyone()
    return final


def is_complete(path: Path) -> bool:
    return (path / COMPLETE).is_file() and (path / MANIFEST).is_file()


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def read_manifest(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / MANIFEST).read_text())


def resolve_checkpoint(spec: str, output_dir: str | Path) -> Path:
    """`latest` → the newest complete checkpoint of this run; otherwise a checkpoint directory."""
    if spec == "latest":
        found = list_checkpoints(output_dir)
        if not found:
            raise UserError(f"resume_from_checkpoint=latest: no complete checkpoint in {Path(output_dir) / CHECKPOINTS}")
        return found[-1]
    path = Path(spec)
    if not path.is_dir():
        raise UserError(f"checkpoint not found: {spec}")
    if not is_complete(path):
        raise UserError(f"{spec} is not a complete checkpoint (no {COMPLETE} marker); "
                        "it was probably interrupted while saving — use an earlier one or 'latest'")
    return path


def prune_checkpoints(output_dir: str | Path, keep_last: int | None, best: Path | None) -> list[Path]:
    """Delete all but the last `keep_last` complete checkpoints; never the best nor the latest."""
    found = list_checkpoints(output_dir)
    if keep_last is None or len(found) <= keep_last:
        return []
    keep = set(found[-keep_last:]) | {found[-1]}
    if best is not None:
        keep.add(best)
    removed = [p for p in found if p not in keep]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed
