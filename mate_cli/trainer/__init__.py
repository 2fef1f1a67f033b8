"""What a Trainer needs of mate that is neither a LightningModule nor a callback: parameter groups and the schedule
(``optim``), the quiet W&B logger (``wandb_logger``), and the one place that reads Lightning's internals
(``lightning_internals``)."""
