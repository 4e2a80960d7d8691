"""The documentation's examples, run: every ```console block of the README and docs/ holds commands (`$ …`) each
followed by the output the page shows, and the tests run them and compare (tests/unit/test_docs_examples.py for
the commands that need no database, tests/integration/test_docs_examples_db.py for the others).

- A ```toml or ```sql block whose first line is a comment naming a file (`# seat.toml`, `-- example.sql`) is that
  file for the console blocks after it on the same page; the commands run in a folder holding those files.
- In the output shown, `…` stands for any text within a line, and a line that is only `…` for any lines.
- `python tests/examples.py --update` writes what the offline commands (explain, config, check) print now into
  the pages' blocks that hold no `…` (review the diff: the pages then say what the code does).
- `openwop-seat` runs as `python -m proxy`, `make demo` as `python -m proxy.dev.demo`; `$NAME` is taken from the
  environment the test gives. stdout is compared (progress lines go to stderr), or stderr for a command that
  fails and prints nothing on stdout.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
FILE_NAME = re.compile(r"^(?:#|--) ([\w.-]+\.(?:toml|sql|json))$")


@dataclass
class Step:
    command: str
    expected: list[str]


@dataclass
class Example:
    page: Path
    line: int
    steps: list[Step]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def programs(self) -> set[str]:
        """What each step runs: 'make demo', or the openwop-seat subcommand."""
        out = set()
        for step in self.steps:
            words = shlex.split(step.command)
            out.add("make demo" if words[:2] == ["make", "demo"] else f"openwop-seat {words[1]}")
        return out


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text()
        files: dict[str, str] = {}
        for m in FENCE.finditer(text):
            lang, body = m.group(1), m.group(2)
            first = body.split("\n", 1)[0]
            if lang in ("toml", "sql") and (name := FILE_NAME.match(first)):
                files[name.group(1)] = body
                continue
            if lang != "console":
                continue
            steps: list[Step] = []
            for line in body.rstrip("\n").split("\n"):
                if line.startswith("$ "):
                    steps.append(Step(line[2:], []))
                elif steps:
                    steps[-1].expected.append(line)
                else:
                    raise AssertionError(f"{page}: a console block must start with a `$ ` command line")
            found.append(Example(page, text.count("\n", 0, m.start()) + 1, steps, dict(files)))
    return found


def _argv(command: str, env: dict[str, str]) -> list[str]:
    words = [os.path.expandvars(w) if "$" in w else w for w in shlex.split(command)]
    if words[:2] == ["make", "demo"]:
        return [sys.executable, "-m", "proxy.dev.demo"]
    if words[0] != "openwop-seat":
        raise AssertionError(f"an example runs openwop-seat or make demo, not {words[0]!r}")
    return [sys.executable, "-m", "proxy", *words[1:]]


def pattern(expected: list[str]) -> re.Pattern:
    parts = []
    for line in expected:
        if line.strip() == "…":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(re.escape(p) for p in line.rstrip().split("…")) + r"[ \t]*\n")
    return re.compile("".join(parts))


def run(example: Example, workdir: Path, env: dict[str, str] | None = None, timeout: float = 300) -> None:
    """Run ``example`` in ``workdir``; AssertionError naming the page and line when an output differs."""
    for name, body in example.files.items():
        (workdir / name).write_text(body)
    full = {**os.environ, **(env or {})}
    for step in example.steps:
        saved = dict(os.environ)
        os.environ.update(full)
        try:
            argv = _argv(step.command, full)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        out = subprocess.run(argv, cwd=workdir, env={**full, "PYTHONPATH": str(ROOT)}, capture_output=True,
                             text=True, timeout=timeout)
        shown = out.stderr if out.returncode != 0 and not out.stdout else out.stdout
        text = "\n".join(line.rstrip() for line in shown.rstrip("\n").split("\n")) + "\n"
        if not pattern(step.expected).fullmatch(text):
            raise AssertionError(
                f"{example.name}: `{step.command}` printed (exit {out.returncode}):\n{out.stdout}\n"
                f"stderr:\n{out.stderr[-2000:]}\nbut the page shows:\n" + "\n".join(step.expected))


OFFLINE = {"openwop-seat explain", "openwop-seat config", "openwop-seat check"}
EXAMPLE_SECRET = "an-example-claim-secret-0123456789"  # what the tests give as $OPENWOP_SEAT_CLAIM_SECRET


def _output(example: Example, step: Step, workdir: Path, env: dict[str, str]) -> str:
    out = subprocess.run(_argv(step.command, env), cwd=workdir, env={**env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    shown = out.stderr if out.returncode != 0 and not out.stdout else out.stdout
    return "\n".join(line.rstrip() for line in shown.rstrip("\n").split("\n"))


def update() -> list[str]:
    """Rewrite the offline console blocks without `…` with what their commands print now; the pages changed."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    env["OPENWOP_SEAT_CLAIM_SECRET"] = EXAMPLE_SECRET
    changed = []
    by_page: dict[Path, list[Example]] = {}
    for example in examples():
        by_page.setdefault(example.page, []).append(example)
    for page, found in by_page.items():
        text = page.read_text()
        blocks = [m for m in FENCE.finditer(text) if m.group(1) == "console"]
        out, last = [], 0
        for m, example in zip(blocks, found):
            body = m.group(2)
            if example.programs <= OFFLINE and not any("…" in line for s in example.steps for line in s.expected):
                with tempfile.TemporaryDirectory() as d:
                    for name, content in example.files.items():
                        (Path(d) / name).write_text(content)
                    body = "".join(f"$ {step.command}\n{_output(example, step, Path(d), env)}\n"
                                   for step in example.steps)
            out.append(text[last:m.start(2)] + body)
            last = m.end(2)
        new = "".join(out) + text[last:]
        if new != text:
            page.write_text(new)
            changed.append(str(page.relative_to(ROOT)))
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/examples.py --update")
    print("\n".join(update()) or "nothing to update")
