"""Issue 4's performance targets, checked against the rows of one run.

"MATE" is the fastest ``mate`` / ``mate.<impl>`` row of the cell being compared
(the paper, §3.1: "the best of the two functionally equivalent implementations
is chosen for each use case"); the row it came from is named in the output.
A target whose rows are missing (not in the grid, skipped, failed) is
``not measured``, never silently met.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mate_cli.bench.runner import select

GIB = 2**30


@dataclass
class Target:
    name: str
    requirement: str
    measured: str = "not measured"
    met: bool | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _ok(rows, **where) -> list[dict]:
    return [r for r in select(rows, **where) if r["status"] == "ok" and r["time_ms"] not in ("", None)]


def _time(rows, backend, **where) -> float | None:
    found = _ok(rows, backend=backend, **where)
    return float(found[0]["time_ms"]) if found else None


def best_mate(rows, key: str = "time_ms", **where) -> tuple[str, float] | None:
    """``(backend, value)`` of the mate row with the smallest ``key`` at ``where``."""
    found = [r for r in _ok(rows, **where) if r["backend"].split(".")[0] == "mate" and r[key] not in ("", None)]
    if not found:
        return None
    best = min(found, key=lambda r: float(r[key]))
    return best["backend"], float(best[key])


def _speedup(rows, target: Target, anchor: str, least: float, **where) -> Target:
    mate, other = best_mate(rows, **where), _time(rows, anchor, **where)
    if mate and other:
        ratio = other / mate[1]
        target.measured = f"{ratio:.2f}x ({anchor} {other:.1f} ms / {mate[0]} {mate[1]:.1f} ms)"
        target.met = ratio >= least
    return target


def evaluate(rows: list[dict]) -> list[Target]:
    k_inf = dict(level="kernel", mode="inference", seq_len=8192)
    k_train = dict(level="kernel", mode="train", seq_len=8192)
    targets = [
        _speedup(rows, Target("kernel inference 8192: MATE vs dense SDPA", ">= 15x faster"), "dense", 15, **k_inf),
    ]
    flex = Target("kernel inference 8192: MATE vs FlexAttention (same mask)", "MATE time <= 1.2x flex time")
    mate, other = best_mate(rows, **k_inf), _time(rows, "flex", **k_inf)
    if mate and other:
        flex.measured = f"{mate[1] / other:.2f}x of flex ({mate[0]} {mate[1]:.1f} ms, flex {other:.1f} ms)"
        flex.met = mate[1] <= 1.2 * other
    targets.append(flex)
    targets.append(
        _speedup(rows, Target("kernel fwd+bwd 8192: MATE vs dense", ">= 10x faster"), "dense", 10, **k_train)
    )
    e4096 = dict(level="encoder", mode="inference", seq_len=4096)
    targets.append(_speedup(rows, Target("encoder inference 4096: MATE vs TapasModel (eager)", ">= 3x faster"), "tapas_hf", 3, **e4096))
    targets.append(_speedup(rows, Target("encoder inference 4096: MATE vs BertModel (sdpa)", ">= 1.6x faster"), "bert_hf", 1.6, **e4096))

    overhead = Target("encoder inference 8192: MATE overhead over the none floor", "<= 15%")
    e8192 = dict(level="encoder", mode="inference", seq_len=8192)
    mate, floor = best_mate(rows, **e8192), _time(rows, "none", **e8192)
    if mate and floor:
        extra = mate[1] / floor - 1
        overhead.measured = f"{extra * 100:+.1f}% ({mate[0]} {mate[1]:.0f} ms, none {floor:.0f} ms)"
        overhead.met = extra <= 0.15
    targets.append(overhead)

    growth = Target("encoder inference peak memory 8192 -> 16384 (MATE)", "<= 2.1x")
    # Only MATE impls measured at both lengths can show growth (linear_backends run at 16384).
    at_big = {r["backend"] for r in _ok(rows, level="encoder", mode="inference", seq_len=16384)}
    pairs = []
    for r in _ok(rows, level="encoder", mode="inference", seq_len=8192):
        if r["backend"].split(".")[0] == "mate" and r["backend"] in at_big and r["peak_mem_mb"] not in ("", None):
            big = _ok(rows, level="encoder", mode="inference", seq_len=16384, backend=r["backend"])[0]
            if big["peak_mem_mb"] not in ("", None):
                pairs.append((r["backend"], float(r["peak_mem_mb"]), float(big["peak_mem_mb"])))
    if pairs:
        backend, small, large = min(pairs, key=lambda p: p[2] / p[1])
        ratio = large / small
        growth.measured = f"{ratio:.2f}x ({backend}: {small:.0f} MB -> {large:.0f} MB)"
        growth.met = ratio <= 2.1
    targets.append(growth)

    fits = Target("encoder inference 32768 tokens (MATE) fits in 24 GB", "process peak RSS <= 24 GiB")
    found = [
        r for r in _ok(rows, level="encoder", mode="inference", seq_len=32768)
        if r["backend"].split(".")[0] == "mate" and r["peak_rss_mb"] not in ("", None)
    ]  # fmt: skip
    if found:
        best = min(found, key=lambda r: float(r["peak_rss_mb"]))
        high = float(best["peak_rss_mb"]) * 2**20
        fits.measured = f"{high / GIB:.2f} GiB peak RSS ({best['backend']}, {float(best['time_ms']) / 1e3:.1f} s)"
        fits.met = high <= 24 * GIB
    targets.append(fits)
    return targets


def print_targets(targets: list[Target], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="issue 4 targets (this run)")
    for column in ("target", "required", "measured", "met"):
        table.add_column(column)
    for t in targets:
        verdict = "[dim]n/a[/dim]" if t.met is None else "[green]yes[/green]" if t.met else "[red]no[/red]"
        table.add_row(t.name, t.requirement, t.measured, verdict)
    console.print(table)
