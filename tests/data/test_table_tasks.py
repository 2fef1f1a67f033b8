"""Table tasks (SQA, WikiTQ, TabFact): supervision, the datamodule, collation, SQA's sequential evaluation.

Everything runs on the bundled real samples (data/{wtq,sqa,tabfact}_sample) with the bundled
MiniLM vocabulary; the model of the last tests is a tiny random TableEncoder.
"""

from __future__ import annotations

import ast
import csv
import functools
import logging
import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mate_cli import tasks
from mate_cli.data.records import Question, TaskBatch
from mate_cli.data.sqa import SQAReader
from mate_cli.data.table_tasks import (
    TableTaskDataModule,
    TaskCollator,
    answer_matches,
    cell_numbers,
    encode_task_question,
    first_cell_per_answer,
    previous_answers,
    scalar_answer,
)
from mate_cli.data.tokenize import TableTokenizer
from mate_cli.data.wtq import WTQReader
from mate_cli.errors import MateError
from mate_cli.lit_modules.table_qa import TableQAModule, aggregate_answer
from mate_cli.pretrained import load_tokenizer
from mate_cli.modeling.encoder_config import EncoderConfig
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.layout import ID_FIELDS
from mate_cli.modeling.tapas_heads import QAOutput
from tests.data.readouts import answer_cells

DATA = Path(__file__).resolve().parents[2] / "data"
SAMPLES = {
    "wtq": (DATA / "wtq_sample", "training.tsv"),
    "sqa": (DATA / "sqa_sample", "train.tsv"),
    "tabfact": (DATA / "tabfact_sample", "val_examples.json"),
}
MAX_LENGTH = 256
nan = math.nan


def _same(a: float, b: float) -> bool:
    """Equal, NaN included."""
    return (math.isnan(a) and math.isnan(b)) or a == b


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def hf_tokenizer():
    return load_tokenizer("minilm")


