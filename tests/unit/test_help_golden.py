"""Golden ``plan --help`` and ``submit --help``: the help a user reads stays byte for byte what
``golden_help/VERB.txt`` holds, so a refactor of the request, the profile or the planner cannot
change it by accident. A deliberate change rewrites the file (``SCALETRAIN_GOLDEN_WRITE=1``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import run_cli

GOLDEN = Path(__file__).parent / "golden_help"


@pytest.mark.parametrize("verb", ["plan", "submit"])
def test_help_is_unchanged(verb: str, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")   # argparse wraps to the terminal's width
    try:
        code, out, err = run_cli(capsys, verb, "--help")
    except SystemExit as stop:
        code = int(stop.code or 0)
        out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    path = GOLDEN / f"{verb}.txt"
    if os.environ.get("SCALETRAIN_GOLDEN_WRITE") == "1":
        path.write_text(out, encoding="utf-8")
    assert "--cluster" in out                       # the help itself, not an empty page
    assert out == path.read_text(encoding="utf-8")
