"""`mate bench` end to end on a tiny grid (real CLI, subprocess), plus the measuring parts.

Never asserts wall time: only structure, and FLOP counts (which do not depend on
the machine): MATE's bucketed attention grows linearly with the length at fixed
G and R, dense attention quadratically.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mate_cli.bench import measure, runner
from mate_cli.bench.layouts import TableShape, describe, table_layout

MATE = str(Path(sys.executable).parent / "mate")
TINY = [
    "bench.dims=tiny",
    "bench.threads=1",
    "bench.lengths=[512,1024]",
    "bench.linear_lengths=[]",
    "bench.levels=[kernel,encoder]",
    "bench.modes=[inference,train]",
    "bench.kernel.backends=[dense,mate.bucketed,none]",
    "bench.encoder.backends=[mate.bucketed,none]",
    "bench.schedule=[{max_length: null, warmup: 1, repeats: 1}]",
    "bench.progress=false",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, MATE_OUTPUT_DIR=str(tmp))
    proc = subprocess.run([MATE, "bench", *TINY], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in (tmp / "bench").iterdir() if p.is_dir()]
    return run


def rows_of(run: Path) -> list[dict]:
    with open(run / "bench.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def flops(rows, level, mode, backend, length) -> int:
    (row,) = [
        r for r in rows
        if (r["level"], r["mode"], r["backend"], int(r["seq_len"])) == (level, mode, backend, length)
    ]  # fmt: skip
    assert row["status"] == "ok", row
    return int(row["flops"])


def test_csv_has_every_cell_and_column(tiny_run):
    rows = rows_of(tiny_run)
    assert list(rows[0]) == list(runner.COLUMNS)
    assert len(rows) == 2 * (3 + 2) * 2  # modes x (kernel + encoder backends) x lengths
    for row in rows:
        assert row["status"] == "ok", row
        assert float(row["time_ms"]) > 0
        floor_kernel = row["backend"] == "none" and row["level"] == "kernel"  # context = v: no FLOPs
        assert (int(row["flops"]) == 0) if floor_kernel else (int(row["flops"]) > 0)
        assert row["peak_mem_mb"] != "" and float(row["peak_rss_mb"]) > 0
        assert row["dims"] == "tiny" and row["threads"] == "1"


def test_plots_and_reports_are_written(tiny_run):
    for level in ("kernel", "encoder"):
        for mode in ("inference", "train"):
            png = tiny_run / f"bench_{level}_{mode}.png"
            assert png.exists() and 1_000 < png.stat().st_size < 300_000
    assert json.loads((tiny_run / "machine.json").read_text())["torch"] == torch.__version__
    names = [t["name"] for t in json.loads((tiny_run / "targets.json").read_text())]
    assert any("FlexAttention" in n for n in names)
    assert "| mate.bucketed |" in (tiny_run / "bench.md").read_text()


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_mate_bucketed_flops_grow_linearly_dense_quadratically(tiny_run, mode):
    rows = rows_of(tiny_run)
    mate = flops(rows, "kernel", mode, "mate.bucketed", 1024) / flops(rows, "kernel", mode, "mate.bucketed", 512)
    dense = flops(rows, "kernel", mode, "dense", 1024) / flops(rows, "kernel", mode, "dense", 512)
    assert mate <= 2.1, mate
    assert 3.9 <= dense <= 4.1, dense
    # Encoder level: attention's share (MATE minus the none floor) is linear too.
    extra = [flops(rows, "encoder", mode, "mate.bucketed", n) - flops(rows, "encoder", mode, "none", n) for n in (512, 1024)]
    assert 0 < extra[1] / extra[0] <= 2.1, extra


# ------------------------------------------------------------------ in-process parts
def test_table_layout_fills_the_length_with_a_realistic_table():
    ids, layout = table_layout(2048, batch=2, shape=TableShape(query_tokens=60, columns=8, cell_tokens=30))
    assert ids.shape == (2, 2048) and layout.seq_len == 2048
    assert bool(layout.attention_mask.all())
    d = describe(layout)
    assert d["query"] == 60 and d["columns"] == 8 and 5 <= d["rows"] <= 12
    assert not torch.equal(layout.row_ids[0], layout.row_ids[1])  # examples differ


def test_flop_counter_sees_cpu_sdpa():
    q = torch.randn(1, 2, 64, 16)
    mask = torch.ones(1, 1, 1, 64, dtype=torch.bool)
    count = measure.count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    assert count == 4 * 2 * 64 * 64 * 16


@pytest.mark.skipif(not measure.PeakMemory.supported(torch.device("cpu")), reason="needs /proc/self/clear_refs")
def test_peak_memory_sees_a_transient_allocation():
    with measure.PeakMemory(torch.device("cpu")) as memory:
        x = torch.ones(64, 2**20 // 4)  # 64 MiB, touched
        del x
    assert 60 * 2**20 <= memory.peak <= 80 * 2**20


def test_memory_estimate_skips_instead_of_crashing():
    dims = {"num_heads": 12, "num_layers": 12}
    # TapasModel training at 32768 tokens would keep ~12 x 51 GB of probabilities.
    assert runner.analytic_memory("tapas_hf", "encoder", "train", 32768, dims, 1, 4) > 500 * 2**30
    assert runner.analytic_memory("mate.bucketed", "encoder", "train", 32768, dims, 1, 4) == 0
    history = runner.History()
    key = ("encoder", "inference", "x")
    history.add(key, 1024, 100, 1.0)
    history.add(key, 2048, 200, 2.0)
    memory, seconds = history.estimate(key, 8192)
    assert memory == pytest.approx(800) and seconds == pytest.approx(8.0)
