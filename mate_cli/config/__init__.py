"""The config, before anything loads and as a run dir holds it: the command-line check (``check``), what each key may
hold (``schema``, from the generated ``parameter_types``; ``signatures`` writes that table) and Hydra's argument syntax
(``hydra_args``); the names a run gets and the ``${mate.*:}`` resolvers composition needs (``naming``); a run dir's
YAML read as data (``yaml_data``), the ``_target_`` values it may name (``run_targets``) and the options added since it
was trained (``recorded``)."""
