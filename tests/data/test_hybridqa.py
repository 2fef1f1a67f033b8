"""HybridQAReader and split_by_table on the bundled sample and on broken copies of it."""

from __future__ import annotations

import json
import logging
import pickle

import pytest

from mate_cli.data.hybridqa import HybridQAReader
from mate_cli.data.split import split_by_table
from mate_cli.data.records import Question
from mate_cli.errors import MateError


# ------------------------------------------------------------------ counts
def test_counts_match_sample_readme(reader, sample_root, dev_questions):
    table_ids = sorted(p.stem for p in (sample_root / "WikiTables-WithLinks/tables_tok").glob("*.json"))
    assert len(table_ids) == 45
    assert all(reader.table(t).num_rows > 0 for t in table_ids)
    assert len(dev_questions) == 53
    test = list(reader.questions("test"))
    assert len(test) == 15
    assert len({q.table_id for q in test}) == 14
    assert all(q.answer_text is None and q.answer_nodes == [] for q in test)
    assert sum(bool(reader.table(t).intro) for t in table_ids) == 11


def test_dev_reference_split_and_traced_nodes(sample_root, dev_questions):
    ref = json.loads((sample_root / "released_data/dev_reference.json").read_text())
    assert (len(ref["table"]), len(ref["passage"])) == (25, 28)
    by_id = {q.question_id: q for q in dev_questions}
    assert set(ref["reference"]) == set(by_id)
    assert all(by_id[qid].answer_text == answer for qid, answer in ref["reference"].items())
    # dev.traced.json is preferred, so every dev question carries its answer nodes
    assert all(q.answer_nodes for q in dev_questions)
    in_passage = [by_id[qid] for qid in ref["passage"]]
    assert all(any(n.source == "passage" and n.link for n in q.answer_nodes) for q in in_passage)


def test_first_dev_question_parsed(dev_questions):
    q = dev_questions[0]
    assert q.question_id == "079a8368bdad96b3"
    assert q.table_id == "Marine_defense_battalions_0"
    assert q.answer_text == "4th Defense Battalion"
    node = q.answer_nodes[0]
    assert (node.text, node.coord, node.link, node.source) == ("4th Defense Battalion", (3, 0), None, "table")


def test_table_and_passages(reader):
    table = reader.table("1991_Monaco_Grand_Prix_0")
    assert [c.text for c in table.header][:3] == ["Pos", "No", "Driver"]
    assert table.rows[0][2].text == "JJ Lehto" and table.rows[0][2].links == ["/wiki/JJ_Lehto"]
    assert all(len(row) == table.num_columns for row in table.rows)
    passages = reader.passages("1991_Monaco_Grand_Prix_0")
    assert passages["/wiki/JJ_Lehto"].startswith("Jyrki Juhani")


def test_splits_and_question_file(reader, sample_root):
    assert reader.splits() == ["dev", "test"]
    assert reader.question_file("dev").name == "dev.traced.json"
    assert reader.question_file("test").name == "test.json"


def test_table_cache_is_bounded_lru(sample_root):
    reader = HybridQAReader(sample_root, cache_size=2)
    a = reader.table("1991_Monaco_Grand_Prix_0")
    assert reader.table("1991_Monaco_Grand_Prix_0") is a
    reader.table("Marine_defense_battalions_0")
    reader.table("ADX_Florence_0")
    assert reader._tables.cache_info().currsize == 2
    assert reader.table("1991_Monaco_Grand_Prix_0") is not a  # evicted, re-read


def test_a_reader_pickles_with_empty_caches(sample_root):
    reader = HybridQAReader(sample_root, cache_size=2)
    table = reader.table("1991_Monaco_Grand_Prix_0")
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._tables.cache_info().currsize == 0 and copy._passages.cache_info().maxsize == 2
    assert copy.table("1991_Monaco_Grand_Prix_0") == table and copy._tables.cache_info().currsize == 1
    assert reader._tables.cache_info().currsize == 1  # the copy reads through its own cache


