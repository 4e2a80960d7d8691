"""Walking pglast's syntax trees (shared by the classifier and the client_encoding check)."""

from __future__ import annotations


def walk(node):
    """Yield every pglast node under ``node`` (inclusive), depth first."""
    from pglast import ast

    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (list, tuple)):
            stack.extend(n)
        elif isinstance(n, ast.Node):
            yield n
            for name in n.__slots__:
                child = getattr(n, name, None)
                if isinstance(child, (ast.Node, list, tuple)):
                    stack.append(child)
