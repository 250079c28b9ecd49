from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCAL_FIXTURES = ROOT / "tests" / "fixtures" / "bdd100k"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """pytest-xdist 3.8 groups ``--dist loadgroup`` tests by suffixing the node id of each test marked
    ``xdist_group`` with ``@<group>`` on the workers, by setting ``item._nodeid``, which pytest 9.2 no longer
    reads (it keeps a structured ``item._id``): every mark is silently ignored and the tests of a group spread
    over the workers (pytest-dev/pytest-xdist#1386). Add the suffix where pytest 9.2 reads it, unless xdist
    did (an xdist that works with this pytest)."""
    if not getattr(config.option, "loadgroup", False):  # set on the workers of --dist loadgroup only
        return
    for item in items:
        names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                 for mark in item.iter_markers("xdist_group")}
        if not names:
            continue
        suffix = "@" + "_".join(sorted(names))
        if not item.nodeid.endswith(suffix):
            item._id = type(item._id).parse(item.nodeid + suffix)


@pytest.fixture
def bdd_fixture_dir() -> Path:
    """The real BDD100K label samples (a copy lives in tests/fixtures so a clean clone has them)."""
    return LOCAL_FIXTURES
