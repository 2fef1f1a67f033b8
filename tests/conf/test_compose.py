"""The config tree, in process through Hydra's compose API: every experiment and every
sweep composes, and its datamodule, model and trainer instantiate (real Hydra, the
bundled sample and MiniLM); experiments differ from the defaults only where they say."""

from __future__ import annotations

import itertools
from pathlib import Path

import lightning as L
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mate_cli.paths import CONF_DIR
from tests.inprocess import build, compose_command

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_instantiates(experiment, tmp_path, request):
    if experiment.endswith("_pretrained"):
        request.getfixturevalue("pretrained_runs")
    cfg = compose_command("train", [f"experiment={experiment}"], tmp_path)
    assert cfg.experiment_name == experiment
    datamodule, model, trainer = build(cfg, tmp_path)
    assert isinstance(datamodule, L.LightningDataModule) and isinstance(model, L.LightningModule)
    assert trainer.max_epochs == cfg.trainer.max_epochs


def sweep_jobs(name: str, tmp_path: Path) -> list[list[str]]:
    """The override lists of every job a ``+sweep=<name>`` multirun launches."""
    cfg = compose_command("train", [f"+sweep={name}"], tmp_path)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    keys = list(params)
    values = [str(params[k]).split(",") for k in keys]
    return [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_job_composes_and_instantiates(sweep, tmp_path, request):
    """Every job of the sweep is composed, and the model, data module and trainer of each
    distinct job built (jobs that differ only in their seed build the same things: once)."""
    if sweep == "sparse_pretrain":
        request.getfixturevalue("pretrained_runs")
    jobs = sweep_jobs(sweep, tmp_path)
    assert len(jobs) > 1
    seen = set()
    for job in jobs:
        default = [] if any(o.startswith("experiment=") for o in job) else ["experiment=hybridqa_mate"]
        cfg = compose_command("train", [*default, *job], tmp_path)
        what = repr(
            {k: OmegaConf.to_container(cfg[k]) for k in ("attention", "dataset", "model", "trainer", "callbacks")}
        )
        if what not in seen:
            build(cfg, tmp_path)
            seen.add(what)
    assert len(seen) > 1  # beyond the seed, the sweep changes what is built


def test_the_optuna_search_names_keys_that_exist(tmp_path):
    cfg = compose_command("train", ["experiment=hybridqa_mate", "hparams_search=optuna"], tmp_path)
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and cfg.hydra.sweeper.direction == "maximize"
    for key in cfg.hydra.sweeper.params:
        assert OmegaConf.select(cfg, key) is not None, key


def test_the_slurm_launcher_has_the_keys_users_set(tmp_path):
    cfg = compose_command(
        "train", ["+sweep=baselines", "hydra/launcher=slurm", "hydra.launcher.partition=gpu"], tmp_path
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert {"gpus_per_node", "timeout_min", "array_parallelism"} <= set(launcher)


def test_experiments_change_only_what_they_name(tmp_path):
    default = compose_command("train", [], tmp_path)
    mate = compose_command("train", ["experiment=hybridqa_mate"], tmp_path)
    tapas = compose_command("train", ["experiment=hybridqa_tapas"], tmp_path)
    reader = compose_command("train", ["experiment=hybridqa_reader"], tmp_path)
    strip = lambda c: {k: v for k, v in OmegaConf.to_container(c).items() if k not in ("hydra", "experiment_name")}  # noqa: E731
    assert strip(mate) == strip(default)
    assert strip(tapas)["attention"]["_target_"].endswith("DenseAttention")
    assert {k: v for k, v in strip(tapas).items() if k != "attention"} == {
        k: v for k, v in strip(default).items() if k != "attention"
    }
    assert reader.model.optimizer.lr == 5e-5 and reader.model.scheduler.warmup_ratio == 0.01
    assert reader.callbacks.best_checkpoint.monitor == "val/f1"
    assert default.model.optimizer.lr == 1e-5 and default.model.scheduler.warmup_ratio == 0.05
    assert default.trainer.gradient_clip_val == 10.0


@pytest.mark.parametrize("task", ["sqa", "wtq", "tabfact"])
def test_table_task_baselines_differ_from_mate_only_in_attention(task, tmp_path):
    mate = OmegaConf.to_container(compose_command("train", [f"experiment={task}_mate"], tmp_path))
    tapas = OmegaConf.to_container(compose_command("train", [f"experiment={task}_tapas"], tmp_path))
    assert tapas["attention"]["_target_"].endswith("DenseAttention")
    assert mate["attention"]["_target_"].endswith("MateAttention")
    drop = ("hydra", "experiment_name", "attention")
    assert {k: v for k, v in mate.items() if k not in drop} == {k: v for k, v in tapas.items() if k not in drop}
    assert mate["dataset"]["task"] == task and mate["callbacks"]["best_checkpoint"]["monitor"] == "val/accuracy"


def test_the_split_statistics_slice_is_the_one_the_model_scores(tmp_path):
    """dataset.long_table_tokens follows model.long_table_tokens (one threshold for the log's
    long_questions and the model's accuracy_long); TabFact's model has none, so neither has it."""
    wtq = compose_command("train", ["experiment=wtq_mate", "model.long_table_tokens=300"], tmp_path)
    assert wtq.dataset.long_table_tokens == wtq.model.long_table_tokens == 300
    assert compose_command("train", ["experiment=sqa_tapas"], tmp_path).dataset.long_table_tokens == 512
    assert compose_command("train", ["experiment=tabfact_mate"], tmp_path).dataset.long_table_tokens is None


def test_both_stages_read_one_split_node(tmp_path):
    stage1 = compose_command("train", ["experiment=hybridqa_mate", "dataset.split.seed=7"], tmp_path)
    stage2 = compose_command("train", ["experiment=hybridqa_reader", "dataset.split.seed=7"], tmp_path)
    assert stage1.dataset.split == stage2.dataset.split and stage1.dataset.split.seed == 7
    full = compose_command("train", ["dataset=hybridqa"], tmp_path)
    assert full.dataset.split.mode == "files"


def test_transformer_xh_is_in_the_baselines_sweep_and_keeps_its_graph_under_the_paper_profile(tmp_path):
    """XH differs from TAPAS only in its model and data (graph) keys, so its Hits@k compare in one sweep;
    profile=paper's 2048-token sequence length does not reach its nodes."""
    sweep = compose_command("train", ["+sweep=baselines"], tmp_path)
    assert "hybridqa_xh" in sweep.hydra.sweeper.params.experiment.split(",")

    def strip(c):
        return {
            k: v
            for k, v in OmegaConf.to_container(c).items()
            if k not in ("hydra", "experiment_name", "model", "dataset")
        }

    xh, tapas = (
        compose_command("train", ["experiment=hybridqa_xh"], tmp_path),
        compose_command("train", ["experiment=hybridqa_tapas"], tmp_path),
    )
    assert strip(xh) == strip(tapas)
    same = lambda model: {k: v for k, v in model.items() if k not in ("_target_", "hop_layers", "encoder")}  # noqa: E731
    assert same(xh.model) == same(tapas.model)
    assert {**xh.model.encoder, "max_length": None} == {**tapas.model.encoder, "max_length": None}
    assert xh.dataset.split == tapas.dataset.split and xh.dataset.root == tapas.dataset.root
    paper = compose_command("train", ["experiment=hybridqa_xh", "profile=paper"], tmp_path)
    assert paper.dataset._target_.endswith("HybridQAGraphDataModule") and paper.dataset.node_length == 128
    assert paper.model.encoder.max_length == 128  # the encoder reads 128-token nodes, not 2048-token sequences
    assert (
        paper.dataset.root
        == compose_command("train", ["experiment=hybridqa_tapas", "profile=paper"], tmp_path).dataset.root
    )


DEBUG_MODES = ("overfit", "fdr", "limit")


@pytest.mark.parametrize("debug", DEBUG_MODES)
def test_every_debug_mode_composes_on_every_experiment_and_pretraining(debug, tmp_path):
    """debug=<mode> overrides the experiment (it comes last), its trainer keys are Lightning's,
    and its loggers and checkpoint selection are the ones it documents."""
    from mate_cli.config.schema import TRAINER_RESERVED, check_trainer_args

    configs = [compose_command("train", [f"experiment={e}", f"debug={debug}"], tmp_path) for e in EXPERIMENTS]
    configs.append(compose_command("pretrain", [f"debug={debug}"], tmp_path))
    for cfg in configs:
        trainer = check_trainer_args(OmegaConf.to_container(cfg.trainer, resolve=True), TRAINER_RESERVED)
        L.Trainer(**trainer, logger=False, enable_progress_bar=False)
        if debug == "overfit":
            assert cfg.dataset.same_order_every_epoch is True and cfg.trainer.limit_train_batches == 1
            assert cfg.callbacks.best_checkpoint is None and cfg.validate_best is False
            assert cfg.trainer.log_every_n_steps == 1
        if debug in ("overfit", "fdr"):
            assert list(cfg.logger) == ["csv"], cfg.experiment_name  # no W&B run
        else:
            assert "wandb" in cfg.logger and cfg.callbacks.best_checkpoint.monitor.startswith("val/")
            assert cfg.trainer.limit_train_batches == 3 and cfg.trainer.max_epochs == 3


def test_debug_modes_keep_the_experiment_settings_they_do_not_name(tmp_path):
    plain = OmegaConf.to_container(compose_command("train", ["experiment=wtq_mate"], tmp_path))
    overfit = OmegaConf.to_container(compose_command("train", ["experiment=wtq_mate", "debug=overfit"], tmp_path))
    assert overfit["model"] == plain["model"] and overfit["attention"] == plain["attention"]
    assert {k: v for k, v in overfit["dataset"].items() if k != "same_order_every_epoch"} == {
        k: v for k, v in plain["dataset"].items() if k != "same_order_every_epoch"
    }


def test_run_name_and_tags_carry_the_overrides_that_say_what_ran(tmp_path):
    cfg = compose_command("train", ["experiment=hybridqa_mate", "model.optimizer.lr=3e-05", "attention.radius=21",
                         "seed=7", "dataset.root=/data/hybridqa", "hardware=cpu", "tags=[dev,ablation]",
                         "trainer.max_steps=5"],
                        tmp_path)  # fmt: skip
    overrides = ["lr=3e-05", "radius=21", "max_steps=5"]  # not: the name's own parts, a path, where/how it runs
    assert cfg.run_name == "hybridqa_mate-mate-bucketed-hybridqa_sample-seed7-" + ",".join(overrides)
    assert cfg.logger.wandb.name == cfg.run_name
    assert list(cfg.logger.wandb.tags) == ["hybridqa_mate", "mate", "bucketed", "hybridqa_sample", "seed7", *overrides,
                                           "dev", "ablation"]  # fmt: skip


def test_a_swept_encoder_or_start_is_in_the_name_and_a_path_never_nests_a_job_dir(tmp_path):
    """Two jobs of ``-m model.encoder.pretrained=<run A>/encoder,<run B>/encoder`` differ in name and tags (a path
    that says where, such as dataset.root, stays out), and Hydra's job subdir holds no ``/``."""
    from mate_cli.config.naming import capped, override_parts

    names = set()
    for pretrained in ("/x/outputs/pretrain/run-a1/encoder", "/x/outputs/pretrain/run-b2/encoder", "google/tapas-base"):
        cfg = compose_command("train", ["experiment=hybridqa_mate", f"model.encoder.pretrained={pretrained}"], tmp_path)
        names.add(cfg.run_name)
    assert len(names) == 3 and any(n.endswith("-pretrained=google_tapas-base") for n in names), names
    assert override_parts(["init_from=/runs/sqa-1f2e3d", "dataset.root=/data/wtq"]) == ["init_from=runs_sqa-1f2e3d"]
    assert override_parts(["init_from=/o/train/run-c3/checkpoints/last.ckpt"]) == ["init_from=train_run-c3_last.ckpt"]
    job_ckpt = "init_from=/o/multirun/train/2026-01-02_03-04-05-a1b2c3/0-lr=1e-05/checkpoints/last.ckpt"
    assert override_parts([job_ckpt]) == ["init_from=2026-01-02_03-04-05-a1b2c3_0-lr=1e-05_last.ckpt"]
    sweep_job = "model.encoder.pretrained=/o/multirun/pretrain/2026-01-02_03-04-05-a1b2c3/0-attention=mate/encoder"
    assert override_parts([sweep_job]) == ["pretrained=2026-01-02_03-04-05-a1b2c3_0-attention=mate"]
    assert capped("0-pretrained=/x/run-a1/encoder,seed=1") == "0-pretrained=_x_run-a1_encoder,seed=1"


def test_a_resume_names_the_values_it_changes_and_refuses_an_unreadable_run_config(tmp_path):
    """What `mate train ckpt_path=<run>` warns about: values of seed/attention/model/dataset, not where the data and
    cache are; a value that is another key (model.encoder.attention is ${attention}) is named once."""
    from omegaconf import open_dict

    from mate_cli.errors import MateError
    from mate_cli.run.resume import changed_on_resume

    def resolved(overrides: list[str], run_dir: Path, command: str = "train"):
        cfg = compose_command(command, overrides, run_dir)
        with open_dict(cfg):
            del cfg["hydra"]  # as the task sees it (HydraConfig holds it)
        return cfg

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    earlier = resolved(["experiment=hybridqa_mate", "attention.radius=21", "dataset.root=/elsewhere"], run)
    (run / "resolved_config.yaml").write_text(OmegaConf.to_yaml(earlier, resolve=True))
    now = resolved(["experiment=hybridqa_mate"], tmp_path / "now")
    assert changed_on_resume(now, str(run / "checkpoints" / "last.ckpt")) == ["attention.radius (21 -> 42)"]
    # pre-training's sources: a moved source is where the data is; a dropped one changes the data
    earlier = resolved(["dataset.sources.tabfact=null"], run, "pretrain")
    earlier.dataset.sources.wtq = "/another/machine/wtq"
    (run / "resolved_config.yaml").write_text(OmegaConf.to_yaml(earlier, resolve=True))
    now = resolved([], tmp_path / "now", "pretrain")
    assert changed_on_resume(now, str(run / "checkpoints" / "last.ckpt")) == ["dataset.sources.tabfact (None -> set)"]
    (run / "resolved_config.yaml").write_text("a: &x [1]\nb: *x\n")
    with pytest.raises(MateError, match="an anchor or alias"):
        changed_on_resume(now, str(run / "checkpoints" / "last.ckpt"))


def test_override_parts_keep_keys_apart_and_long_names_short():
    from mate_cli.config.naming import NAME_OVERRIDES_MAX, override_parts, overrides_name

    assert override_parts(["model.head.lr=1", "model.optimizer.lr=2", "+extra_layers.n=3", "ckpt_path=last"]) == [
        "model.head.lr=1",
        "model.optimizer.lr=2",
        "n=3",
    ]
    long = [f"model.key{i}=value{i}" for i in range(40)]
    name = overrides_name(long)
    assert len(name) <= NAME_OVERRIDES_MAX and name != overrides_name(long[:-1])


def test_early_stopping_watches_what_the_best_checkpoint_watches(tmp_path):
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    for experiment, monitor, mode in (("hybridqa_mate", "val/hits@1", "max"), ("sqa_mate", "val/accuracy", "max")):
        cfg = compose_command("train", [f"experiment={experiment}", "callbacks=early_stopping",
                                        "callbacks.early_stopping.patience=5"],
                            tmp_path)  # fmt: skip
        callbacks = {name: instantiate(c) for name, c in cfg.callbacks.items()}
        stopper = callbacks["early_stopping"]
        assert isinstance(stopper, EarlyStopping) and isinstance(callbacks["best_checkpoint"], ModelCheckpoint)
        assert (stopper.monitor, stopper.mode, stopper.patience) == (monitor, mode, 5)


def test_pretraining_starts_from_the_checkpoints_own_function(tmp_path):
    """model=mlm keeps MiniLM's absolute positions at 128 tokens and starts the six token-type tables
    it lacks at zero (docs/results.md: TAPAS's per-cell start from MiniLM learned a third as much)."""
    import torch

    cfg = compose_command("pretrain", [], tmp_path)
    encoder = instantiate(cfg.model).encoder
    assert encoder.config.reset_position_index_per_cell is False
    tables = [p for n, p in encoder.named_parameters() if n.startswith("embeddings.token_type_embeddings_")]
    assert len(tables) == 7 and torch.count_nonzero(tables[0]) > 0  # the segment table is MiniLM's
    assert all(torch.count_nonzero(t) == 0 for t in tables[1:])