@pytest.fixture(scope="module")
def table_tokenizer(hf_tokenizer) -> TableTokenizer:
    return TableTokenizer(hf_tokenizer, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def wtq() -> WTQReader:
    return WTQReader(SAMPLES["wtq"][0])


@pytest.fixture(scope="module")
def wtq_questions(wtq) -> dict[str, Question]:
    return {q.question_id: q for q in wtq.questions("training.tsv")}


@pytest.fixture(scope="module")
def sqa() -> SQAReader:
    return SQAReader(SAMPLES["sqa"][0])


@pytest.fixture(scope="module")
def sqa_questions(sqa) -> list[Question]:
    return list(sqa.questions("train.tsv"))


@pytest.fixture(scope="module")
def datamodule(module_tmp):
    """``datamodule(task, pruning="none", **extra)`` -> a set-up ("fit") TableTaskDataModule (memoised)."""
    cache_dir = module_tmp("table_task_cache")
    built = {}

    def make(task: str, pruning: str = "none", **extra) -> TableTaskDataModule:
        key = (task, pruning, tuple(sorted(extra.items())))
        if key not in built:
            root, source = SAMPLES[task]
            dm = TableTaskDataModule(
                task=task,
                root=str(root),
                pretrained="minilm",
                max_length=MAX_LENGTH,
                split={"source": source},
                cache_dir=str(cache_dir),
                pruning=pruning,
                **extra,
            )
            dm.setup("fit")
            built[key] = dm
        return built[key]

    return make


@pytest.fixture(scope="module")
def module(hf_tokenizer) -> TableQAModule:
    return _sqa_module(hf_tokenizer)


def _sqa_module(hf_tokenizer, **head) -> TableQAModule:
    """A small random SQA model, the same weights for the same ``head`` settings (seeded)."""
    torch.manual_seed(0)
    config = EncoderConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    return TableQAModule(
        TableEncoder(config, "dense"), optimizer=functools.partial(torch.optim.AdamW), task="sqa", head=head
    )


def _sqa_file_records() -> list[dict]:
    """The sample's train.tsv read independently of SQAReader (csv + ast, as the README says)."""
    with open(SAMPLES["sqa"][0] / "train.tsv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return [
        {
            "qid": f"{r['id']}/{r['annotator']}/{int(r['position'])}",
            "seq": f"{r['id']}/{r['annotator']}",
            "position": int(r["position"]),
            "coords": sorted({tuple(ast.literal_eval(c)) for c in ast.literal_eval(r["answer_coordinates"])}),
        }
        for r in rows
    ]


def _column(ds, name: str) -> list:
    """A dataset column as a plain list (``ds[name]`` is a lazy ``Column`` in recent ``datasets``)."""
    return list(ds[name])


def _rows_by_id(ds) -> dict[str, dict]:
    return {ds[i]["question_id"]: ds[i] for i in range(len(ds))}


# ================================================================ 1. WikiTQ supervision
def test_wtq_answer_cells_are_the_cells_holding_the_answer(wtq, wtq_questions):
    q = wtq_questions["nt-718"]  # which mayor ... was a bank manager? -> Inge Bjarne Storebø
    table = wtq.table(q.table_id)
    assert answer_cells(tasks.get("wtq"), q, table) == [(12, 1)]
    assert table.rows[12][1].text == "Inge Bjarne Storebø"
    # a list answer: both mayors are found, each in the Name column
    q = wtq_questions["nt-4833"]
    assert q.answers == ["Peder Olai Kleppe", "Salomon O. Fagerbakke"]
    assert answer_cells(tasks.get("wtq"), q, wtq.table(q.table_id)) == [(1, 1), (5, 1)]
    # the official evaluator's matching: "2-1" matches the cells "2–1" (en dash), each occurrence
    q = wtq_questions["nt-12799"]
    table = wtq.table(q.table_id)
    assert answer_cells(tasks.get("wtq"), q, table) == [(0, 5), (1, 5), (2, 5)]
    assert [table.rows[r][5].text for r in range(3)] == ["2–1", "2–1", "4–1"]
    # a formatted number is matched as the number it is
    q = wtq_questions["nt-1022"]
    assert answer_cells(tasks.get("wtq"), q, wtq.table(q.table_id)) == [(0, 11)]


def test_wtq_answer_cells_need_every_answer_item(wtq, wtq_questions):
    table = wtq.table(wtq_questions["nt-4833"].table_id)

    def ask(*answers):
        return answer_cells(
            tasks.get("wtq"), Question("x", "which mayors?", table.table_id, answers=list(answers)), table
        )

    assert ask("Peder Olai Kleppe") == [(1, 1)]
    assert ask("Peder Olai Kleppe", "Nobody Kleppeson") == []
    assert ask() == []
    # nt-12888's cells read "South Kynouria\n(Notia Kynouria)": in predictions.tsv the line break is a
    # space, and the evaluator then drops " (...)": selecting them answers "South Kynouria"
    q = wtq_questions["nt-12888"]
    table = wtq.table(q.table_id)
    assert answer_cells(tasks.get("wtq"), q, table) == [(11, 0), (12, 0), (13, 0)]
    assert table.rows[11][0].text == "South Kynouria\n(Notia Kynouria)"
    # answer texts do not supervise TabFact, and SQA uses its gold coordinates only
    assert (
        answer_cells(tasks.get("tabfact"), Question("x", "q", table.table_id, answers=["Peder Olai Kleppe"]), table)
        == []
    )
    assert answer_cells(
        tasks.get("sqa"),
        Question("x", "q", table.table_id, answers=["Peder Olai Kleppe"], answer_coordinates=[[4, 2], [1, 0], [4, 2]]),
        table,
    ) == [(1, 0), (4, 2)]


def test_wtq_answer_cells_read_gold_answers_through_their_canonical_forms(table_tokenizer):
    """The cells that, selected, the metric scores correct: gold through targetCanon (tests/data/wtq_tagged),
    else through the emulated forms; a cell is read as a prediction."""
    reader = WTQReader(Path(__file__).resolve().parent / "wtq_tagged")
    by_id = {q.question_id: q for q in reader.questions("pristine-seen-tables.tsv")}
    stage = by_id["ns-1908"]  # "Stage 3", canonically 3.0: the cells "3" of the Stage column
    table = reader.table(stage.table_id)
    assert stage.canonical_answers == ["3.0"]
    assert answer_cells(tasks.get("wtq"), stage, table) == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert {table.rows[r][1].text for r in range(1, 6)} == {"3"}
    assert answer_cells(tasks.get("wtq"), replace(stage, canonical_answers=[]), table) == []  # emulated: a word
    date = by_id["ns-552"]  # "15 June 1942" -> 1942-06-15, in cells written the same way
    assert answer_cells(tasks.get("wtq"), date, reader.table(date.table_id)) == [(13, 0), (14, 0), (15, 0)]
    # the canonical forms travel with the encoded example into the batch
    example = encode_task_question(table_tokenizer, tasks.get("wtq"), stage, table)
    assert example["canonical_answers"] == ["3.0"]
    batch = TaskCollator()(
        [example, encode_task_question(table_tokenizer, tasks.get("wtq"), replace(stage, canonical_answers=[]), table)]
    )
    assert batch.canonical_answers == [["3.0"], []]


def test_scalar_answer(wtq_questions):
    def scalar(*answers, task="wtq"):
        return scalar_answer(tasks.get(task), Question("x", "q", "t", answers=list(answers)))

    assert scalar("1,484,900") == 1484900.0
    assert scalar("3") == 3.0
    assert scalar("2.5") == 2.5
    assert scalar("5,5") == 5.5 and scalar("-4") == -4.0  # a decimal comma; a sign
    assert scalar_answer(tasks.get("wtq"), wtq_questions["nt-1022"]) == 560195.0  # "560,195"
    assert scalar_answer(tasks.get("wtq"), wtq_questions["nt-2488"]) == 3.0
    for value in (
        scalar("Czech Republic"),
        scalar("2-1"),
        scalar("8 October 2010"),
        scalar("inf"),
        scalar("nan"),
        scalar("3rd"),
        scalar("3", "4"),
        scalar(),
        scalar("3", task="sqa"),
        scalar("3", task="tabfact"),
        scalar_answer(tasks.get("wtq"), wtq_questions["nt-718"]),
        scalar_answer(tasks.get("wtq"), wtq_questions["nt-4833"]),
    ):
        assert math.isnan(value)


def test_cell_numbers_of_a_numeric_column(wtq):
    table = wtq.table("csv/203-csv/117.csv")  # immigrants to Israel: "560,195", "27,035" in Total
    assert table.rows[0][11].text == "560,195" and table.rows[2][3].text == "16,514"
    got = cell_numbers(table, [[0, 11], [1, 11], [2, 3], [0, 0], [1, 1]])
    assert got[:3] == [560195.0, 27035.0, 16514.0]
    assert math.isnan(got[3]) and math.isnan(got[4])  # the country name; an empty cell
    mayors = wtq.table("csv/201-csv/10.csv")
    got = cell_numbers(mayors, [[0, 0], [12, 0], [12, 1], [12, 4]])
    assert got[:2] == [1.0, 13.0] and math.isnan(got[2]) and math.isnan(got[3])


def test_encoded_wtq_question_carries_its_supervision(wtq, wtq_questions, table_tokenizer):
    q = wtq_questions["nt-1022"]
    table = wtq.table(q.table_id)
    ex = encode_task_question(table_tokenizer, tasks.get("wtq"), q, table)
    assert ex["float_answer"] == 560195.0 and ex["has_answer_cells"] and ex["label"] == -1
    assert [ex["cell_coords"][k - 1] for k in ex["candidates"]] == [[0, 11]]
    assert len(ex["cell_values"]) == len(ex["cell_texts"]) == len(ex["cell_coords"]) > 0
    expected = cell_numbers(table, ex["cell_coords"])
    assert all(_same(a, b) for a, b in zip(ex["cell_values"], expected))
    assert ex["cell_texts"] == [table.rows[r][c].text for r, c in ex["cell_coords"]]
    assert ex["cell_values"][ex["cell_coords"].index([0, 11])] == 560195.0


def test_an_answer_found_in_several_cells_supervises_one_cell_per_answer_item(wtq, wtq_questions, table_tokenizer):
    """``ambiguous_answers``: first (one cell per item, the first in row order that kept a token), all, drop."""
    q = wtq_questions["nt-12799"]  # "2-1" is in rows 0 and 1, "4-1" in row 2
    table = wtq.table(q.table_id)
    assert answer_matches(tasks.get("wtq"), q, table) == [[(0, 5), (1, 5)], [(2, 5)]]

    def chosen(mode: str) -> tuple[list, bool, int]:
        ex = encode_task_question(table_tokenizer, tasks.get("wtq"), q, table, ambiguous_answers=mode)
        return [ex["cell_coords"][k - 1] for k in ex["candidates"]], ex["ambiguous_answer"], ex["candidates_dropped"]

    assert chosen("first") == ([[0, 5], [2, 5]], True, 0)
    assert encode_task_question(table_tokenizer, tasks.get("wtq"), q, table)["answers_cut"] == 0
    assert chosen("all") == chosen("drop") == ([[0, 5], [1, 5], [2, 5]], True, 0)
    # one cell each: an unambiguous answer is left as it is
    q = wtq_questions["nt-718"]
    ex = encode_task_question(table_tokenizer, tasks.get("wtq"), q, wtq.table(q.table_id), ambiguous_answers="first")
    assert not ex["ambiguous_answer"] and [ex["cell_coords"][k - 1] for k in ex["candidates"]] == [[12, 1]]
    # the first cell that kept a token: nt-7387's four "Czech Republic" rows are all cut at this length
    q = wtq_questions["nt-7387"]
    ex = encode_task_question(table_tokenizer, tasks.get("wtq"), q, wtq.table(q.table_id), ambiguous_answers="first")
    assert ex["ambiguous_answer"] and ex["candidates"] == [] and ex["candidates_dropped"] == ex["answers_cut"] == 1


def test_first_cell_per_answer_skips_cut_cells_and_cells_an_earlier_item_took():
    example = {"cell_coords": [[0, 0], [1, 0], [3, 0]], "candidates": [1, 2, 3], "candidates_dropped": 1}
    # item 1 matches (0,0) and (1,0); item 2 matches (0,0) (taken) and (3,0); item 3 only the cut (2,0)
    first_cell_per_answer(example, [[(0, 0), (1, 0)], [(0, 0), (3, 0)], [(2, 0)]])
    assert example["candidates"] == [1, 3] and example["candidates_dropped"] == 1


@pytest.mark.parametrize(
    "extra, dropped",
    [
        ({}, {"dropped_no_supervision": 3, "dropped_answer_cut": 0, "dropped_ambiguous": 0}),
        ({"drop_cut_answers": True}, {"dropped_no_supervision": 3, "dropped_answer_cut": 3, "dropped_ambiguous": 0}),
        ({"ambiguous_answers": "drop"}, {"dropped_no_supervision": 3, "dropped_answer_cut": 0, "dropped_ambiguous": 8}),
    ],
)
def test_training_drops_cut_and_ambiguous_questions_as_configured_and_counts_them(datamodule, extra, dropped):
    dm = datamodule("wtq", **extra)
    train = dm.datasets["train"]
    keep = set(dm.usable_rows("train", train))
    assert {k: dm.stats["train"][k] for k in dropped} == dropped
    assert len(train) - len(keep) == sum(dropped.values())
    rows = [train[i] for i in range(len(train))]
    assert dm.stats["train"]["ambiguous_answers"] == sum(r["ambiguous_answer"] for r in rows)
    for i, r in enumerate(rows):
        cut = r["has_answer_cells"] and r["answers_cut"] > 0
        if extra.get("drop_cut_answers") and cut or extra.get("ambiguous_answers") == "drop" and r["ambiguous_answer"]:
            assert i not in keep, r["question_id"]
    if extra.get("ambiguous_answers") == "drop":  # it labels every copy, as the default (all) does: one cache
        assert dm.cache_key("train") == datamodule("wtq").cache_key("train")
        assert dm.cache_key("train") != datamodule("wtq", ambiguous_answers="first").cache_key("train")


# ================================================================ 2. SQA previous answers
def test_previous_answers_map_to_the_previous_gold_cells(sqa_questions):
    records = _sqa_file_records()
    by_step = {(r["seq"], r["position"]): r for r in records}
    expected = {
        r["qid"]: by_step[(r["seq"], r["position"] - 1)]["coords"]
        for r in records
        if (r["seq"], r["position"] - 1) in by_step
    }
    got = previous_answers(sqa_questions)
    assert len(sqa_questions) == 68 and len(got) == 48  # 20 sequences: every question but their first
    assert got == expected
    assert all(not qid.endswith("/0") for qid in got)
    assert got["ns-2022/0/1"] == [(r, 0) for r in range(9)]
    assert got["ns-2022/0/2"] == [(r, 3) for r in range(9)]
    # two annotators of one question are two sequences: annotator 1's own previous answer
    assert got["ns-2022/1/2"] == [(3, 0), (4, 0), (6, 0), (7, 0), (8, 0)]


def test_previous_answers_follow_position_not_file_order():
    steps = [Question(f"s/{p}", "q", "t", answer_coordinates=[[p, p]], sequence_id="s", position=p) for p in (2, 0, 1)]
    other = Question("o/1", "q", "t", answer_coordinates=[[9, 9]], sequence_id="o", position=1)  # no position 0
    assert previous_answers([*steps, other]) == {"s/1": [(0, 0)], "s/2": [(1, 1)]}


def test_prev_labels_are_one_exactly_on_the_previous_answer_cells(sqa, sqa_questions, table_tokenizer):
    q = next(q for q in sqa_questions if q.question_id == "ns-2022/0/1")
    table = sqa.table(q.table_id)
    prev = previous_answers(sqa_questions)[q.question_id]
    ex = encode_task_question(table_tokenizer, tasks.get("sqa"), q, table, prev)
    cells, marks = ex["layout"]["cell_ids"], ex["layout"]["prev_labels"]
    expected = [int(k > 0 and tuple(ex["cell_coords"][k - 1]) in set(prev)) for k in cells]
    assert marks == expected
    marked_cells = {tuple(ex["cell_coords"][k - 1]) for k, m in zip(cells, marks) if m}
    assert marked_cells == set(prev)  # all nine cells of column 0 kept tokens and are marked
    assert sum(marks) >= len(prev)
    # the candidates are this question's own gold cells (column 3), not the previous ones
    assert [tuple(ex["cell_coords"][k - 1]) for k in ex["candidates"]] == [(r, 3) for r in range(9)]
    assert ex["sequence_id"] == "ns-2022/0" and ex["position"] == 1
    # without a previous answer nothing is marked
    first = encode_task_question(table_tokenizer, tasks.get("sqa"), q, table, None)
    assert sum(first["layout"]["prev_labels"]) == 0


# ================================================================ 3. the datamodule
@pytest.mark.parametrize("task, sizes", [("wtq", (54, 6)), ("sqa", (59, 9)), ("tabfact", (178, 47))])
def test_train_and_validation_are_disjoint_by_table(datamodule, task, sizes):
    dm = datamodule(task)
    train, val = dm.datasets["train"], dm.datasets["validation"]
    assert (len(train), len(val)) == sizes
    assert not set(_column(train, "table_id")) & set(_column(val, "table_id"))
    ids = _column(train, "question_id") + _column(val, "question_id")
    assert len(set(ids)) == len(ids) == sum(sizes)
    reader_ids = [q.question_id for q in dm.reader.questions(SAMPLES[task][1])]
    assert set(ids) == set(reader_ids)
    assert dm.stats["train"]["questions"] == sizes[0] and dm.stats["validation"]["questions"] == sizes[1]


def test_sqa_validation_is_served_in_position_order(datamodule):
    dm = datamodule("sqa")
    val = dm.datasets["validation"]
    positions = _column(val, "position")
    assert positions != sorted(positions)  # the file order is sequence by sequence
    order = dm.usable_rows("validation", val)
    assert sorted(order) == list(range(len(val)))
    assert [positions[i] for i in order] == sorted(positions)
    served = [(qid, p) for batch in dm.val_dataloader() for qid, p in zip(batch.question_ids, batch.positions)]
    assert [p for _, p in served] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [qid for qid, _ in served] == [
        "ns-129/1/0",
        "ns-129/2/0",
        "nt-8495/1/0",
        "ns-129/1/1",
        "ns-129/2/1",
        "nt-8495/1/1",
        "ns-129/1/2",
        "ns-129/2/2",
        "nt-8495/1/2",
    ]
    # training order is the sampler's business: every SQA training question has an answer cell
    assert dm.usable_rows("train", dm.datasets["train"]) == list(range(59))


def test_wtq_training_skips_questions_that_supervise_nothing(datamodule, caplog):
    dm = datamodule("wtq")
    train = dm.datasets["train"]
    with caplog.at_level(logging.INFO, logger="mate_cli.data.table_tasks"):
        keep = dm.usable_rows("train", train)
    rows = [train[i] for i in range(len(train))]
    skipped = [r["question_id"] for i, r in enumerate(rows) if i not in set(keep)]
    assert sorted(skipped) == ["nt-12665", "nt-7387", "nt-7675"]
    assert "3 of 54" in caplog.text
    for i, r in enumerate(rows):
        supervises = bool(r["candidates"]) or not math.isnan(r["float_answer"])
        assert supervises == (i in set(keep)), r["question_id"]
    by_id = _rows_by_id(train)
    # nt-7387's answer cell is in a row cut by the length budget; nt-2488 ("3") has no cell but a scalar answer
    assert by_id["nt-7387"]["has_answer_cells"] and by_id["nt-7387"]["candidates"] == []
    assert by_id["nt-2488"]["candidates"] == [] and by_id["nt-2488"]["float_answer"] == 3.0
    assert sum(len(b) for b in dm.train_dataloader()) == len(keep) == 51
    # evaluation serves everything, in file order
    assert dm.usable_rows("validation", dm.datasets["validation"]) is None
    # TabFact trains on every statement
    tabfact = datamodule("tabfact")
    assert tabfact.usable_rows("train", tabfact.datasets["train"]) is None


def test_eval_file_makes_validation_the_whole_file(datamodule):
    dm = datamodule("wtq", eval_file="training.tsv")
    val = dm.datasets["validation"]
    file_ids = [q.question_id for q in dm.reader.questions("training.tsv")]
    assert len(file_ids) == 60
    assert _column(val, "question_id") == file_ids
    assert len(dm.datasets["train"]) == 54  # training still comes from the by-table split
    assert dm.cache_key("validation") != datamodule("wtq").cache_key("validation")
    assert dm.cache_key("train") == datamodule("wtq").cache_key("train")


@pytest.mark.parametrize("task", ["wtq", "sqa"])
def test_pruning_heuristics_fit_the_budget_and_change_what_is_kept(datamodule, task):
    stats = {}
    for pruning in ("none", "cc", "hem"):
        dm = datamodule(task, pruning)
        for split in ("train", "validation"):
            lengths = [len(ids) for ids in _column(dm.datasets[split], "input_ids")]
            assert max(lengths) <= MAX_LENGTH
        stats[pruning] = dm.stats["train"]
    assert stats["none"]["questions"] == stats["cc"]["questions"] == stats["hem"]["questions"]
    assert stats["cc"] != stats["none"] and stats["hem"] != stats["none"] and stats["cc"] != stats["hem"]
    # CC and the default drop no column; HEM removes whole columns
    assert stats["none"]["columns_pruned"] == stats["cc"]["columns_pruned"] == 0
    assert stats["hem"]["columns_pruned"] > 0
    assert stats["cc"]["rows_dropped"] == stats["hem"]["rows_dropped"] == 0  # the heuristics drop no row
    if task == "wtq":  # the sample's long tables: the default fit drops trailing rows
        assert stats["none"]["rows_dropped"] > 0
    assert stats["hem"]["tokens_pruned"] > stats["cc"]["tokens_pruned"]


@pytest.mark.parametrize("task", ["wtq", "sqa"])
def test_full_length_is_the_uncut_length_whatever_the_pruning(datamodule, task):
    """The long-table slice reads ``full_length``: an input cut to fit is longer whole, an uncut one is
    its own length, and the number is the same under every length heuristic."""
    lengths = {}
    for pruning in ("none", "cc", "hem"):
        ds = datamodule(task, pruning).datasets["validation"]
        lengths[pruning] = _column(ds, "full_length")
        for full, ids, cut in zip(lengths[pruning], _column(ds, "input_ids"), _column(ds, "truncated")):
            assert full > len(ids) if cut else full == len(ids)
    assert lengths["none"] == lengths["cc"] == lengths["hem"]
    if task == "wtq":  # the sample's long tables
        assert max(lengths["none"]) > 2 * MAX_LENGTH


def test_split_statistics_count_the_long_table_slice_and_what_its_answers_keep(datamodule):
    """``long_questions`` / ``answer_cells_kept_long`` are read from each example's uncut length and
    answer cells, so a reader sees how many slice answers the input can reach at all."""
    threshold = MAX_LENGTH
    dm = datamodule("wtq", long_table_tokens=threshold)
    ds = dm.datasets["train"]
    long = [n > threshold for n in _column(ds, "full_length")]
    with_cells = [has and is_long for has, is_long in zip(_column(ds, "has_answer_cells"), long)]
    kept = [w and d == 0 for w, d in zip(with_cells, _column(ds, "candidates_dropped"))]
    stats = dm.stats["train"]
    assert stats["long_questions"] == sum(long) > 0
    assert stats["answer_cells_kept_long"] == pytest.approx(sum(kept) / sum(with_cells), abs=1e-4)
    # the cut loses answers on the sample's long tables, more of them than over the whole split
    assert stats["answer_cells_kept_long"] < stats["answer_cells_kept"] < 1.0
    assert "long_questions" not in datamodule("wtq").stats["train"]  # no threshold, no slice
    nothing_long = datamodule("wtq", long_table_tokens=10**6).stats["train"]
    assert nothing_long["long_questions"] == 0 and nothing_long["answer_cells_kept_long"] is None


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # no Trainer: the metrics are read directly
def test_long_table_slice_scores_only_the_long_questions(module, datamodule):
    ds = datamodule("wtq").datasets["validation"]
    batch = TaskCollator()([ds[i] for i in range(len(ds))])
    threshold = sorted(batch.full_lengths)[len(ds) // 2]
    long = [n > threshold for n in batch.full_lengths]
    assert 0 < sum(long) < len(ds)
    correct = torch.tensor([float(i % 2) for i in range(len(ds))])
    module.metrics["val_accuracy_long"].reset()
    module.metrics["val_long_questions"].reset()
    module.long_table_tokens = threshold
    try:
        module._log_long_tables(batch, correct, "val")
    finally:
        module.long_table_tokens = None
    expected = sum(c for c, is_long in zip(correct.tolist(), long) if is_long) / sum(long)
    assert float(module.metrics["val_accuracy_long"].compute()) == pytest.approx(expected)
    assert int(module.metrics["val_long_questions"].compute()) == sum(long)


def _half_right(module: TableQAModule, datamodule) -> tuple[TaskBatch, list]:
    """The SQA sample's training side as one batch, and golds that make the odd questions right. A random model answers
    none right, so each odd question's gold is its own decoded answer (an evaluation feeds the model's answers, not the
    gold, to the next question, so a second pass decodes the same cells); the even ones keep theirs."""
    ds = datamodule("sqa").datasets["train"]
    batch = TaskCollator()([ds[i] for i in range(len(ds))])
    first = _evaluate(module, batch)
    gold = [
        first[q]["coordinates"] if i % 2 else answer
        for i, (q, answer) in enumerate(zip(batch.question_ids, batch.answer_coordinates))
    ]
    return batch, gold


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # no Trainer: the metrics are read directly
def test_an_evaluation_scores_q1_to_q3_from_its_own_decoded_answers(module, datamodule):
    batch, gold = _half_right(module, datamodule)
    second = _evaluate(module, replace(batch, answer_coordinates=gold))
    for n in (1, 2, 3):
        at = [row["correct"] for row in second.values() if row["position"] == n - 1]
        assert 0 < sum(at) < len(at)  # right and wrong at every position
        assert float(module.metrics[f"val_accuracy_q{n}"].compute()) == pytest.approx(sum(at) / len(at))


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # no Trainer: the metrics are read directly
def test_an_evaluation_scores_one_cell_answers_apart_from_answers_of_several(module, datamodule):
    batch, gold = _half_right(module, datamodule)
    # a one-cell gold written twice is still one cell, and a question with no gold cell is in neither group
    one_cell = [i for i, cells in enumerate(gold) if len(cells) == 1 and i % 2 == 0]
    assert len(one_cell) >= 5
    for i in one_cell[:3]:
        gold[i] = gold[i] * 2
    for i in one_cell[3:5]:
        gold[i] = []
    second = _evaluate(module, replace(batch, answer_coordinates=gold))
    distinct = {q: {tuple(cell) for cell in cells} for q, cells in zip(batch.question_ids, gold)}
    singles = {q for q, cells in distinct.items() if len(cells) == 1}
    multis = {q for q, cells in distinct.items() if len(cells) > 1}
    for name, group in (("single", singles), ("multi", multis)):
        at = [second[q]["correct"] for q in group]
        assert 0 < sum(at) < len(at)  # right and wrong answers of each size
        assert float(module.metrics[f"val_accuracy_{name}_cell_answers"].compute()) == pytest.approx(sum(at) / len(at))


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # no Trainer: the metrics are read directly
def test_an_evaluation_scores_the_other_decoding_as_a_model_decoding_with_it_would(hf_tokenizer, datamodule):
    """``val_accuracy_at_least_one_cell`` is the accuracy the same weights get with ``at_least_one_cell=true``: every
    later question of a sequence reads that decoding's own previous answer, not the configured decoding's."""
    ds = datamodule("sqa").datasets["train"]
    batch = TaskCollator()([ds[i] for i in range(len(ds))])
    assert max(batch.positions) >= 2
    # a threshold no cell passes: the configured decoding answers no cell, the other one the most probable cell; the
    # previous answer's token type is made loud, so the two decodings' previous answers give different cells
    threshold = {"cell_classification_threshold": 0.999}
    configured, other = (
        _sqa_module(hf_tokenizer, **threshold),
        _sqa_module(hf_tokenizer, at_least_one_cell=True, **threshold),
    )
    with torch.no_grad():
        configured.encoder.embeddings.token_type_embeddings_3.weight[1].normal_(0, 3.0)
    other.load_state_dict(configured.state_dict())

    answered = _evaluate(other, batch)
    assert all(len(row["coordinates"]) == 1 for row in answered.values())
    # every other question's gold is the other decoding's own answer, so it scores right and wrong answers
    gold = [answered[q]["coordinates"] if i % 2 else a
            for i, (q, a) in enumerate(zip(batch.question_ids, batch.answer_coordinates))]  # fmt: skip
    batch = replace(batch, answer_coordinates=gold)
    _evaluate(other, batch)
    expected = float(other.metrics["val_accuracy"].compute())
    assert 0 < expected < 1
    _evaluate(configured, batch)
    assert configured._predicted_at_least_one_cell == other._predicted  # the same answers, question by question
    assert float(configured.metrics["val_accuracy"].compute()) == 0  # no cell, never the answer
    assert float(configured.metrics["val_accuracy_at_least_one_cell"].compute()) == pytest.approx(expected)
    assert float(other.metrics["val_accuracy_at_least_one_cell"].compute()) == pytest.approx(expected)  # its own


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # no Trainer: the metrics are read directly
@pytest.mark.filterwarnings("ignore:SQA. no prediction for the question before")
@pytest.mark.parametrize("task", ["sqa", "wtq", "tabfact"])
def test_an_evaluation_reads_tensor_values_as_often_for_few_questions_as_for_many(task, module, datamodule):
    """On a GPU each read of a tensor's value waits for the device: an evaluation step reads a fixed number of times
    a batch (SQA: for each position of its sequences, both decodings' chains), not once a question or a cell. Counted
    on the CPU by the training loop's own counter, in the task modules' code (it counts reads, not the few copies to
    the device a batch makes, which a GPU's sync debug mode would count too)."""
    from mate_cli.lit_modules.entailment import CHANNELS, EntailmentModule
    from mate_cli.callbacks.step_profile import SyncCounter

    ds = datamodule(task).datasets["train"]
    many = TaskCollator()([ds[i] for i in range(len(ds))])
    if task == "sqa":
        longest = max(set(many.sequence_ids), key=many.sequence_ids.count)  # a sequence with every position
        few = many.select([i for i, sequence in enumerate(many.sequence_ids) if sequence == longest])
        assert set(few.positions) == set(many.positions) and many.cell_mask.sum() >= 5 * few.cell_mask.sum()
    elif task == "wtq":  # TAPAS's WikiTQ head: the selected cells' numbers are read too
        # a threshold the random model's cells often pass, so many questions select many more cells than two do
        head = dict(num_aggregation_labels=4, use_answer_as_supervision=True, cell_selection_preference=0.2,
                    huber_loss_delta=0.12, cell_classification_threshold=0.3)  # fmt: skip
        torch.manual_seed(0)
        module = TableQAModule(module.encoder, optimizer=functools.partial(torch.optim.AdamW), task="wtq", head=head)
        few = many.select([0, 1])
    else:
        torch.manual_seed(0)
        module = EntailmentModule(module.encoder, optimizer=functools.partial(torch.optim.AdamW))
        # the sample has no simple / complex lists: each statement given one, so both channels' metrics update
        many = replace(many, channels=[CHANNELS[i % 2] for i in range(len(many))])
        few = many.select([0, 1])
    assert len(many) >= 5 * len(few)
    module.eval()

    def reads(batch: TaskBatch) -> list[str]:
        module.on_validation_epoch_start()
        counter = SyncCounter(torch.device("cpu"))
        counter.start()
        try:
            with torch.no_grad():
                module._eval_step(batch, "val")
        finally:
            counter.stop()
        return sorted(site for site in counter.sites() if site.startswith("mate_cli/lit_modules/"))

    counted = {}
    for name, batch in (("many", many), ("few", few)):
        counted[name] = reads(batch), sum(len(row.get("coordinates", ())) for row in module.predictions)
    assert counted["many"][0] == counted["few"][0]
    assert counted["few"][0]  # the counter counts in this code: it reads the decoded answers once a batch
    if task == "wtq":  # the per-cell paths ran, far more often for many (SQA: its second decoding, a cell a question)
        assert counted["many"][1] >= 5 * max(counted["few"][1], 1), counted


def test_a_question_none_of_whose_cells_kept_a_token_is_answered_with_no_cell(hf_tokenizer, datamodule):
    """``at_least_one_cell`` answers the most probable cell that has a token: where DoT's selection kept no token of
    any cell, it answers none (not the question's slot or a padding slot, which are no cell of the table)."""
    model = _sqa_module(hf_tokenizer, at_least_one_cell=True)
    ds = datamodule("sqa").datasets["train"]
    batch = TaskCollator()([ds[i] for i in range(3)])
    model.eval()
    with torch.no_grad():
        out = model(batch)
    cell_ids = batch.layout.cell_ids.clone()
    cell_ids[0] = 0  # the first question keeps no token of any cell
    rows = model.decode(replace(batch, layout=batch.layout.with_fields(cell_ids=cell_ids)), out)
    assert rows[0]["coordinates"] == []
    assert all(len(row["coordinates"]) >= 1 and min(min(c) for c in row["coordinates"]) >= 0 for row in rows[1:])


def _evaluate(model: TableQAModule, batch: TaskBatch) -> dict[str, dict]:
    """One evaluation of ``batch`` from fresh metrics and no previous answers: its decoded rows by question id."""
    model.eval()
    model._reset_predictions()
    for metric in model.metrics.values():
        metric.reset()
    with torch.no_grad():
        model._eval_step(batch, "val")
    return {row["question_id"]: row for row in model.predictions}


def test_bad_task_or_pruning_is_a_mate_error(tmp_path):
    root, source = SAMPLES["wtq"]
    common = dict(root=str(root), pretrained="minilm", split={"source": source}, cache_dir=str(tmp_path))
    with pytest.raises(MateError, match=r"^dataset.task='hybridqa' is not a table task; use one of sqa, tabfact, wtq$"):
        TableTaskDataModule(task="hybridqa", **common)
    with pytest.raises(MateError, match=r"dataset.pruning='longest' is invalid"):
        TableTaskDataModule(task="wtq", pruning="longest", **common)
    with pytest.raises(MateError, match=r"^dataset.ambiguous_answers='any' is invalid; use one of first, all, drop$"):
        TableTaskDataModule(task="wtq", ambiguous_answers="any", **common)


# ================================================================ 4. collation
def test_task_collator_carries_supervision_aligned_with_cells(datamodule):
    dm = datamodule("wtq")
    by_id = _rows_by_id(dm.datasets["train"])
    examples = [by_id["nt-1022"], by_id["nt-718"], by_id["nt-2488"]]  # scalar + cell, text + cell, scalar only
    batch = TaskCollator(dm.pad_id)(examples)
    assert isinstance(batch, TaskBatch) and len(batch) == 3
    assert batch.labels.tolist() == [-1, -1, -1]
    assert batch.float_answer.dtype == torch.float32
    assert batch.float_answer[0].item() == 560195.0 and batch.float_answer[2].item() == 3.0
    assert math.isnan(batch.float_answer[1].item())
    width = batch.cell_mask.shape[1]
    assert batch.cell_values.shape == (3, width) and width == 1 + max(len(ex["cell_coords"]) for ex in examples)
    for i, ex in enumerate(examples):
        n = len(ex["cell_coords"])
        assert batch.cell_coords[i, 1 : n + 1].tolist() == ex["cell_coords"]
        assert all(_same(batch.cell_values[i, k].item(), ex["cell_values"][k - 1]) for k in range(1, n + 1))
        assert torch.isnan(batch.cell_values[i, 0]) and torch.isnan(batch.cell_values[i, n + 1 :]).all()
        assert batch.candidate_mask[i].nonzero().flatten().tolist() == ex["candidates"]
        assert batch.cell_texts[i] == ex["cell_texts"] and batch.answers[i] == ex["answers"]
    k = examples[0]["cell_coords"].index([0, 11]) + 1  # the "560,195" cell
    assert batch.cell_values[0, k].item() == 560195.0 and batch.candidate_mask[0, k]
    assert batch.sequence_ids == [None, None, None] and batch.positions == [0, 0, 0]
    assert batch.channels == [None, None, None]


def test_task_collator_tabfact_labels(datamodule):
    dm = datamodule("tabfact")
    val = dm.datasets["validation"]
    rows = [val[i] for i in range(6)]
    batch = TaskCollator(dm.pad_id)(rows)
    assert batch.labels.tolist() == [r["label"] for r in rows]
    assert set(_column(val, "label")) == {0, 1}
    assert torch.isnan(batch.float_answer).all() and torch.isnan(batch.cell_values).all()
    assert not batch.candidate_mask.any()


def test_batch_select_reorders_every_per_example_field(datamodule):
    dm = datamodule("sqa")
    val = dm.datasets["validation"]
    by_id = _rows_by_id(val)
    examples = [by_id["ns-129/1/0"], by_id["nt-8495/1/2"]]  # different tables, lengths and positions
    batch = TaskCollator(dm.pad_id)(examples)
    assert batch.input_ids.shape[1] == max(len(ex["input_ids"]) for ex in examples)
    swapped = batch.select([1, 0])
    assert isinstance(swapped, TaskBatch)
    for name in ("input_ids", "cell_mask", "candidate_mask", "cell_coords", "labels"):
        assert torch.equal(getattr(swapped, name), getattr(batch, name)[[1, 0]]), name
    for name in ("float_answer", "cell_values"):
        torch.testing.assert_close(getattr(swapped, name), getattr(batch, name)[[1, 0]], equal_nan=True)
    for name in ("attention_mask", *ID_FIELDS):
        assert torch.equal(getattr(swapped.layout, name), getattr(batch.layout, name)[[1, 0]]), name
    for name in (
        "question_ids",
        "table_ids",
        "answers",
        "answer_coordinates",
        "cell_texts",
        "sequence_ids",
        "positions",
        "channels",
    ):
        assert getattr(swapped, name) == getattr(batch, name)[::-1], name
    assert swapped.question_ids == ["nt-8495/1/2", "ns-129/1/0"] and swapped.positions == [2, 0]
    assert swapped.sequence_ids == ["nt-8495/1", "ns-129/1"]
    assert swapped.answer_coordinates == [examples[1]["answer_coordinates"], examples[0]["answer_coordinates"]]
    # the first row is now the second example, whole
    n = len(examples[1]["input_ids"])
    assert swapped.input_ids[0, :n].tolist() == examples[1]["input_ids"]
    assert swapped.layout.prev_labels[0, :n].tolist() == examples[1]["layout"]["prev_labels"]


# ================================================================ 5. SQA evaluation: the model's own previous answer
def _sqa_batch(datamodule, *question_ids) -> TaskBatch:
    dm = datamodule("sqa")
    by_id = _rows_by_id(dm.datasets["validation"])
    return TaskCollator(dm.pad_id)([by_id[q] for q in question_ids])


def _gold_previous(datamodule, question_id: str) -> list[tuple[int, int]]:
    """The gold previous answer the cached SQA validation example was built with."""
    val = datamodule("sqa").datasets["validation"]
    seqs = defaultdict(dict)
    for row in (val[i] for i in range(len(val))):
        seqs[row["sequence_id"]][row["position"]] = row
    row = _rows_by_id(val)[question_id]
    return [tuple(c) for c in seqs[row["sequence_id"]][row["position"] - 1]["answer_coordinates"]]


def test_in_position_order_splits_a_mixed_batch(module, datamodule):
    batch = _sqa_batch(datamodule, "ns-129/1/2", "ns-129/1/0", "nt-8495/1/1", "ns-129/2/0", "ns-129/2/2")
    parts = module._in_position_order(batch)
    assert [p.positions for p in parts] == [[0, 0], [1], [2, 2]]
    assert [p.question_ids for p in parts] == [
        ["ns-129/1/0", "ns-129/2/0"],
        ["nt-8495/1/1"],
        ["ns-129/1/2", "ns-129/2/2"],
    ]
    for part in parts:  # each part is the sub-batch of its examples, tensors included
        index = [batch.question_ids.index(q) for q in part.question_ids]
        assert torch.equal(part.input_ids, batch.input_ids[index])
        assert torch.equal(part.layout.cell_ids, batch.layout.cell_ids[index])
        assert part.sequence_ids == [batch.sequence_ids[i] for i in index]
    single = _sqa_batch(datamodule, "ns-129/1/1", "ns-129/2/1")
    assert module._in_position_order(single) == [single]


def test_in_position_order_leaves_other_tasks_alone(module, datamodule):
    batch = _sqa_batch(datamodule, "ns-129/1/2", "ns-129/1/0")
    module.task = tasks.get("wtq")
    try:
        assert module._in_position_order(batch) == [batch]
        assert module._with_predicted_previous(batch) is batch
    finally:
        module.task = tasks.get("sqa")


def test_with_predicted_previous_marks_the_predicted_cell(module, datamodule):
    batch = _sqa_batch(datamodule, "ns-129/1/1", "ns-129/1/0")
    assert batch.layout.prev_labels[0].sum() > 0  # the cached example carries the gold previous answer
    coords = batch.cell_coords[0].tolist()
    predicted = (2, 1)
    assert predicted in [tuple(c) for c in coords]
    assert predicted not in {tuple(c) for c in _gold_previous(datamodule, "ns-129/1/1")}
    module._reset_predictions()
    module._predicted[("ns-129/1", 0)] = {predicted, (99, 99)}  # a cell this table lacks is ignored
    module._predicted[("ns-129/1", -1)] = {(0, 1)}  # never consulted: position 0 has no previous question
    out = module._with_predicted_previous(batch)
    k = [tuple(c) for c in coords].index(predicted)
    cell_ids = out.layout.cell_ids
    assert out.layout.prev_labels.dtype == torch.long
    assert out.layout.prev_labels[0].tolist() == (cell_ids[0] == k).long().tolist()
    assert out.layout.prev_labels[0].sum() > 0
    assert out.layout.prev_labels[1].sum() == 0  # position 0: no previous question
    # whatever prev_labels a batch arrives with are replaced, position 0's too
    stale = replace(batch, layout=batch.layout.with_fields(prev_labels=(batch.layout.cell_ids > 0).long()))
    again = module._with_predicted_previous(stale)
    assert torch.equal(again.layout.prev_labels, out.layout.prev_labels)
    # the rest of the batch is untouched
    assert torch.equal(out.input_ids, batch.input_ids) and out.question_ids == batch.question_ids
    assert torch.equal(out.layout.cell_ids, batch.layout.cell_ids)
    assert torch.equal(batch.layout.prev_labels, _sqa_batch(datamodule, "ns-129/1/1", "ns-129/1/0").layout.prev_labels)


def test_with_predicted_previous_without_a_prediction_is_zeros(module, datamodule, caplog):
    batch = _sqa_batch(datamodule, "ns-129/2/2")
    module._reset_predictions()
    module._predicted[("ns-129/1", 1)] = {(0, 1)}  # another sequence's prediction is not used
    module._warned_missing = False
    with caplog.at_level(logging.WARNING, logger="mate_cli.lit_modules.table_qa"):
        out = module._with_predicted_previous(batch)
    assert out.layout.prev_labels.sum() == 0
    assert "no prediction for the question before ns-129/2/2" in caplog.text
    module._predicted[("ns-129/2", 1)] = set()  # predicted nothing: nothing marked, no warning needed
    assert module._with_predicted_previous(batch).layout.prev_labels.sum() == 0


def test_decode_feeds_the_next_position(module, datamodule):
    """A prediction decoded (and remembered, as evaluation does) at position 0 becomes position 1's
    ``prev_labels``; decoding alone, as the training step does, remembers nothing."""
    first = _sqa_batch(datamodule, "ns-129/1/0")
    coords = [tuple(c) for c in first.cell_coords[0].tolist()]
    chosen = {(0, 1), (3, 1)}
    chosen_ids = [coords.index(c) for c in chosen]
    logits = torch.full(first.input_ids.shape, -10.0)
    for k in chosen_ids:
        logits[first.layout.cell_ids == k] = 10.0
    module._reset_predictions()
    rows = module.decode(first, QAOutput(logits=logits, aggregation_logits=None, loss=None))
    assert module._predicted == {}
    module.remember(rows)
    assert rows[0]["coordinates"] == [[0, 1], [3, 1]] and rows[0]["aggregation"] == "NONE"
    gold = {tuple(c) for c in first.answer_coordinates[0]}
    assert rows[0]["correct"] == (gold == chosen)
    assert module._predicted[("ns-129/1", 0)] == chosen
    second = module._with_predicted_previous(_sqa_batch(datamodule, "ns-129/1/1"))
    coords = [tuple(c) for c in second.cell_coords[0].tolist()]
    marked = {coords[k] for k in second.layout.cell_ids[0][second.layout.prev_labels[0].bool()].tolist()}
    assert marked == chosen


def test_at_least_one_cell_answers_the_most_probable_cell_where_none_passes_the_threshold(module, datamodule):
    """TAPAS's decoding answers nothing where no cell reaches 0.5; ``model.head.at_least_one_cell`` answers the most
    probable cell there, and leaves a prediction with a cell above the threshold as it is."""
    first = _sqa_batch(datamodule, "ns-129/1/0")
    coords = [tuple(c) for c in first.cell_coords[0].tolist()]
    unsure = torch.full(first.input_ids.shape, -10.0)
    unsure[first.layout.cell_ids == coords.index((3, 1))] = -1.0  # the most probable cell, at 0.27
    sure = unsure.clone()
    sure[first.layout.cell_ids == coords.index((0, 1))] = 10.0

    def decoded(logits) -> list:
        return module.decode(first, QAOutput(logits=logits, aggregation_logits=None, loss=None))[0]["coordinates"]

    assert decoded(unsure) == [] and decoded(sure) == [[0, 1]]
    module.head_config.at_least_one_cell = True
    try:
        assert decoded(unsure) == [[3, 1]] and decoded(sure) == [[0, 1]]
    finally:
        module.head_config.at_least_one_cell = False


def test_aggregate_answer():
    assert aggregate_answer("NONE", ["a", "b"], [nan, nan]) == ["a", "b"]
    assert aggregate_answer("COUNT", ["a", "b", "c"], [nan, 1.0, 2.0]) == ["3"]
    assert aggregate_answer("SUM", ["1", "x", "2.5"], [1.0, nan, 2.5]) == ["3.5"]
    assert aggregate_answer("AVERAGE", ["2", "4"], [2.0, 4.0]) == ["3"]
    assert aggregate_answer("SUM", ["x"], [nan]) == []


def test_wtq_decode_scores_against_the_canonical_answers(module, table_tokenizer):
    """Selecting a "3" cell answers "Stage 3" (tagged canonical form 3.0); emulated, the gold is a word."""
    reader = WTQReader(Path(__file__).resolve().parent / "wtq_tagged")
    stage = next(q for q in reader.questions("pristine-seen-tables.tsv") if q.question_id == "ns-1908")
    table = reader.table(stage.table_id)
    examples = [
        encode_task_question(table_tokenizer, tasks.get("wtq"), q, table)
        for q in (stage, replace(stage, canonical_answers=[]))
    ]
    batch = TaskCollator()(examples)
    k = 1 + [tuple(c) for c in examples[0]["cell_coords"]].index((1, 1))
    logits = torch.where(batch.layout.cell_ids == k, 10.0, -10.0)
    module.task = tasks.get("wtq")
    try:
        rows = module.decode(batch, QAOutput(logits=logits, aggregation_logits=None, loss=None))
    finally:
        module.task = tasks.get("sqa")
    assert [row["answer"] for row in rows] == [["3"], ["3"]]
    assert [row["correct"] for row in rows] == [True, False]


def test_tabfact_templated_rows_are_the_same_statements_over_phrased_cells(datamodule, hf_tokenizer):
    """``dataset.linearization=template`` (its own cache): the same statements and labels, every
    data cell written as "<header> is <cell> ;" with the cell's ids (mate_cli.data.tokenize)."""
    plain, templated = datamodule("tabfact"), datamodule("tabfact", linearization="template")
    assert plain.cache_key("train") != templated.cache_key("train")
    a, b = plain.datasets["train"], templated.datasets["train"]
    assert _column(a, "question_id") == _column(b, "question_id") and _column(a, "label") == _column(b, "label")
    example = next(x for x in b if not x["truncated"])  # no phrase cut by the length cap
    table = plain.reader.table(example["table_id"])
    cells = example["layout"]["cell_ids"]
    first = [t for t, k in zip(example["input_ids"], cells) if k == 1]
    row, column = example["cell_coords"][0]
    assert hf_tokenizer.decode(first) == hf_tokenizer.decode(
        hf_tokenizer(f"{table.header[column].text} is {table.rows[row][column].text} ;", add_special_tokens=False)[
            "input_ids"
        ]
    )
    assert sum(len(x["input_ids"]) for x in b) > sum(len(x["input_ids"]) for x in a)


def test_tabfact_shuffled_tables_change_the_tables_never_the_statements_or_labels(datamodule, hf_tokenizer):
    """``dataset.eval_tables=shuffled`` (`mate eval tables=shuffled`): each validation statement is encoded with
    another table of the split, the same one for every statement of a table, none with its own; the statements,
    labels and ids stay, training is untouched, and the shuffled split has a cache entry of its own."""
    own, shuffled = datamodule("tabfact"), datamodule("tabfact", eval_tables="shuffled")
    assert own.cache_key("train") == shuffled.cache_key("train")
    assert own.cache_key("validation") != shuffled.cache_key("validation")
    assert _column(own.datasets["train"], "input_ids") == _column(shuffled.datasets["train"], "input_ids")
    a, b = own.datasets["validation"], shuffled.datasets["validation"]
    for name in ("question_id", "label"):
        assert _column(a, name) == _column(b, name)
    pairs = set(zip(_column(a, "table_id"), _column(b, "table_id")))
    tables = set(_column(a, "table_id"))
    assert len(tables) >= 3 and all(mine != other for mine, other in pairs)
    assert len(pairs) == len(tables) and {other for _, other in pairs} == tables  # a permutation of the split's tables
    sep = hf_tokenizer.sep_token_id

    def statement(ids: list[int]) -> list[int]:
        return ids[: ids.index(sep)]

    ids_a, ids_b = _column(a, "input_ids"), _column(b, "input_ids")
    assert [statement(x) for x in ids_a] == [statement(x) for x in ids_b]
    assert all(x != y for x, y in zip(ids_a, ids_b))
    # a fixed pairing: built again, the same
    again = TableTaskDataModule(
        task="tabfact", root=str(SAMPLES["tabfact"][0]), split={"source": SAMPLES["tabfact"][1]}, eval_tables="shuffled"
    )
    assert [q.table_id for q in again.questions("validation")] == _column(b, "table_id")


@pytest.mark.parametrize("task", ["sqa", "wtq"])
def test_shuffled_tables_are_refused_where_the_answer_is_in_the_table(task):
    root, source = SAMPLES[task]
    with pytest.raises(MateError, match=rf"^dataset.eval_tables=shuffled .* {task}'s answers .*; use it on a TabFact"):
        TableTaskDataModule(task=task, root=str(root), split={"source": source}, eval_tables="shuffled")
