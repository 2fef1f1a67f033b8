"""PointR stage-2 data: reader context, gold span at the first normalised occurrence,
encoding, the datamodule's split/cache, and its robustness cases."""

from __future__ import annotations

import logging


from mate_cli.data.span import SpanDataModule, cell_context, encode_span_example, find_answer_span, span_text
from mate_cli.data.records import Cell, Question
from tests.helpers import build_edge_root


def test_find_answer_span_is_the_first_normalised_occurrence():
    context = "Ferrari's engine ( The Scuderia Ferrari team ... ferrari again )"
    start, end = find_answer_span(context, "Ferrari")
    assert (start, end) == (0, 7)  # inside "Ferrari's": punctuation breaks words
    assert find_answer_span(context, "the Scuderia Ferrari") == (context.index("Scuderia"), context.index(" team"))
    assert find_answer_span("Made in the U.S. in 1991", "U.S.") == (12, 15)  # "U.S" -> normalises like "U.S."
    assert find_answer_span("He was 26th .", "26th") == (7, 11)
    assert find_answer_span("forty-two", "Forty Two") == (0, 9)
    assert find_answer_span("nothing here", "Paris") is None
    assert find_answer_span("anything", "") is None and find_answer_span("anything", "the") is None
    assert find_answer_span("Pearl Harbour", "Harbor") is None  # no fuzzy matching


def test_cell_context_appends_every_linked_passage_once_and_counts_missing_ones():
    passages = {"/wiki/A": "Alpha is first. It is a letter.", "/wiki/B": "Beta is second."}
    cell = Cell("Alpha and Beta", ["/wiki/A", "/wiki/B", "/wiki/A", "/wiki/Missing"])
    text, missing = cell_context(cell, passages)
    assert text == "Alpha and Beta ( Alpha is first. It is a letter. Beta is second. )"
    assert missing == 1
    assert cell_context(Cell("", []), passages) == ("", 0)
    assert cell_context(Cell("Gamma", ["/wiki/Missing"]), {}) == ("Gamma", 1)


def _question(answer: str) -> Question:
    return Question("q1", "Which team won the race in Monaco ?", "T", answer)


def test_encoding_layout_and_gold_tokens(tokenizer):
    context = "McLaren ( McLaren Racing Limited is a British motor racing team based in Woking . )"
    ex = encode_span_example(tokenizer, _question("British motor racing team"), (0, 1), context, max_length=64)
    n_q = len(tokenizer("Which team won the race in Monaco ?", add_special_tokens=False)["input_ids"])
    assert ex.input_ids[0] == tokenizer.cls_token_id and ex.input_ids[n_q + 1] == tokenizer.sep_token_id
    assert ex.input_ids[-1] == tokenizer.sep_token_id
    assert ex.layout["segment_ids"] == [0] * (n_q + 2) + [1] * (len(ex.input_ids) - n_q - 2)
    assert ex.context_mask == [0] * (n_q + 2) + [1] * (len(ex.input_ids) - n_q - 3) + [0]
    assert span_text(context, ex.offsets, ex.gold_start, ex.gold_end) == "British motor racing team"
    assert ex.answer_in_context and not ex.context_truncated
    # a word split into several pieces may not start/end inside itself
    pieces = tokenizer.convert_ids_to_tokens(ex.input_ids)
    for j, piece in enumerate(pieces):
        if piece.startswith("##"):
            assert ex.start_ok[j] == 0 and ex.end_ok[j - 1] == 0


def test_gold_span_uses_the_first_occurrence_and_respects_the_window(tokenizer):
    context = "Woking ( Woking is a town in Surrey . McLaren is based in Woking . )"
    ex = encode_span_example(tokenizer, _question("woking"), (0, 0), context, max_length=64)
    assert ex.gold_start == ex.context_mask.index(1)  # the cell text comes first
    assert span_text(context, ex.offsets, ex.gold_start, ex.gold_end) == "Woking"
    late = "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z Woking"
    cut = encode_span_example(tokenizer, _question("Woking"), (0, 0), late, max_length=24)
    assert cut.answer_in_context and cut.context_truncated and cut.gold_start == -1 and cut.gold_end == -1
    assert len(cut.input_ids) == 24


def test_datamodule_uses_the_stage1_split_and_caches(sample_root, tmp_path, caplog):
    from mate_cli.data.datamodule import HybridQADataModule

    dm = SpanDataModule(root=str(sample_root), max_length=128, max_span_length=30, cache_dir=str(tmp_path))
    stage1 = HybridQADataModule(root=str(sample_root), cache_dir=str(tmp_path / "s1"))
    for split in ("train", "validation"):
        assert [q.question_id for q in dm.questions(split)] == [q.question_id for q in stage1.questions(split)]
    assert not {q.table_id for q in dm.questions("train")} & {q.table_id for q in dm.questions("validation")}
    dm.setup("fit")
    train, val = dm.stats["train"], dm.stats["validation"]
    assert train["questions"] == 41 and val["questions"] == 12
    assert val["examples"] == 12  # one gold cell per validation question
    assert train["examples"] >= train["questions"]  # every traced answer-node cell
    assert train["answer_in_window"] < train["examples"]  # 128 tokens cut some answers off
    batches = list(dm.train_dataloader())
    assert sum(len(b) for b in batches) == train["answer_in_window"]
    assert all(bool((b.gold_start >= 0).all()) for b in batches)  # skipped for training ...
    assert sum(len(b) for b in dm.val_dataloader()) == 12  # ... kept for evaluation
    for b in batches[:2]:
        for text, answer in zip(b.texts(b.gold_start, b.gold_end), b.answers):
            assert find_answer_span(text, answer) is not None
    caplog.set_level(logging.INFO, logger="mate_cli.data")
    again = SpanDataModule(root=str(sample_root), max_length=128, max_span_length=30, cache_dir=str(tmp_path))
    again.setup("fit")
    assert "loaded from cache" in caplog.text
    assert again.stats == dm.stats
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("span-")]) == 2


# ------------------------------------------------------------------ robustness
def test_edge_cases_are_counted_and_skipped_never_crash(tmp_path, caplog):
    root = tmp_path / "edge"
    build_edge_root(root)
    caplog.set_level(logging.INFO)
    dm = SpanDataModule(root=str(root), max_length=128, split={"mode": "files"}, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    train = dm.stats["train"]
    assert train["questions"] == 5
    assert train["questions_without_gold_cell"] == 2  # the answer nowhere; the all-empty table
    assert train["examples"] == 3
    assert train["answer_in_window"] == 2  # the empty gold cell has no context
    assert train["missing_passage_links"] == 10  # the 10 links of the cell whose passage file is missing
    assert "no passage file" in caplog.text
    batch = next(iter(dm.train_dataloader()))
    assert sorted(batch.question_ids) == ["edge-linked-missing", "edge-table-answer"]
    assert sorted(batch.texts(batch.gold_start, batch.gold_end)) == ["4th Defense Battalion", "Guantanamo Bay"]
    val = list(dm.val_dataloader())
    assert sum(len(b) for b in val) == 3  # kept for evaluation, the empty cell included
