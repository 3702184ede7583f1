"""The dashboard in a real headless browser (Debian's chromium through Playwright): the page loads behind the API
key, shows the live backend, and updates after a request; the screenshot is kept in bench/out/."""
from __future__ import annotations

import asyncio

import base64
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.config import Config, ServerConfig
from tests.proxy.ui.browser import ARTEFACTS, chromium
from tests.scripted import Script, ScriptedBackend

KEY = "dash-key"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "What is a token bucket?"}], "stream": False}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def app(log_prompts: bool = True) -> TestClient:
    cfg = Config(server=ServerConfig(api_keys=[KEY], log_prompts=log_prompts))
    backend = ScriptedBackend("llama", script=Script(pieces=["A ", "bucket ", "of ", "tokens."], delay=0.02))
    return TestClient(TestServer(make_app(cfg, {"llama": backend})))


async def test_the_page_shows_the_live_backend_and_updates_after_a_request():
    async with app() as c, chromium() as browser:
        context = await browser.new_context(http_credentials={"username": "me", "password": KEY},
                                            viewport={"width": 1280, "height": 860})
        page = await context.new_page()
        assert (await page.goto(str(c.make_url("/ui")))).status == 200
        await page.wait_for_selector('#backends tr[data-backend="llama"] td.up')  # polled: the backend is live
        assert "no requests yet" in await page.inner_text("#recent")
        assert "live" in await page.inner_text("#status")
        for _ in range(3):
            resp = await c.post("/api/chat", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
            assert resp.status == 200
        await page.wait_for_selector('#recent td:has-text("/api/chat")', timeout=10_000)
        recent = await page.inner_text("#recent")
        assert "What is a token bucket?" in recent and "skip" in recent  # log_prompts is on; sampled: not cached
        assert await page.inner_text("#total") == "3"
        assert "tiny:latest" in await page.inner_text("#backends")  # the models it has loaded
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTEFACTS / "dashboard.png"
        await page.screenshot(path=str(shot), full_page=True)
        print(f"dashboard screenshot: {shot}")
        assert shot.stat().st_size > 10_000


async def test_the_key_is_asked_for_and_prompts_stay_out_without_log_prompts():
    async with app(log_prompts=False) as c:
        asked = await c.get("/ui")
        assert asked.status == 401 and asked.headers["WWW-Authenticate"].startswith("Basic")
        assert (await c.get("/ui/state")).status == 401
        assert (await c.get("/ui/state", headers=basic("anyone", "wrong"))).status == 401
        await (await c.post("/api/chat", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})).read()
        state = await (await c.get("/ui/state", headers=basic("anyone", KEY))).json()
        assert (await c.get("/", headers=basic("anyone", KEY))).status == 200
    assert state["backends"][0]["name"] == "llama" and state["backends"][0]["healthy"]
    assert state["recent"][0]["prompt"] == "" and state["recent"][0]["tokens"] == 4
    assert state["requests"] == {"200": 1.0} and sum(state["series"]["requests"]) == 1


async def test_the_root_still_answers_like_ollama():
    async with app() as c:
        resp = await c.get("/")
        assert resp.status == 200 and await resp.text() == "Ollama is running"
        await asyncio.sleep(0)


async def test_prompts_kept_before_log_prompts_was_turned_off_leave_the_page():
    from proxy.state import GENERATIONS
    async with app(log_prompts=True) as c:
        await (await c.post("/api/chat", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})).read()
        before = await (await c.get("/ui/state", headers=basic("me", KEY))).json()
        c.server.app[GENERATIONS].current.config.server.log_prompts = False  # as a reload that turns it off
        after = await (await c.get("/ui/state", headers=basic("me", KEY))).json()
    assert before["recent"][0]["prompt"] == "What is a token bucket?" and after["recent"][0]["prompt"] == ""


