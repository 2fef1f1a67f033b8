"""Kernel- and encoder-level benchmarks of the attention backends (``mate bench``).

- :mod:`~mate_cli.bench.layouts`: realistic long tables (query + R x C multi-token cells).
- :mod:`~mate_cli.bench.cases`: backend name -> one measured call (kernel / encoder,
  inference / train), including the FlexAttention and ``transformers`` anchors.
- :mod:`~mate_cli.bench.measure`: median wall time, peak memory (RSS high-water delta
  on CPU, ``max_memory_allocated`` on GPU), FLOPs (``FlopCounterMode``).
- :mod:`~mate_cli.bench.runner`: the grid, memory/time skips, one row per cell.
- :mod:`~mate_cli.bench.report`: ``bench.csv``, rich tables, log-log PNGs.
- :mod:`~mate_cli.bench.targets`: the targets of ``bench.targets`` (``conf/bench.yaml``) checked on a run's rows.
"""
