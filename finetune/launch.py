"""`accelerate launch`, with one-line answers to launcher mistakes and signals that reach training.

    finetune-launch finetune/run.py                          # = accelerate launch finetune/run.py
    finetune-launch --config_file accelerate_configs/cpu_ddp.yaml finetune/run.py learning_rate=3e-5
    python -m finetune.launch --multi_gpu --num_processes 2 finetune/evaluate_checkpoint.py runs/x/model

It takes exactly `accelerate launch`'s arguments (accelerate's own parser reads them) and runs
accelerate's own launchers; what it changes is what a person or a scheduler sees around them:

- a `--config_file` that does not exist or does not parse, or a script that does not exist: one
  `error:` line and exit status 2 (accelerate launch: a traceback, exit 1);
- the training processes' exit status is the launcher's — 2 for a user mistake, 3 for a diverged
  run, 130/143 after a signal (finetune/errors.py) — with nothing after the process's own message
  (accelerate launch: exit 1 and a CalledProcessError or ChildFailedError traceback);
- SIGTERM or SIGINT sent to the launcher alone reaches the training processes, which finish the
  step, save a checkpoint and exit, and the launcher waits for them. (accelerate's one-process
  launcher does not forward SIGTERM; its multi-process one, torchrun, does, then raises.)

Plain `accelerate launch` stays supported: the training process also asks the kernel for SIGTERM
when its launcher dies (`finetune.signals.stop_with_launcher`), so killing that launcher still saves a
checkpoint, but the launcher has already exited by then.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

from finetune import checks
from finetune.checks import launch
from finetune.config import TrainConfig, read_yaml
from finetune.errors import EXIT_DIVERGED, EXIT_USER_ERROR
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.signals import forwarded_to_children

# Exit statuses after which the training process has printed its own one-line reason.
EXPLAINED = {EXIT_USER_ERROR, EXIT_DIVERGED, 128 + signal.SIGINT, 128 + signal.SIGTERM}


def check_launch_args(args) -> None:
    """What accelerate would fail on with a traceback, or only after starting processes."""
    from accelerate.commands.config.config_args import default_config_file, load_config_from_file

    if args.config_file is not None:
        path = Path(args.config_file)
        checks.gate(launch.CONFIG_FILE, path)
    elif Path(default_config_file).is_file() and not args.cpu:
        path = Path(default_config_file)  # written by `accelerate config`; accelerate reads it unless --cpu
    else:
        path = None
    config = None
    if path is not None:
        try:
            config = load_config_from_file(str(path))
        except Exception as e:  # YAML/JSON syntax, unknown keys, wrong values
            raise checks.explain(launch.CONFIG_FAILED, path, e, _is_a_recipe(path)) from None
        checks.gate(launch.CONFIG, args, config, path)  # accelerate launch --cpu drops FSDP without a word
    check_launch_values(args, config, path)
    checks.gate(launch.SCRIPT, args)


def _is_a_recipe(path: Path) -> bool:
    """A YAML mapping whose keys are the app's settings (task, model_name_or_path, ...), not accelerate's."""
    import dataclasses

    import yaml

    try:
        raw = read_yaml(path.read_text())  # as a recipe is read
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return isinstance(raw, dict) and bool(raw) and sum(k in names for k in raw) * 2 > len(raw)


def check_launch_values(args, config, path: Path | None) -> None:
    """Values accelerate takes as they come and fails on later — in the launcher (a division by zero
    machines, an assertion) or in every training process (an unknown precision) — with a traceback, or
    that start nothing at all (zero processes). A flag wins over the config, as in accelerate."""
    checks.gate(launch.VALUES, launch.Values(args, config, path))


def run_launcher(args) -> int:
    """accelerate's `launch_command`, returning the training processes' exit status."""
    from accelerate.commands.launch import launch_command
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # One process: accelerate waits on it in `subprocess.Popen.wait`, which Python resumes after a
    # handler. Several: torchrun installs its own handlers, which forward the signal and raise.
    # torchrun's log lines about a failed rank repeat what the rank said; the summary below replaces them.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args.quiet = False  # quiet makes accelerate exit 1 instead of raising with the status
    try:
        with forwarded_to_children():
            launch_command(args)
        return 0
    except subprocess.CalledProcessError as e:  # the one-process launcher
        if e.returncode > 0:  # the process said why (or printed its traceback)
            return e.returncode
        name = signal.Signals(-e.returncode).name  # ended by a signal it did not handle
        if -e.returncode in (signal.SIGTERM, signal.SIGINT):
            print(f"stopped: the training process ended on {name} outside the training loop (or on a "
                  "second signal); this signal wrote no checkpoint", file=sys.stderr)  # fmt: skip
        else:
            hint = " (often the kernel's out-of-memory killer)" if name == "SIGKILL" else ""
            print(f"error: the training process was killed by {name}{hint}", file=sys.stderr)
        return 128 - e.returncode
    except ChildFailedError as e:  # torchrun: every failed rank, with its exit status
        # The status that explains the stop: one a rank explained in its own line, else the first
        # failure's (torchrun then stops the others: -SIGTERM, or a traceback from the interruption).
        explained = sorted(f.exitcode for f in e.failures.values() if f.exitcode in EXPLAINED)
        if explained:
            return explained[0]
        first = min(e.failures.values(), key=lambda f: f.timestamp).exitcode
        ranks = ", ".join(f"rank {r}: exit {f.exitcode}" for r, f in sorted(e.failures.items()))
        print(f"error: training processes failed ({ranks}); see their output above", file=sys.stderr)
        return first if first > 0 else 128 - first
    except SignalException as e:  # torchrun forwarded it and waited for the processes
        name = signal.Signals(e.sigval).name
        if e.sigval not in (signal.SIGTERM, signal.SIGINT):  # those: process 0's `stopped:` line says it
            print(
                f"stopped by {name}: the training processes were ended without a checkpoint", file=sys.stderr
            )
        return 128 + int(e.sigval)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    parser.prog = "finetune-launch"

    def usage_error(message: str):  # one line, not accelerate's page of usage
        raise checks.explain(launch.USAGE, message)

    parser.error = usage_error
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    check_launch_args(args)
    return run_launcher(args)


def cli() -> None:
    sys.exit(main())


def write_default_config(path: Path | None = None) -> str:
    """`accelerate config default`, and on a machine that trains on its CPU the one value accelerate
    launch otherwise prints a three-line notice about on every launch: its threads per process
    (accelerate's own count, the physical cores, kept under `mpirun_config`, whose keys the launcher
    reads as its arguments; the training process sets torch's threads itself: `cpu_threads`). An
    existing config is left as it is. What was done, as one line."""
    import json

    import psutil
    from accelerate.commands.config.config_args import default_json_config_file
    from accelerate.utils import write_basic_config

    path = Path(path or default_json_config_file)
    if path.exists():
        import argparse

        from accelerate.commands.config.config_args import load_config_from_file

        try:
            config = load_config_from_file(str(path))
            check_launch_values(argparse.Namespace(dynamo_backend=None), config, path)  # its values, as a launch
        except Exception as e:  # YAML/JSON syntax, unknown keys, wrong values: every launch would fail on it
            raise checks.explain(launch.DEFAULT_CONFIG, path, e) from None
        return f"accelerate config {path} exists; left as it is"
    try:
        write_basic_config(mixed_precision="no", save_location=str(path))
        config = json.loads(path.read_text())
        threads = psutil.cpu_count(logical=False) or 1
        if config.get("use_cpu") and threads > 1:
            config["mpirun_config"] = {"num_cpu_threads_per_process": threads}
            path.write_text(json.dumps(config, indent=2))
    except OSError as e:
        raise checks.explain(launch.WRITE_FAILED, path, e) from None
    return f"wrote accelerate's default config for this machine to {path}"


@exit_on_user_error
def configure(argv: list[str] | None = None) -> int:
    """finetune-config: accelerate's default config for this machine, written once (README set-up)."""
    parser = ArgumentParser(prog="finetune-config", description=write_default_config.__doc__,
                            hint="see finetune-config --help")  # fmt: skip
    parser.add_argument("--config_file", type=Path, help="where to write it (default: accelerate's default config)")
    print(write_default_config(parser.parse_args(sys.argv[1:] if argv is None else argv).config_file))
    return 0


if __name__ == "__main__":
    cli()
