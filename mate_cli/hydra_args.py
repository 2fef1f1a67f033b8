"""Free text as Hydra override values: quoting that parses back to exactly what was typed."""

from __future__ import annotations

import re


#: ``mate predict`` arguments that are free text, quoted for Hydra as the user typed them
FREE_TEXT = {"predict": ("question",)}


def hydra_quote(text: str) -> str:
    """``text`` as a single-quoted Hydra value that parses back to ``text`` exactly (Hydra keeps backslashes unless
    they precede a quote or end the string; ``${``, an interpolation, is escaped)."""
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("${", "\\${") + "'"


def quote_free_text(command: str, args: list[str]) -> list[str]:
    """``question=What's 1,000?`` -> ``question='What\\'s 1,000?'`` (already quoted values are kept)."""
    keys = FREE_TEXT.get(command, ())
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        out.append(f"{key}={hydra_quote(value)}" if sep and key in keys and not quoted else arg)
    return out
