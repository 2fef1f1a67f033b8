"""`mate bench` end to end on a tiny grid (its own function on a config Hydra composes, in process), plus the
measuring parts.

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

from tests.inprocess import hydra_compose, run_captured
import torch
from hydra import initialize_config_dir
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
    """`mate bench` with ``bench.<key>=<value>`` overrides (its own function on a config Hydra
    composes, in this process); its run directory."""
    run = output_dir / "bench" / "run"
    proc = run_captured("bench", [f"bench.{k}={v}" for k, v in overrides.items()], run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def tiny_run(module_tmp) -> Path:
    """Over 20 s: `mate bench` measures every backend on its tiny grid."""
    return mate_bench(TINY, module_tmp("bench"))


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
        assert row["err_vs_fp32"] == ""  # float32 cells have nothing to compare with


def test_a_failed_float32_comparison_keeps_the_measured_cell():
    def comparison_out_of_memory() -> float:
        raise torch.OutOfMemoryError("float32 reference: out of memory")

    assert runner.float32_error(cases.Case(call=lambda: None)) == (None, "")
    assert runner.float32_error(cases.Case(call=lambda: None, error=lambda: 0.004)) == (0.004, "")
    error, note = runner.float32_error(cases.Case(call=lambda: None, error=comparison_out_of_memory))
    assert error is None and note == "err_vs_fp32 not measured (OutOfMemoryError: float32 reference: out of memory)"


def test_reduced_precision_cells_state_their_error_against_float32(tmp_path):
    """A bfloat16 kernel grid: each cell's error against the same backend in float32 is in
    bench.csv and bench.md; it is bf16's rounding (not 0, well under a wrong answer's O(1)),
    and MATE's fused kernel (float32 math) beats the torch path's bf16 math."""
    run = mate_bench({**TINY, "dtype": "bfloat16", "levels": "[kernel]", "lengths": "[256]",
                      "kernel.backends": "[dense,mate.bucketed,mate.eager]"}, tmp_path)  # fmt: skip
    rows = rows_of(run)
    assert len(rows) == 6 and all(r["status"] == "ok" and r["dtype"] == "bfloat16" for r in rows)
    errors = {(r["mode"], r["backend"]): float(r["err_vs_fp32"]) for r in rows}
    assert all(1e-4 < e < 3e-2 for e in errors.values()), errors
    for mode in ("inference", "train"):
        assert errors[(mode, "mate.bucketed")] < errors[(mode, "mate.eager")], errors
    table = (run / "bench.md").read_text()
    assert "error vs float32" in table and rows[0]["err_vs_fp32"] in table


def test_plots_and_reports_are_written(tiny_run):
    for level in ("kernel", "encoder"):
        for mode in ("inference", "train"):
            png = tiny_run / f"bench_{level}_{mode}.png"
            assert png.exists() and 1_000 < png.stat().st_size < 300_000
    assert json.loads((tiny_run / "machine.json").read_text())["torch"] == torch.__version__
    checked = json.loads((tiny_run / "targets.json").read_text())
    assert [t["name"] for t in checked] == [t.name for t in targets.evaluate([], yaml_targets())]
    measured = [s.kind == "overhead" and s.mode == "inference" and s.seq_len == 1024 for s in yaml_targets()]
    assert [t["met"] is not None for t in checked] == measured  # only the 1024-token floor target has its cells
    assert all(t["measured"] == "not measured" for t, m in zip(checked, measured) if not m)
    assert "| mate.bucketed |" in (tiny_run / "bench.md").read_text()


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_mate_bucketed_flops_grow_linearly_dense_quadratically(tiny_run, mode):
    rows = rows_of(tiny_run)
    mate = flops(rows, "kernel", mode, "mate.bucketed", 1024) / flops(rows, "kernel", mode, "mate.bucketed", 512)
    dense = flops(rows, "kernel", mode, "dense", 1024) / flops(rows, "kernel", mode, "dense", 512)
    assert mate <= 2.1, mate
    assert 3.9 <= dense <= 4.1, dense
    # Encoder level: attention's share (MATE minus the none floor) is linear too.
    extra = [
        flops(rows, "encoder", mode, "mate.bucketed", n) - flops(rows, "encoder", mode, "none", n) for n in (512, 1024)
    ]
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
    with hydra_compose() as compose:
        overrides = ["attention=mate", "attention.variant=bucketed", "attention.impl=auto"]
        train = compose(config_name="train", overrides=overrides)
    assert cases.attention_config("mate.bucketed") == train.attention
    factory, trained = cases.attention_factory("mate.bucketed"), instantiate(train.attention)
    assert (factory.func, factory.keywords) == (trained.func, trained.keywords)
    backend = cases.build_backend("mate.bucketed", num_heads=4, head_dim=16, max_length=512)
    assert (backend.variant, backend.impl) == ("bucketed", "auto") and not backend.training
    # mate.<impl> runs that impl of its variant; mate.auto names no function
    assert [(c.variant, c.impl) for c in map(cases.attention_config, ("mate.masked", "mate.exact", "mate.kernel"))] == [
        ("exact", "masked"),
        ("exact", "auto"),
        ("bucketed", "kernel"),
    ]
    with pytest.raises(MateError, match="mate.exact"):
        cases.attention_factory("mate.auto")
    with pytest.raises(MateError, match="no 'impl' option"):
        cases.attention_factory("dense.fast")
    with pytest.raises(cases.Unavailable):
        cases.attention_factory("no_such_backend")


def test_a_misspelt_backend_is_one_line_before_the_grid_runs():
    for name in ("dense", "mate.bucketed", "mate.masked+ckpt", "flex", "tapas_hf", "dot.small-256"):
        cases.check_name(name)
    with pytest.raises(MateError, match="'nosuch' is unknown; use flex, tapas_hf, bert_hf, dot.<size>-<K>, or"):
        cases.check_name("nosuch")
    with pytest.raises(MateError, match="names no MATE variant"):
        cases.check_name("mate.flex")  # an implementation since removed
    with pytest.raises(MateError, match="no 'impl' option"):
        cases.check_name("dense.fast")
    with pytest.raises(MateError, match=r"unknown option \+fast"):
        cases.check_name("dense+fast")
    for name in ("dot.smal-256", "dot.small-abc", "dot.small-0"):
        with pytest.raises(MateError, match="write dot.<pruner size>-<K>"):
            cases.check_name(name)
    settings = runner.Settings(["kernel"], ["inference"], [256], [], {"kernel": ["dense", "nosuch"]})
    with pytest.raises(MateError, match="'nosuch' is unknown"):
        settings.check()
    settings = runner.Settings(["kernel"], ["inference"], [256], [], {"kernel": ["dense"]}, {"kernel": ["densee"]})
    with pytest.raises(MateError, match="'densee' is unknown"):  # a linear backend's typo would drop its lengths
        settings.check()


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


def row(level, mode, seq_len, backend, time_ms, peak_mem_mb="", peak_rss_mb="", flops="") -> dict:
    """A bench.csv row (as csv.DictReader gives it) of a measured cell."""
    values = dict(level=level, mode=mode, seq_len=seq_len, backend=backend, status="ok", time_ms=time_ms, flops=flops)
    return {**dict.fromkeys(runner.COLUMNS, ""), **values, "peak_mem_mb": peak_mem_mb, "peak_rss_mb": peak_rss_mb}


def target_rows(slower: bool = False) -> list[dict]:
    """One run's rows at the targets' cells: every target met, or (``slower``) every one missed."""

    def t(fast: float, slow: float) -> float:
        return slow if slower else fast

    return [
        row("kernel", "inference", 8192, "dense", 1600.0, flops=200e9),  # 125 GFLOP/s
        row("kernel", "inference", 8192, "mate.masked", 400.0, flops=200e9),
        row("kernel", "inference", 8192, "mate.bucketed", t(50.0, 80.0), flops=6e9),  # 120 / 75 GFLOP/s
        row("kernel", "inference", 8192, "mate.block_sparse", t(150.0, 200.0), flops=30e9),
        row("kernel", "inference", 8192, "flex", 60.0),
        row("kernel", "train", 8192, "dense", 2500.0),
        row("kernel", "train", 8192, "mate.bucketed", t(100.0, 125.0)),
        row("encoder", "inference", 4096, "tapas_hf", 900.0),
        row("encoder", "inference", 4096, "bert_hf", 500.0),
        *(
            row("encoder", "inference", n, "none", base)
            for n, base in [(1024, 100.0), (2048, 150.0), (4096, 280.0), (16384, 2200.0)]
        ),  # fmt: skip
        row("encoder", "inference", 1024, "mate.bucketed", t(105.0, 120.0)),
        row("encoder", "inference", 2048, "mate.bucketed", t(160.0, 170.0)),
        row("encoder", "inference", 4096, "mate.bucketed", t(300.0, 320.0)),
        row("encoder", "inference", 8192, "none", 1000.0, 50),
        row("encoder", "inference", 8192, "mate.bucketed", t(1050.0, 1200.0), 100),
        row("encoder", "inference", 8192, "mate.block_sparse", 1300.0, 100),
        row("encoder", "inference", 16384, "mate.bucketed", t(2300.0, 2500.0), t(200, 250)),
        row("encoder", "inference", 16384, "mate.block_sparse", 2900.0, 300),
        row("encoder", "inference", 32768, "mate.bucketed", t(21000.0, 30000.0), 900, t(20480, 25600)),
        row("encoder", "inference", 32768, "none", 20000.0, 500, 10240),  # not a candidate
        *(row("encoder", "train", n, "none", base) for n, base in [(2048, 1000.0), (4096, 2000.0)]),
        row("encoder", "train", 2048, "mate.bucketed", t(1100.0, 1200.0)),
        row("encoder", "train", 4096, "mate.bucketed", t(2200.0, 2400.0)),
        row("encoder", "train", 2048, "mate.bucketed+ckpt", 900.0),  # an option row: never "mate" (1)
        *(row("encoder", "train", n, "tapas_hf", 2300.0 * n / 2048) for n in (2048, 4096)),
        row("encoder", "train", 8192, "mate.bucketed", 9000.0, 9000, 12288),  # not the +ckpt row
        row("encoder", "train", 8192, "mate.bucketed+ckpt", 12000.0, 4000, t(6144, 9216)),
    ]


def checked(rows, specs=None) -> list[tuple[str, str, bool | None]]:
    return [(t.requirement, t.measured, t.met) for t in targets.evaluate(rows, specs or yaml_targets())]


#: requirement, measured on target_rows(), measured on target_rows(slower=True)
EXPECTED = [
    (">= 25x faster", "32.00x (dense 1600.0 ms / mate.bucketed 50.0 ms)",
     "20.00x (dense 1600.0 ms / mate.bucketed 80.0 ms)"),
    (">= 75% of dense's rate", "96% (mate.bucketed 120 GFLOP/s, dense 125 GFLOP/s)",
     "60% (mate.bucketed 75 GFLOP/s, dense 125 GFLOP/s)"),
    ("MATE time <= 1.2x flex time", "0.83x of flex (mate.bucketed 50.0 ms, flex 60.0 ms)",
     "1.33x of flex (mate.bucketed 80.0 ms, flex 60.0 ms)"),
    (">= 25x faster", "25.00x (dense 2500.0 ms / mate.bucketed 100.0 ms)",
     "20.00x (dense 2500.0 ms / mate.bucketed 125.0 ms)"),
    (">= 10x faster", "10.67x (dense 1600.0 ms / mate.block_sparse 150.0 ms)",
     "8.00x (dense 1600.0 ms / mate.block_sparse 200.0 ms)"),
    (">= 3x faster", "3.00x (tapas_hf 900.0 ms / mate.bucketed 300.0 ms)",
     "2.81x (tapas_hf 900.0 ms / mate.bucketed 320.0 ms)"),
    (">= 1.6x faster", "1.67x (bert_hf 500.0 ms / mate.bucketed 300.0 ms)",
     "1.56x (bert_hf 500.0 ms / mate.bucketed 320.0 ms)"),
    ("<= 10%", "+5.0% (mate.bucketed 105 ms, none 100 ms)", "+20.0% (mate.bucketed 120 ms, none 100 ms)"),
    ("<= 10%", "+6.7% (mate.bucketed 160 ms, none 150 ms)", "+13.3% (mate.bucketed 170 ms, none 150 ms)"),
    ("<= 10%", "+7.1% (mate.bucketed 300 ms, none 280 ms)", "+14.3% (mate.bucketed 320 ms, none 280 ms)"),
    ("<= 10%", "+5.0% (mate.bucketed 1050 ms, none 1000 ms)", "+20.0% (mate.bucketed 1200 ms, none 1000 ms)"),
    ("<= 10%", "+4.5% (mate.bucketed 2300 ms, none 2200 ms)", "+13.6% (mate.bucketed 2500 ms, none 2200 ms)"),
    ("<= 10%", "+5.0% (mate.bucketed 21000 ms, none 20000 ms)", "+50.0% (mate.bucketed 30000 ms, none 20000 ms)"),
    ("<= 15%", "+10.0% (mate.bucketed 1100 ms, none 1000 ms)", "+20.0% (mate.bucketed 1200 ms, none 1000 ms)"),
    ("<= 15%", "+10.0% (mate.bucketed 2200 ms, none 2000 ms)", "+20.0% (mate.bucketed 2400 ms, none 2000 ms)"),
    (">= 2x faster", "2.09x (tapas_hf 2300.0 ms / mate.bucketed 1100.0 ms)",
     "1.92x (tapas_hf 2300.0 ms / mate.bucketed 1200.0 ms)"),
    (">= 2x faster", "2.09x (tapas_hf 4600.0 ms / mate.bucketed 2200.0 ms)",
     "1.92x (tapas_hf 4600.0 ms / mate.bucketed 2400.0 ms)"),
    ("process peak RSS <= 8 GiB", "6.00 GiB peak RSS (mate.bucketed+ckpt, 12.0 s)",
     "9.00 GiB peak RSS (mate.bucketed+ckpt, 12.0 s)"),
    ("<= 2.1x", "2.00x (mate.bucketed: 100 MB -> 200 MB)", "2.50x (mate.bucketed: 100 MB -> 250 MB)"),
    ("process peak RSS <= 24 GiB", "20.00 GiB peak RSS (mate.bucketed, 21.0 s)",
     "25.00 GiB peak RSS (mate.bucketed, 30.0 s)"),
]  # fmt: skip


@pytest.mark.parametrize("slower", [False, True], ids=["met", "missed"])
def test_yaml_targets_on_hand_made_rows(slower):
    assert checked(target_rows(slower)) == [
        (req, missed if slower else met, not slower) for req, met, missed in EXPECTED
    ]


def test_targets_without_their_rows_are_not_measured():
    rows = [r for r in target_rows() if r["backend"] not in ("flex", "none")]
    for r in rows:
        if r["seq_len"] in (16384, 32768):
            r.update(status="skipped", time_ms="")
        if r["backend"] == "dense":
            r.update(flops="")  # a rate needs both FLOP counts
    result = checked(rows)
    expected = [True, None, None, True, True, True, True, *[None] * 8, True, True, True, None, None]
    assert [met for _, _, met in result] == expected
    assert all(measured == "not measured" for _, measured, met in result if met is None)


def test_targets_are_data():
    specs = yaml_targets()
    assert [s.kind for s in specs] == [
        "speedup", "throughput_ratio", "time_ratio", "speedup", "speedup", "speedup", "speedup", *["overhead"] * 8,
        "speedup", "speedup", "peak_rss", "memory_growth", "peak_rss",
    ]  # fmt: skip
    assert [s.seq_len for s in specs if s.kind == "overhead"] == [1024, 2048, 4096, 8192, 16384, 32768, 2048, 4096]
    stricter = [dataclasses.replace(specs[0], threshold=20, seq_len=4096, level="encoder", baseline="tapas_hf")]
    (target,) = targets.evaluate(target_rows(), stricter)
    assert (target.name, target.requirement, target.met) == (
        "kernel inference 4096: MATE vs dense SDPA",
        ">= 20x faster",
        False,
    )  # the name follows seq_len; level/baseline are free text there
    with pytest.raises(MateError, match=r"bench.targets\[0\].kind='faster'"):
        targets.parse([{"kind": "faster"}])
    with pytest.raises(MateError, match=r"lacks \['baseline'\]"):
        targets.parse([{**dataclasses.asdict(specs[0]), "baseline": None}])
    with pytest.raises(MateError, match="unknown keys"):
        targets.parse([{**dataclasses.asdict(specs[0]), "treshold": 3}])


def test_ckpt_option_row_trains_with_gradient_checkpointing_and_is_encoder_only():
    input_ids, layout = table_layout(128)
    tiny, cpu = cases.DIMS["tiny"], torch.device("cpu")
    saved = {}
    for name in ("mate.bucketed", "mate.bucketed+ckpt"):
        case = cases.encoder_case(name, "train", input_ids, layout, tiny, torch.float32, cpu)
        count = [0]
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.__setitem__(0, count[0] + t.numel()) or t,
                                                      lambda t: t):  # fmt: skip
            case.call()
        saved[name] = count[0]
    assert saved["mate.bucketed+ckpt"] < saved["mate.bucketed"] / 2  # only each layer's input is kept
    with pytest.raises(cases.Unavailable, match="encoder level"):
        cases.kernel_case("mate.bucketed+ckpt", "train", layout, tiny, 1, torch.float32, cpu)
    with pytest.raises(cases.Unavailable, match="TableEncoder only"):
        cases.encoder_case("tapas_hf+ckpt", "train", input_ids, layout, tiny, torch.float32, cpu)
    with pytest.raises(MateError, match=r"unknown option \+fast"):
        cases.encoder_case("mate.bucketed+fast", "train", input_ids, layout, tiny, torch.float32, cpu)


def test_the_dot_row_runs_the_pruner_on_every_token_and_the_task_model_on_k():
    input_ids, layout = table_layout(128)
    seen = []
    case = cases.encoder_case(
        "dot.mini-32", "train", input_ids, layout, cases.DIMS["tiny"], torch.float32, torch.device("cpu")
    )
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(args[0].shape[1]) if type(module).__name__ == "TableEncoder" else None
    )
    try:
        case.call()
    finally:
        hook.remove()
    assert seen == [128, 32]  # the pruner reads the whole input, the task model the K kept tokens
    with pytest.raises(MateError, match="dot.small-256"):
        cases.encoder_case(
            "dot.huge-8", "inference", input_ids, layout, cases.DIMS["tiny"], torch.float32, torch.device("cpu")
        )


def test_the_none_floor_runs_every_projection_backward_in_a_training_step():
    """``context = v`` alone would let autograd skip the query/key projections' backward,
    which every real attention pays: the floor hands q and k zero gradients instead."""
    from mate_cli.modeling.attention.none import NoAttention

    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    floor = NoAttention(num_heads=2, head_dim=4)
    out = floor(q, k, v, None)
    assert torch.equal(out, v)
    (out * 3).sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and torch.equal(k.grad, torch.zeros_like(k))
    assert torch.equal(v.grad, torch.full_like(v, 3.0))
    with torch.no_grad():
        assert floor(q, k, v, None) is v


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flexattention_cells_are_never_put_under_the_flop_counter_and_flex_keeps_running(monkeypatch):
    """FlexAttention cannot run under FlopCounterMode, and a failed try leaves torch refusing FlexAttention for the
    rest of the process: the exact-mask anchor's FLOPs come from its block mask, and exact MATE's ``block_sparse``
    (FlexAttention on CUDA) is measured uncounted there."""
    input_ids, layout = table_layout(256)
    tiny, cpu = cases.DIMS["tiny"], torch.device("cpu")
    anchor = cases.kernel_case("flex", "inference", layout, tiny, 1, torch.float32, cpu)
    assert anchor.flops and anchor.flops > 0
    result = measure.measure(anchor.call, cpu, 2, 1, anchor.flops, anchor.countable)
    assert result.flops == anchor.flops
    anchor.call()  # FlexAttention still runs in this process
    counted = cases.kernel_case("mate.block_sparse", "train", layout, tiny, 1, torch.float32, cpu)
    assert counted.countable  # the pure path on CPU: the counter sees its work
    assert measure.measure(counted.call, cpu, 1, 1, counted.flops, counted.countable).flops > 0

    # where block_sparse runs FlexAttention (CUDA), its cells and exact MATE's auto beyond its length go uncounted
    monkeypatch.setattr(cases.sparse, "uses_flex", lambda q, dropout_p: dropout_p == 0.0)
    short, long_ = (torch.empty(1, 1, n, 1) for n in (16, 4096))
    for name, probe, grad, flex in [
        ("mate.block_sparse", short, False, True),
        ("mate.exact", long_, True, True),
        ("mate.exact", short, False, False),
        ("mate.masked", long_, True, False),
        ("mate.bucketed", long_, True, False),
    ]:
        backend = cases.build_backend(name, 2, 4, max_length=probe.shape[2])
        assert cases.runs_flex(backend, probe, grad) == flex, (name, probe.shape[2], grad)
    uncounted = cases.kernel_case("mate.block_sparse", "inference", layout, tiny, 1, torch.float32, cpu)
    assert not uncounted.countable
    monkeypatch.undo()  # the call itself takes the pure path here: measured, not counted
    assert measure.measure(uncounted.call, cpu, 1, 1, uncounted.flops, uncounted.countable).flops is None
