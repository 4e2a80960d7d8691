"""The documentation's console examples that need a database or the demo, run and compared with the page
(tests/examples.py): an example whose page gives a `.sql` file gets a fresh database holding it, migrated with the
default configuration, as `$DSN`; `make demo` runs the demo."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from examples import ROOT, examples, run

WITH_DATABASE = {"openwop-seat audit", "make demo"}
SECRET = "an-example-claim-secret-0123456789"


@pytest.mark.parametrize("example", [e for e in examples() if e.programs <= WITH_DATABASE], ids=lambda e: e.name)
def test_database_example(example, pg, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENWOP_SEAT_CONFIG", raising=False)
    env = {"OPENWOP_SEAT_CLAIM_SECRET": SECRET}
    sql = [body for name, body in example.files.items() if name.endswith(".sql")]
    db = None
    if sql:
        db = f"ex_{uuid.uuid4().hex[:8]}"
        pg.psql(f"CREATE DATABASE {db}")
        pg.psql(sql[-1], dbname=db)
        out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=db)], cwd=ROOT,
                             env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        env["DSN"] = pg.dsn(dbname=db)
    try:
        run(example, tmp_path, env=env, timeout=600)
    finally:
        if db is not None:
            pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)
