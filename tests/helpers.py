"""What several test modules share: running the real `mate` CLI as a subprocess, and
a HybridQA root with the pipeline's edge cases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = REPO_ROOT / "data" / "hybridqa_sample"
WIKI = "WikiTables-WithLinks"
MATE = str(Path(sys.executable).parent / "mate")


def mate_env(output_dir: Path, cache_dir: Path | None = None, **extra: str) -> dict:
    """The environment of a `mate` subprocess: outputs (and caches) under test folders, offline.

    The fused CPU kernel is loaded from this test process's build (``TORCH_EXTENSIONS_DIR``),
    not compiled again in every fresh cache (tens of seconds each); the kernel's own build
    tests set their cache without it. W&B's service address, which W&B puts in this test
    process's environment once an in-process test has used it, is left out: each `mate`
    process starts its own service, as from a user's shell (a shared service keeps a
    killed process's run id, so the resume chain could not resume it); so are W&B's folders,
    which an in-process command points into its own run dir."""
    from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel

    env = dict(
        os.environ,
        MATE_OUTPUT_DIR=str(output_dir),
        WANDB_MODE="offline",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TORCH_EXTENSIONS_DIR=str(mate_cpu_kernel.build_dir().parent),
        **extra,
    )
    for name in ("WANDB_SERVICE", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env.pop(name, None)
    if cache_dir is not None:
        env["MATE_CACHE_DIR"] = str(cache_dir)
    return env


def run_mate(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    """``mate <args>`` through the installed entry point."""
    return subprocess.run([MATE, *args], capture_output=True, text=True, env=env, timeout=timeout)


def jobs_of(sweep_dir: Path) -> list[Path]:
    """The job folders of a sweep, by job number (a launcher's own hidden folders, submitit's, left out)."""
    jobs = (p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    return sorted(jobs, key=lambda p: int(p.name.split("-")[0]))


def run_dirs(output_dir: Path, task: str) -> set[Path]:
    """The run directories of ``task`` (train, eval, pointr, ...) under ``output_dir``."""
    return set((output_dir / task).glob("*")) if (output_dir / task).exists() else set()


def new_run(output_dir: Path, task: str, before: set[Path]) -> Path:
    """The one run directory of ``task`` that was not in ``before``."""
    (run,) = run_dirs(output_dir, task) - before
    return run


# ------------------------------------------------------------------ edge cases
def _question_record(qid, question, table_id, answer, nodes):
    return {"question_id": qid, "question": question, "table_id": table_id, "answer-text": answer, "answer-node": nodes}


def build_edge_root(root: Path) -> dict:
    """A HybridQA root with PointR's edge cases; returns its dev reference dict.

    - ``edge-table-answer`` / ``edge-linked-missing``: a table whose passage file is missing;
    - ``edge-nowhere``: an answer that appears in no cell and no passage;
    - ``edge-empty-cell``: the traced answer cell is empty;
    - ``edge-all-empty``: a table whose data cells are all empty, with no passage file.
    """
    for sub in ("tables_tok", "request_tok"):
        (root / WIKI / sub).mkdir(parents=True, exist_ok=True)
    (root / "released_data").mkdir(parents=True, exist_ok=True)
    shutil.copy(SAMPLE / WIKI / "tables_tok" / "Marine_defense_battalions_0.json", root / WIKI / "tables_tok")
    for sub in ("tables_tok", "request_tok"):
        shutil.copy(SAMPLE / WIKI / sub / "1991_Monaco_Grand_Prix_0.json", root / WIKI / sub)
    empty = {
        "title": "Edge",
        "header": [["Name", []], ["Note", []]],
        "data": [[["Alpha", []], ["", []]], [["Beta", ["/wiki/Beta"]], ["", []]]],
    }
    (root / WIKI / "tables_tok" / "Edge_empty_0.json").write_text(json.dumps(empty))
    (root / WIKI / "request_tok" / "Edge_empty_0.json").write_text(
        json.dumps({"/wiki/Beta": "Beta is a letter. It follows alpha."})
    )
    blank = {"title": "Blank", "header": [["Name", []], ["Note", []]], "data": [[["", []], ["", []]]]}
    (root / WIKI / "tables_tok" / "Edge_blank_0.json").write_text(json.dumps(blank))
    records = [
        _question_record(
            "edge-table-answer",
            "What is the battalion name for the battalion located at Guantanamo Bay ?",
            "Marine_defense_battalions_0",
            "4th Defense Battalion",
            [["4th Defense Battalion", [3, 0], None, "table"]],
        ),
        _question_record(
            "edge-linked-missing",
            "Where was the 4th Defense Battalion located first ?",
            "Marine_defense_battalions_0",
            "Guantanamo Bay",
            [["Guantanamo Bay", [3, 1], "/wiki/Guantanamo_Bay,_Cuba", "passage"]],
        ),
        _question_record(
            "edge-nowhere", "Which driver won the 1991 race ?", "1991_Monaco_Grand_Prix_0", "Zzyzx Quux", []
        ),
        _question_record(
            "edge-empty-cell",
            "What is the note of Alpha ?",
            "Edge_empty_0",
            "unknown text",
            [["unknown text", [0, 1], None, "table"]],
        ),
        _question_record("edge-all-empty", "What is the name ?", "Edge_blank_0", "Gamma", []),
    ]
    for name in ("train.traced.json", "dev.traced.json"):
        (root / "released_data" / name).write_text(json.dumps(records))
    reference = {
        "reference": {r["question_id"]: r["answer-text"] for r in records},
        "table": ["edge-table-answer", "edge-empty-cell"],
        "passage": ["edge-linked-missing"],
    }
    (root / "released_data" / "dev_reference.json").write_text(json.dumps(reference))
    return reference


# ------------------------------------------------------------------ W&B offline runs
def read_wandb_records(path: Path) -> list:
    """The ``Record`` protobufs of an offline ``run-*.wandb`` file.

    The file is a 7-byte ``:W&B`` header, then a LevelDB-style log: 32 KiB blocks of
    records, each with a 7-byte header (crc32, little-endian length, type: 1 full,
    2 first, 3 middle, 4 last). wandb 0.31 no longer ships a Python reader for it.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        pending += payload
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def wandb_run_summary(path: Path) -> dict:
    """``{"run": (name, group, job_type, tags), "config": {...}, "summary": {...}}`` of an offline run."""
    out: dict = {"config": {}, "summary": {}}
    for record in read_wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out["run"] = (run.display_name, run.run_group, run.job_type, list(run.tags))
            out["run_id"] = run.run_id
            items = run.config.update
        elif kind == "config":
            items = record.config.update
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
            continue
        else:
            continue
        for item in items:
            out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


