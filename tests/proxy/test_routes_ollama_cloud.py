"""Ollama's ollama.com and file routes, which the ollama CLI calls (signin, launch, create from a file): answered
as a server without cloud, not with "no route"."""
from __future__ import annotations

import ollama
import pytest
from aiohttp.test_utils import TestClient


async def test_launch_sees_cloud_off_and_no_recommendations(client: TestClient) -> None:
    assert await (await client.get("/api/status")).json() == {"cloud": {"disabled": True, "source": "velo"}}
    recommended = await client.get("/api/experimental/model-recommendations")
    assert await recommended.json() == {"recommendations": []}


@pytest.mark.parametrize("method, path", [("POST", "/api/me"), ("POST", "/api/signout"),
                                          ("DELETE", "/api/user/keys/abc")])
async def test_signin_and_signout_say_velo_has_no_account(client: TestClient, method: str, path: str) -> None:
    resp = await client.request(method, path)
    assert resp.status == 400 and "no ollama.com account" in (await resp.json())["error"]
