"""Model presets: Ollama's Modelfile feature (`/api/create` with `from` + `system` / `parameters` / `template`) for
every backend. A preset is a model name of its own that every dialect can use; the resolve stage reads it over its
base model (proxy/stages/resolve.py), and the router lists and routes it as its base (proxy/router.py).

Kept in one JSON file, mode 0600, rewritten whole (to a temporary file, then renamed) on each change: a handful of
presets, changed by hand, needs no database, and a crash mid-write leaves the old file whole.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

import orjson

from adapters.errors import BadRequest, VeloError
from adapters.exact_json import dumps, loads
from adapters.model_card import parameter_lines
from adapters.protocol import Message, ModelInfo, SamplingOptions
from adapters.schema import setting

from .dialects.ollama import now_iso, parse_message, parse_options
from .dialects.ollama_names import full_name, tagged

T = TypeVar("T")
log = logging.getLogger("velo.presets")


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
        """The base model as /api/show describes this preset, as Ollama shows a created model: its system prompt
        (else the base's, which an Ollama backend applies where the preset sends none), its template, its parameters
        over the base's, its time."""
        template = self.template if self.template is not None else base.template
        return replace(base, system=self.system or base.system, template=template,
                       parameters=parameters_over(base.parameters, self.parameters), modified_at=self.modified_at)

    def over(self, older: "Preset") -> "Preset":
        """This preset made from `older`: what this one leaves unset comes from it, as Ollama's layers do."""
        return replace(self, base=older.base, system=self.system if self.system is not None else older.system,
                       template=self.template if self.template is not None else older.template,
                       parameters=older.parameters | self.parameters, messages=self.messages or older.messages)


def spellings(model: str) -> tuple[str, ...]:
    """Ollama treats `name` and `name:latest` as the same model, either way round: a client that copied a tagged
    name (LiteLLM users write `ollama_chat/foo:latest`) finds a model listed without its tag."""
    if model.endswith(":latest"):
        return model, model.removesuffix(":latest")
    return (model,) if tagged(model) else (model, f"{model}:latest")


def by_spelling(table: Mapping[str, T], *names: str) -> T | None:
    """What `table` holds for the first of `names` it has under either spelling (an alias, a [models] table, a
    listed model). An empty table (most configurations' aliases and [models]) is not searched: every request looks
    in two, which was 0.7% of a short chat request's instructions in Velo (2,319 -> 2,302 thousand, callgrind)."""
    if not table:
        return None
    return next((table[n] for name in names if name for n in spellings(name) if n in table), None)


MAX_PRESETS = 1000
MAX_PRESET_BYTES = 1024 * 1024


class PresetStore:
    """The presets in memory, read at start and kept in step with the file; each change is the file's, made under an
    exclusive lock on it (file work on a thread). Two Velo processes share the default file: each wrote its own whole
    set over the other's, through one temporary file that the other's rename took away (lost presets, 500s)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._presets: dict[str, Preset] = {}  # by name
        self._folded: dict[str, str] = {}  # a name in any case -> the preset's name
        self._stamp: tuple[int, int, int] | None = None  # the file's (inode, mtime_ns, size) when last read
        self._loaded = False
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task | None = None

    async def open(self) -> None:
        async with self._lock:
            if not self._loaded:
                stamp = await asyncio.to_thread(_stamp, self.path)
                self._serve(await asyncio.to_thread(_read, self.path), stamp)
                self._loaded = True
                self._watch = asyncio.create_task(self._follow())

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)

    def get(self, name: str) -> Preset | None:
        if not name:
            return None
        full = full_name(name)
        return self._presets.get(full) or self._presets.get(self._folded.get(full.casefold(), ""))

    def all(self) -> list[Preset]:
        return list(self._presets.values())

    async def put(self, preset: Preset) -> None:
        """BadRequest past `MAX_PRESETS` or a preset over `MAX_PRESET_BYTES`: each is listed to every client and
        the whole file is written again at each change (1,500 made-up names took it from 3 to 44 ms a create). A
        name that differs from a preset's only in case is that preset, as Ollama matches names (its spelling stays)."""
        if len(dumps(preset.settings())) > MAX_PRESET_BYTES:
            raise BadRequest(f"a model's system prompt, template and messages are at most {MAX_PRESET_BYTES} bytes")

        def put(presets: dict[str, Preset]) -> bool:
            name = _named(presets, preset.name)
            if name is None and len(presets) >= MAX_PRESETS:
                raise BadRequest(f"there are {MAX_PRESETS} models created here already; delete one first")
            presets[name or preset.name] = replace(preset, name=name) if name else preset
            return True
        await self._change(put)

    async def delete(self, name: str) -> bool:
        """Every /api/delete asks here first, one for a backend's model included: with no presets file there is
        nothing to take, and no folder or lock file is made for it (each such delete left one in the user's home)."""
        return await self._change(lambda presets: presets.pop(_named(presets, name) or "", None) is not None,
                                  creates=False)

    async def _change(self, change: Callable[[dict[str, Preset]], bool], creates: bool = True) -> bool:
        """The file's presets, read under its lock, changed, and written back if `change` says so; then served.
        The file first: a write that failed (a full disk, a folder taken) left a preset served that the next start
        would not have, or the other way round, and answered "internal error"."""
        async with self._lock:
            try:
                presets, stamp, changed = await asyncio.to_thread(_change, self.path, change, creates)
            except (OSError, ValueError) as e:  # ValueError: a file that is no presets file (`_read`)
                why = e.strerror if isinstance(e, OSError) and e.strerror else e
                raise PresetsNotSaved(f"the presets could not be saved to {self.path}: {why}") from e
            self._serve(presets, stamp)
            return changed

    async def _follow(self) -> None:
        """Another process's changes, within `_FOLLOW_S`."""
        while True:
            await asyncio.sleep(_FOLLOW_S)
            try:
                async with self._lock:
                    await self._read_if_changed()
            except (OSError, ValueError) as e:  # a file being fixed by hand: what was read last stays served
                log.warning("presets file %s not read again: %s", self.path, e)

    async def _read_if_changed(self) -> None:
        """A file that cannot be read is said once for each change of it, not at each look."""
        stamp = await asyncio.to_thread(_stamp, self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            self._serve(await asyncio.to_thread(_read, self.path), stamp)

    def _serve(self, presets: dict[str, Preset], stamp: tuple[int, int, int] | None) -> None:
        self._presets, self._stamp = presets, stamp
        self._folded = {name.casefold(): name for name in presets}


_FOLLOW_S = 2.0


def _named(presets: dict[str, Preset], name: str) -> str | None:
    """The preset `name` is, in these: its own spelling, else one that differs only in case, as Ollama matches names
    (server/routes.go getExistingName). A file from before this kept both `Foo` and `foo`: both stay, each found by
    its own spelling."""
    full = full_name(name)
    if full in presets:
        return full
    return next((n for n in presets if n.casefold() == full.casefold()), None)


class PresetsNotSaved(VeloError):
    """The presets file could not be written: Velo's machine, not the client (a 500 that says what and where)."""

    status = 500
    kind = "server_error"


def _read(path: Path) -> dict[str, Preset]:
    try:
        raw = loads(path.read_bytes())
        return {p["name"]: Preset(**p) for p in raw["presets"]}
    except FileNotFoundError:
        return {}
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:  # never start over it: the next save would erase it
        raise ValueError(f"{path} is not a presets file Velo wrote ({e!r}): fix or move it") from e


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """Each write is a rename, so a new inode: a same-size write within one coarse mtime tick is seen too."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _change(path: Path, change: Callable[[dict[str, Preset]], bool],
            creates: bool) -> tuple[dict[str, Preset], Any, bool]:
    """(the presets after `change`, the file's stamp, whether it changed them), read and written under an exclusive
    lock on a file beside it, so that processes sharing the file take turns. A change that only takes (`creates`
    false) finds no presets where there is no file, and makes neither the folder nor the lock."""
    if not creates and _stamp(path) is None:
        return {}, None, False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = os.open(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:  # Windows has no flock: one process a file there
            fcntl.flock(lock, fcntl.LOCK_EX)
        presets = _read(path)
        changed = change(presets)
        if changed:
            _write(path, list(presets.values()))
        return presets, _stamp(path), changed
    finally:
        os.close(lock)  # and the lock with it


def _write(path: Path, presets: list[Preset]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(dumps({"presets": [asdict(p) for p in presets]}, option=orjson.OPT_INDENT_2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
