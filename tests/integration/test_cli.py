"""The real `mate` CLI end to end: Hydra composition, Lightning Trainer, W&B offline,
the bundled sample and the bundled MiniLM, outputs in tmp dirs.

`mate` runs as a subprocess where the process is the point: what a terminal shows, Hydra's
own help and ``--cfg``, a multirun, exit statuses and ``FAILED``, what the once-per-process
log lines say, shell completion. Everything else calls the command's own function on a
config Hydra composes, in this process (tests/inprocess.py)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mate_cli.errors import MateError
from tests.helpers import MATE, mate_env, run_mate
from tests.inprocess import main_before_hydra, run_command

SMOKE = [
    "experiment=hybridqa_mate",
    "trainer.max_steps=3",
    "trainer.log_every_n_steps=1",
    "dataset.max_length=128",
    "dataset.eval_batch_size=16",
]


#: the smoke run also exports its encoder, validates once during fit (so it has a best
#: checkpoint), asks for a test (the sample's test.json has no answers: skipped, said once)
#: and logs its progress at every step (by default: every minute)
SMOKE_EXTRA = [
    "export_encoder=true",
    "trainer.val_check_interval=2",
    "test_after_training=true",
    "callbacks.progress_log.every_n_steps=1",
]


def mate(args: list[str], tmp: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`mate <args>` with outputs and caches under ``tmp``; a first arg that is not a command means `train`."""
    if not args or args[0] not in ("train", "pretrain", "eval", "pointr", "predict", "bench"):
        args = ["train", *args]
    return run_mate(args, mate_env(tmp / "outputs", tmp / "cache", HOME=str(tmp / "home")), timeout)


