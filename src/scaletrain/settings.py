"""One vocabulary for every setting a user gives: its type, default, doc, unit and check, declared once.

Every field of a cluster profile is one: its ``fact(...)`` (``clusters/model.py``) is a setting
with the TOML file's options, checked by these shapes when a profile is loaded. So are the settings
of the Python API and the CLI: the fields of
``JobRequest`` (``plan``/``submit`` and ``scaletrain.submit()``), of ``MonitorConfig``, the
options of ``Checkpointer`` and ``save()``'s step, the seconds of a wait (``slurm.poll.SECONDS``:
``Job.wait()``, ``cancel()``'s ``wait_s``), ``cancel()``'s save, ``Job.logs()``'s rank,
``scale_lr``'s values, ``loader()``'s batch sizes, seed, workers and epoch, ``estimate_memory()``'s
world size and the pipeline's ``n_microbatches``. A setting is declared beside its field::

    mem_per_gpu_gb: float | None = setting("memory per GPU", default=None, unit="GB",
                                           check=number(low=MIN_MEM_GB), flag="--mem-per-gpu")

and checked once, where the value enters (``check_fields`` in the dataclass's
``__post_init__``; ``check_value`` for a class that is not a dataclass). Every refusal is one line
in one style, naming the parameter the user typed - the CLI flag, or the keyword of the call::

    --mem-per-gpu must be a finite number from 0.0009765625 (GB), got 0.0001
    submit(): mem_per_gpu_gb must be a finite number from 0.0009765625 (GB), got 0.0001
    Checkpointer: every_minutes must be a finite number above 0 (minutes), got nan

A setting whose caller promises a narrower error (a strategy's option, ``StrategyError``) names a
subclass of both in its ``Spec(error=...)``: the same line, and the promised type.

Floats are finite and in range (NaN compares false with every bound, so each bound is written as
the test that must hold), enumerations match exactly (``"AMD"`` is not ``"amd"``: the allowed
values are named), booleans are booleans (``requeue="no"`` is not true), and a count is an int.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Iterable, Mapping

from scaletrain.errors import UsageError

# The most GPUs (or nodes, processes, cores) one job may count: far above any real job (the largest
# machines have ~40,000 GPUs), small enough that loops over a count stay short. The CLI bounds each
# flag with it, the planner the GPUs a layout adds up to (scaletrain.plan.values re-exports it).
MAX_COUNT = 100_000
# C0 controls (newline, carriage return, tab, escape, NUL...), DEL and the C1 range: a value holding
# one could end a line of a generated script early, or drive a terminal.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def has_control(value: str) -> bool:
    """True when ``value`` holds a control character (newline, tab, escape, NUL, DEL...)."""
    return bool(CONTROL.search(value))


class Bad(Exception):
    """Raised by a check: the shape the value should have had (``a whole number from 1``)."""


Check = Callable[[Any], Any]   # the value, normalised (an int where a float is declared -> float), or Bad


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A setting's declaration: what it means, its unit, how its value is checked, its CLI flag."""

    doc: str
    check: Check
    unit: str = ""
    flag: str | None = None     # the CLI flag that feeds it, named in the CLI's messages
    optional: bool = False      # None is a value (the default: "not given")
    # the class a refusal raises (default SettingError): a subclass of SettingError that is also
    # the caller's own error, so a setting of a strategy is refused as the StrategyError it promises
    error: type[SettingError] | None = None


class SettingError(UsageError):
    """A value refused by its declaration: one line naming the parameter (exit code 2)."""

    def __init__(self, param: str, shape: str, value: Any, hint: str = "", *, name: str = "") -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        super().__init__(f"{param} must be {shape}, got {shown}", hint)
        self.param, self.shape, self.value = param, shape, value
        self.name = name or param   # the setting's own name (a dataclass field's)

    def renamed(self, param: str) -> SettingError:
        """The same refusal naming ``param`` (the keyword a Python caller typed, not the flag)."""
        return type(self)(param, self.shape, self.value, self.hint, name=self.name)


class SettingTypeError(SettingError, TypeError):
    """A refusal of a value of the wrong kind where the function promised TypeError (``Job(None)``,
    as Python's own calls do): the same one line, caught by either ``except``."""


def setting(doc: str, *, check: Check, default: Any = MISSING, factory: Callable[[], Any] | None = None,
            unit: str = "", flag: str | None = None, compare: bool = True,
            error: type[SettingError] | None = None) -> Any:
    """A dataclass field declared as a setting (read back by :func:`check_fields`); ``compare``
    False leaves it out of the class's ``==`` and hash, as ``dataclasses.field`` does; ``error``
    as :class:`Spec`'s."""
    spec = Spec(doc=doc, check=check, unit=unit, flag=flag, optional=default is None, error=error)
    if factory is not None:
        return field(default_factory=factory, compare=compare, metadata={"setting": spec})
    return field(default=default, compare=compare, metadata={"setting": spec})


