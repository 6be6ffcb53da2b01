"""``scaletrain env create --cluster NAME [--with PKGS] [DIR]``: a venv for jobs, on the cluster's PyTorch.

Run on the cluster's login node. The recipe (``scaletrain.envs.create``) follows the profile:
the centre's module, the Alliance's wheelhouse, or the container image. The flag to pass to
``plan``/``submit`` is printed at the end. Imports no torch.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

EXAMPLES = """\
examples:
  scaletrain env create --cluster roihu /projappl/project_2001234/st-env
  scaletrain env create --cluster narval --with accelerate ~/envs/st     # from the Alliance wheelhouse
  scaletrain env create --cluster lumi --with deepspeed /project/project_465000123/st-env   # in the container
  scaletrain env create --cluster roihu --dry-run DIR                     # print the commands only
then: scaletrain submit --cluster NAME --venv DIR ...   (see docs/clusters.md)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``env`` verb (``env create``)."""
    from scaletrain.cli.args import name, text

    p = subparsers.add_parser("env", help="make a Python environment for jobs on a cluster's own PyTorch",
                              description="Python environments for jobs.", epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="env_verb", metavar="ACTION", parser_class=type(p))
    c = sub.add_parser("create", help="a venv with scaletrain on the cluster's PyTorch (run on its login node)",
                       description="Build a venv on the cluster's own PyTorch (its module, its wheelhouse, or "
                                   "inside its container) with scaletrain and what the launcher needs; print "
                                   "the --venv flag for plan/submit.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("directory", nargs="?", type=text(), metavar="DIR",
                   help="where to make it (default ./scaletrain-env-CLUSTER)")
    c.add_argument("--cluster", type=name, metavar="NAME", help="cluster profile (required unless --profile)")
    c.add_argument("--profile", type=text(), metavar="FILE", help="a cluster profile .toml file")
    c.add_argument("--with", dest="with_", type=text(), metavar="PKGS",
                   help="launcher packages to add: accelerate, deepspeed, lightning (comma-separated)")
    c.add_argument("--container", type=text(), metavar="IMG",
                   help="build inside this image (default: the profile's image, where its software is a container)")
    c.add_argument("--module", action="append", default=[], type=text(), metavar="M",
                   help="load this module instead of the profile's (repeatable)")
    c.add_argument("--dry-run", action="store_true", help="print the commands, build nothing")
    c.set_defaults(func=run_create)
    p.set_defaults(func=_no_action)


def _no_action(args: argparse.Namespace) -> int:
    from scaletrain.errors import UsageError

    raise UsageError("env needs an action", "scaletrain env create --cluster NAME [DIR]")


def run_create(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain env create``."""
    import dataclasses

    import scaletrain
    from scaletrain.clusters.profile import load_profile
    from scaletrain.envs.check import this_arch
    from scaletrain.envs.create import TENSORFLOW, EnvRecipe, check_venv_dir, create_script, known_packages, parse_with
    from scaletrain.errors import UsageError
    from scaletrain.plan.settle import image as job_image
    from scaletrain.plan.request import JobRequest

    if not args.cluster and not args.profile:
        raise UsageError("for which cluster? --cluster NAME is required",
                         "e.g. scaletrain env create --cluster roihu DIR (see 'scaletrain clusters')")
    profile = load_profile(args.profile if args.profile else args.cluster)
    if profile.retired:
        then = f"; its successor is {profile.successor}" if profile.successor else ""
        raise UsageError(f"{profile.name} stopped taking jobs ({profile.retired}){then}",
                         f"make the environment on a live system: scaletrain env create --cluster "
                         f"{profile.successor or 'NAME'} DIR")
    if profile.scheduler != "slurm":
        raise UsageError(f"the {profile.name} profile runs here, in this Python: no environment to make",
                         "name a cluster: scaletrain env create --cluster roihu DIR")
    packages = parse_with(args.with_, known_packages(profile))
    directory = os.path.abspath(os.path.expanduser(args.directory or f"scaletrain-env-{profile.name}"))
    check_venv_dir("DIR", directory)
    flag = f"--venv {shlex.quote(str(directory))}"   # a hint to paste into a shell: quoted
    if _existing(Path(directory), clean=not args.dry_run):
        print(f"scaletrain: {directory} is already an environment env create finished", file=sys.stderr)
        print(flag)
        return 0
    # the same rule as a job's: --container, else the profile's default image unless --module
    # (no program: a stand-in name, never run; the request checks --container and --module as a job's)
    probe = JobRequest(cluster=profile.name, script="env-create", container=args.container,
                       modules=tuple(args.module))
    if TENSORFLOW in packages:   # the centre's TensorFlow module, not its PyTorch image
        probe = dataclasses.replace(probe, launcher="tensorflow")
    recipe = EnvRecipe(directory=directory, packages=packages, image=job_image(probe, profile),
                       modules=tuple(args.module))
    text = create_script(profile, recipe, scaletrain_dir=os.path.dirname(scaletrain.__file__))
    machine = this_arch()
    if profile.cpu_arch and machine and machine != profile.cpu_arch:
        # compiled wheels and the module's own Python differ between x86_64 and aarch64
        print(f"scaletrain: warning: this machine is {machine}, {profile.name}'s GPU nodes are {profile.cpu_arch}: "
              f"build the environment on a login node of that architecture, or in a job on a GPU node",
              file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(text)
        print(f"scaletrain: dry run: nothing built; then pass {flag}", file=sys.stderr)
        return 0
    print(f"scaletrain: making {directory} on the {profile.name} software (takes a minute)", file=sys.stderr)
    _build(Path(directory), recipe, profile, os.path.dirname(scaletrain.__file__))
    print(flag)
    print(f"scaletrain: pass {flag} to 'scaletrain plan' / 'scaletrain submit'", file=sys.stderr)
    return 0


def _existing(target: Path, *, clean: bool) -> bool:
    """True when ``target`` is an environment env create finished; False when it is missing or an
    empty folder (built into); else UsageError saying what is there. With ``clean``, dead
    builds' partial folders beside it are removed."""
    from scaletrain.envs.finished import ENV_MARKER, discard, finished_env, stale_builds
    from scaletrain.errors import UsageError

    for stale in stale_builds(target) if clean else []:
        discard(stale)
        print(f"scaletrain: removed {stale}: a build of this environment that was stopped part-way",
              file=sys.stderr)
    if not os.path.lexists(target) or (target.is_dir() and not target.is_symlink()
                                       and not any(target.iterdir())):
        return False
    why = finished_env(target)
    if why is None and (target / ENV_MARKER).is_file():
        return True
    raise UsageError(f"{target} exists, is not empty and is not an environment env create finished "
                     f"({why or 'it holds other files'})",
                     "give a new folder, or remove this one first (its content is not scaletrain's)")


def _build(target: Path, recipe: Any, profile: Any, scaletrain_dir: str) -> None:
    """Run the recipe in a partial folder beside ``target``; move it into place only when every
    step passed (a kill part-way leaves nothing under the target's name)."""
    import dataclasses

    import scaletrain
    from scaletrain.envs.create import create_script
    from scaletrain.envs.finished import discard, finish, partial_dir
    from scaletrain.errors import DistEnvError

    partial = partial_dir(target)
    try:
        text = create_script(profile, dataclasses.replace(recipe, directory=str(partial)),
                             scaletrain_dir=scaletrain_dir, final=str(target))
        proc = subprocess.run(["bash", "-c", text], check=False)
        if proc.returncode != 0:
            raise DistEnvError(f"making {target} failed (exit {proc.returncode}; its output is above)",
                               "run it on a login node of the cluster; --dry-run shows the commands")
        finish(partial, target, {"scaletrain": scaletrain.__version__, "cluster": profile.name,
                                 "packages": ",".join(recipe.packages)})
    except BaseException:
        discard(partial)
        raise
