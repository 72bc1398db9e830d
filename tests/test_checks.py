"""The checks layer (finetune/checks/): every rule has a case and a line in the docs, no rule fires on good
data, a good file is read once by the parser and once for its fingerprint, and the import graph runs one way.

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_checks.py
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from pathlib import Path

from conftest import DATA, REPO, TOKENIZER

from finetune import checks
from finetune.checks import catalogue
from finetune.config import load_config

TESTS = Path(__file__).resolve().parent
RULE_ID = re.compile(r"[a-z]+\.[a-z0-9_]+")


def _test_strings() -> set[str]:
    """Every string constant of the test files (a catalogue key `files.compressed:gzip` as its rule's id)."""
    found: set[str] = set()
    for path in TESTS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value.split(":")[0])
    return found


def _named_rules() -> set[str]:
    """The ids the tests give as `rule=...` (a case that names its rule)."""
    named: set[str] = set()
    for path in TESTS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "rule" and isinstance(node.value, ast.Constant):
                named.add(str(node.value.value).split(":")[0])
    return named


def test_every_rule_has_a_case_and_every_case_names_a_rule():
    """The catalogue is keyed by rule id: each rule is named by a test (a `rule=` case of tests/conftest.py's
    `user_error`, a key of tests/test_bad_input.py's CASES, or an assertion on a run's warnings), and every
    rule a test names exists."""
    rules = {r.id for group in catalogue.rules().values() for r in group}
    strings = _test_strings()
    assert sorted(rules - strings) == []
    assert sorted(_named_rules() - rules) == []


def test_the_docs_list_every_rule_from_its_docstring():
    """docs/bad-input.md is made from the rules: `python -m finetune.checks > docs/bad-input.md`."""
    assert (REPO / "docs" / "bad-input.md").read_text() == catalogue.markdown()


def test_a_rule_reads_at_a_glance_and_says_what_it_finds():
    for group in catalogue.rules().values():
        for r in group:
            lines, _ = inspect.getsourcelines(r.fn)
            assert len(lines) <= 31, (r.id, len(lines))  # 30 and its decorator
            assert r.doc, r.id
            assert RULE_ID.fullmatch(r.id) and r.phase in catalogue.PHASES, r.id


def _said(load) -> list[tuple[str, str]]:
    said = checks.Said(quiet=True)
    load(said)
    return said.lines


def _text_run(cfg, said):
    """The data phase of a text run, as finetune/run.py makes it: read, checked, encoded and tokenized."""
    from finetune.data import load_splits, prepare_splits, read_splits
    from finetune.models import load_preprocessor

    raw, _ = load_splits(cfg.data_args, said, read_splits(cfg.data_args, said))
    prepare_splits(cfg.data_args, raw, load_preprocessor(cfg.model_args), said=said)


