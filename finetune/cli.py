"""The command line of finetune/run.py: parsed once, and `--help` and setting mistakes answered, before
torch is imported (finetune/config.py and what it reads import no deep-learning library).

    finetune-train --help                       # the settings, their types, defaults and meanings
    python finetune/run.py learning_rat=1e-4    # error: unknown config key 'learning_rat'; did you mean learning_rate?

`parse_command_line` gives the run its `Command`: the config, the mode flags, the run's own saved recipe
when a resume names no --config, and the `Said` that the run's warnings go through (the command line's
are its first).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from finetune import checks
from finetune.checks import settings
from finetune.config import (
    DEFAULT_RECIPE,
    SECTIONS,
    TrainConfig,
    field_types,
    load_config,
    parse_override,
    section_fields,
    settings_from_flags,
)
from finetune.errors import first_line
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.layout import RunDir
from finetune.rundir import resumed_run_config

USAGE = """Fine-tune a text, token or image classifier: one loop, every topology through Accelerate.

    accelerate launch finetune/run.py                                   # MiniLM on rotten_tomatoes
    accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml
    accelerate launch finetune/run.py --config <recipe.yaml> learning_rate=3e-5 num_train_epochs=1
    accelerate launch finetune/run.py --dry-run                         # the plan, without training
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml finetune/run.py
    accelerate launch --config_file accelerate_configs/model_parallel.yaml finetune/run.py \\
        model_parallel=true devices=cuda:0,cpu pipeline_chunks=4 [--plan-only]"""


@dataclass
class Command:
    """A parsed command line: what to run, and how."""

    cfg: TrainConfig
    dry_run: bool
    plan_only: bool
    saved: Path | None  # the run's own config.yaml (or a checkpoint's manifest) a resume reads, if no --config
    said: checks.Said  # the run's warnings, the command line's first


def parse_command_line(argv: list[str], said: checks.Said | None = None) -> Command:
    """The command: `--key value` and `--key=value` work as `key=value`; a key given twice is used with its
    last value, with a warning. `said`: the warnings of the run (a new one's when not given)."""
    hint = "options are --config PATH, --dry-run and --plan-only; settings are key=value (--help lists them)"
    parser = ArgumentParser(prog="finetune/run.py", description=USAGE, hint=hint, add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="this help; with --config, the recipe's values")
    parser.add_argument("--config", metavar="PATH", help="a recipe YAML (default: the MiniLM recipe)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (devices, steps, learning rates) and exit")
    parser.add_argument("--plan-only", action="store_true", help="print the model-parallel plan and exit")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="override any setting of the recipe")
    for token in argv:  # --do_train, --fp16: transformers' flags, whatever comes after them
        checks.gate(settings.OTHER_TOOLS_FLAG, token)
    args = parser.parse_intermixed_args(settings_from_flags(argv))  # key=value before and after the flags
    said = said if said is not None else checks.Said()
    if args.help:
        try:
            print(f"{parser.format_help()}\n{settings_help(args.config, said=said)}", flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        raise SystemExit(0)
    checks.gate(settings.MODES, args.dry_run, args.plan_only)
    saved = resumed_run_recipe(args.settings, said) if args.config is None else None
    items = args.settings
    if saved is not None and not any(s.partition("=")[0].strip() == "output_dir" for s in items):
        # The run the checkpoint is in, not the output_dir its config names: a copied or moved run
        # continues where it is, and never writes into the folder it was copied from.
        run = saved.parent if RunDir(saved.parent).config == saved else saved.parents[2]  # <run>/checkpoints/<step>/
        items = [*items, f"output_dir={run}"]
    cfg = load_config(saved or args.config, items, saved=saved is not None, said=said)
    given: dict[str, object] = {}
    for item in items:
        key, value = parse_override(item)
        if key in given:
            checks.gate(settings.GIVEN_TWICE, key, given[key], value, said=said)
        given[key] = value
    checks.gate(settings.GIVEN_BESIDE, given, cfg, said=said)
    checks.gate(settings.MEMORY, cfg, machine_memory())  # before any data or model is read
    for key in ("train_file", "validation_file", "test_file") if saved is not None else ():
        checks.gate(settings.RESUMED_DATA, key, getattr(cfg, key), set(given))  # the data moved since the run
    return Command(cfg, args.dry_run, args.plan_only, saved, said)


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (os.sysconf: no psutil), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return None


@exit_on_user_error
def answer_early(argv: list[str]) -> Command:
    """`--help`, and a mistake in the options or settings: answered (one line, exit 2) before the
    training module imports torch; a command that parses goes on to finetune.run as it was parsed."""
    return parse_command_line(argv)


def resumed_run_recipe(overrides: list[str], said: checks.Said | None = None) -> Path | None:
    """The saved config.yaml of the run that `overrides` resume (`resume_from_checkpoint=latest`, in
    output_dir or the default recipe's; or a checkpoint directory), for a command that names no recipe."""
    given = dict(parse_override(item) for item in overrides)
    default = (yaml.safe_load(DEFAULT_RECIPE.read_text()) or {}).get("output_dir", "")
    return resumed_run_config(given.get("resume_from_checkpoint"), given.get("output_dir") or default, said)


# --- --help ---------------------------------------------------------------------------------------


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args if a is not type(None)) + " | null"
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_help(recipe: str | Path | None = None, names: typing.Collection[str] | None = None,
                  said: checks.Said | None = None) -> str:
    """Every setting (or those in `names`), grouped as in TrainConfig: `name: type = default`, its
    help, and the value the recipe sets where it differs from the default."""
    path = Path(recipe) if recipe is not None else DEFAULT_RECIPE
    unread = None
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:  # the help still prints, with the defaults; the first line says why
        values, unread = {}, "not found" if isinstance(e, FileNotFoundError) else f"not read ({first_line(e)})"
    values = values if isinstance(values, dict) else {}
    hints = field_types()
    lines = [f"settings (key=value, or in a recipe; 'recipe:' is what {path.name} sets):" if unread is None else
             f"settings (key=value, or in a recipe; the recipe {path} is {unread}: the defaults are shown):"]
    checks.gate(settings.HELP, path, unread, said=said or checks.Said())
    for section in SECTIONS:
        if names is None:
            lines += ["", f"{section.TITLE}:"]
        for f in section_fields(section):
            if names is not None and f.name not in names:
                continue
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            line = f"  {f.name}: {_type_name(hints[f.name])} = {_shown(default)}"
            if f.name in values and values[f.name] != default:
                line += f"    (recipe: {_shown(values[f.name])})"
            lines += [line, f"      {f.metadata['help']}"]
    return "\n".join(lines)
