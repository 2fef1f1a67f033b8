"""The targets of ``bench.targets`` (``conf/bench.yaml`` documents each ``kind``), checked on one run's rows.

A ``candidate`` or ``baseline`` family (``mate``: ``mate`` and every ``mate.<variant or impl>``; a ``+option`` row only
by its exact name) is represented by its best row in the cell, as in the paper (§3.1: "the best of the two functionally
equivalent implementations is chosen for each use case"), and the output names it. ``memory_growth`` takes the
candidate row measured at both lengths that grows least, ``peak_rss`` the smallest ``peak_rss_mb``. A target whose rows
are missing (not in the grid, skipped, failed) is ``not measured``, never silently met."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Callable, Iterable

from rich.console import Console
from rich.table import Table

from mate_cli.bench.cases import LEVELS, MODES
from mate_cli.bench.runner import select
from mate_cli.errors import MateError

GIB = 2**30


@dataclass
class Target:
    """One checked target, as written to ``targets.json`` and ``bench.md``."""

    name: str
    requirement: str
    measured: str = "not measured"
    met: bool | None = None


@dataclass(frozen=True)
class TargetSpec:
    """One entry of ``bench.targets`` at one ``seq_len``."""

    name: str
    requirement: str
    kind: str
    level: str
    mode: str
    seq_len: int
    threshold: float
    candidate: str = "mate"
    baseline: str | None = None
    to_seq_len: int | None = None

    def text(self, template: str) -> str:
        return template.format(**asdict(self))


# ------------------------------------------------------------------ rows
def _ok(rows, **where) -> list[dict]:
    return [r for r in select(rows, **where) if r["status"] == "ok" and r["time_ms"] not in ("", None)]


def matches(backend: str, name: str) -> bool:
    """Whether a row of ``backend`` stands for ``name`` (a family: module docstring)."""
    return backend == name or ("+" not in backend and backend.split(".")[0] == name)


def best(rows, name: str, key: str = "time_ms", **where) -> dict | None:
    """The ok row of backend (family) ``name`` with the smallest ``key`` at ``where``."""
    found = [r for r in _ok(rows, **where) if matches(r["backend"], name) and r[key] not in ("", None)]
    return min(found, key=lambda r: float(r[key])) if found else None


def _cell(spec: TargetSpec) -> dict:
    return dict(level=spec.level, mode=spec.mode, seq_len=spec.seq_len)


def _times(rows, spec: TargetSpec, value=lambda r: float(r["time_ms"])) -> tuple[str, float, str, float] | None:
    """``(candidate, its value, baseline, its value)`` of the spec's cell, the value a row's time unless given."""
    candidate, baseline = best(rows, spec.candidate, **_cell(spec)), best(rows, spec.baseline, **_cell(spec))
    if not (candidate and baseline and float(baseline["time_ms"])):
        return None
    return candidate["backend"], value(candidate), baseline["backend"], value(baseline)


# ------------------------------------------------------------------ kinds
# Each check gives ``(measured, met)`` when its rows exist, else None.
Check = Callable[[list, TargetSpec], "tuple[str, bool] | None"]


def speedup(rows, spec: TargetSpec):
    if found := _times(rows, spec):
        cand, c, base, b = found
        return f"{b / c:.2f}x ({base} {b:.1f} ms / {cand} {c:.1f} ms)", b / c >= spec.threshold


def time_ratio(rows, spec: TargetSpec):
    if found := _times(rows, spec):
        cand, c, base, b = found
        return f"{c / b:.2f}x of {base} ({cand} {c:.1f} ms, {base} {b:.1f} ms)", c <= spec.threshold * b


def overhead(rows, spec: TargetSpec):
    if found := _times(rows, spec):
        cand, c, base, b = found
        return f"{(c / b - 1) * 100:+.1f}% ({cand} {c:.0f} ms, {base} {b:.0f} ms)", c / b - 1 <= spec.threshold


def memory_growth(rows, spec: TargetSpec):
    at = dict(level=spec.level, mode=spec.mode)
    pairs = []
    for small in _ok(rows, seq_len=spec.seq_len, **at):
        if not matches(small["backend"], spec.candidate) or small["peak_mem_mb"] in ("", None):
            continue
        large = _ok(rows, seq_len=spec.to_seq_len, backend=small["backend"], **at)
        if large and large[0]["peak_mem_mb"] not in ("", None):
            pairs.append((small["backend"], float(small["peak_mem_mb"]), float(large[0]["peak_mem_mb"])))
    if pairs:
        backend, small, large = min(pairs, key=lambda p: p[2] / p[1])
        return f"{large / small:.2f}x ({backend}: {small:.0f} MB -> {large:.0f} MB)", large / small <= spec.threshold


def peak_rss(rows, spec: TargetSpec):
    if row := best(rows, spec.candidate, key="peak_rss_mb", **_cell(spec)):
        high = float(row["peak_rss_mb"]) * 2**20
        measured = f"{high / GIB:.2f} GiB peak RSS ({row['backend']}, {float(row['time_ms']) / 1e3:.1f} s)"
        return measured, high <= spec.threshold * GIB


def _gflops(row: dict) -> float:
    return float(row["flops"]) / float(row["time_ms"]) / 1e6 if row["flops"] not in ("", None) else 0.0


def throughput_ratio(rows, spec: TargetSpec):
    found = _times(rows, spec, _gflops)
    if found and found[1] > 0 and found[3] > 0:
        cand, c, base, b = found
        return f"{c / b:.0%} ({cand} {c:.0f} GFLOP/s, {base} {b:.0f} GFLOP/s)", c >= spec.threshold * b


#: kind -> (check, keys it needs besides the common ones).
KINDS: dict[str, tuple[Check, tuple[str, ...]]] = {
    "speedup": (speedup, ("baseline",)),
    "time_ratio": (time_ratio, ("baseline",)),
    "overhead": (overhead, ("baseline",)),
    "memory_growth": (memory_growth, ("to_seq_len",)),
    "peak_rss": (peak_rss, ()),
    "throughput_ratio": (throughput_ratio, ("baseline",)),
}
REQUIRED = ("name", "requirement", "kind", "level", "mode", "seq_len", "threshold")


# ------------------------------------------------------------------ config -> specs -> targets
def parse(entries: Iterable[dict] | None) -> list[TargetSpec]:
    """``bench.targets`` (a list of mappings) -> specs; a one-line `MateError` names a bad entry."""
    known = {f.name for f in fields(TargetSpec)}
    specs = []
    for i, entry in enumerate(entries or []):
        where = f"bench.targets[{i}]"
        if not isinstance(entry, dict):
            raise MateError(f"{where} must be a mapping with keys {', '.join(REQUIRED)}")
        kind = entry.get("kind")
        if kind not in KINDS:
            raise MateError(f"{where}.kind={kind!r} is unknown; choose one of {', '.join(KINDS)}")
        unknown = sorted(set(entry) - known)
        missing = [k for k in REQUIRED + KINDS[kind][1] if entry.get(k) is None]
        if unknown or missing:
            problem = f"has unknown keys {unknown}" if unknown else f"lacks {missing}"
            raise MateError(f"{where} ({kind}) {problem}; keys: {', '.join(sorted(known))}")
        if entry["level"] not in LEVELS or entry["mode"] not in MODES:
            raise MateError(f"{where}: level must be one of {list(LEVELS)} and mode one of {list(MODES)}")
        lengths = entry["seq_len"] if isinstance(entry["seq_len"], (list, tuple)) else [entry["seq_len"]]
        for length in lengths:
            to_seq_len = None if entry.get("to_seq_len") is None else int(entry["to_seq_len"])
            numbers = {"seq_len": int(length), "threshold": float(entry["threshold"]), "to_seq_len": to_seq_len}
            spec = TargetSpec(**{**entry, **numbers})
            try:
                spec.text(spec.name), spec.text(spec.requirement)
            except (KeyError, ValueError, IndexError) as err:
                raise MateError(f"{where}: bad placeholder in name/requirement ({err!r})") from None
            specs.append(spec)
    return specs


def evaluate(rows: list[dict], specs: Iterable[TargetSpec]) -> list[Target]:
    return [
        Target(spec.text(spec.name), spec.text(spec.requirement), *(KINDS[spec.kind][0](rows, spec) or ()))
        for spec in specs
    ]


def print_targets(targets: list[Target], console: Console) -> None:
    table = Table(title="targets (this run)")
    for column in ("target", "required", "measured", "met"):
        table.add_column(column)
    for t in targets:
        verdict = "[dim]n/a[/dim]" if t.met is None else "[green]yes[/green]" if t.met else "[red]no[/red]"
        table.add_row(t.name, t.requirement, t.measured, verdict)
    console.print(table)
