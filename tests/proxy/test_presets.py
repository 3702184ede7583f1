"""The preset store on its own: names as Ollama tags them, a preset over another, the file written and read back."""
from __future__ import annotations

import pytest

from adapters.errors import BadRequest
from proxy.presets import Preset, PresetStore, full_name
from tests.adapters.test_swaps import until


def test_names_without_a_tag_are_latest():
    assert (full_name("mario"), full_name("mario:v2")) == ("mario:latest", "mario:v2")


def test_a_preset_over_another_keeps_what_it_leaves_unset():
    older = Preset("a:latest", "base", system="S", template="T", parameters={"temperature": 0.2, "top_k": 3})
    newer = Preset("b:latest", "a", system=None, parameters={"temperature": 1.5}).over(older)
    assert (newer.name, newer.base, newer.system, newer.template) == ("b:latest", "base", "S", "T")
    assert newer.parameters == {"temperature": 1.5, "top_k": 3}
    assert Preset("c:latest", "a", system="").over(older).system == ""  # an empty SYSTEM clears it, as in Ollama


async def test_the_file_holds_every_change(tmp_path):
    path = tmp_path / "deep" / "presets.json"
    store = PresetStore(path)
    await store.open()
    await store.put(Preset("a:latest", "base", parameters={"stop": ["x"]}))
    await store.put(Preset("b:latest", "base"))
    assert await store.delete("b") and not await store.delete("b")
    again = PresetStore(path)
    await again.open()
    assert again.all() == store.all() and again.get("a") == store.get("a:latest")
    assert again.get("a").options.stop == ["x"]


async def test_a_change_that_cannot_be_saved_is_not_served_and_says_why(tmp_path):
    """The preset went into what is served before the file was written: a write that failed left it served (and a
    delete that failed left it gone) until a restart said otherwise, and the client read "internal error"."""
    from proxy.presets import PresetsNotSaved
    folder = tmp_path / "presets"
    store = PresetStore(folder / "presets.json")
    await store.open()
    await store.put(Preset("a:latest", "base"))
    for file in folder.iterdir():  # the presets and their lock file
        file.unlink()
    folder.rmdir()
    folder.write_text("a file where the folder was")
    with pytest.raises(PresetsNotSaved, match="could not be saved to"):
        await store.put(Preset("b:latest", "base"))
    with pytest.raises(PresetsNotSaved):
        await store.delete("a")
    assert [p.name for p in store.all()] == ["a:latest"]


async def test_created_models_are_bounded_in_number_and_size(tmp_path, monkeypatch):
    """Anyone may create models where admin_keys is unset, each listed to every client and the file written again
    at each change: 1,500 made-up names took a create from 3 to 44 ms."""
    monkeypatch.setattr("proxy.presets.MAX_PRESETS", 3)
    store = PresetStore(tmp_path / "presets.json")
    await store.open()
    for n in range(3):
        await store.put(Preset(f"m{n}:latest", "base"))
    with pytest.raises(BadRequest, match="3 models created here already"):
        await store.put(Preset("m3:latest", "base"))
    await store.put(Preset("m0:latest", "base", system="changed"))  # one that is there may change
    with pytest.raises(BadRequest, match="at most 1048576 bytes"):
        await store.put(Preset("m1:latest", "base", system="x" * (1024 * 1024)))
    assert len(store.all()) == 3 and store.get("m1").system is None


async def test_two_processes_sharing_the_file_keep_each_others_presets(tmp_path, monkeypatch):
    """Each wrote its own whole set over the other's, through one temporary file the other's rename took away:
    presets lost, and 500s. Two stores on one file stand for two processes (flock locks an open file, not a
    process)."""
    import asyncio
    monkeypatch.setattr("proxy.presets._FOLLOW_S", 0.05)
    path = tmp_path / "presets.json"
    one, two = PresetStore(path), PresetStore(path)
    await one.open()
    await two.open()
    try:
        await asyncio.gather(*(store.put(Preset(f"m{n}:latest", "base"))
                               for n in range(40) for store in [(one, two)[n % 2]]))
        fresh = PresetStore(path)
        await fresh.open()
        await fresh.close()
        assert len(fresh.all()) == 40
        every = {f"m{n}:latest" for n in range(40)}
        await until(lambda: {p.name for p in one.all()} == {p.name for p in two.all()} == every)
        assert await two.delete("m0")
        await until(lambda: one.get("m0") is None)
    finally:
        await one.close()
        await two.close()


async def test_a_file_spoilt_under_a_running_velo_is_said_once_and_what_was_read_stays(tmp_path, monkeypatch, caplog):
    """Another process (or a hand) spoilt the file: what was read stays served, a change is a 500 saying why, and
    the log says so once per change of the file, not every 2 s."""
    import asyncio
    import logging

    from proxy.presets import PresetsNotSaved
    monkeypatch.setattr("proxy.presets._FOLLOW_S", 0.02)
    path = tmp_path / "presets.json"
    store = PresetStore(path)
    await store.open()
    try:
        await store.put(Preset("a:latest", "base"))
        with caplog.at_level(logging.WARNING, logger="velo.presets"):
            spoilt = path.with_name("spoilt")
            spoilt.write_text("{ not json")
            spoilt.replace(path)  # at once: a truncate then a write could be seen as two changes
            await until(lambda: "not read again" in caplog.text)
            await asyncio.sleep(0.2)  # ten more looks at the unchanged file
        assert caplog.text.count("not read again") == 1 and store.get("a") is not None
        with pytest.raises(PresetsNotSaved, match="is not a presets file Velo wrote"):
            await store.put(Preset("b:latest", "base"))
    finally:
        await store.close()




async def test_a_file_that_holds_names_differing_in_case_keeps_them_both(tmp_path):
    """Velo was case-sensitive before: its file may hold `Foo` and `foo`. Keyed by folded names, one was served
    and the next change wrote the file without the other."""
    import orjson
    path = tmp_path / "presets.json"
    path.write_bytes(orjson.dumps({"presets": [{"name": "Foo:latest", "base": "a"}, {"name": "foo:latest",
                                                                                    "base": "b"}]}))
    store = PresetStore(path)
    await store.open()
    try:
        await store.put(Preset("other:latest", "base"))
        assert sorted(p.name for p in store.all()) == ["Foo:latest", "foo:latest", "other:latest"]
        assert (store.get("Foo").base, store.get("foo").base) == ("a", "b") and store.get("FOO") is not None
        await store.put(Preset("OTHER:latest", "changed"))  # another case of one name: that preset
        assert store.get("other").base == "changed" and len(store.all()) == 3
    finally:
        await store.close()


async def test_a_delete_with_no_presets_file_makes_no_folder_and_no_lock_file(tmp_path):
    """Every /api/delete asks the presets first, one for a backend's model too: with no presets made, each left an
    empty presets.json.lock (and its folder) in the user's home."""
    path = tmp_path / "velo" / "presets.json"
    store = PresetStore(path)
    await store.open()
    assert not await store.delete("llama3") and not (tmp_path / "velo").exists()
    await store.put(Preset("a:latest", "base"))
    path.unlink()  # removed by hand: what is served follows the file
    assert not await store.delete("a") and store.all() == []
