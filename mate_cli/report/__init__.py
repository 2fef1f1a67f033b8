"""`mate report`: runs on disk -> one row per configuration, median and half-IQR over seeds.

- :mod:`mate_cli.report.collect`: find run dirs under a folder and read what each left
  (``resolved_config.yaml``, ``metrics.json``, ``FAILED``, ``.hydra/``); no W&B.
- :mod:`mate_cli.report.aggregate`: group runs into configurations and summarise each
  metric over seeds (median, half-IQR, n), as the MATE paper reports.
- :mod:`mate_cli.report.render`: the table's text, ``report.md``, ``report.csv`` and the PNGs.
"""
