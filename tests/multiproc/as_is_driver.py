"""Two launches in one Python process, the second under SCALETRAIN_TORCH_AS_IS=1, as a
notebook or a sweep script calling the launcher twice would: prints, after each launch, which
of torch's functions are still scaletrain's and whether the launcher's exit would skip the
interpreter's teardown."""

import json
import os
import sys

from torch.distributed.elastic.multiprocessing import api, tail_log
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

from scaletrain.contract.environ import TORCH_AS_IS_VAR
from scaletrain.launch import lean
from scaletrain.launch.local import launch
from scaletrain.launch.spec import RunRequest, plan_launch


def state() -> dict:
    ours = {name: bool(getattr(fn, "_scaletrain", False) or getattr(fn, "_scaletrain_together", False))
            for name, fn in (("close", api.PContext.close), ("tailer", tail_log.tail_logfile),
                             ("event_names", rdzv.get_method_name))}
    return {"ours": ours, "skip_teardown": lean._STATE["skip_teardown"]}


program = sys.argv[1]
seen = []
with lean.cli_launch():
    for as_is in ("", "1"):
        if as_is:
            os.environ[TORCH_AS_IS_VAR] = as_is
        plan = plan_launch(RunRequest(target=program, nproc_per_node=1), environ=os.environ, gpus=0)
        code = launch(plan)
        seen.append({"code": code, **state()})
print("STATE " + json.dumps(seen), flush=True)
