"""What identifies a file, a folder or a model's weights: their sha256. A run records its data files' (a resume
and an evaluation check them), evaluate_checkpoint.py a model's weights (metrics.json's weights_sha256: a copy
of a run is the same model), and each ONNX file the weights it was made from (finetune/onnx_export.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: str | Path) -> str:
    """A file: the sha256 of its bytes (what `sha256sum` prints). A folder: of its files' relative paths and
    bytes, in sorted order, each framed by its length so that no two layouts collide."""
    path, digest = Path(path), hashlib.sha256()
    each = [path] if path.is_file() else sorted((p for p in path.rglob("*") if p.is_file()),
                                                key=lambda p: p.relative_to(path).as_posix())  # fmt: skip
    for file in each:
        if file != path:
            name = file.relative_to(path).as_posix().encode()
            digest.update(len(name).to_bytes(8, "little") + name + file.stat().st_size.to_bytes(8, "little"))
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def weights_sha256(folder: Path) -> str | None:
    """What identifies a model folder's weights (metrics.json's weights_sha256, an ONNX file's `MADE_FROM`): the
    sha256 of its weights file, or of its weight files' names and digests when there are several (shards,
    FSDP's folder); None without any."""
    found = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model_fsdp_*"))
    if len(found) == 1:
        return sha256_of(found[0])
    return hashlib.sha256("".join(f"{f.name}\0{sha256_of(f)}\n" for f in found).encode()).hexdigest() if found else None
