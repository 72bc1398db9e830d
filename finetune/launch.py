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

from finetune.errors import EXIT_DIVERGED, EXIT_USER_ERROR, UserError
from finetune.exits import ArgumentParser, exit_on_user_error
from finetune.signals import forwarded_to_children

# Exit statuses after which the training process has printed its own one-line reason.
EXPLAINED = {EXIT_USER_ERROR, EXIT_DIVERGED, 128 + signal.SIGINT, 128 + signal.SIGTERM}


def check_launch_args(args) -> None:
    """What accelerate would fail on with a traceback, or only after starting processes."""
    from accelerate.commands.config.config_args import default_config_file, load_config_from_file

    if args.config_file is not None:
        path = Path(args.config_file)
        if path.is_dir():
            raise UserError(
                f"accelerate config {path} is a folder; pass the config file (see accelerate_configs/)"
            )
        if not path.is_file():
            raise UserError(
                f"accelerate config {path} does not exist; pass an existing file (see accelerate_configs/), "
                "or leave out --config_file to use the one `accelerate config` wrote"
            )
    elif Path(default_config_file).is_file() and not args.cpu:
        path = Path(default_config_file)  # written by `accelerate config`; accelerate reads it unless --cpu
    else:
        path = None
    config = None
    if path is not None:
        try:
            config = load_config_from_file(str(path))
        except Exception as e:  # YAML/JSON syntax, unknown keys, wrong values
            detail = " ".join(str(e).split())[:300]
            if _is_a_recipe(path):
                raise UserError(f"{path} is a finetune recipe, not an accelerate config: pass it to finetune/run.py "
                                "as --config, and an accelerate config (accelerate_configs/) as --config_file") from None
            raise UserError(f"accelerate config {path} is not a valid accelerate config: {detail}") from None
        # accelerate launch --cpu drops an FSDP config's FSDP (and its processes) without a word.
        if args.cpu and getattr(config, "distributed_type", None) == "FSDP":
            raise UserError(
                f"accelerate config {path} asks for FSDP, which runs on GPUs only, and --cpu would train "
                "without it; use accelerate_configs/cpu_ddp.yaml on a CPU"
            )
    check_launch_values(args, config, path)
    script = args.training_script
    if not (args.module or args.no_python) and not Path(script).is_file():
        raise UserError(f"script {script} does not exist; the training script is finetune/run.py")


def _is_a_recipe(path: Path) -> bool:
    """A YAML mapping whose keys are the app's settings (task, model_name_or_path, ...), not accelerate's."""
    import dataclasses

    import yaml

    from finetune.config import TrainConfig, read_yaml

    try:
        raw = read_yaml(path.read_text())  # as a recipe is read
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return isinstance(raw, dict) and bool(raw) and sum(k in names for k in raw) * 2 > len(raw)


WHOLE_NUMBERS = ("num_processes", "num_machines", "machine_rank", "main_process_port")


