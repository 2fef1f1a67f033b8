"""HybridQA as Transformer-XH graphs, on the bundled sample and the real MiniLM vocabulary: the
nodes, the edges the issue names (row <-> its linked passages, row <-> row), the question's cell
ids across its row nodes, and the block-diagonal collation."""

from __future__ import annotations

import pytest
import torch

from mate_cli.data.datamodule import encode_question
from mate_cli.data.graph import GraphCollator, closest_passages, encode_graph
from mate_cli.data.tokenize import TableTokenizer, candidate_cells

NO_EXPANSION = {"k": 0, "scope": "table", "method": "tfidf"}


@pytest.fixture(scope="module")
def graphs(reader, dev_questions, tokenizer):
    """The first 6 dev questions, each with its table, passages and graph (up to 40 nodes of 96 tokens)."""
    tok = TableTokenizer(tokenizer, max_length=96)
    out = []
    for question in dev_questions[:6]:
        table, passages = reader.table(question.table_id), reader.passages(question.table_id)
        out.append((question, table, passages, encode_graph(tok, question, table, passages, NO_EXPANSION, 40)))
    return tok, out


def test_row_nodes_are_the_question_and_one_row_with_the_questions_cell_ids(graphs, tokenizer):
    tok, examples = graphs
    for question, table, passages, graph in examples:
        prefix = [tokenizer.cls_token_id, *tok.question_pieces(question.question)[0], tokenizer.sep_token_id]
        seen = []
        for r in range(graph["row_nodes"]):
            ids, layout = graph["node_input_ids"][r], graph["node_layouts"][r]
            assert ids[: len(prefix)] == prefix and len(ids) <= 96
            assert set(layout["row_ids"]) <= {0, r + 1}  # the header and row r, with the table's row id
            cells = [k for k in dict.fromkeys(layout["cell_ids"]) if k]
            assert all(graph["cell_coords"][k - 1][0] == r for k in cells)
            seen += cells
        assert seen == list(range(1, len(graph["cell_coords"]) + 1))  # every cell once, row-major
        gold = {tuple(xy) for xy in candidate_cells(question, table, passages)}
        assert {tuple(graph["cell_coords"][k - 1]) for k in graph["candidates"]} == gold - {
            xy for xy in gold if xy[0] >= graph["row_nodes"]
        }
        assert graph["candidates"] and graph["row_nodes"] == min(table.num_rows, 40)


def test_edges_join_rows_to_each_other_and_to_their_linked_passages_only(graphs):
    for question, table, passages, graph in graphs[1]:
        rows, nodes = graph["row_nodes"], len(graph["node_input_ids"])
        edges = {tuple(e) for e in graph["edges"]}
        assert edges == {(b, a) for a, b in edges} and not any(a == b for a, b in edges)
        assert all((a, b) in edges for a in range(rows) for b in range(rows) if a != b)
        assert not any(a >= rows and b >= rows for a, b in edges)  # passages only meet rows
        kept = closest_passages(
            question.question,
            list(
                dict.fromkeys(
                    link for row in table.rows[:rows] for cell in row for link in cell.links if link in passages
                )
            ),
            passages,
            40 - rows,
        )
        assert nodes == rows + len(kept)
        for j, link in enumerate(kept):
            linked = {r for r in range(rows) if any(link in cell.links for cell in table.rows[r])}
            assert {a for a, b in edges if b == rows + j} == linked and linked
            body = graph["node_input_ids"][rows + j]
            start = graph["node_layouts"][rows + j]["segment_ids"].index(1)
            assert (
                body[start:] == graphs[0].tokenizer(passages[link], add_special_tokens=False)["input_ids"][: 96 - start]
            )  # the passage's first word pieces
            assert set(graph["node_layouts"][rows + j]["cell_ids"]) == {0}


