"""Check, on your own recipe, that gradient accumulation and DDP train exactly like one big batch.

    python -m finetune.verify --config finetune/configs/bert_rotten_tomatoes.yaml
    python -m finetune.verify --config <recipe.yaml> per_device_train_batch_size=8 --steps 5
    accelerate launch --multi_gpu --num_processes 2 -m finetune.verify --config <recipe.yaml> [key=value ...]
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml finetune/verify.py --config <recipe.yaml>

    options: --steps N       optimizer steps to train (default 3)
             --tolerance T   largest parameter difference accepted (default 1e-5)
             --keep DIR      keep the runs under DIR instead of a temporary directory (an empty or
                             new folder: one that holds anything is refused, nothing in it replaced)

It trains your recipe (and key=value overrides) for a few optimizer steps with the global batch G =
processes x per_device_train_batch_size x gradient_accumulation_steps, three ways:

    (a) one big batch   1 process,  batch G,  no accumulation          the reference
    (b) accumulation    1 process,  batch G/k, accumulation k          k = processes x accumulation,
                                                                        or the smallest factor of G
    (c) DDP             your processes x batch x accumulation          only when launched on several

for any problem type (single-label, regression, multi-label: finetune/problems/), and compares
the exported weights of (b) and (c) with (a): the largest absolute difference of any
parameter (what the tolerance applies to), the largest relative one (per tensor, against the
tensor's largest value; tensors whose values all stay below 1e-3, such as attention key biases
that hold only rounding noise, are left out of it), and the largest difference of a logged loss. Exit status 0 when every variant is within the tolerance, 1
when one is not, 2 for a usage error. This is tests/test_equivalence.py, on your model and data.

The slice of data is chosen so that the last step is the hard case: max_train_samples = N x G - (b + 1)
leaves the last window one micro-batch short and its last micro-batch one sample short, so the
divisor of a partial window and, under DDP, the masking of the samples Accelerate duplicates to
even out the last batch are both exercised.

What is held fixed so that the three can agree to rounding error: fp32 (ACCELERATE_MIXED_PRECISION=no,
and no TF32 on GPUs), dropout off (`dropout=0.0` where the config has that key, else the dropout
probabilities of `model_config` set to 0; a pretrained model needs the key; LoRA's too), no random image flips
under DDP (`random_flip=false`, where the config has it), no gradient clipping (it would hide a wrongly
scaled gradient; put max_grad_norm=... on the command line to keep yours), no checkpoints, trackers or
uploads, a small evaluation. Model parallelism is switched off: it is checked by tests/test_parallel.py.
Variant (a) holds the whole global batch in one process's memory: if that does not fit, lower
per_device_train_batch_size; the check does not depend on its size.

Under DDP every process runs (c) together; then process 0 runs (a) and (b), each as a plain
single-process `python -m finetune.run` with the launcher's environment removed, and reports.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune import checks
from finetune.checks import tools
from finetune.config import TrainConfig, load_config
from finetune.errors import UserError
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.layout import RunDir

DEFAULT_STEPS = 3
DEFAULT_TOLERANCE = 1e-5
RELATIVE_FLOOR = 1e-3  # tensors whose values all stay below this are left out of the relative difference
# Environment a launcher (torchrun, accelerate launch, SLURM via accelerate) sets for its processes.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
)
LAUNCHER_PREFIXES = ("ACCELERATE_", "TORCHELASTIC_", "FSDP_", "TORCH_NCCL_")


@dataclass(frozen=True)
class Variant:
    name: str
    processes: int
    batch: int  # per process
    accumulation: int

    @property
    def shape(self) -> str:
        return f"{self.processes} x {self.batch} x {self.accumulation}"

    @property
    def dirname(self) -> str:
        return self.name.replace(" ", "_")


@dataclass
class Comparison:
    variant: Variant
    steps: int
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_tensor: str = ""
    max_loss_diff: float | None = None


# --- the plan ------------------------------------------------------------------------------------------


def plan_variants(processes: int, batch: int, accumulation: int) -> list[Variant]:
    """(a) one big batch, (b) the same with accumulation in one process, (c) DDP when launched so."""
    G = processes * batch * accumulation
    k = processes * accumulation
    if k == 1:  # one process, no accumulation: split the batch by its smallest factor
        k = next((d for d in range(2, G + 1) if G % d == 0), 1)
    checks.gate(tools.VERIFY_BATCH, k)
    variants = [Variant("one big batch", 1, G, 1), Variant("accumulation", 1, G // k, k)]
    if processes > 1:
        variants.append(Variant("DDP", processes, batch, accumulation))
    return variants


def train_samples(steps: int, global_batch: int, micro_batch: int) -> int:
    """steps x G minus (one micro-batch + 1): the last window is partial, its last batch short."""
    return steps * global_batch - min(micro_batch + 1, global_batch - 1)


def zero_dropout(model_config: dict[str, Any]) -> dict[str, Any]:
    """`model_config` with every dropout probability of its model type set to 0."""
    from transformers import AutoConfig

    spec = dict(model_config)
    try:
        defaults = AutoConfig.for_model(spec["model_type"]).to_dict()
    except (ValueError, KeyError):  # an unknown model type: build_model will say so
        defaults = {}
    for key, value in {**defaults, **spec}.items():
        if "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            spec[key] = 0.0
    return spec


def fixed_randomness(cfg: TrainConfig, processes: int) -> list[str]:
    """Overrides that remove the randomness which would differ between the variants."""
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    checks.gate(tools.VERIFY_DROPOUT, cfg, keys)
    overrides = []
    if "dropout" in keys:
        overrides.append("dropout=0.0")
    else:
        overrides.append(f"model_config={json.dumps(zero_dropout(cfg.model_config))}")
    if getattr(cfg, "peft", None) and cfg.peft.get("dropout"):  # LoRA's own dropout
        overrides.append("peft.dropout=0.0")
    if cfg.random_flip:  # each process would flip its images with its own random draws
        overrides.append("random_flip=false")
    return overrides


def variant_args(variant: Variant, recipe: list[str], samples: int, out_dir: Path) -> list[str]:
    """The run.py arguments of one variant: the recipe, then what the check fixes (later keys win)."""
    fixed: dict[str, Any] = {
        "per_device_train_batch_size": variant.batch,
        "gradient_accumulation_steps": variant.accumulation,
        "max_train_samples": samples,
        "num_train_epochs": 1,
        "max_steps": None,
        "output_dir": str(out_dir),
        "overwrite_output_dir": True,
        "resume_from_checkpoint": None,
        "logging_steps": 1,
        "eval_steps": None,
        "save_steps": None,
        "save_at_epoch_end": False,
        "report_to": [],
        "max_eval_samples": 8,
        "max_test_samples": 8,
        "model_parallel": False,
        "pipeline_chunks": 1,
        "push_to_hub_model_id": None,  # never upload from a check (a key a later version may have)
    }
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    fixed = {k: v for k, v in fixed.items() if k in keys}
    # the user's value of a key the check fixes is left out, not overridden (run.py would warn of a key given twice)
    kept = [item for i, item in enumerate(recipe) if item.startswith("-") or (i and recipe[i - 1] == "--config")
            or item.partition("=")[0].strip() not in fixed]  # fmt: skip
    return [*kept, *(f"{k}={json.dumps(v)}" for k, v in fixed.items())]


# --- running and comparing ------------------------------------------------------------------------------


def run_in_process(args: list[str], said: checks.Said | None = None) -> None:
    """Train one variant here, then clear Accelerate's singletons for the next one."""
    from accelerate.state import AcceleratorState, GradientState

    from finetune.run import main as train_main  # torch: only once the command line parsed

    try:
        train_main.__wrapped__(args, said=said)  # its mistakes reach verify's own one line (exit_on_user_error)
    except UserError as e:
        found = checks.first(tools.VERIFY_VARIANT_FAILED, e)  # said in the check's words
        if found:
            raise checks.refusal(*found) from None
        raise
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def run_single_process(runs: list[list[str]]) -> None:
    """Train variants one after another in a plain single-process Python (one import for all of
    them), outside the launcher's process group: its environment variables are removed."""
    env = {
        k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }
    env["ACCELERATE_MIXED_PRECISION"] = "no"
    code = "import json, sys; from finetune.verify import run_in_process; [run_in_process(a) for a in json.loads(sys.argv[1])]"
    result = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], env=env)
    if result.returncode != 0:
        raise RuntimeError(f"the single-process reference runs failed (exit {result.returncode})")


