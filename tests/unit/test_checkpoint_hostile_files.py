"""A hostile pass over a checkpoint folder's files, of kinds not tried before.

Links inside a step folder, a rank file that is a pipe, a folder or a loop of links; markers cut
short, empty, with a byte-order mark, with duplicate names, absurd sizes, block tables that do
not add up, a world size that does not match the rank files; names with a newline, unicode and
bytes that are not UTF-8; two folder names for one step; a marker that lists itself; DCP metadata
that points at a file the marker does not list or outside its folder. Each case on step 30 of a
folder that also holds step 20: a resume either falls back to step 20 with one line naming step
30, or stops with one CheckpointError line; ``layout.choose`` (status, report) agrees; nothing
else escapes. A case that must not be refused (harmless) loads step 30.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable

import pytest
import torch

from helpers import reseal, save_steps, seeded_linear

import scaletrain
from scaletrain.checkpoint import layout
from scaletrain.checkpoint.errors import CheckpointError

STEP = "step-00000030"


_model = seeded_linear


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return save_steps(tmp_path_factory.mktemp("hostile-files") / "ck")


def _marker(folder: Path) -> dict:
    return json.loads((folder / "COMMIT.json").read_text())


def _rewrite(folder: Path, edit: Callable[[dict], None]) -> None:
    marker = _marker(folder)
    edit(marker)
    (folder / "COMMIT.json").write_text(json.dumps(marker))


def _algorithm(marker: dict) -> str:
    return next(a for a in ("crc32c", "crc32") if a in marker)


def _fifo(f: Path) -> None:
    (f / "rank-00000.pt").unlink()
    os.mkfifo(f / "rank-00000.pt")


def _loop(f: Path) -> None:
    (f / "rank-00000.pt").unlink()
    (f / "rank-00000.pt").symlink_to("rank-00000.pt")


def _link_inside(f: Path) -> None:
    (f / "rank-00000.pt").unlink()
    (f / "rank-00000.pt").symlink_to("replicated.pt")


def _folder_for_file(f: Path) -> None:
    (f / "rank-00000.pt").unlink()
    (f / "rank-00000.pt").mkdir()


def _sharded_is_a_file(f: Path) -> None:
    (f / "sharded").write_bytes(b"not a folder")


def _marker_links_elsewhere(f: Path) -> None:
    (f / "COMMIT.json").unlink()
    (f / "COMMIT.json").symlink_to(f.parent / "step-00000020" / "COMMIT.json")


def _marker_is_a_fifo(f: Path) -> None:
    (f / "COMMIT.json").unlink()
    os.mkfifo(f / "COMMIT.json")


def _cut(f: Path) -> None:
    text = (f / "COMMIT.json").read_bytes()
    (f / "COMMIT.json").write_bytes(text[:len(text) // 2])


def _empty(f: Path) -> None:
    (f / "COMMIT.json").write_bytes(b"")


def _bom(f: Path) -> None:
    (f / "COMMIT.json").write_bytes(b"\xef\xbb\xbf" + (f / "COMMIT.json").read_bytes())


def _not_utf8(f: Path) -> None:
    (f / "COMMIT.json").write_bytes((f / "COMMIT.json").read_bytes().replace(b'"step"', b'"st\xffep"'))


def _step_twice(f: Path) -> None:
    text = (f / "COMMIT.json").read_text()
    (f / "COMMIT.json").write_text(text.replace('"step": 30', '"step": 20, "step": 30', 1))


def _file_twice(f: Path) -> None:
    text = (f / "COMMIT.json").read_text()
    size = (f / "replicated.pt").stat().st_size
    (f / "COMMIT.json").write_text(text.replace('"files": {', f'"files": {{"replicated.pt": {size + 1}, ', 1))


def _size(value: object) -> Callable[[Path], None]:
    def edit(f: Path) -> None:
        _rewrite(f, lambda m: m["files"].__setitem__("replicated.pt", value))
    return edit


def _block_size(value: object) -> Callable[[Path], None]:
    def edit(f: Path) -> None:
        _rewrite(f, lambda m: m["blocks"].__setitem__("bytes", value))
    return edit


def _blocks_upper(f: Path) -> None:
    def edit(m: dict) -> None:
        table = m["blocks"][_algorithm(m)]
        table["replicated.pt"] = table["replicated.pt"].upper().replace("0", "A")
    _rewrite(f, edit)


def _blocks_short(f: Path) -> None:
    def edit(m: dict) -> None:
        table = m["blocks"][_algorithm(m)]
        table["replicated.pt"] = table["replicated.pt"][:-8]
    _rewrite(f, edit)


def _blocks_lie(f: Path) -> None:
    """The whole file's checksum right (what older readers check), a block's wrong."""
    def edit(m: dict) -> None:
        table = m["blocks"][_algorithm(m)]
        first = int(table["replicated.pt"][:8], 16) ^ 1
        table["replicated.pt"] = f"{first:08x}" + table["replicated.pt"][8:]
    _rewrite(f, edit)


def _world(value: object) -> Callable[[Path], None]:
    def edit(f: Path) -> None:
        _rewrite(f, lambda m: m.__setitem__("world_size", value))
    return edit


def _extra_rank_listed(f: Path) -> None:
    shutil.copy(f / "rank-00000.pt", f / "rank-00001.pt")
    reseal(f, "rank-00001.pt")


def _name_with_newline(f: Path) -> None:
    """A listed name with a newline, its checksums there too: only the file is missing."""
    name = "rank-00000.pt\nforged line"

    def edit(m: dict) -> None:
        m["files"][name] = 1
        m[_algorithm(m)][name] = "00000000"
        m["blocks"][_algorithm(m)][name] = "00000000"
    _rewrite(f, edit)


def _unicode_stranger(f: Path) -> None:
    (f / "réplicated.pt").write_bytes(b"a stranger")


def _undecodable_stranger(f: Path) -> None:
    with open(os.path.join(os.fsencode(f), b"rank-\xff.pt"), "wb") as fh:
        fh.write(b"a stranger whose name is not UTF-8")


def _marker_lists_itself(f: Path) -> None:
    size = (f / "COMMIT.json").stat().st_size
    _rewrite(f, lambda m: m["files"].__setitem__("COMMIT.json", size))


def _second_name(f: Path) -> None:
    """Step 30 under a second folder name (9 digits), holding step 20's state: a resume must
    not take it for step 30, whatever order the folder is listed in."""
    for name in ("step-000000030", "step-0000000030", "step-00000000030"):
        other = f.parent / name
        shutil.copytree(f.parent / "step-00000020", other)
        _rewrite(other, lambda m: m.__setitem__("step", 30))


def _partial_links_to_the_directory(f: Path) -> None:
    (f.parent / ".partial-step-00000040-00ff00ff").symlink_to(f.parent)


def _uncommitted_link(f: Path) -> None:
    (f.parent / "step-00000050").symlink_to(f.parent / "step-00000020")


# (edit of step 30's folder, what a resume must do: "older" = fall back to 20, "error" = one
# CheckpointError line, "30" = harmless, load step 30)
CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "rank file is a FIFO": (_fifo, "older"),
    "rank file is a loop of links": (_loop, "older"),
    "rank file links to replicated.pt": (_link_inside, "older"),
    "rank file is a folder": (_folder_for_file, "older"),
    "sharded is a file": (_sharded_is_a_file, "older"),
    "marker links to another step's": (_marker_links_elsewhere, "older"),
    "marker is a FIFO": (_marker_is_a_fifo, "older"),
    "marker cut in half": (_cut, "older"),
    "marker empty": (_empty, "older"),
    "marker with a byte-order mark": (_bom, "older"),
    "marker not UTF-8": (_not_utf8, "older"),
    "marker names step twice": (_step_twice, "older"),
    "marker names a file twice": (_file_twice, "older"),
    "size 10**30": (_size(10 ** 30), "older"),
    "size -1": (_size(-1), "older"),
    "size 1.5": (_size(1.5), "older"),
    "block size 0": (_block_size(0), "older"),
    "block size 3 MiB": (_block_size(3 << 20), "older"),
    "block size 2**80": (_block_size(2 ** 80), "older"),
    "block checksums upper case": (_blocks_upper, "older"),
    "a block checksum missing": (_blocks_short, "older"),
    "a block checksum wrong, the file's right": (_blocks_lie, "older"),
    "world size 0": (_world(0), "older"),
    "world size 3, one rank file": (_world(3), "older"),
    "world size true": (_world(True), "older"),
    "an extra rank file, listed": (_extra_rank_listed, "30"),
    "a listed name with a newline": (_name_with_newline, "older"),
    "a stranger with a unicode name": (_unicode_stranger, "older"),
    "a stranger whose name is not UTF-8": (_undecodable_stranger, "older"),
    "the marker lists itself": (_marker_lists_itself, "older"),
    "the step under a second folder name": (_second_name, "30"),
    "a partial folder that links to the directory": (_partial_links_to_the_directory, "30"),
    "an uncommitted step that links to another": (_uncommitted_link, "30"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_step_folder(pristine, tmp_path, name):
    edit, expect = CASES[name]
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck)
    edit(ck / STEP)
    choice = layout.choose(ck)
    model = _model(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            step = scaletrain.Checkpointer(ck).load_latest({"model": model, "epoch": 0})
            error = None
        except CheckpointError as err:
            step, error = None, err
    notes = [str(w.message) for w in seen]
    assert all(len(n.splitlines()) == 1 for n in notes), notes
    for note in choice.notes():
        assert len(note.splitlines()) == 1, note
    if expect == "error":
        assert error is not None and len(error.message.splitlines()) == 1
        return
    assert error is None, error.message
    wanted = 20 if expect == "older" else 30
    assert step == wanted and choice.step == wanted
    assert torch.equal(model.weight, _model(wanted).weight)
    if expect == "older":
        named = [n for n in notes if "00030" in n]
        assert len(named) == 1, notes
    assert (tmp_path / "ck").is_dir() and layout.choose(ck).step == wanted   # nothing else removed


_DCP_CHILD = r'''
import io, json, pickle, sys, warnings
from pathlib import Path
import torch, scaletrain
from torch.distributed.fsdp import fully_shard
from scaletrain.checkpoint.errors import CheckpointError
from scaletrain.checkpoint import safeio

case, directory = sys.argv[1], Path(sys.argv[2])
scaletrain.init(device="cpu")

def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 64)
    fully_shard(model)
    return model

ck = scaletrain.Checkpointer(directory, keep=3)
for step in (20, 30):
    ck.save(step, {"model": make(step)})
ck.close()
folder = directory / "step-00000030" / "sharded"
meta = safeio.read_dcp_metadata(folder)
elsewhere = {"unlisted": "__9_0.distcp", "outside": "../replicated.pt", "absolute": "/etc/passwd"}[case]
for key, info in meta.storage_data.items():
    info.relative_path = elsewhere
    break
buf = io.BytesIO()
pickle.dump(meta, buf)
(folder / ".metadata").write_bytes(buf.getvalue())
sys.path.insert(0, sys.argv[3])
from helpers import reseal, save_steps, seeded_linear
reseal(directory / "step-00000030", "sharded/.metadata")   # a metadata that checks out
fresh = make(0)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        step = scaletrain.Checkpointer(directory).load_latest({"model": fresh})
        out = {"step": step}
    except CheckpointError as err:
        out = {"error": err.message}
out["notes"] = [str(w.message) for w in seen]
print("RESULT " + json.dumps(out))
scaletrain.shutdown()
'''


@pytest.mark.parametrize("case", ["unlisted", "outside", "absolute"])
def test_dcp_metadata_pointing_outside_its_files_is_refused(tmp_path, case):
    """DCP's metadata names the file each entry is in: one the marker does not list, one outside
    ``sharded/`` (the replicated file), an absolute path; the metadata itself checks out."""
    import subprocess
    import sys

    src = Path(scaletrain.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(src), CUDA_VISIBLE_DEVICES="")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-c", _DCP_CHILD, case, str(tmp_path / "ck"),
                           str(Path(__file__).resolve().parents[1])], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    if "error" in out:
        assert len(out["error"].splitlines()) == 1
    else:
        assert out["step"] == 20, out
        assert all(len(n.splitlines()) == 1 for n in out["notes"])
