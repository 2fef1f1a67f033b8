"""Answer normalisation: HybridQA's official one, and a word-break variant for finding an answer inside a text."""

from __future__ import annotations

import re
import string

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ARTICLE_WORDS = frozenset({"a", "an", "the"})
_WORD = re.compile(rf"[^\s{re.escape(string.punctuation)}]+")


def normalize_answer(text: str) -> str:
    """The official HybridQA evaluation's (SQuAD's); also used to find answer cells."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def contains_answer(text: str, normalized_answer: str) -> bool:
    """``normalized_answer`` occurs in ``normalize_answer(text)`` on word boundaries."""
    return f" {normalized_answer} " in f" {normalize_answer(text)} "


def answer_words(text: str) -> list[tuple[str, int, int]]:
    """``(lower-cased word, char start, char end)``, articles dropped; punctuation breaks words instead of vanishing,
    so ``Ferrari`` is found in ``Ferrari's`` (PointR's gold span)."""
    words = ((match.group().lower(), match.start(), match.end()) for match in _WORD.finditer(text))
    return [word for word in words if word[0] not in _ARTICLE_WORDS]
