"""examples/cifar10_cnn.py with a checkpoint folder and the Monitor: stop it, run it again, it resumes.

    python examples/resumable_cnn.py --out runs/demo &     # trains; Ctrl-C-free stop below
    kill -USR1 $!                                          # saves at the next step, exits 75
    python examples/resumable_cnn.py --out runs/demo       # resumes at the saved step
    scaletrain report runs/demo                            # text summary + runs/demo/report.html

A stop signal is safe at any moment: one that arrives while the program is still starting (torch
takes seconds to import) is noted by the first lines below and acted on after the first step.

Under Slurm the same file needs nothing more: ``scaletrain submit --requeue`` sends USR1 before
the time limit and requeues the job, ``scaletrain cancel RUN --save`` stops it without a requeue.
The Checkpointer saves every ``--save-every`` steps and at a stop; the Monitor writes
``OUT/monitor/metrics.jsonl`` (one ``start`` line per run, giving the step it resumed from).
"""

from __future__ import annotations

import signal

# Python's default action for USR1/USR2/TERM ends the program; until scaletrain.init() sets its
# handler, note such a signal here instead, and hand it over once the Checkpointer listens.
_EARLY: list[int] = []
for _sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
    signal.signal(_sig, lambda signum, frame: _EARLY.append(signum))

import argparse  # noqa: E402  (after the handlers: this file's imports take seconds)
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

import scaletrain  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cifar10_cnn import Net, synthetic_cifar  # noqa: E402  (the same model and data)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/resumable", help="checkpoints/ and monitor/ go here")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    args = p.parse_args(argv)

    env = scaletrain.init()          # also makes USR1/TERM/USR2 stop requests
    ckpt = scaletrain.Checkpointer(Path(args.out) / "checkpoints", keep=2, every_steps=args.save_every)
    if _EARLY:                       # the Checkpointer listens now: it saves and stops at the first step
        name = signal.Signals(_EARLY[0]).name
        print(f"rank {env.rank}: {name} arrived while the program was starting; it saves and stops "
              "after a step", file=sys.stderr, flush=True)
        os.kill(os.getpid(), _EARLY[0])
    torch.manual_seed(0)
    model = Net().to(env.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = scaletrain.setup(model, optimizer, strategy="ddp")
    dataset = synthetic_cifar(args.samples, 0)
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    per_epoch = len(loader)

    state = {"model": model, "optimizer": optimizer}
    start = ckpt.load_latest(state) or 0
    monitor = scaletrain.Monitor(Path(args.out) / "monitor", total_steps=args.epochs * per_epoch,
                                 start_step=start)
    scaletrain.print(f"starting at step {start} of {args.epochs * per_epoch}")
    criterion = nn.CrossEntropyLoss()
    step = start
    for epoch in range(start // per_epoch, args.epochs):
        sampler.set_epoch(epoch)         # the same shuffle as an uninterrupted run
        for i, (images, labels) in enumerate(monitor.data(loader)):
            if epoch * per_epoch + i < start:
                continue                 # batches this epoch trained before the stop
            loss = criterion(model(images.to(env.device)), labels.to(env.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            monitor.step(samples=len(images), loss=loss.detach())
            ckpt.step(step, state)       # saves every --save-every steps; on a stop: saves, exits 75
    monitor.close()
    ckpt.close()
    scaletrain.shutdown()


if __name__ == "__main__":
    main()
