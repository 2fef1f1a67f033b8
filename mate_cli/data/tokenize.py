"""The one place a question and its table become word-piece ids and layout ids (docs/architecture.md: the layout).

``[CLS] question [SEP] header row, data rows``, unpadded. Numeric ids come from the whole table's original texts,
before expansion or any row drop. Column ids count the kept columns; row ids and ``cell_coords`` keep the original
rows and columns.

Empty cells: as in ``TapasTokenizer``, an empty cell has no token, hence no cell id; unlike it, a cell of only
punctuation or ``n/a``/``?``/``nan`` keeps its pieces (TAPAS writes ``[EMPTY]``). ``empty_cell_token`` gives each
empty cell one ``[EMPTY]`` (else ``[UNK]``) so it can be selected: SQA's gold answers include empty cells.

Id limits (the embedding-table sizes, TAPAS's 256): only the first ``max_row_id - 1`` data rows (TAPAS's
``drop_rows_to_fit``) and ``max_column_id - 1`` columns (TAPAS raises) are encoded, and ranks are clipped to
``max_rank_id - 1`` (TAPAS leaves them out of range), so an oversized table never fails at the embeddings.

Length budget (paper §4.1): the question is cut to ``max_question_tokens`` first, then the table by ``pruning``
(``none``: :func:`fit_budget`; ``cc``/``hem``: :mod:`mate_cli.data.pruning`). ``linearization="template"`` writes each
data cell as ``<header> is <cell> ;`` (TabFact's templated rows, Chen et al. 2020), every piece with the cell's ids.
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

from mate_cli.metrics.normalize import contains_answer, normalize_answer
from mate_cli.data.numbers import TableNumbers
from mate_cli.data.pruning import Selection, cell_concatenation, heuristic_exact_match, largest_cap
from mate_cli.data.records import EncodedExample, Question, Table
from mate_cli.errors import MateError, check_choice
from mate_cli.layout import TAPAS_TYPE_VOCAB_SIZES
from mate_cli.layout import ID_FIELDS, TOKEN_TYPE_FIELDS

log = logging.getLogger(__name__)

Coord = tuple[int, int]

#: ``dataset.pruning``
PRUNING_CHOICES = ("none", "cc", "hem")
#: ``dataset.linearization``
LINEARIZATIONS = ("tapas", "template")


def check_linearization(linearization: str, pruning: str) -> None:
    check_choice("dataset.linearization", linearization, LINEARIZATIONS)
    if linearization == "template" and pruning != "none":
        raise MateError(
            f"dataset.linearization=template writes cells as phrases that dataset.pruning={pruning} "
            "cannot cut; use dataset.pruning=none with it"
        )


def candidate_cells(question: Question, table: Table, passages: dict[str, str] | None = None) -> list[Coord]:
    """Cells (data row, column), 0-based, that hold or link to the answer: a traced question's in-range
    ``answer-node`` coordinates, else cells whose text or a linked passage contains the normalised answer."""
    if question.answer_nodes:
        coords = []
        for node in question.answer_nodes:
            r, c = node.coord
            if r < table.num_rows and c < table.num_columns:
                coords.append((r, c))
            else:
                log.warning(
                    "question %s: answer node %s outside table %s; skipped",
                    question.question_id,
                    node.coord,
                    table.table_id,
                )
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


def fit_budget(
    header_lengths: Sequence[int], row_lengths: Sequence[Sequence[int]], budget: int, min_cell_tokens: int = 1
) -> tuple[int, int | None]:
    """``(rows kept, per-cell cap or None)``: every cell, header included, capped at the largest size that fits, and
    trailing rows dropped only when ``min_cell_tokens`` per cell does not fit; ValueError when the header alone does
    not."""
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


def _table_size(field: str) -> int:
    return TAPAS_TYPE_VOCAB_SIZES[TOKEN_TYPE_FIELDS.index(field)]


class TableTokenizer:
    """Question + table -> :class:`EncodedExample`, with a BERT WordPiece ``tokenizer``. ``max_length`` counts the
    specials; ``length_key`` is the setting it comes from, named in errors (Transformer-XH: ``dataset.node_length``)."""

    def __init__(
        self,
        tokenizer,
        max_length: int = 2048,
        max_question_tokens: int = 64,
        min_cell_tokens: int = 1,
        max_row_id: int = _table_size("row_ids"),
        max_column_id: int = _table_size("column_ids"),
        max_rank_id: int = _table_size("column_ranks"),
        pruning: str = "none",
        empty_cell_token: bool = False,
        length_key: str = "dataset.max_length",
        linearization: str = "tapas",
    ):
        if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
            raise MateError(
                f"tokenizer {type(tokenizer).__name__} has no [CLS]/[SEP] token; use a BERT WordPiece tokenizer"
            )
        if max_length < 3 or max_question_tokens < 0 or min_cell_tokens < 1:
            raise MateError(
                f"bad tokenizer limits {length_key}={max_length}, max_question_tokens={max_question_tokens}, "
                f"min_cell_tokens={min_cell_tokens}; need {length_key} >= 3, max_question_tokens >= 0, "
                "min_cell_tokens >= 1"
            )
        self.length_key = length_key
        if min(max_row_id, max_column_id, max_rank_id) < 2:
            raise MateError(
                f"bad id limits max_row_id={max_row_id}, max_column_id={max_column_id}, max_rank_id={max_rank_id}; "
                "each must be >= 2 (the sizes of the row, column and rank embedding tables)"
            )
        if pruning not in PRUNING_CHOICES:
            raise MateError(f"dataset.pruning={pruning!r} is not one of {', '.join(PRUNING_CHOICES)}")
        check_linearization(linearization, pruning)
        self.tokenizer, self.pruning = tokenizer, pruning
        self.template = linearization == "template"
        self._is, self._semicolon = self._wordpieces(["is", ";"]) if self.template else ([], [])
        self.max_length, self.max_question_tokens = int(max_length), int(max_question_tokens)
        self.min_cell_tokens, self.max_row_id = int(min_cell_tokens), int(max_row_id)
        self.max_column_id, self.max_rank_id = int(max_column_id), int(max_rank_id)
        self.empty_id = tokenizer.get_vocab().get("[EMPTY]", tokenizer.unk_token_id) if empty_cell_token else None

    def _wordpieces(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []

    def question_pieces(self, text: str) -> tuple[list[int], bool]:
        """``(word pieces cut to max_question_tokens, whether cut)``."""
        ids = self._wordpieces([text])[0]
        return ids[: self.max_question_tokens], len(ids) > self.max_question_tokens

    def encode(
        self,
        question: Question,
        table: Table,
        cell_texts: Sequence[Sequence[str]] | None = None,
        candidates: Iterable[Coord] | None = None,
        prev_answer_coords: Iterable[Coord] | None = None,
        rows: Sequence[int] | None = None,
    ) -> EncodedExample:
        """One example, ``len(input_ids) <= max_length``; coordinates are (data row, column). ``cell_texts``: texts
        replacing the table's (expansion). ``prev_answer_coords``: the previous question's answer cells (SQA), whose
        tokens get ``prev_labels`` 1. ``rows``: encode only these data rows, in this order (Transformer-XH's one-row
        nodes); cell ids count the encoded cells."""
        texts = self._cell_texts(table, cell_texts)
        num_rows = min(table.num_rows, self.max_row_id - 1)
        num_cols = min(table.num_columns, self.max_column_id - 1)
        row_index = list(range(num_rows)) if rows is None else [r for r in rows if 0 <= r < num_rows]
        q_ids, q_cut = self.question_pieces(question.question)
        pieces = self._wordpieces(
            [c.text for c in table.header[:num_cols]] + [t for r in row_index for t in texts[r][:num_cols]]
        )
        if self.empty_id is not None:
            pieces = [ids or [self.empty_id] for ids in pieces]
        header, flat = pieces[:num_cols], pieces[num_cols:]
        cells = [flat[i * num_cols : (i + 1) * num_cols] for i in range(len(row_index))]
        if self.template:  # (header + is, cell, ;) per non-empty data cell; its length is what the budget fits
            cells = [
                [(header[c] + self._is, ids, self._semicolon) if ids else ((), (), ()) for c, ids in enumerate(row)]
                for row in cells
            ]
        kept, selection = self._fit(question, table, q_ids, header, cells)
        example = self._assemble(question, table, q_ids, header, cells, selection, row_index)
        answer = set(map(tuple, candidates or ()))
        example.candidates = sorted(self._cell_ids(example, answer, "candidate"))
        example.candidates_dropped = len(answer) - len(example.candidates)
        previous = self._cell_ids(example, set(map(tuple, prev_answer_coords or ())), "previous-answer")
        example.layout["prev_labels"] = [int(k in previous) for k in example.layout["cell_ids"]]
        example.rows_dropped = (table.num_rows if rows is None else len(rows)) - kept
        example.columns_dropped = table.num_columns - num_cols
        example.columns_pruned = num_cols - len(selection.columns)
        total = sum(map(len, header)) + sum(self._length(ids) for row in cells for ids in row)
        example.tokens_pruned = total - selection.tokens
        example.full_length = 2 + len(q_ids) + total
        example.truncated = bool(
            q_cut or example.tokens_pruned or example.rows_dropped or example.columns_dropped or example.columns_pruned
        )
        if table.num_rows > num_rows or example.columns_dropped:
            log.debug(
                "question %s: table %s has %d rows x %d columns; ids stop at %d x %d, dropped %d rows, %d columns",
                example.question_id,
                table.table_id,
                table.num_rows,
                table.num_columns,
                num_rows,
                num_cols,
                table.num_rows - num_rows,
                example.columns_dropped,
            )
        if (dropped := len(row_index) - kept) > 0:
            log.debug("question %s: dropped %d trailing rows of %s", example.question_id, dropped, table.table_id)
        return example

    @staticmethod
    def _cell_texts(table: Table, cell_texts) -> list[list[str]]:
        if cell_texts is None:
            return [[c.text for c in row] for row in table.rows]
        if len(cell_texts) != table.num_rows or any(len(r) != table.num_columns for r in cell_texts):
            raise ValueError(f"cell_texts must be [{table.num_rows}][{table.num_columns}] for table {table.table_id}")
        return [list(row) for row in cell_texts]

    def _fit(self, question, table, q_ids, header, cells) -> tuple[int, Selection]:
        """``(data rows kept, word pieces kept per cell)``."""
        budget = self.max_length - 2 - len(q_ids)
        header_lengths = [len(ids) for ids in header]
        lengths = [[self._length(ids) for ids in row] for row in cells]
        if self.pruning != "none":
            if budget < 1 and (sum(header_lengths) or any(map(sum, lengths))):
                raise MateError(
                    f"table {table.table_id!r} (question {question.question_id}): no table token fits, "
                    f"budget is {budget}; raise {self.length_key} or lower dataset.max_question_tokens"
                )
            if self.pruning == "cc":
                return len(cells), cell_concatenation(header_lengths, lengths, budget)
            return len(cells), heuristic_exact_match(self._match_tokens(q_ids), header, cells, budget)
        try:
            kept, cap = fit_budget(header_lengths, lengths, budget, self.min_cell_tokens)
        except ValueError as err:
            raise MateError(
                f"table {table.table_id!r} (question {question.question_id}): {err}; "
                f"raise {self.length_key} or lower dataset.max_question_tokens"
            ) from None
        if cap is not None:
            header_lengths = [min(n, cap) for n in header_lengths]
            lengths = [[min(n, cap) for n in row] for row in lengths]
        rows = lengths[:kept] + [[0] * len(header) for _ in lengths[kept:]]  # trailing rows dropped
        return kept, Selection(header=header_lengths, rows=rows, columns=list(range(len(header))))

    def _length(self, cell) -> int:
        return sum(map(len, cell)) if self.template else len(cell)

    def _cut(self, cell, n: int) -> list[int]:
        """A cell's first ``n`` pieces; a template phrase keeps the cell's, then the header's and "is", then ``;``."""
        if not self.template:
            return cell[:n]
        prefix, value, suffix = cell
        kept = list(value[:n])
        lead = list(prefix[: n - len(kept)])
        return lead + kept + list(suffix[: n - len(kept) - len(lead)])

    def _match_tokens(self, q_ids: list[int]) -> list[int]:
        """The question word pieces HEM counts: those with a letter or digit."""
        pieces = self.tokenizer.convert_ids_to_tokens(q_ids)
        return [i for i, piece in zip(q_ids, pieces) if any(ch.isalnum() for ch in piece)]

    def _assemble(self, question, table, q_ids, header, cells, selection: Selection, row_index) -> EncodedExample:
        """``cells[i]`` are the word pieces of data row ``row_index[i]``."""
        numbers = TableNumbers.of([[c.text for c in row] for row in table.rows])
        relations = numbers.relations(question.question)
        top, clipped = self.max_rank_id - 1, 0
        seq = _Sequence()
        seq.add([self.tokenizer.cls_token_id, *q_ids, self.tokenizer.sep_token_id])
        for k, c in enumerate(selection.columns):
            seq.add(header[c][: selection.header[c]], segment_ids=1, column_ids=k + 1)
        coords: list[list[int]] = []
        for i, (r, row) in enumerate(zip(row_index, cells)):
            for k, c in enumerate(selection.columns):
                ids = self._cut(row[c], selection.rows[i][c])
                if not ids:
                    continue
                coords.append([r, c])
                rank, inverse = numbers.ranks[c].get(r, (0, 0))
                if max(rank, inverse) > top:
                    clipped += 1
                    rank, inverse = min(rank, top), min(inverse, top)
                seq.add(
                    ids,
                    segment_ids=1,
                    row_ids=r + 1,
                    column_ids=k + 1,
                    cell_ids=len(coords),
                    column_ranks=rank,
                    inv_column_ranks=inverse,
                    numeric_relations=relations.get((r, c), 0),
                )
        if clipped:
            log.debug(
                "question %s: %d cells of %s have ranks clipped to %d",
                question.question_id,
                clipped,
                table.table_id,
                top,
            )
        return EncodedExample(
            question_id=question.question_id,
            table_id=table.table_id,
            input_ids=seq.input_ids,
            layout=seq.layout,
            cell_coords=coords,
            candidates=[],
            ranks_clipped=clipped,
        )

    @staticmethod
    def _cell_ids(example: EncodedExample, coords: set[Coord], what: str) -> set[int]:
        """The cell ids of ``coords``; those without a token are logged as ``what`` cells."""
        cells = {k + 1 for k, xy in enumerate(example.cell_coords) if tuple(xy) in coords}
        if len(cells) < len(coords):
            log.debug(
                "question %s: %d of %d %s cells have no tokens",
                example.question_id,
                len(coords) - len(cells),
                len(coords),
                what,
            )
        return cells


class _Sequence:
    """Accumulates the word pieces of one example and their layout ids (:data:`ID_FIELDS`)."""

    def __init__(self):
        self.input_ids: list[int] = []
        self.layout: dict[str, list[int]] = {name: [] for name in ID_FIELDS}

    def add(self, ids: list[int], **layout_ids: int) -> None:
        """Append ``ids``, each with ``layout_ids`` (fields not named: 0)."""
        self.input_ids.extend(ids)
        for name in ID_FIELDS:
            self.layout[name].extend([layout_ids.get(name, 0)] * len(ids))
