"""`mate report` on run dirs laid out as `mate train -m` leaves them (the command's own
function on a config Hydra composes, in this process: what it prints and writes), plus the
aggregation on hand-made numbers.

The tree: an attention-ablation multirun (mate, sat, dense x seeds 1-3; dense seed 3
FAILED, sat seed 2 killed before it wrote anything but ``.hydra/``), a heads-ablation
multirun (attention.row_heads_ratio 0.0 / 1.0 x seeds 1-3) and an eval run, which the
report leaves out. Expected medians and half-IQRs are worked out by hand below: for
three sorted values a <= b <= c (or two, a <= b) numpy's linear percentiles give
Q1, Q3 such that the half-IQR is (max - min) / 4.
"""

from __future__ import annotations

import csv
import shutil
import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mate_cli.errors import MateError
from mate_cli.report import aggregate, collect
from tests.inprocess import run_captured

ATTENTION = {
    "mate": {
        "_target_": "mate_cli.modeling.attention.mate.MateAttention",
        "_partial_": True,
        "variant": "bucketed",
        "impl": "auto",
        "row_heads_ratio": 0.5,
        "global_size": 116,
        "radius": 42,
    },
    "sat": {"_target_": "mate_cli.modeling.attention.sat.SatAttention", "_partial_": True, "text_only": False},
    "dense": {"_target_": "mate_cli.modeling.attention.dense.DenseAttention", "_partial_": True},
}
#: attention -> seed -> (val/hits@1, perf/examples_per_s); None: failed or incomplete
ABLATION = {
    "mate": {1: (0.30, 100.0), 2: (0.40, 110.0), 3: (0.35, 90.0)},
    "sat": {1: (0.20, 80.0), 2: None, 3: (0.28, 84.0)},
    "dense": {1: (0.10, 50.0), 2: (0.50, 60.0), 3: None},
}
HEADS = {"0.0": [0.20, 0.25, 0.30], "1.0": [0.31, 0.33, 0.32]}
OOM = "mate: failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
#: by hand: median, half-IQR = (max - min) / 4 (three seeds, or two)
EXPECTED_HITS1 = {"mate": (0.35, 0.025), "sat": (0.24, 0.02), "dense": (0.30, 0.10)}
EXPECTED_SPEED = {"mate": (100.0, 5.0), "sat": (82.0, 1.0), "dense": (55.0, 2.5)}
EXPECTED_HEADS = {"0.0": (0.25, 0.025), "0.5": (0.35, 0.025), "1.0": (0.32, 0.005)}
FAILED_JOB = "8-attention=dense,seed=3"
INCOMPLETE_JOB = "4-attention=sat,seed=2"


def write_run(folder: Path, attention: str, seed: int, overrides: list[str], metrics: dict | None,
              ratio: float | None = None, failed: str | None = None, resolved: bool = True,
              attention_settings: dict | None = None) -> None:  # fmt: skip
    """One run dir as `mate train` leaves it (``metrics`` None: no metrics.json)."""
    att = {**ATTENTION[attention], **(attention_settings or {})}
    if ratio is not None:
        att["row_heads_ratio"] = ratio
    config = {
        "task_name": "train", "experiment_name": "hybridqa_mate", "seed": seed,
        "run_name": "${mate.join:${experiment_name},${hydra:runtime.choices.attention},seed${seed}}",
        "trainer": {"max_epochs": 3, "accelerator": "cpu"},
        "dataset": {"_target_": "mate_cli.data.datamodule.HybridQADataModule",
                    "root": "${paths.data_dir}/hybridqa_sample", "max_length": 512},
        "model": {"encoder": {"attention": att, "max_length": 512}},
        "attention": att,
    }  # fmt: skip
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), folder / ".hydra" / "config.yaml")
    choices = {"experiment": "hybridqa_mate", "attention": attention, "dataset": "hybridqa_sample",
               "model": "cell_selector", "hardware": "cpu", "logger": "default"}  # fmt: skip
    OmegaConf.save(OmegaConf.create({"hydra": {"runtime": {"choices": choices}, "overrides": {"task": overrides}}}),
                   folder / ".hydra" / "hydra.yaml")  # fmt: skip
    OmegaConf.save(OmegaConf.create(overrides), folder / ".hydra" / "overrides.yaml")
    if resolved:
        config["run_name"] = f"hybridqa_mate-{attention}-seed{seed}"
        config["dataset"]["root"] = "/data/hybridqa_sample"
        OmegaConf.save(OmegaConf.create(config), folder / "resolved_config.yaml")
    if failed:
        (folder / "FAILED").write_text(failed + "\n")
    if metrics is not None:
        full = {
            **metrics,
            "best_checkpoint": str(folder / "checkpoints" / "best.ckpt"),
            "data/validation/questions": 12,
        }
        (folder / "metrics.json").write_text(json.dumps(full))


def cell_metrics(hits1: float, speed: float | None = None, memory: float | None = None) -> dict:
    out = {"val/hits@1": hits1, "val/hits@3": hits1 + 0.1, "val/loss": 2.0 - hits1}
    if speed is not None:
        out["perf/examples_per_s"] = speed
    if memory is not None:
        out["perf/peak_mem_mb"] = memory
    return out


