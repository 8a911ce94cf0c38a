"""Random corruptions of a valid text file (delete, insert junk, duplicate, truncate, replace),
drawn by hypothesis: the config and record readers must answer each with their own error."""
from __future__ import annotations

from hypothesis import strategies as st


def corrupt_text(text: str, data) -> str:
    """Apply one to three random edits: delete a span, insert junk, duplicate a span, truncate."""
    for _ in range(data.draw(st.integers(1, 3))):
        n = len(text)
        i = data.draw(st.integers(0, n))
        j = data.draw(st.integers(i, min(n, i + 12)))
        kind = data.draw(st.sampled_from(["delete", "insert", "dup", "truncate", "replace"]))
        junk = data.draw(st.text(alphabet='{}:"\'\\#\n -0123456789.eEabcnuflsrtx,[]', max_size=6))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + junk + text[i:]
        elif kind == "dup":
            text = text[:j] + text[i:j] + text[j:]
        elif kind == "truncate":
            text = text[:i]
        else:
            text = text[:i] + junk + text[j:]
    return text