def _public_files(root: Path) -> dict[str, list[str]]:
    """Clean files in the public formats, as other tools write them: a CSV with quoted newlines and commas
    (pandas' to_csv), JSON Lines, a TSV, a CoNLL file with a -DOCSTART- line and a CoNLL-U file."""
    import pandas as pd

    rows = [{"text": f"a film, which {'ends' if i % 2 else 'starts'} well\nand \"goes on\" {i}", "label": ["neg", "pos"][i % 2]}
            for i in range(40)]  # fmt: skip
    pd.DataFrame(rows).to_csv(root / "quoted.csv", index=False)
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_csv(root / "rows.tsv", sep="\t", index=False)
    words = [("Ada", "B-PER"), ("Lovelace", "I-PER"), ("lived", "O"), ("in", "O"), ("London", "B-LOC"), (".", "O")]
    people = ["Ada", "Alan", "Grace", "Emmy", "Marie", "Rosalind", "Katherine", "Barbara", "Frances", "Hedy"]
    sentences = [[(people[i % 10], "B-PER"), *words[1:4], (["London", "Paris", "Rome"][i % 3], "B-LOC"), (".", "O")]
                 for i in range(30)]  # fmt: skip
    (root / "ner.conll").write_text("-DOCSTART- -X- O O\n\n" + "\n".join("".join(f"{w} {t}\n" for w, t in s)
                                                                        for s in sentences))  # fmt: skip
    upos = ["\n".join(f"{i}\t{w}\t{w.lower()}\t{'PROPN' if t != 'O' else 'X'}\t_\t_\t0\troot\t_\t_"
                      for i, (w, t) in enumerate(s, 1)) + "\n" for s in sentences]  # fmt: skip
    (root / "ud.conllu").write_text("".join(f"# sent_id = {n}\n{u}\n" for n, u in enumerate(upos, 1)))
    base = [f"tokenizer_name={TOKENIZER}", "validation_file=null", "test_file=null"]
    return {
        "quoted csv": ["--config", "finetune/configs/bert_custom_files.yaml", f"train_file={root / 'quoted.csv'}", *base],
        "jsonl": ["--config", "finetune/configs/bert_custom_files.yaml", f"train_file={root / 'rows.jsonl'}", *base],
        "tsv": ["--config", "finetune/configs/bert_custom_files.yaml", f"train_file={root / 'rows.tsv'}", *base],
        "conll": ["--config", "finetune/configs/bert_ner.yaml", f"train_file={root / 'ner.conll'}", *base],
        "conllu": ["--config", "finetune/configs/bert_ner.yaml", f"train_file={root / 'ud.conllu'}", *base],
    }


def test_no_rule_fires_on_the_bundled_data_sets():
    """The bundled recipes' data (rotten_tomatoes, UNER English, SQuAD-shifts and its multiple-choice
    questions, Fashion-MNIST, its PNG sample folder): read, checked and prepared, with not one warning."""
    from finetune.data import load_splits, read_splits

    for recipe in ("bert_rotten_tomatoes.yaml", "bert_ner.yaml", "bert_qa.yaml", "bert_choices.yaml"):
        cfg = load_config(f"finetune/configs/{recipe}")
        assert _said(lambda said, c=cfg: _text_run(c, said)) == [], recipe
    for recipe in ("vit_fashion_mnist.yaml", "vit_imagefolder.yaml"):
        args = load_config(f"finetune/configs/{recipe}").data_args
        assert _said(lambda said, a=args: load_splits(a, said, read_splits(a, said))) == [], recipe


def test_no_rule_fires_on_clean_files_in_the_public_formats(tmp_path):
    from finetune.cli import parse_command_line

    for name, argv in _public_files(tmp_path).items():
        cfg = parse_command_line(argv).cfg
        assert _said(lambda said, c=cfg: _text_run(c, said)) == [], name


def test_no_rule_fires_on_a_clean_image_folder(tmp_path):
    from conftest import drawn_images

    from finetune.data import load_splits, read_splits

    colors = {"cat": [(200, 10 * i, 0) for i in range(11)], "dog": [(0, 10 * i, 200) for i in range(11)]}
    drawn_images(tmp_path / "photos", {k: v[:8] for k, v in colors.items()}, size=(40, 30))
    drawn_images(tmp_path / "photos", {k: v[8:] for k, v in colors.items()}, "test", size=(40, 30))
    args = load_config("finetune/configs/vit_photos.yaml", [f"data_dir={tmp_path / 'photos'}"]).data_args
    assert _said(lambda said: load_splits(args, said, read_splits(args, said))) == []



