"""PointR cell expansion (MATE paper §4.1, Fig. 3): linked-passage sentences appended to data cells (never the header).

``method="tfidf"``: one ``TfidfVectorizer`` (lowercased, English stop words, else scikit-learn's defaults) is fitted
per (question, table) on the sentences of every passage linked from the data cells plus the question, so IDF measures
how distinctive a word is within this table's passages. Ties, all-zero scores included, go by document order
(passages by first link, row-major, then sentence index); exactly ``min(k, available)`` sentences are taken.
``scope="table"`` takes the top ``k`` over the table and appends each to every cell linking its passage;
``scope="cell"`` each cell's top ``k`` among its own passages. ``method="first"``: the first ``k`` sentences of each
linked passage (a cheap baseline; ``scope`` is ignored).
"""

from __future__ import annotations

import logging
import re

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from mate_cli.data.records import Question, Table
from mate_cli.errors import MateError

log = logging.getLogger(__name__)

SCOPES = ("table", "cell")
METHODS = ("tfidf", "first")

_BOUNDARY = re.compile(r"[.!?]+[\"')\]]*\s+")
_ABBREVIATIONS = set(
    "mr mrs ms dr st jr sr vs no nos etc inc ltd co corp mt ft gen col lt sgt capt rev prof gov sen rep jan feb mar apr"
    " jun jul aug sep sept oct nov dec approx".split()
)


def _is_abbreviation(word: str) -> bool:
    """``word``: the text right before a period."""
    bare = word.lstrip("\"'([")
    return (len(bare) == 1 and bare.isalpha()) or "." in bare or bare.lower() in _ABBREVIATIONS


def split_sentences(text: str) -> list[str]:
    """Passage text as sentences. A boundary is ``.``/``!``/``?`` (closing quotes or brackets after it), whitespace,
    then an upper-case letter, digit or opening quote/bracket, unless the word before the period is an initial (``J.``),
    holds a period (``U.S.``) or is a common abbreviation (``Dr.``); a newline always ends a sentence. Works on raw
    text and on WikiTables-WithLinks' space-tokenised text (``driver . He``)."""
    sentences: list[str] = []
    for block in text.splitlines():
        start = 0
        for match in _BOUNDARY.finditer(block):
            nxt = block[match.end() : match.end() + 1]
            if not nxt or not (nxt.isupper() or nxt.isdigit() or nxt in "\"'(["):
                continue
            before = block[start : match.start()].rsplit(None, 1)
            word = before[-1] if before and not block[match.start() - 1].isspace() else ""
            if block[match.start()] == "." and word and _is_abbreviation(word):
                continue
            sentences.append(block[start : match.end()].strip())
            start = match.end()
        sentences.append(block[start:].strip())
    return [s for s in sentences if s]


def linked_passages(table: Table, passages: dict[str, str]) -> list[str]:
    """Links of the data cells that have a passage, in order of first appearance."""
    return list(dict.fromkeys(link for row in table.rows for cell in row for link in cell.links if link in passages))


def tfidf_scores(query: str, sentences: list[str]) -> np.ndarray:
    """``[len(sentences)]`` cosine similarities with ``query``; all zeros when no word survives stop-word removal."""
    if not sentences:
        return np.zeros(0)
    vectorizer = TfidfVectorizer(lowercase=True, stop_words="english")
    try:
        matrix = vectorizer.fit_transform(sentences + [query])
    except ValueError:  # empty vocabulary
        return np.zeros(len(sentences))
    return np.asarray((matrix[:-1] @ matrix[-1].T).todense()).ravel()


def _rank(candidates: list[int], scores: np.ndarray, k: int) -> list[int]:
    return sorted(candidates, key=lambda i: (-scores[i], i))[:k]


def format_expanded(text: str, sentences: list[str]) -> str:
    """``"<text> ( <s1> <s2> ... )"``."""
    return f"{text} ( {' '.join(sentences)} )".strip() if sentences else text


def _check_args(k: int, scope: str, method: str) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise MateError(f"expansion k must be an integer >= 0, got {k!r}; set e.g. dataset.expansion.k=5")
    if scope not in SCOPES:
        raise MateError(f"expansion scope must be one of {SCOPES}, got {scope!r}; set dataset.expansion.scope")
    if method not in METHODS:
        raise MateError(f"expansion method must be one of {METHODS}, got {method!r}; set dataset.expansion.method")


def expand_table(
    question: Question, table: Table, passages: dict[str, str], k: int = 5, scope: str = "table", method: str = "tfidf"
) -> list[list[str]]:
    """Expanded data-cell texts, ``[num_rows][num_columns]``."""
    _check_args(k, scope, method)
    links = linked_passages(table, passages)
    split = {link: split_sentences(passages[link]) for link in links}
    if method == "first":
        first = lambda cell: [s for link in dict.fromkeys(cell.links) for s in split.get(link, [])[:k]]  # noqa: E731
        return [[format_expanded(c.text, first(c)) for c in row] for row in table.rows]
    units = [(link, s) for link in links for s in split[link]]
    owner: dict[str, list[int]] = {link: [] for link in links}
    for i, (link, _) in enumerate(units):
        owner[link].append(i)
    scores = tfidf_scores(question.question, [s for _, s in units])
    if scope == "table":
        rank = {i: r for r, i in enumerate(_rank(list(range(len(units))), scores, k))}
        pick = lambda ids: sorted((i for i in ids if i in rank), key=rank.__getitem__)  # noqa: E731
    else:
        pick = lambda ids: _rank(ids, scores, k)  # noqa: E731
    ids = lambda cell: [i for link in dict.fromkeys(cell.links) for i in owner.get(link, ())]  # noqa: E731
    return [[format_expanded(c.text, [units[i][1] for i in pick(ids(c))]) for c in row] for row in table.rows]