# ------------------------------------------------------------------ layouts
def layout_from_token_type_ids(token_type_ids, attention_mask=None):
    """A `TableLayout` from TAPAS ``token_type_ids`` ``[batch, seq, 7]`` (order: ``TOKEN_TYPE_FIELDS``),
    cell ids numbering each example's data (row, column) pairs from 1."""
    import torch

    from mate_cli.layout import TOKEN_TYPE_FIELDS, TableLayout

    parts = {name: token_type_ids[..., i] for i, name in enumerate(TOKEN_TYPE_FIELDS)}
    if attention_mask is None:
        attention_mask = torch.ones_like(parts["segment_ids"], dtype=torch.bool)
    table = (parts["segment_ids"] == 1) & attention_mask.bool() & (parts["row_ids"] > 0)
    cell_key = parts["row_ids"] * (int(parts["column_ids"].max()) + 1) + parts["column_ids"]
    cell_ids = torch.zeros_like(cell_key)
    for b in range(cell_key.shape[0]):
        uniq = torch.unique(cell_key[b][table[b]])
        cell_ids[b][table[b]] = torch.searchsorted(uniq, cell_key[b][table[b]]) + 1
    return TableLayout(attention_mask=attention_mask, cell_ids=cell_ids, **parts)


def one_error_line(proc: subprocess.CompletedProcess, code: int = 2, prefix: str = "mate: error: ") -> str:
    """The one ``mate:`` line of a process that exited with ``code``, no traceback."""
    assert proc.returncode == code, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("mate:")]
    assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


#: a YAML alias bomb: ten levels of ten references each, ten billion items once expanded
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
)

#: each bundled sample as a pre-training source (dataset.sources.<name>)
SOURCES = {
    "hybridqa": str(REPO_ROOT / "data" / "hybridqa_sample"),
    "wtq": str(REPO_ROOT / "data" / "wtq_sample"),
    "sqa": str(REPO_ROOT / "data" / "sqa_sample"),
    "tabfact": str(REPO_ROOT / "data" / "tabfact_sample"),
}


def a_table_and_question(task: str) -> tuple[Path, str]:
    """A bundled table file of ``task`` (sqa, wtq or tabfact) and a question or statement about it."""
    data = REPO_ROOT / "data" / f"{task}_sample"
    if task == "wtq":
        return data / "csv" / "204-csv" / "106.csv", "how many rows are there?"
    if task == "sqa":
        return data / "table_csv" / "204_792.csv", "which players are listed?"
    return data / "data" / "all_csv" / "2-18178534-1.html.csv", "the team win 3 game"
