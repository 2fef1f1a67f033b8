"""Synthetic statements: what each select and condition evaluates to on a table built by hand, that every written
pair is true on one table and false on the other, and `mate synthesize` on the bundled samples (in this process),
read back as a TabFact dataset whose statements alone tell nothing."""

from __future__ import annotations

import json
import os
import random

import pytest

from mate_cli.commands.synthesize import csv_text, grammar_of, grid_of
from mate_cli.data.corpus import Corpus, TableText, table_key
from mate_cli.data.numbers import normalize_text, parse_number
from mate_cli.data.statements import (
    CELL_SELECTS,
    Condition,
    Expression,
    Grammar,
    Grid,
    Statement,
    absent_refutation,
    absent_value_twins,
    cell_matcher,
    column_values,
    evaluate,
    holds,
    same,
    statement_pairs,
    verbalize,
)
from mate_cli.data.tabfact import TabFactReader
from mate_cli.paths import REPO_ROOT
from tests.inprocess import compose_command, run_captured

GRID = Grid(
    ("driver", "team", "points", "laps"),
    (
        ("Alesi", "Ferrari", "6", "78"),
        ("Hill", "Williams", "10", "78"),
        ("Berger", "Ferrari", "4", "77"),
        ("Blundell", "McLaren", "", "70"),
    ),
)
FERRARI = Condition(1, "is", "ferrari")


def texts(expression: Expression, grid: Grid = GRID):
    value = evaluate(expression, grid)
    return None if value is None else value.texts


@pytest.mark.parametrize(
    "expression, value",
    [
        (Expression("none", 0, (FERRARI,)), ("alesi", "berger")),
        (Expression("first", 0, (FERRARI,)), ("alesi",)),
        (Expression("last", 0, (FERRARI,)), ("berger",)),
        (Expression("total", 2, (FERRARI,)), ("10",)),
        (Expression("average", 2, (FERRARI,)), ("5",)),
        (Expression("range", 2, (FERRARI,)), ("2",)),
        (Expression("lowest", 0, ()), None),  # drivers hold no numbers
        (Expression("lowest", 3, ()), ("70",)),
        (Expression("greatest", 2, (Condition(3, "greater", "75"),)), ("10",)),
        (Expression("average", 3, (Condition(3, "less", "78"),)), ("73.50",)),
        (Expression("count", 0, (Condition(3, "is", "78"),)), ("2",)),
        (Expression("count", 0, (Condition(1, "is", "benetton"),)), None),  # no row kept
        (Expression("first", 0, (Condition(1, "is", "williams"),)), None),  # one value: nothing to aggregate
        (Expression("total", 2, ()), None),  # Blundell's points are empty
        (Expression("none", 0, (Condition(0, "greater", "3"),)), None),  # an order on names
    ],
)
def test_each_select_and_condition_evaluates_as_written(expression, value):
    assert texts(expression) == value


def test_a_statement_compares_its_value_with_its_constant_and_reads_as_it_compares():
    total = Expression("total", 2, (FERRARI,))
    assert holds(Statement(total, "is", ("10",)), GRID) is True
    assert holds(Statement(total, "greater", ("9",)), GRID) is True
    assert holds(Statement(total, "less", ("10",)), GRID) is False
    assert holds(Statement(total, "is", ("ferrari",)), GRID) is False
    assert holds(Statement(total, "greater", ("ferrari",)), GRID) is None  # an order needs numbers
    assert (
        verbalize(Statement(total, "greater", ("9",)), GRID.header)
        == "the total points when team is ferrari is greater than 9"
    )
    count = Statement(Expression("count", 0, (FERRARI, Condition(3, "less", "78"))), "is", ("1",))
    assert verbalize(count, GRID.header) == "the count when team is ferrari and laps is less than 78 is 1"
    assert holds(count, GRID) is True


