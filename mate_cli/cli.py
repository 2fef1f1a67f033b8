"""`mate <command> [hydra overrides]`: one Hydra app per command.

``mate --help`` lists the commands; ``mate <command> --help`` shows Hydra's help
with the config groups; ``mate <command> --cfg job`` prints the composed config.
Errors users can cause (`MateError`) print one line and exit with status 2.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": ("mate_cli.commands.train", "fit a model (Hydra app, conf/train.yaml)"),
    "eval": ("mate_cli.commands.eval", "evaluate a checkpoint (conf/eval.yaml)"),
    "pointr": ("mate_cli.commands.pointr", "PointR end to end: cell selection, then the reader (conf/pointr.yaml)"),
    "predict": ("mate_cli.commands.predict", "answer one question about one table (conf/predict.yaml)"),
    "bench": ("mate_cli.commands.bench", "time/memory/FLOPs of attention backends (conf/bench.yaml)"),
}

USAGE = """usage: mate <command> [overrides...] [--help] [-m]

Transformers over large tables: MATE, PointR and baselines, driven by Hydra configs.

commands:
{commands}

examples:
  mate train experiment=hybridqa_mate
  mate train -m experiment=hybridqa_mate attention=mate,dense seed=1,2
  mate eval ckpt_path=outputs/train/<run>/checkpoints/last.ckpt
"""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = "\n".join(f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items())
    return USAGE.format(commands=lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"mate: error: unknown command '{command}'; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"mate-{command}", *rest]
    module.main()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
