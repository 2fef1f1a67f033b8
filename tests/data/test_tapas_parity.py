"""Parity of the seven TAPAS token types with ``transformers.TapasTokenizer`` on real tables.

Both tokenizers encode the same questions over the bundled HybridQA and WikiTableQuestions
tables (pandas tables of the original cell texts, no expansion, no truncation), asked in
sequence per table so that question i carries the answer cells of question i - 1 as its
previous answer (``prev_labels``, TAPAS's ``sequential`` batch usage).

The two sequences are aligned unit by unit ([CLS], question, [SEP], header cells, data
cells in row-major order) from each tokenizer's own word pieces of that unit, never from
the ids under test. Units whose word pieces differ are left out of the per-token
comparison and counted, with their reason. Known, documented reasons:

- ``empty``: ``TapasTokenizer`` writes one ``[EMPTY]`` token for a cell whose text is only
  white space, punctuation or ``n/a``/``?``/``nan`` (an empty cell gets no token from
  either tokenizer); this project gives such a cell its plain word pieces, or no token
  (see :mod:`mate_cli.data.tokenize`).
- ``wordpiece``: ``TapasTokenizer`` is a slow BasicTokenizer; the bundled fast tokenizer
  splits some rare characters differently.

On the remaining tokens all seven types must agree on at least 99% of tokens, per type
and per dataset (``test_token_types_match_tapas`` prints the table).
"""

from __future__ import annotations

import csv
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pytest

from mate_cli.data.records import Cell, Question, Table
from mate_cli.data.tokenize import TableTokenizer
from mate_cli.layout import TAPAS_TYPE_VOCAB_SIZES
from mate_cli.layout import TOKEN_TYPE_FIELDS

pd = pytest.importorskip("pandas")

WTQ_ROOT = Path(__file__).resolve().parents[2] / "data" / "wtq_sample"
MIN_SHARE = 0.99

#: One question of a sequence: (question, previous answer cells or None, its own answer cells).
Asked = tuple[Question, list[tuple[int, int]] | None, list[tuple[int, int]]]


