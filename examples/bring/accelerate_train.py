"""An Accelerate training loop as the guides write it. argv[1]: "cpu" -> Accelerator(cpu=True),
"plain" -> Accelerator() (on a CPU machine each process then runs alone). argv[2]: output json."""

import json
import os
import sys

import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=sys.argv[1] == "cpu")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, opt, loader = accelerator.prepare(model, opt, loader)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
# one line from the main process, so whoever runs it sees that it trained, and with how many
accelerator.print(f"trained {len(loader)} steps on {accelerator.num_processes} process(es), "
                  f"last loss {loss.item():.4f}")
if accelerator.is_main_process:
    with open(sys.argv[2] if len(sys.argv) > 2 else os.devnull, "w") as fh:
        json.dump({"num_processes": accelerator.num_processes}, fh)
# as Accelerate's examples end: stops trackers and destroys the process group (a gloo group left
# to the interpreter's exit can abort a worker with "terminate called without an active exception",
# pytorch/pytorch#190489)
accelerator.wait_for_everyone()   # every rank done before any tears its connections down
accelerator.end_training()
