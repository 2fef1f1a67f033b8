"""TableTokenizer: TAPAS layout ids, the length budget, ranks and candidates (real MiniLM vocab)."""

from __future__ import annotations

import logging

import pytest

from mate_cli.layout import ID_FIELDS

from mate_cli.data.expand import expand_table
from mate_cli.data.numbers import Relation
from mate_cli.data.records import AnswerNode, Cell, Question, Table
from mate_cli.data.tokenize import TableTokenizer, candidate_cells, fit_budget, largest_cap
from mate_cli.errors import MateError
from tests.data.readouts import column_ranks


def _pieces(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _table(header, rows, links=None):
    links = links or {}
    return Table(
        table_id="hand",
        header=[Cell(h) for h in header],
        rows=[[Cell(t, links.get((r, c), [])) for c, t in enumerate(row)] for r, row in enumerate(rows)],
    )


def _runs(example, start):
    """Group table tokens from ``start`` into contiguous (row, column, cell) runs -> token ids."""
    runs: list[tuple[tuple[int, int, int], list[int]]] = []
    for i in range(start, len(example.input_ids)):
        key = (example.layout["row_ids"][i], example.layout["column_ids"][i], example.layout["cell_ids"][i])
        if not runs or runs[-1][0] != key:
            runs.append((key, []))
        runs[-1][1].append(example.input_ids[i])
    return runs


def check_invariants(example, tok, question, table, texts, max_length, max_q=64):
    """Every token's ids agree with the cell it came from (checked through its text)."""
    n = len(example.input_ids)
    assert n <= max_length
    assert set(example.layout) == set(ID_FIELDS)
    for name in ID_FIELDS:
        assert len(example.layout[name]) == n, name
    sep = example.input_ids.index(tok.tokenizer.sep_token_id)
    assert example.input_ids[0] == tok.tokenizer.cls_token_id
    assert example.input_ids[1:sep] == _pieces(tok.tokenizer, question.question)[:max_q]
    for i in range(sep + 1):  # query set: [CLS] question [SEP]
        assert (
            example.layout["segment_ids"][i],
            example.layout["row_ids"][i],
            example.layout["column_ids"][i],
            example.layout["cell_ids"][i],
        ) == (0, 0, 0, 0)
        assert example.layout["column_ranks"][i] == example.layout["inv_column_ranks"][i] == 0
    assert all(s == 1 for s in example.layout["segment_ids"][sep + 1 :])
    ranks, inverse = column_ranks([[c.text for c in row] for row in table.rows])
    seen_cells = []
    for (row, col, cell), ids in _runs(example, sep + 1):
        assert 1 <= col <= table.num_columns
        if row == 0:  # header
            assert cell == 0 and ids == _pieces(tok.tokenizer, table.header[col - 1].text)[: len(ids)]
            continue
        assert cell >= 1 and example.cell_coords[cell - 1] == [row - 1, col - 1]
        assert ids == _pieces(tok.tokenizer, texts[row - 1][col - 1])[: len(ids)] and ids
        seen_cells.append(cell)
    assert seen_cells == list(range(1, len(example.cell_coords) + 1))  # contiguous, row-major, one run each
    assert example.cell_coords == sorted(example.cell_coords)
    for i in range(sep + 1, n):
        if example.layout["cell_ids"][i]:
            r, c = example.cell_coords[example.layout["cell_ids"][i] - 1]
            assert (example.layout["column_ranks"][i], example.layout["inv_column_ranks"][i]) == (
                ranks[r][c],
                inverse[r][c],
            )
    assert all(1 <= k <= len(example.cell_coords) for k in example.candidates)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sample(reader, dev_questions):
    """(question, table, passages, per-cell top-5 expansion) for every dev question."""
    out = []
    for q in dev_questions:
        table, passages = reader.table(q.table_id), reader.passages(q.table_id)
        out.append((q, table, passages, expand_table(q, table, passages, k=5, scope="cell")))
    return out


# ---------------------------------------------------------------- sample
@pytest.mark.parametrize("max_length", [128, 256])
def test_layout_invariants_on_every_sample_question(tokenizer, sample, max_length):
    tok = TableTokenizer(tokenizer, max_length=max_length)
    assert len(sample) == 53
    for q, table, passages, texts in sample:
        example = tok.encode(q, table, texts, candidate_cells(q, table, passages))
        check_invariants(example, tok, q, table, texts, max_length)
        assert example.truncated


def test_unexpanded_sample_fits_2048_and_keeps_traced_answer_cells(tokenizer, sample):
    tok = TableTokenizer(tokenizer, max_length=2048)
    for q, table, passages, _ in sample:
        example = tok.encode(q, table, None, candidate_cells(q, table, passages))
        texts = [[c.text for c in row] for row in table.rows]
        check_invariants(example, tok, q, table, texts, 2048)
        assert not example.truncated and example.candidates_dropped == 0
        nonempty = [[r, c] for r, row in enumerate(texts) for c, t in enumerate(row) if t.strip()]
        assert example.cell_coords == nonempty
        chosen = {tuple(example.cell_coords[k - 1]) for k in example.candidates}
        assert {n.coord for n in q.answer_nodes} <= chosen and example.candidates


def test_table_scope_expansion_fits_far_more_often_than_cell_scope(tokenizer, sample):
    """Share fitting 2048 tokens (paper §4.1 reports 97% with k=5); the answer always survives."""
    fit, survived = {}, {}
    tok = TableTokenizer(tokenizer, max_length=2048)
    for scope in ("table", "cell"):
        examples = []
        for q, table, passages, cell_texts in sample:
            texts = cell_texts if scope == "cell" else expand_table(q, table, passages, k=5, scope="table")
            examples.append(tok.encode(q, table, texts, candidate_cells(q, table, passages)))
        fit[scope] = sum(not ex.truncated for ex in examples) / len(examples)
        survived[scope] = all(ex.candidates for ex in examples)
    assert fit["table"] >= 0.9 > 0.5 > fit["cell"]
    assert survived["table"] and survived["cell"]


# ---------------------------------------------------------------- budget
def test_largest_cap_and_fit_budget():
    assert largest_cap([10, 3, 1], 9) == 5  # 5 + 3 + 1
    assert largest_cap([10, 3, 1], 100) == 10
    assert fit_budget([1, 1], [[3, 4], [2, 2]], 20) == (2, None)
    assert fit_budget([1, 1], [[3, 4], [2, 2]], 10) == (2, 2)  # 1+1+2+2+2+2 = 10
    assert fit_budget([1, 1], [[3, 4], [2, 2]], 9) == (2, 1)
    assert fit_budget([1, 1], [[5, 5], [5, 5], [5, 5]], 5) == (1, 1)  # rows dropped until 1/cell fits
    assert fit_budget([1, 1], [[5, 5], [5, 5], [5, 5]], 5, min_cell_tokens=2) == (0, None)
    with pytest.raises(ValueError):
        fit_budget([1, 1, 1], [[1]], 2)


def test_truncation_shrinks_longest_cells_first(tokenizer):
    table = _table(["a", "b", "c"], [["red " * 40, "blue " * 10, "green green"], ["x", "y " * 20, ""]])
    question = Question("q", "what ?", "hand")
    tok = TableTokenizer(tokenizer, max_length=44)  # budget 40 for the table
    example = tok.encode(question, table)
    lengths = {}
    for k in example.layout["cell_ids"]:
        if k:
            xy = tuple(example.cell_coords[k - 1])
            lengths[xy] = lengths.get(xy, 0) + 1
    # cap 12: 3 header + 12 + 10 + 2 + 1 + 12 = 40; cap 13 would need 42
    assert lengths == {(0, 0): 12, (0, 1): 10, (0, 2): 2, (1, 0): 1, (1, 1): 12}
    assert len(example.input_ids) == 44 and example.truncated
    assert example.rows_dropped == 0


def test_rows_dropped_when_one_token_per_cell_does_not_fit(tokenizer, caplog):
    table = _table(["a", "b", "c"], [["a b", "a b", "a b"] for _ in range(10)])
    question = Question("q", "what ?", "hand")
    tok = TableTokenizer(tokenizer, max_length=20)  # budget 16: header 3 + 4 rows x 3
    with caplog.at_level(logging.DEBUG, logger="mate_cli.data.tokenize"):
        example = tok.encode(question, table, candidates=[(9, 0), (1, 1)])
    assert max(example.layout["row_ids"]) == 4 and len(example.cell_coords) == 12
    assert [example.cell_coords[k - 1] for k in example.candidates] == [[1, 1]]
    assert example.candidates_dropped == 1 and example.truncated and example.rows_dropped == 6
    assert "dropped 6 trailing rows" in caplog.text
    again = tok.encode(question, table, candidates=[(8, 2)])
    assert again.rows_dropped == 6 and again.candidates == [] and again.candidates_dropped == 1


def test_header_that_cannot_fit_is_a_mate_error(tokenizer):
    table = _table(["a", "b", "c"], [["x", "y", "z"]])
    with pytest.raises(MateError, match="table 'hand'.*max_length"):
        TableTokenizer(tokenizer, max_length=6).encode(Question("q7", "what ?", "hand"), table)


def test_question_truncated_first(tokenizer):
    table = _table(["a"], [["x"]])
    question = Question("q", "one two three four five six", "hand")
    tok = TableTokenizer(tokenizer, max_length=64, max_question_tokens=3)
    example = tok.encode(question, table)
    check_invariants(example, tok, question, table, [["x"]], 64, max_q=3)
    assert example.layout["segment_ids"].count(0) == 5 and example.truncated


def test_empty_cell_has_no_tokens_and_cannot_be_a_candidate(tokenizer):
    table = _table(["a", "b"], [["x", ""], ["", "y"]])
    example = TableTokenizer(tokenizer, max_length=64).encode(
        Question("q", "what ?", "hand"), table, candidates=[(0, 1), (1, 1)]
    )
    assert example.cell_coords == [[0, 0], [1, 1]]
    assert example.candidates == [2] and example.candidates_dropped == 1
    assert not example.truncated


def test_cell_texts_shape_checked(tokenizer):
    table = _table(["a", "b"], [["x", "y"]])
    with pytest.raises(ValueError, match=r"\[1\]\[2\]"):
        TableTokenizer(tokenizer, max_length=64).encode(Question("q", "?", "hand"), table, [["x"]])


# ---------------------------------------------------------------- numeric ids (semantics: test_numbers.py)
def _ids_by_cell(example, name):
    """``{(data row, column): ids of its tokens}`` for one layout field."""
    out = {}
    for i, k in enumerate(example.layout["cell_ids"]):
        if k:
            out.setdefault(tuple(example.cell_coords[k - 1]), []).append(example.layout[name][i])
    return out


def test_ranks_relations_and_prev_labels_on_every_token_of_their_cell(tokenizer):
    table = _table(
        ["year", "team", "goals", "points"],
        [["1999", "Red Lions", "3", "10"], ["2001", "Blue Whales", "5", "7"], ["2000", "Green Geese", "5", ""]],
    )
    question = Question("q", "who scored more than 5 goals after 2000 ?", "hand")
    tok = TableTokenizer(tokenizer, max_length=64)
    example = tok.encode(question, table, prev_answer_coords=[(1, 1), (2, 3)])  # (2, 3) is empty: no tokens
    check_invariants(example, tok, question, table, [[c.text for c in row] for row in table.rows], 64)
    ranks, inverse = _ids_by_cell(example, "column_ranks"), _ids_by_cell(example, "inv_column_ranks")
    assert [ranks[r, 0] for r in range(3)] == [[1], [3], [2]]  # years, ranked as dates
    assert [ranks[r, 2] + inverse[r, 2] for r in range(3)] == [[1, 2], [2, 1], [2, 1]]  # ties share a rank
    assert set(ranks[0, 1]) == {0} and ranks[0, 3] == ranks[1, 3] == [0]  # text; 2 numbers in 3 cells < 70%
    relations = _ids_by_cell(example, "numeric_relations")
    gt, lt, eq = int(Relation.GT), int(Relation.LT), int(Relation.EQ)
    assert [relations[r, 0] for r in range(3)] == [[gt], [lt], [eq]]  # the date 2000 vs the years
    assert [relations[r, 2] for r in range(3)] == [[gt], [gt | eq], [gt | eq]]  # 5 and the number 2000 vs goals
    assert set(relations[0, 1]) == {0} and relations[0, 3] == [0]
    prev = _ids_by_cell(example, "prev_labels")
    assert set(prev[1, 1]) == {1} and sum(example.layout["prev_labels"]) == len(prev[1, 1])
    assert tok.encode(question, table).layout["prev_labels"] == [0] * len(example.input_ids)
    for i, k in enumerate(example.layout["cell_ids"]):  # nothing numeric outside data cells
        if not k:
            assert example.layout["numeric_relations"][i] == example.layout["column_ranks"][i] == 0


def test_one_row_keeps_the_whole_tables_row_ids_coordinates_and_numeric_ids(tokenizer):
    """``rows=[r]`` (Transformer-XH's row nodes): the header and row r only, every id of that row as in
    the whole table's encoding; candidates elsewhere count as dropped."""
    table = _table(
        ["year", "team", "goals"],
        [["1999", "Red Lions", "3"], ["2001", "Blue Whales", "5"], ["2000", "Green Geese", "5"]],
    )
    question = Question("q", "who scored more than 5 goals after 2000 ?", "hand")
    tok = TableTokenizer(tokenizer, max_length=64)
    whole = tok.encode(question, table, candidates=[(1, 1), (2, 1)])
    row = tok.encode(question, table, candidates=[(1, 1), (2, 1)], rows=[2])
    assert row.cell_coords == [[2, 0], [2, 1], [2, 2]] and row.candidates == [2] and row.candidates_dropped == 1
    assert set(row.layout["row_ids"]) == {0, 3} and row.rows_dropped == 0 and not row.truncated
    for name in ("row_ids", "column_ranks", "inv_column_ranks", "numeric_relations"):
        assert _ids_by_cell(row, name) == {xy: ids for xy, ids in _ids_by_cell(whole, name).items() if xy[0] == 2}
    header = [i for i, s in enumerate(whole.layout["segment_ids"]) if s and not whole.layout["row_ids"][i]]
    assert row.input_ids[: header[-1] + 1] == whole.input_ids[: header[-1] + 1]  # [CLS] question [SEP] header


def test_id_limits_drop_rows_and_columns_and_clip_ranks(tokenizer, caplog):
    table = _table([f"c{c}" for c in range(6)], [[str(r * 10 + c) for c in range(6)] for r in range(7)])
    tok = TableTokenizer(tokenizer, max_length=512, max_row_id=5, max_column_id=4, max_rank_id=3)
    with caplog.at_level(logging.DEBUG, logger="mate_cli.data.tokenize"):
        example = tok.encode(Question("q", "what ?", "hand"), table, candidates=[(0, 0), (5, 0), (0, 4)])
    assert max(example.layout["row_ids"]) == 4 and max(example.layout["column_ids"]) == 3
    assert example.rows_dropped == 3 and example.columns_dropped == 3 and example.truncated
    assert example.candidates_dropped == 2 and len(example.cell_coords) == 12
    # ranks over all 7 rows (1..7) stay below 3: rows 0-3 have ranks 1..4, inverse 7..4
    ranks, inverse = _ids_by_cell(example, "column_ranks"), _ids_by_cell(example, "inv_column_ranks")
    assert [ranks[r, 0] for r in range(4)] == [[1], [2], [2], [2]] and inverse[3, 0] == [2]
    assert example.ranks_clipped == 12  # every kept cell: inverse ranks 7..4 (and ranks 3, 4) clipped to 2
    assert "dropped 3 rows, 3 columns" in caplog.text and "ranks clipped to 2" in caplog.text
    with pytest.raises(MateError, match="max_row_id=1"):
        TableTokenizer(tokenizer, max_row_id=1)


# ---------------------------------------------------------------- candidates
def test_candidates_fallback_without_trace():
    table = _table(
        ["river", "country"],
        [["The Quell River", "Zorvania"], ["Quelling", "Brask"], ["Oltan", "Vel"]],
        links={(2, 1): ["/wiki/Vel"]},
    )
    passages = {"/wiki/Vel": "Vel lies on the Quell river ."}
    q = Question("q", "which river ?", "hand", answer_text="quell river")
    assert candidate_cells(q, table, passages) == [(0, 0), (2, 1)]  # not "Quelling": word boundaries
    assert candidate_cells(q, table, {}) == [(0, 0)]
    assert candidate_cells(Question("t", "?", "hand"), table, passages) == []


def test_candidates_prefer_trace_and_skip_out_of_range(caplog):
    table = _table(["a", "b"], [["x", "y"], ["z", "w"]])
    nodes = [
        AnswerNode("w", (1, 1), None, "table"),
        AnswerNode("?", (5, 0), None, "table"),
        AnswerNode("x", (0, 0), "/wiki/X", "passage"),
    ]
    q = Question("q", "?", "hand", answer_text="y", answer_nodes=nodes)
    with caplog.at_level(logging.WARNING, logger="mate_cli.data.tokenize"):
        assert candidate_cells(q, table, {}) == [(0, 0), (1, 1)]
    assert "(5, 0)" in caplog.text


def test_empty_cell_token_makes_empty_cells_selectable(tokenizer):
    """An empty cell has no token (as with ``TapasTokenizer``); with ``empty_cell_token`` it gets
    the vocabulary's [EMPTY] (else [UNK]) and a cell id, so an answer in it survives."""
    table = _table(["name", "note"], [["ann", ""], ["bob", "tall"]])
    question = Question("q", "who has no note?", "hand")
    plain = TableTokenizer(tokenizer, max_length=64).encode(question, table, candidates=[(0, 1)])
    marked = TableTokenizer(tokenizer, max_length=64, empty_cell_token=True).encode(
        question, table, candidates=[(0, 1)]
    )
    assert [0, 1] not in plain.cell_coords and plain.candidates == [] and plain.candidates_dropped == 1
    assert marked.cell_coords == [[0, 0], [0, 1], [1, 0], [1, 1]] and marked.candidates == [2]
    assert "[EMPTY]" not in tokenizer.get_vocab()  # MiniLM has none: its [UNK] stands in
    cell = [t for t, k in zip(marked.input_ids, marked.layout["cell_ids"]) if k == 2]
    assert cell == [tokenizer.unk_token_id]
    assert len(marked.input_ids) == len(plain.input_ids) + 1


# ---------------------------------------------------------------- templated rows
def test_template_writes_each_cell_as_a_phrase_with_the_cells_ids(tokenizer):
    """``linearization=template``: after the header row, each data cell is "<header> is <cell> ;",
    every piece with that cell's row, column and cell id; an empty cell writes nothing."""
    table = _table(["game", "date"], [["51", "february 26"], ["52", ""]])
    question = Question("q", "what ?", "hand")
    example = TableTokenizer(tokenizer, linearization="template").encode(question, table)
    plain = TableTokenizer(tokenizer).encode(question, table)
    start = 2 + len(_pieces(tokenizer, "what ?"))
    runs = [(key, tokenizer.decode(ids)) for key, ids in _runs(example, start)]
    assert runs == [
        ((0, 1, 0), "game"),
        ((0, 2, 0), "date"),
        ((1, 1, 1), "game is 51 ;"),
        ((1, 2, 2), "date is february 26 ;"),
        ((2, 1, 3), "game is 52 ;"),
    ]
    assert example.cell_coords == plain.cell_coords == [[0, 0], [0, 1], [1, 0]]
    assert example.full_length == len(example.input_ids) and not example.truncated


def test_template_cut_keeps_the_cell_before_its_header(tokenizer):
    """Under the length cap a phrase keeps its cell's pieces, then the header's and "is", then the ";"."""
    table = _table(["name of the player"], [["alpha beta gamma delta"], ["x"]])
    question = Question("q", "what ?", "hand")
    budget = 8  # with the header row's 4 pieces: every cell capped at 4 (phrases of 10 and 7 pieces)
    tok = TableTokenizer(
        tokenizer, max_length=2 + len(_pieces(tokenizer, "what ?")) + 4 + budget, linearization="template"
    )
    example = tok.encode(question, table)
    start = 2 + len(_pieces(tokenizer, "what ?"))
    runs = [(key, tokenizer.decode(ids)) for key, ids in _runs(example, start)]
    assert runs[1:] == [((1, 1, 1), "alpha beta gamma delta"), ((2, 1, 2), "name of the x")]
    assert example.truncated and example.full_length > len(example.input_ids)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"linearization": "rows"}, "dataset.linearization='rows' is invalid; use one of tapas, template"),
        ({"linearization": "template", "pruning": "cc"}, "use dataset.pruning=none with it"),
    ],
)
def test_linearization_mistakes_are_one_line(tokenizer, settings, message):
    with pytest.raises(MateError, match=message.replace("(", r"\(")):
        TableTokenizer(tokenizer, **settings)
