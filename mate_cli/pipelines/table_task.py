"""One question (or statement) about one table file, answered by a trained table-task run (``mate predict``)."""

from __future__ import annotations

from pathlib import Path

import torch

from mate_cli import tasks
from mate_cli.data.readers import given_file
from mate_cli.data.records import Question, Table
from mate_cli.data.table_tasks import TaskCollator, encode_task_question, table_tokenizer
from mate_cli.run.rebuild import TrainedRun, autocast


def read_task_table(task: str, path: str | Path) -> Table:
    given_file(path, f"a table file of the run's dataset ({task})")
    return tasks.get(task).read_table_file(Path(str(path)).expanduser())


def predict_table_question(
    run: TrainedRun, table: Table, text: str, device: torch.device, precision: str | None
) -> dict:
    """The run's decoded answer, encoded as in training: a verdict and its probability, or the selected cells with
    the aggregation operator (and WikiTQ's computed answer); JSON-ready."""
    data = run.cfg.dataset
    task = tasks.get(data.task)
    tokenizer = table_tokenizer(run.tokenizer, data)
    question = Question("question", text, table.table_id)
    example = encode_task_question(tokenizer, task, question, table)
    batch = run.model.batch_to_device(TaskCollator(int(run.tokenizer.pad_token_id or 0))([example]), device)
    with torch.no_grad(), autocast(device, precision):
        row = run.model.predict_step(batch, 0)[0]  # what `mate eval` predicts: DoT's pruning included
    result = {"task": task.name, "question": text, "table": table.table_id, "truncated": bool(example["truncated"])}
    if example["truncated"]:  # what of the table the model read (the answer reads nothing else)
        result["kept"] = {
            "rows": table.num_rows - int(example["rows_dropped"]), "of_rows": table.num_rows,
            "columns": table.num_columns - int(example["columns_dropped"]), "of_columns": table.num_columns,
            "tokens_dropped": int(example["tokens_pruned"]), "tokens_needed": int(example["full_length"]),
        }  # fmt: skip
    if not task.selects_cells:
        return {**result, "verdict": row["verdict"], "probability": row["probability"]}
    cells = [
        {"row": r, "column": c, "header": table.header[c].text, "text": table.rows[r][c].text}
        for r, c in row["coordinates"]
    ]
    result.update(cells=cells, aggregation=row["aggregation"])
    if "answer" in row:
        result["answer"] = row["answer"]
    return result
