"""``scaletrain env create``: a venv on the cluster's own PyTorch, with scaletrain and the launcher's packages.

``create_script`` writes the bash that builds it (pure, so it is tested and shown by
``--dry-run``); the CLI runs it on the login node. Three recipes, from the profile:

- modules (CSC, JSC): load the profile's modules, ``python3 -m venv --system-site-packages DIR``
  so the module's torch stays visible, then ``pip install`` the launcher's packages;
- the Alliance (the profile builds its job venv from the centre's wheelhouse): ``module load
  python``, ``virtualenv --no-download DIR``, ``pip install --no-index torch PACKAGES``
  (docs.alliancecan.ca/wiki/Python: the wheelhouse, no internet needed);
- a container (LUMI's AI Factory images): the venv is made by the image's own Python, inside
  ``singularity exec``, with ``--system-site-packages`` (the LUMI AI guide's way to add packages);
  jobs put its ``bin`` first on the container's PATH.

``--with tensorflow`` makes a venv for TensorFlow jobs instead: on the centre's TensorFlow module
where the profile names one (CSC: "The virtual environment needs to be created with the correct
python module activated"; the module brings tensorflow, so pip adds none), and from the wheelhouse
on the Alliance, without torch in either case (a TensorFlow job imports neither torch nor scaletrain).

scaletrain itself is copied from the installation that runs this command into the venv's
site-packages: it is pure Python, needs no index or network, and is the very version that wrote
the job's script (``torch`` and ``numpy`` come from the cluster's PyTorch).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from scaletrain import settings
from scaletrain.clusters.profile import ClusterProfile
from scaletrain.errors import UsageError
from scaletrain.plan.values import check_text

q = shlex.quote
# --with NAME -> what pip installs (the launchers whose package the centre's PyTorch may lack)
PACKAGES = {"accelerate": "accelerate", "deepspeed": "deepspeed", "lightning": "lightning"}
TENSORFLOW = "tensorflow"


@dataclass(frozen=True, kw_only=True)
class EnvRecipe:
    """What to build: where, on which software, with which extra packages."""

    directory: str                  # absolute path of the venv
    packages: tuple[str, ...] = ()  # pip names (PACKAGES values)
    image: str | None = None        # build inside this container image
    modules: tuple[str, ...] = ()   # --module: load these instead of the profile's


# Characters that a venv's bin/activate would let the shell read: CPython's activate before
# 3.11.11/3.12.8/3.13.1 writes the folder's path into double quotes unescaped (CVE-2024-9287), so
# "$(cmd)" or a backquote in the name runs cmd on every activation; the rest are shell syntax.
_SHELL_SPECIAL = re.compile(r"[$`\\\"'!;&|<>(){}*?\[\]#\x00-\x1f\x7f]")


def check_venv_dir(flag: str, path: str) -> str:
    """``path`` unchanged, or UsageError when a venv there would run shell code on activation."""
    m = _SHELL_SPECIAL.search(path)
    if m:
        raise UsageError(f"{flag} {path[:80]!r}: the folder's name holds {m.group()!r}, which a venv's "
                         "activate script would hand to the shell (older Pythons run $(...) in it)",
                         "use a folder name of letters, digits and - _ . / only")
    return path


def parse_with(text: str | None, wheels: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``accelerate,deepspeed`` -> the pip names; UsageError naming the known ones otherwise.

    ``wheels``: the frameworks the cluster's wheelhouse has (the profile's ``wheels``: the
    Alliance's tensorflow and horovod), also accepted.
    """
    if not text:
        return ()
    known = {**PACKAGES, **(wheels or {})}
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"--with {','.join(bad)}: not a launcher package scaletrain knows",
                         "use any of: " + ", ".join(known))
    torch_only = [n for n in names if n in PACKAGES]
    if TENSORFLOW in names and torch_only:
        # a TensorFlow venv is made on the centre's TensorFlow, without torch: the PyTorch
        # launchers' packages have nothing to run on there (Horovod also works with TensorFlow)
        raise UsageError(f"--with {','.join(names)}: tensorflow goes in a venv without "
                         f"{', '.join(torch_only)}, which need torch",
                         "make one venv --with tensorflow for TensorFlow jobs and another for the rest")
    return tuple(dict.fromkeys(known[n] for n in names))


def known_packages(profile: ClusterProfile) -> dict[str, str]:
    """The ``--with`` names ``profile`` can build: the wheelhouse's frameworks (the Alliance's
    tensorflow and horovod) and tensorflow where the centre has a TensorFlow module."""
    known = dict(profile.wheels)
    if profile.tensorflow_setup_lines:
        known.setdefault(TENSORFLOW, TENSORFLOW)
    return known


