"""A finished run's export as ONNX files that serve on onnxruntime without PyTorch: fp32, and dynamic int8.

    python -m finetune.onnx_export runs/bert-rotten-tomatoes             # <run>/onnx/: fp32 and int8
    python -m finetune.onnx_export runs/bert-rotten-tomatoes/model --no-int8
    python -m finetune.evaluate_checkpoint runs/bert-rotten-tomatoes/model --onnx int8   # the test split's metrics

Needs the optional extra: pip install -e ".[onnx]" (onnx, onnxruntime, onnxscript).

`<run>/onnx/` holds `model.onnx` (fp32: the export's outputs within 1e-4), `model_int8.onnx` (its MatMul and
Gemm weights quantized to int8 by onnxruntime's `quantize_dynamic`, activations quantized per batch at run
time), the export's config.json (id2label) and tokenizer or image processor, and a README.md saying how to
load them. It is written aside and moved into place whole; a second export replaces the first.

Every task's model goes through one path: its inputs are those its tokenizer (or image processor) makes,
each with a dynamic batch axis and, for token inputs, a dynamic sequence axis; its outputs are named as the
model's (`logits`; `start_logits` and `end_logits` for question answering). The exporter is torch's own,
`torch.onnx.export(dynamo=True)` (torch.export, then onnxscript's lowering): the TorchScript exporter is
deprecated, and transformers' `exporters.OnnxExporter` calls this same function but says of itself that it
is experimental (docs/onnx.md).

A LoRA run's export already holds its adapters merged into the weights (finetune/export.py): it exports as
any other. An adapter folder alone is refused (runs.onnx_of_an_adapter).
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from finetune import checks
from finetune.card import write_onnx_card
from finetune.checks import evaluation, runs
from finetune.exits import exit_on_user_error
from finetune.layout import MODEL, ONNX_FILES, RunDir, as_umask_allows
from finetune.tasks import task_of_model

ONNX_HELP = "the run's ONNX file instead (<run>/onnx/: python -m finetune.onnx_export <run>); fp32 or int8"
SAMPLE_TEXTS = ["a short text", "a second, somewhat longer text, so that the batch is padded"]


def run_of(path: Path) -> RunDir:
    """The run of `path`: a run folder, or its model/ folder."""
    return RunDir(path.parent if path.name == MODEL and not (path / MODEL).is_dir() else path)


def export_onnx(path: str | Path, int8: bool = True) -> Path:
    """Write `<run>/onnx/` from `<run>/model` (`path`: the run or its export). Returns the folder."""
    path = Path(path).expanduser()
    run = run_of(path)
    checks.gate(runs.ONNX_SOURCE, path, run.root)
    model, preprocessor = _load_export(run.model)
    sample = sample_inputs(model, preprocessor)
    stage = run.onnx_stage
    shutil.rmtree(stage, ignore_errors=True)  # a kill during an earlier export left it
    stage.mkdir(parents=True)
    try:
        fp32 = stage / ONNX_FILES["fp32"]
        _to_onnx(model, sample, fp32)
        written = ["fp32"]
        if int8:
            quantize(fp32, stage / ONNX_FILES["int8"])
            written.append("int8")
        model.config.save_pretrained(stage)
        preprocessor.save_pretrained(stage)
        write_onnx_card(stage, list(sample), output_names(model, sample), written)
        as_umask_allows(stage)
    except BaseException:  # noqa: BLE001 - a failure or a signal: nothing half-written
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _move_into_place(run)
    return run.onnx


def _load_export(folder: Path):
    """The export's model (fp32, eval mode) and its preprocessor, as evaluate_checkpoint.py loads them."""
    from transformers import AutoConfig

    task = task_of_model(AutoConfig.from_pretrained(folder), str(folder))
    model = task.auto_model().from_pretrained(folder, use_safetensors=True)
    return model.float().eval(), task.load_saved_preprocessor(str(folder))


