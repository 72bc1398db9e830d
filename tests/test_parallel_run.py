"""Model parallelism composes with accumulation, checkpoints, exact resume and evaluation."""

from __future__ import annotations

import shutil

from conftest import tiny_text_args
from safetensors.torch import load_file

from finetune import checkpoint as ckpt
from finetune.run import main

SPLIT = ("model_parallel=true", "devices=cpu,cpu", "pipeline_chunks=2", "adam_epsilon=1e-6")
COMMON = ("num_train_epochs=1", "per_device_train_batch_size=4", "gradient_accumulation_steps=2", "save_steps=2")


def _weights(out):
    return load_file(out / "model" / "model.safetensors")


def _worst(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_split_with_accumulation_equals_unsplit_and_resumes_exactly(small_text_data, tmp_path):
    plain, split, resumed = tmp_path / "plain", tmp_path / "split", tmp_path / "resumed"
    main(tiny_text_args(small_text_data, plain, *COMMON, "adam_epsilon=1e-6"))
    results = main(tiny_text_args(small_text_data, split, *COMMON, *SPLIT))
    assert _worst(_weights(plain), _weights(split)) < 1e-5
    assert results["validation"]["num_samples"] == 13

    # Resume the split run from its first checkpoint: the same end as without the interruption.
    first = ckpt.list_checkpoints(split)[0]
    (resumed / ckpt.CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(first, resumed / ckpt.CHECKPOINTS / first.name)
    main(tiny_text_args(small_text_data, resumed, *COMMON, *SPLIT, "resume_from_checkpoint=latest"))
    assert _worst(_weights(split), _weights(resumed)) <= 1e-6

    # The export is an ordinary single-device model.
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(split / "model")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert not hasattr(model, "hf_device_map") or len(set(model.hf_device_map.values())) == 1
