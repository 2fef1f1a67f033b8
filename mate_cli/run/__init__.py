"""A run's life around the commands: the job around a task (``task``), its names (``naming``), its folder claimed
(``lock``), a trained run rebuilt from its folder (``rebuild``), exact resume and whole checkpoints (``resume``),
what a run's config may instantiate (``targets``) and the safe reader of its YAML (``yaml_data``), signals
(``interrupts``) and non-finite numbers (``divergence``)."""
