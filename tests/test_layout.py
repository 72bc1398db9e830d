"""The shape of the package, as the redesign promised it: measured with `ast`, so it cannot drift."""

from __future__ import annotations

import ast
from pathlib import Path

from finetune.config import DataArgs, ModelArgs, TrainConfig, load_config

PACKAGE = Path(__file__).resolve().parents[1] / "finetune"


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def test_functions_stay_small_and_train_reads_in_one_screenful():
    sizes = {f"{p.name}:{name}": n for p in PACKAGE.glob("*.py") for name, n in _functions(p)}
    assert sizes["run.py:train"] <= 150
    assert {k: n for k, n in sizes.items() if n > 120 and k != "run.py:train"} == {}
    assert len((PACKAGE / "metrics.py").read_text().splitlines()) < 250


def test_no_entry_point_edits_sys_path():
    for path in PACKAGE.glob("*.py"):
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
    names = {f for f in TrainConfig.__dataclass_fields__}
    assert set(DataArgs.__dataclass_fields__) <= names and set(ModelArgs.__dataclass_fields__) <= names