def _losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in RunDir(run_dir).metrics.read_text().splitlines() if line]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def compare(reference_dir: Path, run_dir: Path, variant: Variant) -> Comparison:
    """How far `run_dir`'s exported weights and logged losses are from the reference run's."""
    from safetensors.torch import load_file

    ref = load_file(RunDir(reference_dir).model / "model.safetensors")
    got = load_file(RunDir(run_dir).model / "model.safetensors")
    if ref.keys() != got.keys():
        raise RuntimeError(
            f"{variant.name} exported other tensors than the reference: {sorted(ref.keys() ^ got.keys())[:5]}"
        )
    steps = json.loads(RunDir(run_dir).results.read_text())["step"]
    result = Comparison(variant, steps)
    for name, r in ref.items():
        if not r.numel():
            continue
        r, g = r.double(), got[name].double()
        diff, scale = (r - g).abs().max().item(), r.abs().max().item()
        if diff > result.max_abs or not result.worst_tensor:
            result.max_abs, result.worst_tensor = diff, name
        # Relative to the tensor's largest value, for tensors of some size: an attention key bias gets
        # no gradient through the softmax, so it holds only rounding noise (1e-9 to 1e-5, amplified
        # by AdamW) and would make the relative difference look huge (0.1 to 0.7) for no reason.
        if scale >= RELATIVE_FLOOR:
            result.max_rel = max(result.max_rel, diff / scale)
    ref_loss, got_loss = _losses(reference_dir), _losses(run_dir)
    common = ref_loss.keys() & got_loss.keys()
    if common:
        result.max_loss_diff = max(abs(ref_loss[s] - got_loss[s]) for s in common)
    return result


