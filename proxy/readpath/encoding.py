"""The session's ``client_encoding``, as PostgreSQL parses statement text in it (pure code, no I/O).

The seat reads a statement's bytes as UTF-8 (bytes that are not UTF-8 kept as they are); PostgreSQL reads
them in the session's ``client_encoding``. For every server encoding that is the same parse: each byte of a
multibyte character has its high bit set, so ``\\``, ``'``, ``"``, ``;`` and ``-`` are the same bytes to both.
The *client-only* encodings (SJIS and SHIFT_JIS_2004, BIG5, GBK, GB18030, JOHAB, UHC) are different: the
second byte of a character may be ``\\`` (0x5c), among other ASCII bytes, so a literal such as
``E'<such a character>\\' , <SQL> --'`` ends earlier for PostgreSQL than for the seat, and the SQL after it
is neither rewritten nor refused. A translated session (major 1 or 2) therefore never runs in such an
encoding: it is refused at startup, a ``SET client_encoding`` / ``SET NAMES`` / ``set_config`` to one is
refused, and a ParameterStatus that reports one (PostgreSQL's own word, which also covers a role's or a
database's default) ends the session before anything after it reaches the client.

Names are compared as PostgreSQL compares them (``clean_encoding_name``: letters and digits only, lower
case), against the encodings PostgreSQL also accepts as a server encoding and their aliases: an allowlist,
so a name the seat does not know is refused rather than guessed.
"""

from __future__ import annotations

import re

from proxy.readpath.pgnodes import walk as _walk

# PostgreSQL's server encodings and their aliases (src/common/encnames.c), cleaned: their multibyte characters
# (if any) never contain an ASCII byte.
SAFE_ENCODINGS = frozenset((
    "sqlascii", "utf8", "unicode", "muleinternal",
    "eucjp", "eucjis2004", "euccn", "euckr", "euctw",
    *(f"latin{i}" for i in range(1, 11)),
    *(f"iso8859{i}" for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16)),
    "koi8", "koi8r", "koi8u",
    "win", "alt", "abc", "tcvn", "tcvn5712", "vscii",
    "win866", "win874", "windows866", "windows874", "cp866",
    *(f"win125{i}" for i in range(9)), *(f"windows125{i}" for i in range(9)), *(f"cp125{i}" for i in range(9)),
))
# PostgreSQL's client-only encodings, by the names it reports them under (for the messages).
CLIENT_ONLY = ("SJIS", "SHIFT_JIS_2004", "BIG5", "GBK", "GB18030", "JOHAB", "UHC")
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
ERROR_CODE = "client_encoding_refused"  # proxy.errors.SEAT_ERRORS; the refusal kind of a statement that sets one
DOCS = "docs/refusals-and-errors.md#ow009-client_encoding_refused"


def clean(name: str) -> str:
    """``clean_encoding_name``: only letters and digits, lower case."""
    return "".join(c for c in name.lower() if c.isascii() and c.isalnum())


def refusal(value: str) -> str | None:
    """Why a translated session cannot run with ``client_encoding`` ``value``, or None when it can."""
    if clean(value) in SAFE_ENCODINGS:
        return None
    return (f"client_encoding {value!r} is not one openwop-seat parses as PostgreSQL does: in the client-only "
            f"encodings ({', '.join(CLIENT_ONLY)}) a character may contain the byte of a backslash or a quote, "
            f"so a translated session (major 1 or 2) must use UTF8 or another server encoding (see {DOCS})")


def setting_refusal(stmt) -> str:
    """Why a parsed statement (a pglast node) sets a ``client_encoding`` a translated session cannot use, or ''.

    ``SET [LOCAL|SESSION] client_encoding`` and ``SET NAMES`` (the same node), and ``set_config`` with the name
    ``client_encoding`` given as a constant. A value that is not a constant is refused too; ``DEFAULT`` and
    ``RESET`` go back to the value the session started with, which was checked. ``set_config`` with a name that
    is not a constant is left to the ParameterStatus PostgreSQL sends (docs/refusals-and-errors.md).
    """
    from pglast import ast

    for n in _walk(stmt):
        if isinstance(n, ast.VariableSetStmt) and (n.name or "").lower() == "client_encoding":
            if n.kind != 0:  # only VAR_SET_VALUE names a value; DEFAULT and RESET restore the checked one
                continue
            for arg in n.args or ():
                value = _constant(arg)
                why = refusal(value) if value is not None else _not_constant("SET client_encoding")
                if why:
                    return why
        elif isinstance(n, ast.FuncCall) and n.args and len(n.args) >= 2:
            name = ".".join(f.sval for f in n.funcname).lower()
            if name not in ("set_config", "pg_catalog.set_config"):
                continue
            setting = _constant(n.args[0])
            if setting is None or setting.strip().lower() != "client_encoding":
                continue
            value = _constant(n.args[1])
            why = refusal(value) if value is not None else _not_constant("set_config('client_encoding', …)")
            if why:
                return why
    return ""


def to_latin1(sql: str) -> str:
    """Statement text the read path decoded as UTF-8 with bytes that are not (lone surrogates), as latin-1: the
    same bytes, one character each, which pglast can parse. Every encoding a translated session may use keeps ASCII
    bytes ASCII, so the statement's lexical structure is the same; its other characters only pass through."""
    return sql.encode("utf-8", "surrogateescape").decode("latin-1")


def from_latin1(plan):
    """A plan made from :func:`to_latin1` text, with every text back in the read path's form (same bytes)."""
    def back(text: str) -> str:
        return text.encode("latin-1").decode("utf-8", "surrogateescape")

    statements = tuple(st._replace(sql=back(st.sql)) for st in plan.statements)
    refused = plan.refused._replace(sql=back(plan.refused.sql)) if plan.refused is not None else None
    return plan._replace(statements=statements, text=back(plan.text), refused=refused,
                         fast=back(plan.fast) if plan.fast else "")


def might_set(low: str) -> bool:
    """Could lower-cased statement text set client_encoding (the prefilter before a parse)?"""
    return "encoding" in low or "names" in low or "set_config" in low


def statement_refusals(sql: str) -> list[tuple[str, str]] | None:
    """For statement text the classifier does not parse otherwise: None when it sets no client_encoding a
    translated session cannot use, else each statement's text and why it is refused ('' for none).

    Bytes that are not UTF-8 (kept by the read path as lone surrogates) are read as a letter, as PostgreSQL
    reads a high byte of a single-byte server encoding outside a literal. Text that does not parse is left to
    PostgreSQL (it fails there too, in an encoding the seat checked)."""
    if not might_set(sql.lower()):
        return None
    from pglast import parse_sql

    try:
        raw_stmts = parse_sql(_NOT_UTF8.sub("x", sql))
    except Exception:  # noqa: BLE001 - a parse error, or text that is not UTF-8: PostgreSQL decides
        return None
    pieces = []
    for raw in raw_stmts:
        start = raw.stmt_location or 0
        length = raw.stmt_len or (len(sql) - start)
        pieces.append((sql[start:start + length], setting_refusal(raw.stmt)))
    return pieces if any(why for _, why in pieces) else None


def _constant(node) -> str | None:
    from pglast import ast

    if isinstance(node, ast.TypeCast):
        node = node.arg
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.String):
        return node.val.sval
    return None


def _not_constant(what: str) -> str:
    return (f"{what} with a value that is not a constant: openwop-seat cannot tell whether it is a client-only "
            f"encoding, so a translated session may not run it (see {DOCS})")
