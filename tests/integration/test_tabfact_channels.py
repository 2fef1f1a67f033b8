"""TabFact's per-channel accuracies (``<stage>/accuracy_simple``, ``<stage>/accuracy_complex``): with the
upstream id lists present, each is the accuracy over the statements of that channel's tables. The bundled sample
has no id lists, so a copy of it gets them; real Hydra composition, the real MiniLM, a real Lightning validation."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.inprocess import build, compose_command
from tests.helpers import REPO_ROOT


def test_each_channels_accuracy_is_the_accuracy_over_its_tables_statements(tmp_path):
    root = tmp_path / "tabfact"
    shutil.copytree(REPO_ROOT / "data" / "tabfact_sample", root)
    tables = sorted(json.loads((root / "tokenized_data" / "val_examples.json").read_text()))
    channel_of = {t: ("simple" if i % 3 else "complex") for i, t in enumerate(tables)}
    for channel in ("simple", "complex"):
        ids = [t for t, c in channel_of.items() if c == channel]
        (root / "data" / f"{channel}_ids.json").write_text(json.dumps(ids))
    cfg = compose_command(
        "train", ["experiment=tabfact_mate", f"dataset.root={root}", "dataset.max_length=128"], tmp_path / "run"
    )
    datamodule, model, trainer = build(cfg, tmp_path / "run")
    (metrics,) = trainer.validate(model, datamodule=datamodule, verbose=False)
    rows = model.predictions
    assert len({p["table_id"] for p in rows}) > 3

    def accuracy(keep) -> float:
        kept = [p["label"] == p["gold"] for p in rows if keep(p)]
        assert kept, "every channel holds statements"
        return sum(kept) / len(kept)

    assert metrics["val/accuracy"] == pytest.approx(accuracy(lambda p: True), abs=1e-6)
    for channel in ("simple", "complex"):
        expected = accuracy(lambda p: channel_of[p["table_id"]] == channel)
        assert metrics[f"val/accuracy_{channel}"] == pytest.approx(expected, abs=1e-6), channel
    names = ("val/accuracy", "val/accuracy_simple", "val/accuracy_complex")
    assert len({round(metrics[name], 6) for name in names}) == 3  # distinct here, so a mixed-up channel shows