def batchnorm_reasons(cfg: TrainConfig, reference_dir: Path, variants: list[Variant]) -> dict[str, str]:
    """The variants that a BatchNorm model trains differently from one big batch by design, and why
    (docs/topologies.md, "BatchNorm"): in training mode each micro-batch is normalised by its own mean
    and variance, so a batch of G/k is another function than one of G. Frozen (freeze_batchnorm=true)
    every BatchNorm uses its loaded statistics and all the equalities hold; sync_batchnorm=true makes
    DDP's statistics those of every process's batch together, so DDP without accumulation holds too."""
    from safetensors import safe_open

    with safe_open(str(RunDir(reference_dir).model / "model.safetensors"), "pt") as f:
        if cfg.freeze_batchnorm or not any(k.endswith("running_mean") for k in f.keys()):
            return {}
    why = "BatchNorm normalises each micro-batch of {} by its own statistics (freeze_batchnorm=true makes it equal)"
    reasons = {}
    for v in variants[1:]:
        if v.processes > 1 and cfg.sync_batchnorm and v.accumulation == 1:
            continue  # SyncBatchNorm: the statistics of the global batch, as one big batch has them
        reasons[v.name] = why.format(v.batch)
    return reasons


def table(comparisons: list[Comparison], reference: Variant, reference_steps: int, tolerance: float,
          expected: dict[str, str]) -> bool:
    """Print a row per variant against the reference; True when each agrees or differs by design."""
    print(
        f"\n{'variant':<15} {'processes x batch x accumulation':<34} {'steps':>5} {'max |Δ param|':>14} "
        f"{'max rel Δ':>10} {'max |Δ loss|':>13}"
    )
    print(f"{reference.name:<15} {reference.shape:<34} {reference_steps:>5} {'(reference)':>14}")
    ok = True
    for c in comparisons:
        agrees = c.max_abs <= tolerance and c.steps == reference_steps and math.isfinite(c.max_abs)
        by_design = c.variant.name in expected and c.steps == reference_steps
        ok &= agrees or by_design
        loss = f"{c.max_loss_diff:.1e}" if c.max_loss_diff is not None else "-"
        verdict = "ok" if agrees else "differs by design" if by_design else "DIFFERENT"
        print(
            f"{c.variant.name:<15} {c.variant.shape:<34} {c.steps:>5} {c.max_abs:>14.1e} {c.max_rel:>10.1e} "
            f"{loss:>13}   {verdict}"
        )
    return ok


