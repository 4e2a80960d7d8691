"""The documentation's console examples that need no database, run and compared with the page (tests/examples.py);
the others run in tests/integration/test_docs_examples_db.py. Every example is one or the other."""

from __future__ import annotations

import pytest
from examples import examples, run

OFFLINE = {"openwop-seat explain", "openwop-seat config", "openwop-seat check"}
WITH_DATABASE = {"openwop-seat audit", "make demo"}
SECRET = "an-example-claim-secret-0123456789"

ALL = examples()


def test_every_example_runs_somewhere():
    assert ALL, "no console examples found"
    for example in ALL:
        assert example.programs <= OFFLINE or example.programs <= WITH_DATABASE, (example.name, example.programs)
    names = {p for e in ALL for p in e.programs}
    assert {"openwop-seat explain", "openwop-seat config", "openwop-seat check"} <= names


@pytest.mark.parametrize("example", [e for e in ALL if e.programs <= OFFLINE], ids=lambda e: e.name)
def test_offline_example(example, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENWOP_SEAT_CONFIG", raising=False)
    run(example, tmp_path, env={"OPENWOP_SEAT_CLAIM_SECRET": SECRET})


def test_readme_minimal_config_is_valid_with_the_exported_secret(tmp_path):
    """README: the minimal configuration and `export OPENWOP_SEAT_CLAIM_SECRET` above it, followed together, load
    (issue 25: its claim_secret_file overrode the export and named a file that does not exist: exit 2)."""
    import os
    import tomllib

    from examples import FENCE, FILE_NAME, ROOT

    from proxy.config import parse_config
    from proxy.db.claims import load_claim_secret

    text = (ROOT / "README.md").read_text()
    (body,) = [m.group(2) for m in FENCE.finditer(text) if m.group(1) == "toml"
               and FILE_NAME.match(m.group(2).split("\n", 1)[0])]
    assert "OPENWOP_SEAT_CLAIM_SECRET" in text[:text.index(body)]
    path = tmp_path / "seat.toml"
    path.write_text(body)
    config = parse_config(tomllib.loads(body), source=str(path))
    os.environ["OPENWOP_SEAT_CLAIM_SECRET"], saved = SECRET, os.environ.get("OPENWOP_SEAT_CLAIM_SECRET")
    try:
        assert load_claim_secret(config) == SECRET
    finally:
        if saved is None:
            del os.environ["OPENWOP_SEAT_CLAIM_SECRET"]
        else:
            os.environ["OPENWOP_SEAT_CLAIM_SECRET"] = saved


def test_tools_make_test_requires_are_said_to_be_required():
    """pgbouncer and promtool: conftest fails make test without them, so no page or comment may say they are
    optional (issue 25: the README, .ci/run and test_deploy.py said bench-only / skipped)."""
    from examples import ROOT

    conftest = (ROOT / "tests" / "integration" / "conftest.py").read_text()
    readme = (ROOT / "README.md").read_text()
    for tool in ("pgbouncer", "promtool"):
        assert tool in conftest
        (row,) = [line for line in readme.splitlines() if line.startswith("| `") and f"{tool}`" in line
                  or line.startswith("| `prometheus`") and tool == "promtool"]
        assert "`make test`" in row and "skipped" not in row and "only for `make bench`" not in row, row
    for path in (ROOT / ".ci" / "run", ROOT / "tests" / "integration" / "test_deploy.py"):
        text = path.read_text()
        assert "skip" not in text.replace("skip_", ""), path


def test_the_comparison_fails_on_a_difference():
    from examples import pattern

    p = pattern(["a…c", "…", "z"])
    assert p.fullmatch("abbc\nx\ny\nz\n") and p.fullmatch("ac\nz\n")
    assert not p.fullmatch("abd\nz\n") and not p.fullmatch("ac\nz\nextra\n")
