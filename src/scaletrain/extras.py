"""How to install an optional extra, said the way that works for this installation.

``pip install 'scaletrain[monitor]'`` is right for an install from a package index. For a clone
installed with ``pip install -e .`` (the README's set-up) or run from its ``src`` folder, that
command would fetch a second, published scaletrain over the user's checkout; the packages
themselves (or ``pip install -e '.[monitor]'`` in the clone) are what they need.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata

from scaletrain.jsonfile import loads as json_loads

# the packages each extra brings (pyproject.toml's optional-dependencies, by name)
EXTRAS: dict[str, tuple[str, ...]] = {
    "monitor": ("tensorboard", "nvidia-ml-py"),
    "report": ("matplotlib",),
    "frameworks": ("accelerate", "lightning"),
}


@lru_cache(maxsize=1)
def installed_from_clone() -> bool:
    """True for an editable install or a source tree on ``sys.path`` (no installed metadata)."""
    try:
        dist = metadata.distribution("scaletrain")
    except metadata.PackageNotFoundError:
        return True
    try:
        direct = json_loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        return False
    return bool(direct.get("dir_info", {}).get("editable")) or str(direct.get("url", "")).startswith("file:")


def install_hint(extra: str, *packages: str) -> str:
    """The command that installs ``packages`` (default: the whole ``extra``) here."""
    wanted = " ".join(packages or EXTRAS[extra])
    if installed_from_clone():
        return f"pip install {wanted} (or, in your scaletrain clone, pip install -e '.[{extra}]')"
    return f"pip install 'scaletrain[{extra}]' (or pip install {wanted})"