def report(
    comparisons: list[Comparison],
    reference: Variant,
    reference_steps: int,
    tolerance: float,
    learning_rate: float,
    moved: bool = True,
    expected: dict[str, str] | None = None,
) -> bool:
    """Print the table; True when every variant agrees with the reference within `tolerance` and the
    weights `moved` (not one step at learning rate 0, where every variant agrees trivially).

    A wrong gradient (a bad divisor, an unmasked duplicate) moves the weights by about the learning
    rate per step. fp32 rounding moves them by far less, but AdamW divides by sqrt(v) + eps, so in a
    gradient that is nearly zero (a sum of contributions that cancel, e.g. a rare token's embedding
    row) a rounding error can reach a few percent of the learning rate: a pretrained MiniLM at
    learning_rate=1e-3 differs by ~1.4e-5 between batchings that are mathematically equal (2.4e-7
    with adam_epsilon=1e-6). The failure message says where a difference stands on that scale.
    `expected`: the variants a BatchNorm model trains differently by design (`batchnorm_reasons`), with
    why: they are shown, not failed.
    """
    expected = expected or {}
    ok = table(comparisons, reference, reference_steps, tolerance, expected)
    for name, why in expected.items():
        print(f"note: {name} is not expected to equal one big batch: {why}")
    comparisons = [c for c in comparisons if c.variant.name not in expected]
    if not moved:
        print("FAILED: the one optimizer step ran at learning rate 0 (the first step of its warm-up), so no "
              "variant's weights moved and their agreement says nothing; give more training data or --steps, "
              "or warmup_ratio=0")  # fmt: skip
        return False
    if ok and expected:
        held = "".join(f"{c.variant.name} agrees with one big batch within {tolerance:g}; " for c in comparisons)
        print(f"OK: {held}{' and '.join(expected)} differ{'s' if len(expected) == 1 else ''} by design (BatchNorm)")
    elif ok:
        print(f"OK: every variant agrees with one big batch within {tolerance:g}")
    else:
        for c in comparisons:
            if c.steps != reference_steps:
                print(f"FAILED: {c.variant.name} trained {c.steps} steps, the reference {reference_steps}")
            elif not c.max_abs <= tolerance:
                print(
                    f"FAILED: {c.variant.name} differs from one big batch by {c.max_abs:.2e} (> {tolerance:g}), "
                    f"most in {c.worst_tensor}"
                )
        worst = max(c.max_abs for c in comparisons)
        if math.isfinite(worst) and worst < 0.05 * learning_rate:
            print(
                f"note: {worst:.1e} is {100 * worst / learning_rate:.1f}% of the learning rate {learning_rate:g}; a wrong "
                "gradient shows at about the learning rate, while fp32 rounding amplified by AdamW in near-zero "
                "gradients reaches a few percent of it. Rerun with adam_epsilon=1e-6: rounding shrinks with it, "
                "a real mismatch does not"
            )
    return ok


