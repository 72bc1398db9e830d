"""Whether a run learned: the best validation value of the judged metric against the trivial baseline's
(`metrics.learned` states the rule). `judge` gathers the facts; the warnings' lines are the rules'
(`finetune/checks/tools.py`: `did_not_learn`, `too_few_to_judge`), and a run that learned is told so here.
"""

from __future__ import annotations

from typing import Any

from finetune.checks import tools
from finetune.metrics import FEWEST_TO_JUDGE, METRICS, learned
from finetune.problems import problem_of


def judged_metric(cfg: Any) -> str:
    """The metric whether the model learned is judged by: metric_for_best_model, or the problem's main
    metric where that is the loss (a loss has no trivial baseline to be judged against)."""
    return cfg.metric_for_best_model if cfg.metric_for_best_model != "loss" else problem_of(cfg.problem_type).metrics.reported[0]


def better(key: str, value: float, than: float) -> bool:
    return value > than if METRICS[key].greater_is_better else value < than


def judge(cfg: Any, validation: dict, best: dict, tuned: dict | None = None,
          top: tuple[int, float] | None = None) -> dict:
    """Whether the model learned: the best validation value of the problem's main metric (or of
    metric_for_best_model) against the trivial baseline's: the best of the export's (`validation`), the
    best checkpoint's (`best`) and the periodic evaluations' (`top`: step, value). Where an evaluation beat
    the export, the line says so and how to export that one. With `tuned` (a threshold tuned on validation:
    `results["validation_tuned"]`), the export's validation value at that threshold against the baseline's
    at the same threshold: those are the decisions the export makes (the periodic evaluations' best used
    the fixed threshold)."""
    key = judged_metric(cfg)
    validation, value, earlier = _judged_value(key, validation, best, tuned, top)
    baseline = (validation.get("baseline") or {}).get(key)
    problem = problem_of(cfg.problem_type)
    words = key == "word_accuracy"
    n = (validation.get("num_words") if words else validation.get("num_samples", 0)) or 0
    verdict = learned(key, value, baseline, n)
    also = problem.also_judged_by
    if verdict and also is not None and key != also:  # an entity F1 above a baseline's 0 can still come
        # from a tagger worse than "every word O": it must not tag words worse than that. Not "clearly
        # above it" too: a tagger of entity F1 0.525 is 0.0197 above it, with most words O anyway.
        word_baseline = (validation.get("baseline") or {}).get(also)
        word_value = validation.get(also)
        if isinstance(word_value, (int, float)) and isinstance(word_baseline, (int, float)) and word_value <= word_baseline:
            verdict, key, value, baseline = False, also, word_value, word_baseline
    unreachable = (verdict is None and isinstance(value, (int, float)) and isinstance(baseline, (int, float))
                   and n >= FEWEST_TO_JUDGE and learned(key, 1.0, baseline, n) is None)  # fmt: skip
    facts = {
        "metric": key, "value": value, "baseline": baseline, "verdict": verdict, "n": n,
        "counted": "words" if words else problem.counted, "shown": METRICS[key].name,
        "at": " (at the tuned threshold)" if tuned is not None else "", "trivial": problem.trivial_words,
        "baseline_model": problem.baseline_model,
        "spread": ((validation.get("baseline") or {}).get("mse") or 0) ** 0.5,  # about the targets' spread
        "warn": verdict is False or (verdict is None and (n < FEWEST_TO_JUDGE or unreachable)),  # the card too
        "unreachable": unreachable,
    }  # fmt: skip
    said = tools.did_not_learn(facts) or tools.too_few_to_judge(facts)
    if said is None and verdict:
        side = "above" if METRICS[key].greater_is_better else "below"
        base = "0 (a constant correlates with nothing)" if baseline is None else f"{baseline:.4f}"
        said = f"best validation {facts['shown']} {value:.4f}{facts['at']}, clearly {side} the trivial baseline's {base}"
        if earlier is not None and earlier[0] is not None:
            said += (f"; that was at step {earlier[0]}, and the export, {validation.get(key):.4f}, is the last "
                     "step's: load_best_model_at_end=true exports the best")
    elif said is None:
        said = f"validation {facts['shown']} {value} against the trivial baseline's {baseline}"
    return {**facts, "said": said}


def _judged_value(key: str, validation: dict, best: dict, tuned: dict | None,
                  top: tuple[int, float] | None) -> tuple[dict, Any, tuple | None]:  # fmt: skip
    """`judge`'s validation, its value of `key`, and (step, value) of an evaluation better than the export
    (or None): at the tuned threshold where one was tuned, else the best of the export's, the best
    checkpoint's and the periodic evaluations'."""
    if tuned is not None:
        return tuned, tuned.get(key), None
    value, earlier = validation.get(key), None
    for seen in (top, (best.get("step"), best.get("value")) if best.get("metric") == key else None):
        if seen and isinstance(seen[1], (int, float)) and isinstance(value, (int, float)) and better(key, seen[1], value):
            value, earlier = seen[1], seen
    return validation, value, earlier