# ---------------------------------------------------------------- the two samples
def _wtq_field(text: str) -> str:
    """Undo the WikiTableQuestions TSV escapes: ``\\n`` newline, ``\\p`` pipe, ``\\\\`` backslash."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "p": "|", "\\": "\\"}.get(m.group(1), m.group(0)), text)


def wtq_table(context: str) -> Table:
    """The ``.tsv`` twin of a ``csv/<20x>-csv/<n>.csv`` context (first line = header)."""
    path = WTQ_ROOT / context.replace(".csv", ".tsv")
    lines = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    header, *rows = ([_wtq_field(t) for t in line.split("\t")] for line in lines)
    return Table(table_id=context, header=[Cell(h) for h in header], rows=[[Cell(t) for t in row] for row in rows])


def _answer_cells(table: Table, answers: Iterable[str]) -> list[tuple[int, int]]:
    wanted = {a.strip().lower() for a in answers if a.strip()}
    return [
        (r, c) for r, row in enumerate(table.rows) for c, cell in enumerate(row) if cell.text.strip().lower() in wanted
    ]


def wtq_sequences() -> list[tuple[Table, list[Asked]]]:
    """Per table, its questions in file order; answer cells = cells whose text is an answer."""
    with open(WTQ_ROOT / "data" / "training.tsv", encoding="utf-8", newline="") as handle:
        records = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    by_table: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_table[record["context"]].append(record)
    out = []
    for context, group in by_table.items():
        table = wtq_table(context)
        asked, prev = [], None
        for record in group:
            question = Question(record["id"], _wtq_field(record["utterance"]), context)
            cells = _answer_cells(table, _wtq_field(record["targetValue"]).split("|"))
            asked.append((question, prev, cells))
            prev = cells
        out.append((table, asked))
    return out


def hybridqa_sequences(reader, questions: list[Question]) -> list[tuple[Table, list[Asked]]]:
    """Per table, its dev questions in file order; answer cells = the traced answer nodes."""
    by_table: dict[str, list[Question]] = defaultdict(list)
    for question in questions:
        by_table[question.table_id].append(question)
    out = []
    for table_id, group in by_table.items():
        table = reader.table(table_id)
        asked, prev = [], None
        for question in group:
            cells = sorted({node.coord for node in question.answer_nodes})
            asked.append((question, prev, cells))
            prev = cells
        out.append((table, asked))
    return out


# ---------------------------------------------------------------- TAPAS side
def tapas_encode(tapas, table: Table, asked: list[Asked]) -> list[tuple[list[int], list[list[int]]]]:
    """``(input_ids, token_type_ids)`` per question, one sequential TAPAS batch per table."""
    frame = pd.DataFrame(
        [[c.text for c in row] for row in table.rows], columns=[c.text for c in table.header], dtype=str
    )
    queries = [q.question for q, _, _ in asked]
    coords = [list(cells) for _, _, cells in asked]
    texts = [[table.rows[r][c].text for r, c in cells] for cells in coords]
    out = tapas(
        table=frame, queries=queries, answer_coordinates=coords, answer_text=texts, truncation=False, padding=False
    )
    return list(zip(out["input_ids"], out["token_type_ids"]))


# ---------------------------------------------------------------- comparison
@dataclass
class Tally:
    """Per token type: tokens compared and tokens equal; units left out, by reason."""

    compared: int = 0
    equal: Counter = field(default_factory=Counter)
    nonzero: Counter = field(default_factory=Counter)  # TAPAS's non-zero ids among the compared tokens
    left_out: Counter = field(default_factory=Counter)  # reason -> units
    left_out_tokens: Counter = field(default_factory=Counter)  # reason -> TAPAS tokens
    cells: int = 0
    rank_cells_differ: int = 0
    rank_columns_differ: set = field(default_factory=set)
    columns: set = field(default_factory=set)
    examples: list = field(default_factory=list)  # a few differing tokens, for the report

    def share(self, name: str) -> float:
        """Identical share over every TAPAS token (a left-out token counts as different)."""
        return self.equal[name] / max(self.compared + sum(self.left_out_tokens.values()), 1)

    def summary(self, label: str) -> str:
        shares = " ".join(f"{name}={self.share(name):.4f}" for name in TOKEN_TYPE_FIELDS)
        compared = " ".join(f"{name}={self.equal[name] / max(self.compared, 1):.4f}" for name in TOKEN_TYPE_FIELDS)
        nonzero = " ".join(f"{name}={self.nonzero[name]}" for name in TOKEN_TYPE_FIELDS)
        left = ", ".join(
            f"{k}: {v} units / {self.left_out_tokens[k]} TAPAS tokens" for k, v in sorted(self.left_out.items())
        )
        return (
            f"{label}: identical share of all TAPAS tokens: {shares}\n"
            f"  on the {self.compared} aligned tokens: {compared}\n"
            f"  TAPAS non-zero ids among them: {nonzero}\n"
            f"  left out: {left or 'none'}\n"
            f"  data cells with a different rank: {self.rank_cells_differ}/{self.cells}, "
            f"columns: {len(self.rank_columns_differ)}/{len(self.columns)}"
        )


def _units(table: Table, question: str, pieces: Callable[[str], list[int]], cls: int, sep: int):
    """The units of a sequence in order: (key, word-piece ids)."""
    yield ("cls",), [cls]
    yield ("question",), pieces(question)
    yield ("sep",), [sep]
    for c, cell in enumerate(table.header):
        yield ("header", c), pieces(cell.text)
    for r, row in enumerate(table.rows):
        for c, cell in enumerate(row):
            yield ("cell", r, c), pieces(cell.text)


def _split(input_ids: list[int], units) -> dict:
    """``key -> (start, ids)``, checking the units tile ``input_ids`` exactly."""
    out, start = {}, 0
    for key, ids in units:
        assert input_ids[start : start + len(ids)] == ids, f"unit {key} does not align"
        out[key] = (start, ids)
        start += len(ids)
    assert start == len(input_ids), "sequence longer than its units"
    return out


def compare(
    tally: Tally, table: Table, question: str, ours, theirs, pieces: tuple, specials: tuple, count_cells: bool
) -> None:
    """Add one question's comparison.

    Args:
        ours: the :class:`EncodedExample`; theirs: TAPAS ``(input_ids, token_type_ids)``.
        pieces: (ours, TAPAS's) text -> word-piece ids; specials: ([CLS] id, [SEP] id, [EMPTY] id).
        count_cells: add the per-cell rank statistics (once per table: ranks ignore the question).
    """
    cls, sep, empty = specials
    mine = _split(ours.input_ids, _units(table, question, pieces[0], cls, sep))
    other = _split(theirs[0], _units(table, question, pieces[1], cls, sep))
    rank_same: dict[tuple[int, int], bool] = {}
    for key, (start, ids) in mine.items():
        o_start, o_ids = other[key]
        if ids != o_ids:
            reason = "empty" if o_ids == [empty] else "wordpiece"
            tally.left_out[reason] += 1
            tally.left_out_tokens[reason] += len(o_ids)
            continue
        for i in range(len(ids)):
            tally.compared += 1
            same = {}
            for t, name in enumerate(TOKEN_TYPE_FIELDS):
                mine_id, their_id = ours.layout[name][start + i], theirs[1][o_start + i][t]
                same[name] = mine_id == their_id
                tally.equal[name] += same[name]
                tally.nonzero[name] += their_id != 0
                if not same[name] and len(tally.examples) < 30:
                    tally.examples.append((table.table_id, question, key, name, mine_id, their_id))
            if key[0] == "cell":
                cell = key[1:]
                rank_same[cell] = rank_same.get(cell, True) and same["column_ranks"] and same["inv_column_ranks"]
    if count_cells:
        for (_, c), same in rank_same.items():
            tally.cells += 1
            tally.columns.add((table.table_id, c))
            if not same:
                tally.rank_cells_differ += 1
                tally.rank_columns_differ.add((table.table_id, c))


def measure(sequences, encode: Callable, tapas, our_tokenizer) -> Tally:
    """Tally over every (table, questions) sequence; ``encode(question, table, prev_cells)``."""
    tally = Tally()
    ours_pieces = lambda text: our_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    tapas_pieces = lambda text: tapas.convert_tokens_to_ids(tapas.tokenize(text))  # noqa: E731
    specials = (our_tokenizer.cls_token_id, our_tokenizer.sep_token_id, tapas.convert_tokens_to_ids("[EMPTY]"))
    for table, asked in sequences:
        for i, ((question, prev, _), theirs) in enumerate(zip(asked, tapas_encode(tapas, table, asked))):
            ours = encode(question, table, prev)
            compare(tally, table, question.question, ours, theirs, (ours_pieces, tapas_pieces), specials, i == 0)
    return tally


# ---------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def tapas(minilm_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.TapasTokenizer(
        vocab_file=str(minilm_dir / "vocab.txt"),
        do_lower_case=True,
        model_max_length=4096,
        max_row_id=256,
        max_column_id=256,
    )


@pytest.fixture(scope="module")
def sequences(reader, dev_questions):
    return {"hybridqa": hybridqa_sequences(reader, dev_questions), "wtq": wtq_sequences()}


@pytest.mark.parametrize("dataset", ["hybridqa", "wtq"])
def test_token_types_match_tapas(tokenizer, tapas, sequences, dataset):
    """WikiTQ takes over 20 s: every bundled question is encoded by both implementations."""
    tok = TableTokenizer(tokenizer, max_length=4096, max_question_tokens=512)
    encoded = []

    def encode(question, table, prev):
        encoded.append(tok.encode(question, table, prev_answer_coords=prev))
        return encoded[-1]

    tally = measure(sequences[dataset], encode, tapas, tokenizer)
    summary = tally.summary(dataset)
    print("\n" + summary)
    assert not any(ex.truncated for ex in encoded), "the parity test must not truncate"
    assert set(tally.left_out) <= {"empty", "wordpiece"}
    for name in ("prev_labels", "column_ranks", "inv_column_ranks", "numeric_relations"):
        assert tally.nonzero[name] > 50, f"{name} is hardly exercised\n{summary}"
    low = [name for name in TOKEN_TYPE_FIELDS if tally.share(name) < MIN_SHARE]
    assert not low, f"{low} below {MIN_SHARE}; first differences {tally.examples[:5]}\n{summary}"


TRICKY_TEXTS = [
    "1,234.5 Apples",
    "abc12",
    "2001",
    "1990–1995",
    "May 3, 2001",
    "May 3 , 2001",
    "the 3rd of May",
    "-5 and +3",
    "one of twelve",
    "february 29",
    "1990s",
    "1650",
    "n/a",
    "5.",
    ".5",
    "1e3 m",
    "21st century",
    "sept 2001",
    "monday, may 3",
    "05-03-2001",
    "3.5.2001",
    "2015-05",
    "$1,000,000 (est.)",
    "12:30",
    "1,23",
    "second to last",
]


def test_value_spans_match_tapas_parse_text():
    tapas_numbers = pytest.importorskip("transformers.models.tapas.tokenization_tapas")
    from mate_cli.data.numbers import Date, normalize_text, parse_values

    def theirs(value):
        if value.float_value is not None:
            return value.float_value
        return Date(value.date.year, value.date.month, value.date.day)

    for text in TRICKY_TEXTS:
        expected = [
            (s.begin_index, s.end_index, tuple(theirs(v) for v in s.values))
            for s in tapas_numbers.parse_text(normalize_text(text))
        ]
        assert [tuple(span) for span in parse_values(text)] == expected, text


def _long_table(num_rows: int) -> Table:
    rows = [[Cell(str(i + 1)), Cell("x")] for i in range(num_rows)]
    return Table(table_id="long", header=[Cell("n"), Cell("name")], rows=rows)


def test_row_limit_drops_rows_as_tapas_and_clips_ranks(tokenizer, tapas, caplog):
    """300 rows: both keep 255 (TAPAS ``drop_rows_to_fit``); ranks run to 300, so the
    inverse ranks of the 45 smallest kept values are clipped to 255 (TAPAS: out of range)."""
    table = _long_table(300)
    question = Question("long-q", "which n is over 250 ?", "long")
    with caplog.at_level(logging.DEBUG, logger="mate_cli.data.tokenize"):
        ours = TableTokenizer(tokenizer, max_length=4096).encode(question, table, prev_answer_coords=[(3, 0), (299, 0)])
    assert ours.rows_dropped == 45 and ours.ranks_clipped == 45 and ours.columns_dropped == 0 and ours.truncated
    assert "dropped 45 rows" in caplog.text and "ranks clipped to 255" in caplog.text
    for name, size in zip(TOKEN_TYPE_FIELDS, TAPAS_TYPE_VOCAB_SIZES):
        assert max(ours.layout[name]) < size, name
    frame = pd.DataFrame([[c.text for c in row] for row in table.rows], columns=["n", "name"], dtype=str)
    theirs = tapas(table=frame, queries=question.question, truncation="drop_rows_to_fit", max_length=4096)
    assert ours.input_ids == theirs["input_ids"]
    rows = 0
    for i, their in enumerate(theirs["token_type_ids"]):
        expected = [min(v, 255) if name == "inv_column_ranks" else v for name, v in zip(TOKEN_TYPE_FIELDS, their)]
        # TAPAS is given no previous answer here: ours is cell (3, 0) only, (299, 0) was dropped
        expected[TOKEN_TYPE_FIELDS.index("prev_labels")] = int(their[2] == 4 and their[1] == 1)
        assert [ours.layout[name][i] for name in TOKEN_TYPE_FIELDS] == expected, i
        rows += their[6] != 0
    assert max(theirs["token_type_ids"], key=lambda t: t[5])[5] == 300 and rows == 255  # 250 vs every kept cell


def test_column_limit_drops_columns_where_tapas_raises(tokenizer, tapas):
    table = Table(table_id="wide", header=[Cell(f"c{i}") for i in range(300)], rows=[[Cell("1")] * 300])
    question = Question("wide-q", "which ?", "wide")
    ours = TableTokenizer(tokenizer, max_length=4096).encode(question, table, candidates=[(0, 10), (0, 280)])
    assert ours.columns_dropped == 45 and ours.truncated and ours.rows_dropped == 0
    assert max(ours.layout["column_ids"]) == 255 and len(ours.cell_coords) == 255
    assert ours.candidates_dropped == 1
    frame = pd.DataFrame([[c.text for c in table.rows[0]]], columns=[c.text for c in table.header], dtype=str)
    with pytest.raises(ValueError, match="Too many columns"):
        tapas(table=frame, queries=question.question, truncation="drop_rows_to_fit", max_length=4096)
