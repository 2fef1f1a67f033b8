"""A run's life around the commands: the job around a command's task (``job``), its folder claimed (``lock``), a sweep
run again (``sweep``) and a stage started from an earlier sweep's run (``stages``), a trained run rebuilt from its
folder (``rebuild``), and which run a resume continues (``resume``)."""
