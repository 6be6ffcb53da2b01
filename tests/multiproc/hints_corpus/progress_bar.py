"""A training loop with a tqdm-style progress bar, as Lightning's and many course programs print:
each update redraws the bar after a carriage return, on stderr, with no newline until the end."""

import sys

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 40
for step in range(1, steps + 1):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    done = step * 20 // steps
    sys.stderr.write(f"\rEpoch 0: {100 * step // steps:3d}%|{'#' * done}{' ' * (20 - done)}| "
                     f"{step}/{steps} [00:00<00:00, loss=0.{step:03d}]")
    sys.stderr.flush()
sys.stderr.write("\n")
print("done")
