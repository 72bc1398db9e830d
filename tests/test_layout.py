"""The shape of the package, as docs/development.md promises it: measured with `ast`, so it cannot drift."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from finetune.config import SECTIONS, DataArgs, ModelArgs, TrainConfig, load_config, section_fields
from finetune.metrics import PROBLEMS
from finetune.tasks import TASK_NAMES

PACKAGE = Path(__file__).resolve().parents[1] / "finetune"
MODULES = sorted(PACKAGE.glob("*.py")) + sorted((PACKAGE / "problems").glob("*.py")) + sorted((PACKAGE / "tasks").glob("*.py"))


def _name(path: Path) -> str:
    """A module's file inside the package: "data.py", "problems/tags.py"."""
    return path.relative_to(PACKAGE).as_posix()


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def _strings(path: Path) -> set[str]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_train_reads_in_one_screen_and_no_function_is_longer_than_a_person_holds():
    """No function of the core is over 60 lines but the loop itself (`run._train`); a rule of the checks
    layer is 30 at most (tests/test_checks.py)."""
    sizes = {f"{_name(p)}:{name}": n for p in MODULES for name, n in _functions(p)}
    assert sizes["run.py:train"] <= 100 and sizes["run.py:_train"] <= 100
    assert {k: n for k, n in sizes.items() if n > 60} == {"run.py:_train": sizes["run.py:_train"]}


def test_the_core_keeps_to_its_job():
    """The modules that the checks layer emptied of special cases stay their size: the loader, the config,
    the evaluation's entry point and each problem's module."""
    lines = {_name(p): len(p.read_text().splitlines()) for p in MODULES}
    assert lines["data.py"] <= 500 and lines["config.py"] <= 800 and lines["evaluate_checkpoint.py"] <= 800
    assert {name: n for name, n in lines.items() if name.startswith(("problems/", "tasks/")) and n > 400} == {}


def test_no_module_but_the_task_module_names_a_task():
    """Adding a task touches finetune/tasks/ (its module and the registry), not every module that would
    compare its name: each task's name is spelled in its own module alone."""
    naming = {_name(p): _strings(p) & set(TASK_NAMES) for p in MODULES if _strings(p) & set(TASK_NAMES)}
    assert all(name.startswith("tasks/") and len(names) == 1 for name, names in naming.items()), naming
    assert len(naming) == len(TASK_NAMES)


def test_problem_types_are_compared_in_their_home_only():
    """A problem's behaviour is its class's (finetune/problems/): no other module of the core compares a
    problem type's name, nor names one but metrics.py's table of what each reports (the config reads it
    without torch)."""
    names = set(PROBLEMS)
    spelling = {_name(p) for p in MODULES if _strings(p) & names}
    assert spelling == {"metrics.py"}
    constants = {"SINGLE", "MULTI", "REGRESSION", "TOKENS", "WORD_TAGS"}
    using = {_name(p) for p in MODULES for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Name) and n.id in constants}  # fmt: skip
    assert {m for m in using if not m.startswith("problems/")} <= {"metrics.py"} | {m for m in using if m.startswith("tasks/")}


def test_only_the_problems_read_a_models_outputs():
    """`.logits` (a question-answering model has start and end logits instead) is read by the problem's
    `outputs`, nowhere else."""
    reading = {_name(p) for p in MODULES for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Attribute) and n.attr == "logits"}  # fmt: skip
    assert reading == {"problems/base.py"}


def _reads_label_names(path: Path) -> bool:
    """Whether a module names `label_names`: a variable, an attribute, an argument, or a dict's key."""
    key = "label_names"
    for n in ast.walk(ast.parse(path.read_text())):
        if (isinstance(n, ast.Name) and n.id == key) or (isinstance(n, ast.Attribute) and n.attr == key):
            return True
        if isinstance(n, (ast.arg, ast.keyword)) and n.arg == key:
            return True
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == key:
            return True
        if isinstance(n, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == key for k in n.keys):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args \
                and isinstance(n.args[0], ast.Constant) and n.args[0].value == key:
            return True
    return False


def test_only_the_problems_say_what_the_labels_are():
    """What a task's labels are (classes, tags, candidates' numbers, a target's name, a span's ends) is a
    `Labels` (finetune/problems/base.py): the loop, the loader, evaluation, checkpoints, the export and the
    card hold one and ask it for the model's head and for what a manifest keeps. No module of the core but
    the problems' and the config's (which declares the setting) names `label_names`: as a variable, an
    attribute, an argument, or a manifest's key."""
    reading = {_name(p) for p in MODULES if _reads_label_names(p)}
    assert {m for m in reading if not m.startswith(("problems/", "tasks/"))} == {"config.py"}
    assert "problems/base.py" in reading  # the test reads what it means to


