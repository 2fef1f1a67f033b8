"""The datamodules' shared base (:class:`SplitDataModule`) and HybridQA's cell-selection datamodule."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Callable, Literal, Mapping

import lightning as L
import torch
from torch.utils.data import DataLoader

from mate_cli.data import cache
from mate_cli.data.expand import expand_table
from mate_cli.data.hybridqa import HybridQAReader
from mate_cli.data.preprocess import encode_records, loader_options, worker_counts
from mate_cli.data.split import SplitSettings
from mate_cli.data.sampler import EpochShuffle, padding_share
from mate_cli.data.records import AnswerNode, Batch, Question, Table
from mate_cli.data.tokenize import TableTokenizer, candidate_cells
from mate_cli.errors import MateError
from mate_cli.pretrained import encoding_files, load_tokenizer, resolve_pretrained
from mate_cli.layout import TableLayout, batch_width, padded

log = logging.getLogger(__name__)


class SplitDataModule(L.LightningDataModule):
    """What every datamodule shares: the split, the Arrow cache, the loaders. A subclass implements :meth:`encode`
    and :meth:`collator` and may override the hooks (docs/architecture.md, "Add a dataset"). ``root``: the dataset's
    folder in its upstream layout; ``limit_questions``: the first N of each split."""

    #: prefix of cache entries and log lines (``""``: HybridQA stage 1)
    kind = ""
    #: Lightning stage -> the splits ``setup`` prepares
    STAGES = {
        "fit": ("train", "validation"),
        "validate": ("validation",),
        "test": ("test",),
        None: ("train", "validation"),
    }

    def __init__(
        self,
        *,
        root: str,
        pretrained: str = "minilm",
        max_length: int = 512,
        max_question_tokens: int = 64,
        split: SplitSettings | Mapping | None = None,
        batch_size: int = 4,
        eval_batch_size: int = 8,
        num_workers: int | Literal["auto"] = "auto",
        num_proc: int | Literal["auto"] = "auto",
        cache_dir: str | None = None,
        limit_questions: int | None = None,
        shuffle_seed: int = 0,
        eval_file: str | None = None,
        same_order_every_epoch: bool = False,
        bucket_by_length: bool = False,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        super().__init__()
        self.reader = self.make_reader(root)  # raises MateError naming dataset.root if missing
        self.eval_file = eval_file or None
        self.root, self.pretrained = str(root), pretrained
        self.max_length, self.max_question_tokens = max_length, max_question_tokens
        self.split = split if isinstance(split, SplitSettings) else SplitSettings(**dict(split or {}))
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_proc, self.num_workers = worker_counts(num_proc, num_workers)
        self.cache_dir = Path(cache_dir or Path(root) / ".mate_cache")
        self.limit_questions = limit_questions
        self.shuffle_seed = int(shuffle_seed)
        self.same_order_every_epoch = bool(same_order_every_epoch)
        self.bucket_by_length = bool(bucket_by_length)
        if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or int(pad_to_multiple_of) < 1):
            raise MateError(f"dataset.pad_to_multiple_of={pad_to_multiple_of!r}: a whole number >= 1, or null")
        self.pad_to_multiple_of = None if pad_to_multiple_of is None else int(pad_to_multiple_of)
        self.datasets: dict = {}
        self.stats: dict[str, dict] = {}

    def make_reader(self, root: str):
        """Hook: the dataset's reader of ``root`` (default: HybridQA's)."""
        return HybridQAReader(root)

    def questions(self, split: str) -> list[Question]:
        """With ``eval_file``, validation and test are that whole upstream file instead of ``dataset.split``'s."""
        if self.eval_file and split in ("validation", "test"):
            chosen = list(self.reader.questions(self.eval_file))
        else:
            chosen = self.split.questions(split, self.reader.questions)
        return chosen[: self.limit_questions] if self.limit_questions else chosen

    def nonempty_questions(self, split: str) -> list[Question]:
        """:meth:`questions`, refused when there are none (so nothing empty is cached)."""
        chosen = self.questions(split)
        if not chosen:
            raise MateError(
                f"the {split} split of {self.root} has no questions with dataset.split={asdict(self.split)}; "
                "use a larger dataset.split.val_fraction, another dataset.split.mode, or check the files"
            )
        return chosen

    def cache_payload(self, split: str) -> dict:
        """What, beyond the shared settings, changes the encoded examples of ``split``."""
        return {}

    def encode(self, questions: list[Question], split: str):
        """``questions`` -> a ``datasets.Dataset`` of encoded examples."""
        raise NotImplementedError

    def split_stats(self, ds) -> dict:
        """Hook: a non-empty split's statistics for the run log."""
        return {"examples": len(ds)}

    def cache_key(self, split: str) -> str:
        return cache.key(
            kind=self.kind,
            split=split,
            root=os.path.abspath(self.root),
            inputs=cache.fingerprint(self.reader.input_files(), self.reader.root),
            pretrained=resolve_pretrained(self.pretrained),
            encoding=cache.content_digest(encoding_files(resolve_pretrained(self.pretrained))),
            max_length=self.max_length,
            max_question_tokens=self.max_question_tokens,
            split_settings=asdict(self.split),
            limit_questions=self.limit_questions,
            eval_file=self.eval_file if split in ("validation", "test") else None,
            **self.cache_payload(split),
        )

    def preprocess(self, split: str):
        name = " ".join(filter(None, (self.kind, split)))
        target = self.cache_dir / "-".join(filter(None, (self.kind, split, self.cache_key(split))))
        ds = cache.load_or_build(target, lambda: self.encode(self.nonempty_questions(split), split), f"{name} split")
        self.stats[split] = self.split_stats(ds) if len(ds) else {"questions": 0}
        log.info("%s split: %s", name, json.dumps(self.stats[split]))
        return ds

    def _map(self, questions: list[Question], function, split: str):
        what = " ".join(filter(None, (self.kind, split)))
        return encode_records(function, [asdict(q) for q in questions], self.num_proc, what)

    def after_load(self, split: str, ds):
        """Hook: adjust a split once loaded."""
        return ds

    def setup(self, stage: str | None = None) -> None:
        for split in self.STAGES.get(stage, ()):
            if split not in self.datasets:
                self.datasets[split] = self.after_load(split, self.preprocess(split))

    def usable_rows(self, split: str, ds) -> list[int] | None:
        """Hook: indices of the rows the loader serves (None: all)."""
        return None

    def collator(self) -> Callable[[list[dict]], object]:
        """Hook: pads a list of encoded examples into a batch (to :meth:`width`)."""
        raise NotImplementedError

    def width(self) -> dict:
        """How a collator pads: ``multiple`` (``dataset.pad_to_multiple_of``) and ``cap`` (``dataset.max_length``)."""
        return {"multiple": self.pad_to_multiple_of, "cap": self.max_length}

    def _loader(self, split: str, shuffle: bool, batch_size: int) -> DataLoader:
        ds = self.datasets[split]
        keep = self.usable_rows(split, ds)
        if keep is not None:
            ds = ds.select(keep)
        lengths = token_counts(ds) if shuffle and self.bucket_by_length else None
        if lengths is not None:
            plain = EpochShuffle(len(ds), self.shuffle_seed).order(0)
            grouped = EpochShuffle(len(ds), self.shuffle_seed, lengths=lengths, batch_size=batch_size).order(0)
            log.info("dataset.bucket_by_length: batches of similar lengths; padding is %.1f%% of a training batch's "
                     "tokens in epoch 0 (%.1f%% in a plain shuffle)", 100 * padding_share(grouped, lengths, batch_size),
                     100 * padding_share(plain, lengths, batch_size))  # fmt: skip
        order = dict(same_every_epoch=self.same_order_every_epoch, lengths=lengths, batch_size=batch_size)
        return DataLoader(
            ds.with_format(None),
            batch_size=batch_size,
            sampler=EpochShuffle(len(ds), self.shuffle_seed, **order) if shuffle else None,
            collate_fn=self.collator(),
            **loader_options(self.trainer, self.num_workers),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True, self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", False, self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False, self.eval_batch_size)

    @cached_property
    def pad_id(self) -> int:
        return int(load_tokenizer(self.pretrained).pad_token_id or 0)


class HybridQADataModule(SplitDataModule):
    """HybridQA cell-selection data. ``expansion``: :func:`~mate_cli.data.expand.expand_table`'s options;
    ``drop_ambiguous``: drop training questions with more than one candidate cell (paper ablation)."""

    #: the settings that size an example, named in errors
    length_keys = "dataset.max_length"

    def __init__(self, *, expansion: Mapping | None = None, drop_ambiguous: bool = False, **common) -> None:
        super().__init__(**common)
        self.expansion = dict(expansion or {"k": 5, "scope": "table", "method": "tfidf"})
        self.drop_ambiguous = drop_ambiguous

    def cache_payload(self, split: str) -> dict:
        return {"expansion": self.expansion}

    def encode(self, questions: list[Question], split: str):
        encoder = _ExampleEncoder(self.root, self.pretrained, self.max_length, self.expansion, self.max_question_tokens)
        return self._map(questions, encoder, split)

    def split_stats(self, ds) -> dict:
        n = len(ds)
        no_candidate = sum(1 for c in ds["candidates"] if not c)
        rows_dropped = [int(r) for r in ds["rows_dropped"]]
        columns_dropped = [int(c) for c in ds["columns_dropped"]]
        return {
            "questions": n,
            "fit_without_truncation": round(1 - sum(bool(t) for t in ds["truncated"]) / n, 4),
            "with_candidate": round(1 - no_candidate / n, 4),
            "questions_without_candidate": no_candidate,
            "candidates_dropped_by_truncation": sum(int(d) for d in ds["candidates_dropped"]),
            "questions_with_rows_dropped": sum(r > 0 for r in rows_dropped),
            "rows_dropped": sum(rows_dropped),
            "questions_with_columns_dropped": sum(c > 0 for c in columns_dropped),
            "columns_dropped": sum(columns_dropped),
            "rank_ids_clipped": sum(int(r) for r in ds["ranks_clipped"]),
        }

    def after_load(self, split: str, ds):
        if split == "train" and self.drop_ambiguous:
            before = len(ds)
            ds = ds.filter(lambda ex: len(ex["candidates"]) <= 1)
            log.info("dataset.drop_ambiguous: dropped %d multi-candidate training questions", before - len(ds))
        return ds

    def usable_rows(self, split: str, ds) -> list[int] | None:
        """Training skips questions with no candidate cell (nothing to learn from)."""
        if split != "train":
            return None
        keep = [i for i, c in enumerate(ds["candidates"]) if c]
        if len(keep) < len(ds):
            log.info("train: %d questions have no candidate cell and are skipped", len(ds) - len(keep))
        if not keep:
            raise MateError(f"no training question has a candidate cell; check dataset.root and {self.length_keys}")
        return keep

    def collator(self) -> "Collator":
        return Collator(self.pad_id, **self.width())


def encode_question(
    tokenizer: TableTokenizer, question: Question, table: Table, passages: dict[str, str], expansion: Mapping
) -> dict:
    """The one stage-1 encoding of a question (expansion, candidate cells, tokens) as an :class:`EncodedExample`
    dict; training, eval and PointR all call it."""
    cell_texts = expand_table(question, table, passages, **expansion)
    candidates = candidate_cells(question, table, passages)
    return asdict(tokenizer.encode(question, table, cell_texts=cell_texts, candidates=candidates))


@dataclass
class _ExampleEncoder:
    """A question record -> its encoded example, by ``encode`` (:func:`encode_question`'s signature). The reader and
    tokenizer are made at the first record; worker processes are forked, so it is never pickled."""

    root: str
    pretrained: str
    max_length: int
    expansion: dict
    max_question_tokens: int
    encode: Callable[..., dict] = encode_question
    length_key: str = "dataset.max_length"

    @cached_property
    def _state(self) -> tuple[HybridQAReader, TableTokenizer]:
        tokenizer = TableTokenizer(
            load_tokenizer(self.pretrained), self.max_length, self.max_question_tokens, length_key=self.length_key
        )
        return HybridQAReader(self.root), tokenizer

    def __call__(self, record: dict) -> dict:
        reader, tok = self._state
        question = question_from_record(record)
        table_id = question.table_id
        return self.encode(tok, question, reader.table(table_id), reader.passages(table_id), self.expansion)


def token_counts(ds) -> list[int]:
    """Each row's tokens (the length of its ``input_ids``), read from the Arrow column without decoding the rows."""
    import pyarrow.compute as pc

    return pc.list_value_length(ds.with_format("arrow")["input_ids"]).to_pylist()


class Collator:
    """``multiple``, ``cap``: the batch's length (:func:`~mate_cli.layout.batch_width`)."""

    def __init__(self, pad_id: int = 0, multiple: int | None = None, cap: int | None = None) -> None:
        self.pad_id, self.multiple, self.cap = pad_id, multiple, cap

    def __call__(self, examples: list[dict]) -> Batch:
        ids = [ex["input_ids"] for ex in examples]
        input_ids = padded(ids, self.pad_id, width=batch_width(ids, self.multiple, self.cap))
        return Batch(
            input_ids=input_ids,
            layout=TableLayout.from_lists([ex["layout"] for ex in examples], input_ids.shape[1]),
            **cell_tensors(examples),
            question_ids=[ex["question_id"] for ex in examples],
            table_ids=[ex["table_id"] for ex in examples],
        )


def cell_tensors(examples: list[dict]) -> dict[str, torch.Tensor]:
    """:class:`Batch`'s per-cell tensors of examples with ``cell_coords`` and ``candidates``."""
    cells = max([len(ex["cell_coords"]) for ex in examples] + [1])
    b = len(examples)
    cell_mask = torch.zeros((b, cells + 1), dtype=torch.bool)
    candidate_mask = torch.zeros((b, cells + 1), dtype=torch.bool)
    coords = torch.full((b, cells + 1, 2), -1, dtype=torch.long)
    for i, ex in enumerate(examples):
        m = len(ex["cell_coords"])
        cell_mask[i, 1 : m + 1] = True
        if m:
            coords[i, 1 : m + 1] = torch.tensor(ex["cell_coords"])
        if ex["candidates"]:
            candidate_mask[i, torch.tensor(ex["candidates"])] = True
    return {"cell_mask": cell_mask, "candidate_mask": candidate_mask, "cell_coords": coords}


def question_from_record(record: dict) -> Question:
    """Inverse of ``dataclasses.asdict(question)``."""
    nodes = [AnswerNode(n["text"], tuple(n["coord"]), n["link"], n["source"]) for n in record.get("answer_nodes") or []]
    extra = {
        f.name: record[f.name]
        for f in fields(Question)
        if f.name not in ("answer_nodes", "answers", "answer_coordinates") and f.name in record
    }
    return Question(
        **extra,
        answer_nodes=nodes,
        answers=list(record.get("answers") or []),
        answer_coordinates=[list(c) for c in record.get("answer_coordinates") or []],
    )
