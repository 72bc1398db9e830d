"""finetune/onnx_export.py: ONNX files of a run's export for every task, run in onnxruntime against PyTorch
(fp32 within 1e-4, on batches and lengths other than the traced ones); int8; `evaluate_checkpoint --onnx`
through the same metrics; the hostile cases (no export, an adapter, no ONNX files yet, the wrong data). That a
text run and an evaluation import no ONNX library: tests/test_import_time.py (one interpreter for both checks).

    HF_HUB_OFFLINE=1 python -m pytest -q -n 0 tests/test_onnx.py            # -m slow: every task
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TOKENIZER, save_tiny_bert, save_tiny_efficientnet, save_tiny_vit, user_error, write_csv

pytest.importorskip("onnxruntime")  # the .[onnx] extra (CI installs it through .[dev])
import onnxruntime as ort  # noqa: E402

from finetune.onnx_export import main as onnx_main  # noqa: E402

LABELS = {"id2label": {0: "neg", 1: "pos", 2: "mixed"}, "label2id": {"neg": 0, "pos": 1, "mixed": 2}}
# Each task's model as a finished run's export (<run>/model): the architectures the app trains.
MODELS = {
    "single_label": lambda f: save_tiny_bert(f, **LABELS),
    "multi_label": lambda f: save_tiny_bert(f, problem_type="multi_label_classification", **LABELS),
    "regression": lambda f: save_tiny_bert(f, num_labels=1, problem_type="regression"),
    "tags": lambda f: save_tiny_bert(f, "BertForTokenClassification", id2label={0: "O", 1: "B-PER", 2: "I-PER"},
                                     label2id={"O": 0, "B-PER": 1, "I-PER": 2}),
    "spans": lambda f: save_tiny_bert(f, "BertForQuestionAnswering"),
    "image": lambda f: save_tiny_vit(f),
    "efficientnet": lambda f: save_tiny_efficientnet(f),
}  # fmt: skip
RUN = ("max_steps=3", "save_steps=3")  # a finished run with a checkpoint, on data with a test split


def _texts(batch: int, words: int, pairs: bool):
    """`batch` texts of up to `words` words (each shorter than the last: padding), optionally as pairs."""
    from transformers import AutoTokenizer

    texts = [" ".join(["good film"] * max(1, words - 3 * i)) for i in range(batch)]
    second = [" ".join(["bad plot"] * (i + 1)) for i in range(batch)] if pairs else None
    return dict(AutoTokenizer.from_pretrained(TOKENIZER)(texts, second, padding=True, return_tensors="pt"))


def _assert_same_as_pytorch(run: Path, precision: str = "fp32", atol: float = 1e-4) -> float:
    import transformers

    config = transformers.AutoConfig.from_pretrained(run / "model")
    model = getattr(transformers, config.architectures[0]).from_pretrained(run / "model").eval()
    session = ort.InferenceSession(str(run / "onnx" / ("model.onnx" if precision == "fp32" else "model_int8.onnx")))
    worst = 0.0
    image = "pixel_values" in [i.name for i in session.get_inputs()]
    shapes = [(1, 2), (3, 9), (5, 40)] if not image else [(1, 0), (4, 0)]
    for batch, words in shapes:  # traced on a batch of 2 of another length
        size = session.get_inputs()[0].shape[-2:] if image else None  # the size the export's processor makes
        inputs = {"pixel_values": torch.rand(batch, 3, *size)} if image else _texts(batch, words, pairs=batch == 3)
        inputs = {k: v for k, v in inputs.items() if k in [i.name for i in session.get_inputs()]}
        with torch.no_grad():
            expected = model(**inputs)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        for name, value in zip([o.name for o in session.get_outputs()], got, strict=True):
            worst = max(worst, float(np.abs(value - expected[name].numpy()).max()))
    assert worst <= atol, worst
    return worst


def _export(tmp_path: Path, kind: str) -> Path:
    run = tmp_path / kind
    MODELS[kind](run / "model")
    onnx_main([str(run)])
    return run


def test_a_text_classifier_serves_on_onnxruntime_fp32_within_1e_4_and_int8(tmp_path):
    run = _export(tmp_path, "single_label")
    assert sorted(p.name for p in (run / "onnx").iterdir()) == sorted(
        ["model.onnx", "model_int8.onnx", "config.json", "README.md", "tokenizer.json", "tokenizer_config.json"]
    ), list((run / "onnx").iterdir())
    _assert_same_as_pytorch(run)  # pairs too (token_type_ids), batches 1, 3 and 5 of other lengths
    _assert_same_as_pytorch(run, "int8", atol=0.5)  # int8: near, not equal
    assert (run / "onnx" / "model_int8.onnx").stat().st_size < (run / "onnx" / "model.onnx").stat().st_size / 2
    card = (run / "onnx" / "README.md").read_text()
    assert "model_int8.onnx" in card and "ort.InferenceSession" in card and "`token_type_ids`" in card
    onnx_main([str(run / "model"), "--no-int8"])  # again, from the export's folder: replaced whole
    assert not (run / "onnx" / "model_int8.onnx").exists() and not (run / ".onnx-new").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k in MODELS if k != "single_label"])
def test_every_task_exports_with_dynamic_axes(tmp_path, kind):
    _assert_same_as_pytorch(_export(tmp_path, kind))


@pytest.fixture(scope="module")
def export_command(finished_run, tmp_path_factory):
    """The RUN finished run exported once by the real command (`python -m finetune.onnx_export <run>`, fp32 and
    int8, in a process of its own): the run and what the command printed."""
    import subprocess
    import sys

    from conftest import REPO

    run = finished_run.copy(tmp_path_factory.mktemp("exported") / "run", *RUN, data="named+test")
    done = subprocess.run([sys.executable, "-m", "finetune.onnx_export", str(run)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return run, done


@pytest.fixture(scope="module")
def exported_run(export_command) -> Path:
    """The run with its ONNX files (<run>/onnx/), for the tests whose subject is what is done with the files
    (each export of the tiny BERT takes ~6 s). Read it, never write into it: a test works on
    `_copy_of(exported_run, ...)`, whose onnx/ records this run's model/ as its export (`EXPORT_OF`) and the
    same weights' sha256. A test that needs the files to record its own run's folder exports them itself."""
    from conftest import file_hashes

    run = export_command[0]
    before = file_hashes(run)
    yield run
    assert file_hashes(run) == before, "a test wrote into the module's exported run (copy it first)"


def _copy_of(exported_run: Path, dest: Path) -> Path:
    return Path(shutil.copytree(exported_run, dest))


def test_a_run_evaluates_on_onnx_through_the_same_metrics(exported_run, tmp_path):
    from finetune.evaluate_checkpoint import main as evaluate

    run = _copy_of(exported_run, tmp_path / "run")  # the finished run and its onnx/, as `onnx_main([run])` makes it
    torch_record = evaluate([str(run / "model")])
    fp32 = evaluate([str(run / "model"), "--onnx"])
    int8 = evaluate([str(run / "model"), "--onnx", "int8", "--predictions"])
    assert fp32["num_samples"] == torch_record["num_samples"] == 11
    assert fp32["accuracy"] == torch_record["accuracy"]
    assert fp32["loss"] == pytest.approx(torch_record["loss"], abs=1e-4)
    assert abs(int8["loss"] - torch_record["loss"]) < 0.05
    assert fp32["onnx"].endswith("model.onnx") and int8["onnx"].endswith("model_int8.onnx")
    # beside the PyTorch evaluation, not over it
    assert Path(fp32["metrics_file"]).parent.name == "test-onnx-fp32"
    assert (run / "eval" / "test" / "metrics.json").is_file()
    assert len((Path(int8["metrics_file"]).parent / "predictions.jsonl").read_text().splitlines()) == 11
    assert json.loads(Path(int8["metrics_file"]).read_text())["onnx"] == int8["onnx"]


@pytest.mark.slow  # ~40 s: an export and three refused evaluations; the default run keeps the one above
def test_the_hostile_cases_are_one_line(finished_run, tmp_path, capsys):
    from finetune.evaluate_checkpoint import main as evaluate

    user_error(capsys, onnx_main, [str(tmp_path / "nowhere")], "does not exist", rule="runs.onnx_path_not_found")
    (tmp_path / "empty").mkdir()
    user_error(capsys, onnx_main, [str(tmp_path / "empty")], "no export in", rule="runs.onnx_without_export")
    adapter = tmp_path / "lora" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    user_error(capsys, onnx_main, [str(adapter)], "is a LoRA adapter alone", rule="runs.onnx_of_an_adapter")
    user_error(capsys, onnx_main, [str(tmp_path), "--int4"], "unrecognized arguments", rule="runs.onnx_arguments")

    run = finished_run.copy(tmp_path / "run", *RUN, data="named+test")
    user_error(capsys, evaluate, [str(run / "model"), "--onnx"], "python -m finetune.onnx_export",
               rule="evaluation.onnx_file_missing")  # fmt: skip
    checkpoint = run / "checkpoints" / "step-00000003"
    user_error(capsys, evaluate, [str(checkpoint), "--onnx"], "give the run's model/ folder",
               rule="evaluation.onnx_not_an_export")  # fmt: skip
    # the wrong data: the same refusal as without --onnx (the data's checks come before the model runs)
    onnx_main([str(run)])
    wrong = write_csv(tmp_path / "wrong.csv", [{"review": "fine", "label": "pos"}])
    user_error(capsys, evaluate, [str(run / "model"), "--onnx", "int8", "--data", str(wrong)], "text",
               rule="columns.text_column_named_otherwise")  # fmt: skip
    assert not (run / "eval").exists()



def test_onnx_files_made_from_other_weights_than_the_exports_are_refused(exported_run, tmp_path, capsys):
    """Each ONNX file records the sha256 of the weights it was made from: after the export's weights change
    (a resumed run exports anew, weights copied in), --onnx refuses the stale files in one line, writing
    nothing, rather than record their scores as the export's; made again, they evaluate. The ONNX folder given
    as the model is one line that names the command."""
    from safetensors.torch import load_file, save_file

    from finetune.evaluate_checkpoint import main as evaluate

    run = _copy_of(exported_run, tmp_path / "run")  # its onnx/: made from the weights as they were
    weights = run / "model" / "model.safetensors"
    save_file({k: v + 0.01 for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    user_error(capsys, evaluate, [str(run / "model"), "--onnx"], "was made from other weights than",
               f"python -m finetune.onnx_export {run}", rule="evaluation.onnx_of_other_weights")  # fmt: skip
    assert not (run / "eval").exists()
    onnx_main([str(run), "--no-int8"])
    assert evaluate([str(run / "model"), "--onnx"])["num_samples"] == 11


def test_onnx_files_given_as_the_model_are_evaluated_through_their_export(exported_run, tmp_path, capsys):
    """An ONNX folder (<run>/onnx/, or an --output-dir elsewhere) or one of its .onnx files given as the model:
    the export it was made from is evaluated on that file, into <run>/eval/<split>-onnx-<precision>/. A file of
    the other precision than --onnx, and files whose export is gone, are one line each. <run>/onnx/ is the
    run's own beside its model/ even in a copy of the run (or one moved), whose files record another folder."""
    from finetune.evaluate_checkpoint import main as evaluate

    # a copy of a run with its onnx/: the files record the original's model/, which is there too
    run = _copy_of(exported_run, tmp_path / "run")
    elsewhere = tmp_path / "served" / "bert"  # exported here from the copy: these record the copy's model/
    onnx_main([str(run), "--output-dir", str(elsewhere)])
    fp32 = evaluate([str(elsewhere)])
    assert fp32["onnx"] == str(elsewhere / "model.onnx") and fp32["num_samples"] == 11
    assert Path(fp32["metrics_file"]).parent == run / "eval" / "test-onnx-fp32"
    int8 = evaluate([str(elsewhere / "model_int8.onnx")])
    assert Path(int8["metrics_file"]).parent.name == "test-onnx-int8" and int8["onnx"].endswith("model_int8.onnx")
    user_error(capsys, evaluate, [str(elsewhere / "model.onnx"), "--onnx", "int8"], "is the fp32 file",
               rule="evaluation.onnx_file_of_another_precision")  # fmt: skip
    own = evaluate([str(run / "onnx")])
    assert own["onnx"] == str(run / "onnx" / "model.onnx")
    assert Path(own["metrics_file"]).parent == run / "eval" / "test-onnx-fp32"  # the copy's export, not the original
    run.rename(tmp_path / "moved")  # the export the files record is gone; <run>/onnx/ still finds its own
    user_error(capsys, evaluate, [str(elsewhere)], f"the export they were made from ({run / 'model'}) is not there",
               untouched=elsewhere, rule="evaluation.onnx_without_its_export")  # fmt: skip
    moved = evaluate([str(tmp_path / "moved" / "onnx")])
    assert moved["num_samples"] == 11
    assert Path(moved["metrics_file"]).parent == tmp_path / "moved" / "eval" / "test-onnx-fp32"

