"""Every Lightning callback mate adds to a Trainer: signals (``interrupts``), a lost DDP rank (``ranks``), non-finite
numbers (``divergence``), the training budget over calls (``budget``), exact resume's state and the continuous CSV log
(``resume_state``), progress lines and the Rich bar (``progress_log``), throughput and peak memory (``throughput``) and
the step profile (``step_profile``)."""
