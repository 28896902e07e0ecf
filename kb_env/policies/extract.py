"""Kernel source out of a model's reply: the last complete fenced code block."""

from __future__ import annotations

import re

# An opening fence (``` or ~~~, optional language tag) at a line start, and its matching close.
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_CODE_LANGS = {"", "python", "py", "python3"}

# What is submitted when a reply has no code: a syntax error whose line, quoted in the compiler
# output the agent reads next, says what happened.
NO_CODE_SOURCE = ("# kb_env: nothing was submitted\n"
                  "no code block in the reply: answer with the whole module in one ```python block\n")


def extract_code(reply: str) -> str | None:
    """The body of the last complete fenced block tagged python (or untagged), else None. An
    unterminated block at the end (a reply cut off by max_tokens) does not count."""
    blocks = [m for m in _FENCE.finditer(reply) if m.group("lang").lower() in _CODE_LANGS]
    return blocks[-1].group("body") if blocks else None