@pytest.mark.slow
def test_a_lora_run_exports_its_merged_model_and_its_adapter_is_refused(finished_run, tmp_path, capsys):
    """A LoRA run's model/ holds the adapters merged (finetune/export.py): it exports as any other run, equal
    to PyTorch; its adapter/ alone is refused in one line that names the run."""
    pytest.importorskip("peft")
    run = finished_run.copy(tmp_path / "lora", "max_steps=2", "peft={r: 4, alpha: 8, target_modules: [query, value]}")
    line = user_error(capsys, onnx_main, [str(run / "adapter")], "is a LoRA adapter alone",
                      rule="runs.onnx_of_an_adapter")  # fmt: skip
    assert str(run) in line
    onnx_main([str(run)])
    _assert_same_as_pytorch(run)


def test_an_export_leaves_the_libraries_settings_as_they_were(tmp_path):
    """The noise is silenced for the export alone: warning filters, loggers and transformers' bars are put back."""
    import logging
    import warnings

    import transformers

    from finetune.onnx_export import libraries_quiet

    root = logging.getLogger()
    before = (list(warnings.filters), list(root.handlers), list(root.filters), logging.getLogger("torch.onnx").level,
              transformers.utils.logging.is_progress_bar_enabled())  # fmt: skip
    with libraries_quiet():
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
    assert (list(warnings.filters), list(root.handlers), list(root.filters), logging.getLogger("torch.onnx").level,
            transformers.utils.logging.is_progress_bar_enabled()) == before


