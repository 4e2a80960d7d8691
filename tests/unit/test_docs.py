"""The documentation: a short README, docs/ pages whose links resolve, every configuration key documented.

No database and no external tool: this reads files only.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from proxy.config import Config, config_keys

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
EXAMPLE = ROOT / "config" / "openwop-seat.toml"

README_LIMIT = 15_000  # bytes

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target), not inside inline code; the target has no spaces.
_LINK = re.compile(r"(?<!\\)\[(?:[^\[\]`]|`[^`]*`)*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def _prose_lines(text: str):
    """The lines of a Markdown file outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def headings(path: Path) -> list[tuple[int, str]]:
    """(level, text) of every ATX heading outside code blocks."""
    out = []
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if m:
            out.append((len(m.group(1)), m.group(2)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        if ch in "-_ " or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, text in headings(path):
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in _LINK.finditer(_INLINE_CODE.sub(lambda c: "x" * len(c.group()), line)):
            out.append((number, m.group(1)))
    return out


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _linked_pages() -> list[Path]:
    """Every Markdown page whose links must resolve: the README, docs/, the ADRs and deploy/README.md."""
    return [*_pages(), *sorted((DOCS / "adr").glob("*.md")), ROOT / "deploy" / "README.md"]


def test_readme_is_short():
    size = README.stat().st_size
    assert size < README_LIMIT, f"README.md is {size} bytes; keep it under {README_LIMIT} and move detail to docs/"


def test_docs_pages_exist_and_the_readme_links_each():
    linked = {target.split("#")[0] for _, target in links(README)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not missing, f"README.md's documentation index does not link {missing}"


@pytest.mark.parametrize("page", _linked_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto: ...
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{page.name}:{number}: {target}: no such file")
            continue
        if fragment:
            if dest.is_dir() or dest.suffix != ".md":
                broken.append(f"{page.name}:{number}: {target}: an anchor into a non-Markdown target")
            elif fragment not in anchors(dest):
                broken.append(f"{page.name}:{number}: {target}: no heading with that anchor in {dest.name}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slugs_follow_github():
    assert slug("The per-run lock, and seat replicas") == "the-per-run-lock-and-seat-replicas"
    assert slug("Client → seat") == "client--seat"
    assert slug("proxy.listen") == "proxylisten"
    assert slug("`audit`") == "audit"
    assert slug("UPDATE of type or run_id") == "update-of-type-or-run_id"


def _example_keys() -> set[str]:
    """section.key names the example configuration sets or shows commented out."""
    out: set[str] = set()
    section = ""
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*\[\[?\s*([A-Za-z0-9_.]+)\s*\]\]?", line)
        if m:
            section = m.group(1)
            out.add(section)
            continue
        m = re.match(r"^\s*#?\s*([a-z][a-z0-9_]*)\s*=", line)
        if m and section:
            out.add(f"{section}.{m.group(1)}")
    return out


def _config_keys() -> list[str]:
    return sorted(config_keys(Config()))


def test_config_keys_come_from_the_code():
    keys = _config_keys()
    assert "proxy.listen" in keys and "host.dsn" in keys and "log.level" in keys
    assert all(re.fullmatch(r"[a-z]+\.[a-z_]+", k) for k in keys), keys


@pytest.mark.parametrize("key", _config_keys())
def test_config_key_is_documented(key: str):
    documented = {text.strip("`") for level, text in headings(CONFIGURATION) if level == 3}
    assert key in documented, f"docs/configuration.md has no '### {key}' heading"
    section = (CONFIGURATION.read_text(encoding="utf-8").split(f"### {key}\n", 1) + [""])[1]
    section = section.split("\n#", 1)[0]
    assert "Default: " in section, f"docs/configuration.md, {key}: no 'Default: ...' line"
    assert re.search(r"reload|restart", section, re.I), f"docs/configuration.md, {key}: reload or restart?"
    assert key in _example_keys(), f"config/openwop-seat.toml does not show {key}"


def test_configuration_documents_no_unknown_key():
    keys = set(_config_keys())
    extra = [text for level, text in headings(CONFIGURATION)
             if level == 3 and text.strip("`") not in keys]
    assert not extra, f"docs/configuration.md documents keys the code does not have: {extra}"


def test_code_names_no_readme_section():
    """Messages, HINTs and comments in proxy/ point at docs/ pages, not at README sections."""
    titles = [text for level, text in headings(README) if level in (2, 3)]
    offenders = []
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "README" not in line:
                continue
            named = [t for t in titles if t.lower() in line.lower()]
            offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                             + (f" (README section {named})" if named else ""))
    assert not offenders, "proxy/ refers to the README; point at a docs/ page instead:\n" + "\n".join(offenders)


def test_restart_keys_are_the_documented_ones():
    """A key documented as needing a restart is one a reload keeps (RESTART_KEYS), and no other."""
    from proxy.config import RESTART_KEYS

    text = CONFIGURATION.read_text(encoding="utf-8")
    documented = set()
    for key in _config_keys():
        section = text.split(f"### {key}\n", 1)[1].split("\n#", 1)[0]
        if "Needs a restart" in section:
            documented.add(key)
    assert documented == set(RESTART_KEYS.values())
