"""Test-wide settings: offline everything, outputs and caches in temp dirs."""

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist: the cores are shared out among the workers
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers))
    )  # torch, here and in `mate`

# Triton fixes its mode when first imported (torch._dynamo imports it early): without a GPU,
# the test processes and their `mate` subprocesses run its kernels in the interpreter
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_ROOT = REPO_ROOT / "data" / "hybridqa_sample"


@pytest.fixture(scope="session")
def sample_root() -> Path:
    return SAMPLE_ROOT


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from mate_cli.pretrained import bundled_model_dir

    return Path(bundled_model_dir())


@pytest.fixture
def pretrained_runs(tmp_path, monkeypatch):
    """``MATE_OUTPUT_DIR`` with a finished dense and MATE ``mate pretrain`` run (their encoder/:
    the bundled MiniLM with a fresh masked-LM head, saved as `mate pretrain` saves), for the
    experiments fine-tuning from them."""
    from mate_cli.pretrained import load_tokenizer
    from mate_cli.modeling.encoder import TableEncoder
    from mate_cli.modeling.mlm import MaskedLMHead, mlm_state_dict

    encoder = TableEncoder.from_pretrained("minilm", "dense", max_length=128, reset_position_index_per_cell=True)
    head = MaskedLMHead(encoder.config, encoder.embeddings.word_embeddings)
    for attention in ("dense", "mate"):
        run = tmp_path / "outputs" / "pretrain" / f"2026-01-01_00-00-00-pretrain_{attention}-x"
        encoder.save_pretrained(
            run / "encoder", tokenizer=load_tokenizer("minilm"), extra_state=mlm_state_dict(head), prefix="tapas."
        )
    monkeypatch.setenv("MATE_OUTPUT_DIR", str(tmp_path / "outputs"))


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory):
    """``module_tmp(name)``: a new folder for a module-scoped fixture, removed once the module's
    tests are done, unless one of them failed (kept, like a failed test's ``tmp_path``).

    A module's runs hold checkpoints (hundreds of MB each); kept to the session's end, the
    suite's folders outgrew the free disk of a CI machine."""
    made: list[Path] = []
    failed = request.session.testsfailed

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    if request.session.testsfailed == failed:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """``trained(name)``: the run dir of a shared trained run (:mod:`tests.shared_runs`),
    read-only; at the session's end every file of it must be as it was.

    The first test that asks for a run pays for training it (10-40 s, over 20 s for some),
    once for the whole session and its workers."""
    from tests.shared_runs import shared_root, shared_run, snapshot

    root = shared_root(tmp_path_factory)
    seen: dict[str, tuple[Path, dict]] = {}

    def get(name: str) -> Path:
        if name not in seen:
            run = shared_run(root, name)
            seen[name] = (run, snapshot(run))
        return seen[name][0]

    yield get
    changed = [name for name, (run, files) in seen.items() if snapshot(run) != files]
    assert not changed, (
        f"tests changed the shared runs {changed}: copy a shared run (tests.shared_runs.copy_run) to change it"
    )


#: the folders whose modules take longest, collected first: pytest-xdist (``--dist loadfile``)
#: hands each worker whole modules in collection order, so the long ones start early and the
#: short ones fill in at the end, instead of one long module finishing alone on one core
LONG_FIRST = ("tests/integration/", "tests/bench/", "tests/conf/")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next((i for i, folder in enumerate(LONG_FIRST) if item.nodeid.startswith(folder)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: each module keeps its own order
