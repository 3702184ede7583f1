"""Model presets: Ollama's Modelfile feature (`/api/create` with `from` + `system` / `parameters` / `template`) for
every backend. A preset is a model name of its own that every dialect can use; the resolve stage reads it over its
base model (proxy/stages/resolve.py), and the router lists and routes it as its base (proxy/router.py).

Kept in one JSON file, mode 0600, rewritten whole (to a temporary file, then renamed) on each change: a handful of
presets, changed by hand, needs no database, and a crash mid-write leaves the old file whole.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, TypeVar

import orjson

from adapters.errors import BadRequest, VeloError
from adapters.model_card import parameter_lines
from adapters.protocol import Message, ModelInfo, SamplingOptions
from adapters.schema import setting

from .dialects.ollama import now_iso, parse_message, parse_options

T = TypeVar("T")


@dataclass
class PresetsConfig:
    """Model presets made with /api/create (and /api/copy): a new model name over a base model."""

    path: str | None = setting(None, "the JSON file presets are kept in across restarts (written with mode 0600)",
                               default_doc='"$XDG_DATA_HOME/velo/presets.json" (~/.local/share/velo/presets.json)')

    def file(self) -> Path:
        if self.path:
            return Path(self.path).expanduser()
        data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        return Path(data) / "velo" / "presets.json"


def parameters_over(lines: str, options: dict[str, Any]) -> str:
    """Modelfile PARAMETER `lines` with `options` over them, as Ollama shows a model's options."""
    kept = [line for line in lines.splitlines() if line.split(" ", 1)[0] not in options]
    return "\n".join(filter(None, ["\n".join(kept), parameter_lines(options)]))


@dataclass(frozen=True)
class Preset:
    """`parameters` are Ollama option names, as the client sent them (Modelfile PARAMETER lines)."""

    name: str
    base: str  # never itself a preset: creating from a preset folds the two into one
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    modified_at: str = field(default_factory=now_iso)
    # Ollama's MESSAGE lines, as its API sends them: a conversation every chat continues (`ollama run`'s /save)
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def options(self) -> SamplingOptions:
        return parse_options({"options": self.parameters})

    @property
    def history(self) -> list[Message]:
        return [parse_message(m) for m in self.messages]

    def settings(self) -> dict[str, Any]:
        """What this preset adds to its base."""
        return {"system": self.system, "template": self.template, "parameters": self.parameters,
                "messages": self.messages}

    def shown(self, base: ModelInfo) -> ModelInfo:
        """The base model as /api/show describes this preset, as Ollama shows a created model: its system prompt,
        its template, its parameters over the base's, its time."""
        template = self.template if self.template is not None else base.template
        return replace(base, system=self.system or "", template=template,
                       parameters=parameters_over(base.parameters, self.parameters), modified_at=self.modified_at)

    def over(self, older: "Preset") -> "Preset":
        """This preset made from `older`: what this one leaves unset comes from it, as Ollama's layers do."""
        return replace(self, base=older.base, system=self.system if self.system is not None else older.system,
                       template=self.template if self.template is not None else older.template,
                       parameters=older.parameters | self.parameters, messages=self.messages or older.messages)


def full_name(name: str) -> str:
    """Ollama names a model without a tag `name:latest`."""
    return name if ":" in name else f"{name}:latest"


def spellings(model: str) -> tuple[str, ...]:
    """Ollama treats `name` and `name:latest` as the same model, either way round: a client that copied a tagged
    name (LiteLLM users write `ollama_chat/foo:latest`) finds a model listed without its tag."""
    if model.endswith(":latest"):
        return model, model.removesuffix(":latest")
    return (model,) if ":" in model else (model, f"{model}:latest")


def by_spelling(table: Mapping[str, T], *names: str) -> T | None:
    """What `table` holds for the first of `names` it has under either spelling (an alias, a [models] table, a
    listed model)."""
    return next((table[n] for name in names if name for n in spellings(name) if n in table), None)


MAX_PRESETS = 1000
MAX_PRESET_BYTES = 1024 * 1024


class PresetStore:
    """The presets in memory, loaded once at start and saved on every change (file work on a thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._presets: dict[str, Preset] = {}
        self._loaded = False
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        async with self._lock:
            if not self._loaded:
                self._presets = await asyncio.to_thread(_read, self.path)
                self._loaded = True

    def get(self, name: str) -> Preset | None:
        return self._presets.get(full_name(name)) if name else None

    def all(self) -> list[Preset]:
        return list(self._presets.values())

    async def put(self, preset: Preset) -> None:
        """BadRequest past `MAX_PRESETS` or a preset over `MAX_PRESET_BYTES`: each is listed to every client and
        the whole file is written again at each change (1,500 made-up names took it from 3 to 44 ms a create)."""
        if len(orjson.dumps(preset.settings())) > MAX_PRESET_BYTES:
            raise BadRequest(f"a model's system prompt, template and messages are at most {MAX_PRESET_BYTES} bytes")
        async with self._lock:
            if preset.name not in self._presets and len(self._presets) >= MAX_PRESETS:
                raise BadRequest(f"there are {MAX_PRESETS} models created here already; delete one first")
            await self._save({**self._presets, preset.name: preset})

    async def delete(self, name: str) -> bool:
        name = full_name(name)
        async with self._lock:
            if name not in self._presets:
                return False
            await self._save({k: p for k, p in self._presets.items() if k != name})
            return True

    async def _save(self, presets: dict[str, Preset]) -> None:
        """The file first, then what is served: a write that failed (a full disk, a folder taken) left a preset served
        that the next start would not have, or the other way round, and answered "internal error"."""
        try:
            await asyncio.to_thread(_write, self.path, list(presets.values()))
        except OSError as e:
            raise PresetsNotSaved(f"the presets could not be saved to {self.path}: {e.strerror or e}") from e
        self._presets = presets


class PresetsNotSaved(VeloError):
    """The presets file could not be written: Velo's machine, not the client (a 500 that says what and where)."""

    status = 500
    kind = "server_error"


def _read(path: Path) -> dict[str, Preset]:
    try:
        raw = orjson.loads(path.read_bytes())
        return {p["name"]: Preset(**p) for p in raw["presets"]}
    except FileNotFoundError:
        return {}
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:  # never start over it: the next save would erase it
        raise ValueError(f"{path} is not a presets file Velo wrote ({e!r}): fix or move it") from e


def _write(path: Path, presets: list[Preset]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps({"presets": [asdict(p) for p in presets]}, option=orjson.OPT_INDENT_2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
