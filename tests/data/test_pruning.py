"""Length heuristics CC and HEM (mate_cli.data.pruning) and TableTokenizer(pruning=...)."""

from __future__ import annotations

import random

import pytest

from mate_cli.data.pruning import Selection, cell_concatenation, column_scores, heuristic_exact_match
from mate_cli.data.records import Cell, Question, Table
from mate_cli.data.tokenize import TableTokenizer
from mate_cli.errors import MateError
from mate_cli.layout import ID_FIELDS
from tests.data.readouts import column_ranks


# ---------------------------------------------------------------- CC on lengths
def _literal_cc(header, rows, budget):
    """CC as the papers describe it: one word piece per cell per round, header first, row-major."""
    lengths = list(header) + [n for row in rows for n in row]
    kept, left, depth = [0] * len(lengths), max(budget, 0), 0
    while left and depth < max(lengths, default=0):
        for i, n in enumerate(lengths):
            if left and n > depth:
                kept[i] += 1
                left -= 1
        depth += 1
    return kept[: len(header)], [
        kept[len(header) + r * len(header) : len(header) + (r + 1) * len(header)] for r in range(len(rows))
    ]


def test_cc_round_robin_header_first_then_row_major():
    # round 1: all 4 cells (4 tokens); round 2 starts with the header
    assert cell_concatenation([2, 1], [[3, 1]], 5) == Selection(header=[2, 1], rows=[[1, 1]], columns=[0, 1])
    assert cell_concatenation([2, 1], [[3, 1]], 6) == Selection(header=[2, 1], rows=[[2, 1]], columns=[0, 1])
    assert cell_concatenation([2, 1], [[3, 1]], 7).rows == [[3, 1]]


def test_cc_partial_last_round_keeps_earlier_cells():
    # 9 cells: a full round is 9 tokens; the 2 left go to the first cells still longer than 1
    sel = cell_concatenation([1, 1, 1], [[3, 3, 3], [3, 3, 3]], 11)
    assert sel.header == [1, 1, 1] and sel.rows == [[2, 2, 1], [1, 1, 1]] and sel.tokens == 11
    # fewer tokens than cells: the header row, then the first data cells
    sel = cell_concatenation([1, 1, 1], [[3, 3, 3], [3, 3, 3]], 4)
    assert sel.header == [1, 1, 1] and sel.rows == [[1, 0, 0], [0, 0, 0]]
    # empty cells are never visited
    assert cell_concatenation([1, 0], [[0, 4], [2, 2]], 5).rows == [[0, 2], [1, 1]]


def test_cc_everything_fits_nothing_cut():
    header, rows = [2, 3], [[4, 0], [1, 5]]
    for budget in (15, 100):
        sel = cell_concatenation(header, rows, budget)
        assert sel.header == header and sel.rows == rows and sel.columns == [0, 1] and sel.tokens == 15
    assert cell_concatenation(header, rows, 14).tokens == 14


def test_cc_matches_literal_round_robin_on_random_tables():
    rng = random.Random(3)
    for _ in range(300):
        cols, nrows = rng.randint(1, 4), rng.randint(0, 4)
        header = [rng.randint(0, 4) for _ in range(cols)]
        rows = [[rng.randint(0, 6) for _ in range(cols)] for _ in range(nrows)]
        budget = rng.randint(-2, 40)
        sel = cell_concatenation(header, rows, budget)
        assert (sel.header, sel.rows) == _literal_cc(header, rows, budget), (header, rows, budget)
        total = sum(header) + sum(map(sum, rows))
        assert sel.tokens == min(max(budget, 0), total) and sel.columns == list(range(cols))


# ---------------------------------------------------------------- HEM on ids
def test_column_scores_count_distinct_question_tokens_in_header_or_cells():
    header = [[9], [1], [3], [1]]
    rows = [[[8], [2, 2], [7, 7], [1]], [[8], [5], [1], [1, 1]]]
    # question repeats 1 and 2: each counts once per column
    assert column_scores([1, 1, 2, 3, 2], header, rows) == [0, 2, 2, 1]
    assert column_scores([], header, rows) == [0, 0, 0, 0]


