"""`mate bench` end to end on a tiny grid (real CLI, subprocess), plus the measuring parts.

Never asserts wall time: only structure, and FLOP counts (which do not depend on
the machine): MATE's bucketed attention grows linearly with the length at fixed
G and R, dense attention quadratically. The targets of ``conf/bench.yaml`` are
checked on hand-made rows.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from tests.helpers import mate_env, run_mate
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mate_cli.bench import cases, measure, runner, targets
from mate_cli.bench.layouts import TableShape, describe, table_layout
from mate_cli.errors import MateError
from mate_cli.paths import CONF_DIR

KERNEL_BACKENDS = ["dense", "mate.bucketed", "table_etc", "none"]
ENCODER_BACKENDS = ["mate.bucketed", "none"]
TINY = {
    "dims": "tiny",
    "threads": 1,
    "lengths": "[512,1024]",
    "linear_lengths": "[]",
    "levels": "[kernel,encoder]",
    "modes": "[inference,train]",
    "kernel.backends": f"[{','.join(KERNEL_BACKENDS)}]",
    "encoder.backends": f"[{','.join(ENCODER_BACKENDS)}]",
    "schedule": "[{max_length: null, warmup: 1, repeats: 1}]",
    "progress": "false",
}


def mate_bench(overrides: dict, output_dir: Path) -> Path:
    """Run the real `mate bench` CLI with ``bench.<key>=<value>`` overrides; its run directory."""
    proc = run_mate(["bench", *(f"bench.{k}={v}" for k, v in overrides.items())], mate_env(output_dir), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in (output_dir / "bench").iterdir() if p.is_dir()]
    return run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    return mate_bench(TINY, tmp_path_factory.mktemp("bench"))


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
    assert len(rows) == 2 * (len(KERNEL_BACKENDS) + len(ENCODER_BACKENDS)) * 2  # modes x backends x lengths
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
    checked = json.loads((tiny_run / "targets.json").read_text())
    assert [t["name"] for t in checked] == [t.name for t in targets.evaluate([], yaml_targets())]
    assert all(t["measured"] == "not measured" and t["met"] is None for t in checked)  # no 8192 cells here
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


# ------------------------------------------------------------------ backends: the training config path
def test_backends_are_built_from_the_attention_group_as_training_builds_them():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        overrides = ["attention=mate", "attention.variant=bucketed", "attention.impl=auto"]
        train = compose(config_name="train", overrides=overrides)
    assert cases.attention_config("mate.bucketed") == train.attention
    factory, trained = cases.attention_factory("mate.bucketed"), instantiate(train.attention)
    assert (factory.func, factory.keywords) == (trained.func, trained.keywords)
    backend = cases.build_backend("mate.bucketed", num_heads=4, head_dim=16, max_length=512)
    assert (backend.variant, backend.impl) == ("bucketed", "auto") and not backend.training
    # mate.<impl> runs that impl of its variant; mate.auto names no function
    assert [(c.variant, c.impl) for c in map(cases.attention_config, ("mate.masked", "mate.exact", "mate.kernel"))] == [
        ("exact", "masked"), ("exact", "auto"), ("bucketed", "kernel")]
    with pytest.raises(MateError, match="mate.exact"):
        cases.attention_factory("mate.auto")
    with pytest.raises(MateError, match="no 'impl' option"):
        cases.attention_factory("dense.fast")
    with pytest.raises(cases.Unavailable):
        cases.attention_factory("no_such_backend")


def test_compose_works_inside_a_running_hydra_app_and_leaves_it_as_it_was():
    cases._composed.cache_clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):  # as under @hydra.main
        outer = GlobalHydra.instance().hydra
        assert cases.attention_config("sat").text_only is False
        assert GlobalHydra.instance().hydra is outer
    assert not GlobalHydra.instance().is_initialized()
    cases._composed.cache_clear()
    assert cases.attention_config("sat")._target_.endswith("SatAttention")  # and outside one
    assert not GlobalHydra.instance().is_initialized()


def test_kernel_level_runs_every_backends_input_hook():
    _, layout = table_layout(256, batch=1)
    hidden = dict(batch=1, hidden_size=64, dtype=torch.float32, device=torch.device("cpu"))
    dense = cases.build_backend("dense", num_heads=4, head_dim=16, max_length=256)
    assert cases.layer_layout(dense, layout, **hidden) is layout  # identity hook
    etc = cases.build_backend("table_etc", num_heads=4, head_dim=16, max_length=256)
    extended = cases.layer_layout(etc, layout, **hidden)
    assert extended.seq_len == 256 + cases.attention_config("table_etc").num_global
    case = cases.kernel_case("table_etc", "train", layout, cases.dims_of("tiny"), 1, torch.float32, torch.device("cpu"))
    case.call()


# ------------------------------------------------------------------ targets (conf/bench.yaml)
def yaml_targets() -> list[targets.TargetSpec]:
    return targets.parse(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "bench.yaml").bench.targets))


def row(level, mode, seq_len, backend, time_ms, peak_mem_mb="", peak_rss_mb="") -> dict:
    """A bench.csv row (as csv.DictReader gives it) of a measured cell."""
    values = dict(level=level, mode=mode, seq_len=seq_len, backend=backend, status="ok", time_ms=time_ms)
    return {**dict.fromkeys(runner.COLUMNS, ""), **values, "peak_mem_mb": peak_mem_mb, "peak_rss_mb": peak_rss_mb}


def target_rows(slower: bool = False) -> list[dict]:
    """One run's rows at the targets' cells: every target met, or (``slower``) every one missed."""
    fast, slow = not slower, slower
    return [
        row("kernel", "inference", 8192, "dense", 1600.0),
        row("kernel", "inference", 8192, "mate.masked", 400.0),
        row("kernel", "inference", 8192, "mate.bucketed", fast * 100.0 + slow * 120.0),
        row("kernel", "inference", 8192, "flex", 90.0),
        row("kernel", "train", 8192, "dense", 1000.0),
        row("kernel", "train", 8192, "mate.block_sparse", fast * 90.0 + slow * 125.0),
        row("encoder", "inference", 4096, "tapas_hf", 900.0),
        row("encoder", "inference", 4096, "bert_hf", 500.0),
        row("encoder", "inference", 4096, "mate.bucketed", fast * 300.0 + slow * 320.0),
        row("encoder", "inference", 8192, "none", 1000.0, 50),
        row("encoder", "inference", 8192, "mate.bucketed", fast * 1100.0 + slow * 1200.0, 100),
        row("encoder", "inference", 8192, "mate.block_sparse", 1300.0, 100),
        row("encoder", "inference", 16384, "mate.bucketed", 2300.0, fast * 200 + slow * 250),
        row("encoder", "inference", 16384, "mate.block_sparse", 2900.0, 300),
        row("encoder", "inference", 32768, "mate.bucketed", 30000.0, 900, fast * 20480 + slow * 25600),
        row("encoder", "inference", 32768, "none", 20000.0, 500, 10240),  # not a candidate
    ]


def checked(rows, specs=None) -> list[tuple[str, str, bool | None]]:
    return [(t.requirement, t.measured, t.met) for t in targets.evaluate(rows, specs or yaml_targets())]


#: requirement, measured on target_rows(), measured on target_rows(slower=True)
EXPECTED = [
    (">= 15x faster", "16.00x (dense 1600.0 ms / mate.bucketed 100.0 ms)", "13.33x (dense 1600.0 ms / mate.bucketed 120.0 ms)"),
    ("MATE time <= 1.2x flex time", "1.11x of flex (mate.bucketed 100.0 ms, flex 90.0 ms)", "1.33x of flex (mate.bucketed 120.0 ms, flex 90.0 ms)"),
    (">= 10x faster", "11.11x (dense 1000.0 ms / mate.block_sparse 90.0 ms)", "8.00x (dense 1000.0 ms / mate.block_sparse 125.0 ms)"),
    (">= 3x faster", "3.00x (tapas_hf 900.0 ms / mate.bucketed 300.0 ms)", "2.81x (tapas_hf 900.0 ms / mate.bucketed 320.0 ms)"),
    (">= 1.6x faster", "1.67x (bert_hf 500.0 ms / mate.bucketed 300.0 ms)", "1.56x (bert_hf 500.0 ms / mate.bucketed 320.0 ms)"),
    ("<= 15%", "+10.0% (mate.bucketed 1100 ms, none 1000 ms)", "+20.0% (mate.bucketed 1200 ms, none 1000 ms)"),
    ("<= 2.1x", "2.00x (mate.bucketed: 100 MB -> 200 MB)", "2.50x (mate.bucketed: 100 MB -> 250 MB)"),
    ("process peak RSS <= 24 GiB", "20.00 GiB peak RSS (mate.bucketed, 30.0 s)", "25.00 GiB peak RSS (mate.bucketed, 30.0 s)"),
]  # fmt: skip


@pytest.mark.parametrize("slower", [False, True], ids=["met", "missed"])
def test_yaml_targets_on_hand_made_rows(slower):
    assert checked(target_rows(slower)) == [(req, missed if slower else met, not slower) for req, met, missed in EXPECTED]


def test_targets_without_their_rows_are_not_measured():
    rows = [r for r in target_rows() if r["backend"] not in ("flex", "none")]
    for r in rows:
        if r["seq_len"] in (16384, 32768):
            r.update(status="skipped", time_ms="")
    result = checked(rows)
    assert [met for _, _, met in result] == [True, None, True, True, True, None, None, None]
    assert all(measured == "not measured" for _, measured, met in result if met is None)


def test_targets_are_data():
    specs = yaml_targets()
    assert [s.kind for s in specs] == [
        "speedup", "time_ratio", "speedup", "speedup", "speedup", "overhead", "memory_growth", "peak_rss"
    ]  # fmt: skip
    stricter = [dataclasses.replace(specs[0], threshold=20, seq_len=4096, level="encoder", baseline="tapas_hf")]
    (target,) = targets.evaluate(target_rows(), stricter)
    assert (target.name, target.requirement, target.met) == (
        "kernel inference 4096: MATE vs dense SDPA", ">= 20x faster", False
    )  # the name follows seq_len; level/baseline are free text there
    with pytest.raises(MateError, match=r"bench.targets\[0\].kind='faster'"):
        targets.parse([{"kind": "faster"}])
    with pytest.raises(MateError, match=r"lacks \['baseline'\]"):
        targets.parse([{**dataclasses.asdict(specs[0]), "baseline": None}])
    with pytest.raises(MateError, match="unknown keys"):
        targets.parse([{**dataclasses.asdict(specs[0]), "treshold": 3}])


def test_the_dot_row_runs_the_pruner_on_every_token_and_the_task_model_on_k():
    input_ids, layout = table_layout(128)
    seen = []
    case = cases.encoder_case("dot.mini-32", "train", input_ids, layout, cases.DIMS["tiny"], torch.float32,
                              torch.device("cpu"))
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(args[0].shape[1]) if type(module).__name__ == "TableEncoder" else None)
    try:
        case.call()
    finally:
        hook.remove()
    assert seen == [128, 32]  # the pruner reads the whole input, the task model the K kept tokens
    with pytest.raises(MateError, match="dot.small-256"):
        cases.encoder_case("dot.huge-8", "inference", input_ids, layout, cases.DIMS["tiny"], torch.float32,
                           torch.device("cpu"))
