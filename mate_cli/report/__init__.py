"""`mate report`: run dirs on disk (no W&B) -> one row per configuration, each metric over seeds.

:mod:`~mate_cli.report.collect` reads the runs, :mod:`~mate_cli.report.aggregate` groups and summarises them,
:mod:`~mate_cli.report.render` and :mod:`~mate_cli.report.screen` write and show the table.
"""
