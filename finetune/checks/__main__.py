"""docs/bad-input.md, made from the rules' docstrings: `python -m finetune.checks > docs/bad-input.md`."""

from __future__ import annotations

from finetune.checks.catalogue import markdown

if __name__ == "__main__":
    print(markdown(), end="")
