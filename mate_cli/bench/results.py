"""A run's bench rows as ``bench.csv``, screen tables, ``bench.md`` and PNGs like the paper's Figures 4-6: one per
(level, mode), median time, peak memory and FLOPs vs length, log-log, a line per backend (skipped cells absent)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable

from rich.console import Console
from rich.table import Table

from mate_cli.bench.runner import COLUMNS, select
from mate_cli.io import atomic_open, atomic_write_csv

#: Line styles: anchors dashed, other baselines dash-dotted, the floor dotted; a backend not listed (MATE's)
#: solid, in :data:`MATE_COLORS`.
STYLE = {
    "none": dict(linestyle=":", color="black"),
    "dense": dict(linestyle="--", color="tab:red"),
    "flex": dict(linestyle="--", color="tab:purple"),
    "tapas_hf": dict(linestyle="--", color="tab:brown"),
    "bert_hf": dict(linestyle="--", color="tab:pink"),
    "sat": dict(linestyle="-.", color="tab:orange"),
    "linformer": dict(linestyle="-.", color="tab:olive"),
    "table_etc": dict(linestyle="-.", color="tab:cyan"),
}
#: other processes' CPU (cores) above which a cell's time is flagged as contended.
NOISY_CORES = 0.25
MATE_COLORS = ("tab:blue", "tab:green", "tab:gray", "navy", "teal")


def write_csv(rows: list[dict], path: Path) -> Path:
    return atomic_write_csv(path, list(COLUMNS), rows, extrasaction="ignore")


def _num(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def groups(rows: Iterable[dict]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((row["level"], row["mode"]) for row in rows))


def backends_of(rows: Iterable[dict]) -> list[str]:
    return list(dict.fromkeys(row["backend"] for row in rows))


def _fmt_time(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1e3:.2f} s" if ms >= 1e3 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def format_mb(mb: float | None) -> str:
    if mb is None:
        return "-"
    return f"{mb / 1024:.2f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def cell_text(row: dict) -> str:
    if row["status"] != "ok":
        return f"[dim]{row['status']}[/dim]"
    return f"{_fmt_time(_num(row['time_ms']))}\n[dim]{format_mb(_num(row['peak_mem_mb']))}[/dim]"


def markdown_cell(row: dict) -> str:
    if row["status"] != "ok":
        return row["status"]
    flops = _num(row["flops"])
    gf = "" if not flops else f" ({flops / 1e9:,.1f} GF)"
    err = f"; {row['err_vs_fp32']}" if row.get("err_vs_fp32") else ""
    return f"{_fmt_time(_num(row['time_ms']))} / {format_mb(_num(row['peak_mem_mb']))}{gf}{err}"


def print_tables(rows: list[dict], console: Console) -> None:
    """One rich table per (level, mode): backends x lengths, median time over peak memory."""
    for level, mode in groups(rows):
        part = select(rows, level=level, mode=mode)
        lengths = sorted({r["seq_len"] for r in part})
        table = Table(title=f"{level} / {mode}: median time, peak memory", show_lines=False)
        table.add_column("backend")
        for n in lengths:
            table.add_column(str(n), justify="right")
        for backend in backends_of(part):
            by_len = {r["seq_len"]: r for r in select(part, backend=backend)}
            table.add_row(backend, *(cell_text(by_len[n]) if n in by_len else "" for n in lengths))
        console.print(table)
    noisy = [r for r in rows if r["status"] == "ok" and (_num(r.get("other_cpu")) or 0) > NOISY_CORES]
    if noisy:
        console.print(
            f"[yellow]{len(noisy)} of {len(rows)} cells were timed while other processes used more than "
            f"{NOISY_CORES} cores (column other_cpu): their times include contention.[/yellow]"
        )
    notes: dict[tuple, dict] = {}  # the first row of each backend's note
    for r in rows:
        if r["status"] != "ok" and r["note"]:
            notes.setdefault((r["level"], r["mode"], r["backend"], r["note"]), r)
    for r in notes.values():
        console.print(
            f"[dim]{r['level']}/{r['mode']} {r['backend']} @ {r['seq_len']}: {r['status']} - {r['note']}[/dim]"
        )


def plot(rows: list[dict], out_dir: Path, dpi: int = 90) -> list[Path]:
    """The ``bench_<level>_<mode>.png`` files (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    paths = []
    for level, mode in groups(rows):
        part = [r for r in select(rows, level=level, mode=mode) if r["status"] == "ok"]
        if not part:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.2))
        panels = (("time_ms", "median time (ms)"), ("peak_mem_mb", "peak memory (MB)"), ("flops", "FLOPs"))
        mate_colors = itertools.cycle(MATE_COLORS)  # MATE's rows in turn, in the order they first appear
        styles = {
            b: STYLE.get(b) or dict(linestyle="-", color=next(mate_colors), linewidth=2) for b in backends_of(part)
        }
        for ax, (column, label) in zip(axes, panels):
            for backend in backends_of(part):
                pts = sorted((r["seq_len"], _num(r[column])) for r in select(part, backend=backend) if _num(r[column]))
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o", markersize=3, label=backend, **styles[backend])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            lengths = sorted({r["seq_len"] for r in part})
            ax.set_xticks(lengths, [str(n) for n in lengths], fontsize=7)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7, loc="upper left")
        meta = part[0]
        fig.suptitle(
            f"{level} / {mode} - dims={meta['dims']}, batch={meta['batch']}, {meta['dtype']}, {meta['device']}",
            fontsize=10,
        )
        fig.tight_layout()
        path = out_dir / f"bench_{level}_{mode}.png"
        with atomic_open(path, "wb") as handle:
            fig.savefig(handle, format="png", dpi=dpi)
        plt.close(fig)
        paths.append(path)
    return paths


def markdown(rows: list[dict], targets: list | None = None, machine: dict | None = None) -> str:
    """``bench.md``: the machine, the targets and one table per (level, mode), ready for BENCHMARKS.md."""
    out = []
    if machine:
        out.append("Machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()) + "\n")
    if targets:
        out.append("| target | required | measured | met |\n|---|---|---|---|")
        for t in targets:
            verdict = "n/a" if t.met is None else "**yes**" if t.met else "**no**"
            out.append(f"| {t.name} | {t.requirement} | {t.measured} | {verdict} |")
        out.append("")
    for level, mode in groups(rows):
        part = select(rows, level=level, mode=mode)
        lengths = sorted({r["seq_len"] for r in part})
        errors = any(r.get("err_vs_fp32") for r in part)
        error_text = "; error vs float32" if errors else ""
        out.append(f"**{level} / {mode}** - median time / peak memory (FLOPs{error_text})\n")
        out.append("| backend | " + " | ".join(map(str, lengths)) + " |")
        out.append("|---|" + "---:|" * len(lengths))
        for backend in backends_of(part):
            by_len = {r["seq_len"]: r for r in select(part, backend=backend)}
            cells = [markdown_cell(by_len[n]) if n in by_len else "" for n in lengths]
            out.append(f"| {backend} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"