def test_an_output_dir_that_holds_other_files_is_never_replaced(tmp_path, capsys):
    """--output-dir is replaced whole: a folder of other files (the user's, a run) is refused, untouched; so are
    a file and a folder inside a model's (the run's own export), which would be loaded and replaced with it; and a
    file given for the run."""
    run = tmp_path / "run"
    MODELS["single_label"](run / "model")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    user_error(capsys, onnx_main, [str(run), "--output-dir", str(mine)], "holds files that are not the ONNX files",
               "name a new or empty folder", untouched=mine, rule="runs.onnx_output_not_ours")  # fmt: skip
    user_error(capsys, onnx_main, [str(run), "--output-dir", str(run)], rule="runs.onnx_output_not_ours")
    (run / "onnx").mkdir()
    (run / "onnx" / "notes.txt").write_text("mine")  # where the default goes: named as the default, not --output-dir
    user_error(capsys, onnx_main, [str(run)], f"{run / 'onnx'} (the default folder of the ONNX files) holds files",
               "or move those files away", untouched=run / "onnx", rule="runs.onnx_output_not_ours")  # fmt: skip
    shutil.rmtree(run / "onnx")
    user_error(capsys, onnx_main, [str(run / "model" / "config.json")], "is a file; give a finished run's folder",
               f"python -m finetune.onnx_export {run}", untouched=run, rule="runs.onnx_path_a_file")  # fmt: skip
    user_error(capsys, onnx_main, [str(run), "--output-dir", str(mine / "notes.txt")], "is a file; name a folder",
               untouched=mine, rule="runs.onnx_output_a_file")  # fmt: skip
    user_error(capsys, onnx_main, [str(run), "--output-dir", str(run / "model" / "onnx")], "a model's folder",
               untouched=run, rule="runs.onnx_output_inside_a_model")  # fmt: skip
    (run / "checkpoints").mkdir()
    (run / "metrics.jsonl").write_text("")  # a run: its checkpoints/ are rotated, and deleted whole by an overwrite
    user_error(capsys, onnx_main, [str(run), "--output-dir", str(run / "checkpoints" / "onnx")], "the checkpoints folder",
               untouched=run, rule="runs.onnx_output_replaced_by_its_run")  # fmt: skip


