"""Where a CPU-only machine gets its torch wheel: PyTorch's own CPU index when reachable.

On the public package index, ``torch==2.13.0`` is the CUDA build: a CPU-only laptop that installs it
downloads several GB of CUDA libraries it cannot use. PyTorch publishes CPU wheels on its own index
(https://download.pytorch.org/whl/cpu), where the same version is ``2.13.0+cpu``; with that index added,
pip prefers ``+cpu`` (a local version sorts above the bare one) and the constraint ``torch==2.13.0``
still matches it. When the index cannot be reached (an offline mirror, a site proxy), the machine's own
pip configuration is kept as it is: it may well provide the CPU wheel itself.

Prints the extra pip arguments, one per line, on stdout, and one line saying which source was chosen on
stderr. ``SCALETRAIN_TORCH_CPU_INDEX`` names another index (a mirror; the tests use a local one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"
TIMEOUT_S = 5.0


def reachable(index: str, timeout: float = TIMEOUT_S) -> bool:
    """True when the index answers for the torch project page within ``timeout`` seconds."""
    url = index.rstrip("/") + "/torch/"
    if url.startswith("file:"):   # a local mirror: pip reads the folder itself
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)).is_dir()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http(s)/file only)
            return 200 <= getattr(response, "status", 200) < 400
    except (OSError, ValueError, urllib.error.URLError):
        return False


def main() -> int:
    index = os.environ.get("SCALETRAIN_TORCH_CPU_INDEX", DEFAULT_INDEX)
    if not index.startswith(("https://", "http://", "file://")):
        print(f"scaletrain install: SCALETRAIN_TORCH_CPU_INDEX={index!r} is not an http(s) or file URL; "
              "keeping pip's own configuration", file=sys.stderr)
        return 0
    if reachable(index):
        print("--extra-index-url")
        print(index)
        print(f"scaletrain install: torch's CPU wheel from {index} (no GPU here)", file=sys.stderr)
    else:
        print(f"scaletrain install: {index} not reachable; torch from pip's own configuration "
              "(check that it is a CPU build: `pip download --no-deps torch==2.13.0` names '+cpu')",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
