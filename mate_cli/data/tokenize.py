"""Tokenization: a question + table become WordPiece ids and layout ids, exactly once.

Owns: :class:`TableTokenizer` (ids, TAPAS layout ids, numeric column ranks, the length
budget), :func:`candidate_cells` (which cells hold the answer) and :func:`column_ranks`.

Sequence (TAPAS conventions, see :mod:`mate_cli.modeling.layout`)::

    [CLS] question [SEP] header cells (row 0) data row 1 ... data row R

Per token: ``segment`` 0 for [CLS]/question/[SEP], 1 for table tokens (header
included); ``row`` 0 for query and header, 1..R for data rows; ``column`` 0 for query,
1..C; ``cell`` 0 for query/specials/header, k >= 1 for the k-th data cell that has
tokens (row-major). **Empty cells have no tokens**, so they get no cell id and cannot
be selected; ``cell_coords[k - 1]`` = (data row, column) of cell k, listing only
cells with >= 1 token. Nothing is padded here (the collator pads).

Length budget (paper §4.1): the question is cut to ``max_question_tokens`` first.
If the table still does not fit in ``max_length - 2 - len(question)``, every table cell
(header included) is capped at ``c`` tokens, ``c`` the largest value with
``sum(min(len(cell), c)) <= budget``: the longest cells shrink first and short cells
stay whole. If even ``min_cell_tokens`` (default 1) per non-empty cell does not fit,
trailing data rows are dropped until it does. ``truncated`` is set when anything was
cut, and the example records ``rows_dropped`` and ``candidates_dropped`` (the
datamodule's split statistics sum them).

Column ranks (TAPAS semantics): per column, the data cells that are not empty or a
missing-value placeholder (``-``, ``–``, ``n/a``, ``?``, ...) must *all* parse as
numbers, or all as dates; then they get dense ranks ascending from 1 (ties share a
rank) and inverse ranks counted from the largest. Otherwise the column gets 0s, as do
placeholders, header and query. Numbers: optional leading currency (``$£€¥₹``),
sign, thousands commas, decimals, trailing ``%``; a range (``1990–1995``,
``5 to 10``) takes its first number. Dates (a small parser, not dateutil, which is too
lenient for ranking): ``YYYY-MM-DD``, ``D Month YYYY``, ``Month D, YYYY``,
``Month YYYY``, ``D Month`` / ``Month D`` (year 0) and a bare ``YYYY`` (a column of
bare years alone is numeric).
Ranks are computed on the original cell text of the whole table (never on expanded
text), before rows are dropped.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable, Sequence

from mate_cli.data.schema import EncodedExample, Question, Table
from mate_cli.data.normalize import contains_answer, normalize_answer
from mate_cli.errors import MateError
from mate_cli.modeling.layout import ID_FIELDS

log = logging.getLogger(__name__)

Coord = tuple[int, int]


# ============================================================ numbers and dates
_PLACEHOLDERS = {"", "-", "–", "—", "−", "n/a", "na", "n.a.", "?", "tbd", "tba", "none", "unknown", "×", "x"}
_CUR = "$£€¥₹"
_NUM = r"[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+\-−]?\.\d+"
_NUMBER_RE = re.compile(
    rf"^[{_CUR}]?\s*({_NUM})\s*%?(?:\s*(?:-|–|—|to)\s*[{_CUR}]?\s*(?:{_NUM})\s*%?)?$", re.IGNORECASE
)
_MONTHS = {
    name: i + 1
    for i, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
         ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
         ("october", "oct"), ("november", "nov"), ("december", "dec")]
    )
    for name in names
}
_MONTH = r"([A-Za-z]+)\.?"
_DATE_PATTERNS = (
    (re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})$"), ("y", "m", "d")),
    (re.compile(rf"^(\d{{1,2}})\s+{_MONTH}\s*,?\s*(\d{{4}})$"), ("d", "M", "y")),
    (re.compile(rf"^{_MONTH}\s+(\d{{1,2}})\s*,?\s*(\d{{4}})$"), ("M", "d", "y")),
    (re.compile(rf"^{_MONTH}\s*,?\s*(\d{{4}})$"), ("M", "y")),
    (re.compile(rf"^(\d{{1,2}})\s+{_MONTH}$"), ("d", "M")),
    (re.compile(rf"^{_MONTH}\s+(\d{{1,2}})$"), ("M", "d")),
    (re.compile(r"^(\d{4})$"), ("y",)),
)


def parse_number(text: str) -> float | None:
    """``'1,234'`` -> 1234.0, ``'45 %'`` -> 45.0, ``'$3.5'`` -> 3.5, ``'1990–95'`` -> 1990.0, else None."""
    match = _NUMBER_RE.match(text.strip())
    if not match:
        return None
    return float(match.group(1).replace(",", "").replace("−", "-"))


def parse_date(text: str) -> tuple[int, int, int] | None:
    """``(year, month, day)`` with 0 for missing parts, or None (see module docstring)."""
    text = text.strip()
    for pattern, parts in _DATE_PATTERNS:
        match = pattern.match(text)
        if not match:
            continue
        got = dict(zip(parts, match.groups()))
        month = _MONTHS.get(got["M"].lower()) if "M" in got else int(got.get("m", 0))
        day = int(got.get("d", 0))
        if month is None or not 0 <= month <= 12 or not 0 <= day <= 31:
            return None
        return int(got.get("y", 0)), month, day
    return None


def _dense_ranks(keys: dict[int, object]) -> tuple[dict[int, int], dict[int, int]]:
    """``{row: key}`` -> (``{row: rank}``, ``{row: inverse rank}``), dense, ascending from 1."""
    order = {key: r + 1 for r, key in enumerate(sorted(set(keys.values())))}
    top = len(order)
    return ({i: order[k] for i, k in keys.items()}, {i: top - order[k] + 1 for i, k in keys.items()})


def column_ranks(rows: Sequence[Sequence[str]]) -> tuple[list[list[int]], list[list[int]]]:
    """Numeric ranks of data cells: ``(ranks, inverse)``, each ``[num_rows][num_columns]``."""
    num_rows, num_cols = len(rows), len(rows[0]) if rows else 0
    ranks = [[0] * num_cols for _ in range(num_rows)]
    inverse = [[0] * num_cols for _ in range(num_rows)]
    for c in range(num_cols):
        present = {r: rows[r][c] for r in range(num_rows) if rows[r][c].strip().lower() not in _PLACEHOLDERS}
        keys = None
        for parse in (parse_number, parse_date):
            parsed = {r: parse(text) for r, text in present.items()}
            if present and all(v is not None for v in parsed.values()):
                keys = parsed
                break
        if keys:
            rank, inv = _dense_ranks(keys)
            for r in keys:
                ranks[r][c], inverse[r][c] = rank[r], inv[r]
    return ranks, inverse


# ============================================================ candidates
def candidate_cells(question: Question, table: Table, passages: dict[str, str] | None = None) -> list[Coord]:
    """Cells (data row, column), 0-based, that hold or link to the answer, row-major.

    Traced questions: the ``answer-node`` coordinates (out-of-range ones are logged and
    skipped). Untraced: cells whose text contains the normalised answer on word
    boundaries, or one of whose linked passages does. No answer -> ``[]``.
    """
    if question.answer_nodes:
        coords = []
        for node in question.answer_nodes:
            r, c = node.coord
            if r < table.num_rows and c < table.num_columns:
                coords.append((r, c))
            else:
                log.warning("question %s: answer node %s outside table %s; skipped",
                            question.question_id, node.coord, table.table_id)
        return sorted(set(coords))
    answer = normalize_answer(question.answer_text or "")
    if not answer:
        return []
    passages = passages or {}
    linked = {link: contains_answer(text, answer) for link, text in passages.items()}
    return [
        (r, c)
        for r, row in enumerate(table.rows)
        for c, cell in enumerate(row)
        if contains_answer(cell.text, answer) or any(linked.get(link, False) for link in cell.links)
    ]


# ============================================================ length budget
def largest_cap(lengths: Sequence[int], budget: int) -> int:
    """Largest ``c >= 0`` with ``sum(min(l, c)) <= budget`` (``max(lengths)`` if all fit)."""
    low, high = 0, max(lengths, default=0)
    while low < high:
        mid = (low + high + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def fit_budget(
    header_lengths: Sequence[int], row_lengths: Sequence[Sequence[int]], budget: int, min_cell_tokens: int = 1
) -> tuple[int, int | None]:
    """``(rows kept, per-cell cap or None when no cell is cut)`` so the table fits ``budget``.

    Raises ValueError when not even the header fits at ``min_cell_tokens`` per cell.
    """
    flat = list(header_lengths) + [n for row in row_lengths for n in row]
    if sum(flat) <= budget:
        return len(row_lengths), None
    need = sum(min(n, min_cell_tokens) for n in header_lengths)
    row_need = [sum(min(n, min_cell_tokens) for n in row) for row in row_lengths]
    kept = 0
    while kept < len(row_need) and need + row_need[kept] <= budget:
        need += row_need[kept]
        kept += 1
    if need > budget:
        raise ValueError(f"header needs {need} tokens, budget is {budget}")
    lengths = list(header_lengths) + [n for row in row_lengths[:kept] for n in row]
    cap = largest_cap(lengths, budget)
    return kept, (cap if cap < max(lengths, default=0) else None)


# ============================================================ tokenizer
class TableTokenizer:
    """Question + table -> :class:`EncodedExample` (WordPiece ids + TAPAS layout ids).

    Args:
        tokenizer: a ``transformers`` BERT WordPiece tokenizer (fast preferred).
        max_length: the whole sequence, specials included, is at most this long.
        max_question_tokens: the question is cut to this many WordPieces first.
        min_cell_tokens: rows are dropped rather than cap cells below this.
    """

    def __init__(self, tokenizer, max_length: int = 2048, max_question_tokens: int = 64, min_cell_tokens: int = 1):
        if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise MateError(f"tokenizer {type(tokenizer).__name__} has no [CLS]/[SEP] token; use a BERT WordPiece tokenizer")
        if max_length < 3 or max_question_tokens < 0 or min_cell_tokens < 1:
            raise MateError(
                f"bad tokenizer limits max_length={max_length}, max_question_tokens={max_question_tokens}, "
                f"min_cell_tokens={min_cell_tokens}; need max_length >= 3, max_question_tokens >= 0, min_cell_tokens >= 1"
            )
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.max_question_tokens = int(max_question_tokens)
        self.min_cell_tokens = int(min_cell_tokens)

    def _wordpieces(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def encode(
        self,
        question: Question,
        table: Table,
        cell_texts: Sequence[Sequence[str]] | None = None,
        candidates: Iterable[Coord] | None = None,
    ) -> EncodedExample:
        """Tokenize one example.

        Args:
            question: its ``question`` text, ``question_id`` and ``table_id`` are used.
            table: the table; its cell texts are used unless ``cell_texts`` is given.
            cell_texts: ``[num_rows][num_columns]`` replacement data-cell texts (expansion).
            candidates: (data row, column) answer cells, e.g. from :func:`candidate_cells`;
                ``None`` means no candidates (nothing is inferred here).
        Returns:
            an :class:`EncodedExample` with ``len(input_ids) <= max_length``.
        """
        texts = self._cell_texts(table, cell_texts)
        q_ids = self._wordpieces([question.question])[0]
        q_cut = len(q_ids) > self.max_question_tokens
        q_ids = q_ids[: self.max_question_tokens]
        pieces = self._wordpieces([c.text for c in table.header] + [t for row in texts for t in row])
        header, flat = pieces[: table.num_columns], pieces[table.num_columns:]
        cells = [flat[r * table.num_columns: (r + 1) * table.num_columns] for r in range(table.num_rows)]
        kept, cap = self._fit(question, table, header, cells, len(q_ids))
        example = self._assemble(question, table, q_ids, header, cells[:kept], cap)
        coords = sorted(set(map(tuple, candidates or ())))
        self._add_candidates(example, coords)
        example.truncated = q_cut or cap is not None or kept < table.num_rows
        example.rows_dropped = table.num_rows - kept
        if example.rows_dropped:
            log.debug("question %s: dropped %d trailing rows of %s", example.question_id, example.rows_dropped, table.table_id)
        return example

    # ------------------------------------------------------------ steps
    @staticmethod
    def _cell_texts(table: Table, cell_texts) -> list[list[str]]:
        if cell_texts is None:
            return [[c.text for c in row] for row in table.rows]
        shape_ok = len(cell_texts) == table.num_rows and all(len(r) == table.num_columns for r in cell_texts)
        if not shape_ok:
            raise ValueError(f"cell_texts must be [{table.num_rows}][{table.num_columns}] for table {table.table_id}")
        return [list(row) for row in cell_texts]

    def _fit(self, question, table, header, cells, q_len) -> tuple[int, int | None]:
        budget = self.max_length - 2 - q_len
        lengths = [[len(ids) for ids in row] for row in cells]
        try:
            return fit_budget([len(ids) for ids in header], lengths, budget, self.min_cell_tokens)
        except ValueError as err:
            raise MateError(
                f"table {table.table_id!r} (question {question.question_id}): {err}; "
                "raise max_length or lower max_question_tokens"
            ) from None

    def _assemble(self, question, table, q_ids, header, rows, cap) -> EncodedExample:
        ranks, inverse = column_ranks([[c.text for c in row] for row in table.rows])
        seq = _Sequence()
        seq.add([self.tokenizer.cls_token_id, *q_ids, self.tokenizer.sep_token_id])
        for c, ids in enumerate(header):
            seq.add(ids[:cap], segment_ids=1, column_ids=c + 1)
        coords: list[list[int]] = []
        for r, row in enumerate(rows):
            for c, ids in enumerate(row):
                if ids:
                    coords.append([r, c])
                    seq.add(ids[:cap], segment_ids=1, row_ids=r + 1, column_ids=c + 1, cell_ids=len(coords),
                            column_ranks=ranks[r][c], inv_column_ranks=inverse[r][c])
        return EncodedExample(
            question_id=question.question_id, table_id=table.table_id, input_ids=seq.input_ids, layout=seq.layout,
            cell_coords=coords, candidates=[],
        )

    @staticmethod
    def _add_candidates(example: EncodedExample, coords: list[Coord]) -> None:
        cell_of = {tuple(xy): k + 1 for k, xy in enumerate(example.cell_coords)}
        example.candidates = sorted(cell_of[xy] for xy in coords if xy in cell_of)
        example.candidates_dropped = len(coords) - len(example.candidates)
        if example.candidates_dropped:
            log.debug("question %s: %d of %d candidate cells have no tokens",
                      example.question_id, example.candidates_dropped, len(coords))


class _Sequence:
    """Accumulates the word pieces of one example and their layout ids (:data:`ID_FIELDS`)."""

    def __init__(self):
        self.input_ids: list[int] = []
        self.layout: dict[str, list[int]] = {name: [] for name in ID_FIELDS}

    def add(self, ids: list[int], **layout_ids: int) -> None:
        """Append ``ids``; every one gets ``layout_ids`` (fields not named: 0)."""
        self.input_ids.extend(ids)
        for name in ID_FIELDS:
            self.layout[name].extend([layout_ids.get(name, 0)] * len(ids))
