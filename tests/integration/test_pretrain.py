"""`mate pretrain` for real: a short masked-LM run on the bundled tables from the bundled MiniLM,
its exported encoder (a TapasForMaskedLM directory with the trained weights and the same
logits), and `mate train` fine-tuning from it, by path and through the ablation experiment
(each command's own function, in process: tests/inprocess.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mate_cli.data.pretraining import MaskedCollator, PretrainDataModule
from mate_cli.modeling.encoder import TableEncoder
from mate_cli.modeling.mlm import MaskedLMHead, load_mlm_head
from tests.helpers import SOURCES
from mate_cli.errors import MateError
from tests.helpers import mate_env, run_dirs, run_mate
from tests.inprocess import run_command

transformers = pytest.importorskip("transformers")

SHORT = [
    "seed=1",
    "logger=csv",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "dataset.batch_size=4",
    "dataset.eval_masks=1",
]
#: a fine-tuning run that only needs to start from the pre-trained encoder
FINETUNE = [
    "logger=csv",
    "trainer.max_steps=1",
    "dataset.limit_questions=4",
    "dataset.max_length=128",
    "validate_best=false",
]


@pytest.fixture(scope="module")
def pretrained(module_tmp) -> dict:
    """A short `mate pretrain` run (in process), where `mate pretrain` would put it under ``outputs``.

    Over 20 s: six steps of masked-LM pre-training and its held-out scoring.
    """
    base = module_tmp("pretrain")
    run = base / "outputs" / "pretrain" / "2026-01-01_00-00-00-pretrain_mate-bucketed-bundled_tables-seed1-a1b2c3"
    metrics = run_command("pretrain", [*SHORT, f"dataset.cache_dir={base / 'cache'}"], run)
    assert json.loads((run / "metrics.json").read_text()) == metrics
    return {"run": run, "outputs": base / "outputs", "cache": base / "cache", "metrics": metrics}


def test_held_out_loss_falls_from_the_starting_checkpoint(pretrained):
    metrics = pretrained["metrics"]
    assert metrics["val/mlm_loss"] < metrics["start/val/mlm_loss"]
    assert 0.0 <= metrics["start/val/mlm_accuracy"] <= 1.0 and 0.0 <= metrics["val/mlm_accuracy"] <= 1.0
    assert metrics["perf/tokens_per_s"] > 0
    assert metrics["data/validation/tables"] > 0 and metrics["data/train/tables"] > 0
    assert metrics["exported_encoder"] == str(pretrained["run"] / "encoder")


def test_the_exported_encoder_is_the_best_checkpoint_as_tapas_for_masked_lm(pretrained):
    directory = pretrained["run"] / "encoder"
    best = torch.load(pretrained["metrics"]["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    saved = load_file(str(directory / "model.safetensors"))
    assert torch.equal(
        saved["tapas.embeddings.word_embeddings.weight"], best["encoder.embeddings.word_embeddings.weight"]
    )
    assert torch.equal(saved["cls.predictions.bias"], best["head.bias"])
    assert torch.equal(saved["cls.predictions.transform.dense.weight"], best["head.transform.dense.weight"])

    reference = transformers.TapasForMaskedLM.from_pretrained(directory).eval()
    encoder = TableEncoder.from_pretrained(directory, "dense").eval()
    head = MaskedLMHead(encoder.config, encoder.embeddings.word_embeddings).eval()
    assert load_mlm_head(head, str(directory))
    dm = PretrainDataModule(sources=SOURCES, pretrained=str(directory), cache_dir=str(pretrained["outputs"] / "c"))
    dm.setup("validate")
    data = dm.masked("validation")
    batch = MaskedCollator(dm.pad_id)([data[i] for i in range(6)])
    with torch.no_grad():
        expected = reference(
            input_ids=batch.input_ids,
            attention_mask=batch.layout.attention_mask.long(),
            token_type_ids=batch.layout.token_type_ids,
        ).logits
        logits = head(encoder(batch.input_ids, batch.layout))
    assert (logits - expected).abs()[batch.layout.attention_mask].max().item() <= 1e-5


def test_mate_train_fine_tunes_from_the_pretrained_encoder(pretrained, monkeypatch, tmp_path):
    monkeypatch.setenv("MATE_OUTPUT_DIR", str(pretrained["outputs"]))  # where the ablation arm finds its run
    cache = f"dataset.cache_dir={pretrained['cache']}"
    by_path, by_experiment = tmp_path / "by_path", tmp_path / "by_experiment"
    run_command(
        "train",
        ["experiment=hybridqa_mate", f"model.encoder.pretrained={pretrained['run']}/encoder", *FINETUNE, cache],
        by_path,
    )
    run_command("train", ["experiment=hybridqa_mate_sparse_pretrained", *FINETUNE, cache], by_experiment)
    for run in (by_path, by_experiment):  # the resolved config records the pre-trained directory
        assert f"pretrained: {pretrained['run']}/encoder" in (run / "resolved_config.yaml").read_text()
    assert "experiment_name: hybridqa_mate_sparse_pretrained" in (by_experiment / "resolved_config.yaml").read_text()


def test_the_ablation_arm_without_its_pretraining_run_is_one_line(pretrained, monkeypatch, tmp_path):
    monkeypatch.setenv("MATE_OUTPUT_DIR", str(pretrained["outputs"]))
    with pytest.raises(MateError) as err:
        run_command("train", ["experiment=hybridqa_mate_dense_pretrained", "logger=csv"], tmp_path / "run")
    assert str(err.value).startswith("no finished `mate pretrain` run of experiment 'pretrain_dense'"), err.value
    assert "run `mate pretrain attention=dense` first" in str(err.value) and "\n" not in str(err.value)


def test_a_missing_corpus_file_is_one_line(tmp_path):
    with pytest.raises(MateError) as err:
        run_command(
            "pretrain",
            [
                "dataset=pretrain_jsonl",
                f"dataset.sources.jsonl={tmp_path}/absent.jsonl",
                "logger=csv",
                f"dataset.cache_dir={tmp_path / 'cache'}",
            ],
            tmp_path / "run",
        )
    assert str(err.value) == (
        f"corpus file not found: {tmp_path}/absent.jsonl; pass an existing JSON-lines file "
        '(each line: {"text": str, "table": {"header": [str, ...], "rows": [[str, ...], ...]}})'
    )
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["mate", "dense"])
def test_a_few_hundred_steps_lower_the_held_out_loss_and_raise_accuracy(attention, tmp_path, record_property):
    """The acceptance run: 200 steps of 8 examples from the bundled MiniLM (whose MLM head starts
    fresh), scored on the held-out tables before and after; the numbers go to the test report."""
    env = mate_env(tmp_path / "outputs", tmp_path / "cache")
    result = run_mate(
        ["pretrain", f"attention={attention}", "logger=csv", "trainer.max_steps=200", "dataset.batch_size=8"],
        env,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "outputs", "pretrain")
    metrics = json.loads((run / "metrics.json").read_text())
    shown = {
        k: round(metrics[k], 4)
        for k in (
            "start/val/mlm_loss",
            "val/mlm_loss",
            "start/val/mlm_accuracy",
            "val/mlm_accuracy",
            "perf/tokens_per_s",
        )
    }
    record_property(f"pretrain[{attention}]", json.dumps(shown))
    print(f"pretrain attention={attention}: {json.dumps(shown)}")
    assert metrics["val/mlm_loss"] < metrics["start/val/mlm_loss"] - 1.0
    assert metrics["val/mlm_accuracy"] > metrics["start/val/mlm_accuracy"] + 0.01  # measured: 0.0004 -> 0.031 (mate)


def test_the_ablation_resolver_finds_the_newest_finished_run(pretrained, monkeypatch):
    from mate_cli.errors import MateError
    from mate_cli.config.naming import pretrained_run

    monkeypatch.setenv("MATE_OUTPUT_DIR", str(pretrained["outputs"]))
    assert pretrained_run("pretrain_mate") == str(pretrained["run"].resolve() / "encoder")
    unfinished = pretrained["outputs"] / "pretrain" / "2999-01-01_00-00-00-pretrain_mate-bucketed-x"
    job = pretrained["outputs"] / "multirun" / "pretrain" / "2998-01-01_00-00-00" / "1-attention=mate"
    try:
        (unfinished / "checkpoints").mkdir(parents=True)  # started later, no encoder/ yet: not it
        assert pretrained_run("pretrain_mate") == str(pretrained["run"].resolve() / "encoder")
        (job / "encoder").mkdir(parents=True)  # a later sweep job of the same experiment: found there too
        (job / "encoder" / "config.json").write_text((pretrained["run"] / "encoder" / "config.json").read_text())
        (job / "resolved_config.yaml").write_text("seed: 1\nexperiment_name: pretrain_mate\n")
        assert pretrained_run("pretrain_mate") == str(job.resolve() / "encoder")
        (job / ".hydra").mkdir()  # a debug=fdr job (one step) is never the one to fine-tune from
        (job / ".hydra" / "overrides.yaml").write_text("- attention=mate\n- debug=null\n")  # no debug mode
        assert pretrained_run("pretrain_mate") == str(job.resolve() / "encoder")
        (job / ".hydra" / "overrides.yaml").write_text("- attention=mate\n- debug=fdr\n")
        assert pretrained_run("pretrain_mate") == str(pretrained["run"].resolve() / "encoder")
        with pytest.raises(MateError, match="run `mate pretrain attention=sat` first"):
            pretrained_run("pretrain_sat")
    finally:  # the module's other tests fine-tune from the real run
        shutil.rmtree(unfinished, ignore_errors=True)
        shutil.rmtree(pretrained["outputs"] / "multirun", ignore_errors=True)


def test_a_corpus_given_to_mate_train_is_one_line(tmp_path):
    with pytest.raises(MateError) as err:
        run_command("train", ["dataset=pretrain_sample", "logger=csv"], tmp_path / "run")
    assert str(err.value) == (
        "dataset=pretrain_sample does not go with model=cell_selector: `mate pretrain` reads "
        "dataset=pretrain_sample or pretrain_jsonl, `mate train` the task datasets"
    )
