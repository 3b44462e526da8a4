from __future__ import annotations

import pytest
from client_helpers import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
