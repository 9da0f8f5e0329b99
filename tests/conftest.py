"""Shared test plumbing.

Parts that a developer's machine may lack (Chromium, PostgreSQL) skip with a loud
reason there; CI sets GRADWATCH_REQUIRE_ALL=1 so that a missing part fails instead.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_ALL = os.environ.get("GRADWATCH_REQUIRE_ALL") == "1"
CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")
POSTGRES_URL = os.environ.get("GRADWATCH_TEST_POSTGRES_URL")


def require_part(available: bool, what: str) -> None:
    """Skip (developer machine) or fail (CI) when a real part is missing."""
    if available:
        return
    message = f"MISSING PART: {what}"
    if REQUIRE_ALL:
        pytest.fail(message + " (GRADWATCH_REQUIRE_ALL=1, so this fails instead of skipping)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    require_part(
        shutil.which(CHROMIUM) is not None or os.path.exists(CHROMIUM),
        f"Chromium at {CHROMIUM} (apt-get install chromium, or set GRADWATCH_CHROMIUM)",
    )
    return CHROMIUM


@pytest.fixture(scope="session")
def postgres_url() -> str:
    require_part(
        bool(POSTGRES_URL),
        "PostgreSQL (set GRADWATCH_TEST_POSTGRES_URL=postgresql://...; .ci/run starts one)",
    )
    assert POSTGRES_URL is not None
    return POSTGRES_URL
