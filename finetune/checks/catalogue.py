"""Every rule of the checks layer, by phase, as docs/bad-input.md lists them (`python -m finetune.checks`)."""

from __future__ import annotations

import importlib
import inspect

from finetune.checks import RULES, Rule

# The phases, in the order a run meets them; each is a module of finetune/checks/.
PHASES = {
    "settings": "the recipe, the command line and the typed config",
    "files": "a data file: its path, its bytes, a parse that failed, a CoNLL file, a folder",
    "columns": "a split's columns and their values",
    "labels": "the label column: the problem type, classes, label lists, regression targets, tags",
    "splits": "the splits together: shared samples, the held-out share, what the limits leave",
    "streams": "a streamed run: the settings that cannot stream, the splits it needs, what its stream holds",
    "images": "image folders and the images a split names",
    "inputs": "what the tokenizer makes of the training texts",
    "models": "model folders, configs, tokenizers, image processors, weights",
    "runs": "the output directory, checkpoints and resumes",
    "evaluation": "what is evaluated, and on what",
    "launch": "the launcher, accelerate configs, processes, devices, compilation",
    "tools": "the run's verdict, the search, verify, the plots command, the model card and the hub push",
}


def rules() -> dict[str, list[Rule]]:
    """Every registered rule, by phase, each phase's module imported so that its rules are registered."""
    for phase in PHASES:
        try:
            importlib.import_module(f"finetune.checks.{phase}")
        except ModuleNotFoundError as e:
            if e.name != f"finetune.checks.{phase}":
                raise
    by_phase: dict[str, list[Rule]] = {phase: [] for phase in PHASES}
    for rule in RULES.values():
        by_phase.setdefault(rule.phase, []).append(rule)
    return {phase: sorted(found, key=lambda r: r.id) for phase, found in by_phase.items() if found}


def markdown() -> str:
    """docs/bad-input.md."""
    found = rules()
    total = sum(map(len, found.values()))
    warnings = sum(r.warning for group in found.values() for r in group)
    lines = [
        "# Bad input: the rules",
        "",
        "Every refusal and warning of the app is a rule of the checks layer (`finetune/checks/`, one module a",
        "phase): a small function with a stable id that looks at one phase's subject and returns one line, what",
        "is wrong and what to do. A refusal is that line after `error:` and exit status 2, with nothing written",
        "over ([faults-and-bad-input.md](faults-and-bad-input.md)); a warning is said once a run, and the run goes",
        "on. Each rule has a case in the catalogue of bad input (`tests/test_bad_input.py` and the tests of its",
        "phase, keyed by the rule's id; `tests/test_checks.py` holds every rule to one). This page is made from the",
        "rules' docstrings: `python -m finetune.checks > docs/bad-input.md` (a test fails when it is stale), and",
        "`FINETUNE_SHOW_RULES=1` prints the id of the rule behind each `error:` and `warning:` line. Each rule",
        "names the lists of its module that hold it (the core asks a list through one gate, in its order) and",
        "its subject (what the gate passes it).",
        "",
        f"{total} rules: {total - warnings} refusals, {warnings} warnings.",
    ]
    for phase, group in found.items():
        lines += ["", f"## {phase}: {PHASES.get(phase, '')}", ""]
        member = lists_of(phase)
        for r in group:
            kind = "warning" if r.warning else "refusal"
            where = ", ".join(f"`{name}`" for name in member.get(r.id, []))
            lines.append(f"- `{r.id}` ({kind}{', one process' if r.local else ''}; {where or 'no list'}, of "
                         f"{subject(r)}): {r.doc}")
    return "\n".join(lines) + "\n"


def lists_of(phase: str) -> dict[str, list[str]]:
    """The lists of a phase's module that hold each rule (the gates the core calls with them), by rule id."""
    module = importlib.import_module(f"finetune.checks.{phase}")
    member: dict[str, list[str]] = {}
    for name, value in vars(module).items():
        if name.isupper() and isinstance(value, list) and value and all(isinstance(r, Rule) for r in value):
            for r in value:
                member.setdefault(r.id, []).append(name)
    return member


def subject(r: Rule) -> str:
    """What a rule is asked about: its parameters, as annotated."""
    params = inspect.signature(r.fn).parameters.values()
    return ", ".join(p.name + (f": {p.annotation}" if p.annotation is not inspect.Parameter.empty else "")
                     for p in params) or "nothing"
