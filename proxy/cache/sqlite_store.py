"""On-disk exact tier: survives restarts. One connection on one worker thread, so SQLite never runs on the
event loop and never sees two threads."""
from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

_SCHEMA = """CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, payload BLOB NOT NULL, expires_at REAL NOT NULL, stored_at REAL NOT NULL)"""
_PRUNE_EVERY = 100  # puts between byte-bound checks: the check scans the table


@dataclass
class SqliteStore:
    path: str
    max_bytes: int
    clock: Callable[[], float] = time.time
    name: str = "sqlite"
    shared = False  # one host's file: stored responses read this process's memory before it
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "velo-cache-sqlite"))
    bytes_used: int = 0  # payload bytes, exact after open and each prune, an upper bound between prunes
    _db: sqlite3.Connection | None = None
    _puts: int = 0

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @classmethod
    async def open(cls, path: str, max_bytes: int, clock: Callable[[], float] = time.time) -> "SqliteStore":
        store = cls(path, max_bytes, clock)
        await store._run(store._open)
        return store

    def _open(self) -> None:
        _private_file(Path(self.path))
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        try:  # reads the header alone: a file that is no database is left as it was, its mode too
            self._db.execute("PRAGMA schema_version")
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise sqlite3.DatabaseError(f"{self.path}: {e}") from e
        os.chmod(self.path, 0o600)  # before WAL mode, whose -wal and -shm files SQLite gives the file's mode
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._prune()
        self._db.commit()

    async def get(self, key: str) -> tuple[bytes, float] | None:
        return await self._run(self._get, key)

    def _get(self, key: str) -> tuple[bytes, float] | None:
        row = self._db.execute("SELECT payload, expires_at FROM entries WHERE key = ? AND expires_at > ?",
                               (key, self.clock())).fetchone()
        return (bytes(row[0]), row[1]) if row else None

    async def put(self, key: str, payload: bytes, expires_at: float) -> None:
        await self._run(self._put, key, payload, expires_at)

    def _put(self, key: str, payload: bytes, expires_at: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
                         (key, payload, expires_at, self.clock()))
        self._puts += 1
        self.bytes_used += len(payload)
        if self._puts % _PRUNE_EVERY == 0:
            self._prune()
        self._db.commit()

    async def delete(self, key: str) -> bool:
        return await self._run(self._delete, key)

    def _delete(self, key: str) -> bool:
        deleted = self._db.execute("DELETE FROM entries WHERE key = ?", (key,)).rowcount > 0
        self._db.commit()
        return deleted

    def _prune(self) -> None:
        """Drop expired rows, then the oldest until the payloads fit in `max_bytes`."""
        self._db.execute("DELETE FROM entries WHERE expires_at <= ?", (self.clock(),))
        total = 0
        rows = self._db.execute("SELECT key, length(payload) FROM entries ORDER BY stored_at DESC").fetchall()
        for key, size in rows:
            if total + size > self.max_bytes:
                self._db.execute("DELETE FROM entries WHERE key = ?", (key,))
            else:
                total += size
        self.bytes_used = total

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
        self._pool.shutdown(wait=True)


def _private_file(path: Path) -> None:
    """Cached answers are the users' conversations: the file is created its owner's alone (0600; one already there
    is made so once it is found to be a database), in folders Velo creates for its owner alone (0700). A path
    naming some other file had its mode changed first: `sqlite_path = "/etc/passwd"` made it 0600 for root."""
    missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
