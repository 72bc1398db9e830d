"""How a text reads, and how a line shows it: the helpers every message and check that quotes data uses.

Nothing heavy is imported: the config, the checks and the tasks read these.
"""

from __future__ import annotations

import re
import shlex
import unicodedata

# A text that reads as nothing: spaces and invisible format characters (zero-width spaces and joiners,
# word joiners, a byte-order mark, soft hyphens). A regular expression: it stops at a text's first visible
# character, so a corpus is checked at no cost.
BLANK = re.compile(r"[\s\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]*")


def visible(text: str) -> str:
    """`text` as it reads: in one Unicode form (NFKC: an accent composed or not, a full-width digit), without
    the invisible format characters (zero-width spaces and joiners, a byte-order mark)."""
    return "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")


def shown(text: str) -> str:
    """`text` quoted, its invisible and combining characters written as escapes ('cafe\\u0301', 'pos\\u200b'):
    two names that `visible` makes one are told apart."""
    marks = "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cf", "Mn") else c for c in text)
    return repr(marks).replace("\\\\u", "\\u")


def pasted(value) -> str:
    """A path or value as a line offers it in a command or a key=value setting: quoted for the shell where it
    holds a space or another character the shell reads (shlex.quote), so the line's advice can be pasted."""
    return shlex.quote(str(value))


def a(word: str) -> str:
    """`word` with its article: 'an image', 'a text'."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
