"""The docs name only what exists: every setting, path, link and recipe they mention resolves.

    python -m pytest -q tests/test_docs.py

Reads README.md, docs/*.md, benchmarks/README.md and accelerate_configs/README.md, and checks:

- every `key=value` that sets the app's config — on a command line that runs an entry point
  (finetune/run.py, finetune-train, finetune/evaluate_checkpoint.py, finetune-evaluate,
  finetune.verify, the SLURM script), after a benchmark's `--override`, or in a code span made only of
  such tokens (`learning_rate=3e-5`) — names a field of `TrainConfig`; a dotted key
  (`peft.r=16`, `max_memory.cuda:0=2GiB`) needs a mapping field as its head. Environment
  assignments (UPPERCASE), Python code (```python blocks, calls like `AdamW(fused=True)`) and other
  tools' flags (`--num_processes 2`) are not settings;
- every `--config` / `--config_file` value and every repository path in code or a link exists
  (placeholders with `<`, `*` or `...`, and run outputs like `runs/...` or `/tmp/...`, are skipped),
  and every `#anchor` of a link to a Markdown file is one of its headings;
- every shipped recipe loads;
- README.md is at most 150 lines, each docs page under 250, and README.md links every docs page.

Standard library, pytest and `finetune.config` (with its `UserError`) only: a couple of seconds.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from finetune.config import CONFIGS_DIR, TrainConfig, load_config
from finetune.errors import UserError

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(
    [REPO / "README.md", *DOCS.glob("*.md"), REPO / "benchmarks" / "README.md",
     REPO / "accelerate_configs" / "README.md"]
)  # fmt: skip
README_MAX_LINES = 150  # STYLE.md, habit 18: a README read in ten minutes
PAGE_MAX_LINES = 249  # each docs page "under 250"
# Named in the README's index before it is written (the code's layout, after the restructure). A
# missing file here is allowed; once it exists it is checked like every other page.
PENDING = {"docs/development.md"}

# A command line runs the app when one of its tokens is one of these (or ends with one).
ENTRY_POINTS = (
    "finetune/run.py", "finetune-train", "finetune.run",
    "finetune/evaluate_checkpoint.py", "finetune-evaluate", "finetune.evaluate_checkpoint",
    "finetune/verify.py", "finetune-verify", "finetune.verify",
    "scripts/slurm_multinode.sbatch",  # passes its arguments through to finetune/run.py
)  # fmt: skip
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


# --- the checks -------------------------------------------------------------------------------------


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


def check_key(token: str) -> str | None:
    """Why `token`, a `key=value` of the app, names no setting (None when it does or is no setting)."""
    match = SETTING.match(token)
    if not match or match.group("key") in PLACEHOLDER_KEYS:
        return None
    key, sub = match.group("key"), match.group("sub")
    if key not in FIELDS:
        return f"unknown setting {key!r} in {token!r}"
    if sub and key not in MAPPINGS:
        return f"{key!r} is not a mapping, so {token!r} sets nothing"
    return None


def _runs_the_app(word: str) -> bool:
    return any(word == entry or word.endswith("/" + entry) for entry in ENTRY_POINTS)


def setting_problems(page: Page) -> list[str]:
    found = []
    for code in page.code:
        if code.lang in ("python", "py", "pycon"):
            continue
        for line, number in command_lines(code):
            words = tokens(line)
            checked: list[str] = []
            entry = next((i for i, w in enumerate(words) if _runs_the_app(w)), None)
            if entry is not None:
                checked += words[entry + 1 :]
            checked += [w for prev, w in pairwise(words) if prev == "--override"]
            matches = [SETTING.match(w) for w in words]
            if code.kind == "span" and words and all(matches):
                # a span of settings only: `max_train_samples=null learning_rate=1e-4`
                checked += [
                    w for w, m in zip(words, matches, strict=True) if m.group("value") not in PYTHON_VALUES
                ]
            for word in dict.fromkeys(checked):
                problem = check_key(word)
                if problem:
                    found.append(f"{page.path.relative_to(REPO)}:{number}: {problem}")
    return found


def _skipped(path: str) -> bool:
    return any(p in path for p in PLACEHOLDER) or path.startswith(RUN_OUTPUTS) or "://" in path


def _exists(relative: str) -> bool:
    return (REPO / relative).exists() or relative.rstrip("/") in PENDING


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
        relative = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)
        if not resolved.exists():
            if relative not in PENDING:
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
        assert len(page.read_text().splitlines()) <= PAGE_MAX_LINES, f"{page.name}: split it"
        assert page.resolve() in linked, f"README.md does not link docs/{page.name}"


def test_readme_keeps_the_ci_test_command_on_its_own_line():
    """.ci/run runs exactly this; the README shows it as an indented code line."""
    assert "\n    HF_HUB_OFFLINE=1 python -m pytest -q\n" in (REPO / "README.md").read_text()


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

SYNTHETIC = """\
# A page

    HF_HUB_OFFLINE=1 python -m pytest -q
    accelerate launch --num_processes 2 finetune/run.py learning_rat=1e-4 \\
        model_config.image_size=32 peft.r=16 'max_memory.cuda:0=2GiB' [devices=cpu,cpu] key=value
    ACCELERATE_USE_CPU=true accelerate launch -m finetune.verify --config finetune/configs/nope.yaml

```python
model = AutoModel.from_pretrained("x", config=config, learnig_rate=1)
```

Set `learning_rat=1e-4`, or `learning_rate=3e-5 learning_rate.x=1`; not `AdamW(foreach=True)`,
`device_ids=None`, `torch.load(weights_only=True)`, `OMP_NUM_THREADS=1` or `--num_processes 2`. Run `python -m benchmarks.bench --override dropuot=0`.
See `accelerate_configs/<file>`, `runs/x/model`, [a page](docs/nope.md#x) and [the top](#a-page).
"""


def test_the_checker_finds_invented_keys_and_paths():
    page = parse(SYNTHETIC, REPO / "synthetic.md")
    problems = setting_problems(page)
    named = sorted(re.findall(r"'(\w+(?:\.\w+)?)' ", " ".join(problems)))
    assert named == ["dropuot", "learning_rat", "learning_rat", "learning_rate"], problems
    assert any("'learning_rate' is not a mapping" in p for p in problems)
    assert all(":" in p.split(" ")[0] for p in problems)  # file:line
    paths = path_problems(page, {})
    assert sum("finetune/configs/nope.yaml" in p for p in paths) >= 1, paths
    assert any("docs/nope.md" in p for p in paths) and not any("#a-page" in p for p in paths), paths
    assert not any("<file>" in p or "runs/x" in p for p in paths), paths
