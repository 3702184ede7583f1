"""Cursor pagination as OpenAI's and Anthropic's list endpoints read their query strings: a bounded `limit`, and
the id of the item to start after (or to end before)."""
from __future__ import annotations

from typing import Mapping

from adapters.errors import BadRequest


def query_int(query: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadRequest(f"{key}: must be an integer from {low} to {high}", param=key)
    return value


def position(ids: list[str], cursor: str, key: str, what: str = "item") -> int:
    """Where the `what` that `cursor` names stands in the list; a 400 naming `key` when it is not there."""
    if cursor not in ids:
        raise BadRequest(f"{key}: no {what} {cursor!r} in the list", param=key)
    return ids.index(cursor)


def window(ids: list[str], limit: int, after: str | None, before: str | None, keys: tuple[str, str],
           what: str = "item") -> tuple[int, int, bool]:
    """The page's bounds in `ids`: `limit` after the `after` cursor, or the `limit` just before the `before` one
    (`keys` name the two in the query); and whether more lie the way the page went, as `has_more` reads in OpenAI's
    and Anthropic's cursor pagination."""
    if after is not None and before is not None:
        raise BadRequest(f"{keys[0]}, {keys[1]}: give at most one", param=keys[1])
    if before is not None:
        end = position(ids, before, keys[1], what)
        return max(0, end - limit), end, end > limit
    start = 0 if after is None else position(ids, after, keys[0], what) + 1
    return start, start + limit, start + limit < len(ids)
