"""The commands a documentation page shows, for tests that run every one of them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def bash_commands(page: Path, verb: str | None = None) -> list[list[str]]:
    """Each ``scaletrain ...`` line of the page's ```bash blocks, split like a shell would."""
    found = []
    for block in _BLOCK.findall(page.read_text()):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("scaletrain "):
                words = shlex.split(line)
                if verb is None or words[1] == verb:
                    found.append(words)
    return found
