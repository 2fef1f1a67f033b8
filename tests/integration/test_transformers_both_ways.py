"""transformers both ways: a TAPAS task directory (``TapasForQuestionAnswering`` for SQA and WikiTQ,
``TapasForSequenceClassification`` for TabFact, as Google's published checkpoints are) scored as it is by `mate eval`
and `mate predict`; a trained run written by `mate export` as one, which transformers' classes and its
``table-question-answering`` pipeline load, and which `mate eval` scores back to the run's own metrics.

The task directories are small random transformers models saved here (no hub at test time); the trained run is a
shared dense SQA run on the bundled sample (tests/shared_runs.py). Logits are compared under dense attention on the
padded validation batches of the bundled samples, real tokens only (the one documented difference: TAPAS counts
padding in the question's cell, mate in none)."""

from __future__ import annotations

import csv
import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from mate_cli.errors import MateError
from tests.helpers import REPO_ROOT
from tests.inprocess import run_app, run_command

transformers = pytest.importorskip("transformers")

#: as the encoder and head parity tests (tests/modeling/test_tapas_heads.py: relative above 1)
TOLERANCE = 1e-5
WTQ_HEAD = dict(num_aggregation_labels=4, use_answer_as_supervision=True, answer_loss_cutoff=0.664694,
                cell_selection_preference=0.207951, huber_loss_delta=0.121194, temperature=0.0352513)  # fmt: skip
CLASSES = {"sqa": "TapasForQuestionAnswering", "wtq": "TapasForQuestionAnswering",
           "tabfact": "TapasForSequenceClassification"}  # fmt: skip


def task_directory(path: Path, task: str, seed: int = 0, **config) -> Path:
    """A random transformers TAPAS model of ``task``'s head saved at ``path`` with the bundled vocabulary, its weights
    drawn wide, so its logits and operators differ from example to example."""
    from mate_cli.pretrained import bundled_model_dir

    settings = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=512)  # fmt: skip
    settings.update(WTQ_HEAD if task == "wtq" else {})
    settings.update(config)
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[task])(transformers.TapasConfig(**settings))
    with torch.no_grad():  # wider than BERT's 0.02: attention that is not uniform, examples that differ
        for name, param in model.named_parameters():
            if "LayerNorm" not in name:
                param.copy_(torch.randn_like(param) * (0.2 if name.startswith("tapas.") else 0.5))
    model.save_pretrained(path)
    shutil.copy(bundled_model_dir() / "vocab.txt", path)
    return path


