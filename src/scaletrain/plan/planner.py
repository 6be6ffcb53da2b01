"""``make_plan``: a JobRequest and a ClusterProfile in, a Plan out, through named stages. Pure:
no I/O, no clock.

Each stage is a function from the records before it to one frozen record
(``scaletrain.plan.records``), and the Plan is the tuple of those records::

    settle      request, profile      -> Settled     the image, the environment found; checks
    resources   Settled               -> Allocation  nodes, GPUs, tasks, partition, CPUs, memory, disk
    software    Settled, Allocation   -> Software    set-up lines, interpreter, container, environment
    files       Settled, Allocation   -> Files       framework configs the job writes and reads

then ``render_script(plan)`` (``scaletrain.plan.render``) writes the text, reading the records
only. A fact of the job is decided in the one stage whose record holds it; a reader (the
summary, the pre-sbatch check, ``port``) reads the field. What the submitting machine measures
(the data's size, the program's imports, the account default, the environment running
scaletrain) is read before, by ``scaletrain.jobs.submit.plan_job``, and handed in.

Where a new thing goes: a cluster fact is a ``fact(...)`` of ``scaletrain.clusters.model`` (its
shape from ``scaletrain.settings``), read by the one stage that decides with it; a launcher is a
row of ``scaletrain.plan.launchers.SPECS`` (its tasks per node and its launch line); a refusal of
a request's value belongs to its setting (``JobRequest``), of what a cluster takes to settle (the
request's flags against the profile) or to the stage that computes the figure (a partition's
limits: ``scaletrain.clusters.resources``, which ``lint`` shares); a check of the job's Python on
the login node reads the plan's records (``scaletrain.envs.check``).
"""

from __future__ import annotations

from scaletrain.clusters.model import ClusterProfile
from scaletrain.plan.jobfiles import plan_files
from scaletrain.plan.records import Plan, RunningEnv
from scaletrain.plan.request import JobRequest
from scaletrain.plan.resources import plan_resources
from scaletrain.plan.settle import settle
from scaletrain.plan.software import plan_software

__all__ = ["Plan", "make_plan"]


def make_plan(request: JobRequest, profile: ClusterProfile, *, running: RunningEnv | None = None) -> Plan:
    """Lay out ``request`` on ``profile``: each stage once, in order.

    ``running``: the environment running scaletrain where this machine is the cluster's login node
    (``plan_job`` finds it; None elsewhere). Raises UsageError for contradictory flags,
    ProfileError for an unknown partition, and PlanError (exit 2, with a hint) for a job the
    cluster cannot run as asked.
    """
    settled = settle(request, profile, running=running)
    resources = plan_resources(settled)
    return Plan(settled=settled, resources=resources, software=plan_software(settled, resources),
                files=plan_files(settled, resources))
