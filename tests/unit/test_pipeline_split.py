"""Cutting a model into pipeline stages (no processes needed: splitting is local)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scaletrain.errors import StrategyError  # noqa: E402
from scaletrain.parallel.pipeline_split import microbatch_of, split_model  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc1 = nn.Linear(4 * 6 * 6, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.flatten(F.relu(self.conv(x)), 1)
        return self.fc2(F.relu(self.fc1(x)))


def test_sequential_is_sliced_without_tracing_and_shares_parameters():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 2))
    split = split_model(model, split_points=["2", "3"])
    assert split.method == "sequential" and split.n_stages == 3
    assert split.modules[1][0] is model[2]
    assert split.owner_of() == {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": 1,
                                "3.weight": 2, "3.bias": 2}
    x = torch.randn(5, 4)
    y = x
    for stage in split.modules:
        y = stage(y)
    torch.testing.assert_close(y, model(x))


def test_traced_split_matches_the_model_and_restores_forward(monkeypatch, tmp_path):
    # torch.export sets this variable on first use; give it one so nothing leaks
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(6, 3, 8, 8)
    split = split_model(model, split_points=["fc1"], example_microbatch=(x,))
    assert split.method == "traced"
    assert {k for k, s in split.owner_of().items() if s == 0} == {"conv.weight", "conv.bias"}
    assert split.modules[1].get_parameter("fc1.weight") is model.fc1.weight
    torch.testing.assert_close(split.modules[1](split.modules[0](x)), model(x))
    assert "forward" not in vars(model.fc1)  # pipeline()'s patch is undone


def test_explicit_stages_keep_model_names():
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    split = split_model(model, stages=[model[:1], nn.Sequential(model[1])])
    assert split.method == "explicit"
    assert split.param_names[1] == {"0.weight": "1.weight", "0.bias": "1.bias"}
    orphan = split_model(None, stages=[nn.Linear(2, 2), nn.Linear(2, 2)])
    assert orphan.param_names[1]["weight"] == "stages.1.weight"


@pytest.mark.parametrize("kwargs, words", [
    ({}, ["exactly one of"]),
    ({"split_points": ["nope"]}, ["unknown split point 'nope'", "conv, fc1, fc2"]),
    ({"split_points": []}, ["at least one split point"]),
    ({"split_points": ["fc1"]}, ["example batch", "stages=[...]"]),
    ({"stages": [nn.Linear(2, 2)]}, ["at least 2"]),
])
def test_split_errors_say_what_to_do(kwargs, words, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with pytest.raises(StrategyError) as info:
        split_model(Net(), **kwargs)
    text = str(info.value)
    for word in words:
        assert word in text
    assert info.value.hint


def test_sequential_split_points_out_of_order():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(StrategyError, match="forward order"):
        split_model(model, split_points=["2", "1"])


def test_tied_weights_across_stages_are_refused():
    a, b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
    b.weight = a.weight
    with pytest.raises(StrategyError, match="used by stages 0") as info:
        split_model(nn.Sequential(a, b), split_points=["1"])
    assert "same stage" in info.value.hint


def test_microbatch_of_takes_the_first_chunk():
    x, y = torch.arange(8.0), torch.arange(16.0).view(8, 2)
    (mx,) = microbatch_of(x, 4)
    assert mx.tolist() == [0.0, 1.0]
    mx, my = microbatch_of((x, y), 2)
    assert my.shape == (4, 2)
