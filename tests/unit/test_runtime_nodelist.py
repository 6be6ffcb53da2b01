"""Slurm host-list and task-list expansion: documented forms, bad input, and scontrol itself."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime.nodelist import (MAX_RANGE, expand_hostlist, first_host,
                                         parse_tasks_per_node)

FORMS: list[tuple[str, list[str]]] = [
    # the documented forms
    ("nid[001-004,007]", ["nid001", "nid002", "nid003", "nid004", "nid007"]),
    ("gpu-[1,3-5],cpu7", ["gpu-1", "gpu-3", "gpu-4", "gpu-5", "cpu7"]),
    ("a[01-02]b[1-2]", ["a01b1", "a01b2", "a02b1", "a02b2"]),
    # single hosts and plain lists
    ("localhost", ["localhost"]),
    ("n1", ["n1"]),
    ("n1,n2", ["n1", "n2"]),
    ("n1,n1", ["n1", "n1"]),  # duplicates kept, as Slurm does
    ("node-01.cluster.example", ["node-01.cluster.example"]),
    ("r1i0n3", ["r1i0n3"]),
    # whitespace and stray commas
    (" n1 , n2 ", ["n1", "n2"]),
    ("n1 n2", ["n1", "n2"]),
    ("n1\tn2\n", ["n1", "n2"]),
    ("n[1-2],,n3", ["n1", "n2", "n3"]),
    ("x,", ["x"]),
    ("n[ 1 - 2 ]", ["n1", "n2"]),
    # ranges and padding
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[5]", ["n5"]),
    ("n[05]", ["n05"]),
    ("n[0]", ["n0"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[008-011]", ["n008", "n009", "n010", "n011"]),
    ("n[008-11]", ["n008", "n009", "n010", "n011"]),  # width of the low bound
    ("n[9-010]", ["n9", "n10"]),
    ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ("n[099-101]", ["n099", "n100", "n101"]),
    ("n[1,1]", ["n1", "n1"]),
    ("n[1-2,03-4]", ["n1", "n2", "n03", "n04"]),
    ("n[3,1]", ["n3", "n1"]),  # order as written
    ("[1-2]", ["1", "2"]),
    ("n1[1-2]", ["n11", "n12"]),
    ("n-[1-2]", ["n-1", "n-2"]),
    ("a.b[1-2]", ["a.b1", "a.b2"]),
    # several lists, brackets inside and outside commas
    ("n[1-2],m[3-4]", ["n1", "n2", "m3", "m4"]),
    ("nid[001-002],login1,gpu[10-11]", ["nid001", "nid002", "login1", "gpu10", "gpu11"]),
    # cartesian products, in Slurm's order
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("a[1-2]-[3-4]", ["a1-3", "a1-4", "a2-3", "a2-4"]),
    ("n[1-2]0[3-4]", ["n103", "n104", "n203", "n204"]),
    ("n[0-1]x[2-3]y[4-5]", ["n0x2y4", "n0x2y5", "n1x2y4", "n1x2y5",
                            "n0x3y4", "n0x3y5", "n1x3y4", "n1x3y5"]),
    ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"]),
    # a suffix after the last bracket (InfiniBand names)
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("jwb[0001-0002]i", ["jwb0001i", "jwb0002i"]),
]


@pytest.mark.parametrize(("text", "hosts"), FORMS, ids=[f[0].strip() or "blank" for f in FORMS])
def test_expand_hostlist_forms(text, hosts):
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


def test_at_least_thirty_forms():
    assert len(FORMS) >= 30


def test_large_range_and_limit():
    hosts = expand_hostlist("n[0-65535]")
    assert len(hosts) == MAX_RANGE and hosts[-1] == "n65535"
    with pytest.raises(DistEnvError, match="more than 65536"):
        expand_hostlist("n[1-70000]")


BAD = ["", "   ", ",", "n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[]", "n[1-]", "n[-2]",
       "n[1--2]", "n[1-2-3]", "n[[1-2]]", "n[1-2]]",
       "n[\u0661-\u0663]", "n[\u0966]"]   # Arabic-Indic and Devanagari digits: Slurm reads ASCII only (issue 22)


@pytest.mark.parametrize("text", BAD)
def test_bad_hostlists_raise_one_line_with_hint(text):
    with pytest.raises(DistEnvError) as info:
        expand_hostlist(text)
    err = info.value
    assert "\n" not in err.message and err.hint
    assert "nid[001-004,007]" in err.hint


def test_error_class_can_be_chosen_for_user_input():
    with pytest.raises(UsageError):
        expand_hostlist("n[1-", error=UsageError)
    with pytest.raises(UsageError):
        first_host("", error=UsageError)


@pytest.mark.parametrize(("text", "counts"), [
    ("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("2,1", [2, 1]), ("1(x2)", [1, 1]),
    ("8(x1)", [8]), (" 3 ( x 2 ) , 4", [3, 3, 4]), ("0", [0]),
])
def test_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x)", "2(x0)", "-1", "2(x3)1", "\u0664", "2(x\u0663)"])
def test_tasks_per_node_bad(text):
    with pytest.raises(DistEnvError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node(text)


# --- differential: our expansion against Slurm's own ------------------------------------

def _random_range(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        width = rng.choice([1, 1, 2, 3, 4])
        lo = rng.randint(0, 10 ** min(width, 3) - 1)
        lo_text = str(lo).zfill(width)
        if rng.random() < 0.3:
            parts.append(lo_text)
        else:
            hi = lo + rng.randint(0, 12)
            parts.append(f"{lo_text}-{str(hi).zfill(rng.choice([1, width]))}")
    return ",".join(parts)


def _random_hostlist(rng: random.Random) -> str:
    items = []
    for _ in range(rng.randint(1, 4)):
        prefix = rng.choice(["n", "nid", "gpu-", "r1i", "a.b", "x", "c-0"])
        kind = rng.random()
        if kind < 0.2:
            items.append(f"{prefix}{rng.randint(0, 99)}")
        elif kind < 0.75:
            items.append(f"{prefix}[{_random_range(rng)}]")
        else:  # two or three dimensions; Slurm 22.05 rejects text after the last bracket
            dims = rng.choice([2, 2, 3])
            text = prefix
            for d in range(dims):
                text += f"[{_random_range(rng)}]"
                if d < dims - 1 and rng.random() < 0.6:
                    text += rng.choice(["b", "-", "x0"])
            items.append(text)
    return rng.choice([",", ",", " "]).join(items)


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """``scontrol`` with a throw-away slurm.conf: ``show hostnames`` needs a config to start
    (without one it tries DNS SRV records and dies) but never contacts a controller."""
    exe = shutil.which("scontrol")
    if exe is None:
        pytest.skip("scontrol not installed (apt-get install slurm-client) - differential "
                    "test against Slurm's own hostlist expansion skipped")
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text("ClusterName=hostlisttest\nSlurmctldHost=localhost\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=localhost Default=YES\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)}

    def run(text: str) -> list[str]:
        proc = subprocess.run([exe, "show", "hostnames", text], env=env, capture_output=True,
                              text=True, timeout=30)
        if proc.returncode != 0 or "Invalid hostlist" in proc.stdout + proc.stderr:
            raise AssertionError(f"scontrol refused {text!r}: {proc.stdout}{proc.stderr}")
        return proc.stdout.split()

    try:
        assert run("n[1-2]") == ["n1", "n2"]
    except (AssertionError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"scontrol cannot run here: {exc}")
    return run


def test_documented_forms_match_scontrol(scontrol):
    for text in ["nid[001-004,007]", "gpu-[1,3-5],cpu7", "a[01-02]b[1-2]", "n[9-010]",
                 "n[0-1]x[2-3]y[4-5]", "n[008-11]"]:
        assert expand_hostlist(text) == scontrol(text), text


def test_random_hostlists_match_scontrol(scontrol):
    rng = random.Random(20261122)
    for _ in range(150):
        text = _random_hostlist(rng)
        assert expand_hostlist(text) == scontrol(text), text