def test_an_image_model_is_traced_at_the_size_its_processor_makes(tmp_path):
    """A run's image_size is its processor's (config.json keeps the pretraining's): the ONNX graph takes
    what the processor saved beside it makes, so evaluate_checkpoint --onnx and onnx/README.md's code run."""
    from transformers import AutoImageProcessor, EfficientNetForImageClassification

    from finetune.tasks import task_of

    folder = save_tiny_efficientnet(tmp_path / "model")
    processor = AutoImageProcessor.from_pretrained(folder)
    processor.size = {"height": 48, "width": 48}  # as a run with image_size=48 saves it
    model = EfficientNetForImageClassification.from_pretrained(folder)
    assert model.config.image_size != 48
    assert task_of("image-classification").export_inputs(model, processor)["pixel_values"].shape == (2, 3, 48, 48)


def test_an_export_prints_its_own_line_and_a_signal_leaves_the_earlier_files_and_nothing_half_written(
        export_command, exported_run, tmp_path, monkeypatch):
    """python -m finetune.onnx_export (int8 too: the module's export, `export_command`): stdout is the app's one
    line, stderr holds none of the libraries' noise (torch.onnx's registry and axis names, torch's pytree
    deprecation, onnxruntime's quantizer's advice, transformers' bars). SIGTERM during the next export: one
    `stopped:` line, exit 143, no staging folder left, the earlier onnx/ as it was; and a stop between setting
    the earlier folder aside and moving the new one in puts the earlier back."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, file_hashes

    import finetune.onnx_export

    source, done = export_command
    assert done.stdout.splitlines() == [f"ONNX files of {source / 'model'} -> {source / 'onnx'}"]
    assert done.stderr.strip() == "", done.stderr
    run = _copy_of(exported_run, tmp_path / "run")
    before = file_hashes(run / "onnx")
    proc = subprocess.Popen([sys.executable, "-m", "finetune.onnx_export", str(run)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run / ".onnx-new").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "stopped: received SIGTERM during the ONNX export" in err, err[-2000:]
    assert "Traceback" not in err and not (run / ".onnx-new").exists() and file_hashes(run / "onnx") == before

    def stopped_midway(stage, out, aside):
        os.replace(out, aside)
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune.onnx_export, "_move_into_place", stopped_midway)
    monkeypatch.setattr(finetune.onnx_export, "_write", lambda *args, **kwargs: None)  # the files: as above
    with pytest.raises(KeyboardInterrupt):
        finetune.onnx_export.export_onnx(run)
    assert file_hashes(run / "onnx") == before and not (run / ".onnx-old").exists()
