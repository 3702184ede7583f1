"""What outlives a configuration is kept under keys that name its settings, and those keys are logged."""
from __future__ import annotations

import logging

from proxy.cache.config import CacheConfig
from proxy.keep import Keep, fingerprint


async def test_a_failed_close_logs_no_password_of_the_settings(caplog):
    cfg = CacheConfig(redis_url="redis://:hunter2@127.0.0.1:1/0")
    assert fingerprint(cfg) == fingerprint(CacheConfig(redis_url="redis://:hunter2@127.0.0.1:1/0"))
    assert fingerprint(cfg) != fingerprint(CacheConfig())

    async def broken(_: object) -> None:
        raise OSError("no redis here")
    lease = Keep().lease()
    lease.hold(f"cache:{fingerprint(cfg)}", object, broken)
    with caplog.at_level(logging.ERROR, logger="velo.keep"):
        await lease.give_back()
    assert "closing cache:" in caplog.text and "hunter2" not in caplog.text
