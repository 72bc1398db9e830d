"""The end of a run: the model as an ordinary `save_pretrained` directory (safetensors, tokenizer or
image processor, `id2label`; LoRA adapters merged into the weights), a LoRA run's adapter alone in
peft's format, `results.json`, the training curves, the model card and, when asked, the upload to the
Hub. And what a run writes in its output_dir: what `overwrite_output_dir` replaces, and how the run it
replaces is kept until the new one is finished."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from finetune import checkpoint as ckpt
from finetune.card import describe_data, push_to_hub, write_model_card
from finetune.config import TrainConfig
from finetune.errors import UserError, first_line, on_failure
from finetune.lora import is_lora, merge_lora
from finetune.plots import plot_training_curves
from finetune.runtime import agreed

RESULTS = "results.json"
ADAPTER = "adapter"  # a LoRA run's adapters and head alone: peft's save_pretrained, before the merge
# What a run writes in its output_dir, besides Accelerate's tracker logs in <output_dir>/<its name>.
RUN_FILES = (
    ckpt.CHECKPOINTS,
    "model",
    ADAPTER,
    "metrics.jsonl",
    RESULTS,
    "config.yaml",
    "training_curves.png",
)
PREVIOUS = ".previous-run"  # the run that an overwrite replaces, until the new one is finished


def _run_files(out: Path) -> list[str]:
    return [*RUN_FILES, out.name]


def check_files_in_the_way(out: Path, trackers: bool) -> None:
    """overwrite_output_dir=true into a folder that holds no run writes into it and deletes nothing: so a
    file there with the name of one a run writes (the user's config.yaml, model/) is refused."""
    names = [*RUN_FILES, out.name] if trackers else RUN_FILES
    found = [name + ("/" if (out / name).is_dir() else "") for name in names if (out / name).exists()]
    if found:
        raise UserError(
            f"output_dir {out} holds {', '.join(found)}, which no run of this app wrote there; a run would "
            "write over them: move them, or choose another output_dir (overwrite_output_dir=true replaces "
            "only a run)"
        )


def _remove(out: Path, names: list[str]) -> None:
    for name in names:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def set_aside_previous_run(out: Path) -> None:
    """overwrite_output_dir=true over a run: its files move to <output_dir>/.previous-run (renames, no
    copy) until this run is finished, when `export_run` deletes them. If this run fails before it has a
    checkpoint of its own (a mistake found mid-run, a full disk, a diverged loss), they come back. An
    earlier overwrite that never finished left the last finished run there: it stays, the unfinished
    run's files go. Main process only."""
    names, aside = _run_files(out), out / PREVIOUS
    if aside.is_dir():
        _remove(out, names)
    else:
        moving = out / f"{PREVIOUS}.tmp"  # a kill while moving leaves this: the next overwrite goes on
        moving.mkdir(exist_ok=True)
        for name in names:
            if (out / name).exists() or (out / name).is_symlink():
                os.replace(out / name, moving / name)
        os.replace(moving, aside)
    on_failure(functools.partial(restore_previous_run, out))


def restore_previous_run(out: Path) -> None:
    """After a failed overwrite: the run that was there comes back, unless this one left a checkpoint to
    resume from (a signal, a diverged loss after a save): then both stay, the earlier one set aside."""
    aside = out / PREVIOUS
    if not aside.is_dir() or ckpt.list_checkpoints(out):
        return
    _remove(out, _run_files(out))
    for path in aside.iterdir():
        os.replace(path, out / path.name)
    aside.rmdir()


def export_run(
    cfg: TrainConfig,
    accelerator: Accelerator,
    model,
    preprocessor,
    results: dict[str, Any],
    label_names: list[str],
    best: dict[str, Any],
) -> Path:
    """Write `<output_dir>/model`, results.json, training_curves.png and the card. Every process
    calls it (FSDP gathers the shards); the main process writes. Adds the export's facts to `results`."""
    out = Path(cfg.output_dir)
    export = out / "model"
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # every process: gathers shards under FSDP
    with agreed(accelerator):
        if accelerator.is_main_process:
            try:
                _write_export(cfg, accelerator, model, preprocessor, results, label_names, best, state_dict)
            except OSError as e:  # a full disk, a quota: one line; the checkpoints are untouched
                file = f" ({e.filename})" if e.filename else ""
                raise UserError(
                    f"could not write the export in {out}: {e.strerror or first_line(e)}{file}; the run is "
                    "not finished; free some space, then run again (with resume_from_checkpoint=latest if it "
                    "saved checkpoints: a resume from the last step only evaluates and exports)"
                ) from None
            if cfg.push_to_hub_model_id:
                accelerator.print(f"pushed to {push_to_hub(export, cfg.push_to_hub_model_id)}")
    return export


def _as_umask_allows(folder: Path) -> None:
    """safetensors writes its files readable by their owner alone (0600); an export is for sharing, so
    its files get the modes the user's umask gives any new file (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def save_adapter(model, folder: Path) -> None:
    """peft's own adapter directory (adapter_config.json, adapter_model.safetensors: the LoRA matrices
    and the trained head, `modules_to_save`), which `PeftModel.from_pretrained(base, folder)` puts back
    on the model the run started from."""
    model.save_pretrained(folder, safe_serialization=True)
    _as_umask_allows(folder)


def _write_export(cfg, accelerator, model, preprocessor, results, label_names, best, state_dict) -> None:
    """The main process's part of `export_run`."""
    out = Path(cfg.output_dir)
    export = out / "model"
    unwrapped = accelerator.unwrap_model(model)
    if is_lora(unwrapped):  # an ordinary model: the adapters merged into their weights
        save_adapter(unwrapped, out / ADAPTER)  # first: merge_lora works in place
        results["adapter_dir"] = str(out / ADAPTER)
        unwrapped = merge_lora(unwrapped)
        state_dict = unwrapped.state_dict()
    # Model parallel: transformers reads "cpu" in hf_device_map as offloading and warns at save;
    # the state dict is complete here, and the export is an ordinary one-device model.
    device_map = unwrapped.__dict__.pop("hf_device_map", None)
    try:
        unwrapped.save_pretrained(export, state_dict=state_dict, safe_serialization=True)
    finally:
        if device_map is not None:
            unwrapped.hf_device_map = device_map
    preprocessor.save_pretrained(export)
    _as_umask_allows(export)
    results.update(
        {
            "model_dir": str(export),
            "label_names": label_names,
            "best": best,
            "versions": ckpt.package_versions(),
        }
    )
    plot_training_curves(out / "metrics.jsonl", out / "training_curves.png", best=best)
    write_model_card(
        export,
        config=cfg.to_dict(),
        label_names=label_names,
        results=results,
        base_model=cfg.model_name_or_path if cfg.model_config is None else None,
        data_description=describe_data(cfg.data_args),
        num_processes=accelerator.num_processes,
        mixed_precision=accelerator.mixed_precision,
        repo_id=cfg.push_to_hub_model_id,
    )
    # Last, and whole or not at all: results.json is what marks the run as finished.
    tmp = out / f".{RESULTS}.tmp"
    tmp.write_text(json.dumps(results, indent=2))
    os.replace(tmp, out / RESULTS)
    shutil.rmtree(out / PREVIOUS, ignore_errors=True)  # the run this one replaced, now replaced
