"""`make demo` (python -m proxy.dev.demo) runs end to end and shows what it says it shows."""

from __future__ import annotations

import subprocess
import sys


def test_demo_shows_translation_projection_and_refusals():
    proc = subprocess.run([sys.executable, "-m", "proxy.dev.demo"], capture_output=True, text=True, timeout=300,
                          check=False)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "agent.reasoning-delta *" in out
    # a projected payload with the legacy Subject and a boxed key, and an unprojectable row refused
    assert '"issuer": "urn:openwop:legacy", "tenant": "tenant-1", "subjectId": "legacy"' in out
    assert '"engineVersion": 7}' in out
    assert '{"name": "total", "x-v1": {"value": 2}}' in out
    assert "SQLSTATE OW002" in out and '"keys": ["latencyMs"]' in out
    assert "SQLSTATE OW001" in out
    # the refused statement is one the seat still refuses (issue 25: it showed OW001 for one now translated)
    refused = out[out.index("a refused statement"):]
    assert "SQLSTATE OW004" in refused.split("\n== ")[0] and \
        '"kind":"a view over the events table"' in refused.split("\n== ")[0], refused
    assert "next statement in the transaction: SQLSTATE 25P02" in refused
    assert "runs named 'run-rolled-back' afterwards: 0" in refused