def build_tree(outputs: Path) -> dict[str, Path]:
    """outputs/ with two train multiruns and an eval run; returns the multirun dirs."""
    ablation = outputs / "multirun" / "train" / "2026-01-01_10-00-00"
    num = 0
    for attention, seeds in ABLATION.items():
        for seed, values in seeds.items():
            job = ablation / f"{num}-attention={attention},seed={seed}"
            overrides = [
                "experiment=hybridqa_mate",
                "+sweep=attention_ablation",
                f"attention={attention}",
                f"seed={seed}",
            ]
            if values is not None:
                write_run(job, attention, seed, overrides, cell_metrics(values[0], values[1], 500.0 + 10 * seed))
            elif attention == "dense":
                write_run(job, attention, seed, overrides, None, failed=OOM)
            else:  # killed before it wrote resolved_config.yaml
                write_run(job, attention, seed, overrides, None, resolved=False)
            num += 1
    (ablation / "multirun.yaml").write_text("hydra: {}\n")
    heads = outputs / "multirun" / "train" / "2026-01-02_10-00-00"
    num = 0
    for ratio, values in HEADS.items():
        for seed, value in enumerate(values, start=1):
            overrides = [
                "experiment=hybridqa_mate",
                "+sweep=heads_ablation",
                f"attention.row_heads_ratio={ratio}",
                f"seed={seed}",
            ]
            write_run(heads / f"{num}-attention.row_heads_ratio={ratio},seed={seed}", "mate", seed, overrides,
                      cell_metrics(value), ratio=float(ratio))  # fmt: skip
            num += 1
    evaluation = outputs / "eval" / "2026-01-03_10-00-00-eval"
    (evaluation / ".hydra").mkdir(parents=True)
    OmegaConf.save(
        OmegaConf.create({"task_name": "eval", "experiment_name": "eval"}), evaluation / ".hydra" / "config.yaml"
    )
    (evaluation / "metrics.json").write_text(json.dumps({"val/hits@1": 0.99}))
    return {"ablation": ablation, "heads": heads}


@pytest.fixture(scope="module")
def tree(module_tmp) -> dict[str, Path]:
    outputs = module_tmp("runs") / "outputs"
    return {"outputs": outputs, **build_tree(outputs)}


def mate_report(args: list[str], out: Path) -> subprocess.CompletedProcess:
    """`mate report <args>` (its own function on a config Hydra composes, in this process)
    into ``<out>/report/run``: its exit status, screen and stderr."""
    from mate_cli.config.hydra_args import path_argument

    return run_captured("report", path_argument(args), out / "report" / "run")


def report_dir(out: Path) -> Path:
    (run,) = [p for p in (out / "report").iterdir() if p.is_dir()]
    return run


def csv_rows(run: Path) -> list[dict]:
    with open(run / "report.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def screen_rows(stdout: str) -> list[str]:
    """Each row of the screen's tables, its cells from every table joined by its ``#``:
    ``"│ 1 │ mate │ bucketed/auto │ 3 │ 0.3500 ± 0.0250 │ ... │"`` (a cell wrapped: its first line)."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")] if line.startswith("│") else [""]
        if cells[0]:
            rows.setdefault(cells[0], [cells[0]]).extend(cells[1:])
    return ["│ " + " │ ".join(cells) + " │" for cells in rows.values()]


def screen_row(stdout: str, number: int) -> str:
    """The screen's row ``number``."""
    (line,) = [line for line in screen_rows(stdout) if line.startswith(f"│ {number} │")]
    return line


def table_line(stdout: str, *parts: str) -> str:
    """The one screen row holding every part."""
    (line,) = [line for line in screen_rows(stdout) if all(p in line for p in parts)]
    return line


# ------------------------------------------------------------------ the CLI
@pytest.fixture(scope="module")
def ablation_report(tree, module_tmp):
    out = module_tmp("report_out")
    proc = mate_report([str(tree["ablation"])], out)  # a bare path
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, report_dir(out)


def test_the_table_has_one_row_per_configuration_with_median_and_half_iqr(ablation_report):
    proc, _ = ablation_report
    assert len(screen_rows(proc.stdout)) == 3
    assert "every row: dataset=hybridqa_sample, experiment=hybridqa_mate" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines() if line.startswith(("┃", "│", "┏", "└"))) <= 100
    assert "…" not in proc.stdout
    assert "bucketed/auto" in table_line(proc.stdout, " mate ")
    assert "0.3500 ± 0.0250" in table_line(proc.stdout, " mate ")
    assert "100.0 ± 5.0" in table_line(proc.stdout, " mate ")
    assert "520 MB ± 5.0 MB" in table_line(proc.stdout, " mate ")
    assert "0.2400 ± 0.0200" in table_line(proc.stdout, " sat ", "2 (+1 incomplete)")
    assert "0.3000 ± 0.1000" in table_line(proc.stdout, " dense ", "2 (+1 failed)")
    assert "val/hits@1" in proc.stdout and "best_checkpoint" not in proc.stdout and "data/validation" not in proc.stdout


def test_failed_and_incomplete_runs_are_listed(ablation_report):
    proc, run = ablation_report
    md = (run / "report.md").read_text()
    assert f"{FAILED_JOB}: {OOM}" in proc.stdout and INCOMPLETE_JOB in proc.stdout
    assert f"{FAILED_JOB}`: {OOM}" in md and f"{INCOMPLETE_JOB}` (no metrics.json" in md
    assert "## Failed runs (1)" in md and "## Incomplete runs (1)" in md
    assert "| 0.2000–0.2800 | 1: 0.2000, 2: incomplete, 3: 0.2800 |" in md  # killed before any last.ckpt
    assert "| 0.1000–0.5000 | 1: 0.1000, 2: 0.5000, 3: failed |" in md
    assert "| hybridqa_sample | hybridqa_mate | mate | bucketed/auto | 3 | 0.3500 ± 0.0250 |" in md


def test_csv_holds_the_hand_computed_median_and_half_iqr(ablation_report):
    _, run = ablation_report
    rows = {r["attention"]: r for r in csv_rows(run)}
    assert sorted(rows) == ["dense", "mate", "sat"]
    for attention, (median, half_iqr) in EXPECTED_HITS1.items():
        assert float(rows[attention]["val/hits@1_median"]) == pytest.approx(median, abs=1e-12)
        assert float(rows[attention]["val/hits@1_half_iqr"]) == pytest.approx(half_iqr, abs=1e-12)
        speed, spread = EXPECTED_SPEED[attention]
        assert float(rows[attention]["perf/examples_per_s_median"]) == pytest.approx(speed, abs=1e-9)
        assert float(rows[attention]["perf/examples_per_s_half_iqr"]) == pytest.approx(spread, abs=1e-9)
    assert float(rows["mate"]["val/loss_median"]) == pytest.approx(1.65, abs=1e-12)
    assert [rows[a]["val/hits@1_n"] for a in ("mate", "sat", "dense")] == ["3", "2", "2"]
    assert (rows["dense"]["runs_ok"], rows["dense"]["runs_failed"], rows["dense"]["runs_incomplete"]) == ("2", "1", "0")
    assert (rows["sat"]["runs_ok"], rows["sat"]["runs_failed"], rows["sat"]["runs_incomplete"]) == ("2", "0", "1")
    assert rows["mate"]["impl"] == "bucketed/auto" and rows["sat"]["impl"] == "-"