def test_numbers_are_compared_as_numbers_and_orders_with_the_exact_value():
    """A number written two ways is one number; an average written to two decimals is compared exactly."""
    grid = Grid(("name", "p"), (("a", "10.0"), ("b", "1,000"), ("c", "3")))
    greatest = Expression("greatest", 1, ())
    assert texts(greatest, grid) == ("1000",) and holds(Statement(greatest, "is", ("1000",)), grid) is True
    assert holds(Statement(Expression("first", 1, ()), "is", ("10",)), grid) is True  # the cell says 10.0
    assert texts(Expression("none", 0, (Condition(1, "is", "10"),)), grid) == ("a",)
    thirds = Grid(("name", "p"), (("a", "5"), ("b", "6"), ("c", "6")))  # average 17 / 3, written 5.67
    average = Expression("average", 1, ())
    assert texts(average, thirds) == ("5.67",)
    assert holds(Statement(average, "is", ("5.67",)), thirds) is True
    assert holds(Statement(average, "less", ("5.67",)), thirds) is True  # 5.666... < 5.67
    assert holds(Statement(average, "greater", ("5.66",)), thirds) is True


def test_a_column_without_a_name_of_its_own_is_never_named():
    grid = Grid(("", "p", "p", "laps"), tuple((str(r), str(r), str(r + 1), str(r + 2)) for r in range(6)))
    for seed in range(20):
        for pair in statement_pairs(grid, 4, random.Random(seed)):
            assert set(pair.statement.expression.columns()) <= {3}, pair.text


def sample_grids() -> list[Grid]:
    sources = {kind: REPO_ROOT / "data" / f"{kind}_sample" for kind in ("hybridqa", "wtq", "sqa", "tabfact")}
    examples = {table_key(e.table): e for e in Corpus(sources).examples()}.values()
    return [grid_of(e, 30) for e in examples]


def test_every_pair_is_true_on_one_table_and_false_on_a_copy_with_one_column_shuffled():
    """On every table of the four bundled samples: the statement's verdicts, and how the copy differs."""
    pairs = 0
    for number, grid in enumerate(sample_grids()):
        for pair in statement_pairs(grid, 4, random.Random(number)):
            pairs += 1
            assert (
                holds(pair.statement, grid) is pair.verdict and holds(pair.statement, pair.flipped) is not pair.verdict
            )
            assert pair.text == verbalize(pair.statement, grid.header)
            copy = pair.flipped
            changed = [c for c in range(len(grid.header)) if copy.column(c) != grid.column(c)]
            assert len(changed) == 1 and sorted(copy.column(changed[0])) == sorted(grid.column(changed[0]))
            assert changed[0] in pair.statement.expression.columns()
    assert pairs > 300


def refuting_value(twin) -> str:
    """The value a twin's refuted statement names where the entailed one names its constant."""
    stem = twin.text[: len(twin.text) - len(", ".join(twin.statement.constant))]
    assert twin.refuted.startswith(stem) and twin.refuted != twin.text
    return twin.refuted[len(stem) :]


def test_each_twin_is_entailed_and_its_refuted_twin_names_a_value_the_table_lacks():
    """On every table of the four bundled samples, with the values of all of them: the entailed statement holds, names
    cells of the table with ``is``, and its twin names, under the same column, a value that no cell equals."""
    grids = sample_grids()
    values = column_values(grids)
    twins = 0
    for number, grid in enumerate(grids):
        cells = [cell for row in grid.rows for cell in row]
        for twin in absent_value_twins(grid, 4, random.Random(number), Grammar(), values):
            twins += 1
            expression = twin.statement.expression
            assert holds(twin.statement, grid) is True and twin.statement.comparator == "is"
            assert expression.select in CELL_SELECTS and twin.text == verbalize(twin.statement, grid.header)
            value = refuting_value(twin)
            assert value in values[normalize_text(grid.header[expression.column])]
            assert not any(same((value,), (cell,)) for cell in cells), (twin.refuted, value)
            assert holds(Statement(expression, "is", (value,)), grid) is False
            assert holds(Statement(expression, "is", tuple(part.strip() for part in value.split(","))), grid) is False
            assert expression.select not in ("lowest", "greatest") or parse_number(value) is not None
        assert absent_value_twins(grid, 4, random.Random(number), Grammar(), {}) == []  # no value to name: none
    assert twins > 300
    assert absent_value_twins(grids[0], 4, random.Random(0), Grammar(("total", "count")), values) == []  # no cells


