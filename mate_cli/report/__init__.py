"""`mate report`: run dirs on disk (no W&B) -> one row per configuration, each metric over seeds: collect reads,
aggregate groups and summarises, render writes, screen shows."""
