"""Multiple-choice questions in SWAG's layout from the bundled SQuAD-shifts questions (CC BY 4.0):

    python scripts/squad_choices.py    # data/squad_choices/{train,validation}.jsonl and SOURCE.md

Each question of data/squad_shifts_wiki becomes one row: `sent1` the question, `ending0`-`ending3` four
candidate answers, `label` the right one's number. The candidates are the question's first gold answer and
three gold answers of other questions about the same article (distinct once lower-cased and stripped,
none equal to a gold answer of this question), drawn and ordered with a fixed seed; a question whose
article has fewer than three such answers is left out. The split is squad_shifts_wiki's (by article). The
context is not given: the model picks the answer that fits the question (a date for "when", a person for
"who"), closed-book; what it reads is short, which keeps the recipe quick.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE, OUT = REPO / "data" / "squad_shifts_wiki", REPO / "data" / "squad_choices"
SEED, CANDIDATES = 0, 4


def rows_of(questions: list[dict], rng: random.Random) -> list[dict]:
    by_article = defaultdict(set)
    for q in questions:
        by_article[q["title"]].update(a.strip() for a in q["answers"]["text"])
    rows = []
    for q in questions:
        golds = {a.strip().lower() for a in q["answers"]["text"]}
        others = sorted({a for a in by_article[q["title"]] if a.lower() not in golds})
        distinct = list({a.lower(): a for a in others}.values())
        if len(distinct) < CANDIDATES - 1:
            continue
        candidates = rng.sample(distinct, CANDIDATES - 1)
        label = rng.randrange(CANDIDATES)
        candidates.insert(label, q["answers"]["text"][0].strip())
        rows.append({"id": q["id"], "sent1": q["question"].strip(),
                     **{f"ending{i}": c for i, c in enumerate(candidates)}, "label": label})
    return rows


def main() -> None:
    OUT.mkdir(exist_ok=True)
    rng, sums = random.Random(SEED), {}
    for split in ("train", "validation"):
        questions = [json.loads(line) for line in (SOURCE / f"{split}.jsonl").read_text().splitlines()]
        rows = rows_of(questions, rng)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (OUT / f"{split}.jsonl").write_text(text)
        sums[split] = (len(questions), len(rows), hashlib.sha256(text.encode()).hexdigest())
    shutil.copy(SOURCE / "LICENSE.txt", OUT / "LICENSE.txt")
    lines = "\n".join(f"- `{s}.jsonl`: {kept:,} of the {n:,} questions, sha256 `{digest}`" for s, (n, kept, digest) in sums.items())
    (OUT / "SOURCE.md").write_text(
        "# squad_choices: multiple choice in SWAG's layout, from the SQuAD-shifts \"New Wikipedia\" questions\n\n"
        f"Built by `python scripts/squad_choices.py` from `data/squad_shifts_wiki` (its SOURCE.md says where that "
        f"comes from); how, in that script's docstring. Seed {SEED}.\n\n{lines}\n\n"
        "## Licence\n\nCreative Commons Attribution 4.0 International (CC BY 4.0), as the questions and answers it is "
        "made of (`LICENSE.txt`). Attribution: Miller, Krauth, Recht and Schmidt, \"The Effect of Natural Distribution "
        "Shift on Question Answering Models\", ICML 2020 (SQuAD-shifts).\n")


if __name__ == "__main__":
    main()
