"""``mate bench``: time, peak memory and FLOPs of the attention backends, kernel and encoder level.

:mod:`~mate_cli.bench.runner` walks the grid, one :mod:`~mate_cli.bench.cases` case per cell on the
:mod:`~mate_cli.bench.layouts` table, measured by :mod:`~mate_cli.bench.measure`; :mod:`~mate_cli.bench.report`
and :mod:`~mate_cli.bench.targets` turn the rows into files and verdicts.
"""
