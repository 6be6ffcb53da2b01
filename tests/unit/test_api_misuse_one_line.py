"""Misuse of the Python API ends in one line of ours, not a traceback from inside torch
(issue 39, item 10); the node sampler given a file ends in one line, not FileExistsError."""

from __future__ import annotations

import pytest
import torch

import scaletrain
from scaletrain.errors import UsageError
from scaletrain.observe import nodesampler


@pytest.mark.parametrize("dataset, words", [
    ((i for i in range(10)), "got a generator"),
    (None, "got None"),
    (object(), "got a object"),
])
def test_loader_refuses_what_is_not_a_dataset(dataset, words):
    with pytest.raises(UsageError, match="scaletrain.loader needs a dataset: map-style") as info:
        scaletrain.loader(dataset, batch_size=2, rank=0, world_size=1)
    assert words in info.value.message and info.value.hint
    assert len(info.value.message.splitlines()) == 1


def test_loader_still_takes_a_list_and_an_iterable_dataset():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    assert sum(len(b) for b in scaletrain.loader(list(range(8)), batch_size=2, rank=0, world_size=1,
                                                 num_workers=0)) == 8
    assert sum(len(b) for b in scaletrain.loader(Stream(), batch_size=2, rank=0, world_size=1,
                                                 num_workers=0)) == 8


def test_setup_refuses_a_model_on_the_meta_device():
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(UsageError, match="on the meta device") as info:
        scaletrain.setup(model, strategy="none")
    assert "to_empty" in info.value.hint


def test_nodesampler_given_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "samples.jsonl"
    path.write_text("mine\n")
    assert nodesampler.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"scaletrain: error: {path} is not a folder") and "Traceback" not in err
    assert path.read_text() == "mine\n"
