"""The hygiene fixture puts scaletrain's module state back after every test (issue 31 item 6),
and fails a test that left the runtime set up."""

from __future__ import annotations

import conftest
import scaletrain.data.lr as lr
import scaletrain.runtime.session as session


def test_runtime_state_left_set_is_put_back_and_named() -> None:
    before = conftest._module_state()
    assert ("scaletrain.runtime.session", "_ENV") in before
    marker = object()
    session._ENV = marker  # type: ignore[assignment]
    leaks = conftest._restore_module_state(before)
    assert session._ENV is before[("scaletrain.runtime.session", "_ENV")][0]
    assert leaks == ["runtime.session._ENV"]


def test_a_cache_is_reset_in_place_without_a_failure() -> None:
    before = conftest._module_state()
    warned = lr._warned
    warned.add((7, 7, 7))
    assert conftest._restore_module_state(before) == []
    assert lr._warned is warned and (7, 7, 7) not in warned
