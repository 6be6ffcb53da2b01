"""Property test (issue 8): random valid requests on every profile render scripts that pass
``bash -n``, lint with zero errors, and keep every request value literal - the program's words
as the shell will split them, the #SBATCH values as sbatch will read them.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, reject, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from scaletrain.clusters.profile import list_profiles, load_profile  # noqa: E402
from scaletrain.errors import PlanError, ProfileError  # noqa: E402
from scaletrain.lint import lint_text  # noqa: E402
from scaletrain.lint.script import parse_script  # noqa: E402
from scaletrain.plan.launchers import LAUNCHERS, SPECS  # noqa: E402
from scaletrain.plan.planner import make_plan  # noqa: E402
from scaletrain.plan.render import render_script  # noqa: E402
from scaletrain.plan.request import JobRequest  # noqa: E402

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")

CLUSTERS = [c for c in list_profiles() if c != "local" and not load_profile(c).retired]
# Any text without control characters (those are refused, see test_plan_fidelity).
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=12)
# a value the request refuses when blank (spaces only: "must be one line of text, not blank")
FILLED = TEXT.filter(str.strip)
WORD = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}", fullmatch=True)
# a value that lands on a command line as a word of its own (a script, a container image): one that
# starts with "-" is refused, since the command would read it as an option (settings.operand)
OPERAND = FILLED.filter(lambda s: not s.lstrip().startswith("-"))


@st.composite
def requests(draw):
    cluster = draw(st.sampled_from(CLUSTERS))
    prof = load_profile(cluster)
    per = prof.gpus_per_node
    nodes = draw(st.integers(1, 3))
    gpn = per if nodes > 1 else draw(st.integers(1, per))
    launcher = draw(st.sampled_from(LAUNCHERS))
    kw = dict(cluster=cluster, nodes=nodes, gpus_per_node=gpn, account=draw(WORD),
              launcher=launcher, script=draw(OPERAND),
              script_args=tuple(draw(st.lists(TEXT, max_size=4))), job_name=draw(FILLED),
              requeue=draw(st.booleans()) and SPECS[launcher].requeue_ok, device=draw(st.sampled_from(("auto", "cpu"))),
              env=tuple((k, v) for k, v in draw(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}",
                                                                             fullmatch=True), TEXT,
                                                                 max_size=2)).items()),
              mail_type=draw(st.sampled_from((None, "END", "END,FAIL"))),
              sbatch_extra=(("comment", draw(FILLED)),) if draw(st.booleans()) else ())
    if draw(st.booleans()):
        kw["cpus_per_gpu"] = draw(st.integers(1, prof.cores_per_gpu))
    if draw(st.booleans()) and prof.scratch_var:
        kw["stage_data"] = "/" + draw(TEXT.filter(lambda t: "/" not in t and t.strip(".")))
    if draw(st.booleans()):
        kw["container"] = draw(OPERAND)
    shape = draw(st.sampled_from(("gpu", "gpu", "cpu", "gpus_per_proc", "mps")))
    if shape == "cpu":   # a CPU-only job on the same nodes
        kw.pop("gpus_per_node"), kw.pop("cpus_per_gpu", None)
        kw["cpus"] = draw(st.integers(1, prof.cores_per_node))
    elif shape == "gpus_per_proc" and gpn % 2 == 0 and not SPECS[kw["launcher"]].per_node:
        kw["gpus_per_proc"] = 2
    elif shape == "mps" and prof.gpu_vendor == "nvidia" and nodes == 1 and not SPECS[kw["launcher"]].per_node:
        kw["procs_per_gpu"] = draw(st.integers(2, 4))
    return JobRequest(**kw), prof


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_random_requests_render_runnable_clean_literal_scripts(case) -> None:
    request, profile = case
    try:
        plan = make_plan(request, profile)
    except (PlanError, ProfileError):
        reject()   # a valid request the cluster cannot run (a 3-node job in a 2-node partition,
        #            a CPU-only job on a profile without a CPU partition)
    text = render_script(plan)
    syntax = subprocess.run([BASH, "-n"], input=text, text=True, capture_output=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr + text
    errors = [f for f in lint_text(text, profile=profile).findings if f.severity == "error"]
    assert errors == [], (errors, text)
    # #SBATCH values as sbatch reads them (quotes, escapes, '#'; the real sbatch: tests/slurm)
    header = parse_script(text, "job.sh")
    assert header.option("job-name").value == request.job_name
    assert header.option("account").value == request.account
    for name, value in request.sbatch_extra:
        assert header.option(name).value == value
    # the program's words as the shell splits the launch line: the script and its arguments, last
    launch = [ln for ln in text.splitlines() if ln.startswith("srun --kill-on-bad-exit=1 ")][-1]
    words = shlex.split(launch.removesuffix(" &"))
    tail = words[len(words) - 1 - len(request.script_args):]
    assert tail == [request.script, *request.script_args]
    # exported values, as the shell will set them
    for key, value in request.env:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"export {key}="))
        assert shlex.split(line[len("export "):]) == [f"{key}={value}"]
