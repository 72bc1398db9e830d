"""A finished run's export as ONNX files that serve on onnxruntime without PyTorch: fp32, and dynamic int8.

    python -m finetune.onnx_export runs/bert-rotten-tomatoes             # <run>/onnx/: fp32 and int8
    python -m finetune.onnx_export runs/bert-rotten-tomatoes/model --no-int8
    python -m finetune.onnx_export /read-only/runs/bert-rotten-tomatoes --output-dir onnx-bert   # elsewhere
    python -m finetune.evaluate_checkpoint runs/bert-rotten-tomatoes/model --onnx int8   # the test split's metrics

Needs the optional extra: pip install -e ".[onnx]" (onnx, onnxruntime, onnxscript).

`<run>/onnx/` holds `model.onnx` (fp32: the export's outputs within 1e-4), `model_int8.onnx` (its MatMul and
Gemm weights quantized to int8 by onnxruntime's `quantize_dynamic`, activations quantized per batch at run
time), the export's config.json (id2label) and tokenizer or image processor, and a README.md saying how to
load them. It is written aside and moved into place whole; a second export replaces the first. Each ONNX file
records the sha256 of the export's weights it was made from (its metadata, `MADE_FROM`), which
`evaluate_checkpoint.py --onnx` holds against the export's (evaluation.onnx_of_other_weights).

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
import contextlib
import functools
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from finetune import checks
from finetune.card import write_onnx_card
from finetune.checks import evaluation, runs
from finetune.digests import weights_sha256
from finetune.errors import write_failure
from finetune.exits import exit_on_user_error
from finetune.layout import MODEL, ONNX, ONNX_FILES, RunDir, as_umask_allows
from finetune.signals import stop_outside_the_loop
from finetune.tasks import task_of_model

ONNX_HELP = "the run's ONNX file instead (<run>/onnx/: python -m finetune.onnx_export <run>); fp32 or int8"
# What the libraries say on every export, of their own making, not the user's: torch's pytree deprecation (in
# torch.export) and torch.onnx's note on dynamic axes that share a name; onnxruntime's quantizer's advice to
# pre-process (logged on the root logger); torch.onnx's registry skipping torchvision's ops (its own logger).
NOISY_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"# The axis name: \w+ will not be used")
NOISY_ROOT_LOG = "Please consider to run pre-processing before quantization"
NOISY_LOGGER = "torch.onnx"
MADE_FROM = "finetune.weights_sha256"  # an ONNX file's metadata: the sha256 of the export's weights it was made from
EXPORT_OF = "finetune.export"  # and the export's folder (evaluate_checkpoint.py given the ONNX files finds it so)


def run_of(path: Path) -> RunDir:
    """The run of `path`: a run folder, or its model/ folder."""
    return RunDir(path.parent if path.name == MODEL and not (path / MODEL).is_dir() else path)


def export_onnx(path: str | Path, int8: bool = True, output_dir: str | Path | None = None) -> Path:
    """Write `<run>/onnx/` (or `output_dir`) from `<run>/model` (`path`: the run or its export). Returns the folder.
    The files are written aside (`.<folder>-new`, `.onnx-new` in the run) and moved into place whole; a write
    that fails (a read-only run folder, a full disk) leaves nothing and says to choose another --output-dir."""
    path = Path(path).expanduser()
    run = run_of(path)
    checks.gate(runs.ONNX_SOURCE, path, run.root)
    out = Path(output_dir).expanduser() if output_dir is not None else run.onnx
    checks.gate(runs.ONNX_OUTPUT, out, output_dir is not None)
    stage, aside = out.parent / f".{out.name}-new", out.parent / f".{out.name}-old"  # in a run: layout.ONNX_STAGE
    with libraries_quiet():  # their known noise, for the export alone
        task, model, preprocessor = _load_export(run.model)
        sample = task.export_inputs(model, preprocessor)
        try:
            shutil.rmtree(stage, ignore_errors=True)  # a kill during an earlier export left it
            stage.mkdir(parents=True)
            _write(model, preprocessor, sample, task.export_axes(sample), stage, int8, weights_sha256(run.model),
                   run.model.resolve())  # fmt: skip
            _move_into_place(stage, out, aside)
        except BaseException as e:  # noqa: BLE001 - a failure or a signal: nothing half-written
            shutil.rmtree(stage, ignore_errors=True)
            if aside.is_dir() and not out.exists():  # stopped between the two moves: the earlier folder goes back
                os.replace(aside, out)
            failure = write_failure(e, out.parent if out.parent.exists() else None)
            if failure is None:
                raise
            raise checks.explain(runs.ONNX_WRITE_FAILED, out, failure) from None
    return out


@contextlib.contextmanager
def libraries_quiet():
    """The libraries' known noise of an export (NOISY_*: warnings, log lines, transformers' loading and saving
    bars) silenced while it runs, and every setting put back after: no global state changes. Their errors
    still raise; the app's own line is printed after it."""
    import transformers

    bars = transformers.utils.logging.is_progress_bar_enabled()
    torch_onnx, root = logging.getLogger(NOISY_LOGGER), logging.getLogger()
    level, hush = torch_onnx.level, logging.NullHandler()  # hush: logging.warning() then configures no root handler

    def noise(record: logging.LogRecord) -> bool:
        return NOISY_ROOT_LOG not in record.getMessage()

    transformers.utils.logging.disable_progress_bar()
    torch_onnx.setLevel(logging.ERROR)
    root.addFilter(noise)
    root.addHandler(hush)
    try:
        with warnings.catch_warnings():
            for message in NOISY_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        root.removeHandler(hush)
        root.removeFilter(noise)
        torch_onnx.setLevel(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()


def _write(model, preprocessor, sample: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], stage: Path,
           int8: bool, digest: str | None, export: Path) -> None:  # fmt: skip
    """The ONNX files (each stamped with `digest`, the export's weights', and `export`, its folder), the export's
    config and preprocessor, and the card, into `stage`."""
    fp32 = stage / ONNX_FILES["fp32"]
    _to_onnx(model, sample, axes, fp32)
    written = ["fp32"]
    if int8:
        quantize(fp32, stage / ONNX_FILES["int8"])
        written.append("int8")
    for precision in written:
        _stamp(stage / ONNX_FILES[precision], digest, export)
    model.config.save_pretrained(stage)
    preprocessor.save_pretrained(stage)
    write_onnx_card(stage, list(sample), output_names(model, sample), written)
    as_umask_allows(stage)


