"""Job planning and Slurm script rendering: pure functions, dataclasses in, text out.

A request becomes a batch script through named stages (``scaletrain.plan.planner``): settle,
resources, software, files, each a function from the records before it to one frozen record
(``scaletrain.plan.records``), then render.

    from scaletrain.plan import JobRequest, make_plan, render_script, render_summary
    from scaletrain.clusters.profile import load_profile
    plan = make_plan(JobRequest(cluster="roihu", gpus=8, account="project_1", script="train.py"),
                     load_profile("roihu"))
    print(render_script(plan))

Names resolve lazily so that importing the package costs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "JobRequest": "scaletrain.plan.request",
    "LAUNCHERS": "scaletrain.plan.request",
    "Plan": "scaletrain.plan.records",
    "StagePlan": "scaletrain.plan.records",
    "make_plan": "scaletrain.plan.planner",
    "render_script": "scaletrain.plan.render",
    "launch_command": "scaletrain.plan.render",
    "render_summary": "scaletrain.plan.summary",
    "plan_to_dict": "scaletrain.plan.summary",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scaletrain.plan' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
