"""Preprocessing in processes: the same examples whatever ``num_proc``, progress in the log,
``auto`` worker counts, and one-line errors for counts that are not counts."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict

import pytest

from mate_cli.data.preprocess import available_cores, encode_records, worker_counts
from mate_cli import tasks
from mate_cli.data.table_tasks import _TaskEncoder
from mate_cli.errors import MateError
from tests.helpers import REPO_ROOT

WTQ = str(REPO_ROOT / "data" / "wtq_sample")
TOKENIZER = {
    "pretrained": "minilm",
    "max_length": 128,
    "max_question_tokens": 64,
    "pruning": "none",
    "empty_cell_token": True,
}


def wtq_records() -> list[dict]:
    return [asdict(q) for q in tasks.get("wtq").make_reader(WTQ).questions("training.tsv")]


def test_processes_give_the_examples_of_one_process_in_record_order(caplog):
    records = wtq_records()
    encoder = _TaskEncoder(tasks.get("wtq"), WTQ, TOKENIZER, {})
    with caplog.at_level(logging.INFO, logger="mate_cli.data.preprocess"):
        alone = encode_records(encoder, records, 1, "wtq train")
        shared = encode_records(encoder, records, 2, "wtq train", min_per_process=8, progress_every_s=0.0)
    assert len(alone) == len(records) > 16
    assert shared["question_id"] == [r["question_id"] for r in records]
    assert json.dumps(shared.to_list()) == json.dumps(alone.to_list())  # NaN answers compare as text
    lines = [r.getMessage() for r in caplog.records]
    assert "wtq train: preprocessing 60 questions in 1 process" in lines
    assert "wtq train: preprocessing 60 questions in 2 processes" in lines
    # progress lines (count, rate, ETA) while it runs, then the rate at the end
    assert any(re.fullmatch(r"wtq train: \d+/60 questions \([\d.]+/s, ETA \d+s\)", line) for line in lines)
    assert (
        sum(
            bool(
                re.fullmatch(
                    r"wtq train: 60 questions preprocessed in \d+s \([\d.]+ questions/s, "
                    r"[12] process(es)?\)",
                    line,
                )
            )
            for line in lines
        )
        == 2
    )


def test_a_record_with_many_examples_and_an_empty_split():
    twice = encode_records(lambda r: [dict(r, copy=0), dict(r, copy=1)], [{"question_id": "a"}], 1, "x")
    assert twice.to_list() == [{"question_id": "a", "copy": 0}, {"question_id": "a", "copy": 1}]
    assert len(encode_records(lambda r: r, [], 4, "x")) == 0


def test_auto_worker_counts_follow_the_machine():
    cores = available_cores()
    processes, workers = worker_counts("auto", "auto")
    assert processes == cores
    assert workers == (0 if cores < 4 else min(4, cores // 4))
    assert worker_counts(3, 0) == (3, 0) and worker_counts("2", "1") == (2, 1)


@pytest.mark.parametrize(
    "num_proc, num_workers, key",
    [
        (0, 0, "dataset.num_proc"),
        ("many", 0, "dataset.num_proc"),
        (1, -1, "dataset.num_workers"),
        (1, 1.5, "dataset.num_workers"),
    ],
)
def test_a_count_that_is_not_a_count_is_one_line_naming_its_key(num_proc, num_workers, key):
    with pytest.raises(MateError, match=rf"^{re.escape(key)}=.* is not a count; use a whole number >= [01], or auto"):
        worker_counts(num_proc, num_workers)