def check_launch_values(args, config, path: Path | None) -> None:
    """Values accelerate takes as they come and fails on later — in the launcher (a division by zero
    machines, an assertion) or in every training process (an unknown precision) — with a traceback, or
    that start nothing at all (zero processes). A flag wins over the config, as in accelerate."""
    from accelerate.utils import DynamoBackend, PrecisionType

    def value(name: str):
        flag = getattr(args, name, None)
        if flag is not None:
            return flag, f"--{name}"
        held, where = getattr(config, name, None), f"in accelerate config {path}"
        if name in WHOLE_NUMBERS and held is not None and (isinstance(held, bool) or not isinstance(held, int)):
            raise UserError(f"{name} {held!r} ({where}) is not a whole number; write it as one (e.g. {name}: 2)")
        return held, where

    processes, where = value("num_processes")
    # -1 in a config is accelerate's "not set" (the launcher then counts the GPUs).
    if processes is not None and processes < 1 and not (processes == -1 and where != "--num_processes"):
        raise UserError(f"num_processes must be at least 1, got {processes} ({where})")
    kind = getattr(getattr(config, "distributed_type", None), "value", getattr(config, "distributed_type", None))
    mpirun = getattr(args, "mpirun_hostfile", None) or (getattr(config, "mpirun_config", None) or {}).get(
        "mpirun_hostfile")
    if str(kind) == "MULTI_CPU" and (processes or 1) > 1 and not mpirun and not getattr(args, "multi_gpu", False):
        raise UserError(
            f"accelerate config {path} asks for MULTI_CPU with {processes} processes, which accelerate starts only "
            "through mpirun (mpirun_config): it would train in one process; for several CPU processes on one "
            "machine use accelerate_configs/cpu_ddp.yaml (distributed_type MULTI_GPU with use_cpu: true)"
        )
    if str(kind) == "NO" and (processes or 1) > 1 and not getattr(args, "multi_gpu", False):  # edited by hand
        raise UserError(
            f"num_processes {processes} ({where}) with distributed_type NO: accelerate starts one process and it "
            "would train alone; for several CPU processes use accelerate_configs/cpu_ddp.yaml (on GPUs, "
            "distributed_type MULTI_GPU), or set num_processes: 1"
        )
    machines, where = value("num_machines")
    if machines is not None and machines < 1:
        raise UserError(f"num_machines must be at least 1, got {machines} ({where})")
    rank, where = value("machine_rank")
    if rank is not None and not 0 <= rank < (machines or 1):
        raise UserError(
            f"machine_rank {rank} ({where}) is not one of the {machines or 1} machines: give 0 to {(machines or 1) - 1}"
        )
    port, where = value("main_process_port")
    if port is not None and not 0 <= port < 65536:  # 0: a free one
        raise UserError(
            f"main_process_port {port} ({where}) is not a port: give one from 0 (any free one) to 65535"
        )
    precision, where = value("mixed_precision")
    precisions = [p.value for p in PrecisionType]
    precision = getattr(precision, "value", precision)  # an enum member, or the string as written
    if precision is not None and str(precision).lower() not in precisions:
        raise UserError(f"mixed_precision {precision!r} ({where}) is not one of {', '.join(precisions)}")
    backend = (getattr(config, "dynamo_config", None) or {}).get("dynamo_backend")
    backend = getattr(backend, "value", backend)
    backends = [b.value for b in DynamoBackend]
    if args.dynamo_backend is None and backend is not None and str(backend).upper() not in backends:
        raise UserError(
            f"dynamo_backend {backend!r} (in accelerate config {path}) is not one of "
            f"{', '.join(b.lower() for b in backends)}"
        )


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
        unknown = message.split(":", 1)[1].split() if message.startswith("unrecognized arguments:") else []
        if any(a == "--config" or a.startswith("--config=") for a in unknown):  # the recipe, before the script
            raise UserError("--config (the recipe) is finetune/run.py's option: put it after the script, as in "
                            "finetune-launch finetune/run.py --config finetune/configs/<recipe>.yaml; the "
                            "launcher's own is --config_file (accelerate_configs/)")
        raise UserError(f"{message}; see finetune-launch --help (accelerate launch's arguments)")

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
            detail = " ".join(str(e).split())[:200] if not isinstance(e, AttributeError) else "an empty file"
            raise UserError(f"accelerate config {path} exists but is not a valid accelerate config ({detail}); "
                            "fix it, or delete it and run finetune-config again") from None  # fmt: skip
        return f"accelerate config {path} exists; left as it is"
    try:
        write_basic_config(mixed_precision="no", save_location=str(path))
        config = json.loads(path.read_text())
        threads = psutil.cpu_count(logical=False) or 1
        if config.get("use_cpu") and threads > 1:
            config["mpirun_config"] = {"num_cpu_threads_per_process": threads}
            path.write_text(json.dumps(config, indent=2))
    except OSError as e:
        raise UserError(f"cannot write accelerate's config {path}: {e.strerror or e}") from None
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
