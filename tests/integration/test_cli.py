"""The real `mate` CLI end to end: Hydra composition, Lightning Trainer, W&B offline,
the bundled sample and the bundled MiniLM. Runs as subprocesses, outputs in tmp dirs."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import MATE, mate_env, run_mate

SMOKE = [
    "experiment=hybridqa_mate",
    "trainer.max_steps=3",
    "trainer.log_every_n_steps=1",
    "dataset.max_length=128",
    "dataset.eval_batch_size=16",
]


def mate(args: list[str], tmp: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`mate <args>` with outputs and caches under ``tmp``; a first arg that is not a command means `train`."""
    if not args or args[0] not in ("train", "eval", "pointr", "predict", "bench"):
        args = ["train", *args]
    return run_mate(args, mate_env(tmp / "outputs", tmp / "cache", HOME=str(tmp / "home")), timeout)


def only_run_dir(base: Path) -> Path:
    dirs = [p for p in base.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One smoke run; its stdout holds stdout and stderr interleaved, as a terminal shows them."""
    tmp = tmp_path_factory.mktemp("train")
    env = mate_env(tmp / "outputs", tmp / "cache", HOME=str(tmp / "home"))
    proc = subprocess.run([MATE, "train", *SMOKE, "export_encoder=true"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return tmp, proc


@pytest.fixture(scope="module")
def trained_run(smoke) -> Path:
    return only_run_dir(smoke[0] / "outputs" / "train")


def test_the_run_dir_holds_every_log_and_its_files_are_readable(smoke, trained_run):
    home = smoke[0] / "home"
    assert not [p for p in home.rglob("*") if "wandb" in str(p)], "W&B wrote outside the run dir"
    assert list(trained_run.glob("wandb/cache/wandb/logs/core-debug-*.log"))
    for name in ("metrics.json", "resolved_config.yaml", "checkpoints/last.ckpt"):
        assert (trained_run / name).stat().st_mode & 0o044 == 0o044, name


def test_train_ends_with_the_final_metrics_and_where_they_are(smoke, trained_run):
    lines = [line for line in smoke[1].stdout.strip().splitlines() if line.strip()]
    assert lines[-1].split() == ["metrics:", str(trained_run / "metrics.json")]
    assert lines[-2].startswith("best checkpoint: ") and lines[-2].split()[-1].startswith(str(trained_run))
    assert any("final validation" in line for line in lines[-12:])
    assert any("val/hits@1" in line for line in lines[-12:])


def test_help_lists_commands():
    proc = subprocess.run([MATE, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for command in ("train", "eval", "pointr", "predict", "bench"):
        assert command in proc.stdout


def test_train_help_shows_config_groups(tmp_path):
    proc = subprocess.run([MATE, "train", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for group in ("dataset:", "model:", "attention:", "hardware:", "experiment:"):
        assert group in proc.stdout


def test_cfg_job_prints_the_overridden_config(tmp_path):
    """The CLI hands overrides to Hydra (composition itself is tested in tests/conf)."""
    proc = mate(["--cfg", "job", "experiment=hybridqa_tapas", "dataset.max_length=256"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "experiment_name: hybridqa_tapas" in proc.stdout and "DenseAttention" in proc.stdout
    assert "max_length: 256" in proc.stdout


def test_train_smoke_writes_checkpoints_csv_wandb_and_finite_metrics(trained_run: Path):
    ckpts = {p.name for p in (trained_run / "checkpoints").iterdir()}
    assert "last.ckpt" in ckpts
    assert (trained_run / ".hydra" / "config.yaml").is_file()
    assert (trained_run / "resolved_config.yaml").is_file()
    rows = list(csv.DictReader(open(trained_run / "csv" / "metrics.csv")))
    assert any(r.get("train/loss") for r in rows)
    offline = list((trained_run / "wandb").glob("offline-run-*"))
    assert offline, "expected an offline W&B run directory"
    metrics = json.loads((trained_run / "metrics.json").read_text())
    for key in ("val/hits@1", "val/hits@3", "val/hits@5", "val/loss", "perf/examples_per_s", "perf/tokens_per_s"):
        assert math.isfinite(metrics[key]), key
    assert metrics["perf/examples_per_s"] > 0 and metrics["perf/tokens_per_s"] > metrics["perf/examples_per_s"]
    assert metrics["perf/peak_mem_mb"] > 100
    assert metrics["val/hits@1"] <= metrics["val/hits@3"] <= metrics["val/hits@5"]
    assert metrics["data/train/questions"] > 0 and metrics["data/validation/questions"] > 0


def test_exported_encoder_loads_in_transformers(trained_run: Path):
    import torch
    from transformers import TapasModel

    from mate_cli.modeling.checkpoints import load_tokenizer

    model = TapasModel.from_pretrained(trained_run / "encoder").eval()
    tokenizer = load_tokenizer(str(trained_run / "encoder"))
    ids = torch.tensor([tokenizer.encode("which driver finished third ?")])
    out = model(input_ids=ids, token_type_ids=torch.zeros(*ids.shape, 7, dtype=torch.long))
    assert torch.isfinite(out.last_hidden_state).all()
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6


def test_eval_reproduces_validation_metrics(trained_run: Path, tmp_path: Path):
    """`mate eval` of the checkpoint `mate train` validated gives the same numbers."""
    train_metrics = json.loads((trained_run / "metrics.json").read_text())
    proc = mate(["eval", f"ckpt_path={train_metrics['best_checkpoint']}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hits@1" in proc.stdout
    eval_dir = only_run_dir(tmp_path / "outputs" / "eval")
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    for key in ("val/hits@1", "val/hits@3", "val/hits@5", "val/loss"):
        assert metrics[key] == pytest.approx(train_metrics[key], abs=1e-6), key


def test_multirun_every_backend_trains_a_few_steps(tmp_path: Path):
    """One sweep: mate and dense (the first check) plus every other trainable backend."""
    backends = ["mate", "dense", "sat", "linformer", "table_etc"]
    # Linformer's paper k=256 needs max_length >= 256.
    args = ["-m", *SMOKE, "dataset.max_length=256", "trainer.max_steps=2", f"attention={','.join(backends)}", "logger=csv"]
    proc = mate(args, tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = only_run_dir(tmp_path / "outputs" / "multirun" / "train")
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.json").exists())
    assert len(runs) == len(backends), list(sweep.iterdir())
    by_backend = {}
    for run in runs:
        backend = run.name.split("attention=")[1].split(",")[0]
        by_backend[backend] = json.loads((run / "metrics.json").read_text())
        assert not list(run.glob("wandb")), "logger=csv must run without W&B"
    assert set(by_backend) == set(backends)
    for backend, metrics in by_backend.items():
        assert all(math.isfinite(metrics[k]) for k in ("val/loss", "val/hits@1", "val/hits@5")), backend
    assert by_backend["mate"]["val/loss"] != by_backend["dense"]["val/loss"]


# ------------------------------------------------------------------ bad input
def test_unknown_experiment_lists_options(tmp_path):
    proc = mate(["experiment=nope"], tmp_path)
    assert proc.returncode != 0
    assert "hybridqa_mate" in proc.stderr and "nope" in proc.stderr


def test_unknown_attention_lists_options(tmp_path):
    proc = mate(["attention=nope"], tmp_path)
    assert proc.returncode != 0
    assert "mate" in proc.stderr and "dense" in proc.stderr and "nope" in proc.stderr


def test_missing_dataset_root_is_one_line_naming_override(tmp_path):
    proc = mate([*SMOKE, f"dataset.root={tmp_path}/absent"], tmp_path)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("mate: error")]
    assert len(lines) == 1 and "dataset.root=" in lines[0] and "absent" in lines[0]
    assert "Traceback" not in proc.stderr
    run = only_run_dir(tmp_path / "outputs" / "train")  # the failed run says so, in its dir and its log
    assert (run / "FAILED").read_text().strip() == lines[0]
    assert lines[0] in (run / "train.log").read_text()


def copy_sample(sample_root: Path, tmp: Path) -> Path:
    root = tmp / "sample"
    shutil.copytree(sample_root, root)
    return root


def test_malformed_question_record_names_file_and_id(sample_root, tmp_path):
    root = copy_sample(sample_root, tmp_path)
    path = root / "released_data" / "dev.traced.json"
    records = json.loads(path.read_text())
    qid = records[3]["question_id"]
    del records[3]["table_id"]
    path.write_text(json.dumps(records))
    proc = mate([*SMOKE, f"dataset.root={root}"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "dev.traced.json" in proc.stderr and qid in proc.stderr
    assert "Traceback" not in proc.stderr


def test_malformed_table_file_names_table(sample_root, tmp_path):
    root = copy_sample(sample_root, tmp_path)
    records = json.loads((root / "released_data" / "dev.traced.json").read_text())
    table_id = records[0]["table_id"]
    (root / "WikiTables-WithLinks" / "tables_tok" / f"{table_id}.json").write_text("{not json")
    proc = mate([*SMOKE, f"dataset.root={root}"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert table_id in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tab_completion_of_a_command(tmp_path):
    """`eval "$(mate -sc install=bash)"`, then <TAB> after `mate train dataset=hy`: Hydra's
    completion of train's config, asked as `COMP_LINE=... mate train -sc query=bash`."""
    env = mate_env(tmp_path / "outputs", COMP_LINE="mate train dataset=hy")
    query = run_mate(["train", "-sc", "query=bash"], env, timeout=120)
    assert query.returncode == 0, query.stderr
    assert set(query.stdout.split()) >= {"dataset=hybridqa", "dataset=hybridqa_sample"}
    env = mate_env(tmp_path / "outputs")
    env["PATH"] = f"{Path(MATE).parent}:{env['PATH']}"
    script = """eval "$(mate -sc install=bash)"
    tab() { COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; COMPREPLY=(); _mate_completion; echo "${COMPREPLY[*]}"; }
    tab "mate tr"; tab "mate train hardware=ddp"; tab "mate eval spl"
    """
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines() == ["train", "hardware=ddp hardware=ddp_cpu", "split="]
