"""A program whose own line makes torch warn: ``torch.tensor(t)`` of a tensor (torch's
"To copy construct from a tensor" UserWarning), on a CUDA tensor as a GPU program has it."""

import torch

weights = torch.ones(3).cuda()
copy = torch.tensor(weights)  # the line the warning is about
print("copied", copy.sum().item())
