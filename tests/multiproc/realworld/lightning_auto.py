"""A Lightning program that lets the Trainer choose the device (or says accelerator="gpu")."""

import sys

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from agree import report


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(5, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


accelerator = sys.argv[1] if len(sys.argv) > 2 else "auto"
L.seed_everything(0)
gen = torch.Generator().manual_seed(3)
data = TensorDataset(torch.randn(64, 5, generator=gen), torch.randn(64, 1, generator=gen))
model = Regressor()
trainer = L.Trainer(accelerator=accelerator, devices="auto", max_epochs=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, DataLoader(data, batch_size=8))
report(list(model.parameters()), accelerator=type(trainer.accelerator).__name__,
       devices=trainer.num_devices, steps=trainer.global_step)
