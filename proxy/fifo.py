"""The first-in first-out queues of a session's owed answers: a list while short, a deque once long.

A list costs an idle session nothing but its header (a deque allocates a 64-slot block up front: make bench's
idle_memory), but ``list.pop(0)`` moves every item after the first: draining 16,384 owed answers (the bound
at the default buffer_limit) that way took most of a second of the event loop for every session of the worker.
So a queue longer than :data:`LONG` becomes a deque, and stays one.
"""

from __future__ import annotations

from collections import deque

LONG = 64


def grown(fifo: list | deque) -> list | deque:
    """``fifo`` after an append made it longer than :data:`LONG`: a deque of its items (the same deque if it is one)."""
    return deque(fifo) if fifo.__class__ is list else fifo


def popleft(fifo: list | deque):
    """The first item of ``fifo``, removed (IndexError when empty, as list.pop and deque.popleft)."""
    return fifo.pop(0) if fifo.__class__ is list else fifo.popleft()
