"""Layer-wise model parallelism: the plan, the hand-offs, and training equal to the unsplit model.

    python -m pytest tests/test_parallel.py -q

Stages on repeated "cpu" devices run the real hooks and hand-offs, so the mechanics are tested
without a GPU; the `gpu` test splits across cuda:0 and cpu.
"""

import copy
import json
import os
from types import SimpleNamespace

os.environ["HF_HUB_OFFLINE"] = "1"  # an accidental download fails loudly

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import check_device_map
from conftest import tiny_bert_config, tiny_vit_config
from transformers import (
    BertForMaskedLM,
    BertForSequenceClassification,
    ViTForImageClassification,
)

from benchmarks import bench_parallel
from finetune.errors import UserError
from finetune.parallel import (
    ParallelError,
    apply_model_parallel,
    estimate_stage_bytes,
    find_blocks,
    parse_devices,
    parse_size,
    pipelined_forward,
    plan_model_parallel,
    process_devices,
)

CPU = torch.device("cpu")
BATCH = 7  # odd, so that chunks of 2 and 3 are uneven
SEQ = 8


def LOGITS(output, inputs):  # noqa: N802  the outputs pipelined_forward concatenates: a classifier's logits
    return output.logits


def tiny_bert(seed: int = 0, **overrides) -> BertForSequenceClassification:
    """conftest's tiny BERT with 4 layers (a split has blocks to share out), a 100-word vocabulary."""
    torch.manual_seed(seed)
    config = tiny_bert_config(**({"vocab_size": 100, "num_hidden_layers": 4, "max_position_embeddings": 512}
                                 | overrides), num_labels=3)  # fmt: skip
    return BertForSequenceClassification(config)


def tiny_vit(seed: int = 0) -> ViTForImageClassification:
    torch.manual_seed(seed)
    return ViTForImageClassification(tiny_vit_config(num_hidden_layers=4, num_labels=10))


