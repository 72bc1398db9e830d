"""The checks layer: every refusal and warning of the app, as named rules, run at the boundary of a phase.

    from finetune import checks
    from finetune.checks import files

    checks.gate(files.BEFORE_PARSE, head, said=said)   # the first error raises; each warning is said once
    raise checks.explain(files.PARSE_FAILED, head, e)  # a library failed: the first rule that explains it

A rule is a small function with a stable id (`phase.name`) that looks at one phase's subject and returns
the line of its finding (what is wrong, then what to do) or None. `@rule` registers it in `RULES`. A phase's
module declares its rules in lists, in the order they are asked (the first that finds something wins:
that order is the precedence, written down), and the core calls one gate per list at the boundary it
guards. The core trusts what a gate let through.

    phase      module               its subject
    settings   checks/settings.py   the typed config (TrainConfig), the command line, a recipe
    files      checks/files.py      a data file: its path and head (`FileHead`), what the parser loaded
    columns    checks/columns.py    a split's columns and their values
    labels     checks/labels.py     the label column: classes, numbers, label lists, tags
    splits     checks/splits.py     the splits together: held-out shares, repeats across splits
    models     checks/models.py     model folders, configs, tokenizers, image processors, weights
    runs       checks/runs.py       the output directory, checkpoints and resumes, evaluation targets
    images     checks/images.py     image folders, and the images a split names
    inputs     checks/inputs.py     what the tokenizer makes of the training texts
    evaluation checks/evaluation.py what is evaluated, and on what
    launch     checks/launch.py     the launcher, accelerate configs, processes, devices, the step plan
    tools      checks/tools.py      the run's verdict, the search, verify, the plots command, the card

A warning is said once per run on the main process: the entry point makes one `Said` and passes it down
(a search's trials share theirs), so nothing is remembered between runs of one process. Adding a check is
one rule in one file and one case in the catalogue (tests/test_bad_input.py, keyed by rule id);
docs/bad-input.md is made from the rules' docstrings (`python -m finetune.checks > docs/bad-input.md`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from finetune.errors import UserError


@dataclass(frozen=True)
class Rule:
    """A named check: `fn(*subject)` returns its finding's line, or None."""

    id: str
    fn: Callable[..., str | None]
    warning: bool = False  # said, and the run goes on; else refused: one line, exit status 2
    local: bool = False  # met by one process alone (its share of the data): that process says it
    # What the rule reads that may still be unknown when the settings are first checked (the task and
    # problem type that the data decides): it runs once they are known (`finetune.config.resolved`).
    needs: tuple[str, ...] = ()

    def __call__(self, *subject: Any) -> str | None:
        return self.fn(*subject)

    @property
    def phase(self) -> str:
        return self.id.partition(".")[0]

    @property
    def doc(self) -> str:
        """The first paragraph of the rule's docstring: what it finds and why it matters."""
        text = (self.fn.__doc__ or "").strip()
        return " ".join(text.split("\n\n")[0].split())


RULES: dict[str, Rule] = {}


def rule(id: str, *, warning: bool = False, local: bool = False, needs: tuple[str, ...] = ()):
    """Register the function below as the rule `id` (`phase.name`, stable: the catalogue and the docs key
    on it)."""

    def register(fn: Callable[..., str | None]) -> Rule:
        if id in RULES:
            raise ValueError(f"rule {id} is defined twice")
        RULES[id] = Rule(id, fn, warning, local, needs)
        return RULES[id]

    return register


@dataclass
class Said:
    """What a run has said: each warning once, on the main process only (every process finds the same),
    and recorded with its rule id (results.json keeps them). `quiet`: nothing printed (data read again to
    compare with, whose warnings its own run said)."""

    quiet: bool = False
    lines: list[tuple[str, str]] = field(default_factory=list)  # (rule id, line), in the order said

    def warn(self, line: str, rule: str = "") -> None:
        if any(said == line for _, said in self.lines):
            return
        self.lines.append((rule, line))
        if not self.quiet and os.environ.get("RANK", "0") == "0":
            print(f"warning: {shown_rule(rule)}{line}", file=sys.stderr)

    def rules(self) -> list[str]:
        return [rule for rule, _ in self.lines]

    def record(self) -> list[dict[str, str]]:
        """As results.json holds them."""
        return [{"rule": rule, "line": line} for rule, line in self.lines]


def shown_rule(rule: str | None) -> str:
    """`[phase.name] ` before a line when FINETUNE_SHOW_RULES=1 (which rule said it), else nothing."""
    return f"[{rule}] " if rule and os.environ.get("FINETUNE_SHOW_RULES") == "1" else ""


def refusal(rule: Rule, line: str) -> UserError:
    return UserError(line, local=rule.local, rule=rule.id)


def gate(rules: Iterable[Rule], *subject: Any, said: Said | None = None, known: Callable[[Rule], bool] | None = None) -> None:
    """Ask `rules` in order about `subject`: the first error is raised (a UserError), each warning said
    once by `said`. `known`: only the rules it accepts are asked (`finetune.config`: those whose `needs`
    are known)."""
    for r in rules:
        if known is not None and not known(r):
            continue
        line = r.fn(*subject)
        if not line:
            continue
        if not r.warning:
            raise refusal(r, line)
        if said is None:
            raise TypeError(f"rule {r.id} warns, and this gate was given no Said")
        said.warn(line, r.id)


def first(rules: Iterable[Rule], *subject: Any) -> tuple[Rule, str] | None:
    """The first of `rules` that finds something, with its line."""
    for r in rules:
        line = r.fn(*subject)
        if line:
            return r, line
    return None


def explain(rules: Iterable[Rule], *subject: Any) -> UserError:
    """Why a library failed, from the first of `rules` that can tell: the error to raise (`raise
    checks.explain(...) from None`). The last rule of a list of explainers always answers."""
    found = first(rules, *subject)
    if found is None:
        raise TypeError("no rule explains this failure: the list needs a last rule that always answers")
    return refusal(*found)
