"""The end of a run: the model as an ordinary `save_pretrained` directory (safetensors, tokenizer or
image processor, `id2label`; LoRA adapters merged into the weights), `results.json`, the training
curves, the model card and, when asked, the upload to the Hub."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from finetune import checkpoint as ckpt
from finetune.card import describe_data, push_to_hub, write_model_card
from finetune.config import TrainConfig
from finetune.lora import is_lora, merge_lora
from finetune.plots import plot_training_curves

RESULTS = "results.json"


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
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        if is_lora(unwrapped):  # an ordinary model: the adapters merged into their weights
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
        results.update(
            {
                "model_dir": str(export),
                "label_names": label_names,
                "best": best,
                "versions": ckpt.package_versions(),
            }
        )
        plot_training_curves(out / "metrics.jsonl", out / "training_curves.png")
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
        if cfg.push_to_hub_model_id:
            accelerator.print(f"pushed to {push_to_hub(export, cfg.push_to_hub_model_id)}")
    accelerator.wait_for_everyone()
    return export
