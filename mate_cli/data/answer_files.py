"""Table-task predictions in each dataset's upstream answer format (writers named by :mod:`mate_cli.tasks`)."""

from __future__ import annotations

from pathlib import Path

from mate_cli.io import atomic_write_json, atomic_write_text
from mate_cli.metrics.wtq import prediction_field


def write_wtq(rows: list[dict], directory: Path) -> Path:
    """``predictions.tsv``, ``id<TAB>answer<TAB>...``; officially scored by
    ``python2 evaluator.py -t <root>/tagged/data predictions.tsv``."""
    lines = ["\t".join([row["question_id"], *(prediction_field(a) for a in row["answer"])]) for row in rows]
    return atomic_write_text(directory / "predictions.tsv", "".join(f"{line}\n" for line in lines))


def write_sqa(rows: list[dict], directory: Path) -> Path:
    """``predictions.tsv`` for SQA's ``eval.py``, coordinates as the release writes them (``['(0, 4)', ...]``)."""
    lines = ["id\tannotator\tposition\tanswer_coordinates"]
    for row in rows:
        wtq_id, annotator, position = row["question_id"].rsplit("/", 2)
        coords = [f"({r}, {c})" for r, c in sorted(map(tuple, row["coordinates"]))]
        lines.append(f"{wtq_id}\t{annotator}\t{position}\t{coords!r}")
    return atomic_write_text(directory / "predictions.tsv", "".join(f"{line}\n" for line in lines))


def write_tabfact(rows: list[dict], directory: Path) -> Path:
    """``predictions.json``, ``{table_id: [1 entailed / 0 refuted per statement, in file order]}``, the shape of
    ``*_examples.json``'s label lists."""
    by_table: dict[str, dict[int, int]] = {}
    for row in rows:
        table_id, index = row["question_id"].rsplit("#", 1)
        by_table.setdefault(table_id, {})[int(index)] = int(row["label"])
    return atomic_write_json(
        directory / "predictions.json", {t: [labels[i] for i in sorted(labels)] for t, labels in by_table.items()}
    )