def _load_export(folder: Path):
    """The export's task, its model (fp32, eval mode) and its preprocessor, as evaluate_checkpoint.py loads them."""
    from transformers import AutoConfig

    task = task_of_model(AutoConfig.from_pretrained(folder), str(folder))
    model = task.auto_model().from_pretrained(folder, use_safetensors=True)
    return task, model.float().eval(), task.load_saved_preprocessor(str(folder))


def output_names(model, sample: dict[str, torch.Tensor]) -> list[str]:
    """The model's output names (logits; start_logits, end_logits), in order."""
    with torch.no_grad():
        return [k for k in model(**sample).keys() if k not in ("loss", "hidden_states", "attentions")]


def _to_onnx(model, sample: dict[str, torch.Tensor], axes: dict[str, dict[int, str]], file: Path) -> None:
    """torch.onnx's exporter, the task's axes (`Task.export_axes`: batch, sequence) dynamic: any batch size and
    text length runs."""
    from torch.export import Dim

    dims = {name: Dim(name) for name in {n for named in axes.values() for n in named.values()}}
    shapes = {k: {axis: dims[name] for axis, name in axes[k].items()} for k in sample}
    program = torch.onnx.export(model, (), kwargs=sample, dynamo=True, dynamic_shapes=shapes,
                                input_names=list(sample), output_names=output_names(model, sample),
                                verbose=False)  # fmt: skip
    program.save(str(file))


