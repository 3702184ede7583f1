"""The OpenAI dialect: /v1 request bodies -> internal requests, internal chunks -> OpenAI JSON objects.

Tool-call `arguments` travel as JSON strings here (objects internally); streams are SSE `data:` events.
"""
from __future__ import annotations

import base64
import contextlib
import itertools
import struct
import time
from dataclasses import fields, replace
from typing import Any, Iterable

import orjson

from adapters import model_card, options
from adapters.errors import BadRequest, ContextOverflow, ModelLacks, ModelNotFound, UnusableFormat, VeloError
from adapters.exact_json import loads
from adapters.protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, Message,
                               ModelInfo, SamplingOptions, TokenLogprob, Tool, ToolCall, Usage, epoch)

from adapters.fields import body_object, get, get_model
from adapters.llamacpp import NATIVE_SAMPLERS
from . import documents, ollama, tool_choice
from .ollama import parse_tools, parse_top_logprobs


def parse_options(body: dict[str, Any]) -> SamplingOptions:
    opts = options.read("openai", body)
    if (completion := get(body, "max_completion_tokens", int)) is not None:  # 0 fell back to max_tokens
        opts.max_tokens = completion
    if opts.max_tokens is not None and opts.max_tokens < 1:
        name = "max_completion_tokens" if completion is not None else "max_tokens"
        raise BadRequest(f"{name} must be at least 1", param=name)
    top_logprobs = get(body, "top_logprobs", int)
    logprobs = body.get("logprobs")
    if isinstance(logprobs, int) and not isinstance(logprobs, bool):  # /v1/completions: logprobs is a count
        top_logprobs, logprobs = parse_top_logprobs(body, "logprobs", _MAX_COMPLETION_LOGPROBS), True
    elif logprobs is not None and not isinstance(logprobs, bool):
        raise BadRequest("logprobs must be a boolean", param="logprobs")
    elif top_logprobs is not None and parse_top_logprobs(body) and not logprobs:
        raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    opts.logprobs, opts.top_logprobs = bool(logprobs), top_logprobs
    return _with_ollama_options(opts, body)


_MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on completions' `logprobs`


# Ollama's and llama-server's knob names the OpenAI API has no field for (repeat_penalty, num_ctx, mirostat,
# dry_multiplier, ...)
_OLLAMA_ONLY = (frozenset(options.names("ollama") - options.names("openai")) | ollama.OTHER_OPTIONS
                | NATIVE_SAMPLERS)


def _with_ollama_options(opts: SamplingOptions, body: dict[str, Any]) -> SamplingOptions:
    """Ollama options the OpenAI API has no field for, in an `options` object (OpenAI SDKs: `extra_body`) or at the
    top level, where Open WebUI's OpenAI connections put a model's advanced parameters (utils/payload.py: they were
    dropped) and llama-server's users its own samplers' (`dry_multiplier`, `xtc_probability`, ...); the object's
    come first, and OpenAI's own fields win where both are set."""
    if "options" not in body and _OLLAMA_ONLY.isdisjoint(body):  # most requests (parse_chat is ~6 us)
        return opts
    raw = {k: v for k, v in body.items() if k in _OLLAMA_ONLY} | get(body, "options", dict, {})
    native = ollama.parse_options({"options": raw})
    for f in fields(SamplingOptions):
        if _unset(getattr(opts, f.name)):
            setattr(opts, f.name, getattr(native, f.name))
    return opts


def _unset(value: Any) -> bool:
    """A field the OpenAI body left unset. A zero is set: `0 in (None, False)` is true in Python, and it let the
    `options` object's value or the default replace `temperature: 0` and `seed: 0`."""
    return value is None or value is False or value == [] or value == {}


def parse_response_format(body: dict[str, Any]) -> Any:
    """`response_format`, else a vendor's JSON Schema field (`_vendor_schema`)."""
    fmt = get(body, "response_format", dict)
    vendor = _vendor_schema(body)
    if vendor is not None and fmt is not None:
        raise BadRequest("set response_format or a JSON Schema field of vLLM's or llama-server's, not both",
                         param="response_format")
    if fmt is None or fmt.get("type") in (None, "text"):
        return vendor
    if fmt["type"] == "json_object":
        return "json"
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(spec, dict) and "schema" not in spec and ("properties" in spec or "type" in spec):
            schema = spec  # a bare schema in its place, as Dify's OpenAI-compatible plugin sends one (Ollama's /v1
            # takes it, unenforced; OpenAI refuses it)
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object", param="response_format")
        return schema
    raise BadRequest(f"unknown response_format type {fmt['type']!r}", param="response_format")


