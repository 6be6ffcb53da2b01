"""The shape of a single-GPU course program (the "before" of every guide's DDP conversion): it
picks ``cuda`` if available and trains; it never forms a process group."""

import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
for step in range(5):
    x = torch.randn(8, 16, device=device)
    y = torch.randint(0, 2, (8,), device=device)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.3f}")
