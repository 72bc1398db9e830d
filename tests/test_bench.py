"""The benchmark's smoke run: tiny BERT from config, a few steps of the app's loop and the reference.

Checks the report's fields and that its values are sane, and that the hooks of both loops recorded
every phase; no timing assertions on real runs (a shared CPU makes timings noise in a test): the
recorder's arithmetic is checked on a loop with a clock of its own."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.bench import main


@pytest.mark.slow
def test_smoke_bench_writes_a_sane_report(tmp_path):
    main(["--smoke", "--recipe", "bert", "--steps", "4", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "bench.json").read_text())
    assert (tmp_path / "bench.md").read_text().count("| samples/s |") == 1
    assert report["peak"]["flops_per_s"] > 0
    bert = report["recipes"]["bert"]
    assert bert["app_over_reference"]["samples_per_s"] > 0
    for side in ("app", "reference"):
        r = bert[side]
        assert r["optimizer_steps"] == 4 and r["steps_timed"] == 3, side
        assert 0 < r["real_tokens"] <= r["padded_tokens"], side
        assert r["samples"] == 3 * 8, side  # 3 timed steps of the smoke batch of 8
        assert 0 < r["mfu"] < 1.5, side
        assert r["samples_per_s"] > 0 and r["step_time_s"] > 0 and r["first_step_s"] > 0, side
        # every mark of the loop arrived: each phase of the step has time in it
        phases = r["phases_s"]
        assert {"data", "forward", "backward", "optimizer", "other"} <= set(phases), side
        assert all(phases[k] > 0 for k in ("data", "forward", "backward", "optimizer")), (side, phases)
        assert 0 <= r["eval_accuracy"] <= 1 and r["eval_split"] == "test" and r["eval_samples"] == 32, side
        assert r["peak_rss_mib"] > 0, side
        assert r["evals_s"] and all(s > 0 for s in r["evals_s"]), side  # the evaluations, timed apart
        flops = r["flop_model"]  # counted from the model the "built" mark gave
        assert 0 < flops["non_embedding_params"] < flops["params"], side
    # the app's own phases, as its hooks report them
    assert list(bert["app"]["stages_s"]) == ["start-up", "data", "build", "train", "evaluate", "export"]
    assert all(s > 0 for s in bert["app"]["stages_s"].values()), bert["app"]["stages_s"]
    assert {"data", "build", "train", "evaluate"} <= set(bert["reference"]["stages_s"])
    assert "instrumentation_missing" not in json.dumps(report)


def test_recorder_splits_a_step_by_its_marks():
    """Which mark ends which phase, an evaluation left out of its step, and the batch's counts, on a
    loop with a clock of its own."""
    import torch

    from benchmarks.recorder import Recorder

    class Clocked(Recorder):
        t = 0.0

        def now(self, sync: bool = True) -> float:
            return self.t

    rec = Clocked(torch.device("cpu"))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    with rec.phase("train"):
        for step in (1, 2, 3):
            for name, seconds, value in [("batch", 1, {"attention_mask": mask}), ("backward", 2, None),
                                         ("optimizer", 3, None), ("micro-batch done", 4, None)]:  # fmt: skip
                rec.t += seconds
                rec.mark(name, value)
            with rec.phase("evaluate"):
                rec.t += 100
            rec.t += 5  # scheduler, logging, checkpoint
            rec.mark("step", step)
    s = rec.summary(warmup=1)
    assert s["steps_recorded"] == 3 and s["steps_timed"] == 2
    assert s["phases_s"] == {"data": 1, "forward": 2, "backward": 3, "optimizer": 4, "other": 5}
    assert s["step_time_s"] == 15 and s["evals_s"] == [100] * 3
    assert (s["samples"], s["real_tokens"], s["padded_tokens"]) == (4, 10, 16)
    assert set(s["stages_s"]) == {"train", "evaluate"}


def test_unsplit_recorder_times_the_device_not_the_host():
    """split=False (the bench's --no-split): the host queues each step's device work and runs ahead;
    only the timed window's ends wait for the device, so the step time is the device's, the phases
    are not reported, and the tokens are counted from the masks after the run."""
    import torch

    from benchmarks.recorder import Recorder

    class Queued(Recorder):
        t, done, syncs = 0.0, 0.0, 0  # host clock, when the device's queue drains, waits

        def now(self, sync: bool = True) -> float:
            if sync:
                self.t, self.syncs = max(self.t, self.done), self.syncs + 1
            return self.t

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    results = {}
    for split in (True, False):
        rec = Queued(torch.device("cpu"), warmup=1, split=split)
        with rec.phase("train"):
            for step in (1, 2, 3, 4):
                rec.mark("batch", {"attention_mask": mask})
                rec.done = max(rec.done, rec.t) + 10  # the step's device work, queued
                rec.t += 1  # the host's own time
                for name in ("backward", "optimizer", "micro-batch done", "step"):
                    rec.mark(name, step)
        results[split] = (rec.summary(warmup=1), rec.syncs)
    unsplit, syncs = results[False]
    assert unsplit["step_time_s"] == 10  # the device's 10 s a step, though the host took 1 s
    assert syncs == 3  # the loop's start, the end of the warm-up's step, the loop's end
    assert set(unsplit["phases_s"].values()) == {None}
    assert (unsplit["samples"], unsplit["real_tokens"], unsplit["padded_tokens"]) == (6, 15, 24)
    split, split_syncs = results[True]
    assert split_syncs > 4 * 5 and split["real_tokens"] == unsplit["real_tokens"]


def test_peak_memory_is_the_runs_own(tmp_path):
    """The peak RSS of a block: what it allocated, not an earlier, larger peak of the process."""
    import ctypes
    import mmap
    import time

    import torch

    from benchmarks.recorder import RunMonitor

    def touch(mib: int, hold: float = 0.0) -> None:
        m = mmap.mmap(-1, mib * 2**20)  # anonymous memory, whatever malloc keeps
        view = ctypes.c_char.from_buffer(m)
        ctypes.memset(ctypes.addressof(view), 1, mib * 2**20)
        time.sleep(hold)
        del view
        m.close()

    touch(384)  # an earlier peak
    with RunMonitor(torch.device("cpu")) as monitor:
        touch(96, hold=0.1)
    report = monitor.report()
    assert 80 <= report["peak_rss_mib"] - report["rss_before_mib"] < 200, report


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_seq_len_must_be_positive(bad, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", "--seq-len", bad, "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and not (tmp_path / "bench.json").exists()


@pytest.mark.slow
def test_smoke_levers_of_the_full_recipe(tmp_path):
    """The full-data recipe's own levers run (frozen layers, batch 64) beside the attention kernel, whose
    "off" is the kernel the app did not choose for this precision."""
    import torch

    from benchmarks.levers import LEVERS, lever_overrides

    report = main([
        "--smoke", "--recipe", "bert_full", "--steps", "2", "--levers", "--levers-only",
        "frozen_layers", "batch_64", "attention_kernel", "--out", str(tmp_path),
    ])  # fmt: skip
    rows = {row["lever"]: row for row in report["levers"]}
    assert set(rows) == {"frozen_layers", "batch_64", "attention_kernel"}
    assert all(row["ratio"] > 0 for row in rows.values())
    cpu = torch.device("cpu")
    assert lever_overrides(LEVERS["attention_kernel"], cpu) == ["attn_implementation=eager"]  # fp32: SDPA chosen


def test_frozen_lower_layers_count_forward_only():
    from conftest import tiny_bert_config
    from transformers import BertForSequenceClassification

    from benchmarks.flops import flop_model, token_flops

    model = BertForSequenceClassification(tiny_bert_config(num_hidden_layers=4, max_position_embeddings=512))
    full = flop_model(model)
    per_layer = sum(p.numel() for p in model.bert.encoder.layer[0].parameters())
    model.bert.embeddings.requires_grad_(False)
    for layer in model.bert.encoder.layer[:2]:
        layer.requires_grad_(False)
    frozen = flop_model(model)
    assert frozen["frozen_layers"] == 2 and full["frozen_layers"] == 0
    assert frozen["frozen_non_embedding_params"] == 2 * per_layer + 2 * 32  # two layers and the embedding LayerNorm
    s = 16
    # two layers' weights lose their 4 backward FLOPs per weight, and their attention 2 of its 3 passes
    saved = 4 * (2 * per_layer + 2 * 32) + 2 * 4 * 32 * s * 2
    assert token_flops(full, s) - token_flops(frozen, s) == saved


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reps", "0"], "--reps must be positive"),
        (["--levers-only", "nosuchlever"], "no lever named nosuchlever"),
        (["--recipe", "bert_fulll"], "invalid choice"),
        (["--override", "output_dir=/tmp/x"], "--override output_dir"),
        (["--recipe", "bert_full", "--levers-only", "batch_32"], "batch_32: it is not a lever of --recipe bert_full"),
        (["--levers-only", "eager_mode"], "eager_mode: it needs --compile"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", *argv, "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error:") and err.count("\n") == 1 and message in err, err


@pytest.mark.slow  # ~7 s: the profiler over a few steps of the bundled model
def test_profile_step_splits_the_step_into_groups(capsys, tmp_path):
    from benchmarks.profile_step import main as profile_main

    shares = profile_main(["--precision", "no", "--batch", "4", "--length", "8", "--steps", "1",
                           "--out", str(tmp_path), "--gemm-size", "256"])  # fmt: skip
    assert shares["step_s"] > 0 and shares["weight GEMMs (mm, addmm)"] > 0
    groups = [v for k, v in shares.items() if k != "step_s"]
    assert all(v >= 0 for v in groups[:-1]) and abs(sum(groups) - 1) < 1e-9
    assert "ms a step" in capsys.readouterr().out
    report = json.loads((tmp_path / "profile_step_no_eager_4x8.json").read_text())
    # torch's count of the weight GEMMs is the FLOP model's forward and backward of every trained weight
    counted = report["flops_counted_by_torch"]["mm"] + report["flops_counted_by_torch"]["addmm"]
    assert 0.8 < counted / report["model_flops_per_step"] <= 1.0
    assert 0 < report["mfu_ceiling"] <= report["weight_gemm_over_peak"] and report["machine"]["cpu"]


def test_warmup_that_leaves_no_step_to_time_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--steps", "2", "--warmup", "5", "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "leaves none of --steps 2 to time" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:  # a step count that is no count is named as such first
        main(["--steps", "0", "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--steps must be positive, got 0" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_launcher_benchmark_starts_the_app_through_both_launchers(tmp_path):
    """benchmarks/launcher.py: `accelerate launch`, `accelerate-launch` and plain python each start
    run.py (its --help printed, or the benchmark stops); the report holds each one's seconds."""
    from benchmarks.launcher import main as launcher

    report = launcher(["--reps", "1", "--out", str(tmp_path)])
    assert set(report["median"]) == {"accelerate launch", "accelerate-launch", "python (no launcher)"}
    assert all(s > 0 for s in report["median"].values())
    assert json.loads((tmp_path / "launcher.json").read_text())["median"] == report["median"]
    assert "| `accelerate-launch` |" in (tmp_path / "launcher.md").read_text()


@pytest.mark.slow
def test_the_launcher_benchmark_stops_when_a_command_fails(tmp_path):
    from benchmarks.launcher import main as launcher

    with pytest.raises(SystemExit, match="failed"):
        launcher(["--reps", "1", "--config-file", str(tmp_path / "missing.yaml"), "--out", str(tmp_path)])


class _Convolutional(torch.nn.Module):
    """A convolution, a depthwise one (EfficientNet's kind: a group per channel) and a linear head on 8x8
    RGB images, as a convolutional model answers (`.logits`), with a config that is not a transformer's."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"hidden_size": 2})()
        self.conv, self.head = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(4 * 8 * 8, 2)
        self.depthwise = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)

    def forward(self, pixel_values):
        return type("Output", (), {"logits": self.head(self.depthwise(self.conv(pixel_values)).flatten(1))})()


def test_a_convolutional_model_has_its_flops_counted_by_torch_and_frozen_layers_count_forward_only():
    from benchmarks.flops import flop_model

    model, batch = _Convolutional(), {"pixel_values": torch.randn(5, 3, 8, 8)}
    conv, depthwise, head = 2 * 3 * 4 * 9 * 64, 2 * 4 * 1 * 9 * 64, 2 * 256 * 2  # forward FLOPs of one image
    # backward: each gradient costs its forward; no input gradient for the first layer (the images need none)
    assert flop_model(model, batch)["flops_per_sample"] == 2 * conv + 3 * depthwise + 3 * head
    model.conv.requires_grad_(False)  # frozen: no backward through it, nor a gradient of its output
    assert flop_model(model, batch)["flops_per_sample"] == conv + 2 * depthwise + 3 * head
    assert all(p.grad is None for p in model.parameters())  # counted on a copy: the run's gradients untouched


def test_the_textbook_loop_feeds_each_head_its_own_labels_and_scores_where_labelled():
    from types import SimpleNamespace

    from benchmarks.reference import argmax_hits, textbook_inputs

    spans = {"input_ids": torch.ones(2, 4), "labels": torch.tensor([[1, 2], [0, 0]]),
             "meta": {"example": torch.tensor([0, 0]), "offsets": torch.zeros(2, 4, 2)}}  # fmt: skip
    inputs = textbook_inputs(spans)
    assert set(inputs) == {"input_ids", "start_positions", "end_positions"}  # run_qa's own loss arguments
    assert inputs["start_positions"].tolist() == [1, 0] and inputs["end_positions"].tolist() == [2, 0]
    qa = SimpleNamespace(start_logits=torch.tensor([[0.0, 9, 0, 0], [9.0, 0, 0, 0]]),
                         end_logits=torch.tensor([[0.0, 0, 0, 9], [9.0, 0, 0, 0]]))  # fmt: skip
    hits, counted = argmax_hits(qa, spans["labels"])
    assert hits.tolist() == [False, True] and counted.sum() == 2  # a window is right where start and end are
    tags = {"input_ids": torch.ones(1, 3), "labels": torch.tensor([[1, -100, 0]])}
    assert set(textbook_inputs(tags)) == {"input_ids", "labels"}
    hits, counted = argmax_hits(SimpleNamespace(logits=torch.tensor([[[0.0, 1], [0, 1], [0, 1]]])), tags["labels"])
    assert counted.tolist() == [[True, False, True]] and (hits & counted).sum() == 1  # later subwords not scored


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["ner", "qa", "choices", "efficientnet"])
def test_smoke_bench_of_every_task(recipe, tmp_path):
    main(["--smoke", "--recipe", recipe, "--steps", "4", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "bench.json").read_text())["recipes"][recipe]
    for side in ("app", "reference"):
        assert r[side]["optimizer_steps"] == 4 and r[side]["samples"] == 3 * 8, side
        assert 0 < r[side]["mfu"] < 1.5 and r[side]["model_flops"] > 0, side
    assert r["app"]["eval_metric"] == {"ner": "word_accuracy", "qa": "exact_match"}.get(recipe, "accuracy")
    assert (r["app_over_reference"]["eval_accuracy_difference"] is None) == (recipe == "qa")
    assert r["app_over_reference"]["validation_evaluation_s"] > 0
    assert r["app"]["validation_evaluation"]["samples"] == 16  # max_eval_samples: texts, sentences, questions


@pytest.mark.slow  # the profiler over a step of the ViT recipe's model
def test_profile_step_of_the_vit_recipe_counts_its_patches(tmp_path):
    from benchmarks.profile_step import main as profile_main

    profile_main(["--recipe", "vit", "--precision", "no", "--batch", "4", "--steps", "1", "--out", str(tmp_path),
                  "--gemm-size", "256"])  # fmt: skip
    report = json.loads((tmp_path / "profile_step_vit_no_eager_4x50.json").read_text())  # 28 px / 4: 7 x 7 patches, [CLS]
    counted = report["flops_counted_by_torch"]["mm"] + report["flops_counted_by_torch"]["addmm"]
    assert report["length"] == 50 and 0.8 < counted / report["model_flops_per_step"] <= 1.0