def scaled_diff(ours: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |ours - expected| relative to the value's size (absolute below 1)."""
    return float(((ours - expected).abs() / expected.abs().clamp(min=1.0)).max())


def unpadded(batch):
    """Each example of ``batch`` alone, cut to its real tokens (padding comes last)."""
    from dataclasses import replace

    from mate_cli.layout import TableLayout

    for i in range(len(batch)):
        one = batch.select([i])
        length = int(one.layout.attention_mask.sum())
        assert bool(one.layout.attention_mask[0, :length].all())
        layout = TableLayout(**one.layout.map_tensors(lambda t: t[:, :length]))
        yield replace(one, input_ids=one.input_ids[:, :length], layout=layout)


def logit_pairs(model, reference, batches, task: str, limit: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(ours, transformers')`` logits (and WikiTQ's aggregation logits) of the first ``limit`` examples of
    ``batches``, each unpadded."""
    pairs = []
    for one in itertools.islice((one for batch in batches for one in unpadded(batch)), limit):
        with torch.no_grad():
            ours = model(one)
            theirs = reference(input_ids=one.input_ids, attention_mask=one.layout.attention_mask.long(),
                               token_type_ids=one.layout.token_type_ids)  # fmt: skip
        if task == "tabfact":
            pairs.append((ours, theirs.logits))
            continue
        pairs.append((ours.logits, theirs.logits))
        if task == "wtq":
            pairs.append((ours.aggregation_logits, theirs.logits_aggregation))
    return pairs


def validation_logits(directory: Path, cfg, cache: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`logit_pairs` over ``cfg``'s validation split, the model built as `mate eval` builds it from ``cfg`` and
    transformers' class loaded from ``directory``."""
    from hydra.utils import instantiate

    model = instantiate(cfg.model).eval()
    datamodule = instantiate(cfg.dataset, cache_dir=str(cache))
    datamodule.setup("validate")
    task = str(cfg.dataset.task)
    reference = getattr(transformers, CLASSES[task]).from_pretrained(directory).eval()
    return logit_pairs(model, reference, datamodule.val_dataloader(), task)


@pytest.mark.parametrize("task", ["sqa", "wtq", "tabfact"])
def test_a_task_directory_scores_as_transformers_computes_it_and_evaluates(task, tmp_path):
    from mate_cli.run.task_directory import task_directory as read_directory, task_run_config

    directory = task_directory(tmp_path / f"tapas_{task}", task)
    found = read_directory(str(directory))
    assert found.task == task
    cfg = task_run_config(found, [f"dataset.cache_dir={tmp_path / 'cache'}"])
    assert cfg.model.pooling == "cls" and "dense" in cfg.model.encoder.attention._target_
    pairs = validation_logits(directory, cfg, tmp_path / "cache")
    assert pairs and all(ours.shape == theirs.shape for ours, theirs in pairs)
    assert max(scaled_diff(ours, theirs) for ours, theirs in pairs) <= TOLERANCE
    tops = [float(theirs[theirs > -1000].max()) for _, theirs in pairs if bool((theirs > -1000).any())]
    assert max(tops) - min(tops) > 0.01  # the logits differ from example to example

    run = tmp_path / "eval"
    metrics = run_command("eval", [f"ckpt_path={directory}", f"overrides=['dataset.cache_dir={tmp_path / 'cache'}']"],
                          run)  # fmt: skip
    assert 0.0 <= metrics["val/accuracy"] <= 1.0 and metrics["val/loss"] > 0
    assert metrics["ckpt_path"] == str(directory.resolve()) and len(metrics["ckpt_sha256"]) == 16
    assert "ckpt_step" not in metrics  # a directory has no training step
    written = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    assert written["val/accuracy"] == metrics["val/accuracy"]
    if task != "tabfact":
        assert (run / "predictions.tsv").is_file() or (run / "predictions.csv").is_file()


def test_a_task_directory_head_settings_decide_and_an_override_names_one_to_change_it(tmp_path):
    from mate_cli.run.task_directory import task_directory as read_directory, task_run_config

    directory = task_directory(tmp_path / "tapas_wtq", "wtq", temperature=0.5, cell_selection_preference=0.3)
    found = read_directory(str(directory))
    cfg = task_run_config(found, [])
    from hydra.utils import instantiate

    module = instantiate(cfg.model)
    assert (module.head_config.temperature, module.head_config.cell_selection_preference) == (0.5, 0.3)
    changed = instantiate(task_run_config(found, ["model.head.temperature=0.25"]).model)
    assert (changed.head_config.temperature, changed.head_config.cell_selection_preference) == (0.25, 0.3)
    other = instantiate(task_run_config(found, ["attention=mate"]).model)
    assert type(other.encoder.backends[0]).__name__ == "MateAttention"


def test_predict_answers_with_a_task_directory(tmp_path, capsys):
    directory = task_directory(tmp_path / "tapas_wtq", "wtq")
    table = REPO_ROOT / "data" / "wtq_sample" / "csv" / "204-csv" / "106.csv"
    result = run_command(
        "predict", [f"ckpt_path={directory}", f"table={table}", "question=how many years are listed?"], tmp_path / "p"
    )
    assert result["task"] == "wtq" and result["aggregation"] in ("NONE", "SUM", "AVERAGE", "COUNT")
    written = json.loads((tmp_path / "p" / "prediction.json").read_text(encoding="utf-8"))
    assert written["question"] == result["question"]


@pytest.mark.parametrize(
    "case, config, overrides, expected",
    [
        ("another task", {}, ["dataset=sqa_sample"], r"is a TapasForQuestionAnswering for WikiTQ, and SQA"),
        ("three operators", {"num_aggregation_labels": 3}, [], r"num_aggregation_labels=3; WikiTQ's classifies 4"),
        ("three verdicts", {"num_labels": 3}, [], r"its classifier has 3 labels; TabFact's has 2"),
        ("no head", "TapasModel", [], r"a transformers directory of TapasModel, not a TAPAS task model"),
        ("a head cut short", "cut", [], r"holds no output_weights: its TapasForQuestionAnswering head is incomplete"),
    ],
)
def test_a_head_that_does_not_fit_is_one_line_and_exit_2(case, config, overrides, expected, tmp_path):
    directory = tmp_path / "tapas"
    if config == "TapasModel":
        task_directory(directory, "sqa")
        config_file = directory / "config.json"
        settings = json.loads(config_file.read_text(encoding="utf-8"))
        config_file.write_text(json.dumps({**settings, "architectures": ["TapasModel"]}), encoding="utf-8")
    elif config == "cut":
        from safetensors.torch import load_file, save_file

        task_directory(directory, "sqa")
        state = load_file(directory / "model.safetensors")
        save_file({k: v for k, v in state.items() if k != "output_weights"}, directory / "model.safetensors")
    else:
        task_directory(directory, "tabfact" if "num_labels" in config else "wtq", **config)
    code, err = run_app("eval", [f"ckpt_path={directory}", f"overrides={overrides}"], tmp_path / "eval")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("mate: error: ") and re.search(expected, lines[0]), lines[0]


# ------------------------------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """The shared dense SQA run exported once: ``(run dir, export dir)``."""
    run = trained("sqa_dense")
    out = tmp_path_factory.mktemp("export")
    result = run_command("export", [f"ckpt_path={run}"], out / "job")
    return run, Path(result["directory"])


def test_export_writes_a_directory_transformers_loads_with_the_runs_logits(exported, tmp_path):
    from mate_cli.run.task_directory import task_directory as read_directory, task_run_config
    from mate_cli.run.tapas_export import MARKER

    run, directory = exported
    assert directory.name == "model" and (directory.parent / "export.json").is_file()
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["TapasForQuestionAnswering"] and config["num_aggregation_labels"] == 0
    card = (directory / "README.md").read_text(encoding="utf-8")
    assert MARKER in card and "`sqa_tapas`" in card and "`dense`" in card
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    assert type(tokenizer).__name__ == "TapasTokenizer" and max(tokenizer.get_vocab().values()) < config["vocab_size"]
    # transformers' model against the run rebuilt from its checkpoint, on the run's own data settings
    from hydra.utils import instantiate
    from mate_cli.run.rebuild import load_run_config, run_checkpoint

    run_cfg = load_run_config(run_checkpoint(run))
    model = instantiate(run_cfg.model).eval()
    model.load_state_dict(torch.load(run_checkpoint(run), weights_only=True)["state_dict"])
    reference = transformers.TapasForQuestionAnswering.from_pretrained(directory).eval()
    datamodule = instantiate(run_cfg.dataset, cache_dir=str(tmp_path / "cache"))
    datamodule.setup("validate")
    pairs = logit_pairs(model, reference, datamodule.val_dataloader(), "sqa")
    diffs = [scaled_diff(ours, theirs) for ours, theirs in pairs]
    selected = sum(int((theirs > 0).sum()) for _, theirs in pairs)
    assert max(diffs) <= TOLERANCE and selected > 0  # cells pass 0.5 in both
    # the directory read back stands for the run: its task, the run's head settings
    found = read_directory(str(directory))
    assert found.task == "sqa" and instantiate(task_run_config(found, []).model).head_config == model.head_config


def test_the_pipeline_answers_the_sample_questions_as_mate_predict(exported, tmp_path):
    pandas = pytest.importorskip("pandas")
    from mate_cli.pipelines.table_task import predict_table_question, read_task_table
    from mate_cli.lit_modules.table_qa import TableQAModule
    from mate_cli.run.rebuild import load_trained

    run, directory = exported
    trained = load_trained(str(run), [], TableQAModule, "predict", torch.device("cpu"))
    pipeline = transformers.pipeline("table-question-answering", model=str(directory))
    root = REPO_ROOT / "data" / "sqa_sample"
    with open(root / "train.tsv", encoding="utf-8") as handle:
        questions = [q for q in csv.DictReader(handle, delimiter="\t") if q["position"] == "0"]
    compared = answered = 0
    for question in questions[:12]:
        table = read_task_table("sqa", root / question["table_file"])
        ours = predict_table_question(trained, table, question["question"], torch.device("cpu"), None)
        if ours["truncated"]:  # the two tokenizers cut a long table differently
            continue
        frame = pandas.DataFrame([[c.text for c in row] for row in table.rows], columns=[h.text for h in table.header])
        theirs = pipeline(table=frame, query=question["question"])
        assert sorted(map(tuple, theirs["coordinates"])) == sorted((c["row"], c["column"]) for c in ours["cells"])
        compared += 1
        answered += bool(ours["cells"])
    assert compared >= 5 and answered >= 3


def test_a_round_trip_reproduces_the_runs_metrics_exactly(exported, tmp_path):
    run, directory = exported
    cache = f"dataset.cache_dir={tmp_path / 'cache'}"
    of_run = run_command("eval", [f"ckpt_path={run}", f"overrides=['{cache}']"], tmp_path / "run")
    of_export = run_command("eval", [f"ckpt_path={directory}", f"overrides=['dataset.max_length=256','{cache}']"],
                            tmp_path / "export")  # fmt: skip
    scored = {k: v for k, v in of_run.items() if k.startswith("val/")}
    assert scored and scored == {k: v for k, v in of_export.items() if k.startswith("val/")}


def test_export_of_a_mate_run_says_which_attention_computes_it_and_round_trips(trained, tmp_path):
    run = trained("wtq_task")
    written = Path(run_command("export", [f"ckpt_path={run}", f"directory={tmp_path / 'wtq'}"], tmp_path / "job")[
        "directory"])  # fmt: skip
    config = json.loads((written / "config.json").read_text(encoding="utf-8"))
    assert config["num_aggregation_labels"] == 4 and config["aggregation_labels"]["3"] == "COUNT"
    assert "overrides=['attention=mate']" in (written / "README.md").read_text(encoding="utf-8")
    cache = f"dataset.cache_dir={tmp_path / 'cache'}"
    of_run = run_command("eval", [f"ckpt_path={run}", f"overrides=['{cache}']"], tmp_path / "run")
    from mate_cli.run.rebuild import load_run_config, run_checkpoint

    recorded = load_run_config(run_checkpoint(run))
    data = recorded.dataset
    same = ["attention=mate", f"dataset.max_length={data.max_length}", f"dataset.root={data.root}", cache]
    of_export = run_command("eval", [f"ckpt_path={written}", f"overrides={same}"], tmp_path / "export")
    scored = {k: v for k, v in of_run.items() if k.startswith("val/")}
    assert scored and scored == {k: v for k, v in of_export.items() if k.startswith("val/")}


def test_export_refuses_a_folder_it_did_not_write_and_a_model_transformers_cannot_hold(exported, trained, tmp_path):
    run, _ = exported
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me", encoding="utf-8")
    code, err = run_app("export", [f"ckpt_path={run}", f"directory={foreign}"], tmp_path / "job1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "did not write" in err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]  # nothing half-written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine")]
    # an earlier export's folder is replaced
    again = tmp_path / "again"
    run_command("export", [f"ckpt_path={run}", f"directory={again}"], tmp_path / "job2")
    (again / "left.txt").write_text("from the first export's time", encoding="utf-8")
    run_command("export", [f"ckpt_path={run}", f"directory={again}"], tmp_path / "job3")
    assert (again / "model.safetensors").is_file() and not (again / "left.txt").exists()
    # a model whose head reads the mean of the last states: transformers' TAPAS heads read the pooler
    wtq, mean = trained("wtq_task"), "overrides=['model.pooling=mean']"
    code, err = run_app("export", [f"ckpt_path={wtq}", mean, f"directory={tmp_path / 'tf'}"], tmp_path / "job4")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "model.pooling=mean" in err, err
    assert not (tmp_path / "tf").exists()


def test_a_tabfact_model_exports_to_a_sequence_classifier_with_its_logits(tmp_path):
    """A TabFact module of [CLS] through the pooler (built from a random TAPAS TabFact directory, as `mate eval`
    builds it) exported: transformers' TapasForSequenceClassification gives its logits."""
    from hydra.utils import instantiate

    from mate_cli.pretrained import load_tokenizer
    from mate_cli.run.rebuild import TrainedRun
    from mate_cli.run.tapas_export import export_run
    from mate_cli.run.task_directory import task_directory as read_directory, task_run_config

    source = task_directory(tmp_path / "tapas_tabfact", "tabfact", seed=3)
    cfg = task_run_config(read_directory(str(source)), [f"dataset.cache_dir={tmp_path / 'cache'}"])
    model = instantiate(cfg.model).eval()
    trained = TrainedRun(cfg=cfg, model=model, ckpt_path=str(source), tokenizer=load_tokenizer(cfg.dataset.pretrained))
    written, architecture = export_run(trained, tmp_path / "out")
    assert architecture == "TapasForSequenceClassification"
    assert json.loads((written / "config.json").read_text(encoding="utf-8"))["id2label"] == {
        "0": "Refuted",
        "1": "Entailed",
    }
    pairs = validation_logits(written, cfg, tmp_path / "cache")
    assert max(scaled_diff(ours, theirs) for ours, theirs in pairs) <= TOLERANCE


def test_a_hub_id_is_tried_only_where_no_folder_of_its_first_part_is_here(tmp_path, monkeypatch):
    from mate_cli.run.task_directory import task_directory as read_directory

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    assert read_directory("outputs/missing_run") is None  # a run path under a folder that is here
    assert read_directory("outputs/run/checkpoints/last.ckpt") is None
    assert read_directory(str(tmp_path / "nothing")) is None
    with pytest.raises(MateError, match=r"^ckpt_path=nobody-here/no-such-model: no run dir .* no hub model"):
        read_directory("nobody-here/no-such-model")  # offline here (tests/conftest.py): the hub does not answer


def test_export_refuses_what_a_tapas_directory_cannot_hold_a_file_in_the_way_and_keeps_the_task(tmp_path):
    """Models built (not trained) from random TAPAS directories as `mate eval` builds them, then exported."""
    from hydra.utils import instantiate

    from mate_cli.pretrained import load_tokenizer
    from mate_cli.run.rebuild import TrainedRun
    from mate_cli.run.tapas_export import MARKER, export_run
    from mate_cli.run.task_directory import task_directory as read_directory, task_run_config

    def built(task: str, *overrides: str) -> TrainedRun:
        found = read_directory(str(task_directory(tmp_path / f"source_{task}", task)))
        cfg = task_run_config(found, [f"dataset.cache_dir={tmp_path / 'cache'}", *overrides])
        tokenizer = load_tokenizer(cfg.dataset.pretrained)
        return TrainedRun(cfg=cfg, model=instantiate(cfg.model).eval(), ckpt_path=found.resolved, tokenizer=tokenizer)

    with pytest.raises(MateError, match=r"extra layers on the encoder \(model.extra_layers\)"):
        export_run(built("sqa", "model.extra_layers=1"), tmp_path / "extra")
    with pytest.raises(MateError, match=r"model.pooling=query, and transformers' TAPAS heads read \[CLS\]"):
        export_run(built("sqa", "model.pooling=query"), tmp_path / "query")
    with pytest.raises(MateError, match=r"it is DoT's task model, .* export a run trained with model.dot=null"):
        export_run(built("sqa", "+model/dot@model.dot=default", "model.dot.pretrained=minilm"), tmp_path / "dot")
    (tmp_path / "a_file").write_text("mine", encoding="utf-8")
    with pytest.raises(MateError, match="is a file"):
        export_run(built("sqa"), tmp_path / "a_file")
    assert not any((tmp_path / name).exists() for name in ("extra", "query", "dot"))
    assert not [p.name for p in tmp_path.iterdir() if ".export-" in p.name]  # no staging left behind
    (tmp_path / "empty").mkdir()
    written, _ = export_run(built("sqa"), tmp_path / "empty")
    assert MARKER in (written / "README.md").read_text(encoding="utf-8")
    # a WikiTQ head trained without operators is still read back as WikiTQ's (config.json names the task)
    written, _ = export_run(built("wtq", "model.head.num_aggregation_labels=0"), tmp_path / "no_operators")
    assert json.loads((written / "config.json").read_text(encoding="utf-8"))["num_aggregation_labels"] == 0
    assert read_directory(str(written)).task == "wtq"