def batches(kind: str, n: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Fixed random batches; text rows are padded to different lengths so the mask matters."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if kind == "bert":
            lengths = torch.randint(2, SEQ + 1, (BATCH,), generator=g)
            batch = {
                "input_ids": torch.randint(0, 100, (BATCH, SEQ), generator=g),
                "attention_mask": (torch.arange(SEQ)[None, :] < lengths[:, None]).long(),
                "labels": torch.randint(0, 3, (BATCH,), generator=g),
            }
        else:
            batch = {
                "pixel_values": torch.randn(BATCH, 3, 28, 28, generator=g),
                "labels": torch.randint(0, 10, (BATCH,), generator=g),
            }
        out.append(batch)
    return out


BUILD = {"bert": tiny_bert, "vit": tiny_vit}


def split(model, devices=(CPU, CPU, CPU), **kw):
    plan = plan_model_parallel(
        model, list(devices), micro_batch_size=BATCH, seq_len=kw.pop("seq_len", SEQ), **kw
    )
    return apply_model_parallel(model, plan)


# --- devices and sizes ---------------------------------------------------------------------------


def test_parse_devices():
    assert parse_devices("cpu,cpu,cpu") == [CPU, CPU, CPU]
    assert parse_devices(" CPU ") == [CPU]
    auto = parse_devices(None)
    assert auto == parse_devices("auto")
    assert auto == ([torch.device("cuda", i) for i in range(torch.cuda.device_count())] or [CPU])
    for bad, rule in (("tpu", "models.device_unknown"), ("cpu,,cpu", "models.device_unknown"),
                      ("cuda:99", "models.device_missing"), ("mps", "models.device_unsupported"),
                      ("", "models.device_unknown")):  # fmt: skip
        with pytest.raises(UserError, match="device") as e:
            parse_devices(bad)
        assert e.value.rule == rule


def test_process_devices_give_each_local_process_its_own(monkeypatch):
    """DDP x layer split: the visible GPUs in equal consecutive groups by default, or a list per
    process; one list for all processes only of CPUs (NCCL ranks cannot share a GPU)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cuda = [torch.device("cuda", i) for i in range(4)]
    assert process_devices(None, 0, 2) == cuda[:2] and process_devices("auto", 1, 2) == cuda[2:]
    assert [process_devices(None, r, 4) for r in range(4)] == [[d] for d in cuda]
    assert process_devices("cuda:3,cpu;cuda:1", 0, 2) == [cuda[3], CPU]
    assert process_devices("cuda:3,cpu;cuda:1", 1, 2) == [cuda[1]]
    assert process_devices("cpu,cpu", 1, 2) == [CPU, CPU]
    assert process_devices("cuda:0,cuda:1", 0, 1) == cuda[:2]  # one process: as written
    with pytest.raises(UserError, match="4 visible GPUs do not split evenly among 3 processes") as e:
        process_devices(None, 0, 3)
    assert e.value.rule == "models.gpus_do_not_divide"
    with pytest.raises(UserError, match="on the same GPUs") as e:
        process_devices("cuda:0,cuda:1", 0, 2)
    assert e.value.rule == "models.gpus_shared"
    with pytest.raises(UserError, match="2 device lists for 3 processes") as e:
        process_devices("cuda:0;cuda:1", 0, 3)
    assert e.value.rule == "models.device_lists_per_process"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert process_devices(None, 1, 2) == [CPU]  # no GPU: each process trains unsplit on the CPU


def test_parse_size():
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("1.5 gb") == 1_500_000_000
    assert parse_size(123) == parse_size("123") == 123
    with pytest.raises(UserError, match="memory size") as e:
        parse_size("2 parsecs")
    assert e.value.rule == "models.memory_size_unreadable"
    with pytest.raises(UserError, match="max_memory key 'gpu0' is not a device") as e:
        plan_model_parallel(tiny_bert(), [CPU], micro_batch_size=1, seq_len=8, max_memory={"gpu0": "1GiB"})
    assert e.value.rule == "models.memory_key_not_a_device"


# --- the plan ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bert", "vit"])
@pytest.mark.parametrize("n_devices", [1, 2, 3, 6])
def test_plan_is_contiguous_and_complete(kind, n_devices):
    model = BUILD[kind]()
    plan = plan_model_parallel(model, [CPU] * n_devices, micro_batch_size=4, seq_len=None)
    names = ["embeddings", *(f"layer.{i}" for i in range(4)), "head"]
    assert [b.name for b in plan.blocks] == names
    assert [name for s in plan.stages for name in s.blocks] == names  # in order, each exactly once
    assert all(s.blocks for s in plan.stages)
    assert plan.stages[0].blocks[0] == "embeddings" and plan.stages[-1].blocks[-1] == "head"
    assert [s.index for s in plan.stages] == list(range(n_devices))
    assert sum(s.num_parameters for s in plan.stages) == sum(p.numel() for p in model.parameters())
    for s in plan.stages:
        assert s.estimated_bytes == estimate_stage_bytes([b for b in plan.blocks if b.name in s.blocks])
        assert s.estimated_bytes <= s.capacity_bytes
    if kind == "vit":
        assert plan.seq_len == 17  # 4x4 patches + [CLS], from the config
    if n_devices == 1:
        assert plan.device_map == {"": "cpu"}  # one entry: accelerator.prepare places it as usual


def equal_layer_split(plan, n_devices):
    """The naive alternative: the same number of layers on every stage, embeddings first, head last."""
    layers = plan.blocks[1:-1]
    size, extra = divmod(len(layers), n_devices)
    stages, start = [], 0
    for k in range(n_devices):
        end = start + size + (k < extra)
        stages.append(layers[start:end])
        start = end
    stages[0] = [plan.blocks[0], *stages[0]]
    stages[-1] = [*stages[-1], plan.blocks[-1]]
    return max(estimate_stage_bytes(s) for s in stages)


@pytest.mark.parametrize("vocab_size", [100, 5000])
@pytest.mark.parametrize("n_devices", [2, 3, 4])
def test_plan_is_balanced(vocab_size, n_devices):
    model = tiny_bert(vocab_size=vocab_size)
    plan = plan_model_parallel(model, [CPU] * n_devices, micro_batch_size=8, seq_len=64)
    best = max(s.estimated_bytes for s in plan.stages)
    assert best <= equal_layer_split(plan, n_devices)
    if vocab_size == 5000 and n_devices == 2:
        # a heavy embedding table: the plan moves layers off the first stage, beating the equal split
        assert best < equal_layer_split(plan, n_devices)
        assert len(plan.stages[0].blocks) < len(plan.stages[1].blocks)


def test_max_memory_forces_split_and_reports_need():
    model = tiny_bert()
    # CUDA devices whose capacity comes from max_memory only, so no GPU is needed to plan for them.
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    free = plan_model_parallel(
        model, devices, micro_batch_size=8, seq_len=64, max_memory={0: "1GiB", 1: "1GiB"}
    )
    first = free.stages[0].estimated_bytes
    capped = plan_model_parallel(
        model,
        devices,
        micro_batch_size=8,
        seq_len=64,
        max_memory={"cuda:0": f"{first - 1}B", "cuda:1": "1GiB"},
    )
    assert capped.stages[0].capacity_bytes == first - 1
    assert capped.stages[0].estimated_bytes < first
    assert len(capped.stages[0].blocks) < len(free.stages[0].blocks)
    with pytest.raises(UserError, match=r"does not fit.*needs .* on cuda:0") as e:
        plan_model_parallel(
            model, devices, micro_batch_size=8, seq_len=64, max_memory={"cuda:0": 1000, "cuda:1": 1000}
        )
    assert e.value.rule == "models.does_not_fit"


def test_shared_device_splits_capacity():
    plan = plan_model_parallel(
        tiny_bert(), [CPU, CPU], micro_batch_size=1, seq_len=8, max_memory={"cpu": "10MB"}
    )
    assert [s.capacity_bytes for s in plan.stages] == [5 * 10**6, 5 * 10**6]
    # DDP x layer split: the processes of a machine share its CPU memory too
    plan = plan_model_parallel(
        tiny_bert(), [CPU, CPU], micro_batch_size=1, seq_len=8, max_memory={"cpu": "10MB"}, local_processes=2
    )
    assert [s.capacity_bytes for s in plan.stages] == [25 * 10**5, 25 * 10**5]


def test_plan_errors():
    for model, devices, kw, message, rule in [
        (tiny_bert(), [CPU] * 7, {}, "7 devices but only 6 layers", "models.more_devices_than_blocks"),
        (torch.nn.Linear(2, 2), [CPU, CPU], {}, "cannot split Linear: model parallelism supports BERT-like",
         "models.not_layered"),
        (tiny_bert(num_hidden_layers=0), [CPU], {}, "cannot split BertForSequenceClassification: it has no encoder "
         "layers", "models.no_encoder_layers"),
        (tiny_bert(), [CPU, CPU], {"mixed_precision": "fp64"}, "mixed_precision", "models.mixed_precision_unknown"),
        (tiny_bert(), [], {}, "model parallelism needs at least one device", "models.no_devices"),
    ]:  # fmt: skip
        with pytest.raises(UserError, match=message) as e:
            plan_model_parallel(model, devices, micro_batch_size=1, seq_len=8, **kw)
        assert e.value.rule == rule


def test_a_model_the_split_cannot_read_is_named_by_its_rule():
    """Weights outside the layers (no stage would hold them), a config without the sizes the estimate reads:
    `find_blocks` signals it (ParallelError, inside the app), the plan says it as the rule's line."""
    model = tiny_bert()
    model.register_parameter("loose", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(ParallelError):
        find_blocks(model)
    with pytest.raises(UserError, match="cannot split BertForSequenceClassification: the model holds parameters "
                                        "outside its layers") as e:  # fmt: skip
        plan_model_parallel(model, [CPU], micro_batch_size=1, seq_len=8)
    assert e.value.rule == "models.parameters_outside_layers"
    model = tiny_bert()
    model.config = SimpleNamespace()  # no sizes at all
    with pytest.raises(UserError, match="cannot estimate memory: the model config has none of hidden_size, dim") as e:
        plan_model_parallel(model, [CPU], micro_batch_size=1, seq_len=8)
    assert e.value.rule == "models.config_without_size"


def test_format_table_lists_every_stage():
    plan = plan_model_parallel(tiny_bert(), [CPU] * 3, micro_batch_size=4, seq_len=SEQ)
    table = plan.format_table()
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["stage", "device", "layers"]
    for s in plan.stages:
        assert any(line.startswith(f"{s.index} ") and f"{s.num_parameters:,}" in line for line in lines)
    assert "embeddings" in table and "head" in table and "micro_batch_size=4" in table
    assert "layer.1-2" in table or "layer.0-1" in table or "layer.2-3" in table  # runs are compressed


# --- the split model -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_split_model_hands_off_and_matches(kind):
    ref, model = BUILD[kind]().eval(), split(BUILD[kind]()).eval()
    batch = batches(kind, 1)[0]
    with torch.no_grad():
        expected, got = ref(**batch), model(**batch)
    assert model.mp_state.handoffs == 2  # three stages, two boundaries
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=1e-6)  # labels went to the last stage
    with torch.no_grad():
        pipelined_forward(model, batch, chunks=2, outputs=LOGITS)
    assert model.mp_state.handoffs == 2  # per forward, not per step
    assert model.mp_state.total_handoffs == 2 + 2 * 2


def train(model, data, chunks: int | None, lr: float = 1e-3) -> None:
    """AdamW steps; chunks=None: the unsplit reference with HF's mean loss; 0: split, no chunks."""
    # eps above float32 noise: the key bias has an exactly zero gradient (softmax ignores it), so
    # its gradient is rounding noise that differs with chunking, and the default eps=1e-8 would let
    # AdamW turn that noise into lr-sized steps (differences near 1e-5 on tiny ViT)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-6)
    for batch in data:
        if chunks is None:
            loss = model(**batch).loss
        else:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            logits = model(**inputs).logits if chunks == 0 else pipelined_forward(model, batch, chunks, LOGITS)
            # summed over samples / batch size: equal to the unchunked mean, whatever the chunk sizes
            loss = F.cross_entropy(logits, batch["labels"].to(logits.device), reduction="sum") / len(logits)
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("chunks, kind", [
    (0, "bert"), (2, "vit"), (3, "bert"),  # each schedule once by default; the other model with each under slow
    pytest.param(0, "vit", marks=pytest.mark.slow), pytest.param(2, "bert", marks=pytest.mark.slow),
    pytest.param(3, "vit", marks=pytest.mark.slow),
])  # fmt: skip
def test_training_matches_unsplit(kind, chunks):
    ref, model = BUILD[kind](), split(BUILD[kind]())
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    data = batches(kind, 4)
    train(ref, data, None)
    train(model, data, chunks)
    assert model.mp_state.handoffs == 2
    got = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p, rtol=0, atol=1e-5, msg=name)
    # not vacuous: every stage's weights moved (gradients crossed every boundary back to stage 0)
    plan = model.mp_state.plan
    for stage in plan.stages:
        modules = [m + "." for b in plan.blocks if b.name in stage.blocks for m in b.modules]
        moved = max((got[n] - start[n]).abs().max().item() for n in start if n.startswith(tuple(modules)))
        assert moved > 1e-4, f"stage {stage.index} did not train"