def test_a_tables_cell_matcher_says_what_same_says_of_each_cell():
    """The sets :func:`cell_matcher` builds once give :func:`same`'s answer against any cell: numbers as numbers
    ("1,000" is "1000.0"), other texts by case and spacing, and a number against a cell that is no number ("3rd" is a
    number, "3RD" is not) as texts."""
    grid = Grid(("a", "b", "c"), (("1,000", "3RD", ""), ("Alesi ", "2.5", "4th"), ("", "x  y", "")))
    cells = [cell for row in grid.rows for cell in row if cell]
    matches = cell_matcher(grid)
    probes = [
        "1000.0",
        "1000",
        "1,000",
        "3rd",
        "3RD",
        "3",
        "alesi",
        "ALESI",
        "2.50",
        "2.499",
        "x y",
        "",
        "berger",
        "4TH",
    ]
    for text in probes + [cell for row in sample_grids()[0].rows for cell in row]:
        assert matches(text) == any(same((text,), (cell,)) for cell in cells), text
    assert [matches(text) for text in ("1000.0", "3rd", "4TH", "ALESI", "2.50", "x y", "berger")] == [
        1,
        1,
        1,
        1,
        1,
        1,
        0,
    ]


def test_a_value_that_reads_as_the_true_list_does_not_refute():
    """ "driver when team is ferrari is alesi, berger" is true read as a list, though no cell is "alesi, berger"."""
    drivers = Statement(Expression("none", 0, (FERRARI,)), "is", ("alesi", "berger"))
    assert holds(drivers, GRID) is True
    assert absent_refutation(random.Random(0), drivers, GRID, {"driver": ["alesi, berger"]}) is None
    refuted = absent_refutation(random.Random(0), drivers, GRID, {"driver": ["alesi, berger", "senna"]})
    assert refuted == "driver when team is ferrari is senna"


def test_a_tables_twins_do_not_depend_on_how_many_values_the_other_tables_offer():
    """Every column's values grown by the table's own cells, none of which can refute: the same entailed statements
    (drawing the refuted value from the table's generator would shift every later draw with the pools' sizes)."""
    grids = sample_grids()
    values = column_values(grids)
    assert column_values(grids[::-1]) == values
    for number, grid in enumerate(grids):
        own = {normalize_text(cell) for row in grid.rows for cell in row} - {""}
        grown = {name: sorted(set(texts) | own) for name, texts in values.items()}
        drawn = [absent_value_twins(grid, 4, random.Random(number), Grammar(), pool) for pool in (values, grown)]
        assert [twin.text for twin in drawn[0]] == [twin.text for twin in drawn[1]], number


def test_the_whole_grammar_draws_as_tapas_release_weighs_it_and_always_the_same():
    """The default grammar's draws, pinned on the first sample table: a change to the default draws (an rng call added,
    a select reordered) changes every synthesized corpus, and must show here."""
    pairs = statement_pairs(sample_grids()[0], 4, random.Random(0))
    assert [(p.text, p.verdict) for p in pairs] == [
        ("the first constructor is dallara - judd", True),
        ("the first time when pos is less than 5 is 1:25.893", False),
        ("constructor when gap is +4.129 and time is 1:27.389 is coloni - ford", True),
        ("the range of pos when constructor is dallara - judd and no is less than 31 is less than 7", True),
    ]