def test_hem_ranks_by_overlap_keeps_whole_columns_in_original_order():
    # column sizes 3, 3, 3, 3; scores 0, 2, 1, 0 -> rank 1, 2, 0, 3
    header = [[9], [1], [3], [6]]
    rows = [[[8], [2], [7]], [[8], [5], [7]]]
    rows = [[*row, [6]] for row in rows]
    sel = heuristic_exact_match([1, 2, 3], header, rows, 7)  # two whole columns fit, a third does not
    assert sel.columns == [1, 2]
    assert sel.header == [0, 1, 1, 0] and sel.rows == [[0, 1, 1, 0], [0, 1, 1, 0]]
    sel = heuristic_exact_match([1, 2, 3], header, rows, 9)
    assert sel.columns == [0, 1, 2]  # original order, not rank order [1, 2, 0]
    assert sel.header == [1, 1, 1, 0]


def test_hem_ties_broken_by_original_column_order():
    header = [[1], [5], [2], [6]]  # scores 1, 0, 1, 0: columns 0 and 2 tie, 1 and 3 tie; 2 tokens each
    rows = [[[7], [7], [7], [7]]]
    assert heuristic_exact_match([1, 2], header, rows, 3).columns == [0]
    assert heuristic_exact_match([1, 2], header, rows, 4).columns == [0, 2]
    assert heuristic_exact_match([1, 2], header, rows, 7).columns == [0, 1, 2]
    assert heuristic_exact_match([], header, rows, 4).columns == [0, 1]


def test_hem_whole_columns_only_and_stops_at_first_that_does_not_fit():
    # ranks: column 0 (size 5, score 2), column 1 (size 4, score 1), column 2 (size 1, score 0)
    header = [[1, 2], [3], [9]]
    rows = [[[8, 8, 8], [8, 8, 8], []]]
    sel = heuristic_exact_match([1, 2, 3], header, rows, 8)
    assert sel.columns == [0]  # column 1 does not fit whole (9 > 8); column 2 ranks lower: removed too
    assert sel.header == [2, 0, 0] and sel.rows == [[3, 0, 0]] and sel.tokens == 5


def test_hem_everything_fits_keeps_every_column():
    header = [[1], [2]]
    rows = [[[3, 4], [5]]]
    sel = heuristic_exact_match([5], header, rows, 5)
    assert sel == Selection(header=[1, 1], rows=[[2, 1]], columns=[0, 1])


def test_hem_fallback_keeps_best_column_cut_by_cc():
    header = [[1], [2, 2]]  # best: column 1 (score 1), size 2 + 3 + 3 = 8
    rows = [[[7], [5, 5, 5]], [[7], [6, 6, 6]]]
    sel = heuristic_exact_match([2], header, rows, 5)
    assert sel.columns == [1]
    # CC inside column 1: round 1 header, row 0, row 1 (3); round 2 header, row 0 (2)
    assert sel.header == [0, 2] and sel.rows == [[0, 2], [0, 1]] and sel.tokens == 5
    assert heuristic_exact_match([2], header, rows, 0).tokens == 0


# ---------------------------------------------------------------- through the tokenizer
@pytest.fixture(scope="module")
def minilm():
    from mate_cli.pretrained import load_tokenizer

    return load_tokenizer("minilm")


def _table(header, rows):
    return Table(table_id="hand", header=[Cell(h) for h in header], rows=[[Cell(t) for t in row] for row in rows])


CITIES = _table(
    ["city", "country", "population", "notes"],
    [
        ["Paris", "France", "2.1 million", "capital of the country since 508"],
        ["Lyon", "France", "0.5 million", "on the Rhone river , a silk trade town"],
        ["Marseille", "", "0.9 million", "old port on the Mediterranean sea coast"],
    ],
)
QUESTION = Question("q", "which population is above 2 million ?", "hand")