def sample_inputs(model, preprocessor) -> dict[str, torch.Tensor]:
    """A batch of two as the model's preprocessor makes it: the inputs the ONNX graph takes."""
    accepted = inspect.signature(model.forward).parameters
    if "pixel_values" in accepted:  # an image model: the size its processor makes (image_size: the run's own)
        from PIL import Image  # images only

        made = preprocessor(images=[Image.new("RGB", (300, 200), (90, 120, 150))] * 2, return_tensors="pt")
        return {"pixel_values": torch.rand(2, model.config.num_channels, *made["pixel_values"].shape[-2:])}
    batch = preprocessor(SAMPLE_TEXTS, padding=True, return_tensors="pt")
    return {k: v for k, v in batch.items() if k in accepted}


def output_names(model, sample: dict[str, torch.Tensor]) -> list[str]:
    """The model's output names (logits; start_logits, end_logits), in order."""
    with torch.no_grad():
        return [k for k in model(**sample).keys() if k not in ("loss", "hidden_states", "attentions")]


def _to_onnx(model, sample: dict[str, torch.Tensor], file: Path) -> None:
    """torch.onnx's exporter, batch (and sequence) axes dynamic: any batch size and text length runs."""
    from torch.export import Dim

    batch, sequence = Dim("batch"), Dim("sequence")
    shapes = {k: {0: batch} if k == "pixel_values" else {0: batch, 1: sequence} for k in sample}
    program = torch.onnx.export(model, (), kwargs=sample, dynamo=True, dynamic_shapes=shapes,
                                input_names=list(sample), output_names=output_names(model, sample),
                                verbose=False)  # fmt: skip
    program.save(str(file))


def quantize(fp32: Path, int8: Path) -> None:
    """Dynamic int8 (onnxruntime's quantizer): int8 weights, activations scaled per batch at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)


def _move_into_place(run: RunDir) -> None:
    """The staged folder becomes <run>/onnx; an earlier one is set aside first and removed after."""
    shutil.rmtree(run.onnx_aside, ignore_errors=True)
    if run.onnx.exists():
        os.replace(run.onnx, run.onnx_aside)
    os.replace(run.onnx_stage, run.onnx)
    shutil.rmtree(run.onnx_aside, ignore_errors=True)


def onnx_file_of(precision: str | None, kind: str, spec: str, path: Path | None) -> Path | None:
    """evaluate_checkpoint.py --onnx: the ONNX file beside the export `path` (<run>/onnx/), checked; None
    without --onnx."""
    if precision is None:
        return None
    run = RunDir(path.parent if path is not None else Path(spec))
    checks.gate(evaluation.ONNX, kind, spec, run.onnx_file(precision), run.root)
    return run.onnx_file(precision)


class OnnxModel(torch.nn.Module):
    """An ONNX file on onnxruntime as the evaluation loop calls a model: `model(**batch)` returns the outputs
    by name (`logits`, or `start_logits` and `end_logits`), as torch tensors on the inputs' device. No
    parameters: Accelerate's evaluation preparation leaves it as it is. `config`: the export's (thresholds,
    labels), which the evaluation reads of a model."""

    def __init__(self, file: Path, config=None):
        super().__init__()
        self.config = config
        import onnxruntime as ort  # only an --onnx evaluation imports it

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()  # the process's share of the CPU (cpu_threads)
        self.session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def forward(self, **batch: torch.Tensor) -> SimpleNamespace:
        device = next(iter(batch.values())).device
        feeds = {name: batch[name].detach().cpu().numpy() for name in self.inputs}
        values = self.session.run(self.outputs, feeds)
        return SimpleNamespace(**{n: torch.from_numpy(v).to(device) for n, v in zip(self.outputs, values, strict=True)})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit status 2, like every other user error
        raise checks.explain(runs.ONNX_COMMAND, message)


@exit_on_user_error
def main(argv: list[str] | None = None) -> Path:
    parser = _Parser(prog="python -m finetune.onnx_export", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("run", help="a finished run's folder (its output_dir), or its model/ folder")
    parser.add_argument("--no-int8", action="store_true", help="write model.onnx alone, without model_int8.onnx")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    folder = export_onnx(args.run, int8=not args.no_int8)
    print(f"ONNX files of {run_of(Path(args.run)).model} -> {folder}")
    return folder


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