# --- command line ---------------------------------------------------------------------------------------


@dataclass
class Options:
    config: str | None
    overrides: list[str]
    steps: int
    tolerance: float
    keep: str | None


def _number(name: str, kind: type, check, requirement: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{name} must be {requirement}, got {value}")
        return value

    return parse


def parse_args(argv: list[str]) -> Options:
    hint = "options are --config, --steps, --tolerance, --keep; settings are key=value"
    parser = ArgumentParser(prog="python -m finetune.verify", description=__doc__, hint=hint)
    parser.add_argument("--config", metavar="PATH", help="the recipe to check (default: the MiniLM recipe)")
    parser.add_argument(
        "--steps", type=_number("--steps", int, lambda v: v >= 1, "at least 1"), default=DEFAULT_STEPS
    )
    parser.add_argument(
        "--tolerance",
        type=_number("--tolerance", float, lambda v: v > 0, "positive"),
        default=DEFAULT_TOLERANCE,
    )
    parser.add_argument("--keep", metavar="DIR", help="keep the runs here (an empty or new folder)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="override any setting of the recipe"
    )
    args = parser.parse_intermixed_args(argv)
    checks.gate(tools.VERIFY_KEEP, args.keep)
    return Options(args.config, args.overrides, args.steps, args.tolerance, args.keep)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status (0 agree, 1 differ)."""
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ["ACCELERATE_MIXED_PRECISION"] = "no"  # fp32, whatever the accelerate config says
    os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # no TF32 in cuBLAS/cuDNN (read at CUDA init)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))

    cfg = load_config(opts.config, opts.overrides)  # the user's recipe, checked as run.py would
    variants = plan_variants(processes, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps)
    reference, accumulation = variants[0], variants[1]
    samples = train_samples(opts.steps, reference.batch, accumulation.batch)
    # The recipe, then the user's overrides (which may put max_grad_norm back), then what must be fixed.
    recipe = ([f"--config={opts.config}"] if opts.config else []) + [
        "max_grad_norm=null",
        *opts.overrides,
        *fixed_randomness(cfg, processes),
    ]
    root = Path(opts.keep) if opts.keep else Path(tempfile.mkdtemp(prefix="finetune-verify-"))
    args = {v: variant_args(v, recipe, samples, root / v.dirname) for v in variants}
    if rank == 0:
        print(
            f"finetune.verify: {opts.steps} optimizer steps on {samples} samples, global batch {reference.batch}, "
            f"fp32, dropout off; variants: " + ", ".join(f"{v.name} ({v.shape})" for v in variants)
            + ("" if processes > 1 else "; one process, so no DDP variant (launched with --num_processes 2 or "
               "more, it adds one)")  # fmt: skip
        )

    said = checks.Said()  # each variant reads the same data: its warnings said once, not once a variant
    try:
        if processes > 1:
            run_in_process(args[variants[-1]])  # every process trains the DDP variant together
            if rank != 0:
                return 0
            run_single_process([args[v] for v in variants[:-1]])
        else:
            for v in variants:
                run_in_process(args[v], said)
        comparisons = [compare(root / reference.dirname, root / v.dirname, v) for v in variants[1:]]
        reference_steps = json.loads(RunDir(root / reference.dirname).results.read_text())["step"]
        # the data held fewer samples than the check takes (after a held-out share)
        checks.gate(tools.VERIFY_STEPS, reference_steps, opts.steps, samples, said=said)
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else math.ceil(cfg.warmup_ratio * reference_steps)
        moved = not (reference_steps == 1 and warmup >= 1)  # finetune/steps.py: a warm-up's first step has rate 0
        expected = batchnorm_reasons(cfg, root / reference.dirname, variants)
        ok = report(comparisons, reference, reference_steps, opts.tolerance, cfg.learning_rate, moved, expected)
    finally:
        if not opts.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