def test_no_rule_fires_on_regression_ratings_whose_texts_repeat(tmp_path):
    """Whole 1-5 ratings to regress on, a short review repeated with two ratings (two readers): good regression
    data, not a text with two classes (splits.one_sample_two_labels warned) nor a rating whose every text also
    has another (splits.class_within_another refused the run)."""
    import pandas as pd

    from finetune.data import load_splits, read_splits

    rows = [{"text": f"review {i} of a film that {'ends' if i % 3 else 'starts'} well", "score": 2 + i % 4} for i in range(40)]
    rows += [{"text": t, "score": s} for t in ("awful", "dreadful") for s in (1, 2)]  # every 1 is also a 2
    pd.DataFrame(rows).to_csv(tmp_path / "ratings.csv", index=False)
    args = load_config("finetune/configs/bert_regression.yaml", [f"train_file={tmp_path / 'ratings.csv'}"]).data_args
    assert _said(lambda said: load_splits(args, said, read_splits(args, said))) == []

_OPENED: list[tuple[str, str]] | None = None  # (the path, who opened it: the app, or the library and how)


def _count_opens(event: str, args: tuple) -> None:
    if _OPENED is None or event != "open" or not isinstance(args[0], (str, Path)):
        return
    frame, stack = sys._getframe(1), []  # the files of the calling frames (no source read: no open of its own)
    while frame is not None:
        stack.append(frame.f_code.co_filename)
        frame = frame.f_back
    app = str(REPO / "finetune")
    caller = stack[0]  # where open() was called
    who = "app" if caller.startswith(app) else "probe" if any(f.endswith("extract.py") for f in stack) else "parser"
    _OPENED.append((str(args[0]), who))


def test_a_good_file_is_read_once_for_its_fingerprint_and_once_by_the_parser(tmp_path, monkeypatch):
    """On the happy path each data file is read twice: by the app's one pass that hashes it, reads its head
    for the file rules, checks it is UTF-8 and reads a CSV's cells for leading zeros; and by the parser.
    Counted with an audit hook over the data phase of a run. (datasets also opens it a few times to read its
    first bytes, looking for an archive's magic number: `probe`.)"""
    global _OPENED
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # the parser reads the file
    files = {split: tmp_path / f"{split}.csv" for split in ("train", "validation", "test")}
    for split, path in files.items():
        path.write_text((DATA / "rotten_tomatoes" / f"{split}.csv").read_text())
    cfg = load_config(None, [f"{split}_file={path}" for split, path in files.items()])
    sys.addaudithook(_count_opens)  # (a hook stays for the process: it counts only while _OPENED is a list)
    _OPENED = []
    try:
        _text_run(cfg, checks.Said(quiet=True))
        opened = list(_OPENED)
    finally:
        _OPENED = None
    for split, path in files.items():
        by = [who for p, who in opened if p == str(path)]
        assert (by.count("app"), by.count("parser")) == (1, 1), (split, by)


# The layers of the package, lowest first: a module imports only from the layers below its own. The checks'
# phase modules sit below the core they guard; checks/settings.py and checks/columns.py read the task registry,
# which asks checks/inputs.py, checks/images.py and checks/models.py.
LAYERS = [
    {"errors"},
    {"text", "formats", "digests"},
    {"signals", "checks", "metrics", "squad"},
    {"layout"},
    {"checks.inputs", "checks.images", "checks.files", "checks.labels", "checks.models", "checks.runs",
     "checks.launch", "checks.tools", "checks.catalogue"},
    {"lora", "images", "parallel", "checks.splits", "rundir"},
    {"checks.evaluation"},
    {"tasks.base"},
    {"tasks.text", "tasks.images"},
    {"tasks.tags", "tasks.questions", "tasks.choices"},
    {"tasks"},
    {"checks.columns"},
    {"checks.streams"},  # a streamed block's rows by the columns' rules for a row
    {"checks.settings"},
    {"config", "exits"},
    {"problems.base"},
    {"problems.multi_label", "problems.regression", "problems.tags", "problems.spans", "problems.choices"},
    {"problems"},
    {"runtime", "steps", "shapes", "models", "card", "launch", "cli", "verdict"},
    {"data", "checkpoint", "evaluation"},
    {"streams"},
    {"plots", "tracking"},
    {"export", "onnx_export"},
    {"run"},
    {"evaluate_checkpoint", "search", "verify", "console", "checks.__main__"},
]  # fmt: skip


