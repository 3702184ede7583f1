"""`velo serve --config FILE` reloads FILE on SIGHUP, as a service manager's `reload` sends it."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.fakes import FakeOpenAI
from tests.http_ready import wait_until_ok
from tests.llama_server import free_port

ROOT = str(Path(__file__).resolve().parents[2])


def config(url: str, reply_model: str, port: int) -> str:
    return f"""
[server]
port = {port}

[aliases]
m = "fake:{reply_model}"

[[backends]]
name = "fake"
kind = "openai"
url = "{url}"
models = ["one", "two"]
"""


async def test_sighup_reloads_the_config_file(tmp_path):
    async with FakeOpenAI(models=["one", "two"]) as fake:
        port = free_port()
        path = tmp_path / "config.toml"
        path.write_text(config(fake.url, "one", port))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(path)], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_until_ok(url + "/health", 60, proc=proc)
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
            async with aiohttp.ClientSession() as s:
                await (await s.post(url + "/api/chat", json=body)).read()
                assert fake.last("/v1/chat/completions")["model"] == "one"
                before = path.stat()
                path.write_text(config(fake.url, "two", port))
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # so only the signal can reload it
                proc.send_signal(signal.SIGHUP)
                for _ in range(100):
                    await (await s.post(url + "/api/chat", json=body)).read()
                    if fake.last("/v1/chat/completions")["model"] == "two":
                        break
                    await asyncio.sleep(0.1)
                assert fake.last("/v1/chat/completions")["model"] == "two"
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "configuration 2 from" in out and "is in force" in out


async def test_sighups_while_velo_starts_never_end_it(tmp_path):
    """`systemctl reload` while Velo starts (an engine loads its model for seconds): SIGHUP's default action ended
    the process until Velo took the signal, which it did only once it served."""
    async with FakeOpenAI(models=["one", "two"]) as fake:
        port = free_port()
        path = tmp_path / "config.toml"
        path.write_text(config(fake.url, "one", port))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
        log = tmp_path / "velo.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(path)], cwd=tmp_path,
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/health"
        try:
            while b"configuration from" not in log.read_bytes():  # `velo serve` runs: its imports are done
                assert proc.poll() is None, log.read_text()
                await asyncio.sleep(0.01)
            async with aiohttp.ClientSession() as s:
                for _ in range(600):
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGHUP)
                    await asyncio.sleep(0.02)
                    assert proc.poll() is None, log.read_text()
                    try:
                        if (await s.get(url)).status == 200:
                            break
                    except aiohttp.ClientConnectionError:
                        continue
                proc.send_signal(signal.SIGHUP)
                await asyncio.sleep(0.5)
                assert proc.poll() is None and (await s.get(url)).status == 200
        finally:
            proc.terminate()
            proc.wait(30)
        assert "Traceback" not in log.read_text()
