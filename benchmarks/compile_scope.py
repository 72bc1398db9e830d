"""Compiled whole or region by region: what `torch_compile=true` costs and gives for each scope.

    python -m benchmarks.compile_scope --out benchmarks/results     # about 8 minutes on 2 cores
    python -m benchmarks.compile_scope --smoke --out /tmp/cs        # a tiny model, a few steps: the test's run

Runs the full-data recipe (`finetune/configs/bert_rotten_tomatoes_full.yaml`) with `torch_compile=true
length_buckets=4` for `--steps` optimizer steps, once per scope, each in a fresh process with its own
empty inductor cache (`TORCHINDUCTOR_CACHE_DIR`), so neither reuses the other's kernels:

- **whole**: the app as it is (`finetune.shapes.compile_model`: `model.compile()`).
- **regional**: the same run with the model compiled by accelerate's regional compilation instead
  (`compile_regions_deepspeed`, in place: each repeated block compiled once and shared, the rest
  compiled part by part), the scope the app used before.

Each row is read from the run's own results.json: the phase seconds (`seconds`), the graphs dynamo
compiled in the warm-up and after it (`shapes`), and the test accuracy. Under `--precision` (default
bf16 where torch reports native bf16, as `cpu_bf16.yaml` runs the recipe; else no). Writes
`compile_scope.json` and `compile_scope.md` into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.report import machine, machine_line

RECIPE = "finetune/configs/bert_rotten_tomatoes_full.yaml"
SCOPES = ("whole", "regional")
TINY = ("model_config={model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, "
        "intermediate_size: 64}", "tokenizer_name=data/bert_minilm_l6_uncased", "model_name_or_path=null",
        "max_train_samples=256", "max_eval_samples=64")  # fmt: skip


def run_one(scope: str, argv: list[str]) -> None:
    """In this process: the app's `main` with the model compiled in `scope`."""
    import finetune.run

    if scope == "regional":
        from accelerate.utils.other import compile_regions_deepspeed  # in place, for any module

        from finetune import shapes

        def regional(model, dynamic: bool, mode: str = "default") -> None:
            shapes.raise_recompile_limits()  # as the app's compile_model
            compile_regions_deepspeed(model, dynamic=dynamic, mode=mode)

        assert finetune.run.compile_model is shapes.compile_model
        finetune.run.compile_model = regional
    finetune.run.main(argv)


def measure(scope: str, steps: int, precision: str, smoke: bool, work: Path) -> dict:
    out = work / scope
    argv = ["--config", RECIPE, f"max_steps={steps}", "torch_compile=true", "length_buckets=4",
            f"output_dir={out}", "overwrite_output_dir=true", f"eval_steps={steps}", "save_at_epoch_end=false",
            *(TINY if smoke else ())]  # fmt: skip
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{scope}"),
           "ACCELERATE_MIXED_PRECISION": precision, "HF_HUB_OFFLINE": "1"}  # fmt: skip
    code = f"import sys; from benchmarks.compile_scope import run_one; run_one({scope!r}, sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((out / "results.json").read_text())
    return {"scope": scope, "seconds": results["seconds"], "shapes": results["shapes"],
            "test_accuracy": results["test"]["accuracy"]}  # fmt: skip


def markdown(report: dict) -> str:
    lines = [
        f"# Compiled whole or region by region ({report['steps']} steps of the full-data recipe)",
        "",
        machine_line(report["machine"]) + f"; precision {report['precision']}.",
        f"Command: `{report['command']}`",
        "",
        "| scope | compile s | train s | evaluate s | graphs in warm-up | graphs after | test accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        s, g = row["seconds"], row["shapes"]
        lines.append(f"| {row['scope']} | {s['compile']:.1f} | {s['train']:.1f} | {s['evaluate']:.1f} | "
                     f"{g['graphs_compiled_in_warm_up']} | {g['graphs_compiled_after_warm_up']} | "
                     f"{row['test_accuracy']:.4f} |")  # fmt: skip
    whole, regional = report["rows"]
    lines += ["", f"Whole / regional compile seconds: {whole['seconds']['compile'] / regional['seconds']['compile']:.2f}x; "
              f"train seconds: {whole['seconds']['train'] / regional['seconds']['train']:.2f}x."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    from finetune.runtime import native_bf16

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of each run (default 60)")
    parser.add_argument("--precision", choices=("no", "bf16"), default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny model from a config, 256 samples")
    args = parser.parse_args(argv)
    precision = args.precision or ("bf16" if native_bf16() else "no")
    with tempfile.TemporaryDirectory() as work:
        rows = [measure(scope, args.steps, precision, args.smoke, Path(work)) for scope in SCOPES]
    report = {"machine": machine(), "precision": precision, "steps": args.steps, "rows": rows,
              "command": "python -m benchmarks.compile_scope " + " ".join(argv if argv is not None else sys.argv[1:])}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_scope.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "compile_scope.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