# JSON Schema output constraints as vLLM (`guided_json` before 0.12, `structured_outputs.json`), SGLang and
# llama-server (`json_schema`) take them at the top level of an OpenAI request (SDKs: `extra_body`).
_VENDOR_SCHEMAS = ("json_schema", "guided_json")
# Their other constraints (a choice, a regex, a grammar): no format every backend enforces, so a 400, not an answer
# that silently ignores them.
_VENDOR_GRAMMARS = ("guided_choice", "guided_regex", "guided_grammar", "grammar", "regex", "ebnf")
_VENDOR_FIELDS = frozenset(_VENDOR_SCHEMAS + _VENDOR_GRAMMARS + ("structured_outputs",))


def _vendor_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """A JSON Schema given in a vendor's field, which every backend then enforces as a `response_format` would;
    these were dropped, so the answer came back unconstrained."""
    if _VENDOR_FIELDS.isdisjoint(body):  # most requests: one set test, not eight lookups
        return None
    given = {k: body[k] for k in _VENDOR_SCHEMAS if body.get(k) is not None}
    structured = get(body, "structured_outputs", dict, {})
    if structured.get("json") is not None:
        given["structured_outputs.json"] = structured["json"]
    others = [k for k in _VENDOR_GRAMMARS if body.get(k) is not None]
    others += [f"structured_outputs.{k}" for k in structured if k != "json" and structured[k] is not None]
    if others:
        raise BadRequest(f"{others[0]} is not supported: Velo constrains output by JSON Schema only "
                         "(response_format json_schema)", param=others[0])
    if len(given) > 1:
        raise BadRequest(f"set one JSON Schema, not {' and '.join(given)}", param=next(iter(given)))
    for key, schema in given.items():
        if isinstance(schema, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                schema = loads(schema)
        if not isinstance(schema, dict):
            raise BadRequest(f"{key} must be a JSON Schema object", param=key)
        return schema
    return None


def _content_text(content: Any) -> tuple[str, list[str]]:
    """String content, or an array of parts: text parts joined, base64 data-URL images collected, a file's text
    (documents.py) apart from the text around it."""
    if content is None or isinstance(content, str):
        return content or "", []
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or an array of parts", param="messages")
    texts, images = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(_part_text(part, "text"))
        elif kind == "image_url":
            image = part.get("image_url")
            if not isinstance(image, dict):
                raise BadRequest("image_url must be an object {url: ...}", param="messages")
            images.append(data_url_image(image.get("url"), "image_url.url", "messages"))
        elif kind == "refusal":  # an assistant's refusal, echoed back in the history: what it said
            texts.append(_part_text(part, "refusal"))
        elif kind == "file":  # a PDF as the openai package sends it: its text
            before = texts[-1] if texts else ""
            texts.append(documents.apart(before) + documents.openai_file(part.get("file"), "file", "messages"))
        else:
            raise BadRequest(f"unsupported content part type {kind!r}", param="messages")
    return "".join(texts), images


def _part_text(part: dict[str, Any], key: str) -> str:
    """A text (or refusal) part's string, else OpenAI's 400: `str()` put a null into the prompt as the word "None"
    and a number as its digits."""
    text = part.get(key)
    if not isinstance(text, str):
        got = "null" if text is None else type(text).__name__
        raise BadRequest(f"a {part['type']} part's {key} must be a string, got {got}", param="messages")
    return text


def data_url_image(url: Any, where: str, param: str) -> str:
    """The base64 payload of an image's data URL. A web URL is a 400, as Ollama answers it: fetching it would let any
    client make Velo reach any address it names, and passed on as it was, it reached the backend as broken base64."""
    if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
        raise BadRequest(f"{where}: only base64 data URLs (data:image/png;base64,...) are supported", param=param)
    return url.split(",", 1)[1]


def _tool_call(raw: Any) -> ToolCall:
    """A call sent back in the history, with its arguments string as `text`: the backend gets the call as the model
    wrote it (re-spelled, it missed llama-server's and vLLM's prefix caches from that turn on)."""
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest("tool_calls entries must be {id, type, function: {name, arguments}}", param="messages")
    args = fn.get("arguments") or "{}"
    try:
        parsed = loads(args) if isinstance(args, str) else args
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"tool call arguments are not valid JSON: {e}", param="messages") from e
    if not isinstance(parsed, dict):
        raise BadRequest("tool call arguments must encode a JSON object", param="messages")
    text = args if isinstance(args, str) else ""
    return ToolCall(name=fn["name"], arguments=parsed, id=str(raw.get("id", "")), text=text)


