"""Counts in the words Velo writes (headers, errors, logs): "1 message", "3 messages", never "1 messages"."""
from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """`n` and the noun in its number (every noun Velo counts takes an "s")."""
    return f"{n} {noun if n == 1 else noun + 's'}"
