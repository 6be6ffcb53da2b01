"""The main example under `scaletrain run` (tier 2): 2 CPU ranks train the seeds' CNN with DDP.

One launch. Checks: it succeeds, only rank 0 prints (scaletrain.print), the loss falls, and
every rank ends with exactly the same parameters, which differ from the initial ones.
"""

from __future__ import annotations

import re

import pytest
from workers import REPO, run_workers

pytestmark = pytest.mark.multiproc

EXAMPLE = REPO / "examples" / "cifar10_cnn.py"
EPOCHS = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn")
    proc = run_workers(EXAMPLE, 2, ["--epochs", EPOCHS, "--samples", 1024, "--batch-size", 32,
                                    "--lr", 0.05, "--save-params", out], timeout=300)
    return proc, out


def test_example_succeeds(trained):
    proc, _ = trained
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_only_rank_0_prints(trained):
    proc, _ = trained
    epochs = [line for line in proc.stdout.splitlines() if " epoch " in f" {line}"]
    assert len(epochs) == EPOCHS
    assert all(line.startswith("[rank 0] ") for line in epochs)
    assert "[rank 1]" not in proc.stdout


def test_loss_falls(trained):
    proc, _ = trained
    losses = [float(x) for x in re.findall(r"epoch \d+/\d+ loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == EPOCHS
    assert losses[-1] < losses[0] - 0.05, losses


def test_ranks_end_with_identical_parameters(trained):
    import torch

    _, out = trained
    states = [torch.load(out / f"params_rank{r}.pt") for r in (0, 1)]
    assert states[0].keys() == states[1].keys()
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name
    # and training really changed them (a no-op run would also be "identical")
    torch.manual_seed(0)
    import importlib.util

    spec = importlib.util.spec_from_file_location("cifar10_cnn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    initial = module.Net().state_dict()
    assert not torch.equal(initial["fc3.weight"], states[0]["fc3.weight"])
