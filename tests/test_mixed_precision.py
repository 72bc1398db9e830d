"""fp16's gradient scaler: a step it skips (overflowing gradients) does not advance the schedule and
does not count as a non-finite loss toward `max_nonfinite_loss_steps`.

The CPU test gives the Accelerator a torch GradScaler (Accelerate builds one for fp16 on an
accelerator only) and makes the first backward passes produce an infinite gradient, as an fp16
overflow does; the scaler skips those steps exactly as on a GPU. The `gpu` test runs real fp16 autocast on CUDA with
Accelerate's own scaler, started at 2**40.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from accelerate.utils import GradScalerKwargs
from conftest import TINY_BERT, tiny_text_args, user_error

import finetune.run as run
import finetune.runtime as runtime
from finetune.config import load_config


def _logged(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _skipped(scaler, init_scale: float) -> int:
    return round(math.log2(init_scale / scaler.get_scale()))  # each skip halves the scale; no growth here


def _learning_rates(out) -> list[float]:
    rows = _logged(out)
    return [r["learning_rate"] for r in sorted(rows, key=lambda r: r["step"])]


def test_skipped_scaler_steps_leave_schedule_and_nonfinite_count(small_text_data, tmp_path, monkeypatch):
    out = tmp_path / "run"
    init_scale, overflowing = 2.0**10, 3
    made = {}
    real_make, real_build = run.make_accelerator, run.build_model

    def make_with_scaler(cfg, said=None):
        accelerator = real_make(cfg, said)
        made["scaler"] = accelerator.scaler = torch.amp.GradScaler(
            "cpu", init_scale=init_scale, growth_interval=10**6
        )
        return accelerator

    def build_overflowing(*args, **kwargs):
        """The first backward passes give an infinite gradient, as an fp16 overflow does."""
        model = real_build(*args, **kwargs)
        calls = iter(range(10**6))
        model.classifier.weight.register_hook(lambda g: g * math.inf if next(calls) < overflowing else g)
        return model

    monkeypatch.setattr(run, "make_accelerator", make_with_scaler)
    monkeypatch.setattr(run, "build_model", build_overflowing)
    total = 10
    cfg = load_config(
        None,
        tiny_text_args(
            small_text_data, out, "per_device_train_batch_size=4", f"max_steps={total}", "warmup_ratio=0",
            "max_nonfinite_loss_steps=1",  # one counted step would stop the run with exit status 3
        ),
    )  # fmt: skip
    results = run.train(cfg)  # no TrainingStopped: the skipped steps had finite losses
    assert results["step"] == total and _skipped(made["scaler"], init_scale) == overflowing
    # Linear decay without warmup, stepped only after a step that was not skipped (the first three).
    expected = [cfg.learning_rate * (1 - max(s - overflowing, 0) / total) for s in range(1, total + 1)]
    assert _learning_rates(out) == pytest.approx(expected, rel=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp16_overflow_on_gpu(small_text_data, tmp_path, monkeypatch):
    out = tmp_path / "run"
    init_scale = 2.0**40
    made = {}
    real_accelerator = runtime.Accelerator

    def accelerator_with_scaler(**kwargs):
        kwargs["mixed_precision"] = "fp16"
        kwargs["kwargs_handlers"] = [
            *kwargs["kwargs_handlers"],
            GradScalerKwargs(init_scale=init_scale, growth_interval=10**6),
        ]
        accelerator = real_accelerator(**kwargs)
        made["scaler"] = accelerator.scaler
        return accelerator

    monkeypatch.setattr(runtime, "Accelerator", accelerator_with_scaler)
    total = 30
    cfg = load_config(
        None,
        tiny_text_args(
            small_text_data, out, "per_device_train_batch_size=1", f"max_steps={total}", "warmup_ratio=0",
            "max_nonfinite_loss_steps=1",
        ),
    )  # fmt: skip
    results = run.train(cfg)
    assert made["scaler"] is not None and results["step"] == total
    skipped = _skipped(made["scaler"], init_scale)
    assert 2 <= skipped < total, skipped  # 2**40 overflows fp16 gradients at first
    # The schedule advanced on the steps that were not skipped, and only on them.
    lrs = _learning_rates(out)
    assert len(lrs) == total and lrs[-1] == pytest.approx(cfg.learning_rate * skipped / total, rel=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU case")
@pytest.mark.parametrize("written", ["fp16", "FP16"])  # Accelerate keeps "FP16" as written, then ignores it
def test_fp16_on_cpu_is_refused(small_text_data, tmp_path, monkeypatch, capsys, written):
    """Accelerate has no fp16 autocast on a CPU and would silently train in fp32."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", written)
    out = tmp_path / "run"
    assert "fp16 needs a GPU" in user_error(
        capsys, run.main, tiny_text_args(small_text_data, out, "max_steps=2")
    )
    assert not out.exists()


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="needs a CPU with native bf16")
@pytest.mark.parametrize(
    ("precision", "asked", "expected"),
    [("bf16", None, "eager"), ("no", None, "sdpa"), ("bf16", "sdpa", "sdpa"), ("no", "eager", "eager")],
)
def test_attention_kernel_on_cpu(small_text_data, tmp_path, monkeypatch, precision, asked, expected):
    """Unasked, bf16 on a CPU trains with eager attention (SDPA's CPU backward is slow in bf16); fp32
    keeps transformers' default; an explicit attn_implementation wins either way."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
    built = []
    real_build = run.build_model

    def build(*args, **kwargs):
        built.append(real_build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(run, "build_model", build)
    extra = [f"attn_implementation={asked}"] if asked else []
    run.train(load_config(None, tiny_text_args(small_text_data, tmp_path / "run", "max_steps=2", *extra)))
    assert built[0].config._attn_implementation == expected


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="needs a CPU with native bf16")
@pytest.mark.parametrize(
    ("precision", "asked", "trains", "evaluates"),
    [("bf16", None, "eager", "sdpa"), ("no", None, "sdpa", "sdpa"), ("bf16", "eager", "eager", "eager"),
     ("bf16", "long", "sdpa", "sdpa")],  # fmt: skip
)
def test_evaluation_reads_with_sdpa_where_training_was_given_eager(small_text_data, tmp_path, monkeypatch,
                                                                    precision, asked, trains, evaluates):  # fmt: skip
    """Eager attention is chosen for bf16 training on a CPU for SDPA's slow backward; evaluation has no
    backward and reads with SDPA, as evaluate_checkpoint.py reads the export; an asked kernel is kept."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
    seen: set[tuple[bool, str]] = set()
    real_build = run.build_model

    def build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        model.register_forward_pre_hook(lambda m, _: seen.add((m.training, m.config._attn_implementation)))
        return model

    monkeypatch.setattr(run, "build_model", build)
    # "long": unasked, texts of 256 tokens, past which SDPA trains faster under bf16 on a CPU
    long = ["max_length=256", "model_config=" + TINY_BERT.replace("max_position_embeddings: 128", "max_position_embeddings: 512")]
    extra = {None: [], "long": long}.get(asked, [f"attn_implementation={asked}"])
    run.train(load_config(None, tiny_text_args(small_text_data, tmp_path / "run", "max_steps=2", "eval_steps=1", *extra)))
    assert seen == {(True, trains), (False, evaluates)}  # and training went back to its own after each evaluation


