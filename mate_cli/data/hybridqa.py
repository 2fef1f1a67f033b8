"""Reading HybridQA's upstream layout (single files too: ``mate predict``). Under ``root``, the two upstream
repositories side by side; tables and passages are read a file at a time behind a small LRU cache, so the full dataset
(~13k tables) is never in memory at once::

    released_data/{train,dev,test}.json               question records (JSON arrays)
    released_data/{split}.traced.json                 the same with ``answer-node`` (preferred)
    WikiTables-WithLinks/tables_tok/<table_id>.json   url, title, header, data, ...
    WikiTables-WithLinks/request_tok/<table_id>.json  {"/wiki/...": passage text}
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from mate_cli.data.readers import CachedReads, given_file, load_json, no_questions
from mate_cli.data.records import AnswerNode, Cell, Question, Table
from mate_cli.errors import MateError

log = logging.getLogger(__name__)

QUESTIONS_DIR = "released_data"
TABLES_DIR = "WikiTables-WithLinks/tables_tok"
PASSAGES_DIR = "WikiTables-WithLinks/request_tok"
_SPLIT_ORDER = {"train": 0, "dev": 1, "test": 2}


def _plain_name(table_id: str) -> bool:
    """A table id names a file inside its folder: no path separator of any platform."""
    return "/" not in table_id and "\\" not in table_id


class HybridQAReader(CachedReads):
    CACHED = {"_tables": "_read_table", "_passages": "_read_passages"}
    REQUIRED_DIRS = (QUESTIONS_DIR, TABLES_DIR)
    LAYOUT = "released_data/ and WikiTables-WithLinks/"

    def input_files(self) -> list[Path]:
        return [
            path
            for sub in (QUESTIONS_DIR, TABLES_DIR, PASSAGES_DIR)
            if (self.root / sub).is_dir()
            for path in (self.root / sub).glob("*.json")
        ]

    def splits(self) -> list[str]:
        names = set()
        for path in (self.root / QUESTIONS_DIR).glob("*.json"):
            stem = path.name.removesuffix(".json").removesuffix(".traced")
            if stem and "_" not in stem and "." not in stem:  # skips dev_reference.json
                names.add(stem)
        return sorted(names, key=lambda s: (_SPLIT_ORDER.get(s, 99), s))

    def question_file(self, split: str) -> Path:
        folder = self.root / QUESTIONS_DIR
        for name in (f"{split}.traced.json", f"{split}.json"):
            if (folder / name).is_file():
                return folder / name
        raise MateError(
            f"no question file for split {split!r} in {folder} (available: {self.splits()}); "
            "name one of those with dataset.eval_file=<split> "
            "(mate eval: \"overrides=['dataset.eval_file=<split>']\"), or add the file"
        )

    def questions(self, split: str) -> Iterator[Question]:
        """The split's questions in file order. An id repeated by a different record is an error naming both; an
        identical copy, a blank question and (in a file with answers) a record without ``answer-text`` or
        ``answer-node`` are skipped with a warning, counted in ``self.skipped[split]``."""
        path = self.question_file(split)
        records = load_json(path, "question file")
        if not isinstance(records, list):
            raise MateError(f"{path}: expected a JSON array of question records, got {type(records).__name__}")
        answered = any(isinstance(r, dict) and ("answer-text" in r or "answer-node" in r) for r in records)
        seen: dict[str, tuple[int, Any]] = {}
        skipped = self.skipped.setdefault(split, Counter())
        yielded = 0
        for index, record in enumerate(records):
            question = parse_question(record, path, index)
            if question.question_id in seen:
                first, first_record = seen[question.question_id]
                if record != first_record:
                    raise MateError(
                        f"{path}: question {question.question_id!r} appears twice (records #{first} and #{index}) "
                        "with different content; give one of them another question_id or remove it"
                    )
                log.warning("%s: record #%d repeats question %r; skipped", path, index, question.question_id)
                skipped["duplicate_records"] += 1
                continue
            seen[question.question_id] = (index, record)
            if not question.question.strip():
                log.warning("%s: question %r has an empty question text; skipped", path, question.question_id)
                skipped["empty_question"] += 1
                continue
            if answered and "answer-text" not in record and "answer-node" not in record:
                log.warning(
                    "%s: question %r has no answer-text and no answer-node; skipped", path, question.question_id
                )
                skipped["no_answer_fields"] += 1
                continue
            yielded += 1
            yield question
        if not yielded:
            raise MateError(no_questions(path, skipped))

    def table_file(self, table_id: str) -> Path:
        return self.root / TABLES_DIR / f"{table_id}.json"

    def table(self, table_id: str) -> Table:
        return self._tables(table_id)

    def _read_table(self, table_id: str) -> Table:
        path = self.table_file(table_id)
        if not _plain_name(table_id) or not path.is_file():
            raise MateError(
                f"table file not found: {path} (table_id {table_id!r}); "
                f"check dataset.root or that {TABLES_DIR}/ is complete"
            )
        return parse_table(load_json(path, f"table {table_id!r}"), table_id, path)

    def passages(self, table_id: str) -> dict[str, str]:
        """``{'/wiki/...': passage text}``; ``{}`` (and a warning) when the file is missing."""
        return self._passages(table_id)

    def _read_passages(self, table_id: str) -> dict[str, str]:
        path = self.root / PASSAGES_DIR / f"{table_id}.json"
        if not _plain_name(table_id) or not path.is_file():
            log.warning("no passage file %s for table %r; using no passages", path, table_id)
            return {}
        return parse_passages(load_json(path, f"passages of table {table_id!r}"), path)

    def has_passage_file(self, table_id: str) -> bool:
        return (self.root / PASSAGES_DIR / f"{table_id}.json").is_file()


def read_table_file(path: str | Path) -> Table:
    """A ``tables_tok`` JSON file given on the command line; table id = file stem."""
    path = given_file(path, "a WikiTables-WithLinks tables_tok/<id>.json file")
    return parse_table(load_json(path, "table file"), path.stem, path)


def read_passages_file(path: str | Path) -> dict[str, str]:
    path = given_file(path, "the request_tok/<id>.json of the table, or passages=null", "passages")
    return parse_passages(load_json(path, "passages file"), path)


def _check(ok: bool, where: str, problem: str) -> None:
    if not ok:
        raise MateError(f"{where}: {problem}")


def parse_question(record: Any, path: Path | str, index: int) -> Question:
    qid = record.get("question_id") if isinstance(record, dict) else None
    where = f"{path}: question {qid!r}" if isinstance(qid, str) else f"{path}: record #{index}"
    fix = "fix or remove that record"
    _check(isinstance(record, dict), where, f"expected a JSON object; {fix}")
    for key in ("question_id", "question", "table_id"):
        _check(key in record, where, f"missing key {key!r}; {fix}")
        _check(isinstance(record[key], str), where, f"{key!r} must be a string; {fix}")
    answer = record.get("answer-text")
    _check(answer is None or isinstance(answer, str), where, f"'answer-text' must be a string; {fix}")
    nodes = record.get("answer-node", [])
    _check(isinstance(nodes, list), where, f"'answer-node' must be a list; {fix}")
    answer_nodes = [_parse_node(node, where, fix) for node in nodes]
    return Question(record["question_id"], record["question"], record["table_id"], answer, answer_nodes)


def _parse_node(node: Any, where: str, fix: str) -> AnswerNode:
    shape = "[text, [row, column], link-or-null, 'table'|'passage']"
    ok = isinstance(node, list) and len(node) == 4
    ok = ok and isinstance(node[0], str) and isinstance(node[1], list) and len(node[1]) == 2
    ok = ok and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in node[1])
    ok = ok and (node[2] is None or isinstance(node[2], str)) and node[3] in ("table", "passage")
    _check(ok, where, f"answer-node entry {node!r} is not {shape}; {fix}")
    return AnswerNode(text=node[0], coord=(node[1][0], node[1][1]), link=node[2], source=node[3])


def _parse_cell(raw: Any, where: str) -> Cell:
    ok = isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str)
    ok = ok and isinstance(raw[1], list) and all(isinstance(link, str) for link in raw[1])
    _check(ok, where, f"cell {str(raw)[:60]!r} is not [text, [links]]; repair the table file")
    return Cell(text=raw[0], links=list(raw[1]))


def parse_table(data: Any, table_id: str, path: Path | str) -> Table:
    where = f"{path}: table {table_id!r}"
    _check(isinstance(data, dict), where, "expected a JSON object; repair the table file")
    for key in ("header", "data"):
        _check(isinstance(data.get(key), list), where, f"missing or non-list {key!r}; repair the table file")
    header = [_parse_cell(raw, f"{where} header") for raw in data["header"]]
    _check(len(header) > 0, where, "empty header; repair the table file")
    rows = []
    for r, raw_row in enumerate(data["data"]):
        got = f"{len(raw_row)} cells" if isinstance(raw_row, list) else f"a {type(raw_row).__name__}, not a list"
        ok = isinstance(raw_row, list) and len(raw_row) == len(header)
        _check(ok, where, f"data row {r} is {got}, header has {len(header)} cells; repair the table file")
        rows.append([_parse_cell(raw, f"{where} row {r}") for raw in raw_row])
    text = {k: data.get(k) if isinstance(data.get(k), str) else "" for k in ("title", "section_title", "intro")}
    return Table(table_id=table_id, header=header, rows=rows, **text)


def parse_passages(data: Any, path: Path | str) -> dict[str, str]:
    ok = isinstance(data, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in data.items())
    _check(
        ok,
        str(path),
        "passages must be a JSON object mapping '/wiki/...' links to passage text; repair or delete the file",
    )
    return data
