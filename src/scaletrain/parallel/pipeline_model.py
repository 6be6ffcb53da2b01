"""One rank's share of a pipeline-parallel model, and its train step (``PipelineModel``).

Built by :func:`scaletrain.parallel.pipeline.apply` (``setup(strategy="pipeline")``), which
cuts the model into stages and makes the ``torch.distributed.pipelining`` stage and schedule;
this module is what the training loop then holds: ``step(x, y)``, the stage's parameters under
the original model's names, and the full state dict gathered over the stages.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.errors import StrategyError
from scaletrain.parallel.pipeline_split import StageSplit
from scaletrain.runtime import collectives
from scaletrain.torch_features import schedule_has_eval, schedule_step_parameters

__all__ = ["PipelineModel", "batch_size", "check_divisible"]


def batch_size(batch: Any) -> int | None:
    first = batch[0] if isinstance(batch, tuple) and batch else batch
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else None


def check_divisible(batch: Any, n_microbatches: int, what: str) -> None:
    size = batch_size(batch)
    if size is not None and size % n_microbatches:
        lower = size - size % n_microbatches
        raise StrategyError(
            f"{what} of {size} samples does not split into {n_microbatches} equal "
            "micro-batches",
            hint=f"use a batch of {lower or n_microbatches} or {lower + n_microbatches} per "
                 f"replica, or an n_microbatches that divides {size}")


class PipelineModel:
    """One rank's share of a pipeline-parallel model, and its train step.

    Attributes:
        stage_index: this rank's stage (0 = the first).
        n_stages: stages per pipeline.
        dp_size, dp_rank: pipeline replicas and this rank's replica.
        module: the stage module (unwrapped) as run here.
        stage: the ``torch.distributed.pipelining.PipelineStage``.
        schedule: the ``ScheduleGPipe``/``Schedule1F1B`` driving it.
        optimizer: the optimizer over this stage's parameters (``step()`` uses it).
        stage_of: the model's parameter name -> the stage that owns it.
        divide_grads: ``step()`` divides the gradients by ``n_microbatches`` itself (a torch
            whose schedules take no ``scale_grads``: 2.6).
    """

    def __init__(self, *, split: StageSplit, stage_index: int, dp_size: int, dp_rank: int,
                 module: nn.Module, wrapped: nn.Module, stage: Any, schedule: Any,
                 optimizer: torch.optim.Optimizer | None, n_microbatches: int,
                 mesh: Any, broadcast_loss: bool, traced_batch: int | None = None,
                 divide_grads: bool = False) -> None:
        self.stage_index = stage_index
        self.n_stages = split.n_stages
        self.dp_size = dp_size
        self.dp_rank = dp_rank
        self.module = module
        self.wrapped = wrapped
        self.stage = stage
        self.schedule = schedule
        self.optimizer = optimizer
        self.n_microbatches = n_microbatches
        self.mesh = mesh
        self.broadcast_loss = broadcast_loss
        self.method = split.method
        self.traced_batch = traced_batch
        self.divide_grads = divide_grads
        self.stage_of: dict[str, int] = split.owner_of()
        self._local_names: dict[str, str] = dict(split.param_names[stage_index])

    @property
    def is_first(self) -> bool:
        """True on the stage that takes the inputs."""
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """True on the stage that computes the loss."""
        return self.stage_index == self.n_stages - 1

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This stage's parameters under the original model's names (DTensors under FSDP)."""
        return [(self._local_names.get(n, n), p) for n, p in self.module.named_parameters()]

    def parameters(self) -> list[nn.Parameter]:
        """This stage's parameters (e.g. for gradient clipping)."""
        return [p for _, p in self.named_parameters()]

    def train(self, mode: bool = True) -> PipelineModel:
        """Set training mode on this stage's module."""
        self.module.train(mode)
        return self

    def eval(self) -> PipelineModel:
        """Set evaluation mode on this stage's module."""
        return self.train(False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StrategyError(
            "a pipeline model is not called like a module: its stages live on other ranks",
            hint="train with loss = pipe.step(inputs, targets) on every rank")

    def step(self, inputs: Any = None, targets: torch.Tensor | None = None, *,
             broadcast_loss: bool | None = None) -> torch.Tensor | None:
        """One optimizer step on one batch of this replica: zero_grad, pipeline, step.

        Every rank of the pipeline calls it with the same batch (the first stage uses the
        inputs, the last the targets; others may pass None). The batch is split into
        ``n_microbatches`` equal micro-batches.

        Returns:
            The batch's mean loss (detached) on the last stage, None elsewhere; with
            ``broadcast_loss`` every rank gets the mean over all replicas (one all-reduce).
        """
        if self.is_first:
            if inputs is None:
                raise StrategyError("the first pipeline stage needs the inputs",
                                    hint="call pipe.step(inputs, targets) on every rank")
            check_divisible(inputs, self.n_microbatches, "a batch")
        if self.is_last:
            if targets is None:
                raise StrategyError("the last pipeline stage needs the targets",
                                    hint="call pipe.step(inputs, targets) on every rank")
            check_divisible(targets, self.n_microbatches, "a batch of targets")
        self._check_traced_size(inputs if self.is_first else targets)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        args = (inputs if isinstance(inputs, tuple) else (inputs,)) if self.is_first else ()
        device = self.stage.device
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        # no merged outputs wanted; a torch before 2.10 has no return_outputs (and would hand it
        # to the model's forward)
        quiet = ({"return_outputs": False}
                 if "return_outputs" in schedule_step_parameters(self.schedule) else {})
        if self.is_last and targets is not None:  # checked above: the last stage has them
            self.schedule.step(*args, target=targets.to(device), losses=losses, **quiet)
        else:
            self.schedule.step(*args, **quiet)
        if self.divide_grads:  # what scale_grads=True does in torch's stage, for a torch without
            for p in self.wrapped.parameters():
                if p.grad is not None:
                    p.grad.div_(self.n_microbatches)
        if self.optimizer is not None:
            self.optimizer.step()
        loss = torch.stack([l.detach() for l in losses]).mean() if self.is_last else None
        if self.broadcast_loss if broadcast_loss is None else broadcast_loss:
            # the last stage of each replica contributes its loss; the sum over all ranks
            # divided by the replicas is the global mean, known everywhere
            total = loss.clone() if loss is not None else torch.zeros((), device=device)
            collectives.all_reduce(total)
            loss = total / self.dp_size
        return loss

    @torch.no_grad()
    def evaluate(self, inputs: Any = None, targets: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Forward only (validation): ``(outputs, mean loss)`` of a batch on the last stage.

        Every rank of the pipeline calls it (first stage: inputs; last stage: targets);
        None on the other stages. No gradients, no optimizer step.
        """
        if self.is_first:
            if inputs is None:
                raise StrategyError("the first pipeline stage needs the inputs",
                                    hint="call pipe.evaluate(inputs, targets) on every rank")
            check_divisible(inputs, self.n_microbatches, "a batch")
            self._check_traced_size(inputs)
        if self.is_last and targets is None:
            raise StrategyError("the last pipeline stage needs the targets",
                                hint="call pipe.evaluate(inputs, targets) on every rank")
        if not schedule_has_eval(self.schedule):
            raise StrategyError(
                "pipe.evaluate() needs torch 2.9 or newer, whose pipeline schedules have "
                f"eval() (this is torch {torch.__version__})",
                hint="use a newer torch for pipelined validation, or evaluate the whole "
                     "model outside the pipeline")
        device = self.stage.device
        args = (inputs if isinstance(inputs, tuple) else (inputs,)) if self.is_first else ()
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        if not self.is_last or targets is None:  # targets checked above on the last stage
            self.schedule.eval(*args)
            return None
        losses: list[torch.Tensor] = []
        outputs = self.schedule.eval(*args, target=targets.to(device), losses=losses)
        return outputs, torch.stack(losses).mean()

    def _check_traced_size(self, batch: Any) -> None:
        size = batch_size(batch)
        if self.traced_batch is not None and size is not None and size != self.traced_batch:
            raise StrategyError(
                f"this pipeline was traced with batches of {self.traced_batch} samples, "
                f"got {size}",
                hint="tracing fixes the shapes: keep the batch size of example_input "
                     "(drop_last=True in the loader), or pass stages=[...] instead")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every stage's parameters, full size on the CPU, under the model's names.

        A collective: call it on all ranks. FSDP shards are gathered within the replica
        first, then the stages' dicts over the pipeline group.
        """
        local: dict[str, torch.Tensor] = {}
        for name, p in self.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            local[name] = t.detach().cpu().clone()
        gathered = collectives.all_gather_objects(local, group=self.mesh.get_group("pipeline"))
        full: dict[str, torch.Tensor] = {}
        for part in gathered:
            full.update(part)
        return full

    @torch.no_grad()
    def load_full_state_dict(self, full: dict[str, torch.Tensor]) -> None:
        """Copy this stage's parameters out of a full dict (as ``full_state_dict()`` gives).

        A collective under FSDP (each replica's shard is cut from the full tensor); call it
        on all ranks. Keys of other stages are ignored; a missing key of this stage raises.
        """
        missing = [name for name, _ in self.named_parameters() if name not in full]
        if missing:
            raise StrategyError(f"the state dict lacks {len(missing)} parameter(s) of stage "
                                f"{self.stage_index}, e.g. {missing[0]!r}",
                                hint="pass a dict from full_state_dict() of the same model")
        for name, p in self.named_parameters():
            src = full[name].to(device=p.device, dtype=p.dtype)
            from torch.distributed.tensor import DTensor, distribute_tensor

            if isinstance(p, DTensor):  # a shard (FSDP across replicas)
                p.to_local().copy_(distribute_tensor(src, p.device_mesh, p.placements)
                                   .to_local())
            else:
                p.copy_(src)

    def describe(self) -> str:
        """Which stage owns which parameters, and where this rank sits."""
        lines = [f"pipeline: {self.n_stages} stages x {self.dp_size} replica(s), "
                 f"{self.n_microbatches} micro-batches, "
                 f"{type(self.schedule).__name__}, split {self.method}; this rank: stage "
                 f"{self.stage_index} of replica {self.dp_rank}"]
        for s in range(self.n_stages):
            names = [n for n, owner in self.stage_of.items() if owner == s]
            shown = ", ".join(names[:8]) + (f", ... ({len(names)} tensors)"
                                            if len(names) > 8 else "")
            lines.append(f"  stage {s}: {shown or '(no parameters)'}")
        return "\n".join(lines)
