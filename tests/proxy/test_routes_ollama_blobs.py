"""/api/blobs, which `ollama create` sends each file of a model made from files (a GGUF) to before /api/create:
passed through to an Ollama backend (the protocol double follows server/routes.go's blob handlers), the upload as
it arrives; with no Ollama backend, or a set of replicas, a 400 saying where such models are made."""
from __future__ import annotations

import hashlib
from pathlib import Path

import ollama
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.config import Config, ServerConfig
from tests.fakes import OllamaDouble


def _gguf(folder: Path, size: int) -> Path:
    path = folder / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * (size // 256))
    return path


async def test_ollama_create_from_a_file_goes_through_to_ollama(tmp_path: Path) -> None:
    """The official client's create_blob, then a create with `files`: the file reaches Ollama whole, past Velo's
    body limit (a GGUF is many GB; Velo holds none of it), and the created model is listed."""
    gguf = _gguf(tmp_path, 256 * 1024)
    async with OllamaDouble(models=["llama3:latest"]) as up:
        config = Config(server=ServerConfig(max_body_bytes=1024),
                        backends=[BackendConfig(name="o", kind="ollama", urls=[up.url])], default_backend="o")
        async with TestClient(TestServer(make_app(config))) as c:
            oll = ollama.AsyncClient(host=str(c.make_url("")).rstrip("/"))
            digest = await oll.create_blob(gguf)
            assert up.blobs == {digest: gguf.stat().st_size}
            assert (await c.head(f"/api/blobs/{digest}")).status == 200
            assert (await c.post(f"/api/blobs/{digest}", data=b"held already: not read")).status == 200
            assert (await oll.create("mine", files={"model.gguf": digest})).status == "success"
            assert "mine:latest" in {m.model for m in (await oll.list()).models}


async def test_ollamas_own_answers_come_back_as_it_sent_them(tmp_path: Path) -> None:
    async with OllamaDouble() as up:
        config = Config(backends=[BackendConfig(name="o", kind="ollama", urls=[up.url])], default_backend="o")
        async with TestClient(TestServer(make_app(config))) as c:
            other = "sha256:" + hashlib.sha256(b"other").hexdigest()
            assert (await c.head(f"/api/blobs/{other}")).status == 404  # the CLI uploads on a 404
            wrong = await c.post(f"/api/blobs/{other}", data=b"not the file named")
            assert wrong.status == 400 and (await wrong.json())["error"].startswith("digest mismatch, expected")
            assert up.blobs == {}
            for name in ("sha256:abc", "md5:" + "0" * 64, "sha256:" + "0" * 64 + "%2Fx"):
                refused = await c.post(f"/api/blobs/{name}", data=b"x")
                assert refused.status == 400 and await refused.json() == {"error": "invalid digest format"}, name
            assert [r.path for r in up.requests if r.path.startswith("/api/blobs/")] == [f"/api/blobs/{other}"] * 2


async def test_without_an_ollama_backend_says_where_models_from_files_are_made(client: TestClient, base_url: str,
                                                                               tmp_path: Path) -> None:
    """The official client asks HEAD first; an upload then is refused the same way."""
    gguf = _gguf(tmp_path, 1024)
    with pytest.raises(ollama.ResponseError) as e:
        await ollama.AsyncClient(host=base_url).create_blob(gguf)
    assert e.value.status_code == 400
    upload = await client.post("/api/blobs/sha256:" + "0" * 64, data=gguf.read_bytes())
    assert upload.status == 400 and "on the Ollama server itself" in (await upload.json())["error"]


async def test_a_set_of_replicas_is_not_sent_a_file_only_one_of_them_would_get(tmp_path: Path) -> None:
    async with OllamaDouble() as a, OllamaDouble() as b:
        config = Config(backends=[BackendConfig(name="pool", kind="ollama", urls=[a.url, b.url])])
        async with TestClient(TestServer(make_app(config))) as c:
            refused = await c.post("/api/blobs/sha256:" + "0" * 64, data=b"GGUF")
            assert refused.status == 400 and "set of replicas" in (await refused.json())["error"]
            assert a.blobs == b.blobs == {}
