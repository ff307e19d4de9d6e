"""The showback tests' project with two weeks of spend (tests/costboard/reports/showback.py)."""

from __future__ import annotations

import pytest

from tests.costboard.reports.showback import Showback, showback_made


@pytest.fixture
def showback(db: None) -> Showback:
    return showback_made()
