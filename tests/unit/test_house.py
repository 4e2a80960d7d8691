"""The shape of the house: imports run one way between the subsystems, no module imports itself back through
others, and the wheel holds every module and every vendored spec file, built without a setuptools warning."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from harness import ROOT

PACKAGE = ROOT / "proxy"

# Each subsystem (a folder of proxy/, or a top-level module) and its floor: an import must go to a lower floor,
# or stay inside its own subsystem. Read top down: cli -> serve / tools / dev -> readpath / db -> config ->
# artifacts / wire -> errors, stats, logs, the package itself (its version).
FLOORS = {
    "__main__": 6,
    "cli": 5,
    "serve": 4, "tools": 4, "dev": 4,
    "readpath": 3, "db": 3,
    "config": 2,
    "wire": 1, "artifacts": 1,
    "errors": 0, "stats": 0, "logs": 0, "fifo": 0, "proxy": 0,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Every project module and the project modules it imports, at module level or inside a function (a lazy
    import is an arrow too), resolving `from package import submodule`."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target in modules:
                    found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules}
        graph[name] = found - {name}
    return graph


def subsystem(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "proxy"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_walk_sees_the_arrows_it_should():
    graph = imports()
    assert "proxy.serve.relay" in graph["proxy.serve.session"]  # module level
    assert "proxy.db.relations" in graph["proxy.serve.context"]  # `from proxy.db import relations`
    assert "proxy.serve.supervisor" in graph["proxy.cli"]  # inside a function


def test_no_import_cycle_among_the_modules():
    assert cycles(imports()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_down_the_floors():
    wrong = []
    for module, targets in imports().items():
        here = subsystem(module)
        for target in targets:
            there = subsystem(target)
            if there != here and FLOORS[there] >= FLOORS[here]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []
    assert {subsystem(m) for m in imports()} <= set(FLOORS)


def test_the_wheel_builds_without_warnings_and_holds_every_module_and_spec_file(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                            "-v", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    output = built.stdout + built.stderr
    for warning in ("SetuptoolsDeprecationWarning", "SetuptoolsWarning", "Warning:", "!!\n"):
        assert warning not in output, output[output.find(warning) - 2000:output.find(warning) + 2000]
    (wheel,) = tmp_path.glob("openwop_seat-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    # The compiled framer (ADR 0018), built from proxy/wire/_cframer.c by setup.py's ext_modules with the compiler
    # Python was built with. It is optional: without that compiler on PATH (.ci/run's first run of tests/unit has only
    # the venv there) the wheel is built without it, and setuptools says so.
    compiled = any(n.startswith("proxy/wire/_cframer.") and n.endswith(".so") for n in names)
    if shutil.which(sysconfig.get_config_var("CC").split()[0]):
        assert compiled, sorted(names)
    else:
        assert not compiled and 'building extension "proxy.wire._cframer" failed' in output
    spec = PACKAGE / "spec"
    manifest = json.loads((spec / "MANIFEST.json").read_text())
    listed = {f"proxy/spec/{rel}" for rel in manifest["files"]} | {"proxy/spec/MANIFEST.json", "proxy/spec/SOURCES.md"}
    assert len(listed) > 10
    assert listed <= names, sorted(listed - names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
