"""finetune/shapes.py: length buckets chosen from the data (the least padding, every batch held),
batches filled to full rows and cut back, and the compiled run: every shape compiled in the warm-up,
none after it, and the same training as without the compiler."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from finetune.evaluation import forward
from finetune.problems import problem_of
from finetune.run import main
from finetune.shapes import Bucketed, batch_lengths, choose_buckets, fill_rows, padded_ratio
from tests.conftest import launch, tiny_text_args, user_error


def _cost(batches: list[tuple[int, int]], buckets: list[int]) -> int:
    return sum(rows * next(b for b in buckets if b >= n) for rows, n in batches)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.integers(1, 100)), min_size=1, max_size=30),
    st.integers(1, 5),
)
def test_buckets_hold_every_batch_and_pad_the_least(batches, k):
    longest = max(n for _, n in batches)
    chosen = choose_buckets(batches, k, 8, longest)
    assert chosen == sorted(set(chosen)) and len(chosen) <= k
    assert all(b % 8 == 0 for b in chosen) and chosen[-1] >= longest  # every batch has a bucket
    # no other choice of k multiples of 8 (the largest covering the longest) pads less
    top = -(-longest // 8) * 8
    candidates = range(8, top + 1, 8)
    best = min(
        _cost(batches, [*c, top])
        for r in range(min(k, len(candidates)))
        for c in itertools.combinations([x for x in candidates if x < top], r)
    )
    assert _cost(batches, chosen) == best


def test_the_padding_ratio_counts_each_batch_at_its_bucket():
    batches = [(4, 10, 30), (4, 20, 70)]  # (rows, longest, real tokens)
    assert padded_ratio(batches, [16, 24], None) == pytest.approx((4 * 16 + 4 * 24) / 100)
    assert padded_ratio(batches, None, 8) == pytest.approx((4 * 16 + 4 * 24) / 100)
    assert padded_ratio(batches, [24], None) == pytest.approx(8 * 24 / 100)



def test_a_short_last_batch_counts_its_own_rows_unless_a_compiled_model_fills_it():
    """Without torch_compile the epoch's short last batch is not filled: its padding is its own rows'."""
    lengths = [5, 6, 7, 8, 3]  # batches of 4: [5, 6, 7, 8] and [3] alone
    assert batch_lengths(list(range(5)), lengths, 4, filled=False) == [(4, 8, 26), (1, 3, 3)]
    assert batch_lengths(list(range(5)), lengths, 4, filled=True) == [(4, 8, 26), (4, 3, 3)]
    assert padded_ratio(batch_lengths(list(range(5)), lengths, 4, filled=False), [8], None) == pytest.approx(40 / 29)


def test_a_bucketed_batch_is_padded_to_its_bucket():
    class Pad:
        def pad_to(self, features, length):
            return {"length": length, "rows": len(features)}

    collate = Bucketed(Pad(), [16, 32, 64])
    assert collate([{"input_ids": [1] * 5}, {"input_ids": [1] * 17}]) == {"length": 32, "rows": 2}
    assert collate([{"input_ids": [1] * 16}]) == {"length": 16, "rows": 1}
    with pytest.raises(RuntimeError, match="longer than every bucket"):
        collate([{"input_ids": [1] * 65}])


def test_filled_rows_reach_the_model_and_are_cut_from_its_logits():
    seen = []

    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            seen.append(input_ids.shape)

            class Out:
                logits = input_ids.float() * 2

            return Out()

    batch = {"input_ids": torch.arange(6).reshape(3, 2), "attention_mask": torch.ones(3, 2), "labels": torch.zeros(3)}
    logits = forward(Model(), batch, problem_of(None), rows=8)
    assert seen == [torch.Size([8, 2])] and torch.equal(logits, batch["input_ids"].float() * 2)
    filled, real = fill_rows({"x": torch.arange(4).reshape(2, 2)}, 3)
    assert real == 2 and filled["x"].tolist() == [[0, 1], [2, 3], [0, 1]]  # copies of the first row
    assert fill_rows({"x": torch.zeros(5, 1)}, 3)[1] == 5  # a full batch is left as it is


def test_filled_image_rows_stay_channels_last():
    """A short image batch filled to the compiled row count keeps its channels-last layout: a compiled model
    warmed on that layout would otherwise compile another graph for the filled batch (a stride guard)."""
    images = torch.rand(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    filled, real = fill_rows({"pixel_values": images}, 5)
    assert real == 2 and filled["pixel_values"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(filled["pixel_values"][:2], images) and torch.equal(filled["pixel_values"][4], images[0])
    text, _ = fill_rows({"input_ids": torch.ones(2, 7, dtype=torch.long)}, 5)
    assert text["input_ids"].is_contiguous()


# --- runs ------------------------------------------------------------------------------------------


def _weights(out: Path) -> dict:
    return load_file(out / "model" / "model.safetensors")


def _worst(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


COMMON = ("num_train_epochs=2", "max_grad_norm=null", "group_by_length=true", "max_length=64", "save_steps=null")


@pytest.mark.slow
def test_buckets_train_as_one_big_batch_under_accumulation_and_ddp(small_text_data, tmp_path):
    """Length buckets pad more, never differently for the loss: accumulation and DDP still equal one
    big batch, and all equal the run padded per batch."""
    plain = tmp_path / "plain"
    main(tiny_text_args(small_text_data, plain, "per_device_train_batch_size=8", *COMMON))
    one = tmp_path / "one"
    main(tiny_text_args(small_text_data, one, "per_device_train_batch_size=8", "length_buckets=2", *COMMON))
    accumulated = tmp_path / "accumulated"
    main(tiny_text_args(small_text_data, accumulated, "per_device_train_batch_size=2", "gradient_accumulation_steps=4",
                        "length_buckets=2", *COMMON))  # fmt: skip
    ddp = tmp_path / "ddp"
    result = launch(tiny_text_args(small_text_data, ddp, "per_device_train_batch_size=2", "gradient_accumulation_steps=2",
                                   "length_buckets=2", *COMMON), num_processes=2)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reference = _weights(one)
    for run in (plain, accumulated, ddp):
        assert _worst(_weights(run), reference) < 1e-5, run.name
    shapes = json.loads((one / "results.json").read_text())["shapes"]
    assert len(shapes["length_buckets"]) <= 2 and shapes["padded_per_real_token"] >= 1


@pytest.mark.slow
def test_a_compiled_run_compiles_every_shape_in_its_warm_up_and_trains_as_the_eager_one(
    small_text_data, tmp_path, capsys
):
    """torch_compile with buckets: every graph is compiled before the first step (the test split's and
    the short last batches' shapes too), none after; the weights are the eager run's within 1e-5."""
    args = ("per_device_train_batch_size=8", "length_buckets=2", *COMMON)
    main(tiny_text_args(small_text_data, tmp_path / "eager", *args))
    main(tiny_text_args(small_text_data, tmp_path / "compiled", *args, "torch_compile=true"))
    printed = capsys.readouterr().out
    assert "graphs compiled in the warm-up, 0 after it" in printed
    shapes = json.loads((tmp_path / "compiled" / "results.json").read_text())["shapes"]
    assert shapes["graphs_compiled_in_warm_up"] > 0 and shapes["graphs_compiled_after_warm_up"] == 0
    assert _worst(_weights(tmp_path / "compiled"), _weights(tmp_path / "eager")) < 1e-5
    seconds = json.loads((tmp_path / "compiled" / "results.json").read_text())
    assert "compile" in json.dumps(seconds)


def test_torch_compile_refuses_the_layer_split(small_text_data, tmp_path, capsys):
    line = user_error(capsys, main, tiny_text_args(small_text_data, tmp_path / "r", "torch_compile=true",
                                                    "model_parallel=true", "devices=cpu,cpu"), rule="settings.compile_layer_split")  # fmt: skip
    assert "torch_compile does not work with model_parallel=true" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_compiled_ddp_and_accumulation_equal_one_compiled_big_batch(small_text_data, tmp_path):
    """torch_compile with buckets under 2-process DDP and under accumulation: the weights of one big
    batch (within 1e-5), no graph compiled after the warm-up."""
    args = ("length_buckets=2", "torch_compile=true", *COMMON)
    main(tiny_text_args(small_text_data, tmp_path / "one", "per_device_train_batch_size=8", *args))
    main(tiny_text_args(small_text_data, tmp_path / "accumulated", "per_device_train_batch_size=4",
                        "gradient_accumulation_steps=2", *args))  # fmt: skip
    result = launch(tiny_text_args(small_text_data, tmp_path / "ddp", "per_device_train_batch_size=4", *args),
                    num_processes=2)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "graphs compiled in the warm-up, 0 after it" in result.stdout
    reference = _weights(tmp_path / "one")
    for run in ("accumulated", "ddp"):
        assert _worst(_weights(tmp_path / run), reference) < 1e-5, run
        shapes = json.loads((tmp_path / run / "results.json").read_text())["shapes"]
        assert shapes["graphs_compiled_after_warm_up"] == 0


def test_the_compile_mode_reaches_torch_compile_and_needs_torch_compile(small_text_data, tmp_path, capsys,
                                                                       monkeypatch):  # fmt: skip
    """torch_compile_mode is passed to the model's compile (compiling itself left out here: the
    warm-up then runs eagerly); without torch_compile=true it is refused, not ignored."""
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda model, **kw: seen.append(kw))
    args = ("per_device_train_batch_size=8", "length_buckets=2", "num_train_epochs=1", "save_steps=null")
    main(tiny_text_args(small_text_data, tmp_path / "m", *args, "torch_compile=true",
                        "torch_compile_mode=max-autotune-no-cudagraphs"))  # fmt: skip
    assert seen == [{"dynamic": False, "mode": "max-autotune-no-cudagraphs"}]
    line = user_error(capsys, main, tiny_text_args(small_text_data, tmp_path / "r", *args,
                                                   "torch_compile_mode=reduce-overhead"), rule="settings.compile_mode_alone")  # fmt: skip
    assert "torch_compile_mode=reduce-overhead needs torch_compile=true" in line


@pytest.mark.slow
def test_a_compiled_pretrained_model_with_unpadded_batches_compiles_nothing_after_its_warm_up(tmp_path, capsys):
    """A model loaded with from_pretrained starts in eval mode, and SDPA attention drops the mask of a
    batch with no padding: the warm-up compiles the training graphs in training mode and both mask
    variants of each bucket, so the loop, whose batches of equal lengths have no padding, compiles none."""
    from tests.conftest import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "pretrained")
    rows = [("one two three four", "pos"), ("five six seven eight", "neg")] * 8
    rows += [("word " * n, "pos" if n % 2 else "neg") for n in range(1, 13)]
    data = {}
    for split in ("train", "validation"):
        data[split] = tmp_path / f"{split}.csv"
        data[split].write_text("text,label\n" + "".join(f"{t.strip()},{y}\n" for t, y in rows))
    args = tiny_text_args(data, tmp_path / "out", f"model_name_or_path={folder}", "model_config=null",
                          "attn_implementation=sdpa", "per_device_train_batch_size=8", "length_buckets=2",
                          "torch_compile=true", *COMMON)  # fmt: skip
    main(args)
    shapes = json.loads((tmp_path / "out" / "results.json").read_text())["shapes"]
    assert shapes["graphs_compiled_in_warm_up"] > 0 and shapes["graphs_compiled_after_warm_up"] == 0, shapes
    assert "0 after it" in capsys.readouterr().out


@pytest.mark.slow
def test_an_evaluation_batch_smaller_than_the_training_batch_is_compiled_in_the_warm_up(
    small_text_data, tmp_path, capsys
):
    """The warm-up's evaluation forward runs at the evaluation batch's rows, not the training batch's:
    with per_device_eval_batch_size below per_device_train_batch_size nothing compiles after it (on one
    H200, batch 256 with evaluation at 128 compiled one graph at the first evaluation before this)."""
    args = ("per_device_train_batch_size=8", "per_device_eval_batch_size=4", "length_buckets=1",
            "torch_compile=true", *COMMON)  # fmt: skip
    main(tiny_text_args(small_text_data, tmp_path / "out", *args))
    shapes = json.loads((tmp_path / "out" / "results.json").read_text())["shapes"]
    assert shapes["graphs_compiled_in_warm_up"] > 0 and shapes["graphs_compiled_after_warm_up"] == 0, shapes
    assert "0 after it" in capsys.readouterr().out


@pytest.mark.parametrize("rule", ["launch.compile_with_fsdp", "launch.compile_twice"])
def test_torch_compile_refuses_fsdp_and_a_second_compiler(rule):
    """torch_compile=true is one process's or DDP's, and the only compiler (not the accelerate config's
    dynamo_backend too): the Accelerator's state stands in for a real launch."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from finetune.errors import UserError
    from finetune.shapes import check_compile

    fsdp = rule == "launch.compile_with_fsdp"
    plugin = None if fsdp else SimpleNamespace(backend="INDUCTOR")
    accelerator = SimpleNamespace(distributed_type=DistributedType.FSDP if fsdp else DistributedType.NO,
                                  state=SimpleNamespace(dynamo_plugin=plugin))  # fmt: skip
    with pytest.raises(UserError) as e:
        check_compile(accelerator)
    assert e.value.rule == rule
    check_compile(SimpleNamespace(distributed_type=DistributedType.NO, state=SimpleNamespace(dynamo_plugin=None)))
