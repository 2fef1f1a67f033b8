"""The command line checked before anything loads: the check (``check``), what each key may hold (``schema``) and
Hydra's argument syntax (``hydra_args``)."""