def test_hf_device_map_covers_every_parameter():
    model = split(tiny_bert())
    check_device_map(model, model.hf_device_map)  # accelerate's own check: raises if a parameter is missed
    assert set(model.hf_device_map) >= {
        "bert.embeddings",
        "bert.encoder.layer.3",
        "bert.pooler",
        "classifier",
    }
    for name, p in model.named_parameters():
        module = max((m for m in model.hf_device_map if name.startswith(m + ".")), key=len)
        assert str(p.device) == model.hf_device_map[module]


def test_accelerator_prepare_keeps_the_split():
    model = split(tiny_bert())
    accelerator = Accelerator()
    assert accelerator.verify_device_map(model)  # prepare will not move it, nor allow several processes
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prepared, opt = accelerator.prepare(model, opt)
    assert prepared is model  # no DDP wrapper around a split model
    batch = batches("bert", 1)[0]
    loss = F.cross_entropy(pipelined_forward(prepared, batch, 2, LOGITS), batch["labels"])
    accelerator.backward(loss)
    opt.step()
    assert model.mp_state.handoffs == 2


def test_pipelined_forward_chunk_sizes():
    model = split(tiny_bert())
    batch = batches("bert", 1)[0]
    for chunks, calls in ((1, 1), (3, 3), (BATCH, BATCH), (100, BATCH)):
        before = model.mp_state.forwards
        with torch.no_grad():
            logits = pipelined_forward(model, batch, chunks, LOGITS)
        assert model.mp_state.forwards - before == calls
        assert logits.shape == (BATCH, 3)
    with pytest.raises(UserError, match="at least 1") as e:
        pipelined_forward(model, batch, 0, LOGITS)
    assert e.value.rule == "models.pipeline_chunks_below_one"


