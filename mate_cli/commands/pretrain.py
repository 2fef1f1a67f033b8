"""`mate pretrain`: masked-LM pre-training on tables (MATE §3.2, App. A.1), `mate train`'s loop on
``conf/pretrain.yaml``. ``mate train model.encoder.pretrained=<run dir>/encoder`` fine-tunes from the export."""

from __future__ import annotations

from mate_cli.commands.common import hydra_app
from mate_cli.commands.train import objective, train

main = hydra_app(__name__, train, objective)  # objective: val/mlm_loss, the monitored metric