async def test_a_key_reads_only_its_own_requests_and_an_admin_reads_all():
    """Any key may open the dashboard where no admin_keys are set: with log_prompts on, each key's holder read every
    other key's prompts there; then, with those blanked, still when, what model and for how long each asked, which
    /velo/requests never showed another key."""
    other = "other-key"
    backend = ScriptedBackend("llama", script=Script(pieces=["ok"]))
    for admins in ([], ["admin-key"]):
        cfg = Config(server=ServerConfig(api_keys=[KEY, other], admin_keys=admins, log_prompts=True))
        async with TestClient(TestServer(make_app(cfg, {"llama": backend}))) as c:
            for key, text in ((KEY, "mine"), (other, "theirs")):
                chat = {**CHAT, "messages": [{"role": "user", "content": text}]}
                assert (await c.post("/api/chat", json=chat, headers={"Authorization": f"Bearer {key}"})).status == 200
            if admins:
                refused = await c.get("/ui/state", headers=basic("me", KEY))
                assert refused.status == 401  # a browser asks again, for an admin key
                seen = {"admin": await (await c.get("/ui/state", headers=basic("me", "admin-key"))).json()}
            else:
                seen = {k: await (await c.get("/ui/state", headers=basic("me", k))).json() for k in (KEY, other)}
        prompts = {who: [r["prompt"] for r in state["recent"]] for who, state in seen.items()}
        if admins:
            assert prompts == {"admin": ["theirs", "mine"]}
        else:
            assert prompts == {KEY: ["mine"], other: ["theirs"]}
        assert all("tenant" not in r for state in seen.values() for r in state["recent"])


async def test_without_keys_every_request_shows_whatever_key_its_tool_sent():
    """Without api_keys the dashboard is the one local user's: the openai SDK must send some key, and a request
    from it showed with its prompt blanked, as if another user's."""
    backend = ScriptedBackend("llama", script=Script(pieces=["ok"]))
    async with TestClient(TestServer(make_app(Config(server=ServerConfig(log_prompts=True)), {"llama": backend}))) as c:
        for key, text in (("sk-anything", "from the sdk"), (None, "from curl")):
            chat = {**CHAT, "messages": [{"role": "user", "content": text}]}
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            assert (await c.post("/api/chat", json=chat, headers=headers)).status == 200
        state = await (await c.get("/ui/state")).json()
    assert [r["prompt"] for r in state["recent"]] == ["from curl", "from the sdk"]


async def test_counts_ending_in_zero_show_whole():
    """The page's number format stripped trailing zeros from whole numbers too: 10 requests showed as "1"."""
    async with app() as c, chromium() as browser:
        context = await browser.new_context(http_credentials={"username": "me", "password": KEY})
        page = await context.new_page()
        for _ in range(10):
            await (await c.post("/api/chat", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})).read()
        await page.goto(str(c.make_url("/ui")))
        await page.wait_for_selector("#recent tbody tr:nth-child(10)")
        assert await page.inner_text("#total") == "10"


async def test_the_page_s_script_and_style_are_revalidated_and_only_they_are_served():
    """Without Cache-Control, a browser keeps app.js fresh for a tenth of its age since Last-Modified (a wheel's
    build time): days of the old script against a new /ui/state after an upgrade."""
    async with app() as c:
        for name in ("app.js", "style.css"):
            resp = await c.get(f"/ui/static/{name}", headers=basic("me", KEY))
            assert resp.status == 200 and resp.headers["Cache-Control"] == "no-cache"
        missing = await c.get("/ui/static/nope.js", headers=basic("me", KEY))
        assert missing.status == 404 and "nope.js" in (await missing.json())["error"]  # an empty octet-stream 404 was


async def test_the_page_runs_only_its_own_script_and_no_site_frames_it():
    """It shows strings any client or backend sets (model names, prompts) to a browser holding an admin key: a
    script that slipped in would run with that key, and any site could frame the page."""
    async with app() as c:
        for path in ("/ui", "/ui/static/app.js", "/ui/static/style.css", "/ui/state"):
            resp = await c.get(path, headers=basic("me", KEY))
            assert resp.status == 200 and resp.headers["X-Content-Type-Options"] == "nosniff"
        policy = (await c.get("/ui", headers=basic("me", KEY))).headers["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy


async def test_a_managed_servers_counts_are_worded_for_one():
    """A llama-server started once read "1 starts, 1 swaps"."""
    async with app() as c, chromium() as browser:
        context = await browser.new_context(http_credentials={"username": "me", "password": KEY})
        page = await context.new_page()
        assert (await page.goto(str(c.make_url("/ui")))).status == 200
        managed = "{state: 'ready', waiting: 0, starts: 1, swaps: 1, wait_s: 0.5}"
        assert await page.evaluate(f"servers({{managed: {managed}}})") == \
            "llama-server ready · 0 waiting · 1 start, 1 swap, 0.5 s waited"
