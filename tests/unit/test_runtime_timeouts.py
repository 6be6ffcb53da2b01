"""Collective timeouts: the step timeout's sources and order, and training_started() changing
the live group's timeout once (one process, gloo)."""

from __future__ import annotations

import pytest

import scaletrain
from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime import timeouts
from scaletrain.runtime.init import init, shutdown


def test_step_timeout_order():
    assert timeouts.step_timeout(1800, 30, {"SCALETRAIN_TIMEOUT": "5"}) == 30   # argument first
    assert timeouts.step_timeout(1800, None, {"SCALETRAIN_TIMEOUT": "5"}) == 5   # then run --timeout
    assert timeouts.step_timeout(1800, None, {}) == timeouts.DEFAULT_STEP_TIMEOUT_S
    assert timeouts.step_timeout(15, None, {}) == 15  # never longer than a short start-up timeout


@pytest.mark.parametrize("bad", ["0", "-3", "soon", "inf", "nan"])
def test_bad_environment_value_is_an_environment_error(bad):
    with pytest.raises(DistEnvError, match="SCALETRAIN_TIMEOUT"):
        timeouts.step_timeout(1800, None, {"SCALETRAIN_TIMEOUT": bad})


def test_bad_argument_is_a_usage_error():
    with pytest.raises(UsageError, match="step_timeout_s"):
        timeouts.step_timeout(1800, 0, {})


def _group_timeout_s() -> float:
    import torch
    from torch.distributed import distributed_c10d as c10d

    backend = c10d._get_default_group()._get_backend(torch.device("cpu"))
    return backend.options._timeout.total_seconds()


@pytest.fixture
def bare(clean_env):
    clean_env.delenv("SCALETRAIN_TIMEOUT", raising=False)
    yield clean_env
    shutdown()


def test_training_started_shortens_the_live_group_once(bare):
    assert timeouts.training_started() is False          # no init(): nothing to do
    init(device="cpu", step_timeout_s=7)
    assert _group_timeout_s() == pytest.approx(1800)      # start-up: long
    assert scaletrain.training_started() is True
    assert _group_timeout_s() == pytest.approx(7)         # training: short
    assert timeouts.training_started() is False           # idempotent
    shutdown()
    assert timeouts.current_step_timeout() is None and not timeouts.is_started()


def test_the_first_stop_agreement_poll_starts_training(bare):
    """A loop with a Checkpointer but no scaletrain.loader still gets the short timeout."""
    from scaletrain.runtime.agreement import StopAgreement

    init(device="cpu", step_timeout_s=9)
    agreement = StopAgreement()
    assert _group_timeout_s() == pytest.approx(1800)
    agreement.poll()
    assert timeouts.is_started() and _group_timeout_s() == pytest.approx(9)
    agreement.close()