def test_a_narrower_grammar_draws_only_its_selects_conditions_and_comparators():
    """The lookups of an easier first stage, on the bundled samples' tables: only their selects, one condition at
    most, ``is`` everywhere; still a pair on most tables. The whole grammar, on the same tables, uses what they
    leave."""
    easy = Grammar(("none", "first", "last"), max_conditions=1, orders=False)
    grids = sample_grids()
    drawn, tables = {"easy": [], "whole": []}, {"easy": 0, "whole": 0}
    for number, grid in enumerate(grids):
        for name, grammar in (("easy", easy), ("whole", Grammar())):
            pairs = statement_pairs(grid, 4, random.Random(number), grammar)
            drawn[name] += [p.statement for p in pairs]
            tables[name] += bool(pairs)
    for name, statements in drawn.items():
        selects = {s.expression.select for s in statements}
        comparators = {s.comparator for s in statements}
        comparators |= {c.comparator for s in statements for c in s.expression.conditions}
        most = max(len(s.expression.conditions) for s in statements)
        if name == "easy":
            assert selects <= {"none", "first", "last"} and comparators == {"is"} and most == 1
            assert tables["easy"] >= 0.9 * len(grids) and len(statements) >= 3 * len(grids)
        else:
            assert selects > {"none", "first", "last"} and comparators > {"is"} and most == 2
    # one select given alone, and no condition, as the command line gives them
    alone = grammar_of(compose_command("synthesize", ["selects=first", "max_conditions=0"]))
    assert alone == Grammar(("first",), 0)
    for number, grid in enumerate(grids[:20]):
        for pair in statement_pairs(grid, 4, random.Random(number), alone):
            assert pair.statement.expression.select == "first" and not pair.statement.expression.conditions
    # the selects are a set: listed in another order or twice, they draw the same
    assert Grammar(("last", "none", "first", "none")) == Grammar(("none", "first", "last"))
    with pytest.raises(ValueError):
        Grammar(("median",))


def folder_bytes(run_dir) -> dict:
    return {
        path.relative_to(run_dir): path.read_bytes()
        for folder in ("data", "tokenized_data")
        for path in (run_dir / folder).rglob("*")
        if path.is_file()
    }


def synthesize(run_dir, *overrides):
    done = run_captured("synthesize", list(overrides), run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((run_dir / "synthesize.json").read_text())


def test_mate_synthesize_writes_a_tabfact_dataset_whose_statements_alone_tell_nothing(tmp_path, monkeypatch):
    """Over 20 s: four `mate synthesize` runs on the four samples' tables (the same seed twice, another once, a narrower
    grammar) and a `mate baseline`, in this process."""
    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))
    stats = synthesize(tmp_path / "run")
    reader = TabFactReader(tmp_path / "run")
    sides = {side: list(reader.questions(file)) for side, file in reader.FILES.items() if side != "test"}
    for side, name in (("train", "train"), ("dev", "validation")):
        statements = sides[side]
        assert len(statements) == stats[name]["statements"] > 50
        assert sum(s.label for s in statements) == stats[name]["entailed"] == len(statements) / 2
        by_text: dict[str, set[int]] = {}
        for statement in statements:
            by_text.setdefault(statement.question, set()).add(statement.label)
            reader.table(statement.table_id)  # every table a statement names is there, and parses
        assert all(labels == {0, 1} for labels in by_text.values())  # each text once entailed, once refuted
    keys = {side: {table_key(reader.table(s.table_id)) for s in sides[side]} for side in sides}
    assert not keys["train"] & keys["dev"]
    # each drawn table holds its statements with their verdicts on it, each copy the flipped table and the other one
    for file in ("train_examples.json", "val_examples.json"):
        entries = json.loads((tmp_path / "run" / "tokenized_data" / file).read_text())
        for name in (name for name in entries if "-" not in name):
            grid = grid_of(TableText(reader.table(name), ""), 30)
            pairs = statement_pairs(grid, 4, random.Random(f"42:{name.removesuffix('.csv')}"))
            assert entries[name][:2] == [[p.text for p in pairs], [int(p.verdict) for p in pairs]]
            for n, pair in enumerate(pairs, 1):
                assert entries[f"{name[:-4]}-{n}.csv"][:2] == [[pair.text], [int(not pair.verdict)]]
                assert (tmp_path / "run" / "data" / "all_csv" / f"{name[:-4]}-{n}.csv").read_text() == csv_text(
                    pair.flipped
                )
    # a narrower grammar on the command line (listed in another order): each table's statements are its lookups
    easy = synthesize(tmp_path / "easy", "selects=[last,none,first]", "max_conditions=1", "orders=false")
    assert set(easy["train"]["by_select"]) <= {"none", "first", "last"}
    lookups_only = {"selects": ["none", "first", "last"], "max_conditions": 1, "orders": False}
    assert easy["settings"] == {**stats["settings"], **lookups_only} != stats["settings"]
    lookups, written = Grammar(("none", "first", "last"), 1, False), 0
    for file in ("train_examples.json", "val_examples.json"):
        entries = json.loads((tmp_path / "easy" / "tokenized_data" / file).read_text())
        for name in (name for name in entries if "-" not in name):
            grid = grid_of(TableText(TabFactReader(tmp_path / "easy").table(name), ""), easy["settings"]["max_rows"])
            seed = f"{easy['settings']['seed']}:{name.removesuffix('.csv')}"
            pairs = statement_pairs(grid, easy["settings"]["statements_per_table"], random.Random(seed), lookups)
            assert entries[name][0] == [p.text for p in pairs]
            written += len(pairs)
    assert written * 2 == easy["train"]["statements"] + easy["validation"]["statements"] > 50
    # the same seed writes the same files; another seed other statements
    again = synthesize(tmp_path / "again")
    assert again == stats
    assert folder_bytes(tmp_path / "run") == folder_bytes(tmp_path / "again")
    synthesize(tmp_path / "other", "seed=7")
    assert (tmp_path / "other" / "tokenized_data" / "train_examples.json").read_bytes() != (
        tmp_path / "run" / "tokenized_data" / "train_examples.json"
    ).read_bytes()
    # what TabFact's statement-only baseline makes of it: each validation statement is once right, once wrong
    done = run_captured("baseline", ["dataset=tabfact", f"dataset.root={tmp_path / 'run'}"], tmp_path / "baseline")
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "baseline" / "metrics.json").read_text())
    assert metrics["val/accuracy"] == 0.5 and metrics["val/accuracy_statement_only"] == 0.5


