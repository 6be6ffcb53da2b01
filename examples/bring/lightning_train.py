"""A Lightning program. argv[1]: "told" -> Trainer(devices=<workers per node>, num_nodes=...,
strategy="ddp", accelerator="cpu"); "untold" -> Trainer(accelerator="cpu", devices=1), the
common single-device form. argv[2]: output json (written by global rank 0)."""

import json
import os
import sys

import lightning as L
import torch


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
if sys.argv[1] == "told":
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", "1")))
    nodes = int(os.environ.get("SLURM_NNODES", "1")) if "LOCAL_WORLD_SIZE" not in os.environ else (
        int(os.environ["WORLD_SIZE"]) // per_node)
    trainer = L.Trainer(accelerator="cpu", devices=per_node, num_nodes=nodes, strategy="ddp",
                        max_epochs=1, enable_progress_bar=False, enable_model_summary=False,
                        logger=False, enable_checkpointing=False)
else:
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_progress_bar=False,
                        enable_model_summary=False, logger=False, enable_checkpointing=False)
trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=4))
if trainer.global_rank == 0:
    with open(sys.argv[2] if len(sys.argv) > 2 else os.devnull, "w") as fh:
        json.dump({"world_size": trainer.world_size}, fh)
# Lightning leaves the process group up after fit(); a gloo group left to the interpreter's exit
# can abort a worker with "terminate called without an active exception" (pytorch/pytorch#190489)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
