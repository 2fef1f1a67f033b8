"""Masked-LM pre-training data (docs/architecture.md, "Data flow": pre-training).

The held-out split is by table content (:func:`table_key`): SQA's tables are WikiTableQuestions tables under other
names, and a table read from two sources must be on one side. Each example is ``[CLS] text [SEP] table``, laid out as
a question and a table; the unmasked encodings are cached.

Masking happens when an example is served, seeded by ``(mask_seed, epoch, example)``: a training example is masked
afresh each epoch (dynamic masking, as RoBERTa) and identically after a resume. Held-out examples are masked
``eval_masks`` fixed ways, so every checkpoint of a run, the starting one included, is scored on the same predictions.
"""

from __future__ import annotations

import json
import logging
import os
import random
from functools import cached_property
from pathlib import Path
from typing import Literal, Mapping

import datasets
import lightning as L
from torch.utils.data import DataLoader, Dataset

from mate_cli.data import cache
from mate_cli.data.corpus import Corpus, TableText, table_key
from mate_cli.data.masking import IGNORE, continuation_table, mask_words, word_spans
from mate_cli.data.preprocess import loader_options, worker_counts
from mate_cli.data.sampler import EpochTagged
from mate_cli.data.records import MaskedBatch, Question
from mate_cli.data.split import split_by_table
from mate_cli.data.tokenize import TableTokenizer
from mate_cli.errors import MateError
from mate_cli.pretrained import encoding_files, load_tokenizer, resolve_pretrained
from mate_cli.layout import TableLayout, padded
from mate_cli.paths import cache_dir as default_cache_dir

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")


class PretrainDataModule(L.LightningDataModule):
    """Tables and their text, masked for masked-LM pre-training. ``sources``, ``hybridqa_passages``, ``tables`` and
    ``splits`` go to :class:`~mate_cli.data.corpus.Corpus`; ``max_length`` counts text and table together (TAPAS and
    MATE pre-train at 128); the text is cut to ``max_text_tokens``, and to half of ``max_length`` at most."""

    def __init__(
        self,
        *,
        sources: Mapping[str, object],
        pretrained: str = "minilm",
        max_length: int = 128,
        max_text_tokens: int = 64,
        hybridqa_passages: int = 1,
        tables: str = "all",
        splits: Mapping[str, Mapping] | None = None,
        val_fraction: float = 0.2,
        split_seed: int = 0,
        mask_rate: float = 0.15,
        max_predictions: int = 20,
        mask_seed: int = 0,
        eval_masks: int = 4,
        batch_size: int = 16,
        eval_batch_size: int = 32,
        num_workers: int | Literal["auto"] = "auto",
        cache_dir: str | None = None,
        shuffle_seed: int = 0,
        same_order_every_epoch: bool = False,
    ) -> None:
        super().__init__()
        self.sources = {
            k: v if v is None or isinstance(v, (str, os.PathLike)) else [str(x) for x in v]
            for k, v in dict(sources or {}).items()
        }
        self.pretrained = pretrained
        self.max_length, self.max_text_tokens = int(max_length), int(max_text_tokens)
        self.hybridqa_passages = int(hybridqa_passages)
        self.val_fraction, self.split_seed = float(val_fraction), int(split_seed)
        self.mask_rate, self.max_predictions = float(mask_rate), int(max_predictions)
        self.mask_seed, self.eval_masks = int(mask_seed), max(1, int(eval_masks))
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers = worker_counts(1, num_workers)[1]
        self.cache_dir = Path(cache_dir or default_cache_dir() / "pretrain")
        self.shuffle_seed, self.same_order_every_epoch = int(shuffle_seed), bool(same_order_every_epoch)
        self.tables = str(tables)
        self.splits = {
            str(k): dict(v)
            for k, v in dict(splits or {}).items()
            if v is not None and k in self.sources and self.sources[k] is not None
        }
        self.corpus = Corpus(self.sources, self.hybridqa_passages, self.tables, self.splits)  # checks the sources now
        self.encoded: dict[str, datasets.Dataset] = {}
        self.stats: dict[str, dict] = {}

    @cached_property
    def tokenizer(self):
        return load_tokenizer(self.pretrained)

    def cache_key(self) -> str:
        return cache.key(
            kind="pretrain",
            sources=[[k, str(v)] for k, v in self.sources.items()],  # their order is the examples' order
            inputs=cache.fingerprint([p.resolve() for p in self.corpus.input_files()], Path("/")),
            pretrained=resolve_pretrained(self.pretrained),
            encoding=cache.content_digest(encoding_files(resolve_pretrained(self.pretrained))),
            max_length=self.max_length,
            max_text_tokens=self.max_text_tokens,
            hybridqa_passages=self.hybridqa_passages,
            tables=self.tables,
            splits=self.splits if self.tables == "train" else None,
            val_fraction=self.val_fraction,
            split_seed=self.split_seed,
        )

    def split_corpus(self) -> dict[str, list[TableText]]:
        train, held_out = split_by_table(
            list(self.corpus.examples()),
            self.val_fraction,
            self.split_seed,
            key=lambda e: table_key(e.table),
            setting="dataset.val_fraction",
        )
        return {"train": train, "validation": held_out}

    def encode(self, examples: list[TableText]) -> datasets.Dataset:
        text_tokens = min(self.max_text_tokens, (self.max_length - 2) // 2)
        tokenizer = TableTokenizer(self.tokenizer, max_length=self.max_length, max_question_tokens=text_tokens)
        rows, skipped = [], []
        for example in examples:
            text = Question(question_id=example.source, question=example.text, table_id=example.table.table_id)
            try:
                encoded = tokenizer.encode(text, example.table)
            except MateError:  # a header wider than the whole budget: nothing of the table would be seen
                skipped.append(example.source)
                continue
            kept = {name: getattr(encoded, name) for name in ("input_ids", "layout", "truncated", "rows_dropped")}
            rows.append({"source": example.source, "table_key": table_key(example.table), **kept})
        if skipped:
            log.warning(
                "pre-training: %d examples left out, their table header alone passes dataset.max_length=%d (first: %s)",
                len(skipped),
                self.max_length,
                skipped[0],
            )
        return datasets.Dataset.from_list(rows) if rows else datasets.Dataset.from_dict({"source": []})

    def prepare(self) -> None:
        if self.encoded:
            return
        key = self.cache_key()
        targets = {split: self.cache_dir / f"pretrain-{split}-{key}" for split in SPLITS}
        corpus: dict[str, list[TableText]] = {}
        for split in SPLITS:

            def build(split=split):
                if not corpus:
                    corpus.update(self.split_corpus())
                encoded = self.encode(corpus[split])
                if not len(encoded):  # refused before it is cached: a rerun with more tables rebuilds
                    raise MateError(
                        f"the pre-training {split} split is empty (one table in the corpus?); "
                        "add tables to dataset.sources or change dataset.val_fraction"
                    )
                return encoded

            self.encoded[split] = cache.load_or_build(targets[split], build, f"pre-training {split} split")
            self.stats[split] = split_stats(self.encoded[split])
            log.info("pre-training %s split: %s", split, json.dumps(self.stats[split]))

    def setup(self, stage: str | None = None) -> None:
        self.prepare()

    def masked(self, split: str) -> "MaskedTables":
        tok = self.tokenizer  # BERT masks every piece but [CLS] and [SEP] ([UNK] included)
        special = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
        return MaskedTables(
            self.encoded[split],
            continuation_table(tok),
            special,
            int(tok.mask_token_id),
            int(tok.vocab_size),
            self.mask_rate,
            self.max_predictions,
            self.mask_seed,
            repeats=1 if split == "train" else self.eval_masks,
        )

    def train_dataloader(self) -> DataLoader:
        data = self.masked("train")
        return DataLoader(
            data,
            batch_size=self.batch_size,
            sampler=EpochTagged(len(data), self.shuffle_seed, same_every_epoch=self.same_order_every_epoch),
            collate_fn=MaskedCollator(self.pad_id),
            **loader_options(self.trainer, self.num_workers),
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.masked("validation"),
            batch_size=self.eval_batch_size,
            collate_fn=MaskedCollator(self.pad_id),
            **loader_options(self.trainer, self.num_workers),
        )

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id or 0)


