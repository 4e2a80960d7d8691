"""The probes' counts (rounds, pages, connects, …) are checked before anything starts: a value that is not a whole
number of at least 1 (store_page_plan's --tail: 0) ends the probe with argparse's exit code 2 and a message naming
the option, without starting a cluster."""

import importlib
import sys

import pytest

from bench.args import count, positive

CASES = [  # (module, option): each probe's counts
    ("bench.page_backend_cost", "--pages"), ("bench.page_backend_cost", "--rounds"),
    ("bench.pool_cost", "--connects"), ("bench.pool_cost", "--rounds"), ("bench.pool_cost", "--clients"),
    ("bench.store_page_plan", "--runs"), ("bench.store_page_plan", "--length"), ("bench.store_page_plan", "--limit"),
    ("bench.store_page_plan", "--repeat"), ("bench.projection_cost", "--rows"), ("bench.projection_cost", "--repeat"),
    ("bench.append_cost", "--rows"), ("bench.append_cost", "--repeat"), ("bench.chunks", "--seconds"),
    ("bench.chunks", "--rounds"), ("bench.connect_cost", "--connects"), ("bench.connect_cost", "--claims"),
    ("bench.page_syscalls", "--seconds"), ("bench.page_syscalls", "--rounds"),
    ("bench.page_cpu_split", "--seconds"), ("bench.page_cpu_split", "--rounds"),
]


@pytest.mark.parametrize("value", ["0", "-3", "two", "1.5", ""])
@pytest.mark.parametrize("module,option", CASES)
def test_a_bad_count_ends_the_probe_before_it_starts(module, option, value, monkeypatch, capsys):
    main = importlib.import_module(module).main
    started = []
    monkeypatch.setattr("proxy.dev.devcluster.DevCluster.start", lambda *a, **k: started.append(a))
    monkeypatch.setattr(sys, "argv", [module, option, value])
    with pytest.raises(SystemExit) as ended:
        main() if module == "bench.connect_cost" else main([option, value])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and ("must be at least 1" in err or "not an integer" in err), err
    assert not started


def test_the_tail_may_be_none_but_not_negative(monkeypatch, capsys):
    from bench import store_page_plan

    with pytest.raises(SystemExit) as ended:
        store_page_plan.main(["--tail", "-1"])
    assert ended.value.code == 2 and "must be at least 0: -1" in capsys.readouterr().err
    assert count("0") == 0


def test_the_types_themselves():
    assert positive("7") == 7 and count("0") == 0
    for bad in ("0", "-1", "x", " ", "3.0"):
        with pytest.raises(Exception, match="must be at least 1|not an integer"):
            positive(bad)


def no_cluster(monkeypatch) -> list:
    started: list = []
    monkeypatch.setattr("proxy.dev.devcluster.DevCluster.start", lambda *a, **k: started.append(a))
    return started


@pytest.mark.parametrize("module", ["bench.page_syscalls", "bench.page_cpu_split"])
def test_the_page_probes_refuse_an_unknown_workload_before_they_start(module, monkeypatch, capsys):
    started = no_cluster(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        importlib.import_module(module).main(["--workload", "passthrough"])
    assert ended.value.code == 2 and "argument --workload: invalid choice: 'passthrough'" in capsys.readouterr().err
    assert not started


def test_page_syscalls_refuses_a_missing_strace(monkeypatch, capsys):
    from bench import page_syscalls

    started = no_cluster(monkeypatch)
    monkeypatch.setattr("shutil.which", lambda name: None if name == "strace" else "/usr/bin/" + name)
    with pytest.raises(SystemExit) as ended:
        page_syscalls.main([])
    assert ended.value.code == 2 and "strace is not installed" in capsys.readouterr().err
    assert not started


@pytest.mark.parametrize("module", ["bench.page_cpu_split", "bench.pool_cost"])
def test_a_baseline_that_is_not_a_checkout_ends_the_probe_before_it_starts(module, tmp_path, monkeypatch, capsys):
    started = no_cluster(monkeypatch)
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(SystemExit) as ended:
            importlib.import_module(module).main(["--baseline", str(bad)])
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "argument --baseline: not a checkout of the seat" in err, err
    assert not started


def test_a_checkout_is_a_directory_holding_the_seats_code(tmp_path):
    from pathlib import Path

    from bench.args import checkout

    root = Path(__file__).resolve().parents[2]
    assert checkout(str(root)) == root
    with pytest.raises(Exception, match="no proxy/__main__.py"):
        checkout(str(tmp_path))
