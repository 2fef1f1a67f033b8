"""`mate predict`: answer one question about one table file; writes ``prediction.json``. HybridQA (``stage1.ckpt_path=``
[``stage2.ckpt_path=``], ``passages=``): PointR; SQA, WikiTQ, TabFact (``ckpt_path=``): :mod:`mate_cli.pipelines`."""

from __future__ import annotations

import rich
from omegaconf import DictConfig, OmegaConf

from mate_cli import tasks
from mate_cli.commands.common import hydra_app, log, print_table, quiet_third_party_logs, write_result
from mate_cli.data.hybridqa import read_table_file
from mate_cli.errors import MateError
from mate_cli.lit_modules.entailment import EntailmentModule
from mate_cli.lit_modules.table_qa import TableQAModule
from mate_cli.pipelines.pointr import CellRanker, SpanPredictor, load_passages, load_stages, predict_question
from mate_cli.pipelines.table_task import predict_table_question, read_task_table
from mate_cli.run.rebuild import check_checkpoint, load_trained, pick_device, run_checkpoint
from mate_cli.run.task_directory import task_directory


def predict(cfg: DictConfig) -> dict:
    quiet_third_party_logs()
    for key in ("table", "question"):
        if OmegaConf.is_missing(cfg, key):
            raise MateError(f"{key} is missing; pass {key}=... (see `mate predict --help`)")
    if cfg.get("ckpt_path"):
        return write_result("prediction", predict_table_task(cfg))
    if not cfg.stage1.get("ckpt_path"):
        raise MateError(
            "no checkpoint given; pass ckpt_path=<sqa|wtq|tabfact run>/checkpoints/<name>.ckpt, or "
            "stage1.ckpt_path=<HybridQA cell-selection run>/checkpoints/<name>.ckpt"
        )
    s1, s2, device = load_stages(cfg)  # the checkpoints first: they are what a user most often gets wrong
    table = read_table_file(cfg.table)
    passages = load_passages(cfg.get("passages"))
    precision = cfg.trainer.get("precision")
    ranker = CellRanker(s1, device, precision, batch_size=1, top_k=int(cfg.top_k))
    spans = SpanPredictor(s2, device, precision, batch_size=1)
    warn_if_cut(str(cfg.question), s1, "stage1.")
    result = predict_question(ranker, spans, str(cfg.question), table, passages, top_k=int(cfg.top_k))

    rich.print(f"[bold]question:[/bold] {shown(result['question'])}")
    rich.print(f"[bold]answer:[/bold] {result['answer'] or '(none)'}")
    if (cell := result["cell"]) is not None:
        rich.print(f"[bold]cell:[/bold] row {cell['row']}, column {cell['column']} ({cell['header']}): {cell['text']}")
    top = result["top_cells"]
    cells = [(str(c["row"]), f"{c['column']} ({c['header']})", c["text"], f"{c['prob']:.4f}") for c in top]
    rows = [(str(rank), *cell) for rank, cell in enumerate(cells, 1)]
    print_table(f"top {len(top)} cells of {table.table_id}", ("rank", "row", "column", "text", "probability"), rows)
    return write_result("prediction", result)


def predict_table_task(cfg: DictConfig) -> dict:
    if task_directory(cfg.ckpt_path) is None:  # a run's checkpoint: whole before anything else is read
        check_checkpoint(run_checkpoint(cfg.ckpt_path))
    device = pick_device(cfg.trainer.get("accelerator"))
    run = load_trained(cfg.ckpt_path, cfg.get("overrides"), (TableQAModule, EntailmentModule), "predict", device,
                       bool(cfg.get("trust_run_config")))  # fmt: skip
    table = read_task_table(str(run.cfg.dataset.task), cfg.table)
    warn_if_cut(str(cfg.question), run, "")
    result = predict_table_question(run, table, str(cfg.question), device, cfg.trainer.get("precision"))
    task = tasks.get(result["task"])
    if kept := result.get("kept"):
        log.warning(
            "the table was cut to fit dataset.max_length=%s: %d of %d rows and %d of %d columns kept, %d of the %d "
            "tokens it needs dropped; the answer reads only what was kept (raise dataset.max_length in overrides=[...] "
            "to read more)", run.cfg.dataset.max_length, kept["rows"], kept["of_rows"], kept["columns"],
            kept["of_columns"], kept["tokens_dropped"], kept["tokens_needed"],
        )  # fmt: skip
    noun = "question" if task.selects_cells else "statement"
    rich.print(f"[bold]{noun}:[/bold] {shown(result['question'])}")
    if not task.selects_cells:
        rich.print(f"[bold]verdict:[/bold] {result['verdict']} (probability {result['probability']:.4f})")
    else:
        if task.aggregates:
            rich.print(f"[bold]aggregation:[/bold] {result['aggregation']}")
        if "answer" in result:
            rich.print(f"[bold]answer:[/bold] {' | '.join(result['answer']) or '(none)'}")
        rows = [(str(c["row"]), f"{c['column']} ({c['header']})", c["text"]) for c in result["cells"]]
        print_table(f"selected cells of {table.table_id}", ("row", "column", "text"), rows)
    return result


def shown(text: str, limit: int = 200) -> str:
    """``text`` as the screen shows it: whole, or its start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def warn_if_cut(question: str, run, prefix: str) -> None:
    """One warning when the question is longer than the run reads (``dataset.max_question_tokens``)."""
    limit = OmegaConf.select(run.cfg, "dataset.max_question_tokens", default=None)
    pieces = len(run.tokenizer.tokenize(question))
    if limit is not None and pieces > int(limit):
        log.warning(
            "the question has %d word pieces; the model reads only the first %d (the run's "
            "dataset.max_question_tokens; %soverrides=[dataset.max_question_tokens=N] reads more)",
            pieces,
            int(limit),
            prefix,
        )


main = hydra_app(__name__, predict)
