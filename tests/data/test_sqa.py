"""SQAReader on the bundled SQA sample and on broken copies of it."""

from __future__ import annotations

import logging
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from mate_cli.data.sqa import SQAReader, read_table_file
from mate_cli.errors import MateError

SQA_ROOT = Path(__file__).resolve().parents[2] / "data" / "sqa_sample"


@pytest.fixture(scope="module")
def sqa() -> SQAReader:
    return SQAReader(SQA_ROOT)


@pytest.fixture(scope="module")
def questions(sqa):
    return list(sqa.questions("train.tsv"))


@pytest.fixture
def sqa_copy(tmp_path) -> Path:
    root = tmp_path / "sqa"
    shutil.copytree(SQA_ROOT, root)
    return root


def _rows(root: Path) -> list[list[str]]:
    return [line.split("\t") for line in (root / "train.tsv").read_text(encoding="utf-8").splitlines()]


def _write(root: Path, rows: list[list[str]]) -> Path:
    path = root / "train.tsv"
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------ sample
def test_counts_match_sample_readme(sqa, questions):
    assert len(questions) == 68
    assert len({q.question_id for q in questions}) == 68
    sequences = defaultdict(list)
    for q in questions:
        sequences[q.sequence_id].append(q.position)
    assert len(sequences) == 20
    assert all(positions == list(range(len(positions))) for positions in sequences.values())
    assert len({q.table_id for q in questions}) == 15
    assert sqa.skipped["train.tsv"] == {}


def test_first_questions_parsed(questions):
    q = questions[1]
    assert (q.question_id, q.sequence_id, q.position) == ("nt-2156/0/1", "nt-2156/0", 1)
    assert q.table_id == "table_csv/204_195.csv"
    assert (q.answers, q.answer_coordinates) == (["2,850"], [[3, 3]])
    assert len(questions[0].answer_coordinates) == 12 and questions[0].answer_coordinates[0] == [0, 1]


def test_gold_coordinates_point_at_their_answer_text(sqa, questions):
    checked = 0
    for q in questions:
        table = sqa.table(q.table_id)
        assert all(len(row) == table.num_columns for row in table.rows)
        assert len(q.answer_coordinates) == len(q.answers) > 0
        for (row, column), text in zip(q.answer_coordinates, q.answers):
            assert table.rows[row][column].text == text
            checked += 1
    assert checked == sum(len(q.answers) for q in questions) > 200


def test_quoted_csv_cells(sqa):
    table = sqa.table("table_csv/204_792.csv")
    assert [c.text for c in table.header][:3] == ["#", "Date", "Opponent"]
    assert table.rows[0][7].text == "40,606" and table.num_rows == 27
    assert sqa.table("table_csv/204_792.csv") is table
    assert read_table_file(SQA_ROOT / "table_csv/204_792.csv").table_id == "204_792.csv"


def test_split_names_and_file_names(sqa):
    assert sqa.question_file("train.tsv") == SQA_ROOT / "train.tsv"
    with pytest.raises(MateError, match="random-split-1-train.tsv"):  # the full release's train split
        sqa.question_file("train")
    with pytest.raises(MateError, match="'test.tsv'.*available files: \\['train.tsv'\\]"):
        sqa.question_file("test")
    files = sqa.input_files()
    assert SQA_ROOT / "train.tsv" in files and len(files) == 16


def test_quoted_question_field_with_tab_and_newline(sqa_copy):
    rows = _rows(sqa_copy)
    rows[1][3] = '"what are the\thome cities\nof the league"'
    _write(sqa_copy, rows)
    got = list(SQAReader(sqa_copy).questions("train.tsv"))
    assert len(got) == 68 and got[0].question == "what are the\thome cities\nof the league"


# ------------------------------------------------------------------ errors
def test_missing_root_and_layout(tmp_path):
    with pytest.raises(MateError, match="dataset.root not found.*table_csv") as err:
        SQAReader(tmp_path / "nowhere")
    assert "\n" not in str(err.value)
    with pytest.raises(MateError, match=r"has no table_csv/.*dataset\.root="):
        SQAReader(tmp_path)


@pytest.mark.parametrize(
    "column, value, expected",
    [
        (5, "['(0, 1)', '(x, 1)']", r"answer coordinate '\(x, 1\)' is not"),
        (5, "['(0, -1)']", r"answer coordinate '\(0, -1\)' is not"),
        (5, "[(0, 1", "is not a Python-literal list"),
        (6, "[1, 2]", "answer_text .* is not a list of strings"),
        (2, "first", "position 'first' is not a non-negative integer"),
    ],
)
def test_malformed_record_names_file_line_and_id(sqa_copy, column, value, expected):
    rows = _rows(sqa_copy)
    rows[3][column] = value
    path = _write(sqa_copy, rows)
    with pytest.raises(MateError, match=expected) as err:
        list(SQAReader(sqa_copy).questions("train.tsv"))
    message = str(err.value)
    assert str(path) in message and f"line 4 (id {rows[3][0]!r}" in message


def test_missing_column_and_short_line(sqa_copy):
    rows = _rows(sqa_copy)
    path = _write(sqa_copy, [rows[0][:5] + rows[0][6:]] + [r[:5] + r[6:] for r in rows[1:]])
    reader = SQAReader(sqa_copy)
    assert all(q.answer_coordinates == [] for q in reader.questions("train.tsv"))  # answer columns are optional
    _write(sqa_copy, [rows[0][:4]] + rows[1:])
    with pytest.raises(MateError, match="no 'table_file' column") as err:
        next(SQAReader(sqa_copy).questions("train.tsv"))
    assert str(path) in str(err.value)
    _write(sqa_copy, rows[:2] + [rows[2][:6]] + rows[3:])
    with pytest.raises(MateError, match="line 3 has 6 tab-separated fields, the header has 7"):
        list(SQAReader(sqa_copy).questions("train.tsv"))


def test_duplicates_and_empty_questions(sqa_copy, caplog):
    rows = _rows(sqa_copy)
    blank = list(rows[1])
    blank[0], blank[3] = "nt-blank", ""
    _write(sqa_copy, rows[:3] + [rows[2], blank] + rows[3:])
    reader = SQAReader(sqa_copy)
    with caplog.at_level(logging.WARNING, logger="mate_cli.data.readers"):
        assert len(list(reader.questions("train.tsv"))) == 68
    assert reader.skipped["train.tsv"] == {"duplicate_records": 1, "empty_question": 1}
    assert "line 4 repeats question 'nt-2156/0/1'" in caplog.text

    changed = list(rows[2])
    changed[6] = "['2,851']"
    path = _write(sqa_copy, rows[:3] + [changed] + rows[3:])
    with pytest.raises(MateError, match=r"'nt-2156/0/1' appears twice \(line 3 and line 4\)") as err:
        list(SQAReader(sqa_copy).questions("train.tsv"))
    assert str(path) in str(err.value)


def test_missing_table(sqa):
    with pytest.raises(MateError, match="table file not found: .*table_csv/999_1.csv"):
        sqa.table("table_csv/999_1.csv")
    with pytest.raises(MateError, match="table=.*not found; pass an SQA"):
        read_table_file(SQA_ROOT / "table_csv/999_1.csv")