# ------------------------------------------------------------------ errors
def test_missing_root(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(MateError, match=r"^dataset\.root not found") as err:
        HybridQAReader(missing)
    assert str(missing) in str(err.value) and "dataset.root=" in str(err.value)
    assert "\n" not in str(err.value)


def test_root_without_released_data(tmp_path):
    with pytest.raises(MateError, match="released_data"):
        HybridQAReader(tmp_path)


def test_unknown_split(reader):
    with pytest.raises(MateError, match="'train'.*available.*dev"):
        next(reader.questions("train"))


def _write_questions(root, records):
    path = root / "released_data" / "dev.traced.json"
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r.pop("table_id"), "missing key 'table_id'"),
        (lambda r: r.update(question=7), "'question' must be a string"),
        (lambda r: r.update({"answer-node": [["x", [1], None, "table"]]}), "answer-node entry"),
        (lambda r: r.update({"answer-node": [["x", [1, 0], None, "cell"]]}), "answer-node entry"),
        (lambda r: r.update({"answer-text": ["x"]}), "'answer-text' must be a string"),
    ],
)
def test_malformed_question_names_file_and_id(tiny_root, mutate, expected):
    records = json.loads((tiny_root / "released_data/dev.traced.json").read_text())[:3]
    mutate(records[1])
    path = _write_questions(tiny_root, records)
    with pytest.raises(MateError) as err:
        list(HybridQAReader(tiny_root).questions("dev"))
    message = str(err.value)
    assert str(path) in message and records[1]["question_id"] in message and expected in message


def test_question_record_not_an_object(tiny_root):
    path = _write_questions(tiny_root, [["not", "a", "record"]])
    with pytest.raises(MateError, match="record #0") as err:
        list(HybridQAReader(tiny_root).questions("dev"))
    assert str(path) in str(err.value)


def test_question_file_bad_json(tiny_root):
    path = tiny_root / "released_data" / "dev.traced.json"
    path.write_text('[{"question_id": "a",')
    with pytest.raises(MateError, match="not valid JSON") as err:
        list(HybridQAReader(tiny_root).questions("dev"))
    assert str(path) in str(err.value)


def _table_path(root, table_id):
    return root / "WikiTables-WithLinks" / "tables_tok" / f"{table_id}.json"


def test_table_bad_json(tiny_root):
    table_id = "1991_Monaco_Grand_Prix_0"
    path = _table_path(tiny_root, table_id)
    path.write_text(path.read_text()[:200])
    with pytest.raises(MateError, match="not valid JSON") as err:
        HybridQAReader(tiny_root).table(table_id)
    assert str(path) in str(err.value) and table_id in str(err.value)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda t: t["data"][2].pop(), "data row 2 is 5 cells, header has 6 cells"),
        (lambda t: t["data"].__setitem__(1, "oops"), "data row 1 is a str, not a list"),
        (lambda t: t["data"][0].__setitem__(0, "1"), "row 0: cell"),
        (lambda t: t["data"][0][0].__setitem__(1, "/wiki/x"), "is not [text, [links]]"),
        (lambda t: t.pop("header"), "missing or non-list 'header'"),
    ],
)
def test_table_wrong_shape_names_file_and_id(tiny_root, mutate, expected):
    table_id = "1991_Monaco_Grand_Prix_0"
    path = _table_path(tiny_root, table_id)
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(MateError) as err:
        HybridQAReader(tiny_root).table(table_id)
    message = str(err.value)
    assert str(path) in message and table_id in message and expected in message


def test_missing_table_file(tiny_root):
    with pytest.raises(MateError, match="table file not found.*ADX_Florence_0"):
        HybridQAReader(tiny_root).table("ADX_Florence_0")


def test_missing_passages_warn_not_crash(tiny_root, caplog):
    table_id = "Marine_defense_battalions_0"
    (tiny_root / "WikiTables-WithLinks" / "request_tok" / f"{table_id}.json").unlink()
    with caplog.at_level(logging.WARNING, logger="mate_cli.data.hybridqa"):
        assert HybridQAReader(tiny_root).passages(table_id) == {}
    assert table_id in caplog.text


def test_a_table_id_with_a_path_separator_reads_no_file_outside_its_folder(tiny_root):
    outside = tiny_root / "WikiTables-WithLinks" / "request_tok" / "..\\secret.json"
    outside.write_text(
        json.dumps({"/wiki/x": "not a passage of this dataset"})
    )  # a file named as Windows would read it
    assert HybridQAReader(tiny_root).passages("..\\secret") == {}  # refused like the table of that id
    with pytest.raises(MateError, match="table file not found"):
        HybridQAReader(tiny_root).table("..\\secret")


def test_bad_passages_file(tiny_root):
    table_id = "Marine_defense_battalions_0"
    path = tiny_root / "WikiTables-WithLinks" / "request_tok" / f"{table_id}.json"
    path.write_text(json.dumps(["not", "a", "map"]))
    with pytest.raises(MateError) as err:
        HybridQAReader(tiny_root).passages(table_id)
    assert str(path) in str(err.value) and table_id in str(err.value)


