"""The house's figures: what issue 47 measures of the package, from its source alone (nothing is run).

    python scripts/house_figures.py            # a table
    python scripts/house_figures.py --json     # the same as JSON

- lines per module (`wc -l`), and the package's total;
- `UserError(` sites per module, and outside the checks layer (`finetune/checks/`);
- functions over 60 lines (and their lengths);
- the import graph of every `finetune` import, inside functions too (those under `if TYPE_CHECKING:` left
  out: they never run): its cycles (strongly connected components of more than one module), and the imports
  made inside functions;
- the special-case share of a module: code lines inside functions that lie in a check-named function
  (`check*`, `_check*`, `*_hint`, `warn*`, `_warn*`, `refuse*`, `_refuse*`, `_diagnose*`, `explain*`), in an
  `if` whose body raises or warns, in a `raise`, in an `except` that raises or warns, or in a statement whose
  value is a user message (a string of three words or more), over all code lines inside functions
  (docstrings and comments excluded).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "finetune"
CHECKS = "checks"
CHECK_NAME = re.compile(r"_?(check|warn|refuse|diagnose|explain)\w*|\w*_hint")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (finetune.data, finetune.checks.files ...)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def code_lines(source: str) -> set[int]:
    """Lines that hold code: a token other than a comment, a newline or indentation."""
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}  # fmt: skip
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def _span(node: ast.AST) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def _docstring_lines(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found |= _span(first)
    return found


def _says(node: ast.AST) -> bool:
    """Whether a node raises or warns somewhere inside it."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Raise):
            return True
        if isinstance(inner, ast.Call):
            name = getattr(inner.func, "id", getattr(inner.func, "attr", ""))
            if name in ("warn", "warning", "error"):
                return True
    return False


def _message(value: ast.AST | None) -> bool:
    """A user message: a string (or f-string, or a sum or choice of them) of three words or more."""
    if value is None:
        return False
    texts = []
    for inner in ast.walk(value):
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            texts.append(inner.value)
    return bool(texts) and len(" ".join(texts).split()) >= 3 and isinstance(
        value, (ast.JoinedStr, ast.Constant, ast.BinOp, ast.IfExp))


def special_share(path: Path) -> tuple[int, int]:
    """(special-case code lines, code lines) inside the functions of a module."""
    source = path.read_text()
    tree = ast.parse(source)
    code = code_lines(source) - _docstring_lines(tree)
    inside: set[int] = set()
    special: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = set(range(node.body[0].lineno, node.end_lineno + 1))
            inside |= body
            if CHECK_NAME.fullmatch(node.name):
                special |= body
        elif isinstance(node, ast.If) and any(_says(s) for s in node.body):
            special |= _span(node) - set().union(*(_span(s) for s in node.orelse)) if node.orelse else _span(node)
        elif isinstance(node, ast.Raise):
            special |= _span(node)
        elif isinstance(node, ast.ExceptHandler) and _says(node):
            special |= _span(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)) and _message(
                getattr(node, "value", None)):
            special |= _span(node)
    inside &= code
    return len(special & inside), len(inside)


def imports(path: Path, name: str, known: set[str]) -> list[tuple[str, bool, int]]:
    """(imported module, inside a function, line) for every import of a package module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    in_function: set[int] = set()
    type_only: set[int] = set()  # `if TYPE_CHECKING:` blocks: names for the reader and the type checker, never run
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function |= _span(node)
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            type_only |= _span(node)
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in type_only:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno in in_function, node.lineno))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def figures() -> dict:
    mods = modules()
    known = set(mods)
    lines = {n: len(p.read_text().splitlines()) for n, p in mods.items()}
    user_errors = {n: p.read_text().count("UserError(") for n, p in mods.items()}
    outside = {n: c for n, c in user_errors.items() if c and not n.startswith(f"finetune.{CHECKS}")}
    long = {}
    for n, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long[f"{n}:{node.name}"] = node.end_lineno - node.lineno + 1
    graph: dict[str, set[str]] = {n: set() for n in mods}
    inner = []
    for n, p in mods.items():
        for target, in_function, line in imports(p, n, known):
            graph[n].add(target)
            if in_function:
                inner.append(f"{p.relative_to(PACKAGE.parent)}:{line} -> {target}")
    share = {n: special_share(p) for n, p in mods.items()}
    return {
        "lines": lines,
        "total_lines": sum(lines.values()),
        "user_error_sites": user_errors,
        "user_error_sites_outside_checks": outside,
        "functions_over_60_lines": dict(sorted(long.items(), key=lambda kv: -kv[1])),
        "import_cycles": cycles(graph),
        "imports_inside_functions": inner,
        "special_case_share": {n: round(s / c, 3) if c else 0.0 for n, (s, c) in share.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    f = figures()
    if args.json:
        print(json.dumps(f, indent=1))
        return
    print(f"{'module':34} {'lines':>6} {'UserError(':>10} {'special':>8}")
    for n in f["lines"]:
        print(f"{n:34} {f['lines'][n]:6} {f['user_error_sites'][n]:10} {f['special_case_share'][n]:8.0%}")
    print(f"{'total':34} {f['total_lines']:6} {sum(f['user_error_sites'].values()):10}")
    print(f"\nUserError( outside the checks layer: {sum(f['user_error_sites_outside_checks'].values())} in "
          f"{len(f['user_error_sites_outside_checks'])} modules")
    print(f"functions over 60 lines: {len(f['functions_over_60_lines'])}")
    for k, v in f["functions_over_60_lines"].items():
        print(f"  {k} {v}")
    print(f"import cycles: {len(f['import_cycles'])}")
    for c in f["import_cycles"]:
        print(f"  {' '.join(c)}")
    print(f"imports inside functions: {len(f['imports_inside_functions'])}")


if __name__ == "__main__":
    main()
