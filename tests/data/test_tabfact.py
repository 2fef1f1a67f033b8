"""TabFactReader on the bundled TabFact sample and on broken copies of it."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from collections import Counter
from pathlib import Path

import pytest

from mate_cli.data.tabfact import TabFactReader, read_table_file
from mate_cli.errors import MateError

TABFACT_ROOT = Path(__file__).resolve().parents[2] / "data" / "tabfact_sample"
EXAMPLES = "tokenized_data/val_examples.json"


@pytest.fixture(scope="module")
def tabfact() -> TabFactReader:
    return TabFactReader(TABFACT_ROOT)


@pytest.fixture(scope="module")
def statements(tabfact):
    return list(tabfact.questions("dev"))


@pytest.fixture
def tabfact_copy(tmp_path) -> Path:
    root = tmp_path / "tabfact"
    shutil.copytree(TABFACT_ROOT, root)
    return root


def _examples(root: Path) -> dict:
    return json.loads((root / EXAMPLES).read_text(encoding="utf-8"))


# ------------------------------------------------------------------ sample
def test_counts_match_sample_readme(tabfact, statements):
    assert len(statements) == 225
    assert Counter(q.label for q in statements) == {1: 111, 0: 114}
    assert len({q.question_id for q in statements}) == 225
    assert len({q.table_id for q in statements}) == 30
    assert all(q.channel is None for q in statements)  # no simple/complex id lists in the sample
    assert tabfact.skipped["dev"] == {}


def test_statement_ids_follow_the_examples_file(statements):
    raw = _examples(TABFACT_ROOT)
    first_table, (texts, labels, caption) = next(iter(raw.items()))
    mine = [q for q in statements if q.table_id == first_table]
    assert [q.question_id for q in mine] == [f"{first_table}#{i}" for i in range(len(texts))]
    assert [q.question for q in mine] == texts and [q.label for q in mine] == labels
    assert statements[0].question.startswith("daniel acácio first match")  # \u00e1 decoded


def test_tables_parse_with_hash_separator(tabfact, statements):
    table = tabfact.table("2-18178534-1.html.csv")
    assert [c.text for c in table.header] == ["opposing teams", "against", "date", "venue", "status"]
    assert [c.text for c in table.rows[0]] == ["ireland", "0", "20 / 01 / 1990", "twickenham , london", "five nations"]
    assert table.num_rows == 7
    for table_id in {q.table_id for q in statements}:
        table = tabfact.table(table_id)
        assert table.num_columns > 1 and 5 <= table.num_rows <= 43
        assert all(len(row) == table.num_columns for row in table.rows)
        assert not any(
            "\r" in c.text or "#" in c.text for row in [table.header, *table.rows] for c in row
        )  # CRLF files
    assert tabfact.table("2-17835872-2.html.csv").num_rows == 43


def test_title_is_the_caption(statements):
    reader = TabFactReader(TABFACT_ROOT)
    assert reader.table("2-17835872-2.html.csv").title == ""  # no question file read yet
    list(reader.questions("val_examples.json"))
    assert reader.table("2-17835872-2.html.csv").title == "daniel acácio"
    assert read_table_file(TABFACT_ROOT / "data/all_csv/2-17835872-2.html.csv").table_id == "2-17835872-2.html.csv"
    copy = pickle.loads(pickle.dumps(reader))  # the captions travel, the table cache starts empty
    assert copy._tables.cache_info().currsize == 0 and copy.table("2-17835872-2.html.csv").title == "daniel acácio"


def test_split_names_and_file_names(tabfact):
    assert tabfact.question_file("dev") == tabfact.question_file("val_examples.json") == TABFACT_ROOT / EXAMPLES
    with pytest.raises(MateError, match="'train_examples.json'.*available files: \\['val_examples.json'\\]") as err:
        tabfact.question_file("train")
    assert str(TABFACT_ROOT / "tokenized_data") in str(err.value)
    files = tabfact.input_files()
    assert TABFACT_ROOT / EXAMPLES in files and len(files) == 31


def test_channels_from_id_lists(tabfact_copy):
    raw = list(_examples(tabfact_copy))
    (tabfact_copy / "data/simple_ids.json").write_text(json.dumps(raw[:10]))  # upstream: a list
    (tabfact_copy / "data/complex_ids.json").write_text(json.dumps({t: 1 for t in raw[10:25]}))
    reader = TabFactReader(tabfact_copy)
    channels = {q.table_id: q.channel for q in reader.questions("dev")}
    assert Counter(channels.values()) == {"simple": 10, "complex": 15, None: 5}
    assert tabfact_copy / "data/simple_ids.json" in reader.input_files()
    (tabfact_copy / "data/simple_ids.json").write_text(json.dumps([1, 2]))
    with pytest.raises(MateError, match="simple_ids.json: expected a JSON list of table ids"):
        list(TabFactReader(tabfact_copy).questions("dev"))


# ------------------------------------------------------------------ errors
def test_missing_root_and_layout(tmp_path):
    with pytest.raises(MateError, match="dataset.root not found.*tokenized_data") as err:
        TabFactReader(tmp_path / "nowhere")
    assert "\n" not in str(err.value)
    (tmp_path / "tokenized_data").mkdir()
    with pytest.raises(MateError, match=r"has no data/all_csv/.*dataset\.root="):
        TabFactReader(tmp_path)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda v: v[1].__setitem__(2, 2), "statement #2: .* with label 2 is not"),
        (lambda v: v[1].__setitem__(0, "1"), "statement #0: .* with label '1' is not"),
        (lambda v: v[0].__setitem__(1, None), "statement #1: .* is not"),
        (lambda v: v[1].pop(), "one label per statement"),
    ],
)
def test_malformed_entry_names_file_and_table(tabfact_copy, mutate, expected):
    data = _examples(tabfact_copy)
    table_id = list(data)[3]
    mutate(data[table_id])
    path = tabfact_copy / EXAMPLES
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(MateError, match=expected) as err:
        list(TabFactReader(tabfact_copy).questions("dev"))
    assert str(path) in str(err.value) and table_id in str(err.value)


def test_not_json_or_not_an_object(tabfact_copy):
    path = tabfact_copy / EXAMPLES
    path.write_text('{"2-1.html.csv": [["a"], [1]')
    with pytest.raises(MateError, match="not valid JSON") as err:
        list(TabFactReader(tabfact_copy).questions("dev"))
    assert str(path) in str(err.value)
    path.write_text("[]")
    with pytest.raises(MateError, match="expected a JSON object"):
        list(TabFactReader(tabfact_copy).questions("dev"))


def test_repeated_table_key(tabfact_copy, caplog):
    data = _examples(tabfact_copy)
    table_id, value = next(iter(data.items()))
    entry = f"{json.dumps(table_id)}: {json.dumps(value)}"  # the same key twice, as text
    path = tabfact_copy / EXAMPLES
    path.write_text("{" + entry + ", " + entry + "}")
    reader = TabFactReader(tabfact_copy)
    with caplog.at_level(logging.WARNING, logger="mate_cli.data.readers"):
        assert len(list(reader.questions("dev"))) == len(value[0])
    assert reader.skipped["dev"] == {"duplicate_records": len(value[0])}
    assert "repeats question" in caplog.text

    changed = [[value[0][0] + " !", *value[0][1:]], value[1], value[2]]
    path.write_text("{" + entry + ", " + f"{json.dumps(table_id)}: {json.dumps(changed)}" + "}")
    with pytest.raises(MateError, match=f"'{table_id}#0' appears twice .*entry #0.*entry #1") as err:
        list(TabFactReader(tabfact_copy).questions("dev"))
    assert str(path) in str(err.value)


def test_empty_statement_skipped(tabfact_copy):
    data = _examples(tabfact_copy)
    table_id = list(data)[0]
    data[table_id][0][1] = "  "
    (tabfact_copy / EXAMPLES).write_text(json.dumps(data))
    reader = TabFactReader(tabfact_copy)
    got = list(reader.questions("dev"))
    assert len(got) == 224 and f"{table_id}#1" not in {q.question_id for q in got}
    assert reader.skipped["dev"] == {"empty_question": 1}


def test_missing_table_file(tabfact_copy):
    (tabfact_copy / "data/all_csv/2-18178534-1.html.csv").unlink()
    with pytest.raises(MateError, match="table file not found: .*2-18178534-1.html.csv"):
        TabFactReader(tabfact_copy).table("2-18178534-1.html.csv")
    with pytest.raises(MateError, match="table=.*not found; pass a TabFact"):
        read_table_file(tabfact_copy / "data/all_csv/2-18178534-1.html.csv")


def test_a_comma_separated_file_is_not_read_as_a_tabfact_table(tmp_path):
    from mate_cli.data.tabfact import read_table_file

    path = tmp_path / "t.csv"
    path.write_text("name,year\nann,1999\n", encoding="utf-8")
    with pytest.raises(MateError, match="not a '#'-separated TabFact table"):
        read_table_file(path)
    path.write_text("name#year\nann#1999\n", encoding="utf-8")
    assert [c.text for c in read_table_file(path).header] == ["name", "year"]
