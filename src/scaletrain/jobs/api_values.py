"""``scaletrain.submit()``'s arguments: handed to the request's own check, each refusal one line
naming the parameter.

Every field of :class:`~scaletrain.plan.request.JobRequest` is declared once, with its check, in
that class (:mod:`scaletrain.settings`); ``submit()`` passes the values it gets to the request and
names the keyword the caller typed when one is refused (the CLI's messages name the flag).
Only what is ``submit()``'s own is checked here: ``cluster``, ``program``, ``run_dir`` and ``env``,
and the few shapes a Python caller writes that are not the field's type (a str for ``modules``
or ``setup`` is one item, not a sequence of letters).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from scaletrain import settings
from scaletrain.errors import UsageError
from scaletrain.plan.request import JobRequest
from scaletrain.settings import SettingError, Spec

HINT = "see help(scaletrain.submit) and scaletrain.plan.request.JobRequest"
# fields submit() fills in itself (from its own parameters, or on the way to sbatch)
_SET_BY_SUBMIT = {"cluster": "cluster=", "script": "program=", "script_args": "program=",
                  "gpus": "gpus=", "nodes": "nodes=", "account": "account=", "command": "",
                  "profile_file": "cluster=FILE.toml", "files_dir": "run_dir=", "env_origin": "",
                  "python": "venv= or conda=", "stage_data_gb": "stage_data=: it is measured, as the CLI does",
                  "program_imports": ""}
# a str given for these is one item (one module, one set-up line), not a sequence of letters
_ONE_ITEM = {"modules", "setup"}
# the request's fields that submit()'s own parameters fill, by the keyword the caller typed
_KEYWORD = {"script": "program[0]", "script_args": "program", "profile_file": "cluster"}
# submit()'s own parameters (the rest are JobRequest's fields, declared there)
OWN: dict[str, Spec] = {
    "cluster": Spec(doc="a profile name or a .toml file", check=settings.text(
        shape="a profile name or a .toml file (str)")),
    "program": Spec(doc='the script and its arguments, e.g. program=["train.py", "--epochs", "10"]',
                    check=settings.texts(empty_ok=True, control_ok=True)),
    "run_dir": Spec(doc="the folder for the job's script, id and output", optional=True,
                    check=settings.path(shape="a folder path (str or Path)")),
    "check": Spec(doc="False skips the check before sbatch (as 'submit --no-check')", check=settings.boolean()),
}


def _own(name: str, value: object) -> Any:
    return settings.check_value(OWN[name], value, f"submit(): {name}")


def build_request(*, cluster: object, program: object, gpus: object, nodes: object, account: object,
                  run_dir: object, fields: Mapping[str, Any], check: object = True) -> JobRequest:
    """The JobRequest for ``submit()``'s arguments (UsageError naming the first bad one)."""
    name_or_file: str = _own("cluster", cluster)
    words = _own("program", program)
    if not words:
        raise UsageError("submit(): program must be a list: the script and its arguments", OWN["program"].doc)
    _own("run_dir", run_dir)
    _own("check", check)
    names = {f.name for f in dataclasses.fields(JobRequest)}
    for name in fields:
        if name not in names:
            raise UsageError(f"submit() has no option {name!r}", HINT)
        if name in _SET_BY_SUBMIT:
            how = _SET_BY_SUBMIT[name]
            raise UsageError(f"submit(): {name} is set by submit() itself" + (f" (use {how})" if how else ""), HINT)
    values: dict[str, Any] = {name: (v,) if name in _ONE_ITEM and isinstance(v, str) else v
                              for name, v in fields.items()}
    is_file = name_or_file.endswith(".toml") or os.sep in name_or_file
    # gpus, nodes and account are checked by the request itself (one check, where the value enters)
    unchecked: dict[str, Any] = {"gpus": gpus, "nodes": nodes, "account": account}
    try:
        req = JobRequest(cluster=name_or_file, script=words[0], script_args=tuple(words[1:]),
                         profile_file=str(Path(name_or_file).expanduser().absolute()) if is_file else None,
                         **unchecked, **values)
    except SettingError as err:   # the request's own check: said with the keyword, not the CLI flag
        raise err.renamed(f"submit(): {_KEYWORD.get(err.name, err.name)}") from None
    if req.venv:
        from scaletrain.envs.create import check_venv_dir

        req = dataclasses.replace(req, venv=check_venv_dir("venv=", os.path.abspath(os.path.expanduser(req.venv))))
    return req


def sbatch_environment(env: object) -> dict[str, str]:
    """This process's environment with ``env`` added on top: what sbatch (and so the job) gets."""
    merged = dict(os.environ)
    if env is None:
        return merged
    if not isinstance(env, Mapping):
        raise SettingError("submit(): env", "a dict of str to str (added to this process's environment)", env, HINT)
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SettingError("submit(): env", "a dict that maps str names to str values", {key: value}, HINT)
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise SettingError("submit(): env", "names and values an environment can hold", {key: value}, HINT)
        merged[key] = value
    return merged
