"""`mate synthesize`: synthetic statements (:mod:`mate_cli.data.statements`) about the tables of a corpus (the
``dataset`` group of `mate pretrain`), written into the run dir as a TabFact dataset, which `mate train
experiment=tabfact_<attention> dataset=tabfact dataset.root=<run dir>` trains on::

    tokenized_data/train_examples.json, val_examples.json   {"<table id>": [[statement, ...], [label, ...], caption]}
    data/all_csv/<table id>                                    '#'-separated, header first
    synthesize.json                                            what was written, by side and by select; the settings

The corpus's tables are cut into train and validation by content (``val_fraction``; the same table is never on both
sides), each table is written with ``statements_per_table`` statements, and each statement once more on a copy of its
table with one column shuffled, where its verdict is the other one (that copy's own table id, ``<id>-<n>.csv``).
``selects``, ``max_conditions`` and ``orders`` narrow the grammar the statements are drawn from (easier statements).
``refuted=absent_value`` writes a first stage instead: each entailed statement that names cells of its table, with a
refuted twin on the same table naming a value the table lacks (drawn from a column of that name in another table of
the same side), and no copies (:func:`mate_cli.data.statements.absent_value_twins`). The
files come from the corpus and the settings alone (``seed`` draws each table's statements and which tables are held
out): a second run writes the same ones."""

from __future__ import annotations

import logging
import random
import shutil
from collections import Counter

from omegaconf import DictConfig

from mate_cli.commands.common import hydra_app, print_table, write_result
from mate_cli.data.corpus import Corpus, TableText, table_key
from mate_cli.data.split import split_by_table
from mate_cli.data.statements import SELECTS, Grammar, Grid, absent_value_twins, column_values, statement_pairs
from mate_cli.errors import MateError
from mate_cli.io import atomic_write_json, atomic_write_text
from mate_cli.run.job import run_dir

log = logging.getLogger(__name__)

#: a table needs this many data rows and columns for a statement to compare rows
MIN_ROWS, MIN_COLUMNS = 3, 2
#: how a refuted statement is made: on a shuffled copy of its table (TAPAS's release), or naming an absent value
REFUTED = ("shuffled_copy", "absent_value")
#: what a '#'-separated TabFact line cannot hold in a cell
_SEPARATORS = str.maketrans({"#": " ", "\n": " ", "\r": " "})


def grid_of(example: TableText, max_rows: int) -> Grid:
    """The table's texts, its first ``max_rows`` data rows, with '#' and line breaks made spaces."""

    def clean(text: str) -> str:
        return " ".join(text.translate(_SEPARATORS).split())

    header = tuple(clean(cell.text) for cell in example.table.header)
    rows = tuple(tuple(clean(cell.text) for cell in row) for row in example.table.rows[:max_rows])
    return Grid(header, rows)


def csv_text(grid: Grid) -> str:
    return "".join("#".join(line) + "\n" for line in (grid.header, *grid.rows))


def grammar_of(cfg: DictConfig) -> Grammar:
    """The settings' grammar; one line with the fix where they name none."""
    selects = [cfg.selects] if isinstance(cfg.selects, str) else cfg.selects  # selects=none: that one
    conditions = cfg.max_conditions
    try:
        if not isinstance(cfg.orders, bool) or not isinstance(conditions, int) or isinstance(conditions, bool):
            raise ValueError
        return Grammar(tuple(selects), conditions, cfg.orders)
    except (TypeError, ValueError):
        raise MateError(
            f"selects={selects}, max_conditions={cfg.max_conditions}, orders={cfg.orders}: selects are some of "
            f"{list(SELECTS)}, max_conditions is 0 or more and orders true or false; set e.g. "
            "'selects=[none,first,last]' max_conditions=1 orders=false"
        ) from None