# OpenAI's roles as chat templates know them: `developer` (o1 and later) is the system prompt, as the Responses API
# has it (a template that knows no such role drops it or makes it a turn); `function` is the legacy tool answer.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}


def parse_message(raw: Any) -> Message:
    if not isinstance(raw, dict):
        raise BadRequest("messages must be objects", param="messages")
    role = get(raw, "role", str, required=True)
    if role not in _ROLES:
        raise BadRequest(f"Invalid value: {role!r}. Supported values are: 'system', 'assistant', 'user', 'function', "
                         "'tool', and 'developer'.", param="messages")
    text, images = _content_text(raw.get("content"))
    legacy = [{"function": get(raw, "function_call", dict)}] if raw.get("function_call") is not None else []
    return Message(role=_ROLES[role], content=text, images=images, thinking=_thinking_of(raw),
                   tool_calls=[_tool_call(c) for c in get(raw, "tool_calls", list, legacy)],
                   tool_call_id=get(raw, "tool_call_id", str, ""),
                   tool_name=get(raw, "name", str, "") if _ROLES[role] == "tool" else "")  # else a speaker's name


def _thinking_of(raw: dict[str, Any]) -> str:
    """An assistant turn's thinking, sent back under either name (Ollama's /v1 reads `reasoning`)."""
    text = raw.get("reasoning_content") or raw.get("reasoning")
    return text if isinstance(text, str) else ""  # OpenRouter-style objects are not text


def parse_tool_choice(raw: Any, tools: list[Tool]) -> tuple[list[Tool], Any]:
    """The tools offered and the choice in its internal form: None (auto: what every backend does unasked), "none",
    "required", or {"type": "function", "function": {"name"}}. An `allowed_tools` choice (OpenAI's, which the SDK
    types) offers only the tools it names, by its mode auto or required: it was a 400."""
    if raw in (None, "auto"):
        return tools, None
    if raw in ("none", "required"):
        return tools, raw
    if isinstance(raw, dict) and raw.get("type") == "allowed_tools":
        return _allowed_tools(get(raw, "allowed_tools", dict, required=True), tools)
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest('tool_choice must be "auto", "none", "required", {"type": "function", "function": '
                         '{"name": ...}} or {"type": "allowed_tools", ...}', param="tool_choice")
    return tools, {"type": "function", "function": {"name": fn["name"]}}


def _allowed_tools(allowed: dict[str, Any], tools: list[Tool]) -> tuple[list[Tool], Any]:
    """`{mode, tools: [{type: "function", function: {name}}]}`: the tools named, each one of those given."""
    mode = get(allowed, "mode", str, required=True)
    names = set()
    for entry in get(allowed, "tools", list, required=True):
        fn = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest('tool_choice.allowed_tools.tools entries must be {"type": "function", "function": '
                             '{"name": ...}}', param="tool_choice")
        names.add(fn["name"])
    if unknown := sorted(names - {t.name for t in tools}):
        raise BadRequest(f"tool_choice: the tool {unknown[0]!r} is not among the tools given", param="tool_choice")
    return tool_choice.allowed(tools, names, mode)


# Effort levels as the internal think switch, for OpenAI's `reasoning_effort`, the Responses API's
# `reasoning.effort` and Anthropic's `output_config.effort`: "none" / "minimal" off; above "high" (OpenAI's "xhigh"
# and "max", Anthropic's "max") is "high", the most a local thinking model takes.
EFFORTS: dict[str, bool | str] = {"none": False, "minimal": False, "low": "low", "medium": "medium", "high": "high",
                                  "xhigh": "high", "max": "high"}


def parse_think(body: dict[str, Any], kwargs: dict[str, Any]) -> bool | str | None:
    """The think switch: `reasoning_effort` (EFFORTS), else `enable_thinking: false` in `kwargs` (the request's
    `chat_template_kwargs`), the way vLLM's, SGLang's and llama-server's users turn a Qwen3 model's thinking off
    (OpenAI SDKs: `extra_body`), on every backend. `true` stays a template variable only: a template without the
    switch ignores it on those servers, where a think request to a model that cannot think is a 400 here."""
    effort = get(body, "reasoning_effort", str)
    if effort is None:
        return False if get(kwargs, "enable_thinking", bool) is False else None
    return effort_level(effort, "reasoning_effort", "reasoning_effort")