def quantize(fp32: Path, int8: Path) -> None:
    """Dynamic int8 (onnxruntime's quantizer): int8 weights, activations scaled per batch at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)


def _stamp(file: Path, digest: str | None, export: Path) -> None:
    """`digest` and `export` into the ONNX file's metadata (`MADE_FROM`, `EXPORT_OF`); its weights, inline or
    external, are left as written."""
    import onnx  # the [onnx] extra: only an export imports it

    proto = onnx.load(str(file), load_external_data=False)
    for key, value in ((MADE_FROM, digest), (EXPORT_OF, str(export))):
        if value is not None:
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
    onnx.save(proto, str(file))


def made_from(file: Path, key: str = MADE_FROM) -> str | None:
    """What an ONNX file records it was made from (`MADE_FROM`: the export's weights' sha256; `EXPORT_OF`: the
    export's folder), or None for a file that records none."""
    import onnx  # only --onnx imports it

    props = onnx.load(str(file), load_external_data=False).metadata_props
    return next((p.value for p in props if p.key == key), None)


def _move_into_place(stage: Path, out: Path, aside: Path) -> None:
    """The staged folder becomes `out`; an earlier one is set aside first and removed after."""
    shutil.rmtree(aside, ignore_errors=True)
    if out.exists():
        os.replace(out, aside)
    os.replace(stage, out)
    shutil.rmtree(aside, ignore_errors=True)


def onnx_file_of(precision: str | None, kind: str, spec: str, path: Path | None, weights: str | None,
                 given: Path | None = None) -> Path | None:  # fmt: skip
    """evaluate_checkpoint.py --onnx: the ONNX file beside the export `path` (<run>/onnx/), or the one `given`
    (`onnx_given`), checked, and made from the export's weights (`weights`: their sha256); None without --onnx."""
    if precision is None:
        return None
    run = RunDir(path.parent if path is not None else Path(spec))
    file = given or run.onnx_file(precision)
    checks.gate(evaluation.ONNX, kind, spec, file, run.root)
    checks.gate(evaluation.ONNX_WEIGHTS, file, made_from(file), weights, run.root)
    return file


def _holds_onnx(folder: Path) -> bool:
    """A folder of ONNX files (<run>/onnx/, an --output-dir): one of ONNX_FILES, and no PyTorch weights."""
    weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    return folder.is_dir() and not weights and any((folder / f).is_file() for f in ONNX_FILES.values())


def onnx_given(args: argparse.Namespace) -> argparse.Namespace:
    """evaluate_checkpoint.py given ONNX files as the model (a folder of them, <run>/onnx/ or an --output-dir, or one
    .onnx file): the export they were made from, evaluated with --onnx on them (`args.onnx_file`). The export is
    the run's model/ beside <run>/onnx/, else the folder the files record (`EXPORT_OF`); onnx_file_of then holds
    them to its weights, as for <run>/model --onnx."""
    path, args.onnx_file = Path(args.checkpoint).expanduser(), None
    file = path if path.suffix == ".onnx" and path.is_file() else None
    if file is None and not _holds_onnx(path):
        return args
    folder = file.parent if file is not None else path
    named = next((p for p, name in ONNX_FILES.items() if file is not None and file.name == name), None)
    checks.gate(evaluation.ONNX_GIVEN, file, args.onnx, named)
    precision = args.onnx or named or "fp32"
    found = [f for f in ([file] if file else [folder / n for n in ONNX_FILES.values()]) if f.is_file()]
    recorded = next((r for r in map(functools.partial(made_from, key=EXPORT_OF), found) if r), None)
    beside = [folder.parent / MODEL] if folder.name == ONNX else []  # a run's own onnx/ (a run moved, copied)
    export = next((e for e in [*beside, *([Path(recorded)] if recorded else [])] if (e / "config.json").is_file()), None)
    checks.gate(evaluation.ONNX_EXPORT, folder, export, recorded)
    args.checkpoint, args.onnx, args.onnx_file = str(export), precision, file or folder / ONNX_FILES[precision]
    return args


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
    parser.add_argument("--output-dir", help="the folder for the ONNX files (default: <run>/onnx/, which "
                        "evaluate_checkpoint.py --onnx reads); a new or empty one, or an earlier export's")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    stop_outside_the_loop("during the ONNX export")  # SIGTERM: one line, and nothing of the files left
    folder = export_onnx(args.run, int8=not args.no_int8, output_dir=args.output_dir)
    print(f"ONNX files of {run_of(Path(args.run)).model} -> {folder}")
    return folder


def cli() -> None:
    main()


if __name__ == "__main__":
    main()
