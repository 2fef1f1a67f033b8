"""HybridQA as Transformer-XH graphs (Zhao et al. 2020): per question, sequences whose [CLS] tokens are the hubs.

- A **row node** per data row ``r``: ``[CLS] question [SEP] header row, row r``. Cell ids run across the question's
  row nodes, so the cell head pools every node into one softmax over the table's cells, as PointR stage 1 does.
- A **passage node** per passage linked from the kept rows: ``[CLS] question [SEP] passage``; when there are more than
  nodes left, those closest to the question are kept.
- **Edges**, symmetric, no self-loops: a row and each passage its cells link to, and every two rows.

Rows come first, up to ``dataset.max_nodes`` and TAPAS's row-id limit. ``dataset.node_length`` is the tokens per node;
``dataset.max_length`` is not used, so a profile that sets it (``profile=paper``'s 2048) leaves the graph as it is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

import torch

from mate_cli.data.datamodule import Collator, HybridQADataModule, _ExampleEncoder, cell_tensors
from mate_cli.data.expand import expand_table, linked_passages, tfidf_scores
from mate_cli.data.records import Batch, Question, Table
from mate_cli.data.tokenize import TableTokenizer, candidate_cells
from mate_cli.errors import MateError
from mate_cli.layout import ID_FIELDS, TableLayout, batch_width, padded


def encode_graph(
    tokenizer: TableTokenizer,
    question: Question,
    table: Table,
    passages: dict[str, str],
    expansion: Mapping,
    max_nodes: int = 64,
) -> dict:
    """One question's graph as a plain dict; ``edges`` as ``[tau, eta]`` node pairs."""
    num_rows = min(table.num_rows, tokenizer.max_row_id - 1, max_nodes)
    cell_texts = expand_table(question, table, passages, **expansion)
    rows = [tokenizer.encode(question, table, cell_texts=cell_texts, rows=[r]) for r in range(num_rows)]
    if not rows:  # a table with no data row: one node, the question and the header, so no graph is empty
        rows = [tokenizer.encode(question, table, cell_texts=cell_texts, rows=[])]
    coords: list[list[int]] = []
    for row in rows:  # the question's cell ids: row 0's cells, then row 1's, ...
        row.layout["cell_ids"] = [k + len(coords) if k else 0 for k in row.layout["cell_ids"]]
        coords.extend(row.cell_coords)
    links = linked_passages(Table(table.table_id, table.header, table.rows[:num_rows]), passages)
    kept = closest_passages(question.question, links, passages, max_nodes - num_rows)
    q_ids, q_cut = tokenizer.question_pieces(question.question)
    passage_nodes = [passage_node(tokenizer, q_ids, passages[link]) for link in kept]
    edges = [[a, b] for a in range(num_rows) for b in range(num_rows) if a != b]
    for j, link in enumerate(kept, start=len(rows)):  # passage nodes follow the row nodes
        for r in range(num_rows):
            if any(link in cell.links for cell in table.rows[r]):
                edges += [[r, j], [j, r]]
    cell_of = {tuple(xy): k + 1 for k, xy in enumerate(coords)}
    gold = candidate_cells(question, table, passages)
    candidates = sorted(cell_of[xy] for xy in gold if xy in cell_of)
    return {
        "question_id": question.question_id,
        "table_id": table.table_id,
        "node_input_ids": [row.input_ids for row in rows] + [ids for ids, _, _ in passage_nodes],
        "node_layouts": [row.layout for row in rows] + [layout for _, layout, _ in passage_nodes],
        "edges": edges,
        "cell_coords": coords,
        "candidates": candidates,
        "row_nodes": num_rows,
        "nodes": len(rows) + len(passage_nodes),
        # rows over the node or row-id limit, and rows whose header and one token per cell did not fit a node
        "rows_dropped": table.num_rows - num_rows + sum(row.rows_dropped for row in rows),
        "passages_dropped": len(links) - len(kept),
        "candidates_dropped": len(gold) - len(candidates),
        "truncated": bool(q_cut or any(row.truncated for row in rows) or any(cut for _, _, cut in passage_nodes)),
    }


def closest_passages(query: str, links: list[str], passages: dict[str, str], room: int) -> list[str]:
    """The ``room`` links whose passages have the highest TF-IDF cosine with ``query`` (ties: link order), in link
    order."""
    if len(links) <= room:
        return list(links)
    scores = tfidf_scores(query, [passages[link] for link in links])
    best = sorted(range(len(links)), key=lambda i: (-scores[i], i))[: max(0, room)]
    return [links[i] for i in sorted(best)]