def effort_level(effort: Any, subject: str, param: str) -> bool | str | None:
    """An effort level as the think switch (None where none is given), for every dialect that takes one; another value
    is a 400 whose message starts with `subject`, as each dialect words it (an unknown level reached the backend as
    sent, a list was a 500: unhashable)."""
    if effort is None:
        return None
    if not isinstance(effort, str) or effort not in EFFORTS:
        raise BadRequest(f"{subject} must be one of {', '.join(EFFORTS)}", param=param)
    return EFFORTS[effort]


# What a chat template is rendered with by the server itself: not the client's to set.
_TEMPLATE_OWN = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs`: variables for the model's chat template, which vLLM, SGLang and llama-server take
    (`enable_thinking`, DeepSeek's `thinking`, ...), passed on to them and to the engine's template."""
    kwargs = get(body, "chat_template_kwargs", dict, {})
    if kwargs and (own := sorted(_TEMPLATE_OWN & kwargs.keys())):
        raise BadRequest(f"chat_template_kwargs may not set {', '.join(own)}", param="chat_template_kwargs")
    return kwargs


def _text_only(body: dict[str, Any]) -> None:
    """A 400 for a spoken answer (`modalities: ["audio"]`, `audio`): no backend Velo serves writes audio, and an
    answer without the sound asked for is not the answer asked for."""
    modalities = get(body, "modalities", list, [])
    if "audio" in modalities or body.get("audio") is not None:
        raise BadRequest("audio output is not supported: the models Velo serves write text", param="modalities")


def hosted_tools(body: dict[str, Any]) -> list[str]:
    """The vendor-hosted tools a chat request asks for, named for X-Velo-Tools-Ignored: `web_search_options` (OpenAI's
    search models search the web before answering) needs OpenAI's servers, as the Responses API's `web_search` tool
    does; it was dropped without a word, and the answer passed for a searched one."""
    return ["web_search"] if get(body, "web_search_options", dict) is not None else []


def _n(body: dict[str, Any]) -> int:
    n = get(body, "n", int, 1)
    if not 1 <= n <= 16:
        raise BadRequest("n must be between 1 and 16", param="n")
    return n


def _stream(body: dict[str, Any]) -> bool:
    """`stream`, and OpenAI's 400s for `stream_options` on an answer that is not streamed and for one that is no
    object of flags (`include_usage: "false"` asked for the usage chunk)."""
    stream = get(body, "stream", bool, False)
    opts = get(body, "stream_options", dict)
    if opts is not None and not stream:
        raise BadRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                         param="stream_options")
    for flag in ("include_usage", "include_obfuscation"):
        if opts and opts.get(flag) is not None and not isinstance(opts[flag], bool):
            raise BadRequest(f"stream_options.{flag} must be a boolean, got {type(opts[flag]).__name__}",
                             param=f"stream_options.{flag}")
    return stream


def parse_chat(body: Any) -> ChatRequest:
    body = as_tools(body_object(body))
    messages = get(body, "messages", list, required=True)
    if not messages:
        raise BadRequest("messages must not be empty", param="messages")
    _text_only(body)
    tools, choice = parse_tool_choice(body.get("tool_choice"), parse_tools(body))
    kwargs = template_kwargs(body)
    return ChatRequest(model=get_model(body), messages=_messages(messages),
                       options=parse_options(body), tools=tools, tool_choice=tool_choice.checked(choice, tools),
                       format=parse_response_format(body),
                       stream=_stream(body), n=_n(body), think=parse_think(body, kwargs),
                       parallel_tool_calls=get(body, "parallel_tool_calls", bool, True), template_kwargs=kwargs,
                       truncate=get(body, "truncate", bool))  # Ollama's field: `true` trims as Ollama's /v1 does


def _messages(raw: list[Any]) -> list[Message]:
    """Each message parsed; a fault in one of its own fields is named by its path, as OpenAI names it
    (`messages[1].role`): it named `role` or `tool_call_id`, as if the request had such a field."""
    out = []
    for i, m in enumerate(raw):
        try:
            out.append(parse_message(m))
        except BadRequest as e:
            if e.param in (None, "messages"):
                raise
            raise BadRequest(f"messages[{i}].{e.message}", param=f"messages[{i}].{e.param}") from e
    return out


def legacy_functions(body: dict[str, Any]) -> bool:
    """Whether the request uses the form before tools (`functions`, `function_call`), answered in that form (a
    `functions: null`, which clients send for "none", is not: it was a 500). A `tools` that is null or empty is none,
    as a client that writes every field sends it: it dropped the functions, and the model answered without them."""
    return body.get("functions") is not None and not body.get("tools")


def as_tools(body: dict[str, Any]) -> dict[str, Any]:
    """The legacy form as tools: the functions as function tools, `function_call` as `tool_choice`, one call a
    turn (the legacy answer holds one)."""
    if not legacy_functions(body):
        return body
    functions = get(body, "functions", list)
    if not all(isinstance(f, dict) for f in functions):
        raise BadRequest("functions entries must be objects {name, description, parameters}", param="functions")
    choice = body.get("function_call")
    if isinstance(choice, dict):
        name = get(choice, "name", str, required=True)
        if name not in {f.get("name") for f in functions}:  # else tool_choice's 400, naming a field not sent
            raise BadRequest(f"Invalid value for 'function_call': no function named {name!r} was specified in the "
                             "'functions' parameter.", param="function_call")
        choice = {"type": "function", "function": {"name": name}}
    elif choice not in (None, "none", "auto"):
        raise BadRequest('function_call must be "none", "auto" or {"name": ...}', param="function_call")
    return {**body, "tools": [{"type": "function", "function": f} for f in functions], "tool_choice": choice,
            "parallel_tool_calls": False}


# Choices one request may ask for (prompts × n, or prompts × best_of): each is a generation that holds a backend slot.
MAX_CHOICES = 64
MAX_BEST_OF = 20  # OpenAI's bound on `best_of`


def parse_completions(body: Any) -> tuple[list[CompletionRequest], bool, int | None]:
    """One request per prompt (`prompt` is a string, one prompt's token ids, or an array of either: a batch,
    answered with `n` choices for each prompt, in prompt order), `echo`, which Velo does itself (backends differ
    on it), and `best_of`: candidates per prompt to rank (proxy/best_of.py), None where there are none to rank."""
    body = body_object(body)
    prompts, n, stream = _prompts(body.get("prompt", "")), _n(body), _stream(body)
    best_of = _best_of(body, n, stream)
    each, param = ("n", "prompt") if best_of is None else ("best_of", "best_of")
    if (choices := len(prompts) * (best_of or n)) > MAX_CHOICES:
        raise BadRequest(f"at most {MAX_CHOICES} choices a request (prompts × {each}), got {choices}", param=param)
    suffix = get(body, "suffix", str) or None  # "" is no insert, as Ollama reads it (Tabby at the end of a file)
    first = CompletionRequest(model=get_model(body), **_prompt(prompts[0]), suffix=suffix, raw=True,
                              options=parse_options(body), format=parse_response_format(body), stream=stream,
                              n=n, truncate=get(body, "truncate", bool))  # as on /v1/chat/completions
    echo = get(body, "echo", bool, False)
    if echo and first.options.logprobs:  # OpenAI scores the prompt's tokens too (lm-eval's loglikelihood reads them)
        raise BadRequest("echo with logprobs: Velo's backends cannot score the prompt's tokens, only the answer's",
                         param="echo")
    if first.prompt_ids is not None:
        _ids_alone(suffix, echo)
    return [first] + [replace(first, **_prompt(prompt)) for prompt in prompts[1:]], echo, best_of


def _best_of(body: dict[str, Any], n: int, stream: bool) -> int | None:
    """`best_of` candidates per prompt, of which the `n` most likely are answered; None where there is nothing to
    rank (unset, or 1). It was ignored: `best_of: 5` answered one sample, unranked, and `best_of` below `n` or with
    `stream` was no 400. Bounds and words as vLLM's SamplingParams and OpenAI's reference give them."""
    best_of = get(body, "best_of", int)
    if best_of is None:
        return None
    if not 1 <= best_of <= MAX_BEST_OF:
        raise BadRequest(f"best_of must be between 1 and {MAX_BEST_OF}, got {best_of}", param="best_of")
    if best_of < n:
        raise BadRequest(f"best_of must be greater than or equal to n, got n={n} and best_of={best_of}.",
                         param="best_of")
    if best_of > 1 and stream:  # OpenAI: "Results cannot be streamed": the best is known once all have ended
        raise BadRequest("Cannot stream results with best_of > 1: the best candidate is known only when all have "
                         "ended. Set stream to false, or leave best_of out.", param="best_of")
    return best_of if best_of > 1 else None


def _prompts(prompt: Any) -> list[str] | list[list[int]]:
    """OpenAI's four shapes of `prompt`, as of embeddings' `input`; an empty string is a prompt (a new document),
    an empty array of ids none."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt == []:
        raise BadRequest("prompt must not be empty", param="prompt")
    prompts = _texts_or_ids(prompt, "prompt")
    if isinstance(prompts[0], list) and not all(prompts):
        raise BadRequest("prompt must not hold an empty array of token ids", param="prompt")
    return prompts


def _prompt(prompt: str | list[int]) -> dict[str, Any]:
    """A CompletionRequest's fields for one prompt: its text, or its token ids."""
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt": "", "prompt_ids": prompt}


def _ids_alone(suffix: str | None, echo: bool) -> None:
    """What a prompt of token ids cannot go with: a suffix (the middle's prompt is built from the two texts) and
    `echo` (Velo echoes the prompt's text, and only the backend could turn the ids into it)."""
    if suffix is not None:
        raise BadRequest("suffix needs the prompt as text, not token ids", param="suffix")
    if echo:
        raise BadRequest("echo needs the prompt as text, not token ids: Velo echoes the text it was sent",
                         param="echo")


def parse_embeddings(body: Any) -> tuple[EmbedRequest, str]:
    body = body_object(body)
    inputs = _embed_inputs(body.get("input"))
    if len(inputs) > _MAX_EMBED_INPUTS or not all(inputs):  # OpenAI's bounds: Ollama's dialect embeds "" as nothing
        raise BadRequest(f"input must be 1 to {_MAX_EMBED_INPUTS} inputs, none of them empty", param="input")
    encoding = get(body, "encoding_format", str, "float")
    if encoding not in ("float", "base64"):
        raise BadRequest("encoding_format must be 'float' or 'base64'", param="encoding_format")
    dimensions = get(body, "dimensions", int)
    if dimensions is not None and dimensions < 1:
        raise BadRequest(f"dimensions must be at least 1, got {dimensions}", param="dimensions")
    return EmbedRequest(model=get_model(body), inputs=inputs, dimensions=dimensions), encoding


_MAX_EMBED_INPUTS = 2048  # OpenAI's bound on one request's inputs
# Token ids fit llama.cpp's llama_token (int32): llama-server read 2**32 + 5 as token 5 and embedded that
_MAX_TOKEN_ID = 2**31 - 1


def _embed_inputs(value: Any) -> list[str] | list[list[int]]:
    """OpenAI's four shapes of `input` (the openai client sends ids itself, as tiktoken chunks a long text)."""
    if value is None or value == []:
        raise BadRequest("input is required", param="input")
    return [value] if isinstance(value, str) else _texts_or_ids(value, "input")


def _texts_or_ids(value: Any, param: str) -> list[str] | list[list[int]]:
    """An array of strings, one item's token ids, or items' token ids (`value` is no string and not empty). A
    float, a bool or a mixed array is refused here: llama-server answered those with a 500."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    items = [value] if isinstance(value, list) and not isinstance(value[0], list) else value
    if not isinstance(items, list) or not all(isinstance(ids, list) and _token_ids(ids) for ids in items):
        raise BadRequest(f"{param} must be a string, an array of strings, an array of token ids (integers from 0 to "
                         f"{_MAX_TOKEN_ID}) or an array of such arrays", param=param)
    return items


def _token_ids(ids: list[Any]) -> bool:
    """Integers (not bools, not floats) within 0 to _MAX_TOKEN_ID; [] passes, for the caller's "empty" check. Types
    first, by set: a 32 MiB body holds millions of ids."""
    return not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) <= _MAX_TOKEN_ID)


def stream_options_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def _usage(usage: Usage | None) -> dict[str, Any]:
    """OpenAI's counts with `prompt_tokens_details.cached_tokens` always there (0 on a miss), as OpenAI sends it:
    agents that read it unguarded (OpenHands did) failed on an answer without it."""
    u = usage or Usage()
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _tool_calls(calls: list[ToolCall], stream: bool, first_index: int = 0) -> list[dict[str, Any]]:
    """`first_index`: calls already sent earlier in the stream, since clients merge deltas by index."""
    out = []
    for i, c in enumerate(calls, first_index):
        item = {"id": c.id or f"call_{i}", "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json()}}
        out.append({"index": i, **item} if stream else item)
    return out


def _logprobs(chunk: Chunk) -> dict[str, Any] | None:
    return {"content": token_logprobs(chunk.logprobs)} if chunk.logprobs else None


def token_logprobs(logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI's per-token log-probabilities, as chat completions and the Responses API both write them."""
    return [{"token": lp.token, "logprob": lp.logprob, "bytes": lp.utf8,
             "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.utf8} for t in lp.top]}
            for lp in logprobs]


def _finish(chunk: Chunk, functions: bool = False) -> str | None:
    if chunk.finish_reason is None:
        return None
    called = chunk.tool_calls or chunk.finish_reason == "tool_calls"
    return ("function_call" if functions else "tool_calls") if called else chunk.finish_reason


def _function_call(calls: list[ToolCall]) -> dict[str, str]:
    """The legacy form's one call (`parallel_tool_calls` was off, so there is one)."""
    return {"name": calls[0].name, "arguments": calls[0].arguments_json()}


class ChatIds:
    """Stable id/created for every chunk of one response, as OpenAI sends them."""

    def __init__(self, prefix: str = "chatcmpl"):
        self.id = f"{prefix}-{time.time_ns():x}"
        self.created = int(time.time())


def _reasoning(thinking: str) -> dict[str, str]:
    """The thinking text under both names clients read: `reasoning_content` (DeepSeek's, llama-server's; LiteLLM
    and Open WebUI read it) and `reasoning` (Ollama's /v1 and vLLM's since 0.16, which dropped the other name)."""
    return {"reasoning_content": thinking, "reasoning": thinking}


def chat_completion(ids: ChatIds, model: str, choices: list[Chunk], functions: bool = False) -> dict[str, Any]:
    """`functions`: the request used the legacy form, so calls go back as `function_call`."""
    out = []
    for i, c in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None,
                                   "refusal": None, "annotations": []}  # as OpenAI's every message has them
        if c.thinking:
            message |= _reasoning(c.thinking)
        if c.tool_calls and functions:
            message["function_call"] = _function_call(c.tool_calls)
        elif c.tool_calls:
            message["tool_calls"] = _tool_calls(c.tool_calls, stream=False)
        out.append({"index": i, "message": message, "logprobs": _logprobs(c), "finish_reason": _finish(c, functions)})
    return {"id": ids.id, "object": "chat.completion", "created": ids.created, "model": model, "choices": out,
            "usage": total_usage(enumerate(c.usage for c in choices), len(choices)), "system_fingerprint": "velo"}


def total_usage(usages: Iterable[tuple[int, Usage | None]], n: int) -> dict[str, Any]:
    """One response's usage from its choices' (index, usage): completion tokens add up, and each prompt's tokens
    count once, however many of its `n` choices there are (choice i answers prompt i // n), with the fewest of them
    cached (the choice that evaluated the prompt)."""
    prompts: dict[int, Usage] = {}
    completion = 0
    for i, u in usages:
        if u is not None:
            seen = prompts.setdefault(i // n, u)
            prompts[i // n] = Usage(max(seen.prompt_tokens, u.prompt_tokens),
                                    cached_tokens=min(seen.cached_tokens, u.cached_tokens))
            completion += u.completion_tokens
    return _usage(Usage(prompt_tokens=sum(u.prompt_tokens for u in prompts.values()), completion_tokens=completion,
                        cached_tokens=sum(u.cached_tokens for u in prompts.values())))


def chat_chunk(ids: ChatIds, model: str, index: int, chunk: Chunk | None, first: bool = False,
               calls_sent: int = 0, functions: bool = False) -> dict[str, Any]:
    """One SSE event; `chunk=None` with `first` gives the opening role delta. `calls_sent`: tool calls this
    choice already streamed; `functions`: the legacy form's `function_call` delta instead."""
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
    if chunk is not None:
        if chunk.text:
            delta["content"] = chunk.text
        if chunk.thinking:
            delta |= _reasoning(chunk.thinking)
        if chunk.tool_calls and functions:
            delta["function_call"] = _function_call(chunk.tool_calls)
        elif chunk.tool_calls:
            delta["tool_calls"] = _tool_calls(chunk.tool_calls, stream=True, first_index=calls_sent)
        if chunk.logprobs:  # most pieces have neither: two calls a piece were 1.5% of a stream
            choice["logprobs"] = _logprobs(chunk)
        if chunk.finish_reason is not None:
            choice["finish_reason"] = _finish(chunk, functions)
    return {"id": ids.id, "object": "chat.completion.chunk", "created": ids.created, "model": model,
            "system_fingerprint": "velo", "choices": [choice]}


def usage_chunk(ids: ChatIds, model: str, obj: str, usages: list[tuple[int, Usage]], n: int) -> dict[str, Any]:
    return {"id": ids.id, "object": obj, "created": ids.created, "model": model, "system_fingerprint": "velo",
            "choices": [], "usage": total_usage(usages, n)}


def completion_logprobs(chunk: Chunk, offset: int = 0) -> dict[str, Any] | None:
    """/v1/completions' legacy shape: parallel lists, `text_offset` counting characters from `offset` (where this
    chunk's text starts in the choice's text)."""
    if not chunk.logprobs:
        return None
    tokens = [lp.token for lp in chunk.logprobs]
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in chunk.logprobs],
            "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in chunk.logprobs],
            "text_offset": list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=offset))}


def completion_object(ids: ChatIds, model: str, choices: list[Chunk], offsets: list[int] | None = None,
                      usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """`usage`: the whole answer's (`total_usage`, which counts best_of's candidates that are not among the choices
    too), none in a streamed chunk."""
    offsets = offsets or [0] * len(choices)
    out = [{"index": i, "text": c.text, "logprobs": completion_logprobs(c, offsets[i]), "finish_reason": _finish(c)}
           for i, c in enumerate(choices)]
    obj = {"id": ids.id, "object": "text_completion", "created": ids.created, "model": model, "choices": out}
    return obj if usage is None else obj | {"usage": usage}


def completion_chunk(ids: ChatIds, model: str, index: int, chunk: Chunk, offset: int = 0) -> dict[str, Any]:
    obj = completion_object(ids, model, [chunk], offsets=[offset])
    obj["choices"][0]["index"] = index
    return obj


def embeddings_object(model: str, result: EmbedResult, encoding: str) -> dict[str, Any]:
    def encode(vec: list[float]) -> Any:
        return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if encoding == "base64" else vec

    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(result.embeddings)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}


def model_object(info: ModelInfo) -> dict[str, Any]:
    """OpenAI's model object, with llama-server's `meta` where Velo knows the window: crush sizes its context (and
    when it summarises) by `meta.n_ctx`, else `n_ctx_train`."""
    obj = {"id": info.name, "object": "model", "created": epoch(info.modified_at), "owned_by": info.backend or "velo"}
    trained = model_card.file_context(info.model_info, info.family)
    meta = {"n_ctx": info.context_length, "n_ctx_train": trained}
    return obj | ({"meta": {k: v for k, v in meta.items() if v}} if info.context_length else {})


# Where each OpenAI dialect's request holds the output schema (UnusableFormat names Ollama's `format`)
_FORMAT_PARAM = {"openai": "response_format", "responses": "text"}
# The field that asked a model for what it lacks (ModelLacks names `model`, as Ollama words it), where OpenAI's API
# names it: "Unsupported parameter: 'reasoning_effort' is not supported with this model."
_LACKS_PARAM = {("openai", "thinking"): "reasoning_effort", ("responses", "thinking"): "reasoning",
                ("openai", "insert"): "suffix"}


def error_object(err: VeloError, dialect: str = "openai") -> dict[str, Any]:
    """OpenAI's error object: `code` is a string or null, never a number (SDKs and agents test it by value). A
    context overflow is worded as OpenAI words it, which is what agents look for before they compact; `param`
    names the request's own field."""
    message, kind, param = err.message, err.kind, err.param
    if isinstance(err, UnusableFormat):
        param = _FORMAT_PARAM.get(dialect, param)
    elif isinstance(err, ModelLacks):
        param = _LACKS_PARAM.get((dialect, err.feature), param)
    if isinstance(err, ContextOverflow) and dialect == "responses":
        message, param = _RESPONSES_OVERFLOW, "input"
    elif isinstance(err, ContextOverflow):
        message = _CHAT_OVERFLOW.format(err.limit, err.tokens, "prompt" if err.param == "prompt" else "messages")
    if err.status in (401, 404):  # OpenAI words a bad key and a missing model or response as an invalid request
        kind = "invalid_request_error"  # ("authentication_error" and "not_found_error" are Anthropic's types)
    if isinstance(err, ModelNotFound):  # naming no parameter
        param = None
    return {"error": {"message": message, "type": kind, "param": param, "code": err.code}}


_CHAT_OVERFLOW = ("This model's maximum context length is {0} tokens. However, your {2} resulted in {1} tokens. "
                  "Please reduce the length of the {2}.")
_RESPONSES_OVERFLOW = "Your input exceeds the context window of this model. Please adjust your input and try again."