def split_stats(ds: datasets.Dataset) -> dict:
    if len(ds) == 0:
        return {"examples": 0}
    return {
        "examples": len(ds),
        "tables": len(set(ds["table_key"])),
        "tokens": sum(len(ids) for ids in ds["input_ids"]),
        "truncated": sum(bool(t) for t in ds["truncated"]),
        "rows_dropped": sum(int(r) for r in ds["rows_dropped"]),
    }


class MaskedTables(Dataset):
    """Encoded examples served masked by ``(seed, epoch, i)`` only: index ``(epoch, i)`` (training) or ``i`` (held-out,
    fixed masks). ``repeats`` k serves k copies, each masked its own fixed way."""

    def __init__(
        self, encoded, continues, special_ids, mask_id, vocab_size, rate, max_predictions, seed, repeats: int = 1
    ) -> None:
        self.encoded = encoded.with_format(None)
        self.continues, self.special_ids = continues, special_ids
        self.mask_id, self.vocab_size = mask_id, vocab_size
        self.rate, self.max_predictions, self.seed, self.repeats = rate, max_predictions, seed, repeats

    def __len__(self) -> int:
        return len(self.encoded) * self.repeats

    def __getitem__(self, key) -> dict:
        epoch, index = key if isinstance(key, tuple) else ("held-out", key)
        row = self.encoded[int(index) % len(self.encoded)]
        rng = random.Random(f"{self.seed}:{epoch}:{index}")
        words = word_spans(row["input_ids"], self.continues, self.special_ids)
        ids, labels = mask_words(
            row["input_ids"], words, rng, self.mask_id, self.vocab_size, self.rate, self.max_predictions
        )
        return {"input_ids": ids, "labels": labels, "layout": row["layout"], "source": row["source"]}


class MaskedCollator:
    def __init__(self, pad_id: int = 0) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: list[dict]) -> MaskedBatch:
        input_ids = padded([ex["input_ids"] for ex in examples], self.pad_id)
        labels = padded([ex["labels"] for ex in examples], IGNORE, width=input_ids.shape[1])
        layout = TableLayout.from_lists([ex["layout"] for ex in examples], input_ids.shape[1])
        return MaskedBatch(input_ids=input_ids, labels=labels, layout=layout, sources=[ex["source"] for ex in examples])