def _pieces(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _sizes(tokenizer, table):
    """Word pieces per column (header + cells) and in all."""
    sizes = [
        len(_pieces(tokenizer, h.text)) + sum(len(_pieces(tokenizer, row[c].text)) for row in table.rows)
        for c, h in enumerate(table.header)
    ]
    return sizes, sum(sizes)


def check_pruned(example, tokenizer, question, table, max_length):
    """Layout of a pruned example: lengths, positional column ids, original cell_coords; returns kept columns."""
    n = len(example.input_ids)
    assert n <= max_length
    assert all(len(example.layout[name]) == n for name in ID_FIELDS)
    q = _pieces(tokenizer, question.question)
    start = len(q) + 2
    assert example.input_ids[:start] == [tokenizer.cls_token_id, *q, tokenizer.sep_token_id]
    column_of = {}  # column id -> original column, from the data cells
    runs = []
    for i in range(start, n):
        key = (example.layout["row_ids"][i], example.layout["column_ids"][i], example.layout["cell_ids"][i])
        if not runs or runs[-1][0] != key:
            runs.append((key, []))
        runs[-1][1].append(example.input_ids[i])
    for (row, col, cell), ids in runs:
        if row == 0:
            continue
        r, c = example.cell_coords[cell - 1]
        assert row == r + 1 and column_of.setdefault(col, c) == c
        assert ids and ids == _pieces(tokenizer, table.rows[r][c].text)[: len(ids)]
    for (row, col, cell), ids in runs:
        if row == 0:
            assert cell == 0 and ids == _pieces(tokenizer, table.header[column_of[col]].text)[: len(ids)]
    kept = [column_of[k] for k in sorted(column_of)]
    assert sorted(column_of) == list(range(1, len(kept) + 1)) and kept == sorted(kept)  # positional ids
    assert [k for (_, _, k), _ in runs if k] == list(range(1, len(example.cell_coords) + 1))
    return kept


def test_bad_pruning_is_a_mate_error(minilm):
    with pytest.raises(MateError, match=r"dataset\.pruning='tapas'.*none, cc, hem"):
        TableTokenizer(minilm, pruning="tapas")


def test_none_is_the_default_and_records_tokens_pruned(minilm):
    _, total = _sizes(minilm, CITIES)
    question_len = len(_pieces(minilm, QUESTION.question))
    default = TableTokenizer(minilm, max_length=64).encode(QUESTION, CITIES)
    assert default == TableTokenizer(minilm, max_length=64, pruning="none").encode(QUESTION, CITIES)
    assert default.tokens_pruned == 0 and default.columns_pruned == 0 and not default.truncated
    max_length = question_len + 2 + total - 6
    cut = TableTokenizer(minilm, max_length=max_length).encode(QUESTION, CITIES)
    table_tokens = len(cut.input_ids) - question_len - 2
    assert cut.tokens_pruned == total - table_tokens > 0 and cut.truncated and cut.columns_pruned == 0


def test_hem_keeps_the_matching_column_with_original_coords(minilm):
    sizes, total = _sizes(minilm, CITIES)
    question_len = len(_pieces(minilm, QUESTION.question))
    budget = sizes[2] + sizes[0]  # population (best match), then city (first of the 0-score columns)
    max_length = question_len + 2 + budget
    tok = TableTokenizer(minilm, max_length=max_length, pruning="hem")
    example = tok.encode(QUESTION, CITIES, candidates=[(0, 2), (0, 3)], prev_answer_coords=[(1, 2)])
    assert check_pruned(example, minilm, QUESTION, CITIES, max_length) == [0, 2]
    assert len(example.input_ids) == max_length
    assert example.cell_coords == [[0, 0], [0, 2], [1, 0], [1, 2], [2, 0], [2, 2]]
    assert example.columns_pruned == 2 and example.tokens_pruned == total - budget and example.truncated
    assert example.rows_dropped == 0 and example.columns_dropped == 0
    # population tokens have column id 2 (positional), their coords say column 2 (original)
    population = _pieces(minilm, "population")[0]
    i = example.input_ids.index(population, question_len + 2)
    assert example.layout["column_ids"][i] == 2 and example.layout["row_ids"][i] == 0
    # candidates: (0, 2) kept, (0, 3) in a pruned column; prev_labels on the original cell (1, 2)
    assert [example.cell_coords[k - 1] for k in example.candidates] == [[0, 2]]
    assert example.candidates_dropped == 1
    prev = {
        tuple(example.cell_coords[k - 1])
        for k, p in zip(example.layout["cell_ids"], example.layout["prev_labels"])
        if p
    }
    assert prev == {(1, 2)}
    # numeric ids come from the whole table, by original coordinates
    ranks, _ = column_ranks([[c.text for c in row] for row in CITIES.rows])
    for i, k in enumerate(example.layout["cell_ids"]):
        if k:
            r, c = example.cell_coords[k - 1]
            assert example.layout["column_ranks"][i] == ranks[r][c]
    assert {example.layout["column_ranks"][i] for i, k in enumerate(example.layout["cell_ids"]) if k} != {0}


def test_hem_counts_no_punctuation_and_falls_back_to_cc(minilm):
    table = _table(["a", "b"], [["x ?", "population"], ["y ?", "z"]])
    question = Question("q", "? population", "hand")
    question_len = len(_pieces(minilm, question.question))
    # column a is 5 word pieces, b 3: only one fits 5. "?" is in column a: counted, a would tie b and win
    example = TableTokenizer(minilm, max_length=question_len + 2 + 5, pruning="hem").encode(question, table)
    assert check_pruned(example, minilm, question, table, question_len + 7) == [1]
    assert example.cell_coords == [[0, 1], [1, 1]] and example.columns_pruned == 1
    # budget 2 < 3: only the best column, CC inside it (header "b", then row 0); 8 - 2 cut
    example = TableTokenizer(minilm, max_length=question_len + 2 + 2, pruning="hem").encode(question, table)
    assert check_pruned(example, minilm, question, table, question_len + 4) == [1]
    assert example.cell_coords == [[0, 1]] and example.tokens_pruned == 6 and example.truncated


def test_cc_keeps_a_token_of_every_cell_and_fills_the_budget(minilm):
    sizes, total = _sizes(minilm, CITIES)
    question_len = len(_pieces(minilm, QUESTION.question))
    nonempty = [[r, c] for r, row in enumerate(CITIES.rows) for c, cell in enumerate(row) if cell.text]
    budget = len(nonempty) + len(CITIES.header) + 3  # one token per cell, 3 more
    max_length = question_len + 2 + budget
    tok = TableTokenizer(minilm, max_length=max_length, pruning="cc")
    example = tok.encode(QUESTION, CITIES, candidates=[(2, 3)])
    assert check_pruned(example, minilm, QUESTION, CITIES, max_length) == [0, 1, 2, 3]
    assert example.cell_coords == nonempty and example.candidates == [len(nonempty)]
    assert len(example.input_ids) == max_length and example.tokens_pruned == total - budget
    assert example.columns_pruned == 0 and example.rows_dropped == 0 and example.truncated
    # the default cap of 1 per cell leaves the 3 extra tokens unused
    default = TableTokenizer(minilm, max_length=max_length).encode(QUESTION, CITIES)
    assert len(default.input_ids) == max_length - 3 and default.tokens_pruned == total - budget + 3


def test_cc_too_tight_keeps_row_ids_and_drops_no_row(minilm):
    question_len = len(_pieces(minilm, QUESTION.question))
    max_length = question_len + 2 + 4 + 5  # header row + 5 data cells at one token each
    cc = TableTokenizer(minilm, max_length=max_length, pruning="cc").encode(QUESTION, CITIES, candidates=[(2, 2)])
    check_pruned(cc, minilm, QUESTION, CITIES, max_length)
    assert cc.cell_coords == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0]]
    assert cc.rows_dropped == 0 and cc.candidates == [] and cc.candidates_dropped == 1
    default = TableTokenizer(minilm, max_length=max_length).encode(QUESTION, CITIES)
    assert default.rows_dropped == 2 and len(default.cell_coords) == 4


def test_no_room_for_the_table_is_a_mate_error(minilm):
    question_len = len(_pieces(minilm, QUESTION.question))
    for pruning in ("cc", "hem"):
        with pytest.raises(MateError, match="table 'hand'.*max_length"):
            TableTokenizer(minilm, max_length=question_len + 2, pruning=pruning).encode(QUESTION, CITIES)
