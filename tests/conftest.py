from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCAL_FIXTURES = ROOT / "tests" / "fixtures" / "bdd100k"


@pytest.fixture
def bdd_fixture_dir() -> Path:
    """The real BDD100K label samples (a copy lives in tests/fixtures so a clean clone has them)."""
    return LOCAL_FIXTURES
