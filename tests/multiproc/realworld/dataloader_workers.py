"""A CUDA program with `DataLoader(num_workers=2, pin_memory=True)`, a helper thread that
prepares batches on the GPU, and the core list of a centre's node pinned by hand."""

import os
import queue
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from agree import report


class Squares(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        x = torch.full((4,), float(i) / 32)
        return x, x.square().sum(0, keepdim=True)


local_rank = int(os.environ["LOCAL_RANK"])
os.sched_setaffinity(0, range(local_rank * 32, local_rank * 32 + 32))  # a 64-core node's half
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1).cuda(), device_ids=[local_rank])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = Squares()
loader = DataLoader(data, batch_size=4, num_workers=2, pin_memory=True,
                    sampler=DistributedSampler(data, shuffle=False))
batches: queue.Queue = queue.Queue(maxsize=2)


def prefetch() -> None:  # moves each batch to the GPU on its own stream, as prefetchers do
    stream = torch.cuda.Stream()
    for x, y in loader:
        with torch.cuda.stream(stream):
            batches.put((x.cuda(non_blocking=True), torch.as_tensor(y, device="cuda")))
    batches.put(None)


helper = threading.Thread(target=prefetch)
helper.start()
steps = 0
while (item := batches.get()) is not None:
    x, y = item
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
helper.join()
report(list(model.parameters()), steps=steps, cores=len(os.sched_getaffinity(0)))
dist.destroy_process_group()