def test_mate_synthesize_absent_value_writes_each_text_once_beside_its_refuted_twin(tmp_path, monkeypatch):
    """`mate synthesize refuted=absent_value` on the four samples' tables, in this process: each table's file holds
    its entailed statements, each followed by its twin naming a value the table lacks, and no copies."""
    monkeypatch.setenv("MATE_CACHE_DIR", str(tmp_path / "cache"))
    stats = synthesize(tmp_path / "run", "refuted=absent_value")
    assert stats["settings"]["refuted"] == "absent_value"
    assert set(stats["train"]["by_select"]) <= set(CELL_SELECTS)
    reader = TabFactReader(tmp_path / "run")
    texts: list[str] = []
    for file, side in (("train_examples.json", "train"), ("val_examples.json", "validation")):
        entries = json.loads((tmp_path / "run" / "tokenized_data" / file).read_text())
        assert not [name for name in entries if "-" in name]  # no shuffled copies
        assert sum(len(labels) for _, labels, _ in entries.values()) == stats[side]["statements"] > 50
        for name, (statements, labels, _) in entries.items():
            assert labels == [1, 0] * (len(labels) // 2) and len(labels) > 0
            grid = grid_of(TableText(reader.table(name), ""), 30)
            cells = [(cell,) for row in grid.rows for cell in row]
            for entailed, refuted in zip(statements[::2], statements[1::2]):
                stem = os.path.commonprefix([entailed, refuted])
                stem = stem[: stem.rfind(" is ") + 4]  # the refuted value replaces the constant after the last "is"
                value = refuted[len(stem) :]
                assert value and not any(same((value,), cell) for cell in cells), (entailed, refuted)
            assert len(statements) == len(set(statements))  # a table's texts are distinct
            texts += statements
    assert len(set(texts)) > 0.95 * len(texts)  # another table's refuted value can be this one's entailed one


@pytest.mark.parametrize(
    "override, echoed",
    [
        ("statements_per_table=0", "statements_per_table=0"),
        ("selects=[none,median]", "'median'"),
        ("selects=[]", "selects=[]"),
        ("max_conditions=-1", "max_conditions=-1"),
        ("max_conditions=true", "max_conditions=True"),
        ("orders=no", "orders=no"),
        ("refuted=maybe", "refuted=maybe"),
    ],
)
def test_mate_synthesize_refuses_settings_that_write_nothing_in_one_line(tmp_path, override, echoed):
    done = run_captured("synthesize", [override], tmp_path / "run")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and echoed in done.stderr, done.stderr
    assert not (tmp_path / "run" / "tokenized_data").exists()
