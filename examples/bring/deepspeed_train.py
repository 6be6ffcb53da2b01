"""A DeepSpeed training loop as the centres' guides write it: the config comes from
``--deepspeed --deepspeed_config FILE`` (``deepspeed.add_config_arguments``), the ranks from the
deepspeed launcher or from srun. argv[1]: output json (rank 0 writes world size, ZeRO stage,
final loss). On a machine without GPUs DeepSpeed runs on its CPU accelerator with gloo.

It trains inside a function and ends by destroying DeepSpeed's groups once the function has
returned. Why: every ZeRO collective runs on a group DeepSpeed creates itself, which its engine,
its optimizer, every parameter (``_dp_group``) and ``deepspeed.utils.groups`` hold;
``torch.distributed.destroy_process_group()`` releases none of them, so that group's gloo
worker threads lived into the interpreter's exit, and one still releasing a finished
all-gather there (it needs the GIL) made torch abort the process after training had finished
("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489). Released
here, the group is destroyed and its threads joined before Python shuts down; only the default
group's threads remain, and they never ran a collective.
"""

import argparse
import gc
import json

import deepspeed
import deepspeed.comm
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--local_rank", type=int, default=-1)   # the deepspeed launcher passes it
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    data = torch.Generator().manual_seed(1 + engine.global_rank)   # each rank its own batches
    for step in range(5):
        x = torch.randn(4, 16, generator=data).to(engine.device)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"world_size": engine.world_size, "stage": engine.zero_optimization_stage(),
                       "loss": loss.item()}, fh)
    engine.destroy()


main()                                  # the engine, optimizer and model are released here
deepspeed.comm.destroy_process_group()  # torch's groups and DeepSpeed's references to its own
gc.collect()                            # the engine's reference cycles: its group is destroyed