def for_tensorflow(recipe: EnvRecipe) -> bool:
    """True when the venv is for TensorFlow jobs (built on the centre's TensorFlow, without torch)."""
    return TENSORFLOW in recipe.packages


def wheelhouse(profile: ClusterProfile) -> bool:
    """True for a profile whose jobs install torch from the centre's wheelhouse (the Alliance)."""
    return any("--no-index" in line for line in profile.python_env_lines)


# a module or an image: a word of the command it is given to, never one it reads as an option
_WORD = settings.Spec(doc="a name, e.g. --module pytorch/2.5", check=settings.operand())


def _word(flag: str, value: str) -> str:
    checked: str = settings.check_value(_WORD, value, flag)
    return checked


def _module_lines(profile: ClusterProfile, recipe: EnvRecipe) -> list[str]:
    # a TensorFlow job loads the centre's TensorFlow (plan.software.setup_lines): its venv is made there
    tf = for_tensorflow(recipe) and profile.tensorflow_setup_lines
    lines = list(profile.tensorflow_setup_lines if tf else profile.setup_lines)
    if recipe.modules:
        lines = [ln for ln in lines if not ln.lstrip().startswith("module load")]
        lines.append("module load " + " ".join(q(_word("--module", m)) for m in recipe.modules))
    return lines


def create_script(profile: ClusterProfile, recipe: EnvRecipe, *, scaletrain_dir: str,
                  final: str | None = None) -> str:
    """The bash that builds ``recipe.directory`` on ``profile``'s software (ends with a newline).

    ``scaletrain_dir`` is the folder of the running ``scaletrain`` package (copied in); ``final``
    the folder the build is moved to once complete (``envs.finished``), for the last message.
    """
    d = q(check_venv_dir("DIR", check_text("DIR", recipe.directory)))
    tf = for_tensorflow(recipe)
    packages = recipe.packages
    if tf and profile.tensorflow_setup_lines and not wheelhouse(profile):
        packages = tuple(p for p in packages if p != TENSORFLOW)   # the module's own tensorflow
    pkg = " ".join(q(p) for p in packages)
    base = "TensorFlow" if tf else "PyTorch"
    lines = ["#!/bin/bash", f"# scaletrain env create for {profile.name}: a venv on the cluster's {base}",
             "set -eo pipefail"]
    if recipe.image:
        from scaletrain.plan.software import runtime

        wrap = f"{runtime(profile)}" + "".join(f" -B {q(b)}" for b in profile.container_binds)
        run = f"{wrap} {q(_word('--container', recipe.image))}"
        lines += list(profile.container_setup_lines) + ["set -u",
                  f"{run} python3 -m venv --system-site-packages {d}"]
        pip = f"{run} {d}/bin/python -m pip install --quiet"
    elif wheelhouse(profile):
        lines += _module_lines(profile, recipe) + ["set -u",
                  f"virtualenv --no-download {d} || python3 -m venv {d}",
                  f"{d}/bin/python -m pip install --no-index --quiet --upgrade pip",
                  f"{d}/bin/python -m pip install --no-index --quiet {'numpy' if tf else 'torch numpy'}"]
        pip = f"{d}/bin/python -m pip install --no-index --quiet"
    else:
        lines += _module_lines(profile, recipe) + ["set -u",
                  f"{profile.python} -m venv --system-site-packages {d}"]
        pip = f"{d}/bin/python -m pip install --quiet"
    if pkg:
        lines.append(f"{pip} {pkg}")
    # the package copied below takes its one optional dependency from here: without it,
    # checkpoints are checked with zlib's CRC-32 (slower), and ones saved with CRC-32C elsewhere
    # cannot be checked
    lines.append(f"{pip} crc32c || echo \"scaletrain: crc32c could not be installed; checkpoints "
                 "use zlib's CRC-32\" >&2")
    site = (f"{'' if not recipe.image else run + ' '}{d}/bin/python -c "
            "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'")
    lines += [f'site="$({site})"',
              f"cp -R {q(check_text('the scaletrain package', scaletrain_dir))} \"$site\"/",
              'find "$site/scaletrain" -name __pycache__ -prune -exec rm -rf {} +',
              "# the job's imports, checked here rather than after its wait in the queue",
              f"{'' if not recipe.image else run + ' '}{d}/bin/python -c "
              f"{q('import scaletrain' + ('' if tf else ', torch') + ''.join(', ' + p for p in recipe.packages))}",
              f"echo \"scaletrain: made {final or recipe.directory}\" >&2"]
    return "\n".join(lines) + "\n"
