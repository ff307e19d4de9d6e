"""tests/waiting.py's wait_until: it returns what it waited for, and a wait that ends without
it fails naming what never happened."""

from __future__ import annotations

import pytest

from tests.waiting import wait_until


def test_wait_until_returns_the_first_truthy_answer() -> None:
    answers = iter([0, [], "ready", "later"])
    assert wait_until(lambda: next(answers), what="ready", every=0) == "ready"


def test_wait_until_fails_naming_what_never_happened_and_the_last_answer() -> None:
    with pytest.raises(
        AssertionError, match=r"^the receiver to answer: not within 0 s \(last: \[\]\)$"
    ):
        wait_until(lambda: [], what="the receiver to answer", timeout=0, every=0)
