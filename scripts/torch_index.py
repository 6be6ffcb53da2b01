"""Where a CPU-only machine gets its torch wheel: PyTorch's own CPU index when reachable.

On the public package index, ``torch==2.13.0`` is the CUDA build: a CPU-only laptop that installs it
downloads several GB of CUDA libraries it cannot use. PyTorch publishes CPU wheels on its own index
(https://download.pytorch.org/whl/cpu), where the same version is ``2.13.0+cpu``; with that index added,
pip prefers ``+cpu`` (a local version sorts above the bare one) and the constraint ``torch==2.13.0``
still matches it. When the index cannot be reached (an offline mirror, a site proxy), the machine's own
pip configuration is kept if it provides a CPU build itself (a site mirror, a folder of wheels): pip is
asked what it would install (a dry run, metadata only). When that is the CUDA build, nothing is
installed: one line says so and names the two ways on (exit 3), instead of several GB of CUDA packages
this machine cannot use.

Prints the extra pip arguments, one per line, on stdout, and one line saying which source was chosen on
stderr. ``SCALETRAIN_TORCH_CPU_INDEX`` names another index (a mirror; the tests use a local one);
``SCALETRAIN_TORCH_CUDA_OK=1`` accepts the CUDA build where no CPU build can be had.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_INDEX = "https://download.pytorch.org/whl/cpu"
TIMEOUT_S = 5.0
RESOLVE_TIMEOUT_S = 300.0
CONSTRAINTS = Path(__file__).resolve().parent.parent / "constraints" / "cpu.txt"
CUDA_OK = "SCALETRAIN_TORCH_CUDA_OK"


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


def resolved_build() -> tuple[str, bool] | None:
    """What pip's own configuration would install for the CPU pin: (torch's version, whether it pulls
    CUDA packages), or None when pip cannot tell (no torch there at all: its install says why)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                 "--disable-pip-version-check", "--report", str(report), "-c", str(CONSTRAINTS), "torch"],
                capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or not report.is_file():
            return None
        try:
            items = json.loads(report.read_text())["install"]
            names = {str(i["metadata"]["name"]).lower(): str(i["metadata"]["version"]) for i in items}
        except (ValueError, KeyError, TypeError):
            return None
    if "torch" not in names:
        return None
    return names["torch"], any(n.startswith("nvidia-") for n in names)


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
        return 0
    build = resolved_build()
    if build is not None and build[1] and os.environ.get(CUDA_OK) != "1":
        print(f"scaletrain install: {index} is not reachable and pip's own configuration offers torch "
              f"{build[0]}'s CUDA build (several GB this CPU-only machine cannot use); nothing installed. "
              f"Either SCALETRAIN_TORCH_CPU_INDEX=URL (a mirror of PyTorch's CPU wheels) or {CUDA_OK}=1 "
              "(take the CUDA build anyway)", file=sys.stderr)
        return 3
    where = f"torch {build[0]}" if build else "torch"
    kind = "" if build is None else (" (the CUDA build, as asked)" if build[1] else " (a CPU build)")
    print(f"scaletrain install: {index} not reachable; {where} from pip's own configuration{kind}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