def test_a_model_without_sdpa_keeps_its_kernel_for_evaluation():
    from types import SimpleNamespace

    class NoSdpa(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kernels = []

        def set_attn_implementation(self, kernel):
            if kernel == "sdpa":
                raise ValueError("this model does not support sdpa")
            self.kernels.append(kernel)

    cfg = load_config(None, ["task=text-classification", "max_length=32", "output_dir=/nonexistent"])
    accelerator = SimpleNamespace(device=torch.device("cpu"), mixed_precision="bf16", unwrap_model=lambda m: m)
    model = NoSdpa()
    model.config = SimpleNamespace()
    with runtime.evaluation_attention(cfg, accelerator, model):
        pass
    assert model.kernels == []  # neither switched nor "restored"


def test_unasked_a_cpu_under_bf16_trains_with_eager_attention_up_to_192_tokens_and_sdpa_past():
    from types import SimpleNamespace

    from finetune.tasks import task_of

    cpu = torch.device("cpu")
    assert [runtime.attention_kernel(None, cpu, "bf16", n) for n in (None, 32, 192, 193, 384)] == [
        "eager", "eager", "eager", "sdpa", "sdpa"]  # fmt: skip
    assert runtime.attention_kernel("eager", cpu, "bf16", 384) == "eager" and runtime.attention_kernel(None, cpu, "no", 384) is None
    text = load_config(None, ["task=text-classification", "max_length=384", "output_dir=/nonexistent"])
    assert runtime.sequence_tokens(task_of(text.task), text, SimpleNamespace()) == 384
    image = load_config(None, ["task=image-classification", "output_dir=/nonexistent"])
    vit = SimpleNamespace(image_size=28, patch_size=4)  # 7 x 7 patches and [CLS]
    assert runtime.sequence_tokens(task_of(image.task), image, vit) == 50
    assert runtime.sequence_tokens(task_of(image.task), image, SimpleNamespace()) is None  # no patches: a convolution
