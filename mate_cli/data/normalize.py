"""Answer normalisation, in one place.

- :func:`normalize_answer`: the official HybridQA evaluation's (SQuAD's): lower-case,
  drop every ``string.punctuation`` character, replace the whole-word articles
  ``a``/``an``/``the`` by a space, collapse whitespace. Used by the metrics and to find
  which cells hold an answer.
- :func:`answer_words`: the deliberate variant for locating an answer *inside* a text
  (the reader's gold span): punctuation acts as a word break instead of vanishing, so
  ``Ferrari`` is found in ``Ferrari's``, and each word keeps its character span.
"""

from __future__ import annotations

import re
import string

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ARTICLE_WORDS = frozenset({"a", "an", "the"})
_WORD = re.compile(rf"[^\s{re.escape(string.punctuation)}]+")


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation, remove articles, collapse whitespace (in that order)."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def contains_answer(text: str, normalized_answer: str) -> bool:
    """``normalized_answer`` occurs in ``normalize_answer(text)`` on word boundaries."""
    return f" {normalized_answer} " in f" {normalize_answer(text)} "


def answer_words(text: str) -> list[tuple[str, int, int]]:
    """``(lower-cased word, char start, char end)``; punctuation breaks words, articles dropped."""
    out = []
    for match in _WORD.finditer(text):
        word = match.group().lower()
        if word not in _ARTICLE_WORDS:
            out.append((word, match.start(), match.end()))
    return out
