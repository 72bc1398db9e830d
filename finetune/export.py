"""The end of a run: the model as an ordinary `save_pretrained` directory (safetensors, tokenizer or
image processor, `id2label`; LoRA adapters merged into the weights), a LoRA run's adapter alone in
peft's format, `results.json`, the training curves, the model card and, when asked, the upload to the
Hub (the run directory's layout: finetune/rundir.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from finetune import checkpoint as ckpt
from finetune import checks
from finetune.card import describe_data, push_to_hub, write_model_card
from finetune.checks import runs
from finetune.config import TrainConfig
from finetune.data import data_file_digests
from finetune.errors import write_failure
from finetune.layout import RunDir, as_umask_allows
from finetune.lora import is_lora, merge_lora
from finetune.plots import plot_training_curves
from finetune.problems import Labels
from finetune.rundir import finish_overwrite
from finetune.runtime import agreed


def export_run(
    cfg: TrainConfig,
    accelerator: Accelerator,
    model,
    preprocessor,
    results: dict[str, Any],
    labels: Labels,  # what the outputs are: results.json and the card keep them
    best: dict[str, Any],
    seconds: Callable[[], dict[str, float]] | None = None,
    digests: dict[str, str] | None = None,
    said: checks.Said | None = None,
) -> Path:
    """Write `<output_dir>/model`, results.json, training_curves.png and the card. Every process
    calls it (FSDP gathers the shards); the main process writes. Adds the export's facts to `results`:
    the data files' sha256 (`digests`: those the run read) and the warnings the run said (`said`)."""
    run = RunDir(cfg.output_dir)
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # every process: gathers shards under FSDP
    with agreed(accelerator):
        if accelerator.is_main_process:
            try:
                results["data_sha256"] = data_file_digests(cfg.data_args, digests)
                results["warnings"] = (said or checks.Said()).record()
                _write_export(cfg, accelerator, model, preprocessor, results, labels, best, state_dict, seconds,
                              said)  # fmt: skip
            except Exception as e:  # a full disk, a quota: one line; the checkpoints are untouched
                failure = write_failure(e, run.root)
                if failure is None:
                    raise
                raise checks.explain(runs.EXPORT_FAILED, failure, run.root) from None
            if cfg.push_to_hub_model_id:
                accelerator.print(f"pushed to {push_to_hub(run.model, cfg.push_to_hub_model_id)}")
    return run.model


def save_adapter(model, folder: Path) -> None:
    """peft's own adapter directory (adapter_config.json, adapter_model.safetensors: the LoRA matrices
    and the trained head, `modules_to_save`), which `PeftModel.from_pretrained(base, folder)` puts back
    on the model the run started from."""
    model.save_pretrained(folder, safe_serialization=True)
    as_umask_allows(folder)


def _write_export(cfg, accelerator, model, preprocessor, results, labels, best, state_dict, seconds,
                  said) -> None:  # fmt: skip
    """The main process's part of `export_run`, whole or not at all: the model (and a LoRA run's adapter)
    and the curves are written into a hidden folder and flushed to disk, then moved into place (an earlier
    export set aside meanwhile), the card written into the export, and results.json last. A failure
    anywhere (a full or read-only disk, a device error: the flush reports those) removes what this export
    wrote and puts the earlier one back, so the run directory is as it was."""
    run = RunDir(cfg.output_dir)
    staged = Staged(run)
    try:
        _stage_export(cfg, accelerator, model, preprocessor, results, labels, best, state_dict, seconds, staged, said)
    except BaseException:  # noqa: BLE001 - any failure, a signal's KeyboardInterrupt too: nothing half-written
        staged.undo()
        raise
    staged.done()
    finish_overwrite(run)  # the run this one replaced, now replaced


class Staged:
    """An export written aside and moved into place; `undo` removes it and puts back what it replaced."""

    def __init__(self, run: RunDir):
        self.run, self.stage, self.aside = run, run.export_stage, run.export_aside
        self.moved: list[str] = []  # names now in place, whose earlier version (if any) is aside
        for folder in (self.stage, self.aside):  # a kill during an earlier export left them
            if folder == self.aside and folder.is_dir():  # a kill while moving: the earlier export goes back
                for path in folder.iterdir():
                    if not (run.root / path.name).exists():
                        os.replace(path, run.root / path.name)
            shutil.rmtree(folder, ignore_errors=True)
        self.stage.mkdir(parents=True)

    def path(self, final: Path) -> Path:
        """Where `final` (a path in the run directory) is written until it is moved into place."""
        return self.stage / final.name

    def move_into_place(self) -> None:
        self.aside.mkdir()
        for path in sorted(self.stage.iterdir()):
            final = self.run.root / path.name
            if final.exists():
                os.replace(final, self.aside / path.name)
            self.moved.append(path.name)
            os.replace(path, final)

    def undo(self) -> None:
        """Best effort (a read-only disk refuses even this): never a second error over the first."""
        for name in reversed(self.moved):
            final = self.run.root / name
            with contextlib.suppress(OSError):
                if final.is_dir():
                    shutil.rmtree(final)
                else:
                    final.unlink(missing_ok=True)
                if (self.aside / name).exists():
                    os.replace(self.aside / name, final)
        for folder in (self.stage, self.aside):
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.run.results.with_name(f".{self.run.results.name}.tmp").unlink(missing_ok=True)

    def done(self) -> None:
        for folder in (self.stage, self.aside):
            shutil.rmtree(folder, ignore_errors=True)


def _stage_export(cfg, accelerator, model, preprocessor, results, labels, best, state_dict, seconds,
                  staged: Staged, said=None) -> None:  # fmt: skip
    run = staged.run
    export = staged.path(run.model)
    unwrapped = accelerator.unwrap_model(model)
    if is_lora(unwrapped):  # an ordinary model: the adapters merged into their weights
        save_adapter(unwrapped, staged.path(run.adapter))  # first: merge_lora works in place
        results["adapter_dir"] = str(run.adapter)
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
    as_umask_allows(export)
    results.update(
        {
            "model_dir": str(run.model),
            **labels.manifest(),
            "best": best,
            "versions": ckpt.package_versions(),
        }
    )
    plot_training_curves(run.metrics, staged.path(run.curves), best=best, said=said)
    ckpt.fsync_tree(staged.stage)  # a failing disk says so here (EIO), not after the run says it is finished
    staged.move_into_place()
    # The card in place: it names the export by its path (written elsewhere, it would name the hidden folder).
    card = write_model_card(
        run.model,
        config=cfg.to_dict(),
        labels=labels,
        results=results,
        base_model=cfg.model_name_or_path if cfg.model_config is None else None,
        data_description=describe_data(cfg.data_args),
        num_processes=accelerator.num_processes,
        mixed_precision=accelerator.mixed_precision,
        repo_id=cfg.push_to_hub_model_id,
        command=results.get("command"),
    )
    with open(card, "rb") as f:
        os.fsync(f.fileno())
    if seconds is not None:  # each phase's own seconds, this export's until now
        results["seconds"] = {name: round(value, 3) for name, value in seconds().items()}
    # Last, and whole or not at all: results.json is what marks the run as finished.
    tmp = run.results.with_name(f".{run.results.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(results, indent=2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run.results)