def specs(cls: type) -> dict[str, Spec]:
    """The declared settings of the dataclass ``cls``, by field name."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(cls) if "setting" in f.metadata}


def check_value(spec: Spec, value: Any, param: str, *, name: str = "") -> Any:
    """``value`` checked against ``spec`` (normalised), or SettingError naming ``param``."""
    if value is None and spec.optional:
        return None
    try:
        return spec.check(value)
    except Bad as bad:
        shape = str(bad) + (f" ({spec.unit})" if spec.unit else "")
        raise (spec.error or SettingError)(param, shape, value, hint=spec.doc, name=name) from None


def from_environ(spec: Spec, environ: Mapping[str, str], name: str,
                 convert: Callable[[str], Any] = str) -> Any:
    """The setting ``spec`` read from the variable ``name`` of ``environ``: None when the variable is
    unset or blank, else its text converted by ``convert`` (``float`` for a number) and checked;
    a text ``convert`` refuses is checked as it is, so the refusal is the same one line naming the
    variable (``SCALETRAIN_X must be a finite number above 0 (s), got 'x'``)."""
    raw = environ.get(name, "")
    if not raw.strip():
        return None
    try:
        value = convert(raw.strip())
    except (ValueError, OverflowError):
        value = raw
    try:
        return check_value(spec, value, name)
    except SettingError as err:   # the refusal shows the text the variable holds, not its float
        raise type(err)(name, err.shape, raw, err.hint, name=err.name) from None


def check_fields(obj: Any, *, owner: str | None = None) -> None:
    """Check every declared setting of the dataclass instance ``obj`` in place (frozen or not).

    A message names the field's CLI flag when it has one and ``owner`` is None (the CLI builds
    these objects), else ``"<owner>: <field>"`` (a Python caller's keyword).
    """
    for f in dataclasses.fields(obj):
        spec = f.metadata.get("setting")
        if spec is None:
            continue
        param = spec.flag if owner is None and spec.flag else f"{owner or type(obj).__name__}: {f.name}"
        value = check_value(spec, getattr(obj, f.name), param, name=f.name)
        object.__setattr__(obj, f.name, value)


# -- the shapes ---------------------------------------------------------------------------------

def count(low: int = 1, high: int = MAX_COUNT) -> Check:
    """A whole number (an int, not a bool or 4.0) from ``low`` to ``high``."""
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise Bad(f"a whole number from {low} to {high:,}")
        return value
    return check


def number(*, low: float | None = None, above: float | None = None, high: float | None = None) -> Check:
    """A finite real number (int, float or numpy's; returned as float) ``>= low``, ``> above``, ``<= high``."""
    words = [f"from {low:g}" if low is not None else "", f"above {above:g}" if above is not None else "",
             ("to" if low is not None else "and at most" if above is not None else "at most")
             + f" {high:g}" if high is not None else ""]
    shape = " ".join(["a finite number", *filter(None, words)])

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise Bad(shape)
        try:
            number = float(value)
        except OverflowError:   # an int past a float's range (10**400): not a finite number either
            raise Bad(shape) from None
        # each bound written as what must hold: NaN fails every one of them
        if not (math.isfinite(number) and (low is None or number >= low)
                and (above is None or number > above) and (high is None or number <= high)):
            raise Bad(shape)
        return number
    return check


def boolean() -> Check:
    """True or False, nothing that merely converts to one."""
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise Bad("True or False")
        return value
    return check


def choice(allowed: Iterable[str]) -> Check:
    """Exactly one of ``allowed`` (case matters: the allowed spellings are named)."""
    values = tuple(allowed)

    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in values:
            raise Bad("one of " + ", ".join(repr(v) for v in values))
        return value
    return check


def text(*, pattern: re.Pattern[str] | None = None, shape: str = "one line of text") -> Check:
    """A non-empty str without control characters (and matching ``pattern`` when given)."""
    def check(value: Any) -> str:
        if not isinstance(value, str) or has_control(value) or (pattern is not None and not pattern.fullmatch(value)):
            raise Bad(shape)
        if not value.strip():   # "" or spaces only: say so (the text itself looks like nothing)
            raise Bad(f"{shape}, not blank")
        return value
    return check


def line(*, pattern: re.Pattern[str] | None = None, shape: str = "one line of text") -> Check:
    """A str without control characters, "" included (matching ``pattern`` whole when given)."""
    def check(value: Any) -> str:
        if not isinstance(value, str) or has_control(value) or (pattern is not None and not pattern.fullmatch(value)):
            raise Bad(shape)
        return value
    return check


def path(*, shape: str = "a path (str or pathlib.Path)") -> Check:
    """A file or folder path: str or os.PathLike, not empty, without a NUL; returned as given."""
    def check(value: Any) -> Any:
        raw = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(raw, str) or not raw or "\0" in raw:
            raise Bad(shape)
        return value
    return check


def texts(*, empty_ok: bool = False, control_ok: bool = False) -> Check:
    """A tuple (or list) of one-line texts, returned as a tuple; ``empty_ok``: "" is an item,
    ``control_ok``: any str is (program arguments, whose own rule is applied where they are used)."""
    shape = "a list of str" if control_ok else "a list of one-line texts"

    def check(value: Any) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)):
            raise Bad(shape)
        for item in value:
            if not isinstance(item, str) or (not item.strip() and not empty_ok) \
                    or (not control_ok and has_control(item)):
                raise Bad(shape)
        return tuple(value)
    return check