def test_with_room_for_every_node_nothing_is_dropped_and_expansion_stays_inside_rows(reader, dev_questions, tokenizer):
    question = dev_questions[0]
    table, passages = reader.table(question.table_id), reader.passages(question.table_id)
    tok = TableTokenizer(tokenizer, max_length=512)
    graph = encode_graph(tok, question, table, passages, NO_EXPANSION, max_nodes=1000)
    assert graph["passages_dropped"] == 0 and graph["rows_dropped"] == 0
    # the cells and candidates of the graph are the whole-table encoding's (PointR's stage-1 input)
    whole = encode_question(TableTokenizer(tokenizer, max_length=100_000), question, table, passages, NO_EXPANSION)
    assert graph["cell_coords"] == whole["cell_coords"] and graph["candidates"] == whole["candidates"]
    expanded = encode_graph(tok, question, table, passages, {**NO_EXPANSION, "k": 2}, max_nodes=1000)
    assert sum(map(len, expanded["node_input_ids"][: table.num_rows])) > sum(
        map(len, graph["node_input_ids"][: table.num_rows])
    )
    assert expanded["node_input_ids"][table.num_rows :] == graph["node_input_ids"][table.num_rows :]


def test_closest_passages_keep_the_best_tfidf_matches_in_link_order():
    passages = {"/a": "a river in france", "/b": "the tallest tower of paris", "/c": "paris and its tallest tower"}
    assert closest_passages("tallest tower in paris", ["/a", "/b", "/c"], passages, 2) == ["/b", "/c"]
    assert closest_passages("which river", ["/a", "/b", "/c"], passages, 1) == ["/a"]
    assert closest_passages("x", ["/a", "/b"], passages, 5) == ["/a", "/b"]
    assert closest_passages("x", ["/a", "/b"], passages, 0) == []


def test_the_collator_joins_graphs_block_diagonally(graphs):
    examples = [graph for *_, graph in graphs[1][:3]]
    batch = GraphCollator(0)(examples)
    sizes = [len(ex["node_input_ids"]) for ex in examples]
    assert len(batch) == 3 and batch.input_ids.shape[0] == sum(sizes)
    assert batch.node_graph.tolist() == [g for g, n in enumerate(sizes) for _ in range(n)]
    same = batch.node_graph[:, None] == batch.node_graph[None, :]
    assert not bool((batch.edges & ~same).any())  # no hop between questions
    start = sizes[0]
    block = batch.edges[start : start + sizes[1], start : start + sizes[1]]
    assert {tuple(e) for e in block.nonzero().tolist()} == {tuple(e) for e in examples[1]["edges"]}
    assert batch.cell_mask.shape[1] == max(len(ex["cell_coords"]) for ex in examples) + 1
    assert torch.equal(
        batch.layout.attention_mask.sum(-1), torch.tensor([len(ids) for ex in examples for ids in ex["node_input_ids"]])
    )


def test_a_table_without_rows_is_one_node_and_a_node_too_short_names_its_setting(tokenizer):
    from mate_cli.data.records import Cell, Question, Table
    from mate_cli.errors import MateError

    question = Question("q", "which team won the cup in 1999 ?", "t")
    empty = Table("t", [Cell("year"), Cell("team")], [])
    graph = encode_graph(TableTokenizer(tokenizer, max_length=32), question, empty, {}, NO_EXPANSION, 8)
    assert len(graph["node_input_ids"]) == graph["nodes"] == 1 and graph["edges"] == [] and graph["cell_coords"] == []
    assert len(GraphCollator(0)([graph])) == 1
    table = Table("t", [Cell("year of the final"), Cell("the winning team")], [[Cell("1999"), Cell("Lions")]])
    short = TableTokenizer(tokenizer, max_length=10, length_key="dataset.node_length")
    with pytest.raises(MateError, match="raise dataset.node_length or lower dataset.max_question_tokens"):
        encode_graph(short, question, table, {}, NO_EXPANSION, 8)
