"""llama-server's own routes without a llama-server to pass them to: a clear 404 in llama-server's (OpenAI's) error
shape, which llama.vscode shows. The pass-through itself runs against the real llama-server in
tests/integration/test_llama_backend.py."""
from __future__ import annotations

import orjson
import pytest

from proxy.routes_llama import Used


@pytest.mark.parametrize("path", ["/infill", "/completion"])
async def test_no_llama_server_backend_is_a_404_naming_the_route(client, scripted, path):
    resp = await client.post(path, json={"input_prefix": "def f():", "input_suffix": "", "n_predict": 4})
    err = (await resp.json())["error"]
    assert resp.status == 404 and err["message"].startswith(f"{path} is llama-server's own route")
    assert scripted.requests == []
    named = await client.post(path, json={"model": "tiny", "prompt": "x"})  # the scripted backend serves it
    # it said "model 'tiny' is served by none", where a backend of another kind serves it
    said = (await named.json())["error"]["message"]
    assert named.status == 404 and said.endswith("""model 'tiny' is served by backend 'scripted' (kind = "openai")""")


@pytest.mark.parametrize("method, path", [("GET", "/props"), ("GET", "/slots?model=tiny"),
                                          ("POST", "/slots/0?action=erase"), ("POST", "/tokenize"),
                                          ("POST", "/v1/rerank"), ("POST", "/v1/reranking"),
                                          ("POST", "/reranking"), ("POST", "/embedding")])
async def test_the_other_routes_are_404s_in_llama_servers_shape_too(client, scripted, method, path):
    resp = await client.request(method, path, json={"content": "hi"} if method == "POST" and "?" not in path else None)
    err = (await resp.json())["error"]
    assert resp.status == 404 and f"{path.split('?')[0]} is llama-server's own route" in err["message"]
    assert set(err) == {"message", "type", "param", "code"} and scripted.requests == []


async def test_a_head_is_answered_as_its_get(client):
    """aiohttp answers HEAD on every GET route: on /props it asked for a JSON body, a 400."""
    assert (await client.head("/props")).status == (await client.get("/props")).status == 404


async def test_a_body_that_is_no_object_is_a_400(client):
    resp = await client.post("/infill", json=["input_prefix"])
    assert resp.status == 400 and "error" in await resp.json()


def test_the_tokens_an_answer_used_are_read_across_pieces_and_never_from_its_text():
    used = Used(stream=True)
    for piece in (b'data: {"index":0,"content":"say \\"tokens_predicted\\":999","stop":false}\n\ndata: {"ind',
                  b'ex":0,"content":"","tokens_predicted":1', b'23,"tokens_evaluated":4,"stop":true}\n\n'):
        assert used.read(piece) == piece
    assert used.total() == 127


def test_each_prompts_result_counts_whole_or_streamed():
    """An array of prompts gets a result each, told apart by `index`: only the last result's counts were charged,
    so 4 prompts cost a key one."""
    results = [{"index": i, "content": "x", "tokens_predicted": 40, "tokens_evaluated": 4} for i in range(4)]
    whole = Used(stream=False)
    body = orjson.dumps(results)
    whole.read(body[:10]), whole.read(body[10:])
    streamed = Used(stream=True)
    for result in results:
        streamed.read(b"data: " + orjson.dumps({"index": result["index"], "content": "x", "stop": False}) + b"\n\n")
    for result in results:
        streamed.read(b"data: " + orjson.dumps(result) + b"\n\n")
    assert whole.total() == streamed.total() == 4 * 44


def test_a_whole_answer_too_large_to_read_on_the_loop_keeps_its_estimate():
    """Every piece was kept and parsed at the end, on the event loop: 1.5 s for a 107 MB answer."""
    used = Used(stream=False)
    for _ in range(20):
        used.read(b"x" * 64 * 1024)
    assert used.held == [] and used.total() == 0


def test_a_stream_event_too_long_to_read_is_passed_over_and_the_next_counted():
    """An event was held whole until its newline, however long."""
    used = Used(stream=True)
    used.read(b"data: {\"content\":\"")
    for _ in range(20):
        used.read(b"x" * 64 * 1024)
    assert used.held == []
    used.read(b'"}\n\ndata: {"content":"","tokens_predicted":3,"tokens_evaluated":2,"stop":true}\n\n')
    assert used.total() == 5


async def test_a_whole_answer_cut_by_its_server_is_cut_for_the_client_too():
    """A non-streamed answer has no words for a failure half-way: the connection closes before the body's end, so
    the client's read fails; ended as usual, the cut JSON came as a 200 that looked whole."""
    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from adapters.base import BackendConfig
    from proxy.app import make_app
    from proxy.cache.config import CacheConfig
    from proxy.config import Config

    async def completion(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"content": "Hello, wor')
        request.transport.close()  # llama-server killed mid-answer
        return resp

    llama = web.Application()
    llama.router.add_get("/props", lambda r: web.json_response({"default_generation_settings": {"n_ctx": 2048}}))
    llama.router.add_get("/v1/models", lambda r: web.json_response({"data": [{"id": "m"}]}))
    llama.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
    llama.router.add_post("/completion", completion)
    async with TestServer(llama, host="127.0.0.1", port=0) as upstream:
        cfg = Config(backends=[BackendConfig(name="llama", kind="llamacpp", urls=[str(upstream.make_url(""))],
                                             models=["m"])], cache=CacheConfig(enabled=False))
        async with TestServer(make_app(cfg), host="127.0.0.1", port=0) as velo, aiohttp.ClientSession() as http:
            async with http.post(velo.make_url("/completion"), json={"prompt": "Say", "n_predict": 8}) as resp:
                assert resp.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