def pairs() -> Check:
    """(name, value) pairs of str (a mapping is taken as its items), returned as a tuple."""
    def check(value: Any) -> tuple[tuple[str, str], ...]:
        items = list(value.items()) if isinstance(value, Mapping) else value
        if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)
                for p in items):
            raise Bad("a dict of str to str (or a list of (name, value) pairs)")
        return tuple((k, v) for k, v in items)
    return check


def each(item: Check) -> Check:
    """A list (or tuple) whose every entry passes ``item``, returned as a tuple."""
    def check(value: Any) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise Bad("a list")
        try:
            return tuple(item(v) for v in value)
        except Bad as bad:
            raise Bad(f"a list of which each entry is {bad}") from None
    return check


def mapping(*, key: Check | None = None, value: Check | None = None) -> Check:
    """A table (dict) whose keys pass ``key`` and whose values pass ``value``, returned as a dict."""
    def check(table: Any) -> dict[Any, Any]:
        if not isinstance(table, Mapping):
            raise Bad("a table")
        out = {}
        for k, v in table.items():
            try:
                k = key(k) if key is not None else k
            except Bad as bad:
                raise Bad(f"a table of which each key is {bad}") from None
            try:
                out[k] = value(v) if value is not None else v
            except Bad as bad:
                raise Bad(f"a table of which each value is {bad} ({k!r} is not)") from None
        return out
    return check


def rule(test: Callable[[Any], bool], shape: str) -> Check:
    """A value for which ``test`` holds (``shape`` says what that means)."""
    def check(value: Any) -> Any:
        if not test(value):
            raise Bad(shape)
        return value
    return check


def operand(*, shape: str = "one line of text that does not start with '-' (a name, not an option)") -> Check:
    """A value that lands on a command line as a word of its own (a module, a conda environment, a
    container image, a script): one line of text that does not start with ``-``, so the command
    cannot read it as an option (``module load --purge``, ``python3 -u -c CODE``)."""
    one_line = text(shape=shape)

    def check(value: Any) -> str:
        if one_line(value).lstrip().startswith("-"):
            raise Bad(shape)
        return value
    return check


def operands() -> Check:
    """A tuple (or list) of :func:`operand` values, returned as a tuple."""
    shape = "a list of names that do not start with '-' (each is a word of a command, not an option)"
    one = operand(shape=shape)

    def check(value: Any) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)):
            raise Bad(shape)
        return tuple(one(item) for item in value)
    return check


def str_mapping(*, shape: str = "a mapping of str to str (an environment, like os.environ)") -> Check:
    """A mapping whose keys and values are all str (an environment), returned as given."""
    def check(value: Any) -> Any:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            raise Bad(shape)
        return value
    return check


def kind(test: Callable[[Any], bool], shape: str) -> Check:
    """A value ``test`` accepts, returned as given: an object the caller will use (a model, a
    tensor, an ``Env``), checked for what it is before it is used deep inside (``shape`` says it:
    ``a torch.nn.Module``). ``test`` may import what it needs (torch) lazily."""
    def check(value: Any) -> Any:
        try:
            ok = test(value)
        except Exception:   # a test that cannot answer (an object whose attribute raises) says no
            ok = False
        if not ok:
            raise Bad(shape)
        return value
    return check


def anything() -> Check:
    """Any value: the setting's own code checks it (an object with methods, a stream)."""
    return lambda value: value


__all__ = ["CONTROL", "MAX_COUNT", "Bad", "Check", "SettingError", "SettingTypeError", "Spec", "anything", "boolean",
           "check_fields", "check_value", "choice", "count", "each", "from_environ", "has_control", "kind", "line",
           "mapping", "number", "operand", "operands", "pairs", "path", "rule", "setting", "specs", "str_mapping",
           "text", "texts"]