def synthesize(cfg: DictConfig) -> dict:
    if int(cfg.statements_per_table) < 1 or int(cfg.max_rows) < MIN_ROWS:
        raise MateError(
            f"statements_per_table={cfg.statements_per_table}, max_rows={cfg.max_rows}: need at least 1 statement "
            f"and {MIN_ROWS} rows a table; set e.g. statements_per_table=4 max_rows=50"
        )
    grammar = grammar_of(cfg)
    if cfg.refuted not in REFUTED:
        raise MateError(
            f"refuted={cfg.refuted} is no way to refute a statement; set refuted=shuffled_copy or absent_value"
        )
    data = cfg.dataset
    corpus = Corpus(data.sources, data.get("hybridqa_passages", 1), data.get("tables", "all"), data.get("splits"))
    unique = {table_key(e.table): e for e in corpus.examples()}  # HybridQA: one table, several texts
    train, validation = split_by_table(
        list(unique.values()), cfg.val_fraction, int(cfg.seed), key=lambda e: table_key(e.table), setting="val_fraction"
    )
    stats: dict = {}
    files: dict[str, dict] = {}
    tables: dict[str, str] = {}  # file name -> its text: written once every side has statements
    for side, examples, file in (
        ("train", train, "train_examples.json"),
        ("validation", validation, "val_examples.json"),
    ):
        entries: dict[str, list] = {}
        selects: Counter = Counter()
        grids = [(example, grid_of(example, int(cfg.max_rows))) for example in examples]
        grids = [(e, g) for e, g in grids if len(g.rows) >= MIN_ROWS and len(g.header) >= MIN_COLUMNS]
        skipped = len(examples) - len(grids)
        values = column_values([grid for _, grid in grids]) if cfg.refuted == "absent_value" else {}
        for example, grid in grids:
            key = table_key(example.table)
            # per table: the same statements drawn whatever the corpus around it (absent_value: the values refuting
            # them come from the side's other tables)
            rng = random.Random(f"{cfg.seed}:{key}")
            if cfg.refuted == "absent_value":
                twins = absent_value_twins(grid, int(cfg.statements_per_table), rng, grammar, values)
                pairs = []
            else:
                pairs = statement_pairs(grid, int(cfg.statements_per_table), rng, grammar)
                twins = []
            if not pairs and not twins:
                skipped += 1
                continue
            caption = example.text.strip()
            own = f"{key}.csv"
            tables[own] = csv_text(grid)
            entries[own] = [[], [], caption]
            for twin in twins:
                entries[own][0] += [twin.text, twin.refuted]
                entries[own][1] += [1, 0]
                selects[twin.statement.expression.select] += 1
            for n, pair in enumerate(pairs, 1):
                copy = f"{key}-{n}.csv"
                tables[copy] = csv_text(pair.flipped)
                entries[own][0].append(pair.text)
                entries[own][1].append(int(pair.verdict))
                entries[copy] = [[pair.text], [int(not pair.verdict)], caption]
                selects[pair.statement.expression.select] += 1
        if not entries:
            raise MateError(
                f"no statement could be written for the {side} side ({len(examples)} tables, {skipped} without one: "
                f"fewer than {MIN_ROWS} rows or {MIN_COLUMNS} columns, or nothing defined on them); give "
                "dataset.sources more tables, lower val_fraction or widen the grammar (selects, max_conditions)"
            )
        files[file] = entries
        statements = sum(len(labels) for _, labels, _ in entries.values())
        stats[side] = {
            "source_tables": len(examples),
            "tables_skipped": skipped,
            "tables_written": len(entries),
            "statements": statements,
            "entailed": sum(sum(labels) for _, labels, _ in entries.values()),
            "by_select": {name: selects[name] for name in SELECTS if selects[name]},
        }
    out = run_dir()
    tables_dir = out / "data" / "all_csv"
    for file in files:  # a rerun into this run dir: no statement file of the last one outlives its tables
        (out / "tokenized_data" / file).unlink(missing_ok=True)
    shutil.rmtree(tables_dir, ignore_errors=True)  # a rerun writes the same files; none is left from another
    tables_dir.mkdir(parents=True)
    for name, text in tables.items():
        atomic_write_text(tables_dir / name, text)
    for file, entries in files.items():  # last: a stopped run leaves no statement file that names a missing table
        atomic_write_json(out / "tokenized_data" / file, entries)
    rows = [[side, str(s["tables_written"]), str(s["statements"]), str(s["entailed"])] for side, s in stats.items()]
    print_table("synthetic statements (TabFact layout)", ["side", "tables", "statements", "entailed"], rows)
    log.info("train on them: mate train experiment=tabfact_mate dataset=tabfact dataset.root=%s", out)
    settings = {
        "seed": int(cfg.seed),
        "statements_per_table": int(cfg.statements_per_table),
        "max_rows": int(cfg.max_rows),
        "val_fraction": float(cfg.val_fraction),
        "selects": list(grammar.selects),
        "max_conditions": grammar.max_conditions,
        "orders": grammar.orders,
        "refuted": str(cfg.refuted),
    }  # which statements these are, wherever the files travel without the run's config
    return write_result("synthesize", {**stats, "settings": settings}, dataset=out)


main = hydra_app(__name__, synthesize)