def _layer_of(module: str) -> int:
    name = module.removeprefix("finetune.")
    return next((i for i, layer in enumerate(LAYERS) if name in layer), -1)


def test_the_import_graph_has_no_cycle_and_every_edge_runs_down():
    """Every import of the package (inside functions too, `if TYPE_CHECKING:` blocks aside: they never run),
    from a module to one of a lower layer of LAYERS; so no cycle."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import house_figures
    finally:
        sys.path.pop(0)
    modules = house_figures.modules()
    unplaced = sorted(m for m in modules if m != "finetune" and _layer_of(m) < 0)
    assert unplaced == [], "a module of no layer: add it to LAYERS"
    upward = []
    for name, path in modules.items():
        for target, _, line in house_figures.imports(path, name, set(modules)):
            if target != "finetune" and name != "finetune" and _layer_of(target) >= _layer_of(name) and not (
                    name.startswith("finetune.checks.") and target == "finetune.checks"):  # fmt: skip
                upward.append(f"{path.relative_to(REPO)}:{line} -> {target}")
    assert upward == []


GERMAN = [
    "Die Bundesregierung hat am Mittwoch beschlossen, die Förderung für erneuerbare Energien deutlich auszuweiten.",
    "Nach Angaben des Statistischen Bundesamtes stiegen die Verbraucherpreise im vergangenen Monat überraschend stark.",
    "Der Verkehrsminister kündigte an, das Schienennetz bis zum Jahr zweitausenddreißig grundlegend zu modernisieren.",
    "Die Gewerkschaften fordern höhere Löhne und eine Verkürzung der wöchentlichen Arbeitszeit.",
    "Im Landtag wurde heftig über die geplante Schulreform und die Ausstattung der Grundschulen gestritten.",
    "Die Stadtverwaltung empfiehlt den Bürgern, bei Hitze ausreichend zu trinken und körperliche Anstrengung zu meiden.",
    "Wegen eines Unwetters fielen zahlreiche Verbindungen im Regionalverkehr am Wochenende aus.",
    "Die Mannschaft gewann das Auswärtsspiel nach einer spannenden Verlängerung mit zwei zu eins.",
]


def test_a_vocabulary_of_another_language_is_said_from_how_it_cuts_the_words():
    """German news under the bundled English uncased vocabulary: no unknown token (accents are stripped), but
    most words cut into pieces; said once, with the fix. The bundled English reviews take about 1.1 pieces a
    word (what the rule's threshold, 1.6, is set against)."""
    import csv

    from datasets import ClassLabel, Dataset
    from transformers import AutoTokenizer

    from finetune.checks import inputs
    from finetune.tasks import task_of

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    english = [row["text"] for row in csv.DictReader((DATA / "rotten_tomatoes" / "train.csv").open())]
    ratio, share = inputs.pieces_a_word(english, tokenizer)
    assert ratio < 1.2 and share < 0.1
    cfg = load_config(None, [f"tokenizer_name={TOKENIZER}"])
    ds = Dataset.from_dict({"text": GERMAN * 5, "labels": [i % 2 for i in range(40)]}).cast_column(
        "labels", ClassLabel(names=["a", "b"]))
    said = checks.Said(quiet=True)
    task_of("text-classification").prepare(ds, tokenizer, cfg.data_args, "train", 3, said)
    assert said.rules() == ["inputs.words_in_pieces"]
    assert "of the training texts' words into two or more pieces" in said.lines[0][1]


def test_a_user_error_is_made_in_the_checks_layer_alone():
    """`UserError(` is constructed by the checks layer (its gate, from a rule) and nowhere else in the
    package: a refusal is a named rule with its case, never a branch of the core."""
    package = REPO / "finetune"
    made = []
    for path in package.rglob("*.py"):
        if path.parent.name == "checks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            if isinstance(node, ast.Call) and getattr(name, "id", getattr(name, "attr", None)) == "UserError":
                made.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert made == []
