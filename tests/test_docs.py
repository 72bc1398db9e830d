"""The docs name only what exists: every setting, flag, path, link and recipe they mention resolves.

    python -m pytest -q tests/test_docs.py

Reads README.md, docs/*.md, benchmarks/README.md and accelerate_configs/README.md, and checks:

- every `key=value` that sets the app's config names a field of `TrainConfig` (nearest one
  suggested); a dotted key (`peft.r=16`, `max_memory.cuda:0=2GiB`) needs a mapping field as its
  head. Checked: on a command line after an entry point (`ENTRIES`: run.py, evaluate_checkpoint.py
  — only its evaluation settings —, verify, search, their console scripts and `-m` names, the SLURM
  script), after a benchmark's `--override`, a line made only of such tokens, and any such token in
  a code span, prose around it or not (`learning_rate=3e-5 on the command line`). Environment
  assignments (UPPERCASE), Python (```python blocks, spans with calls like `AdamW(fused=True)` or
  `x = f()`, values None/True/False) are not settings;
- every YAML-form code span (`problem_type: null`, `ddp_kwargs: find_unused_parameters: true`) names
  a field of `TrainConfig` or a key of accelerate's config (its config classes, its launch flags, the
  shipped accelerate_configs/*.yaml); a nested key needs a mapping as its head;
- every flag after an entry point is one its argparse parser declares (read with `ast` from the
  module that parses it) or `--<setting>` where the entry takes settings as flags; every flag between
  `accelerate launch` / `finetune-launch` and the entry point is one of accelerate launch's; a code
  span that is only flags (`--data <file>`) names flags that some command of this repository, of
  accelerate launch, or of the few other tools the docs quote (`OTHER_TOOLS_FLAGS`) has;
- every console script in pyproject.toml is an entry point here (or the launcher);
- every `--config` / `--config_file` value and every repository path in code or a link exists
  (placeholders with `<`, `*` or `...`, and run outputs like `runs/...` or `/tmp/...`, are skipped),
  and every `#anchor` of a link to a Markdown file is one of its headings;
- every shipped recipe loads;
- README.md is at most 150 lines, each docs page under 250 (the generated list of rules aside), and
  README.md links every docs page.

`test_the_checker_finds_invented_keys_and_paths` runs the checks on a page of known mistakes, so a
checker that has gone blind fails too. Standard library, PyYAML, pytest and `finetune.config` only
(the parsers and accelerate are read with `ast`, never imported): a couple of seconds.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import re
import shlex
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from finetune.config import CONFIGS_DIR, EVAL_KEYS, TrainConfig, load_config
from finetune.errors import UserError

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(
    [REPO / "README.md", *DOCS.glob("*.md"), REPO / "benchmarks" / "README.md",
     REPO / "accelerate_configs" / "README.md"]
)  # fmt: skip
README_MAX_LINES = 150  # STYLE.md, habit 18: a README read in ten minutes
PAGE_MAX_LINES = 249  # each docs page "under 250"
# Made from the code, not written: the list of rules (`python -m finetune.checks`), one line a rule, read by
# searching, not end to end. Its names are checked as every page's are; its length is the rules'.
GENERATED = {"bad-input.md"}
# `key=value` that sets the config: a lowercase identifier (UPPERCASE is an environment variable), a
# dotted sub-key for mappings, then `=`. An optional `[` opens an optional argument: `[devices=cpu]`.
SETTING = re.compile(r"^\[?(?P<key>[a-z_][a-z0-9_]*)(?P<sub>\.[\w:.-]+)?=(?P<value>.*)")
# A span like `device_ids=None` is a Python keyword argument (YAML, which the app reads, says null/true).
PYTHON_VALUES = {"None", "True", "False"}
PLACEHOLDER_KEYS = {"key"}  # `key=value`, the docs' name for any setting
ROOTS = ("finetune", "accelerate_configs", "tests", "scripts", "benchmarks", "docs", "data")
REPO_PATH = re.compile(
    r"(?<![\w/.~$<>-])((?:" + "|".join(ROOTS) + r")/[^\s`'\"()\[\]{},;|]*)"
)  # fmt: skip
MODULE = re.compile(r"(?:^|\s)-m\s+((?:finetune|benchmarks)(?:\.\w+)+)")
PLACEHOLDER = ("<", "*", "...", "$", "{")
RUN_OUTPUTS = ("runs/", "/tmp/", "~/")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")


# --- reading Markdown ---------------------------------------------------------------------------


@dataclass
class Code:
    """A piece of code in a page: a fenced or indented block ("block") or an inline span ("span")."""

    kind: str
    lang: str
    text: str
    line: int


@dataclass
class Page:
    path: Path
    code: list[Code]
    links: list[tuple[str, int]]
    headings: list[str]


def parse(text: str, path: Path = REPO / "x.md") -> Page:
    """Split Markdown into code blocks, inline code spans, link targets and headings."""
    lines = text.splitlines()
    page = Page(path, [], [], [])
    paragraph: list[str] = []
    para_start = 0

    def flush() -> None:
        if not paragraph:
            return
        prose = "\n".join(paragraph)
        for match in SPAN.finditer(prose):
            line = para_start + prose.count("\n", 0, match.start())
            page.code.append(Code("span", "", " ".join(match.group(2).split()), line))
        bare = SPAN.sub("", prose)  # a link inside a code span is code, not a link
        for match in LINK.finditer(bare):
            page.links.append((match.group(1), para_start + bare.count("\n", 0, match.start())))
        paragraph.clear()

    i = 0
    previous_blank = True
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            flush()
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence.group(1)):
                body.append(lines[i])
                i += 1
            page.code.append(Code("block", fence.group(2).lower(), "\n".join(body), start + 1))
            i += 1
            previous_blank = False
            continue
        if line.startswith(("    ", "\t")) and line.strip() and previous_blank and not paragraph:
            start, body = i, []
            while i < len(lines) and (lines[i].startswith(("    ", "\t")) or not lines[i].strip()):
                body.append(lines[i])
                i += 1
            page.code.append(Code("block", "", "\n".join(body), start + 1))
            previous_blank = not body[-1].strip()
            continue
        if not line.strip():
            flush()
            previous_blank = True
        else:
            if line.startswith("#"):
                flush()
                page.headings.append(line.lstrip("#").strip())
            else:
                if not paragraph:
                    para_start = i + 1
                paragraph.append(line)
            previous_blank = False
        i += 1
    flush()
    return page


def command_lines(code: Code) -> Iterator[tuple[str, int]]:
    """The logical lines of a block (`\\` continuations joined), or the span itself."""
    if code.kind == "span":
        yield code.text, code.line
        return
    pending, start = "", code.line
    for offset, line in enumerate(code.text.splitlines()):
        if not pending:
            start = code.line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line, start
        pending = ""
    if pending:
        yield pending, start


def tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in prose-like code: split on spaces
        return line.split("#", 1)[0].split()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(page: Page) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in page.headings:
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


# --- what exists: the config, the entry points and their flags, accelerate's keys -------------------


def _mapping_fields() -> tuple[set[str], set[str]]:
    fields = dataclasses.fields(TrainConfig)
    try:
        hints = typing.get_type_hints(TrainConfig)
    except Exception:  # an annotation that does not evaluate: its text says as much
        hints = {f.name: f.type for f in fields}
    names = {f.name for f in fields}
    mappings = {name for name in names if "dict" in str(hints.get(name, ""))}
    return names, mappings


FIELDS, MAPPINGS = _mapping_fields()


@dataclass(frozen=True)
class Entry:
    """A command of this repository: the words that run it, the module whose argparse parser reads
    its flags, the settings it takes as `key=value` (None: not the app's config), and those it also
    takes as `--key value` (config.settings_from_flags)."""

    names: tuple[str, ...]
    parser: str
    settings: frozenset[str] | None = None
    flag_settings: frozenset[str] = frozenset()


ALL, EVAL = frozenset(FIELDS), frozenset(EVAL_KEYS)
# A command line runs the app when one of its words is one of these names (or ends with "/" + one).
ENTRIES = (
    Entry(("finetune/run.py", "finetune-train", "finetune.run",
           "scripts/slurm_multinode.sbatch"),  # passes its arguments through to finetune/run.py
          "finetune/cli.py", ALL, ALL),
    Entry(("finetune/evaluate_checkpoint.py", "finetune-evaluate", "finetune.evaluate_checkpoint"),
          "finetune/evaluate_checkpoint.py", EVAL, EVAL),  # other settings: "cannot be set when evaluating"
    Entry(("finetune/verify.py", "finetune-verify", "finetune.verify"), "finetune/verify.py", ALL),
    Entry(("finetune/search.py", "finetune-search", "finetune.search"), "finetune/search.py", ALL, ALL),
    Entry(("finetune-config",), "finetune/launch.py"),  # writes accelerate's config: takes no settings
    Entry(("finetune/onnx_export.py", "finetune-onnx", "finetune.onnx_export"), "finetune/onnx_export.py"),
)  # fmt: skip
LAUNCHERS = ("finetune-launch", "finetune.launch")  # accelerate launch's flags, then an entry point
# The benchmarks' and scripts' own command lines: flags checked, `--override key=value` too.
TOOLS = tuple(
    Entry(
        (path.relative_to(REPO).as_posix(), f"{path.parent.name}.{path.stem}"),
        path.relative_to(REPO).as_posix(),
    )
    for folder in ("benchmarks", "scripts")
    for path in sorted((REPO / folder).glob("*.py"))
    if "add_argument" in path.read_text()
)
# Flags of other tools that the docs quote in a span of their own: pytest's marker and quiet flags,
# sbatch's signal and log mode.
OTHER_TOOLS_FLAGS = {"-m", "-q", "-k", "-x", "-n", "--signal", "--open-mode",
                     "--do_train", "--fp16", "--lr"}  # transformers' example scripts, named where they are refused
SHELL_OPERATORS = {"&&", "||", "|", ";"}
FLAG = re.compile(r"^\[?(--?[A-Za-z](?:[\w-]*\w)?)(?:=\S*)?\]?$")  # `--data`, `[--plan-only]`, `--x=1`


@functools.cache
def parser_flags(module: str) -> frozenset[str]:
    """The option strings a module's argparse calls declare (`add_argument("--data", ...)`), read with
    `ast` so that no module is imported (evaluate_checkpoint.py imports torch)."""
    path = Path(module) if Path(module).is_absolute() else REPO / module
    found = {"-h", "--help"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            found |= {
                a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            }
    return frozenset(found)


def _accelerate() -> tuple[frozenset[str], frozenset[str]]:
    """accelerate launch's flags and the keys of its config files: the fields of its config classes,
    the launch flags' names (`fsdp_auto_wrap_policy`, nested under `fsdp_config:`) and every key of the
    shipped accelerate_configs/*.yaml. Read from its source, not imported (torch)."""
    spec = importlib.util.find_spec("accelerate")
    root = Path(spec.origin).parent if spec and spec.origin else None
    flags: frozenset[str] = frozenset()
    keys: set[str] = set()
    if root is not None and (root / "commands" / "launch.py").is_file():
        flags = parser_flags(str(root / "commands" / "launch.py"))
        keys |= {f.lstrip("-").replace("-", "_") for f in flags if f.startswith("--")}
        for node in ast.walk(ast.parse((root / "commands" / "config" / "config_args.py").read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                keys.add(node.target.id)

    def walk(value) -> None:
        if isinstance(value, dict):
            keys.update(map(str, value))
            for child in value.values():
                walk(child)

    for path in (REPO / "accelerate_configs").glob("*.yaml"):
        walk(yaml.safe_load(path.read_text()))
    return flags, frozenset(keys)


ACCELERATE_FLAGS, ACCELERATE_KEYS = _accelerate()
KNOWN_FLAGS = (
    ACCELERATE_FLAGS | OTHER_TOOLS_FLAGS | {f"--{name}" for name in FIELDS}
    | {flag for entry in (*ENTRIES, *TOOLS) for flag in parser_flags(entry.parser)}
)  # fmt: skip


# --- the checks -------------------------------------------------------------------------------------


def _nearest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_key(token: str, allowed: frozenset[str] = ALL) -> str | None:
    """Why `token`, a `key=value` of the app, names no setting it may set (None when it does or is no
    setting)."""
    match = SETTING.match(token)
    if not match or match.group("key") in PLACEHOLDER_KEYS:
        return None
    key, sub = match.group("key"), match.group("sub")
    if key not in FIELDS:
        return f"unknown setting {key!r} in {token!r}{_nearest(key, FIELDS)}"
    if key not in allowed:
        return f"setting {key!r} in {token!r} cannot be set by this command (its --help lists those it takes)"
    if sub and key not in MAPPINGS:
        return f"{key!r} is not a mapping, so {token!r} sets nothing"
    return None


# `ddp_kwargs: find_unused_parameters: true`: keys, each with a colon, then one value.
YAML_SPAN = re.compile(r"^((?:[a-z_][a-z0-9_]*:\s+)+)(\S+|'[^']*'|\"[^\"]*\")$")


def check_yaml_span(text: str) -> str | None:
    """Why a YAML-form span names no key of the app's config nor of accelerate's (None when it does)."""
    match = YAML_SPAN.match(text)
    if not match:
        return None
    head, *nested = [k.strip() for k in match.group(1).split(":") if k.strip()]
    if head in FIELDS:
        if nested and head not in MAPPINGS:
            return f"{head!r} is not a mapping, so {text!r} sets nothing"
        return None
    if head in ACCELERATE_KEYS:
        unknown = [k for k in nested if k not in ACCELERATE_KEYS]
        return f"unknown accelerate config key {unknown[0]!r} in {text!r}" if unknown else None
    return (
        f"unknown setting {head!r} in {text!r}, neither the app's config nor accelerate's"
        f"{_nearest(head, FIELDS | ACCELERATE_KEYS)}"
    )


def _entry(word: str) -> Entry | None:
    for entry in (*ENTRIES, *TOOLS):
        if any(word == name or word.endswith("/" + name) for name in entry.names):
            return entry
    return None


def _segments(words: list[str]) -> Iterator[list[str]]:
    """A line cut at `&&`, `||`, `|` and `;`: one command each."""
    current: list[str] = []
    for word in words:
        if word in SHELL_OPERATORS:
            yield current
            current = []
        elif word.endswith(";"):
            yield [*current, word[:-1]]
            current = []
        else:
            current.append(word)
    yield current


def _is_flag(word: str) -> str | None:
    match = FLAG.match(word)
    return match.group(1) if match and match.group(1).lstrip("-") not in PLACEHOLDER_KEYS else None


def command_problems(words: list[str]) -> list[str]:
    """The settings and flags of one command that runs an entry point, or a launcher before it."""
    found = []
    at = next((i for i, w in enumerate(words) if _entry(w)), None)
    if at is None:
        return found
    entry = _entry(words[at])
    launcher = next(
        (i for i, w in enumerate(words[:at])
         if w in LAUNCHERS or (w == "launch" and i and words[i - 1] == "accelerate")), None
    )  # fmt: skip
    if launcher is not None and ACCELERATE_FLAGS:
        for word in words[launcher + 1 : at]:
            flag = _is_flag(word)
            if flag and flag not in ACCELERATE_FLAGS:
                found.append(f"accelerate launch has no flag {flag!r}{_nearest(flag, ACCELERATE_FLAGS)}")
    flags = parser_flags(entry.parser)
    for word in words[at + 1 :]:
        flag = _is_flag(word)
        if flag:
            name = flag[2:]
            if flag in flags:
                continue
            if flag.startswith("--") and name.split(".")[0] in entry.flag_settings:
                problem = check_key(f"{name}=x", entry.flag_settings)
                if problem:
                    found.append(problem)
                continue
            choices = flags | {f"--{k}" for k in entry.flag_settings}
            found.append(f"{flag!r}: {entry.names[0]} has no such flag{_nearest(flag, choices)}")
        elif entry.settings is not None:
            problem = check_key(word, entry.settings)
            if problem:
                found.append(problem)
    return found


# Python in a span: a call (`AdamW(fused=True)`), an assignment, an import.
PYTHON_SPAN = re.compile(r"\w\(|\s=\s|^(?:from|import)\s")


def setting_problems(page: Page) -> list[str]:
    """Unknown settings, YAML keys and flags in the page's code."""
    found = []
    for code in page.code:
        if code.lang in ("python", "py", "pycon"):
            continue
        for line, number in command_lines(code):
            where = f"{page.path.relative_to(REPO)}:{number}"
            problems: list[str] = []
            words = tokens(line)
            for segment in _segments(words):
                problems += command_problems(segment)
            problems += [check_key(w) for prev, w in pairwise(words) if prev == "--override"]
            matches = [SETTING.match(w) for w in words]
            about_settings = (
                code.kind == "span" and bool(matches) and matches[0] and not PYTHON_SPAN.search(line)
            )
            if about_settings or (words and all(matches)):
                # a line of settings alone, or a span that opens with one: `learning_rate=3e-5 on the
                # command line` (not a quoted output line: `1,090 weights trained (LoRA r=4 and the head)`)
                problems += [
                    check_key(w) for w, m in zip(words, matches, strict=True)
                    if m and m.group("value") not in PYTHON_VALUES
                ]  # fmt: skip
            if code.kind == "span":
                problems.append(check_yaml_span(line))
                if words and _is_flag(words[0]) and not _entry(words[0]):  # `--data <file>`, `--predictions`
                    problems += [
                        f"{flag!r}: no command here has this flag{_nearest(flag, KNOWN_FLAGS)}"
                        for flag in filter(None, map(_is_flag, words)) if flag not in KNOWN_FLAGS
                    ]  # fmt: skip
            found += [f"{where}: {p}" for p in dict.fromkeys(problems) if p]
    return found


def _skipped(path: str) -> bool:
    return any(p in path for p in PLACEHOLDER) or path.startswith(RUN_OUTPUTS) or "://" in path


def _exists(relative: str) -> bool:
    return (REPO / relative).exists()


def path_problems(page: Page, pages: dict[Path, Page]) -> list[str]:
    where = page.path.relative_to(REPO)
    found = []
    for code in page.code:
        for line, number in command_lines(code):
            words = tokens(line)
            for flag, value in pairwise(words):
                if flag in ("--config", "--config_file") and not _skipped(value) and not _exists(value):
                    found.append(f"{where}:{number}: {flag} {value} does not exist")
            for match in REPO_PATH.finditer(line):
                path = match.group(1).rstrip(".:")
                if not _skipped(path) and not _exists(path):
                    found.append(f"{where}:{number}: {path} does not exist")
            for match in MODULE.finditer(line):
                module = Path(*match.group(1).split("."))
                if not ((REPO / module).with_suffix(".py").is_file() or (REPO / module).is_dir()):
                    found.append(f"{where}:{number}: module {match.group(1)} does not exist")
    for target, number in page.links:
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        if not file:  # a heading of this page
            if anchor not in anchors(page):
                found.append(f"{where}:{number}: link {target}: no heading makes #{anchor}")
            continue
        resolved = (page.path.parent / file).resolve()
        if not resolved.exists():
            found.append(f"{where}:{number}: link {target} leads nowhere")
            continue
        if anchor and resolved.suffix == ".md":
            linked = pages.get(resolved) or parse(resolved.read_text(), resolved)
            if anchor not in anchors(linked):
                found.append(f"{where}:{number}: link {target}: no heading makes #{anchor}")
    return found


@pytest.fixture(scope="module")
def pages() -> dict[Path, Page]:
    return {path: parse(path.read_text(), path) for path in PAGES}


def test_the_pages_exist():
    assert DOCS.is_dir() and len(list(DOCS.glob("*.md"))) >= 5
    for path in PAGES:
        assert path.is_file(), path


def test_every_setting_the_docs_name_exists(pages):
    problems = [p for page in pages.values() for p in setting_problems(page)]
    assert not problems, "\n".join(problems)


def test_every_path_and_link_the_docs_name_exists(pages):
    problems = [p for page in pages.values() for p in path_problems(page, pages)]
    assert not problems, "\n".join(problems)


def test_readme_is_short_and_indexes_every_docs_page(pages):
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= README_MAX_LINES
    linked = {(REPO / target.partition("#")[0]).resolve() for target, _ in pages[readme].links}
    for page in DOCS.glob("*.md"):
        assert page.name in GENERATED or len(page.read_text().splitlines()) <= PAGE_MAX_LINES, f"{page.name}: split it"
        assert page.resolve() in linked, f"README.md does not link docs/{page.name}"


def test_readme_keeps_the_ci_test_command_on_its_own_line():
    """.ci/run runs exactly this; the README shows it as an indented code line."""
    assert "\n    HF_HUB_OFFLINE=1 python -m pytest -q\n" in (REPO / "README.md").read_text()


def _file_builders() -> dict[str, str]:
    """finetune/formats.py's FILE_BUILDERS (suffix -> loader): the formats finetune/data.py reads."""
    from finetune.formats import FILE_BUILDERS

    return FILE_BUILDERS


def test_the_data_formats_the_docs_list_are_the_loaders(pages):
    """docs/recipes-and-data.md's "Files" names every suffix the loader reads, and no other."""
    page = pages[DOCS / "recipes-and-data.md"]
    files = next(c for c in page.code if c.kind == "span" and c.text == "train_file")
    listed = {
        c.text for c in page.code
        if c.kind == "span" and 0 <= c.line - files.line < 8 and re.fullmatch(r"\.[a-z0-9]+", c.text)
    }  # fmt: skip
    assert listed == set(_file_builders()), f"docs/recipes-and-data.md:{files.line}: formats {sorted(listed)}"


@pytest.mark.parametrize("recipe", sorted(CONFIGS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(recipe, tmp_path):
    """Recipes for the user's own files have no data of their own: refused without a train_file, for
    that reason alone, and loaded with one."""
    try:
        load_config(recipe)
    except UserError as error:
        assert str(error).startswith("no training data"), f"{recipe.name}: {error}"
        train = tmp_path / "train.csv"
        train.write_text("text,label\ngood,1\nbad,0\n")
        load_config(recipe, [f"train_file={train}"])


# --- the checker checks something ------------------------------------------------------------------


def test_every_console_script_is_an_entry_point_read_from_its_own_parser():
    """A new console script (finetune-search was missing) joins ENTRIES, and each entry's flags come
    from the module its script runs."""
    section = (REPO / "pyproject.toml").read_text().partition("[project.scripts]")[2].partition("\n[")[0]
    scripts = dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', section, re.MULTILINE))  # no tomllib on 3.10
    assert "finetune-train" in scripts, section
    for script, target in scripts.items():
        if script in LAUNCHERS:
            continue
        entry = _entry(script)
        assert entry is not None and entry in ENTRIES, f"{script} is not in ENTRIES"
        module = target.partition(":")[0]
        # finetune/console.py holds no parser of its own: it answers the command line with finetune/cli.py's
        assert entry.parser == {"finetune.console": "finetune/cli.py"}.get(module, module.replace(".", "/") + ".py"), script
    for entry in ENTRIES:
        assert parser_flags(entry.parser) > {"-h", "--help"}, f"{entry.parser}: no add_argument found"
    assert "--config_file" in ACCELERATE_FLAGS and {"use_cpu", "fsdp_auto_wrap_policy"} <= ACCELERATE_KEYS


SYNTHETIC = """\
# A page

    HF_HUB_OFFLINE=1 python -m pytest -q
    accelerate launch --num_processes 2 finetune/run.py learning_rat=1e-4 \\
        model_config.image_size=32 peft.r=16 'max_memory.cuda:0=2GiB' [devices=cpu,cpu] key=value
    ACCELERATE_USE_CPU=true accelerate launch -m finetune.verify --config finetune/configs/nope.yaml
    accelerate launch --num_proceses 2 finetune/run.py --confg finetune/configs/bert_ner.yaml --learning_rate 3e-5 [--plan-only]
    accelerate launch finetune/evaluate_checkpoint.py runs/x/model --dat x.csv --predictions learning_rate=1 max_length=64
    python -m finetune.search --budget 60 warmup_ratoi=0.1 && finetune-search --budget 60 --seeed 1 --seed 1
    finetune-evaluate runs/x/model --output runs/x/eval --max_length 64 | tee log && echo num_epochs=3

```python
model = AutoModel.from_pretrained("x", config=config, learnig_rate=1)
```

Set `learning_rat=1e-4`, or `learning_rate=3e-5 learning_rate.x=1`; not `AdamW(foreach=True)`,
`device_ids=None`, `torch.load(weights_only=True)`, `OMP_NUM_THREADS=1` or `--num_processes 2`. Run `python -m benchmarks.bench --override dropuot=0`.
See `accelerate_configs/<file>`, `runs/x/model`, [a page](docs/nope.md#x) and [the top](#a-page).

Try `learnin_rate=3e-5 on the command line`; output is not a setting: `1,090 weights trained (LoRA r=4)`.
The drift: `ddp_kwargs: find_unused_parameters: true`, and `learning_rate: x: 1`; not `problem_type: null`,
`mixed_precision: 'no'`, `use_cpu: true`, `fsdp_config: fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP`,
or `error: output_dir <dir> is not shared`. Flags: `--dat <file>` and `--predictons`; not `--data <file>`,
`-m slow`, `--key value`, `[--plan-only]` or `-DOCSTART-`.
"""


def _offenders(problems: list[str]) -> list[str]:
    """The first quoted name of each problem: what it says is wrong."""
    return sorted(re.search(r"'([^']+)'", p.split(": ", 1)[1]).group(1) for p in problems)


def test_the_checker_finds_invented_keys_and_paths():
    page = parse(SYNTHETIC, REPO / "synthetic.md")
    problems = setting_problems(page)
    assert _offenders(problems) == sorted([
        "learning_rat", "learning_rat", "learning_rate", "dropuot",  # settings on a command, in spans
        "--num_proceses",  # accelerate launch's flags
        "--confg", "--dat", "--seeed",  # an entry point's flags (finetune-search's too)
        "learning_rate",  # evaluate_checkpoint.py sets only evaluation settings
        "warmup_ratoi",  # after `python -m finetune.search`
        "learnin_rate",  # in a span of prose
        "ddp_kwargs", "learning_rate",  # YAML form: unknown, and not a mapping
        "--dat", "--predictons",  # a span of flags alone
    ]), "\n".join(problems)  # fmt: skip
    assert any("'learning_rate' is not a mapping" in p for p in problems)
    assert any("'--confg'" in p and "did you mean '--config'" in p for p in problems), problems
    assert any("'ddp_kwargs'" in p and "synthetic.md:21:" in p for p in problems), problems
    assert all(":" in p.split(" ")[0] for p in problems)  # file:line
    paths = path_problems(page, {})
    assert sum("finetune/configs/nope.yaml" in p for p in paths) >= 1, paths
    assert any("docs/nope.md" in p for p in paths) and not any("#a-page" in p for p in paths), paths
    assert not any("<file>" in p or "runs/x" in p for p in paths), paths
