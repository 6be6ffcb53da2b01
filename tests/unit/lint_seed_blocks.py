"""Extract the Slurm batch scripts from the centre guides, each with the cluster it is for.

Two sources hold the guides' jobs: tests/unit/guide_jobs (our own scripts in the guides' shapes and
formats, in every clone) and the guides themselves in ../shared/seeds beside the repository (or
$SCALETRAIN_TEST_SEEDS), read in addition where present. Both are files named ``0NN_*.txt``.

Markdown fences (```bash, also indented under ``=== "Puhti"`` tabs and after "- "), unterminated
fences at the end of a file, and MediaWiki ``{{File |lang="bash" |contents=...}}`` blocks (003).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
OURS = Path(__file__).resolve().parent / "guide_jobs"
GUIDES = Path(os.environ.get("SCALETRAIN_TEST_SEEDS", _REPO.parent / "shared" / "seeds"))


def guide_sources() -> dict[str, Path]:
    """The folders of guide jobs to test: ours always, the guides themselves where present."""
    return {"ours": OURS, **({"guides": GUIDES} if GUIDES.is_dir() else {})}

TAB_CLUSTER = {"Puhti": "puhti", "Mahti": "mahti", "LUMI": "lumi"}
# The cluster a document is about when a block is not under a tab. The Alliance page (003)
# applies to its 4-GPU-per-node clusters; Graham has 2 GPUs per node, which 003's 2x4-GPU
# model+data example does not fit, so it is not listed.
DOC_CLUSTERS = {"000": ("puhti",), "001": ("puhti",), "003": ("narval", "beluga", "cedar"),
                "004": ("juwels-booster",)}
PLACEHOLDERS = {"<project>": "project_2001234", "<your account>": "def-someuser",
                "<options>": "--epochs 1", "<further options>": "--epochs 1",
                "<select version>": "3.11"}


@dataclass(frozen=True)
class SeedBlock:
    doc: str          # "000".."004"
    line: int         # line of the first script line in the seed file
    cluster: str
    text: str
    source: str = "guides"   # a key of guide_sources()

    @property
    def id(self) -> str:
        return f"{self.source}-{self.doc}-L{self.line}-{self.cluster}"


def fill_placeholders(text: str) -> str:
    for key, value in PLACEHOLDERS.items():
        text = text.replace(key, value)
    return re.sub(r"<([A-Za-z][^<>\n]*)>", lambda m: m.group(1).replace(" ", "_"), text)


def _markdown_blocks(lines: list[str]) -> list[tuple[int, str, str | None]]:
    out = []
    tab = None
    i = 0
    while i < len(lines):
        m_tab = re.match(r'^=== "([^"]+)"', lines[i])
        if m_tab:
            tab = m_tab.group(1)
        m = re.match(r"^(\s*)(?:- )?```\s*bash\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        body = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        out.append((i + 2, "\n".join(body).rstrip() + "\n", tab))
        i = j + 1
    return out


def _mediawiki_blocks(lines: list[str]) -> list[tuple[int, str, str | None]]:
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == '|lang="bash"' and i + 1 < len(lines) and lines[i + 1].strip().startswith("|contents="):
            j = i + 2
            body = []
            while j < len(lines) and lines[j].strip() != "}}":
                body.append(lines[j])
                j += 1
            while body and not body[0].strip():
                body.pop(0)
            start = j - len(body)
            out.append((start + 1, "\n".join(body).rstrip() + "\n", None))
            i = j
        i += 1
    return out


def seed_blocks(seeds_dir: Path, source: str = "guides") -> list[SeedBlock]:
    """Every block with #SBATCH in every seed, once per cluster it is meant for."""
    blocks: list[SeedBlock] = []
    for path in sorted(seeds_dir.glob("0*.txt")):
        doc = path.name[:3]
        lines = path.read_text(encoding="utf-8").split("\n")
        found = _markdown_blocks(lines) + _mediawiki_blocks(lines)
        for line, text, tab in found:
            if "#SBATCH" not in text:
                continue
            clusters = (TAB_CLUSTER[tab],) if tab in TAB_CLUSTER else DOC_CLUSTERS.get(doc, ())
            for cluster in clusters:
                blocks.append(SeedBlock(doc=doc, line=line, cluster=cluster, text=fill_placeholders(text),
                                         source=source))
    return blocks


def all_blocks() -> list[SeedBlock]:
    """The blocks of every available source (ours, then the guides where present)."""
    return [b for name, folder in guide_sources().items() for b in seed_blocks(folder, name)]
