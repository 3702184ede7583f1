"""Shared fixtures: the fake upstreams of tests/fakes.py."""
import pytest

from tests.fakes import OllamaDouble


@pytest.fixture
async def ollama_double():
    async with OllamaDouble() as double:
        yield double