def passage_node(tokenizer: TableTokenizer, q_ids: list[int], text: str) -> tuple[list[int], dict, bool]:
    """``(ids, layout, whether cut)`` of ``[CLS] question [SEP] passage`` cut to the node length; the passage's tokens
    are segment 1, every other id 0."""
    prefix = [tokenizer.tokenizer.cls_token_id, *q_ids, tokenizer.tokenizer.sep_token_id]
    pieces = tokenizer.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    body = pieces[: max(0, tokenizer.max_length - len(prefix))]
    layout = {name: [0] * (len(prefix) + len(body)) for name in ID_FIELDS}
    layout["segment_ids"] = [0] * len(prefix) + [1] * len(body)
    return prefix + body, layout, len(body) < len(pieces)


@dataclass
class GraphBatch:
    """The nodes of every question of the batch, one after the other: ``input_ids`` ``[nodes, seq]``; ``edges``
    ``[nodes, nodes]`` bool, block-diagonal, so no hop crosses questions (``edges[tau, eta]``: hub ``tau`` reads hub
    ``eta``); ``node_graph`` ``[nodes]``, each node's question. The cell fields are per question, as in ``Batch``."""

    input_ids: torch.Tensor
    layout: TableLayout
    edges: torch.Tensor
    node_graph: torch.Tensor
    cell_mask: torch.Tensor
    candidate_mask: torch.Tensor
    cell_coords: torch.Tensor
    question_ids: list[str]
    table_ids: list[str]

    to, pin_memory, _map = Batch.to, Batch.pin_memory, Batch._map

    def __len__(self) -> int:
        """The number of questions, not of nodes."""
        return self.cell_mask.shape[0]


class GraphCollator(Collator):
    def __call__(self, examples: list[dict]) -> GraphBatch:
        nodes = [ids for ex in examples for ids in ex["node_input_ids"]]
        input_ids = padded(nodes, self.pad_id, width=batch_width(nodes, self.multiple, self.cap))
        edges = torch.zeros((len(nodes), len(nodes)), dtype=torch.bool)
        node_graph, offset = [], 0
        for g, ex in enumerate(examples):
            if ex["edges"]:
                pairs = torch.tensor(ex["edges"]) + offset
                edges[pairs[:, 0], pairs[:, 1]] = True
            node_graph += [g] * len(ex["node_input_ids"])
            offset += len(ex["node_input_ids"])
        return GraphBatch(
            input_ids=input_ids,
            layout=TableLayout.from_lists([lay for ex in examples for lay in ex["node_layouts"]], input_ids.shape[1]),
            edges=edges,
            node_graph=torch.tensor(node_graph, dtype=torch.long),
            **cell_tensors(examples),
            question_ids=[ex["question_id"] for ex in examples],
            table_ids=[ex["table_id"] for ex in examples],
        )


class HybridQAGraphDataModule(HybridQADataModule):
    kind = "graph"
    length_keys = "dataset.node_length and dataset.max_nodes"

    def __init__(self, *, node_length: int = 128, max_nodes: int = 64, **common) -> None:
        common.pop("max_length", None)
        super().__init__(max_length=node_length, **common)
        if int(max_nodes) < 1:
            raise MateError(f"dataset.max_nodes={max_nodes}: a graph needs at least one node; set it >= 1")
        self.max_nodes = int(max_nodes)

    def cache_payload(self, split: str) -> dict:
        return {**super().cache_payload(split), "max_nodes": self.max_nodes}

    def encode(self, questions: list[Question], split: str):
        sizes = self.max_length, self.expansion, self.max_question_tokens
        encode = functools.partial(encode_graph, max_nodes=self.max_nodes)
        encoder = _ExampleEncoder(self.root, self.pretrained, *sizes, encode=encode, length_key="dataset.node_length")
        return self._map(questions, encoder, split)

    def split_stats(self, ds) -> dict:
        n = len(ds)
        nodes = [int(k) for k in ds["nodes"]]
        return {
            "questions": n,
            "with_candidate": round(sum(1 for c in ds["candidates"] if c) / n, 4),
            "nodes_mean": round(sum(nodes) / n, 2),
            "nodes_max": max(nodes),
            "row_nodes": sum(int(r) for r in ds["row_nodes"]),
            "rows_dropped": sum(int(r) for r in ds["rows_dropped"]),
            "passages_dropped": sum(int(p) for p in ds["passages_dropped"]),
            "candidates_dropped": sum(int(c) for c in ds["candidates_dropped"]),
            "questions_with_a_node_cut": sum(bool(t) for t in ds["truncated"]),
        }

    def collator(self) -> GraphCollator:
        return GraphCollator(self.pad_id, **self.width())
