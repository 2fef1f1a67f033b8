"""PointR end to end (MATE §4): point to the expanded cell, then read the answer from it (``mate pointr``,
``mate predict``).

Each stage is a trained run (:func:`mate_cli.run.rebuild.load_trained`). Without a stage-2 run the answer is the top
cell's text, so stage 1 can be evaluated end to end alone. A question the data or a stage cannot serve fully is counted
under :data:`ROBUSTNESS_LINES` and predicted as well as possible; none stops the run.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mate_cli.data.datamodule import Collator, encode_question
from mate_cli.data.hybridqa import read_passages_file
from mate_cli.data.readers import given_file, load_json
from mate_cli.data.span import SpanCollator, SpanExample, cell_context, encode_span_example
from mate_cli.data.records import Question, Table
from mate_cli.data.split import SplitSettings
from mate_cli.data.tokenize import TableTokenizer
from mate_cli.errors import MateError
from mate_cli.io import atomic_write_json
from mate_cli.lit_modules.cell_selection import CellSelectionModule
from mate_cli.lit_modules.span import SpanModule
from mate_cli.metrics.hybridqa import evaluate_predictions, flat_metrics, subset_reference
from mate_cli.run.rebuild import TrainedRun, autocast, dataset_here, load_run_config, load_trained, pick_device

log = logging.getLogger(__name__)

HITS_K = (1, 3, 5)
SPLIT_KEYS = ("root", "split")
ROBUSTNESS_LINES = {
    "questions_without_candidate": (
        "questions whose answer appears in no cell or linked passage (Hits@k counts them as misses)"
    ),
    "tables_without_passages": "questions whose table has no linked passage (reader context = cell text only)",
    "missing_passage_file": "questions whose table has no passage file (treated as no passages)",
    "no_selectable_cell": "questions whose table has no selectable (non-empty) cell (empty prediction)",
    "empty_context": "questions whose chosen cell is empty with no passage (empty prediction)",
    "answer_not_in_context": "questions whose answer is not in the chosen cell's reader context",
    "not_in_reference": "predicted questions absent from the reference file (not scored)",
}


class CellRanker:
    """Stage 1 (a ``CellSelectionModule`` run): each example's ``top_k`` cells (Hits@5 needs ``top_k >= 5``)."""

    def __init__(self, stage: TrainedRun, device: torch.device, precision: str | None, batch_size: int, top_k: int):
        self.stage, self.device, self.precision = stage, device, precision
        self.batch_size, self.top_k = int(batch_size), max(int(top_k), 1)
        self.collate = Collator(int(stage.tokenizer.pad_token_id or 0))

    def encode(self, question: Question, table: Table, passages: dict[str, str]) -> dict:
        """The stage-1 input of one question, as the training run encoded its data (TF-IDF expansion included)."""
        data = self.stage.cfg.dataset
        expansion = OmegaConf.to_container(data.expansion, resolve=True) if data.get("expansion") else {}
        tok = TableTokenizer(
            self.stage.tokenizer, max_length=int(data.max_length), max_question_tokens=int(data.max_question_tokens)
        )
        return encode_question(tok, question, table, passages, expansion)

    @torch.no_grad()
    def rank(self, examples: Iterable[dict]) -> Iterator[dict]:
        """Per example, in order: ``{question_id, cells: top-k {cell_id, coord, prob}, has_candidate, hits@k}``."""
        batch: list[dict] = []
        for example in examples:
            batch.append(example)
            if len(batch) == self.batch_size:
                yield from self._rank_batch(batch)
                batch = []
        if batch:
            yield from self._rank_batch(batch)

    def _rank_batch(self, examples: list[dict]) -> list[dict]:
        batch = self.stage.model.batch_to_device(self.collate(examples), self.device)
        with autocast(self.device, self.precision):
            logits = self.stage.model(batch).float()
        probs = torch.softmax(logits.masked_fill(~batch.cell_mask, float("-inf")), dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # an example with no cell at all
        k = min(self.top_k, probs.shape[-1])
        top_p, top_id = probs.topk(k, dim=-1)
        out = []
        for i, example in enumerate(examples):
            kept = [(int(c), float(p)) for c, p, ok in zip(top_id[i], top_p[i], batch.cell_mask[i, top_id[i]]) if ok]
            cells = [{"cell_id": c, "coord": list(example["cell_coords"][c - 1]), "prob": p} for c, p in kept]
            candidates = set(example["candidates"] or [])
            record = {"question_id": example["question_id"], "cells": cells, "has_candidate": bool(candidates)}
            out.append({**record, **{f"hits@{hk}": any(c in candidates for c, _ in kept[:hk]) for hk in HITS_K}})
        return out


class SpanPredictor:
    """Stage 2: the answer span in one cell's context (without a run: the cell's text)."""

    def __init__(self, stage: TrainedRun | None, device: torch.device, precision: str | None, batch_size: int):
        self.stage, self.device, self.precision, self.batch_size = stage, device, precision, int(batch_size)
        self.collate = SpanCollator(int(stage.tokenizer.pad_token_id or 0)) if stage else None

    def build(self, question: Question, table: Table, passages: dict[str, str], coord: Sequence[int]):
        """The :class:`~mate_cli.data.span.SpanExample` of ``coord``, as in training."""
        r, c = coord
        context, missing = cell_context(table.rows[r][c], passages)
        if self.stage is None:
            answer = question.answer_text or ""
            return SpanExample(
                question.question_id, question.table_id, [r, c], answer, context, missing_passages=missing
            )
        data = self.stage.cfg.dataset
        lengths = int(data.max_length), int(data.get("max_question_tokens", 64))
        return encode_span_example(self.stage.tokenizer, question, (r, c), context, *lengths, missing)

    @torch.no_grad()
    def read(self, items: list, cell_texts: list[str]) -> list[dict]:
        """``[{"pred", "prob"}]`` for ``items``; ``cell_texts`` answer without a stage-2 run."""
        if self.stage is None:
            return [{"pred": text.strip(), "prob": None} for text in cell_texts]
        out: list[dict] = []
        for start in range(0, len(items), self.batch_size):
            chunk = [asdict(x) for x in items[start : start + self.batch_size]]
            batch = self.stage.model.batch_to_device(self.collate(chunk), self.device)
            with autocast(self.device, self.precision):
                out.extend({"pred": r["pred"], "prob": r["prob"]} for r in self.stage.model.predict_batch(batch))
        return out


def reference_for(cfg_path: str | None, dataset: DictConfig, split: str) -> Path | None:
    """``reference=``; else, but for the test split, ``<root>/released_data/<dev>_reference.json`` if it exists."""
    if cfg_path:
        return given_file(cfg_path, "the dev_reference.json of the evaluated split", "reference")
    if split == "test":
        return None
    name = SplitSettings(**dataset.split).reference_file()
    path = Path(str(dataset.root)) / "released_data" / f"{name}_reference.json"
    return path if path.is_file() else None


def _cell_info(table: Table, coord: Sequence[int], prob: float | None) -> dict:
    r, c = int(coord[0]), int(coord[1])
    return {"row": r, "column": c, "header": table.header[c].text, "text": table.rows[r][c].text, "prob": prob}


def load_stages(cfg: DictConfig) -> tuple[TrainedRun, TrainedRun | None, torch.device]:
    """Both stages' runs (stage 2 may be None) and their device; both configs are checked before either is built."""
    trust = bool(cfg.get("trust_run_config"))
    for stage in ("stage1", "stage2"):
        if cfg[stage].get("ckpt_path"):
            load_run_config(cfg[stage].ckpt_path, cfg[stage].get("overrides"), trust)
    device = pick_device(cfg.trainer.get("accelerator"))
    s1 = load_trained(cfg.stage1.ckpt_path, cfg.stage1.get("overrides"), CellSelectionModule, "stage1", device, trust)
    s2 = None
    if cfg.stage2.get("ckpt_path"):
        s2 = load_trained(cfg.stage2.ckpt_path, cfg.stage2.get("overrides"), SpanModule, "stage2", device, trust)
    return s1, s2, device


def evaluate_pointr(cfg: DictConfig, out_dir: Path) -> dict:
    """PointR on ``cfg.split``: writes ``predictions.json`` (the official format), ``pointr_details.json`` and
    ``metrics.json`` (official EM/F1, Hits@k, robustness counts); returns the metrics."""
    for stage in ("stage1", "stage2"):
        if OmegaConf.is_missing(cfg[stage], "ckpt_path"):
            fix = " (or null: answer with the top cell's text)" if stage == "stage2" else ""
            raise MateError(
                f"{stage}.ckpt_path is missing; pass {stage}.ckpt_path=<run dir> (its best checkpoint) "
                f"or <run dir>/checkpoints/<name>.ckpt{fix}"
            )
    split = str(cfg.split)
    if split not in ("validation", "test"):
        raise MateError(f"split={split!r} is invalid; use split=validation or split=test")
    for stage in ("stage1", "stage2"):
        if cfg[stage].get("batch_size", 1) < 1:
            raise MateError(f"{stage}.batch_size={cfg[stage].batch_size} is invalid; use {stage}.batch_size=<N >= 1>")
    s1, s2, device = load_stages(cfg)
    precision = cfg.trainer.get("precision")
    ref_path = reference_for(cfg.get("reference"), s1.cfg.dataset, split)
    if s2 is not None:
        differ = [k for k in SPLIT_KEYS if str(s1.cfg.dataset.get(k)) != str(s2.cfg.dataset.get(k))]
        if differ:
            log.warning(
                "pointr: stage-2 data differs from stage-1 on %s; "
                "the reader's training tables may overlap the evaluated ones",
                differ,
            )
    else:
        log.info("pointr: no stage2.ckpt_path; answering with the top cell's text")

    datamodule = instantiate(dataset_here(s1.cfg, OmegaConf.select(cfg, "paths.cache_dir")))
    dataset = datamodule.preprocess(split)
    limit = cfg.get("limit_questions")
    if limit:
        dataset = dataset.select(range(min(int(limit), len(dataset))))
    questions = {q.question_id: q for q in datamodule.questions(split)}
    ranker = CellRanker(s1, device, precision, cfg.stage1.get("batch_size", 8), cfg.stage1.get("top_k", 5))
    spans = SpanPredictor(s2, device, precision, cfg.stage2.get("batch_size", 16))

    counts: Counter = Counter()
    details = _run(datamodule, dataset.with_format(None), questions, ranker, spans, counts)
    atomic_write_json(
        out_dir / "predictions.json", [{"question_id": d["question_id"], "pred": d["pred"]} for d in details]
    )
    atomic_write_json(out_dir / "pointr_details.json", details)

    metrics = score(details, questions, ref_path, counts)
    metrics.update({f"data/{split}/{k}": v for k, v in datamodule.stats.get(split, {}).items()})
    for key, line in ROBUSTNESS_LINES.items():
        if counts.get(key):
            log.info("pointr: %d %s", counts[key], line)
    metrics.update({f"robustness/{k}": int(counts.get(k, 0)) for k in ROBUSTNESS_LINES})
    metrics.update({"split": split, "stage1_ckpt": s1.ckpt_path, "stage2_ckpt": s2.ckpt_path if s2 else None})
    atomic_write_json(out_dir / "metrics.json", metrics)
    return metrics


def score(details: list[dict], questions: dict[str, Question], ref_path: Path | None, counts: Counter) -> dict:
    """Hits@k of stage 1 (fractions) and official EM/F1 (percent) of the predictions in ``details``."""
    predictions = [{"question_id": d["question_id"], "pred": d["pred"]} for d in details]
    metrics: dict[str, Any] = {"questions": len(details)}
    answered = [d for d in details if questions[d["question_id"]].answer_text is not None]
    if answered:
        for hk in HITS_K:
            metrics[f"stage1/hits@{hk}"] = sum(d[f"hits@{hk}"] for d in answered) / len(answered)
    if ref_path is not None:
        full = load_json(ref_path, "reference file")
        if not isinstance(full, dict) or not isinstance(full.get("reference"), dict):
            raise MateError(
                f"{ref_path}: not a dev_reference.json "
                f"({{'reference': {{qid: answer}}, 'table': [...], 'passage': [...]}}); pass reference=<file>"
            )
        counts["not_in_reference"] = sum(d["question_id"] not in full["reference"] for d in details)
        metrics.update(
            flat_metrics(evaluate_predictions(predictions, subset_reference(full, [d["question_id"] for d in details])))
        )
        metrics["reference"] = str(ref_path)
    elif answered:
        log.info("pointr: no reference file; EM/F1 over all answered questions only (no in-table/in-passage split)")
        reference = {"reference": {d["question_id"]: questions[d["question_id"]].answer_text for d in answered}}
        metrics.update(flat_metrics(evaluate_predictions(predictions, reference)))
    return metrics


def _run(
    datamodule, dataset, questions: dict[str, Question], ranker: CellRanker, spans: SpanPredictor, counts: Counter
) -> list[dict]:
    """Stage 1 over the encoded ``dataset``, stage 2 on each top cell, in chunks."""
    details: list[dict] = []
    pending: list[tuple[dict, Any, str]] = []

    def flush() -> None:
        items = [p[1] for p in pending if p[1] is not None]
        answers = iter(spans.read(items, [p[2] for p in pending if p[1] is not None]))
        for record, item, _ in pending:
            result = next(answers) if item is not None else {"pred": "", "prob": None}
            record.update(pred=result["pred"], reader_prob=result["prob"])
            details.append(record)
        pending.clear()

    for ranked in ranker.rank(dataset):
        question = questions[ranked["question_id"]]
        table = datamodule.reader.table(question.table_id)
        passages = datamodule.reader.passages(question.table_id)
        if not passages:
            counts["tables_without_passages"] += 1
            counts["missing_passage_file"] += not datamodule.reader.has_passage_file(question.table_id)
        counts["questions_without_candidate"] += question.answer_text is not None and not ranked["has_candidate"]
        record = {
            "question_id": question.question_id,
            "question": question.question,
            "answer": question.answer_text,
            "top_cells": [_cell_info(table, c["coord"], c["prob"]) for c in ranked["cells"]],
            **{f"hits@{k}": ranked[f"hits@{k}"] for k in HITS_K},
        }
        record["cell"] = record["top_cells"][0] if record["top_cells"] else None
        item, text = None, ""
        if not ranked["cells"]:
            counts["no_selectable_cell"] += 1
        else:
            coord = ranked["cells"][0]["coord"]
            item = spans.build(question, table, passages, coord)
            text = table.rows[coord[0]][coord[1]].text
            if not item.context.strip():
                counts["empty_context"] += 1
                item = None
            elif question.answer_text is not None and not item.answer_in_context and spans.stage is not None:
                counts["answer_not_in_context"] += 1
        pending.append((record, item, text))
        if len(pending) >= 64:
            flush()
    flush()
    return details


def load_passages(path: str | Path | None) -> dict[str, str]:
    if not path:
        log.info("predict: no passages file; cells are read without linked passages")
        return {}
    return read_passages_file(path)


def predict_question(
    ranker: CellRanker, spans: SpanPredictor, question_text: str, table: Table, passages: dict[str, str], top_k: int = 3
) -> dict:
    """Answer one question about one table: ``{"answer", "cell", "top_cells", "reader_prob", ...}``."""
    if not str(question_text).strip():
        raise MateError('question is empty; pass question="..."')
    question = Question(question_id="predict", question=str(question_text), table_id=table.table_id)
    ranked = next(iter(ranker.rank([ranker.encode(question, table, passages)])))
    top = [_cell_info(table, c["coord"], c["prob"]) for c in ranked["cells"][: max(top_k, 1)]]
    common = {"question": question.question, "table_id": table.table_id}
    if not top:
        log.info("predict: table %s has no selectable (non-empty) cell; no answer", table.table_id)
        return {**common, "answer": "", "cell": None, "top_cells": [], "reader_prob": None}
    item = spans.build(question, table, passages, (top[0]["row"], top[0]["column"]))
    result = spans.read([item], [top[0]["text"]])[0] if item.context.strip() else {"pred": "", "prob": None}
    answer = {"answer": result["pred"], "reader_prob": result["prob"], "cell": top[0], "top_cells": top}
    return {**common, **answer, "context": item.context}
