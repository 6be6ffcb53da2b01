"""``scaletrain.submit()``'s arguments checked and typed, each refusal one line naming the parameter.

The CLI's flags are checked by argparse types (``scaletrain.cli.args``); a Python caller passes
values directly, so the same bounds are applied here to what ``submit()`` gets: the declared
type of each :class:`~scaletrain.plan.request.JobRequest` field (read from its annotation, so a
new field is covered without an edit here), booleans that are booleans (``requeue="no"`` is
not true), counts that are whole numbers within ``MAX_COUNT``, finite sizes, text without control
characters. A str where a list of items is expected (``modules="pytorch"``) is one item, not
a list of letters; ``env``-like pairs may be a mapping.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from scaletrain.errors import UsageError
from scaletrain.plan.request import JobRequest
from scaletrain.plan.values import MAX_COUNT, check_text

HINT = "see help(scaletrain.submit) and scaletrain.plan.request.JobRequest"
# fields submit() fills in itself (from its own parameters, or on the way to sbatch)
_SET_BY_SUBMIT = {"cluster": "cluster=", "script": "program=", "script_args": "program=",
                  "gpus": "gpus=", "nodes": "nodes=", "account": "account=", "command": "",
                  "profile_file": "cluster=FILE.toml", "files_dir": "run_dir=", "env_origin": "",
                  "python": "venv= or conda=", "program_imports": ""}
# a str given for these is one item (one module, one set-up line), not a sequence of letters
_ONE_ITEM = {"modules", "setup"}


def _fail(name: str, what: str, value: object) -> UsageError:
    shown = repr(value)
    return UsageError(f"submit(): {name}={shown[:60]} {what}", HINT)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, "must be a whole number (int)", value)
    if not 1 <= value <= MAX_COUNT:
        raise _fail(name, f"must be from 1 to {MAX_COUNT:,}", value)
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(name, "must be a non-empty str", value)
    return check_text(f"submit(): {name}", value)


def _items(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        if name in _ONE_ITEM:
            return (_text(name, value),)
        raise _fail(name, "must be a list of str, not one str", value)
    if not isinstance(value, (list, tuple)):
        raise _fail(name, "must be a list of str", value)
    return tuple(_text(f"{name}[{i}]", v) for i, v in enumerate(value))


def _pairs(name: str, value: object) -> tuple[tuple[str, str], ...]:
    items = list(value.items()) if isinstance(value, Mapping) else value
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        raise _fail(name, "must be a dict of str to str (or a list of (key, value) pairs)", value)
    out = []
    for pair in items:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise _fail(name, "must map str keys to str values", value)
        out.append((_text(f"{name} key", pair[0]), check_text(f"submit(): {name}[{pair[0]!r}]", pair[1])))
    return tuple(out)


def _value(name: str, annotation: str, value: Any) -> Any:
    """``value`` as the field's declared type (``str | None``, ``int``, ``tuple[str, ...]``...)."""
    kinds = {k.strip() for k in annotation.split("|")}
    if value is None:
        if "None" in kinds:
            return None
        raise _fail(name, "must not be None", value)
    if "bool" in kinds:
        if not isinstance(value, bool):
            raise _fail(name, "must be True or False", value)
        return value
    if "int" in kinds:
        return _count(name, value)
    if "float" in kinds:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise _fail(name, "must be a finite number above 0", value)
        return float(value)
    if "str" in kinds:
        return _text(name, value)
    if "tuple[tuple[str, str], ...]" in kinds:
        return _pairs(name, value)
    if "tuple[str, ...]" in kinds:
        return _items(name, value)
    raise _fail(name, f"has a type submit() cannot take ({annotation})", value)   # a field added later


def build_request(*, cluster: object, program: object, gpus: object, nodes: object, account: object,
                  run_dir: object, fields: Mapping[str, Any]) -> JobRequest:
    """The JobRequest for ``submit()``'s arguments (UsageError naming the first bad one)."""
    if not isinstance(cluster, str) or not cluster.strip():
        raise _fail("cluster", "must be a profile name or a .toml file (str)", cluster)
    if isinstance(program, (str, bytes)) or not isinstance(program, Sequence) or not program:
        raise UsageError("submit(): program must be a list: the script and its arguments",
                         'e.g. program=["train.py", "--epochs", "10"]')
    words = [w if isinstance(w, str) else _fail_word(i, w) for i, w in enumerate(program)]
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise _fail("run_dir", "must be a folder path (str or Path)", run_dir)
    types = {f.name: str(f.type) for f in dataclasses.fields(JobRequest)}
    for name in fields:
        if name not in types:
            raise UsageError(f"submit() has no option {name!r}", HINT)
        if name in _SET_BY_SUBMIT:
            how = _SET_BY_SUBMIT[name]
            raise UsageError(f"submit(): {name} is set by submit() itself" + (f" (use {how})" if how else ""), HINT)
    values = {name: _value(name, types[name], v) for name, v in fields.items()}
    if "venv" in values and values["venv"]:
        from scaletrain.envs.create import check_venv_dir

        values["venv"] = check_venv_dir("venv=", os.path.abspath(os.path.expanduser(values["venv"])))
    from scaletrain.envs.imports import program_imports

    is_file = cluster.endswith(".toml") or os.sep in cluster
    values.setdefault("program_imports", program_imports(words[0], cwd=values.get("chdir")))
    return JobRequest(cluster=cluster, script=_text("program[0]", words[0]),
                      script_args=tuple(check_text(f"submit(): program[{i + 1}]", w) for i, w in enumerate(words[1:])),
                      gpus=None if gpus is None else _count("gpus", gpus),
                      nodes=None if nodes is None else _count("nodes", nodes),
                      account=None if account is None else _text("account", account),
                      profile_file=str(Path(cluster).expanduser().absolute()) if is_file else None, **values)


def _fail_word(index: int, word: object) -> str:
    raise _fail(f"program[{index}]", "must be a str", word)


def sbatch_environment(env: object) -> dict[str, str]:
    """This process's environment with ``env`` added on top: what sbatch (and so the job) gets."""
    merged = dict(os.environ)
    if env is None:
        return merged
    if not isinstance(env, Mapping):
        raise _fail("env", "must be a dict of str to str (added to this process's environment)", env)
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise _fail("env", "must map str names to str values", {key: value})
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise _fail("env", "holds a name or value no environment can hold", {key: value})
        merged[key] = value
    return merged
