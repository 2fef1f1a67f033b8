"""mate_cli's Hydra sweeper plugins (:mod:`.continuing`)."""
