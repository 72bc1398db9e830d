"""The command line of finetune/run.py: parsed, and `--help` and setting mistakes answered, before
torch is imported (finetune/config.py and what it reads import no deep-learning library).

    finetune-train --help                       # the settings, their types, defaults and meanings
    python finetune/run.py learning_rat=1e-4    # error: unknown config key 'learning_rat'; did you mean learning_rate?
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from finetune.config import (
    OTHER_TOOLS,
    TrainConfig,
    load_config,
    parse_override,
    resumed_run_recipe,
    settings_from_flags,
    settings_help,
)
from finetune.errors import ArgumentParser, UserError, exit_on_user_error, warn
from finetune.rundir import RunDir

USAGE = """Fine-tune a text, token or image classifier: one loop, every topology through Accelerate.

    accelerate launch finetune/run.py                                   # MiniLM on rotten_tomatoes
    accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml
    accelerate launch finetune/run.py --config <recipe.yaml> learning_rate=3e-5 num_train_epochs=1
    accelerate launch finetune/run.py --dry-run                         # the plan, without training
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml finetune/run.py
    accelerate launch --config_file accelerate_configs/model_parallel.yaml finetune/run.py \\
        model_parallel=true devices=cuda:0,cpu pipeline_chunks=4 [--plan-only]"""


def parse_args(argv: list[str]):
    """(the config: recipe + key=value, the mode flags, the run's own saved recipe when a resume names
    no --config). `--key value` and `--key=value` work as `key=value`."""
    hint = "options are --config PATH, --dry-run and --plan-only; settings are key=value (--help lists them)"
    parser = ArgumentParser(prog="finetune/run.py", description=USAGE, hint=hint, add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="this help; with --config, the recipe's values")
    parser.add_argument("--config", metavar="PATH", help="a recipe YAML (default: the MiniLM recipe)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (devices, steps, learning rates) and exit")
    parser.add_argument("--plan-only", action="store_true", help="print the model-parallel plan and exit")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="override any setting of the recipe")
    for token in argv:  # --do_train, --fp16: transformers' flags, whatever comes after them
        name = token[2:].split("=", 1)[0] if token.startswith("--") else None
        if name in OTHER_TOOLS:
            raise UserError(f"{token} is a flag of transformers' scripts, not of this one: {OTHER_TOOLS[name]}")
    args = parser.parse_intermixed_args(settings_from_flags(argv))  # key=value before and after the flags
    if args.help:
        try:
            print(f"{parser.format_help()}\n{settings_help(args.config)}", flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        raise SystemExit(0)
    if args.dry_run and args.plan_only:
        raise UserError("--dry-run and --plan-only print two different plans (the run's steps and learning rates; "
                        "the layer split's devices): give one of them")  # fmt: skip
    saved = resumed_run_recipe(args.settings) if args.config is None else None
    settings = args.settings
    if saved is not None and not any(s.partition("=")[0].strip() == "output_dir" for s in settings):
        # The run the checkpoint is in, not the output_dir its config names: a copied or moved run
        # continues where it is, and never writes into the folder it was copied from.
        run = saved.parent if RunDir(saved.parent).config == saved else saved.parents[2]  # <run>/checkpoints/<step>/
        settings = [*settings, f"output_dir={run}"]
    cfg: TrainConfig = load_config(saved or args.config, settings, saved=saved is not None)
    given = {s.partition("=")[0].strip() for s in settings}
    for key in ("train_file", "validation_file", "test_file") if saved is not None else ():
        path = getattr(cfg, key)
        if path and key not in given and not Path(path).expanduser().exists():  # the data moved since the run
            raise UserError(f"the run's {key} {path} is not found (moved or renamed since the run?); resume with "
                            f"{key}=<its path now> (the training file is checked against the bytes the run trained on)")
    return cfg, args, saved


def say_given_twice(settings: list[str], cfg: TrainConfig | None = None) -> None:
    """A key given twice with two values is used with its last, as argparse does, but not without a
    word (a pasted or edited command often repeats one); and a setting given that the run does not read
    beside another (validation_split_percentage beside a validation_file)."""
    given: dict[str, object] = {}
    for item in settings:
        key, value = parse_override(item)
        if key in given and given[key] != value:
            warn(f"{key} is given twice on the command line ({key}={given[key]}, then {key}={value}); the last, "
                 f"{value}, is used")  # fmt: skip
        given[key] = value
    if cfg is not None and "validation_split_percentage" in given and cfg.validation_file:
        warn(f"validation_split_percentage={given['validation_split_percentage']} is not read: a share of the "
             f"training data is held out only without a validation_file (this run's: {cfg.validation_file}); to "
             "hold out a share instead, add validation_file=null")  # fmt: skip


@exit_on_user_error
def answer_early(argv: list[str]) -> None:
    """`--help`, and a mistake in the options or settings: answered (one line, exit 2) before the
    training module imports torch; a command that parses goes on to finetune.run."""
    parse_args(argv)


def train() -> None:
    """The `finetune-train` console script."""
    from finetune.signals import stop_while_starting

    stop_while_starting()
    answer_early(sys.argv[1:])
    from finetune import run

    run.cli()


if __name__ == "__main__":  # pragma: no cover - python -m finetune.cli is finetune-train
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    train()
