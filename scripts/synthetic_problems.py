"""Write small synthetic regression and multi-label text datasets, to try their recipes on (no data is
bundled for them; the README's figures for those recipes were measured on these files).

    python scripts/synthetic_problems.py /tmp/synthetic
    accelerate launch finetune/run.py --config finetune/configs/bert_regression.yaml \\
        train_file=/tmp/synthetic/regression/train.jsonl \\
        validation_file=/tmp/synthetic/regression/validation.jsonl test_file=/tmp/synthetic/regression/test.jsonl
    accelerate launch finetune/run.py --config finetune/configs/bert_multi_label.yaml \\
        train_file=/tmp/synthetic/multi_label/train.jsonl \\
        validation_file=/tmp/synthetic/multi_label/validation.jsonl test_file=/tmp/synthetic/multi_label/test.jsonl

regression/: {"text", "score"}: a "review" of 5-14 words, some rated (awful -2, bad -1, good +1,
great +2, excellent +3); the score is the sum of the ratings of its rated words.
multi_label/: {"text", "labels"}: a sentence naming things of 1-3 of five topics (animals, weather,
music, food, travel) among filler words; the labels are the topics named. multi_label/*.csv holds the
same rows with one 0/1 column per topic (label_columns=animals,weather,music,food,travel).
Seeded: the same files on every machine.
"""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

RATINGS = {"awful": -2, "bad": -1, "good": 1, "great": 2, "excellent": 3}
NEUTRAL = ["the", "movie", "film", "plot", "was", "acting", "and", "story", "very", "a", "music", "cast"]
TOPICS = {
    "animals": ["cat", "dog", "horse", "bird", "cow"],
    "weather": ["rain", "snow", "wind", "sun", "storm"],
    "music": ["piano", "guitar", "drum", "song", "violin"],
    "food": ["bread", "apple", "cheese", "soup", "rice"],
    "travel": ["car", "train", "bike", "plane", "boat"],
}
FILLER = ["the", "a", "we", "saw", "near", "and", "with", "in", "some", "old", "new", "today"]
SIZES = {"train": 2000, "validation": 300, "test": 300}


def regression_row(rng: random.Random) -> dict:
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 9))]
    words += [rng.choice(list(RATINGS)) for _ in range(rng.randint(1, 5))]
    rng.shuffle(words)
    return {"text": " ".join(words), "score": float(sum(RATINGS.get(w, 0) for w in words))}


def multi_label_row(rng: random.Random) -> dict:
    topics = rng.sample(list(TOPICS), rng.choice([1, 1, 2, 2, 3]))
    words = [rng.choice(TOPICS[t]) for t in topics] + [rng.choice(FILLER) for _ in range(rng.randint(3, 8))]
    rng.shuffle(words)
    return {"text": " ".join(words), "labels": sorted(topics)}


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python scripts/synthetic_problems.py OUTPUT_DIR")
    root = Path(argv[0])
    for name, make in (("regression", regression_row), ("multi_label", multi_label_row)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for seed, (split, n) in enumerate(SIZES.items()):
            rng = random.Random(1000 * seed + len(name))
            rows = [make(rng) for _ in range(n)]
            (root / name / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            if name == "multi_label":
                with (root / name / f"{split}.csv").open("w", newline="") as f:
                    writer = csv.DictWriter(f, ["text", *TOPICS])
                    writer.writeheader()
                    writer.writerows({"text": r["text"], **{t: int(t in r["labels"]) for t in TOPICS}} for r in rows)
    print(f"wrote {root}/regression/ and {root}/multi_label/ (train {SIZES['train']}, validation and test 300 each)")


if __name__ == "__main__":
    main(sys.argv[1:])