def only_run_dir(base: Path) -> Path:
    dirs = [p for p in base.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def smoke(module_tmp) -> tuple[Path, subprocess.CompletedProcess]:
    """One smoke run; its stdout holds stdout and stderr interleaved, as a terminal shows them,
    written to a file as ``nohup mate train ... > log`` writes it.

    Over 20 s: a real `mate train` process, since what a terminal shows is the point.
    """
    tmp = module_tmp("train")
    env = mate_env(tmp / "outputs", tmp / "cache", HOME=str(tmp / "home"))
    with open(tmp / "log", "w", encoding="utf-8") as log:
        proc = subprocess.run(
            [MATE, "train", *SMOKE, *SMOKE_EXTRA], env=env, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=600
        )
    proc.stdout = (tmp / "log").read_text(encoding="utf-8")
    assert proc.returncode == 0, proc.stdout[-3000:]
    return tmp, proc


@pytest.fixture(scope="module")
def trained_run(smoke) -> Path:
    return only_run_dir(smoke[0] / "outputs" / "train")


@pytest.fixture(scope="module")
def sample_cache(module_tmp) -> Path:
    """One preprocessing cache for this module's in-process runs on the HybridQA sample (its
    entries are keyed by what they were built from, so runs of other settings add their own)."""
    return module_tmp("sample-cache")


def test_the_run_dir_holds_every_log_and_its_files_are_readable(smoke, trained_run):
    home = smoke[0] / "home"
    assert not [p for p in home.rglob("*") if "wandb" in str(p)], "W&B wrote outside the run dir"
    assert list(trained_run.glob("wandb/cache/wandb/logs/core-debug-*.log"))
    for name in ("metrics.json", "resolved_config.yaml", "checkpoints/last.ckpt"):
        assert (trained_run / name).stat().st_mode & 0o044 == 0o044, name


#: what a training run says it wrote, in its last lines (`wandb run` also names the sync command)
OUTPUTS = ("run dir", "metrics", "best checkpoint", "last checkpoint", "encoder", "csv log", "wandb run")


def outputs_printed(stdout: str) -> dict[str, str]:
    """``name: path`` from the last lines of a command's output."""
    found = {}
    for line in reversed(stdout.strip().splitlines()):
        name, sep, value = line.partition(":")
        if not sep or name not in OUTPUTS:
            break
        found[name] = value.strip()
    return found


def progress_bar_line(line: str) -> bool:
    return (
        line.lstrip().startswith("Epoch ") or "━" in line or line.strip().startswith(("train/", "val/", "v_num", "0."))
    )


def test_train_ends_with_the_final_metrics_and_where_every_output_went(smoke, trained_run):
    lines = [line for line in smoke[1].stdout.strip().splitlines() if line.strip()]
    printed = outputs_printed(smoke[1].stdout)
    assert list(printed) == list(reversed(OUTPUTS)), printed
    assert printed["run dir"] == str(trained_run)
    for name in ("metrics", "best checkpoint", "last checkpoint", "encoder", "csv log"):
        assert Path(printed[name]).exists() and Path(printed[name]).is_relative_to(trained_run), (name, printed[name])
    wandb_dir, sync = printed["wandb run"].split(" (offline: upload with ")
    assert Path(wandb_dir).is_dir() and sync == f"`wandb sync {wandb_dir}`)"
    assert any("final validation" in line for line in lines[-20:])
    assert any("val/hits@1" in line for line in lines[-20:])


def test_a_training_run_says_little_and_its_piped_output_is_never_cut(smoke, trained_run):
    """Piped (as nohup or SLURM write it): at most 40 lines besides the progress bar, the
    overrides and run dir at the start, every path whole, each log record once."""
    lines = [line for line in smoke[1].stdout.splitlines() if line.strip() and not progress_bar_line(line)]
    assert len(lines) <= 40, "\n".join(lines)
    assert lines[0] == "overrides: " + " ".join([*SMOKE, *SMOKE_EXTRA])
    assert lines[1] == f"run dir:   {trained_run}"
    assert not any("…" in line for line in lines), "a line was cut"
    # a record printed twice (two handlers) repeats its timestamp too; two validations of one batch may
    # print the same message in different milliseconds
    logged = [line for line in lines if "] - " in line]
    assert len(logged) == len(set(logged)), "a log record printed twice"
    assert not any("Warning" in line or "warn(" in line for line in lines), "a third-party warning reached the screen"
    log = (trained_run / "train.log").read_text()
    assert "config (resolved):" in log and "max_length: 128" in log, "the whole config goes into the run's log"


def test_a_run_dir_named_with_letters_beyond_ascii_holds_the_run(smoke):
    """``hydra.run.dir='<folder>'``, quoted as mate's error line advises for such a name: the run trains there (mate
    handed the folder back to Hydra unquoted, its lexer failed on the ü, and the folder kept only its lock file).
    One step on the smoke run's data: its preprocessing cache is reused."""
    tmp = smoke[0]
    folder = tmp / "résultats" / "ü"
    args = [*SMOKE[:1], "trainer.max_steps=1", *SMOKE[3:], "logger=csv", "validate_best=false"]
    proc = run_mate(["train", *args, f"hydra.run.dir='{folder}'"], mate_env(tmp / "outputs-ü", tmp / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"run dir:   {folder}" in proc.stdout.splitlines()
    assert (folder / "metrics.json").is_file() and (folder / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp / "outputs-ü").exists()


def test_a_run_logged_to_a_file_says_how_far_preprocessing_training_and_validation_are(smoke):
    """Under ``nohup mate train ... > log`` the bar draws nothing: progress comes as lines
    (every step here, every minute by default; preprocessing every 10 s and at its end)."""
    lines = smoke[1].stdout.splitlines()
    for split in ("train", "validation"):
        assert sum(f"] - {split}: preprocessing " in line for line in lines) == 1, split
        assert sum(f"] - {split}: " in line and " questions preprocessed in " in line for line in lines) == 1, split
    progress = [line.split("progress: ", 1)[1] for line in lines if "progress: " in line]
    steps = [p for p in progress if p.startswith("step ")]
    assert [p.split(",")[0] for p in steps] == ["step 1/3", "step 2/3", "step 3/3"], progress
    assert all(all(k in p for k in ("epoch 0", "train/loss", "examples/s", "steps/s", "elapsed")) for p in steps), steps
    assert steps[0].endswith(" left"), steps
    validations = [p for p in progress if p.startswith("validation batch ")]
    # two validations (step 2 and the final one), each line up to the last batch of the loop
    ends = [p for p in validations if p.split(",")[0].split()[-1].split("/")[0] == p.split(",")[0].split("/")[-1]]
    assert len(ends) == 2 and all("examples/s" in p and "elapsed" in p for p in validations), validations


def test_help_lists_commands(capsys, monkeypatch):
    code, out, _ = main_before_hydra(["--help"], capsys, monkeypatch)
    assert code == 0
    for command in ("train", "eval", "pointr", "predict", "bench"):
        assert command in out


#: `mate <args>` in a fresh interpreter through the entry point's function, then which of the
#: heavy modules it imported (the flags that only answer import none of them)
ANSWER_PROBE = (
    "import atexit, sys; from mate_cli.cli import main; atexit.register(lambda: print('imported:', "
    "sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))); sys.exit(main(sys.argv[1:]))"
)


def answer(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(MATE).parent / "python"), "-c", ANSWER_PROBE, *args],
        capture_output=True,
        text=True,
        env=mate_env(tmp_path / "outputs"),
        timeout=120,
    )


def test_train_help_shows_config_groups_without_importing_torch(tmp_path):
    """A real process: Hydra's own help, answered without the command's module (torch, Lightning)."""
    proc = answer(["train", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for group in ("dataset:", "model:", "attention:", "hardware:", "experiment:"):
        assert group in proc.stdout
    assert "imported: []" in proc.stdout


def test_cfg_job_prints_the_overridden_config_without_importing_torch(tmp_path):
    """The CLI hands overrides to Hydra (composition itself is tested in tests/conf); `--resolve`
    resolves mate's own interpolations; with -m it is one line."""
    proc = answer(
        ["train", "--cfg", "job", "--resolve", "experiment=hybridqa_tapas", "dataset.max_length=256"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "experiment_name: hybridqa_tapas" in proc.stdout and "DenseAttention" in proc.stdout
    assert "max_length: 256" in proc.stdout and "run_name: hybridqa_tapas-dense-hybridqa_sample-seed42" in proc.stdout
    assert "imported: []" in proc.stdout
    proc = mate(["--cfg", "job", "-m", "seed=1,2"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mate: error: --cfg shows the config of one run: drop -m and give each key one value"
    ), proc.stderr


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

    from mate_cli.pretrained import load_tokenizer

    model = TapasModel.from_pretrained(trained_run / "encoder").eval()
    tokenizer = load_tokenizer(str(trained_run / "encoder"))
    ids = torch.tensor([tokenizer.encode("which driver finished third ?")])
    out = model(input_ids=ids, token_type_ids=torch.zeros(*ids.shape, 7, dtype=torch.long))
    assert torch.isfinite(out.last_hidden_state).all()
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6


def test_eval_of_the_run_dir_reproduces_validation_metrics(trained_run: Path, tmp_path: Path, capsys):
    """`mate eval ckpt_path=<run dir>` (its own function, in process) evaluates the checkpoint
    `mate train` validated and gives the same numbers, then says where it wrote them."""
    train_metrics = json.loads((trained_run / "metrics.json").read_text())
    eval_dir = tmp_path / "eval"
    capsys.readouterr()
    metrics = run_command("eval", [f"ckpt_path={trained_run}"], eval_dir)
    out = capsys.readouterr().out
    assert "hits@1" in out
    assert out.strip().splitlines()[-2:] == [f"run dir: {eval_dir}", f"metrics: {eval_dir / 'metrics.json'}"]
    assert json.loads((eval_dir / "metrics.json").read_text()) == metrics
    assert metrics["ckpt_path"] == train_metrics["best_checkpoint"]
    evaluated = Path(metrics["ckpt_path"])  # which state was scored: its step and its file's digest
    assert metrics["ckpt_step"] == torch.load(evaluated, weights_only=True)["global_step"]
    assert metrics["ckpt_sha256"] == hashlib.sha256(evaluated.read_bytes()).hexdigest()[:16]
    assert "overrides" not in metrics  # the run's own config (a second decoding's change is recorded apart)
    for key in ("val/hits@1", "val/hits@3", "val/hits@5", "val/loss"):
        assert metrics[key] == pytest.approx(train_metrics[key], abs=1e-6), key


def test_eval_of_a_split_without_answers_is_refused_in_one_line(trained_run: Path, tmp_path: Path):
    """HybridQA's released test.json has no answers: nothing to score (it scored 0 with a NaN loss)."""
    with pytest.raises(MateError, match=r"^split=test: none of the \d+ questions of .* has an answer to score"):
        run_command("eval", [f"ckpt_path={trained_run}", "split=test"], tmp_path / "eval")
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_the_best_checkpoint_keeps_weights_only_and_is_refused_for_resume(trained_run: Path, tmp_path: Path):
    (best,) = trained_run.glob("checkpoints/best-*.ckpt")
    last = trained_run / "checkpoints" / "last.ckpt"
    assert best.stat().st_size < 0.5 * last.stat().st_size, "the best checkpoint holds no optimiser state"
    with pytest.raises(MateError) as err:
        run_command("train", ["experiment=hybridqa_mate", f"ckpt_path={best}"], tmp_path / "run")
    line = str(err.value)
    assert "holds the weights only" in line and f"ckpt_path={trained_run}" in line and "\n" not in line


def test_every_backend_trains_a_few_steps(tmp_path: Path, sample_cache: Path):
    """mate and dense (the first check) plus every other trainable backend, one step each,
    through `mate train`'s own function in process (the multirun launcher is tested in
    test_sweep); the data is prepared once, for all of them.

    Over 20 s: five trainings, each building its encoder.
    """
    backends = ["mate", "dense", "sat", "linformer", "table_etc"]
    own = {"linformer": ["attention.k=64"]}  # the paper's k=256 needs max_length >= 256
    by_backend = {}
    for backend in backends:
        run = tmp_path / backend
        by_backend[backend] = run_command(
            "train",
            [
                *SMOKE,
                "trainer.max_steps=1",
                f"attention={backend}",
                *own.get(backend, []),
                "logger=csv",
                f"dataset.cache_dir={sample_cache}",
            ],
            run,
        )
        assert not list(run.glob("wandb")), "logger=csv must run without W&B"
        assert f"attention: {backend}" in (run / ".hydra" / "overrides.yaml").read_text().replace("=", ": ")
    for backend, metrics in by_backend.items():
        assert all(math.isfinite(metrics[k]) for k in ("val/loss", "val/hits@1", "val/hits@5")), backend
    assert by_backend["mate"]["val/loss"] != by_backend["dense"]["val/loss"]


@pytest.fixture
def attention_choices(monkeypatch, caplog):
    """The implementation choices MATE's attention logs from now on (it logs each once per
    process: the record of those said before this test is set aside)."""
    import logging

    from mate_cli.modeling.attention import mate as mate_attention

    monkeypatch.setattr(mate_attention, "LOGGED_CHOICES", set())
    caplog.set_level(logging.INFO, logger=mate_attention.logger.name)
    return lambda: [r.getMessage() for r in caplog.records if r.getMessage().startswith("mate attention variant=")]


def test_train_with_a_chosen_mate_impl_runs_it_and_logs_progress_lines(
    tmp_path: Path, sample_cache: Path, attention_choices
):
    """`mate train attention.impl=eager` (in process): the asked-for implementation runs every call, nothing is
    replaced; off a terminal, progress comes as log lines."""
    run = tmp_path / "run"
    metrics = run_command("train", [*SMOKE, "trainer.max_steps=2", "attention.impl=eager", "logger=csv",
                                    "callbacks.progress_log.every_n_seconds=0",
                                    f"dataset.cache_dir={sample_cache}"], run)  # fmt: skip
    assert all(math.isfinite(metrics[k]) for k in ("val/loss", "val/hits@1")), metrics
    assert "impl: eager" in (run / "resolved_config.yaml").read_text()
    assert attention_choices() == []  # a forced implementation that runs is not logged
    # stdout is not a terminal here (as under nohup): progress comes as log lines, one per step at interval 0
    progress = [
        line.split("progress: ", 1)[1]
        for line in (run / "train.log").read_text().splitlines()
        if "progress: step" in line
    ]
    assert [p.split(",")[0] for p in progress] == ["step 1/2", "step 2/2"], progress
    assert all("train/loss" in p and "steps/s" in p for p in progress) and progress[0].endswith("left"), progress


def test_train_takes_a_step_with_mate_in_the_triton_kernels(tmp_path: Path, sample_cache: Path):
    """`mate train attention.impl=triton` (its own function, in process), attention dropout
    on: without a GPU the kernels run in Triton's interpreter (this process was started
    with TRITON_INTERPRET=1, tests/conftest.py), so the wiring from the config to the
    kernels and their backward is exercised end to end; a tiny batch keeps it to seconds."""
    pytest.importorskip("triton")
    run = tmp_path / "run"
    metrics = run_command("train", ["experiment=hybridqa_mate", "attention.impl=triton", "trainer.max_steps=1",
                                    "dataset.max_length=64", "dataset.batch_size=2", "dataset.eval_batch_size=2",
                                    "dataset.limit_questions=2", "trainer.limit_val_batches=1", "validate_best=false",
                                    "logger=csv", f"dataset.cache_dir={sample_cache}"], run)  # fmt: skip
    assert all(math.isfinite(metrics[k]) for k in ("train/loss", "val/loss", "val/hits@1")), metrics
    assert "impl: triton" in (run / "resolved_config.yaml").read_text()


def test_train_in_bf16_on_cpu_runs_mates_fused_kernel(tmp_path: Path, sample_cache: Path, attention_choices):
    """`mate train trainer.precision=bf16-mixed` on CPU (its own function, in process): q, k,
    v reach MATE in bf16 (CPU autocast) and `impl=auto` still takes the fused kernel (float32
    math inside), not the bf16 torch path; the run ends with finite metrics.

    Over 20 s: CPU autocast to bf16 costs time on a CPU without bf16 instructions.
    """
    from mate_cli.modeling.attention.mate import cpu_kernel as mate_cpu_kernel

    metrics = run_command(
        "train",
        [
            *SMOKE,
            "trainer.max_steps=1",
            "trainer.precision=bf16-mixed",
            "logger=csv",
            f"dataset.cache_dir={sample_cache}",
        ],
        tmp_path / "run",
    )
    assert all(math.isfinite(metrics[k]) for k in ("val/loss", "val/hits@1")), metrics
    impl = "kernel" if mate_cpu_kernel.available() else "eager"
    choices = [line for line in attention_choices() if "variant=bucketed" in line]
    assert choices and all(f"using '{impl}' on cpu" in line for line in choices), choices


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "choice, named, options",
    [
        ("experiment=nope", "experiment=nope", ["hybridqa_mate"]),
        ("attention=nope", "attention=nope", ["mate", "dense"]),
        ("+debug=nope", "+debug=nope", ["overfit", "limit"]),  # an option the command's defaults do not hold
        ("model/encoder=nope", "model/encoder=nope", ["pretrained"]),  # a group inside another group's option
        ("attention=mate,dense,nope", "attention=nope", ["mate", "dense"]),  # a sweep's: no context before it
    ],
)
def test_an_unknown_group_choice_lists_the_options(choice, named, options, capsys, monkeypatch):
    """Hydra's own error lists the options over several lines; mate says it in one."""
    code, _, err = main_before_hydra(["train", "-m", choice], capsys, monkeypatch)
    assert code == 2 and err.startswith(f"mate: error: {named} is not a config option; choose one of: "), err
    assert all(option in err for option in options) and err.count("\n") == 1, err


def test_missing_dataset_root_is_one_line_naming_override(tmp_path):
    """The real process: a user error inside a command is one line on stderr, exit status
    2, ``FAILED`` holding that line and the run's log the line with its exit status."""
    proc = mate([*SMOKE, f"dataset.root={tmp_path}/absent"], tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("mate: error")]
    assert len(lines) == 1 and "dataset.root=" in lines[0] and "absent" in lines[0]
    assert "Traceback" not in proc.stderr
    run = only_run_dir(tmp_path / "outputs" / "train")  # the failed run says so, in its dir and its log
    assert (run / "FAILED").read_text().strip() == lines[0]
    assert f"{lines[0]} (exit status 2)" in (run / "train.log").read_text()


@pytest.mark.parametrize(
    "args, fix",
    [
        (
            ["pretrain", "dataset=pretrain_jsonl", "dataset.sources.jsonl={tmp}/none.jsonl"],
            "pass an existing JSON-lines file",
        ),
        (["pointr", "stage1.ckpt_path={tmp}/none.ckpt", "stage2.ckpt_path=null"], "pass ckpt_path="),
        (["predict", "ckpt_path={tmp}/none.ckpt", "table={tmp}/t.csv", "question=q"], "pass ckpt_path="),
        (["bench", "bench.targets=[{kind: faster}]"], "choose one of speedup"),
        (["baseline", "dataset=hybridqa_sample"], "dataset=hybridqa_sample is not one: use dataset=<task> or"),
    ],
    ids=["pretrain", "pointr", "predict", "bench", "baseline"],
)
def test_every_commands_app_ends_a_user_error_in_one_line_and_failed(args, fix, tmp_path):
    """Each command's Hydra app besides train's (whose real process is above) and eval's (its
    run-dir test), in process on the composed config: it hands the task to run_task, which
    turns an error found inside the command into one line on stderr, exit status 2, FAILED
    and the line with its exit status in the run's log."""
    from tests.inprocess import run_app

    run = tmp_path / "run"
    code, err = run_app(args[0], [arg.replace("{tmp}", str(tmp_path)) for arg in args[1:]], run)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("mate: error: ") and fix in lines[0], err[-3000:]
    assert (run / "FAILED").read_text().strip() == lines[0]
    assert f"{lines[0]} (exit status 2)" in (run / f"{args[0]}.log").read_text()


def copy_sample(sample_root: Path, tmp: Path) -> Path:
    root = tmp / "sample"
    shutil.copytree(sample_root, root)
    return root


def train_error(args: list[str], tmp: Path) -> str:
    """The one-line user error of `mate train <args>` (its own function, in process)."""
    with pytest.raises(MateError) as err:
        run_command("train", [*args, f"dataset.cache_dir={tmp / 'cache'}"], tmp / "run")
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_malformed_question_record_names_file_and_id(sample_root, tmp_path):
    root = copy_sample(sample_root, tmp_path)
    path = root / "released_data" / "dev.traced.json"
    records = json.loads(path.read_text())
    qid = records[3]["question_id"]
    del records[3]["table_id"]
    path.write_text(json.dumps(records))
    line = train_error([*SMOKE, f"dataset.root={root}"], tmp_path)
    assert "dev.traced.json" in line and qid in line, line


def test_malformed_table_file_names_table(sample_root, tmp_path):
    root = copy_sample(sample_root, tmp_path)
    records = json.loads((root / "released_data" / "dev.traced.json").read_text())
    table_id = records[0]["table_id"]
    (root / "WikiTables-WithLinks" / "tables_tok" / f"{table_id}.json").write_text("{not json")
    line = train_error([*SMOKE, f"dataset.root={root}"], tmp_path)
    assert table_id in line, line


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


def test_a_test_split_without_answers_is_skipped_in_one_line(smoke, trained_run: Path):
    said = [line for line in smoke[1].stdout.splitlines() if "test_after_training:" in line]
    assert len(said) == 1 and "skipped, the test split's 15 questions have no answers" in said[0]
    assert not [k for k in json.loads((trained_run / "metrics.json").read_text()) if k.startswith("test/")]


def test_keep_best_encoder_keeps_the_best_as_a_transformers_directory_only(tmp_path: Path, sample_cache: Path):
    run = tmp_path / "run"
    metrics = run_command(
        "train",
        [
            "experiment=hybridqa_mate",
            "trainer.max_steps=1",
            "dataset.max_length=128",
            "logger=csv",
            "trainer.val_check_interval=1",
            "keep_best=encoder",
            f"dataset.cache_dir={sample_cache}",
        ],
        run,
    )
    assert "/best-" in metrics["best_checkpoint"] and not Path(metrics["best_checkpoint"]).exists()
    assert metrics["best_kept_as"] == str(run / "encoder") and (run / "encoder" / "config.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]  # still resumable


def test_a_metrics_row_shows_rates_with_4_decimals_and_question_counts_whole(capsys):
    from mate_cli.commands.common import print_metrics

    print_metrics("wtq", {"val/accuracy": 0.5, "val/long_questions": 4.0}, ["val/accuracy", "val/long_questions"])
    out = capsys.readouterr().out
    assert "0.5000" in out and " 4 " in out and "4.0000" not in out, out
