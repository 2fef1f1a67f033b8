"""``mate bench``: time, peak memory and FLOPs of the attention backends, kernel and encoder level. ``runner`` walks
the grid, one ``cases`` case per cell on the ``layouts`` table, timed by ``measure``; ``results`` and ``targets`` write
the rows and verdicts."""