# ------------------------------------------------------------------- split
def _tables(questions):
    return {q.table_id for q in questions}


def test_split_by_table_disjoint_complete_ordered(dev_questions):
    train, val = split_by_table(dev_questions, 0.2, seed=0)
    assert _tables(train).isdisjoint(_tables(val))
    assert len(train) + len(val) == len(dev_questions)
    assert train and val
    order = {q.question_id: i for i, q in enumerate(dev_questions)}
    assert [order[q.question_id] for q in train] == sorted(order[q.question_id] for q in train)


def test_split_by_table_deterministic_and_process_independent(dev_questions):
    first = split_by_table(dev_questions, 0.2, seed=0)
    again = split_by_table(list(reversed(dev_questions)), 0.2, seed=0)
    assert _tables(first[1]) == _tables(again[1])
    # pinned: sha256-based, so the same in every process (Python's hash() is salted)
    assert sorted(_tables(first[1])) == [
        "2006_in_video_gaming_1",
        "2011_Kazakhstan_Premier_League_1",
        "Amanda_Bynes_1",
        "Copa_Sudamericana_records_and_statistics_0",
        "Education_in_Northern_Cyprus_0",
        "Laurence_Fox_1",
        "List_of_Canadian_writers_17",
        "List_of_Japanese_films_of_1980_1",
        "List_of_United_States_Military_Academy_alumni_2",
        "List_of_ships_of_the_Royal_Australian_Navy_20",
        "National_Register_of_Historic_Places_listings_in_Matanuska-Susitna_Borough,_Alaska_0",
    ]
    assert _tables(split_by_table(dev_questions, 0.2, seed=1)[1]) != _tables(first[1])


@pytest.mark.parametrize("fraction", [1e-6, 0.999999])
def test_split_by_table_both_sides_non_empty(dev_questions, fraction):
    train, val = split_by_table(dev_questions, fraction, seed=3)
    assert train and val and _tables(train).isdisjoint(_tables(val))


def test_split_by_table_two_tables_and_one():
    qs = [Question(f"q{i}", "?", f"t{i % 2}") for i in range(6)]
    train, val = split_by_table(qs, 0.5, seed=0)
    assert len(_tables(train)) == len(_tables(val)) == 1
    train, val = split_by_table(qs[::2], 0.9, seed=0)
    assert len(train) == 3 and val == []


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5])
def test_split_by_table_bad_fraction(dev_questions, fraction):
    with pytest.raises(MateError, match="val_fraction"):
        split_by_table(dev_questions, fraction)


# ------------------------------------------------------------ bad records
def _rewrite_dev(root, change):
    path = root / "released_data" / "dev.traced.json"
    records = json.loads(path.read_text())
    change(records)
    path.write_text(json.dumps(records))
    return path, records


def test_a_question_id_used_twice_for_different_records_names_both(tiny_root):
    def change(records):
        records.append({**records[5], "question": "something else entirely ?"})

    path, records = _rewrite_dev(tiny_root, change)
    with pytest.raises(
        MateError,
        match=rf"dev.traced.json: question '{records[5]['question_id']}' appears twice "
        rf"\(records #5 and #{len(records) - 1}\)",
    ):
        list(HybridQAReader(tiny_root).questions("dev"))


def test_repeated_empty_and_answerless_records_are_skipped_counted_and_warned(tiny_root, caplog):
    def change(records):
        records.append(dict(records[0]))  # an exact copy
        records[1]["question"] = "   "
        del records[2]["answer-text"]
        records[2].pop("answer-node", None)

    _, records = _rewrite_dev(tiny_root, change)
    reader = HybridQAReader(tiny_root)
    with caplog.at_level(logging.WARNING, logger="mate_cli.data.hybridqa"):
        ids = [q.question_id for q in reader.questions("dev")]
    assert len(ids) == len(set(ids)) == len(records) - 3
    assert dict(reader.skipped["dev"]) == {"duplicate_records": 1, "empty_question": 1, "no_answer_fields": 1}
    assert sum("skipped" in r.getMessage() and "dev.traced.json" in r.getMessage() for r in caplog.records) == 3


def test_a_file_without_answers_is_read_as_is(tiny_root):
    path = tiny_root / "released_data" / "test.json"
    questions = list(HybridQAReader(tiny_root).questions("test"))
    assert len(questions) == len(json.loads(path.read_text())) and all(q.answer_text is None for q in questions)
