"""The console script `finetune-train`: the command line answered (`--help`, a mistake in a setting) before
torch is imported, then the run, with the command as it was parsed.

    finetune-train --help
    finetune-train --config finetune/configs/bert_ner.yaml learning_rate=3e-5
"""

from __future__ import annotations

import os
import sys

from finetune.cli import answer_early


def train() -> None:
    """The `finetune-train` console script."""
    from finetune.signals import stop_while_starting  # first of all: Ctrl-C while the rest imports

    stop_while_starting()
    command = answer_early(sys.argv[1:])
    from finetune import run  # torch and the rest: only once the command is known to parse

    run.cli(command)


if __name__ == "__main__":  # pragma: no cover - python -m finetune.console is finetune-train
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    train()