def test_the_run_directory_is_spelled_in_one_module():
    names = {"config.yaml", "metrics.jsonl", "results.json", "training_curves.png", ".previous-run"}
    spelling = {_name(p) for p in MODULES if _strings(p) & names}
    assert spelling == {"layout.py"}


# Every name a run directory holds, by the module that writes it. "model" is left out (a word with
# other meanings in card.py and models.py), and so are Accelerate's and transformers' own file names
# (model.safetensors, optimizer.bin, random_states_N.pkl, config.json).
RUN_DIR_NAMES = {
    "config.yaml", "metrics.jsonl", "results.json", "training_curves.png", ".previous-run",
    "checkpoints", "adapter",  # finetune/run.py, export.py: already in layout.py
    "eval", "metrics.json", "predictions.jsonl", "confusion_matrix.png",  # evaluate_checkpoint.py
    "manifest.json", "COMPLETE", "step-",  # checkpoint.py
    "study.db", "best_recipe.yaml", "search.json", "trial-",  # search.py
}  # fmt: skip
# Also a word of its own elsewhere ("eval" is a preparation mode): counted only as a part of a path.
PATH_ONLY = {"eval"}
STILL_SPELLING: set[str] = set()


def _path_parts(path: Path) -> set[str]:
    """Strings used as parts of a path: an operand of `/`, or an argument of Path(), joinpath(),
    with_name()."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
            "Path", "joinpath", "with_name"
        ):  # fmt: skip
            operands = node.args
        else:
            continue
        found |= {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)}
    return found


def _spelled_run_dir_names() -> dict[str, set[str]]:
    """{name: the modules that spell it}."""
    spelled: dict[str, set[str]] = {name: set() for name in RUN_DIR_NAMES}
    for module in MODULES:
        # the owner defines every name as a constant; elsewhere a PATH_ONLY word counts as a path part only
        owner = _name(module) == "layout.py"
        for name in (_strings(module) & (RUN_DIR_NAMES - (set() if owner else PATH_ONLY))) | (_path_parts(module) & PATH_ONLY):
            spelled[name].add(_name(module))
    return spelled


def test_no_other_module_starts_spelling_the_run_directory():
    """Until the names below move, only their present owners spell them; no module joins them."""
    spellers = set().union(*_spelled_run_dir_names().values())
    assert spellers <= {"layout.py"} | STILL_SPELLING, spellers - STILL_SPELLING


def test_every_name_of_the_run_directory_is_spelled_only_in_layout():
    """STYLE.md habit 17: one module owns the run directory's layout."""
    spelled = _spelled_run_dir_names()
    assert spelled == {name: {"layout.py"} for name in RUN_DIR_NAMES}, {
        name: sorted(modules) for name, modules in spelled.items() if modules != {"layout.py"}
    }


def test_signal_handlers_are_installed_in_one_module():
    installing = {
        _name(p)
        for p in MODULES
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "signal" and isinstance(node.value, ast.Name)
        and node.value.id == "signal"
    }  # fmt: skip
    assert installing == {"signals.py"}


def test_one_loader_reads_data_files():
    """Training and evaluate_checkpoint.py --data go through finetune/data.py's loader."""
    calling = {_name(p) for p in MODULES if "load_dataset" in {n.id for n in ast.walk(ast.parse(p.read_text()))
                                                              if isinstance(n, ast.Name)}}  # fmt: skip
    assert calling == {"data.py"}


def test_no_entry_point_edits_sys_path():
    for path in MODULES:
        assert "sys.path" not in path.read_text(), path


def test_builders_see_only_their_section():
    """data.py and models.py take DataArgs / ModelArgs (or plain values), never the whole config."""
    for module, section in (("data.py", "DataArgs"), ("models.py", "ModelArgs")):
        tree = ast.parse((PACKAGE / module).read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "finetune.config"
            for alias in node.names
        }
        assert imported == {section}, module
    cfg = load_config(None, ["max_length=64", "learning_rate=1e-3"])
    assert cfg.data_args.max_length == 64 and not hasattr(cfg.data_args, "learning_rate")
    assert cfg.model_args.model_name_or_path == cfg.model_name_or_path
    assert isinstance(cfg.data_args, DataArgs) and isinstance(cfg.model_args, ModelArgs)


def test_one_list_of_setting_names_in_sections():
    """Every setting is declared once, in one section; the config is the sections together, in order."""
    declared = [f.name for section in SECTIONS for f in section_fields(section)]
    assert len(declared) == len(set(declared))
    assert declared == [f.name for f in dataclasses.fields(TrainConfig)]
