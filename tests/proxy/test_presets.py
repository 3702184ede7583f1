"""The preset store on its own: names as Ollama tags them, a preset over another, the file written and read back."""
from __future__ import annotations

from proxy.presets import Preset, PresetStore, full_name


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
