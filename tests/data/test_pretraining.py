"""The pre-training corpus and its masking, on the bundled tables: what each source reads, the
by-content held-out split, and masks that depend on (seed, epoch, example) only."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mate_cli.data.masking import IGNORE
from mate_cli.data.pretraining import PretrainDataModule, table_key
from mate_cli.data.sampler import EpochTagged
from mate_cli.errors import MateError
from tests.data.readouts import read_corpus
from tests.helpers import REPO_ROOT, SOURCES

DATA = REPO_ROOT / "data"


@pytest.fixture(scope="module")
def corpus():
    return read_corpus(SOURCES, hybridqa_passages=1)


@pytest.fixture(scope="module")
def datamodule(module_tmp):
    dm = PretrainDataModule(sources=SOURCES, cache_dir=str(module_tmp("cache")), batch_size=8)
    dm.setup("fit")
    return dm


def test_every_bundled_table_is_read_once_with_its_text(corpus):
    by_source = Counter(example.source.split(":")[0] for example in corpus)
    assert by_source == {"hybridqa": 90, "wtq": 30, "tabfact": 30, "sqa": 15}  # 45 HybridQA tables, each + 1 passage
    tabfact = [e for e in corpus if e.source.startswith("tabfact:")]
    assert all(e.text for e in tabfact)  # the caption
    assert {e.text for e in corpus if e.source.startswith(("wtq:", "sqa:"))} == {""}  # no page text upstream
    monaco = [e for e in corpus if "1991_Monaco_Grand_Prix_0" in e.source]
    assert [e.source.split("#")[-1] for e in monaco] == ["hybridqa:1991_Monaco_Grand_Prix_0", "passage1"]
    assert monaco[0].text.startswith("1991 Monaco Grand Prix") and len(monaco[1].text) > len(monaco[0].text)


def test_held_out_tables_are_split_by_content(datamodule, corpus, tmp_path):
    train = set(datamodule.encoded["train"]["table_key"])
    held_out = set(datamodule.encoded["validation"]["table_key"])
    assert train and held_out and not train & held_out
    assert len(train | held_out) == len({table_key(e.table) for e in corpus})
    # the same table under another name and text (SQA's tables are WikiTQ tables renamed): one side
    copies = []
    for example in corpus[::20]:
        table = example.table
        copies.append(
            json.dumps(
                {
                    "id": "copy-" + table.table_id,
                    "text": "another text",
                    "table": {
                        "header": [c.text for c in table.header],
                        "rows": [[c.text for c in row] for row in table.rows],
                    },
                }
            )
        )
    (tmp_path / "copies.jsonl").write_text("\n".join(copies) + "\n", encoding="utf-8")
    dm = PretrainDataModule(sources={**SOURCES, "jsonl": str(tmp_path / "copies.jsonl")}, cache_dir=str(tmp_path))
    sides = dm.split_corpus()
    side_of = {e.source: split for split, examples in sides.items() for e in examples}
    for example, line in zip(corpus[::20], range(1, len(copies) + 1)):
        assert side_of[example.source] == side_of[f"{tmp_path / 'copies.jsonl'}:{line}"]
    assert {side_of[e.source] for e in corpus[::20]} == {"train", "validation"}


def test_examples_fit_the_length_and_mask_whole_words(datamodule):
    data = datamodule.masked("train")
    tokenizer = datamodule.tokenizer
    predicted = total_words = 0
    for index in range(len(data)):
        example = data[(0, index)]
        assert len(example["input_ids"]) <= 128
        labels = example["labels"]
        picked = [i for i, label in enumerate(labels) if label != IGNORE]
        assert 1 <= len(picked) <= 20
        original = list(example["input_ids"])
        for i in picked:
            original[i] = labels[i]
        assert original[0] == tokenizer.cls_token_id and IGNORE not in original
        pieces = tokenizer.convert_ids_to_tokens(original)
        for i in picked:  # whole words: a masked piece's continuation pieces are masked with it
            if i + 1 < len(pieces) and pieces[i + 1].startswith("##"):
                assert labels[i + 1] != IGNORE
        predicted += len(picked)
        total_words += sum(1 for p in pieces[1:] if not p.startswith("##") and p not in ("[SEP]",))
    assert 0.08 < predicted / total_words < 0.2  # 15% of words, capped at 20 pieces


def test_masks_depend_on_seed_epoch_and_example_only(datamodule):
    data = datamodule.masked("train")
    again = datamodule.masked("train")
    assert data[(1, 5)] == again[(1, 5)]
    assert data[(0, 5)]["labels"] != data[(1, 5)]["labels"]  # masked afresh every epoch
    held_out = datamodule.masked("validation")
    examples = len(datamodule.encoded["validation"])
    assert len(held_out) == 4 * examples  # eval_masks fixed maskings
    copies = [held_out[3 + j * examples] for j in range(4)]
    assert len({tuple(c["labels"]) for c in copies}) > 1  # each copy masked its own way
    assert len({tuple(c["layout"]["row_ids"]) for c in copies}) == 1  # ... of the same example


def test_worker_processes_mask_as_the_main_process_does(datamodule):
    from torch.utils.data import DataLoader

    from mate_cli.data.pretraining import MaskedCollator

    data = datamodule.masked("train")
    sampler = EpochTagged(len(data), seed=5)
    sampler.set_epoch(3)
    here = [b.labels for b in DataLoader(data, batch_size=16, sampler=sampler, collate_fn=MaskedCollator())]
    there = [
        b.labels for b in DataLoader(data, batch_size=16, sampler=sampler, collate_fn=MaskedCollator(), num_workers=2)
    ]
    assert len(here) == len(there) and all(a.equal(b) for a, b in zip(here, there))


def test_the_training_sampler_hands_the_epoch_to_the_dataset_and_resumes_in_place():
    sampler = EpochTagged(10, seed=7)
    sampler.set_epoch(2)
    whole = list(sampler)
    assert {epoch for epoch, _ in whole} == {2} and sorted(i for _, i in whole) == list(range(10))
    sampler.skip_next(4)
    assert list(sampler) == whole[4:]


def test_batches_carry_labels_only_at_masked_positions(datamodule):
    loader = datamodule.train_dataloader()
    loader.sampler.set_epoch(0)
    batch = next(iter(loader))
    assert batch.input_ids.shape == batch.labels.shape and len(batch) == 8
    masked = batch.labels != IGNORE
    assert not (masked & ~batch.layout.attention_mask).any()
    changed = batch.input_ids[masked] != batch.labels[masked]
    assert 0.6 < changed.float().mean() < 1.0  # 80% [MASK] + 10% random change the piece; 10% keep it


def test_a_user_corpus_and_its_mistakes(tmp_path):
    good = {"text": "Kent wards", "table": {"header": ["ward", "people"], "rows": [["Beaver", "5,512"]]}}
    path = tmp_path / "tables.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n", encoding="utf-8")
    examples = read_corpus({"jsonl": [str(path)]})
    assert [e.table.table_id for e in examples] == ["tables:1", "tables:2"]
    with pytest.raises(MateError, match="dataset.sources.wikisql is not a corpus kind"):
        read_corpus({"wikisql": "x"})
    with pytest.raises(MateError, match="the pre-training corpus is empty"):
        read_corpus({"hybridqa": None, "jsonl": []})
    with pytest.raises(MateError, match="corpus file not found"):
        read_corpus({"jsonl": str(tmp_path / "absent.jsonl")})
    with pytest.raises(MateError, match=r"^dataset.sources.wtq=.*absent is not a folder; set it to a wtq dataset root"):
        read_corpus({"wtq": str(tmp_path / "absent")})
    with pytest.raises(MateError, match=r"^dataset.sources.sqa=.*: dataset.root .* has no table_csv/"):
        read_corpus({"sqa": str(tmp_path)})
    with pytest.raises(MateError, match=r"set e.g. dataset.val_fraction=0.1"):
        PretrainDataModule(sources={"jsonl": str(path)}, val_fraction=0.0, cache_dir=str(tmp_path)).setup("fit")


def test_short_budgets_keep_room_for_the_table_and_skip_only_too_wide_headers(tmp_path, caplog):
    narrow = {"text": "word " * 200, "table": {"header": ["ward", "people"], "rows": [["Beaver", "5,512"]]}}
    wide = {"text": "", "table": {"header": [f"column {i}" for i in range(80)], "rows": []}}
    path = tmp_path / "tables.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (narrow, wide, {**narrow, "text": "other"})) + "\n")
    dm = PretrainDataModule(sources={"jsonl": str(path)}, max_length=32, val_fraction=0.5, cache_dir=str(tmp_path))
    encoded = dm.encode(dm.corpus.examples())
    assert [row["source"].rsplit(":", 1)[1] for row in encoded] == ["1", "3"]  # the 80-column header is left out
    first = dm.tokenizer.convert_ids_to_tokens(encoded[0]["input_ids"])
    assert len(first) <= 32 and "ward" in first and "people" in first  # a 200-word text leaves the table its half
    assert "left out, their table header alone passes dataset.max_length=32" in caplog.text


# ------------------------------------------------------------------ the fine-tuning training tables only
def task_tables(task: str, split: str, tmp_path) -> set[str]:
    """The content keys of the tables of ``split``'s questions, as `mate train experiment=<task>_mate`
    composes and splits the bundled sample (real Hydra, the task's own datamodule)."""
    from hydra.utils import instantiate

    from tests.inprocess import compose_command

    cfg = compose_command("train", [f"experiment={task}_mate"], tmp_path / task)
    dm = instantiate(cfg.dataset)
    return {table_key(dm.reader.table(q.table_id)) for q in dm.questions(split)}


def pretrain_corpus(overrides: list[str], tmp_path) -> PretrainDataModule:
    from hydra.utils import instantiate

    from tests.inprocess import compose_command

    cfg = compose_command(
        "pretrain", ["dataset.sources.hybridqa=null", "dataset.tables=train", *overrides], tmp_path / "pretrain"
    )
    return instantiate(cfg.dataset)


def test_training_tables_only_never_a_validation_table(tmp_path):
    """`mate pretrain dataset.tables=train` reads, of each task, only tables its fine-tuning trains on."""
    kept = list(pretrain_corpus([], tmp_path).corpus.examples())
    everything = read_corpus({k: v for k, v in SOURCES.items() if k != "hybridqa"})
    for task in ("wtq", "sqa", "tabfact"):
        mine = {table_key(e.table) for e in kept if e.source.startswith(f"{task}:")}
        train, validation = task_tables(task, "train", tmp_path), task_tables(task, "validation", tmp_path)
        assert mine == train - validation and mine, task
        assert len(mine) < sum(e.source.startswith(f"{task}:") for e in everything)  # some tables were left out
    held_out = set().union(*(task_tables(task, "validation", tmp_path) for task in ("wtq", "sqa", "tabfact")))
    assert not {table_key(e.table) for e in kept} & held_out


def test_a_training_table_with_a_validation_tables_content_is_left_out(tmp_path):
    """The same table under another name (as SQA's are WikiTQ's) is held out by its content."""
    import shutil

    root = tmp_path / "wtq"
    shutil.copytree(DATA / "wtq_sample", root)
    corpus = pretrain_corpus(
        [f"dataset.sources.wtq={root}", "dataset.sources.sqa=null", "dataset.sources.tabfact=null"], tmp_path
    ).corpus
    train, _ = corpus.kept_tables()
    before = {e.table.table_id for e in corpus.examples()}
    validation = task_tables("wtq", "validation", tmp_path)
    a_train_table = sorted(before)[0]
    held = next(e for e in read_corpus({"wtq": str(root)}) if table_key(e.table) in validation)
    for suffix in (".csv", ".tsv", ".table"):  # the reader prefers a .tsv twin
        if (root / held.table.table_id).with_suffix(suffix).exists():
            shutil.copy((root / held.table.table_id).with_suffix(suffix), (root / a_train_table).with_suffix(suffix))
    after = {
        e.table.table_id
        for e in pretrain_corpus(
            [f"dataset.sources.wtq={root}", "dataset.sources.sqa=null", "dataset.sources.tabfact=null"], tmp_path
        ).corpus.examples()
    }
    assert a_train_table in train["wtq"] and after == before - {a_train_table}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["dataset.sources.hybridqa=data/hybridqa_sample"], "dataset.sources.hybridqa has no split: set it to null"),
        (["dataset.tables=some"], "dataset.tables='some' is invalid; use one of all, train"),
        (["dataset.splits.sqa=null"], "dataset.tables=train needs dataset.splits.sqa"),
    ],
)
def test_training_tables_mistakes_are_one_line(overrides, message, tmp_path):
    """As `mate pretrain` reports them (exit 2, nothing written: tests/integration/test_cli.py)."""
    from tests.inprocess import run_command

    with pytest.raises(MateError) as err:
        run_command("pretrain", ["dataset.sources.hybridqa=null", "dataset.tables=train", *overrides], tmp_path / "run")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_full_releases_corpus_reads_their_own_split_files(tmp_path):
    """`dataset=pretrain_tasks`: the full releases' train / dev files for WikiTQ and SQA (as
    conf/dataset/{wtq,sqa}.yaml), TabFact's validation file cut by table, no HybridQA."""
    from tests.inprocess import compose_command

    dataset = compose_command("pretrain", ["dataset=pretrain_tasks"], tmp_path).dataset
    train = compose_command("train", ["experiment=wtq_mate", "dataset=wtq"], tmp_path).dataset
    assert dataset.tables == "train" and dataset.sources.hybridqa is None and dataset.sources.jsonl is None
    assert dataset.splits.wtq.mode == dataset.splits.sqa.mode == train.split.mode == "files"
    tabfact = compose_command("train", ["experiment=tabfact_mate"], tmp_path).dataset.split
    assert dict(dataset.splits.tabfact) == dict(tabfact)
