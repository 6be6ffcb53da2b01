"""lint's work grows with the script's length, not its square: counted, never timed.

A script checked against two profiles (a partition two clusters share) compared each finding of
one with every finding of the other, and a long quoted word (a many-line ``srun bash -c "..."``
body) was copied whole for every character added to it: 4,000 lines took 17 s, 20,000 over two
minutes. The counters here are the comparisons of findings and the characters stored into
words; each must stay a small multiple of the script's findings or length.
"""

from __future__ import annotations

import random

from scaletrain.lint import engine, shell
from scaletrain.lint.findings import Finding
from scaletrain.lint.script import parse_script
from scaletrain.lint.words import Word

HEAD = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n"
        "#SBATCH --partition={}\n#SBATCH --account=p\n#SBATCH --time=01:00:00\n")


def _srun_lines(n: int) -> str:
    lines = "".join(f"srun python train.py --node $SLURM_NODEID --part {i}\n" for i in range(n))
    return HEAD.format("booster") + lines


def _comparisons(monkeypatch, text: str) -> tuple[int, int]:
    """(Finding comparisons, findings) of linting ``text`` against the profiles it matches."""
    calls = [0]
    real = Finding.__eq__

    def counting(self, other):
        calls[0] += 1
        return real(self, other)

    monkeypatch.setattr(Finding, "__eq__", counting)
    names, how = engine.matching_profiles(parse_script(text))
    assert len(names) == 2, names          # booster: JUWELS Booster and JUPITER
    result = engine.lint_agreed(text, path="t.sh", names=names, cluster_source=how)
    return calls[0], len(result.findings)


def test_findings_agreed_between_two_profiles_cost_a_lookup_each(monkeypatch):
    small, found_small = _comparisons(monkeypatch, _srun_lines(100))
    large, found_large = _comparisons(monkeypatch, _srun_lines(400))
    assert found_small >= 100 and found_large >= 400   # a finding per srun line (early-expansion)
    # a set lookup compares a finding with the one of equal hash: about one comparison each
    assert large <= 2 * found_large + 10, (large, found_large)
    assert large <= 4.5 * max(small, 1), (small, large)


class _CountingWord(Word):
    """A Word that counts the characters stored into its text (``raw`` and ``value``)."""

    stored = 0

    def __setattr__(self, name, value):
        if name in ("raw", "value"):
            _CountingWord.stored += len(value)
        super().__setattr__(name, value)


def _stored(monkeypatch, text: str) -> int:
    monkeypatch.setattr(shell, "Word", _CountingWord)
    _CountingWord.stored = 0
    shell.split_commands(text)
    return _CountingWord.stored


def test_a_long_quoted_word_is_stored_once_not_once_per_character(monkeypatch):
    def body(n: int) -> str:
        inner = "".join(f"python train.py --rank $SLURM_PROCID --part {i}\n" for i in range(n))
        return f'srun bash -c "\n{inner}"\n'

    small, large = body(200), body(800)
    stored_small, stored_large = _stored(monkeypatch, small), _stored(monkeypatch, large)
    # its raw text and its value, each once (an assignment's value is a copy more)
    assert stored_large <= 3 * len(large), (stored_large, len(large))
    assert stored_large <= 4.5 * stored_small, (stored_small, stored_large)


def test_the_words_are_those_the_scanner_gave_before():
    """The scanner takes runs of plain characters at once: the words, their values, their
    expansions and lines are those of one character at a time (pinned on shapes that mix them)."""
    text = ('srun bash -c "a\\qb $X ${Y}" \'$Z\nw\' x#y a(b) <c "$(echo "$Q")" `d`\n'
            'cat <<EOF\n$H line\nEOF\nA=1 B="$C" cmd')
    commands = shell.split_commands(text)
    got = [[(w.raw, w.value, w.line, [(e.name, e.quote, e.line) for e in w.expansions]) for w in c.words]
           for c in commands]
    assert got[0] == [
        ("srun", "srun", 1, []), ("bash", "bash", 1, []), ("-c", "-c", 1, []),
        ('"a\\qb $X ${Y}"', "a\\qb $X ${Y}", 1, [("X", "double", 1), ("Y", "double", 1)]),
        ("'$Z\nw'", "$Z\nw", 1, [("Z", "single", 1)]),
        ("x#y", "x#y", 2, []), ("a(b)", "a(b)", 2, []), ("<c", "<c", 2, []),
        ('"$(echo "$Q")"', '$(echo "$Q")', 2, [("Q", "double", 2)]), ("`d`", "`d`", 2, []),
    ]
    assert commands[1].heredocs[0].body == "$H line" and commands[1].heredocs[0].expansions[0].line == 4
    assert [(n, w.value) for n, w in commands[2].assignments] == [("A", "1"), ("B", "$C")]
    assert commands[2].argv == ["cmd"]


def test_random_shell_text_never_breaks_the_scanner():
    """A backslash as the last character inside double quotes ended the scan in an IndexError
    (``scaletrain lint`` on a script cut short there printed a traceback)."""
    shell.split_commands('srun echo "abc\\')
    rnd = random.Random(7)
    alphabet = list("ab $X{}()'\"\\\n\t;&|<#`=-") + ["<<EOF\n", "\nEOF\n", "$(", "${", "\\\n"]
    for _ in range(2000):
        shell.split_commands("".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 60))))
