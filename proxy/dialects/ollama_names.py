"""Ollama's grammar of model names (types/model/name.go ParseName and IsValid, after internal/modelref's source
suffix): a name outside it is what Ollama's /api/chat and /api/generate refuse, 400 "invalid model name", before they
look for the model."""
from __future__ import annotations

import re

# Each part starts with a letter, a digit or "_"; a host may hold "." and ":" (a port), a namespace neither.
_PARTS = {"host": re.compile(r"\w[\w.:-]{0,349}", re.ASCII), "namespace": re.compile(r"\w[\w-]{0,79}", re.ASCII),
          "model": re.compile(r"\w[\w.-]{0,79}", re.ASCII), "tag": re.compile(r"\w[\w.-]{0,79}", re.ASCII)}
_SOURCES = ("cloud", "local")


def refusal(name: str) -> str | None:
    """Ollama's 400 for a name it would not look a model up by, or None: both source suffixes at once (internal/
    modelref ParseRef), or a name outside the grammar."""
    base, explicit = _source_cut(name.strip())
    if explicit and _source_cut(base)[1]:
        return f"use either :local or :cloud, not both: {go_quoted(name.strip())}"
    return None if valid(name) else "invalid model name"


def valid(name: str) -> bool:
    """`[[scheme://]host/][namespace/]model[:tag]`, each part as _PARTS says; a part a separator promises must be
    there, one left out is Ollama's default (registry.ollama.ai, library, latest)."""
    parts: dict[str, str] = {}
    rest = _source_cut(name.strip())[0]
    if rest.rfind(":") > rest.rfind("/"):
        rest, _, parts["tag"] = rest.rpartition(":")
    rest, slash, parts["model"] = rest.rpartition("/")
    if slash:
        rest, slash, parts["namespace"] = rest.rpartition("/")
        if slash and not rest:
            return False
        if host := rest.split("://", 1)[-1]:
            parts["host"] = host
    return all(_PARTS[kind].fullmatch(part) for kind, part in parts.items())


def display_shortest(name: str) -> str:
    """types/model/name.go DisplayShortest, with which ShowHandler names a model it cannot find: without Ollama's
    default host and namespace, always with a tag (`nope` is `nope:latest`)."""
    return _shortest(_source_cut(name.strip())[0])


def same_model(listed: str, asked: str) -> bool:
    """Whether Ollama finds the listed model by the name asked: each part in any case (server/routes.go
    getExistingName), its default host, namespace and tag written out or left out (`Registry.Ollama.AI/library/Qwen3`
    is `qwen3:latest`), spaces around it and a `:local` source suffix left out (internal/modelref ParseRef)."""
    head, colon, source = asked.strip().rpartition(":")
    asked = head if colon and source.strip().lower() == "local" else asked.strip()
    return _shortest(listed).casefold() == _shortest(asked).casefold()


def _shortest(rest: str) -> str:
    tag = "latest"
    if rest.rfind(":") > rest.rfind("/"):
        rest, _, tag = rest.rpartition(":")
    rest, slash, model = rest.rpartition("/")
    host, hosted, namespace = rest.rpartition("/")
    host = host.split("://", 1)[-1]
    if hosted and host.lower() != "registry.ollama.ai":
        return f"{host}/{namespace}/{model}:{tag}"
    return f"{namespace}/{model}:{tag}" if slash and namespace.lower() != "library" else f"{model}:{tag}"


def full_name(name: str) -> str:
    """Ollama names a model without a tag `name:latest`, and lists every model so (DisplayShortest)."""
    return name if tagged(name) else f"{name}:latest"


def tagged(name: str) -> bool:
    """A tag is after the last "/": `host:11434/model` has none."""
    return ":" in name.rpartition("/")[2]


def _source_cut(name: str) -> tuple[str, bool]:
    """internal/modelref parseSourceSuffix: a `:cloud` or `:local` suffix, or a tag's `-cloud`, says where the model
    runs and is no part of its name; (the name without it, whether there was one)."""
    at = name.rfind(":")
    suffix = name[at + 1:].strip() if at >= 0 else ""
    if suffix.lower() in _SOURCES:
        return name[:at], True
    if at >= 0 and "/" not in suffix and suffix.lower().endswith("-cloud"):
        return name[:at + 1] + suffix[:-len("-cloud")], True
    return name, False


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            '"': '\\"', "\\": "\\\\"}


def go_quoted(text: str) -> str:
    """Go's %q (strconv.Quote), with which Ollama quotes a name in its errors: printable letters as they are (Python's
    and Go's "printable" agree: no control, format or separator characters but the ASCII space), the rest escaped."""
    def one(ch: str) -> str:
        if ch in _ESCAPES:
            return _ESCAPES[ch]
        if ch.isprintable():
            return ch
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return '"' + "".join(map(one, text)) + '"'