def test_tied_weights():
    torch.manual_seed(0)
    mlm = BertForMaskedLM(tiny_bert_config(vocab_size=100, max_position_embeddings=512))
    assert mlm.cls.predictions.decoder.weight is mlm.bert.embeddings.word_embeddings.weight
    plan = plan_model_parallel(mlm, [CPU, torch.device("meta")], micro_batch_size=1, seq_len=8)
    with pytest.raises(UserError, match="tied") as e:
        apply_model_parallel(copy.deepcopy(mlm), plan)
    assert e.value.rule == "models.tied_across_devices"
    # on one device the tie is harmless and counted once
    plan = plan_model_parallel(mlm, [CPU, CPU], micro_batch_size=1, seq_len=8)
    assert sum(s.num_parameters for s in plan.stages) == sum(p.numel() for p in mlm.parameters())
    apply_model_parallel(mlm, plan)(input_ids=torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(UserError, match="the model is already split for model parallelism") as e:
        apply_model_parallel(mlm, plan)
    assert e.value.rule == "models.already_split"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_split_across_gpu_and_cpu():
    ref = tiny_bert()
    model = copy.deepcopy(ref)
    plan = plan_model_parallel(model, parse_devices("cuda:0,cpu"), micro_batch_size=BATCH, seq_len=SEQ)
    model = apply_model_parallel(model, plan)
    assert model.bert.embeddings.word_embeddings.weight.device.type == "cuda"
    assert model.classifier.weight.device == CPU
    batch = batches("bert", 1)[0]
    with torch.no_grad():
        got, expected = model(**batch).logits, ref(**batch).logits
    assert got.device == CPU and model.mp_state.handoffs == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    data = batches("bert", 2)
    train(ref, data, None)
    train(model, data, 2)
    got_params = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got_params[name].cpu(), p, rtol=0, atol=1e-5, msg=name)


# --- the benchmark -------------------------------------------------------------------------------


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    args = "--devices cpu,cpu --chunks 2 --layers 2 --hidden 32 --vocab-size 100 --seq-len 8 --batch-size 4"
    bench_parallel.main([*args.split(), "--warmup", "0", "--steps", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["devices"] == ["cpu", "cpu"] and len(report["stages"]) == 2
    for mode, chunks in (("naive", 1), ("pipelined", 2)):
        r = report[mode]
        assert r["chunks"] == chunks and r["step_s"] > 0 and r["busy_s"] > 0
        assert 0 <= r["bubble_measured"] <= 1
        assert r["bubble_theoretical"] == pytest.approx(1 / (chunks + 1))
    assert report["speedup"] > 0
