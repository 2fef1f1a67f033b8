"""mate_cli/console.py: what a command prints when its output is a file or a pipe (as under pytest): nothing
wrapped or cut, the whole resolved config in the run's log file only."""

from __future__ import annotations

import logging

from omegaconf import OmegaConf

from mate_cli.console import print_config, print_outputs


def test_output_lines_are_aligned_and_never_cut(capsys):
    long = "/very/long/" + "x" * 300 + "/last.ckpt"
    print_outputs({"run dir": "/runs/a", "last checkpoint": long})
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["run dir:         /runs/a", f"last checkpoint: {long}"]


def test_print_config_shows_the_overrides_on_screen_and_the_whole_config_in_the_log_file(capsys, tmp_path):
    log_file = tmp_path / "train.log"
    handler = logging.FileHandler(log_file)
    logging.getLogger().addHandler(handler)
    try:
        cfg = OmegaConf.create({"dataset": {"max_length": 512}, "seed": 3, "run": "${seed}"})
        print_config(cfg, ["seed=3"], tmp_path / "run")
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    screen = capsys.readouterr().out
    assert "overrides: seed=3" in screen and f"run dir:   {tmp_path / 'run'}" in screen
    assert "max_length" not in screen  # the config is not on screen unless asked for (whole=True)
    logged = log_file.read_text()
    assert "config (resolved):" in logged and "max_length: 512" in logged and "run: 3" in logged
