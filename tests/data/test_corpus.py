"""The JSON-lines pre-training corpus format: what it reads, and one line per mistake."""

from __future__ import annotations

import json

import pytest

from mate_cli.data.corpus import read_jsonl
from mate_cli.errors import MateError

GOOD = {
    "text": "Ashford, Kent. Population by ward.",
    "table": {"header": ["ward", "people"], "rows": [["Aylesford Green", "2,432"], ["Beaver", ""]]},
}


def write(tmp_path, *lines):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_tables_with_their_text_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, json.dumps(GOOD), "", json.dumps({**GOOD, "id": "kent-wards", "text": ""}))
    first, second = read_jsonl(path)
    assert first.text == GOOD["text"] and first.table.table_id == "corpus:1"
    assert [c.text for c in first.table.header] == ["ward", "people"]
    assert [[c.text for c in row] for row in first.table.rows] == [["Aylesford Green", "2,432"], ["Beaver", ""]]
    assert second.table.table_id == "kent-wards" and second.text == "" and second.source.endswith("corpus.jsonl:3")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"corpus.jsonl:1: not JSON"),
        (json.dumps([1, 2]), r"corpus.jsonl:1: a JSON list, not an object"),
        (json.dumps({"text": "t"}), r"key 'table' is missing"),
        (json.dumps({**GOOD, "text": 3}), r"key 'text' must be a string"),
        (json.dumps({"table": {"header": [], "rows": []}}), r"key 'table.header' must be a non-empty list"),
        (json.dumps({"table": {"header": ["a"], "rows": "x"}}), r"key 'table.rows' must be a list of lists"),
        (json.dumps({"table": {"header": ["a", "b"], "rows": [["1"]]}}), r"table.rows\[0\] has 1 cells, the header 2"),
        (json.dumps({"table": {"header": ["a"], "rows": [[1]]}}), r"table.rows\[0\] holds a non-string cell"),
    ],
)
def test_each_mistake_is_one_line_naming_file_line_and_key(tmp_path, line, message):
    path = write(tmp_path, line)
    with pytest.raises(MateError, match=message) as caught:
        list(read_jsonl(path))
    assert "\n" not in str(caught.value)


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(MateError, match="corpus file not found: .*none.jsonl"):
        list(read_jsonl(tmp_path / "none.jsonl"))
