"""Table-task predictions in each dataset's upstream answer format."""

from __future__ import annotations

import ast
import csv
import json

from mate_cli import tasks


def test_wtq_lines_are_id_then_raw_answers(tmp_path):
    rows = [{"question_id": "nt-1", "answer": ["a|b", "line\nbreak\tand tab"]}, {"question_id": "nt-2", "answer": []}]
    path = tasks.get("wtq").write_predictions(rows, tmp_path)
    assert path.read_text(encoding="utf-8") == "nt-1\ta|b\tline break and tab\nnt-2\n"


def test_sqa_file_has_the_release_columns(tmp_path):
    rows = [
        {"question_id": "nt-7/1/0", "coordinates": [[3, 1], [0, 2]]},
        {"question_id": "nt-7/1/1", "coordinates": []},
    ]
    path = tasks.get("sqa").write_predictions(rows, tmp_path)
    with open(path, encoding="utf-8", newline="") as handle:
        got = list(csv.DictReader(handle, delimiter="\t"))
    assert [(r["id"], r["annotator"], r["position"]) for r in got] == [("nt-7", "1", "0"), ("nt-7", "1", "1")]
    assert ast.literal_eval(got[0]["answer_coordinates"]) == ["(0, 2)", "(3, 1)"]
    assert ast.literal_eval(got[1]["answer_coordinates"]) == []


def test_tabfact_verdicts_in_statement_order(tmp_path):
    rows = [
        {"question_id": "t.html.csv#1", "label": 0},
        {"question_id": "t.html.csv#0", "label": 1},
        {"question_id": "u.html.csv#0", "label": 1},
    ]
    path = tasks.get("tabfact").write_predictions(rows, tmp_path)
    assert json.loads(path.read_text()) == {"t.html.csv": [1, 0], "u.html.csv": [1]}