def test_pngs_are_written(ablation_report):
    _, run = ablation_report
    for name in ("report_val_hits_1.png", "report_perf_examples_per_s.png", "report_accuracy_vs_throughput.png"):
        data = (run / name).read_bytes()
        assert len(data) > 1000 and data.startswith(b"\x89PNG"), name


def test_an_outputs_dir_gets_one_row_per_swept_override(tree, tmp_path):
    proc = mate_report([f"path={tree['outputs']}", "main_metric=val/hits@3"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = report_dir(tmp_path)
    rows = csv_rows(run)
    assert [(r["attention"], r["attention.row_heads_ratio"]) for r in rows] == [
        ("dense", "-"),
        ("mate", "0.0"),
        ("mate", "0.5"),
        ("mate", "1.0"),
        ("sat", "-"),
    ]
    by_ratio = {r["attention.row_heads_ratio"]: r for r in rows if r["attention"] == "mate"}
    for ratio, (median, half_iqr) in EXPECTED_HEADS.items():
        assert float(by_ratio[ratio]["val/hits@1_median"]) == pytest.approx(median, abs=1e-12)
        assert float(by_ratio[ratio]["val/hits@1_half_iqr"]) == pytest.approx(half_iqr, abs=1e-12)
    metric_columns = [c for c in rows[0] if c.endswith("_median")]
    assert metric_columns[0] == "val/hits@3_median"  # the main metric first
    assert "left out 1 run(s) of other tasks (eval)" in proc.stdout
    assert "0.99" not in (run / "report.csv").read_text()
    assert "0.3200 ± 0.0050" in table_line(proc.stdout, "│ 1.0 ")


def test_a_report_written_into_the_folder_it_reads_leaves_itself_out(tree, tmp_path):
    outputs = tmp_path / "outputs"
    shutil.copytree(tree["outputs"], outputs)
    for again in ("run", "again"):  # its run dir: <outputs>/report/<run|again>; the second finds the first
        proc = run_captured("report", [f"path={outputs}"], outputs / "report" / again)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "left out 1 run(s) of other tasks (eval)" in proc.stdout, proc.stdout[-3000:]


def test_a_missing_path_is_one_line_exit_2(tmp_path):
    proc = mate_report([str(tmp_path / "nope")], tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("mate: error: path=") and "does not exist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_folder_without_runs_is_one_line_exit_2(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    proc = mate_report([str(tmp_path / "empty")], tmp_path / "out")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no train runs under" in proc.stderr


# ------------------------------------------------------------------ in process
def test_summarize_median_and_half_iqr_on_hand_made_numbers():
    s = aggregate.summarize([4, 1, 3, 2])
    assert (s.median, s.half_iqr, s.n) == (2.5, (3.25 - 1.75) / 2, 4)
    s = aggregate.summarize([0.30, 0.40, 0.35])
    assert s.median == pytest.approx(0.35) and s.half_iqr == pytest.approx(0.025) and s.n == 3
    s = aggregate.summarize([1, 2, 3, 4, 100])  # robust to the outlier: Q1 = 2, Q3 = 4
    assert (s.median, s.half_iqr) == (3.0, 1.0)
    assert aggregate.summarize([7.0]).half_iqr == 0.0
    assert aggregate.summarize([]) is None


def test_collect_reads_status_configuration_and_task(tree):
    runs, other = collect.collect(tree["outputs"])
    assert [r.task for r in other] == ["eval"]
    by_name = {r.name.rsplit("/", 1)[-1]: r for r in runs}
    assert len(runs) == 15
    assert by_name[FAILED_JOB].status == "failed" and by_name[FAILED_JOB].error == OOM
    killed = by_name[INCOMPLETE_JOB]
    assert killed.status == "incomplete" and not (killed.path / "resolved_config.yaml").exists()
    assert aggregate.base_key(killed) == {
        "experiment": "hybridqa_mate",
        "attention": "sat",
        "impl": "-",
        "dataset": "hybridqa_sample",
    }
    assert aggregate.swept_keys(runs) == ["attention.row_heads_ratio"]
    assert set(by_name["0-attention=mate,seed=1"].metrics) == {"val/hits@1", "val/hits@3", "val/loss",
                                                                 "perf/examples_per_s", "perf/peak_mem_mb",
                                                                 "data/validation/questions"}  # fmt: skip


def test_seeds_that_differ_only_by_exporting_their_encoder_are_one_configuration(tmp_path):
    for seed, extra in ((1, ["export_encoder=true"]), (2, [])):
        write_run(
            tmp_path / f"seed{seed}",
            "mate",
            seed,
            ["experiment=hybridqa_mate", f"seed={seed}", *extra],
            cell_metrics(0.1 * seed),
        )
    write_run(tmp_path / "ratio", "mate", 3, ["experiment=hybridqa_mate", "seed=3", "attention.row_heads_ratio=1.0"],
              cell_metrics(0.5), ratio=1.0)  # fmt: skip
    runs, _ = collect.collect(tmp_path)
    assert aggregate.swept_keys(runs) == ["attention.row_heads_ratio"]
    confs = aggregate.configurations(runs)
    assert sorted(len(c.runs) for c in confs) == [1, 2]
    (pair,) = [c for c in confs if len(c.runs) == 2]
    assert aggregate.summarize([r.metrics["val/hits@1"] for r in pair.runs]).median == pytest.approx(0.15)


def test_a_run_dir_that_lost_hydra_is_read_from_its_resolved_config_or_listed_as_unreadable(tree, tmp_path):
    """A heads-ablation job without .hydra/ was a row of its own (dataset "datamodule", its target's module), and its
    ratio's median was over the two other seeds. Its dataset is the one of the runs with the same dataset settings;
    with settings no other run has, it is listed as unreadable, in no row."""
    heads = shutil.copytree(tree["heads"], tmp_path / "heads")
    lost = heads / "4-attention.row_heads_ratio=1.0,seed=2"
    shutil.rmtree(lost / ".hydra")
    confs = aggregate.configurations(collect.collect(heads)[0])
    rows = [(c.key["dataset"], c.key["attention"], c.key["attention.row_heads_ratio"], c.count("ok")) for c in confs]
    assert rows == [("hybridqa_sample", "mate", "0.0", 3), ("hybridqa_sample", "mate", "1.0", 3)]
    assert confs[1].summary("val/hits@1").median == pytest.approx(EXPECTED_HEADS["1.0"][0], abs=1e-12)

    config = OmegaConf.load(lost / "resolved_config.yaml")
    config.dataset.root = "/data/elsewhere"
    OmegaConf.save(config, lost / "resolved_config.yaml")
    proc = mate_report([str(heads), "plots=false"], tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [
        (r["attention.row_heads_ratio"], r["runs_ok"], r["runs_failed"]) for r in csv_rows(report_dir(tmp_path / "out"))
    ] == [("0.0", "3", "0"), ("1.0", "2", "0")]
    assert (
        f"{lost.name}: unreadable .hydra/hydra.yaml: missing, and no other run has its dataset settings, so its "
        "configuration is unknown"
    ) in proc.stdout


def test_an_unfilled_hydra_choice_is_filled_from_hydra_yaml(tmp_path):
    job = tmp_path / "0-attention=sat,seed=1"
    write_run(job, "sat", 1, ["attention=sat", "seed=1"], None, resolved=False)
    config = OmegaConf.load(job / ".hydra" / "config.yaml")
    config.experiment_name = "${hydra:runtime.choices.model}_${hydra:runtime.choices.attention}"
    OmegaConf.save(config, job / ".hydra" / "config.yaml")
    run = collect.load_run(job, tmp_path)
    assert run.status == "incomplete" and aggregate.base_key(run)["experiment"] == "cell_selector_sat"


def test_an_unreadable_metrics_file_is_a_failed_run(tmp_path):
    job = tmp_path / "run"
    write_run(job, "mate", 1, ["seed=1"], {"val/hits@1": 0.5})
    (job / "metrics.json").write_text("{truncated")
    run = collect.load_run(job, tmp_path)
    assert run.status == "failed" and run.error.startswith("unreadable metrics.json: JSONDecodeError")
    (job / "metrics.json").write_text('{"test/acc": 0.5}')  # no val/ metric: the CSV log's last validation is read
    (job / collect.CSV_LOG).parent.mkdir(parents=True, exist_ok=True)
    (job / collect.CSV_LOG).write_text("step,val/acc\n3,n/a\n")
    run = collect.load_run(job, tmp_path)
    assert run.status == "failed" and run.error.startswith(f"unreadable {collect.CSV_LOG}: ValueError"), run.error


def test_metric_choice_and_errors(tree):
    runs, _ = collect.collect(tree["ablation"])
    metrics = aggregate.choose_metrics(runs)
    assert metrics == ["val/hits@1", "val/hits@3", "val/loss", "perf/examples_per_s", "perf/peak_mem_mb"]
    assert aggregate.main_metric(metrics) == "val/hits@1"
    assert aggregate.main_metric(["val/em", "val/f1"]) == "val/f1"
    assert aggregate.main_metric(["val/loss"]) == "val/loss"
    with pytest.raises(MateError, match="val/nope is in no run's metrics.json"):
        aggregate.choose_metrics(runs, ["val/nope"])


def test_bare_arguments_are_the_path(tmp_path):
    from mate_cli.config.hydra_args import path_argument

    job = tmp_path / "0-attention=sat,seed=1"
    job.mkdir()
    assert path_argument(["outputs/multirun/train/t", "main_metric=val/f1"]) == [
        "path='outputs/multirun/train/t'",
        "main_metric=val/f1",
    ]
    assert path_argument([str(job), "--cfg", "job"]) == [
        f"path='{job}'",
        "--cfg",
        "job",
    ]  # '=' and ',' in a job dir's name
    assert path_argument(["--info", "defaults", "runs"]) == ["--info", "defaults", "path='runs'"]
    assert path_argument(["path=x", "plots=false"]) == ["path=x", "plots=false"]
    several = path_argument(["a", "plots=false", str(job)])  # several bare folders: one list, where the first stood
    assert several == [f"path=['a','{job}']", "plots=false"] and path_argument(several) == several
    with pytest.raises(MateError, match="both bare .* and as path=b"):
        path_argument(["a", "path=b"])


def test_learning_curves_read_every_validation_of_a_run_and_its_start(tmp_path):
    from mate_cli.report.collect import Run
    from mate_cli.report.aggregate import Configuration
    from mate_cli.report.render import learning_curve, plot_learning_curves

    runs = []
    for seed, values in ((1, ("0.2", "0.4")), (2, ("0.25", "0.5"))):
        path = tmp_path / f"run{seed}"
        (path / "csv").mkdir(parents=True)
        (path / "csv" / "metrics.csv").write_text(
            "epoch,step,train/loss,val/accuracy\n0,9,1.0,\n0,99,,%s\n0,149,0.5,\n0,199,,%s\n" % values
        )
        runs.append(Run(path=path, name=path.name, metrics={"start/val/accuracy": 0.05, "val/accuracy": 0.5}))
    assert learning_curve(runs[0], "val/accuracy") == [(0, 0.05), (99, 0.2), (199, 0.4)]
    assert learning_curve(runs[0], "val/seq") == []
    key = {"experiment": "sqa_mate", "attention": "mate", "impl": "bucketed/auto", "dataset": "sqa"}
    (png,) = plot_learning_curves([Configuration(key=key, runs=runs)], "val/accuracy", tmp_path / "curve.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    assert plot_learning_curves([Configuration(key=key, runs=runs)], "val/seq", tmp_path / "none.png") == []


def test_a_run_without_final_validation_reports_its_last_logged_validation(tmp_path):
    """validate_best=false runs of older versions wrote no val/* into metrics.json: the report
    takes the last validation of their CSV log; metrics.json's own val/* win when present."""
    path = tmp_path / "run"
    (path / "csv").mkdir(parents=True)
    (path / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,val/accuracy,val/seq\n0,99,,0.10,0.01\n0,149,0.5,,\n0,199,,0.30,0.02\n0,200,0.4,,\n"
    )
    (path / "metrics.json").write_text(json.dumps({"train/loss": 0.4, "best_checkpoint": "x"}))
    run = collect.load_run(path, tmp_path)
    assert run.status == collect.OK
    assert run.metrics == {"train/loss": 0.4, "val/accuracy": 0.30, "val/seq": 0.02}
    (path / "metrics.json").write_text(json.dumps({"val/accuracy": 0.5}))
    assert collect.load_run(path, tmp_path).metrics == {"val/accuracy": 0.5}


def test_a_seed_finished_twice_is_counted_once_the_newest_and_listed(tmp_path):
    outputs = tmp_path / "outputs"
    runs = {
        "first": (1, 0.10, 1_000),
        "rerun": (1, 0.30, 2_000),
        "resumed": (2, 0.50, 1_500),
        "other": (3, 0.20, 1_200),
    }
    for name, (seed, hits, finished) in runs.items():
        extra = ["ckpt_path=last", "tags=[dev]"] if name == "resumed" else []
        write_run(
            outputs / name, "mate", seed, ["experiment=hybridqa_mate", f"seed={seed}", *extra], cell_metrics(hits)
        )
        os.utime(outputs / name / "metrics.json", (finished, finished))
    collected, _ = collect.collect(outputs)
    (conf,) = aggregate.configurations(collected)  # neither a resume nor a tag makes a configuration
    assert [r.name for r in conf.counted()] == ["other", "rerun", "resumed"]
    assert conf.summary("val/hits@1").values == (0.20, 0.30, 0.50) and conf.summary("val/hits@1").n == 3
    assert [(r.name, [o.name for o in others]) for r, others in conf.repeated()] == [("rerun", ["first"])]
    assert conf.runs_text() == "3 (+1 repeated)"

    out = tmp_path / "report_out"
    proc = mate_report([str(outputs)], out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "seed 1: counted rerun; not counted first" in proc.stdout
    assert "seed 1: counted `rerun`; not counted `first`" in (report_dir(out) / "report.md").read_text()
    (row,) = csv_rows(report_dir(out))
    assert row["runs_ok"] == "3" and float(row["val/hits@1_median"]) == pytest.approx(0.30)


def test_an_optuna_sweep_of_six_configurations_fits_100_columns_with_nothing_cut(tmp_path):
    sweep = tmp_path / "multirun" / "train" / "2026-01-04_10-00-00"
    trials = [(3.2e-05 * (i + 1), 0.01 * i, (21, 42, 84)[i % 3], (58, 116, 232)[i // 2]) for i in range(6)]
    for i, (lr, warmup, radius, global_size) in enumerate(trials):
        overrides = ["experiment=hybridqa_mate", "hparams_search=optuna", f"model.optimizer.lr={lr!r}",
                     f"model.scheduler.warmup_ratio={warmup!r}", f"attention.radius={radius}",
                     f"attention.global_size={global_size}"]  # fmt: skip
        write_run(sweep / str(i), "mate", 42, overrides, cell_metrics(0.1 + 0.05 * i, 90.0 + i, 512.0 + i),
                  attention_settings={"radius": radius, "global_size": global_size})  # fmt: skip
    out = tmp_path / "report_out"
    proc = mate_report([str(sweep)], out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = [line for line in proc.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 100, "\n".join(table)
    assert "…" not in proc.stdout
    rows = screen_rows(proc.stdout)
    assert len(rows) == 6
    for i, (lr, _, radius, global_size) in enumerate(trials):
        row = table_line(proc.stdout, f"│ {float(f'{lr:.4g}')!r} │")  # 4 significant digits on screen
        assert f"│ {radius} │" in row and f"│ {global_size} │" in row
        assert f"│ {0.1 + 0.05 * i:.4f} │" in row and f"│ {90.0 + i:.1f} │" in row  # one seed: no "± 0"
    assert "±" not in "".join(rows)
    header = next(line for line in proc.stdout.splitlines() if line.startswith("┃ # "))
    assert [c.strip() for c in header.strip("┃").split("┃")][:6] == [
        "#",
        "global_size",
        "radius",
        "lr",
        "warmup_ratio",
        "runs",
    ]


def test_plots_are_written_in_each_format_asked_for_with_readable_labels(tree, tmp_path):
    from mate_cli.report.render import metric_label

    proc = mate_report([str(tree["heads"]), "formats=[png,pdf]"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = report_dir(tmp_path)
    assert (run / "report_val_hits_1.png").read_bytes().startswith(b"\x89PNG")
    assert (run / "report_val_hits_1.pdf").read_bytes().startswith(b"%PDF")
    assert proc.stdout.strip().splitlines()[-1].endswith("report_*.{png,pdf} (6 files)")
    assert (
        metric_label("val/hits@1") == "Hits@1 (validation)" and metric_label("test/denotation") == "denotation (test)"
    )
    bad = mate_report([str(tree["heads"]), "formats=[jpeg]"], tmp_path / "bad")
    assert bad.returncode == 2 and "formats=['jpeg']: jpeg is not a plot format" in bad.stderr


def test_a_report_runs_again_into_its_own_dir_and_writes_report_md_last(tree, tmp_path):
    """`mate report <dir> hydra.run.dir=<out>` again: the claim compared the bare folder with the quoted
    path='<dir>' Hydra recorded and refused the folder. One real report (its lock and .hydra as `mate` writes them),
    then the entry point's claim of the same command line, in this process. report.md comes last, so a report dir
    without it was stopped before the end."""
    from mate_cli.run import lock as run_lock
    from mate_cli.cli import as_hydra_reads, claim_given_run_dir
    from tests.helpers import MATE, mate_env

    out = tmp_path / "report"
    args = [str(tree["outputs"]), f"hydra.run.dir={out}", "formats=[png]"]
    done = subprocess.run([MATE, "report", *args], env=mate_env(tmp_path / "outputs", tmp_path / "cache"),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for again in (args, [f"path={tree['outputs']}", *args[1:]]):  # bare, or path= unquoted: Hydra recorded path='...'
        try:
            assert claim_given_run_dir("report", as_hydra_reads("report", again))[1] is None  # its own earlier run
        finally:
            run_lock.release(out)
    other = claim_given_run_dir("report", as_hydra_reads("report", args[:2]))  # another report (other formats)
    assert "that this command did not write" in other[1], other
    written = [p for p in out.iterdir() if p.name.startswith("report") and p.suffix in (".md", ".csv", ".png")]
    assert max(written, key=lambda p: p.stat().st_mtime_ns).name == "report.md"
    assert len(written) > 2


# ------------------------------------------------------------------ real runs
# Run dirs `mate train` and `mate baseline` wrote (tests/shared_runs.py), read where they are, or copied as the jobs
# of a seed sweep: a copy's seed set in its configs and overrides as `mate train -m seed=...` records it.
def as_seed(real: Path, job: Path, seed: int, metrics: dict | None = None, last_checkpoint: bool = False) -> Path:
    """``job``: a copy of the real run dir ``real`` as the job of ``seed``, ``metrics`` updating its metrics.json (None:
    the key removed);
    its checkpoints left behind, but ``checkpoints/last.ckpt`` with ``last_checkpoint`` (a link to the real one)."""
    shutil.copytree(real, job, ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    for name in ("resolved_config.yaml", ".hydra/config.yaml"):
        config = OmegaConf.load(job / name)
        config.seed = seed
        OmegaConf.save(config, job / name)
    overrides = [o for o in OmegaConf.load(job / ".hydra" / "overrides.yaml") if not o.startswith("seed=")]
    OmegaConf.save(OmegaConf.create([*overrides, f"seed={seed}"]), job / ".hydra" / "overrides.yaml")
    hydra = OmegaConf.load(job / ".hydra" / "hydra.yaml")
    hydra.hydra.overrides.task = [*overrides, f"seed={seed}"]
    OmegaConf.save(hydra, job / ".hydra" / "hydra.yaml")
    if metrics:
        written = {**json.loads((job / "metrics.json").read_text()), **metrics}
        (job / "metrics.json").write_text(json.dumps({k: v for k, v in written.items() if v is not None}, indent=2))
    if last_checkpoint:
        (job / "checkpoints").mkdir()
        os.link(real / "checkpoints" / "last.ckpt", job / "checkpoints" / "last.ckpt")
    return job


#: the SQA sweep's jobs: seed -> what its metrics.json gets, beside what the real run wrote (None: none is left);
#: seed 2 as a run from before `mate train` recorded its minutes
SQA_SEEDS = {1: {"val/accuracy": 0.375, "time/fit_minutes": 2.5}, 2: {"time/fit_minutes": None},
             5: {"val/accuracy": 0.25, "time/fit_minutes": 3.25}, 3: None, 4: None}  # fmt: skip
#: how the SQA sweep's unfinished jobs ended: seed 3 cut (its last.ckpt kept), seed 4 failed
CUT_SEED, FAILED_SEED = 3, 4


@pytest.fixture(scope="module")
def real_folders(trained, module_tmp) -> dict[str, Path]:
    """The folders of one comparison: an SQA seed sweep (of the shared SQA run), the shared TabFact run, and each
    dataset's trivial baselines (`mate baseline` runs)."""
    sweep = module_tmp("real") / "sqa"
    for seed, metrics in SQA_SEEDS.items():
        job = as_seed(trained("sqa_task"), sweep / f"{seed - 1}-seed={seed}", seed, metrics, seed == CUT_SEED)
        if metrics is None:
            (job / "metrics.json").unlink()
        if seed == FAILED_SEED:
            (job / "FAILED").write_text(f"{OOM}\n")
    return {"sqa": sweep, "tabfact": trained("tabfact"), "baseline_sqa": trained("baseline_sqa"),
            "baseline_tabfact": trained("baseline_tabfact")}  # fmt: skip


@pytest.fixture(scope="module")
def real_report(real_folders, module_tmp):
    """`mate report` over the four folders: its screen and report dir."""
    out = module_tmp("real_report")
    proc = mate_report([*map(str, real_folders.values()), "plots=false"], out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, report_dir(out)


def counted_metrics(sweep: Path) -> dict[int, dict]:
    """The SQA sweep's finished jobs: seed -> their metrics.json."""
    jobs = [job for job in sweep.iterdir() if (job / "metrics.json").is_file()]
    return {int(OmegaConf.load(job / "resolved_config.yaml").seed): json.loads((job / "metrics.json").read_text())
            for job in jobs}  # fmt: skip


def test_several_folders_are_pooled_each_run_named_in_its_folder(real_folders, real_report):
    proc, run = real_report
    rows = {r["dataset"]: r for r in csv_rows(run)}
    assert sorted(rows) == ["sqa_sample", "tabfact_sample"]
    assert (rows["sqa_sample"]["runs_ok"], rows["sqa_sample"]["runs_failed"]) == ("3", "1")
    assert rows["sqa_sample"]["runs_incomplete"] == "1" and rows["tabfact_sample"]["runs_ok"] == "1"
    tabfact = json.loads((real_folders["tabfact"] / "metrics.json").read_text())
    assert float(rows["tabfact_sample"]["val/accuracy_median"]) == pytest.approx(tabfact["val/accuracy"], abs=1e-12)
    md = (run / "report.md").read_text()
    assert md.startswith("# mate report: " + ", ".join(f"`{folder}`" for folder in real_folders.values()))
    assert f"`sqa/{FAILED_SEED - 1}-seed={FAILED_SEED}`: {OOM}" in md  # named in its folder, after the folder
    assert f"`sqa/{CUT_SEED - 1}-seed={CUT_SEED}` (no metrics.json" in md


def test_a_missing_folder_among_several_is_one_line_exit_2(real_folders, tmp_path):
    proc = mate_report([str(real_folders["sqa"]), str(tmp_path / "nope")], tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"mate: error: path={tmp_path / 'nope'} does not exist; pass a multirun dir (outputs/multirun/train/<time>) or "
        "an outputs dir"
    )


def test_range_and_each_seeds_value_are_the_counted_runs_metrics(real_folders, real_report):
    proc, run = real_report
    values = {seed: metrics["val/accuracy"] for seed, metrics in counted_metrics(real_folders["sqa"]).items()}
    assert sorted(values) == [1, 2, 5] and len(set(values.values())) == 3
    low, high = min(values.values()), max(values.values())
    marks = {CUT_SEED: "cut", FAILED_SEED: "failed"}
    by_seed = ", ".join(
        f"{seed}: {marks[seed] if seed in marks else f'{values[seed]:.4f}'}" for seed in sorted(SQA_SEEDS)
    )
    shown = f"{low:.4f}–{high:.4f} │ {by_seed}"
    assert shown in screen_row(proc.stdout, 1)  # rows by dataset: sqa_sample, tabfact_sample
    md = (run / "report.md").read_text()
    assert f"| {shown.replace(' │ ', ' | ')}" in md and "| val/accuracy | range | by seed |" in md
    rows = {r["dataset"]: r for r in csv_rows(run)}
    sqa = rows["sqa_sample"]
    assert (float(sqa["val/accuracy_min"]), float(sqa["val/accuracy_max"])) == (low, high)
    assert sqa["val/accuracy_by_seed"] == ", ".join(
        f"{seed}: {marks[seed] if seed in marks else repr(values[seed])}" for seed in sorted(SQA_SEEDS)
    )
    tabfact = real_folders["tabfact"]  # one run: no range
    seed, value = OmegaConf.load(tabfact / "resolved_config.yaml").seed, rows["tabfact_sample"]["val/accuracy_median"]
    assert f"{float(value):.4f} │ - │ {seed}: {float(value):.4f}" in screen_row(proc.stdout, 2)


def test_unfinished_seeds_are_marked_cut_or_failed_and_not_counted(real_folders, real_report):
    proc, run = real_report
    cut, failed = (real_folders["sqa"] / f"{seed - 1}-seed={seed}" for seed in (CUT_SEED, FAILED_SEED))
    assert (cut / "checkpoints" / "last.ckpt").is_file() and not (cut / "FAILED").exists()
    assert (
        (failed / "FAILED").is_file() and not (cut / "metrics.json").exists() and not (failed / "metrics.json").exists()
    )
    row = screen_row(proc.stdout, 1)
    assert f"{CUT_SEED}: cut, {FAILED_SEED}: failed, " in row
    values = [metrics["val/accuracy"] for metrics in counted_metrics(real_folders["sqa"]).values()]
    (sqa,) = [r for r in csv_rows(run) if r["dataset"] == "sqa_sample"]
    assert sqa["val/accuracy_n"] == "3" and float(sqa["val/accuracy_median"]) == pytest.approx(sorted(values)[1])
    assert (sqa["runs_ok"], sqa["runs_failed"], sqa["runs_incomplete"]) == ("3", "1", "1")
    md = (run / "report.md").read_text()
    assert f"- `sqa/{cut.name}` (no metrics.json, no FAILED: cut: its checkpoints/last.ckpt is kept" in md
    assert f"- `sqa/{failed.name}`: {OOM}" in md


def test_each_counted_runs_minutes_are_beside_the_throughput(real_folders, real_report):
    proc, run = real_report
    counted = counted_metrics(real_folders["sqa"])
    assert "time/fit_minutes" not in counted[2] and "perf/examples_per_s" in counted[2]

    def minutes(text) -> str:
        return ", ".join(f"{seed}: "
                         f"{text(counted[seed]['time/fit_minutes']) if 'time/fit_minutes' in counted[seed] else '-'}"
                         for seed in sorted(counted))  # fmt: skip

    speeds = sorted(metrics["perf/examples_per_s"] for metrics in counted.values())
    assert f"{speeds[1]:,.1f}" in screen_row(proc.stdout, 1) and minutes(lambda v: f"{v:.1f}") in screen_row(
        proc.stdout, 1
    )
    md = (run / "report.md").read_text()
    assert "| val/accuracy | range | by seed | trivial baseline | perf/examples_per_s | minutes |" in md
    assert f" | {minutes(lambda v: f'{v:.1f}')} | " in md
    rows = {r["dataset"]: r for r in csv_rows(run)}
    assert rows["sqa_sample"]["minutes_by_seed"] == minutes(repr)
    assert float(rows["sqa_sample"]["perf/examples_per_s_median"]) == pytest.approx(speeds[1])
    tabfact = json.loads((real_folders["tabfact"] / "metrics.json").read_text())
    seed = OmegaConf.load(real_folders["tabfact"] / "resolved_config.yaml").seed
    shown = f"{seed}: {tabfact['time/fit_minutes']!r}" if "time/fit_minutes" in tabfact else "-"  # none: an older run
    assert rows["tabfact_sample"]["minutes_by_seed"] == shown


def test_each_row_has_the_trivial_baseline_of_its_data(real_folders, real_report):
    proc, run = real_report
    sqa, tabfact = (
        json.loads((real_folders[f"baseline_{task}"] / "metrics.json").read_text()) for task in ("sqa", "tabfact")
    )
    assert "val/accuracy_statement_only" in tabfact and "val/accuracy_statement_only" not in sqa
    shown = {
        "sqa": f"{sqa['val/accuracy']:.4f} ({sqa['rule']})",
        "tabfact": f"{tabfact['val/accuracy']:.4f} ({tabfact['rule']}); "
        f"{tabfact['val/accuracy_statement_only']:.4f} (statement only)",
    }
    assert shown["sqa"] in screen_row(proc.stdout, 1) and shown["tabfact"] in screen_row(proc.stdout, 2)
    md = (run / "report.md").read_text()
    assert "| by seed | trivial baseline | perf/examples_per_s |" in md
    assert f" | {shown['sqa']} | " in md and f" | {shown['tabfact']} | " in md
    rows = {r["dataset"]: r for r in csv_rows(run)}
    assert len(rows) == 2  # the baselines are no rows, nor runs left out
    assert "left out" not in proc.stdout and "Left out" not in md
    for task, metrics in (("sqa", sqa), ("tabfact", tabfact)):
        row = rows[f"{task}_sample"]
        assert (row["baseline_run"], row["baseline_rule"]) == (f"baseline_{task}", metrics["rule"])
        assert (row["baseline_metric"], float(row["baseline_value"])) == ("val/accuracy", metrics["val/accuracy"])
    assert float(rows["tabfact_sample"]["baseline_statement_only"]) == tabfact["val/accuracy_statement_only"]


def test_a_baseline_of_other_data_is_beside_no_row(real_folders, tmp_path):
    """A TabFact baseline beside SQA runs, and an SQA baseline of another root (as `mate baseline
    dataset.root=<elsewhere>` records it), are the baseline of no row."""
    elsewhere = shutil.copytree(real_folders["baseline_sqa"], tmp_path / "baselines" / "sqa_elsewhere")
    config = OmegaConf.load(elsewhere / ".hydra" / "config.yaml")
    config.dataset.root = str(tmp_path / "sqa_sample")
    OmegaConf.save(config, elsewhere / ".hydra" / "config.yaml")
    overrides = [*OmegaConf.load(elsewhere / ".hydra" / "overrides.yaml"), f"dataset.root={tmp_path / 'sqa_sample'}"]
    OmegaConf.save(OmegaConf.create(overrides), elsewhere / ".hydra" / "overrides.yaml")
    folders = [real_folders["sqa"], tmp_path / "baselines", real_folders["baseline_tabfact"]]
    proc = mate_report([*map(str, folders), "plots=false"], tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "2 trivial baseline run(s) of data no row trained on: baselines/sqa_elsewhere, baseline_tabfact" in proc.stdout
    )
    (row,) = csv_rows(report_dir(tmp_path / "out"))
    assert row["baseline_run"] == row["baseline_value"] == ""
    assert "trivial baseline |" not in (report_dir(tmp_path / "out") / "report.md").read_text()


def test_rows_go_per_dataset_first(trained, real_folders, tmp_path):
    """PointR's stage 2 (experiment hybridqa_reader, dataset hybridqa_span) sorted before its stage 1 (hybridqa_tapas,
    hybridqa_sample) by experiment; per dataset first, each dataset's rows are together whatever their experiment."""
    folders = [trained("pointr_stage2"), real_folders["sqa"], trained("pointr_stage1")]
    proc = mate_report([*map(str, folders), "main_metric=val/loss", "plots=false"], tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = csv_rows(report_dir(tmp_path / "out"))
    assert [(r["dataset"], r["experiment"]) for r in rows] == [
        ("hybridqa_sample", "hybridqa_tapas"),
        ("hybridqa_span", "hybridqa_reader"),
        ("sqa_sample", "sqa_mate"),
    ]
    header = list(rows[0])  # the dataset, the dataset.* keys that differ, then the other key columns
    assert header[:3] == ["dataset", "dataset.max_length", "experiment"] and header[3:5] == ["attention", "impl"]
    md = (report_dir(tmp_path / "out") / "report.md").read_text()
    assert md.index("\n| hybridqa_sample |") < md.index("\n| hybridqa_span |") < md.index("\n| sqa_sample |")


def test_a_shuffled_table_evaluation_is_a_metric_of_the_run_it_scored(trained, tmp_path):
    """`mate eval tables=shuffled` of a TabFact run, in a folder of the report: the newest such evaluation's ``val/*``
    metrics join that run's as ``val/<name>_shuffled_tables``. Left out (copies of that evaluation's run dir, changed
    as each would be written): an older one, one with other settings (``overrides=``), one with the run's own tables,
    and, without the run in the report, every one."""
    from tests.inprocess import run_command

    run = trained("tabfact")
    evals = tmp_path / "evals"
    newest = run_command("eval", [f"ckpt_path={run}", "tables=shuffled"], evals / "shuffled")

    def copy(name: str, metrics: dict, overrides: list[str] | None = None) -> None:
        copied = shutil.copytree(evals / "shuffled", evals / name)
        written = {k: v for k, v in {**newest, **metrics}.items() if v is not None}
        (copied / "metrics.json").write_text(json.dumps(written))
        if overrides:
            saved = OmegaConf.load(copied / ".hydra" / "overrides.yaml")
            OmegaConf.save(OmegaConf.create([*saved, *overrides]), copied / ".hydra" / "overrides.yaml")

    copy("shuffled_older", {"val/accuracy": 0.125, "val/loss": 9.0})
    os.utime(evals / "shuffled_older" / "metrics.json", (1, 1))  # written before the newest (and the run)
    copy("shuffled_other_settings", {"val/loss": 8.0}, ["overrides=['dataset.max_length=64']"])
    os.utime(evals / "shuffled_other_settings" / "metrics.json")  # the newest of all
    copy("own", {"tables": None, "val/loss": 7.0})
    proc = mate_report([str(run), str(evals), "plots=false"], tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = csv_rows(report_dir(tmp_path / "out"))
    for name in ("accuracy", "loss"):
        assert float(row[f"val/{name}_shuffled_tables_median"]) == pytest.approx(newest[f"val/{name}"], abs=1e-12)
    own = json.loads((run / "metrics.json").read_text())
    assert float(row["val/accuracy_median"]) == pytest.approx(own["val/accuracy"], abs=1e-12)
    assert "left out 3 run(s) of other tasks (eval)" in proc.stdout
    md = (report_dir(tmp_path / "out") / "report.md").read_text()
    assert "`*_shuffled_tables`: `mate eval tables=shuffled`" in md
    alone = mate_report([str(evals), "tasks=[train,eval]", "plots=false"], tmp_path / "alone")
    assert (
        alone.returncode == 0 and "_shuffled_tables" not in (report_dir(tmp_path / "alone") / "report.md").read_text()
    )
