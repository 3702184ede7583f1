"""The Responses API's store on its own: what its memory tier counts against `[responses] max_bytes`."""
from __future__ import annotations

from proxy.responses_store import ResponsesConfig, ResponseStore, StoredResponse


async def test_a_response_read_back_from_sqlite_counts_as_much_memory_as_one_written_here(tmp_path):
    """Promoted from SQLite (after a restart, or by another process), an entry counted its payload's bytes alone, ~2.5x
    less than the same entry written here: max_bytes could be passed by that much."""
    config = ResponsesConfig(sqlite_path=str(tmp_path / "responses.db"))
    record = StoredResponse({"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "content": "x" * 10_000}]},
                            [], [])
    here = await ResponseStore.open(config)
    await here.put("t", record)
    elsewhere = await ResponseStore.open(config)
    assert await elsewhere.get("t", "resp_1") is not None and await elsewhere.item("t", "msg_1") is not None
    assert elsewhere.memory.bytes_used == here.memory.bytes_used
    await here.close()
    await elsewhere.close()
