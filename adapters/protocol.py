"""Velo's one internal request/response model.

Every dialect (Ollama native, OpenAI) parses into these types and writes out of them; every backend adapter
consumes and produces them. Nothing here knows about HTTP.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Union

from .exact_json import dumps

# "content_filter": the server withheld the rest (OpenAI's reason; Anthropic's `refusal`); never cached.
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error", "cancelled"]
# Ollama `format` / OpenAI `response_format`: None (free text), "json" (any JSON object) or a JSON Schema.
OutputFormat = Union[None, Literal["json"], dict]
KEPT_LOADED_S = 2**63 / 1e9  # what Ollama adds to now for a model kept loaded forever (keep_alive < 0)


def rfc3339(epoch_s: float) -> str:
    """The time format of Ollama's `modified_at` and `expires_at`, in UTC."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def epoch(rfc3339_time: str) -> int:
    """Seconds since 1970 of an RFC 3339 time (Ollama writes nanoseconds and an offset); 0 when unreadable."""
    try:
        return int(datetime.fromisoformat(rfc3339_time).timestamp())
    except ValueError:
        return 0


@dataclass
class ToolCall:
    """A complete tool call: `arguments` is always a parsed JSON object, never a string.

    `text` is the arguments as a wire that carries a string had them (OpenAI's: a backend's answer, or a call a
    client sends back in its history), kept only while `arguments` is that text's value unchanged: a dialect or
    adapter that carries a string sends it byte for byte (`\\u00e9`, `1e5`, key order, spacing), where writing
    `arguments` again gave `é`, `100000.0` and orjson's compact form. Whatever makes other arguments (repair,
    coercion, a context edit) makes a ToolCall without it."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    text: str = ""

    def arguments_json(self) -> str:
        return self.text or dumps(self.arguments).decode()


@dataclass
class Tool:
    """A function the client offers the model; `parameters` is its JSON Schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str = ""
    images: list[str] = field(default_factory=list)  # base64 strings
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""  # OpenAI: which call a "tool" message answers
    tool_name: str = ""  # Ollama: which tool a "tool" message comes from
    thinking: str = ""

    @property
    def empty_assistant(self) -> bool:
        """An assistant turn with nothing in it: last in a chat, it prefills nothing, and Anthropic's API answers as
        without it."""
        return self.role == "assistant" and not (self.content or self.thinking or self.tool_calls or self.images)


@dataclass
class SamplingOptions:
    """Everything that changes what the model writes. None means "the backend's default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    num_ctx: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit (-100 bans it)
    ignore_eos: bool | None = None  # write on past the end of text, to max_tokens (benchmarks' fixed-length answers)
    logprobs: bool = False
    top_logprobs: int | None = None
    # Backend-specific knobs passed through untouched (Ollama `options` keys Velo has no field for).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def deterministic(self) -> bool:
        """Greedy or seeded: the same request gives the same answer, so it may be cached or coalesced."""
        return self.temperature == 0 or self.seed is not None


@dataclass
class ChatRequest:
    model: str
    messages: list[Message]
    options: SamplingOptions = field(default_factory=SamplingOptions)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: Any = None  # None (auto) | "none" | "required" | {"type": "function", "function": {"name"}}
    format: OutputFormat = None
    stream: bool = True
    keep_alive: Any = None
    think: bool | str | None = None
    # False: a <think> block the model writes stays in the answer's text, as Ollama leaves it for `think: false`
    # (server/routes.go ChatHandler and GenerateHandler make their thinking parser only when think is on).
    splits_thinking: bool = True
    n: int = 1
    parallel_tool_calls: bool = True  # False: at most one call comes back (proxy/stages/one_call.py)
    # A prompt past the context window: True drops the oldest turns, False is a 400, None does what the dialect
    # does (proxy/stages/fit.py). Ollama's `shift`: False stops a generation at the window's end, as every other
    # backend does; only an Ollama backend shifts.
    truncate: bool | None = None
    shift: bool | None = None
    tools_in_prompt: bool = False  # the model's template ignores tools: adapters write them in (tool_prompt.py)
    # Whose requests may reuse this prompt's prefix in a backend's cache (the caller's API key scope, set at the
    # edge): the length of a cached prefix, in `cached_tokens` and in how soon an answer starts, would tell one key
    # what another sent. Velo's engine and vLLM (`cache_salt`) keep scopes apart; llama-server, Ollama and SGLang
    # cannot.
    prefix_scope: str = ""
    # Variables for the model's chat template (vLLM's, SGLang's and llama-server's `chat_template_kwargs`); the
    # thinking switch `think` goes over their `enable_thinking`.
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def template_variables(self) -> dict[str, Any]:
        """What the chat template is rendered with: the client's variables, the thinking switch over them."""
        if self.think is None:
            return dict(self.template_kwargs)
        return self.template_kwargs | {"enable_thinking": bool(self.think)}

    @property
    def prefill(self) -> str:
        """The text a chat ending in an assistant turn puts in the model's mouth: the answer continues it and holds
        only what the model adds, as Ollama's templates (which leave the last assistant turn open) do it and
        Anthropic's API defines it; "" when the chat ends otherwise."""
        last = self.messages[-1] if self.messages else None
        return last.content if last and last.role == "assistant" and not last.tool_calls else ""


@dataclass
class CompletionRequest:
    """Plain or fill-in-the-middle completion (`suffix`): Ollama /api/generate, OpenAI /v1/completions."""

    model: str
    prompt: str
    # The prompt as token ids instead (OpenAI's `prompt` array of ints, which lm-eval sends): sent as they are, with
    # no BOS added; `prompt` is then "". Only raw, without a suffix (proxy/dialects/openai.py refuses the rest).
    prompt_ids: list[int] | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] = field(default_factory=list)
    options: SamplingOptions = field(default_factory=SamplingOptions)
    format: OutputFormat = None
    stream: bool = True
    keep_alive: Any = None
    think: bool | str | None = None
    splits_thinking: bool = True  # as ChatRequest's
    context: list[int] | None = None
    n: int = 1
    truncate: bool | None = None  # as ChatRequest's, where True trims the prompt's start
    shift: bool | None = None
    prefix_scope: str = ""  # as ChatRequest's


# Ollama's tag for its N-th image (0-based, in `images` order) in a raw prompt: its images are read only where it has
# one, once per tag, and a tag naming none is an error (runner/ollamarunner/runner.go `inputs`, v0.14.0)
IMAGE_TAG = re.compile(r"\[img-(\d+)\]")


def reads_tags(req: CompletionRequest) -> bool:
    """Whether a generate's images are read where its prompt's "[img-N]" tags are (a raw prompt's, not filled in the
    middle), rather than one each ahead of the prompt, where Ollama's template puts them."""
    return req.raw and req.suffix is None


def places_images(req: CompletionRequest) -> bool:
    """Whether a generate's images go where its prompt's tags are: a raw prompt with images and a tag."""
    return bool(req.images) and reads_tags(req) and IMAGE_TAG.search(req.prompt) is not None


def images_in(req: ChatRequest | CompletionRequest) -> int:
    """The images a request shows the model: those of every turn of a chat, a generate's own, or as many as a raw
    prompt's tags name (`reads_tags`: an image twice for a tag used twice, one no tag names not at all)."""
    if isinstance(req, ChatRequest):
        return sum(len(m.images) for m in req.messages)
    if not reads_tags(req):
        return len(req.images)
    return sum(int(n) < len(req.images) for n in IMAGE_TAG.findall(req.prompt))


def prompt_read(req: CompletionRequest) -> str:
    """A generate's prompt text as the model reads it: a raw prompt's tags are images where it has any, not text."""
    return IMAGE_TAG.sub("", req.prompt) if req.images and reads_tags(req) else req.prompt


@dataclass
class EmbedRequest:
    model: str
    inputs: list[str] | list[list[int]]  # texts, or each input's token ids (OpenAI's and llama-server's token input)
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: Any = None
    normalize: bool = True  # False: the model's raw vector (Ollama's legacy /api/embeddings)

    @property
    def tokenized(self) -> bool:
        """The inputs are token ids, not texts (a request holds one kind, as OpenAI's `input` does)."""
        return bool(self.inputs) and not isinstance(self.inputs[0], str)


@dataclass
class Usage:
    """Token counts and timings (nanoseconds, as Ollama reports them). No total: Velo times the whole request itself,
    from its arrival, as Ollama does; a backend's own total leaves out the wait in Velo's queue (and llama-server's
    the wait for a slot)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those a prefix cache served (not evaluated again)
    load_ns: int = 0
    prompt_eval_ns: int = 0
    eval_ns: int = 0


@dataclass
class TokenLogprob:
    """A token's log-probability; the chosen token's also lists its best alternatives (`top`). `raw` holds the
    token's own bytes where its text is not whole characters: a character split across tokens shows as U+FFFD in
    `token`, and only the bytes let a client rebuild the text. None: `token`'s UTF-8."""

    token: str
    logprob: float
    top: list[TokenLogprob] = field(default_factory=list)
    raw: bytes | None = None

    @property
    def utf8(self) -> list[int]:
        """The token's bytes, as OpenAI's and Ollama's `bytes` list them."""
        return list(self.token.encode() if self.raw is None else self.raw)

    @classmethod
    def from_wire(cls, entry: dict[str, Any]) -> TokenLogprob:
        """One entry of the shape OpenAI's chat logprobs, Ollama's, llama-server's and Velo's engine share:
        `{token, logprob, bytes, top_logprobs}`. `bytes` is kept only where it is not the token's UTF-8."""
        token, raw = entry["token"], entry.get("bytes")
        raw = None if raw is None else bytes(list(raw))  # bytes(5) would be five zeros, not a TypeError
        return cls(token, entry["logprob"], [cls.from_wire(t) for t in entry.get("top_logprobs") or []],
                   None if raw is None or raw == token.encode() else raw)


@dataclass
class Chunk:
    """One piece of a streamed answer. The last chunk of a stream has `finish_reason` (and usually `usage`).

    `tool_calls` hold only complete calls: adapters accumulate streamed argument fragments before emitting.
    An `empty` chunk has nothing to send (a backend's role-only delta, llama-server's progress through a prompt):
    the pipeline drops those of a stream (proxy/stages/observe.py). A `heartbeat` one is what a route writes as
    its dialect's empty event while a stream is quiet (proxy/http_io.py).
    """

    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    context: list[int] | None = None  # Ollama /api/generate's opaque conversation state
    stop_sequence: str | None = None  # the client's stop string that ended the answer, where the backend says which
    heartbeat: bool = False

    @property
    def empty(self) -> bool:
        """Nothing of the answer (a backend's empty event, or a heartbeat)."""
        return not (self.text or self.thinking or self.tool_calls or self.logprobs or self.finish_reason
                    or self.usage or self.context is not None)


@dataclass
class EmbedResult:
    embeddings: list[list[float]]
    prompt_tokens: int = 0
    load_ns: int = 0
    input_tokens: list[int] | None = None  # each input's, where the backend says (a batch's callers get their own)


@dataclass
class ModelInfo:
    """What /api/tags, /v1/models and /api/show report about one model."""

    name: str
    backend: str = ""
    size: int = 0
    digest: str = ""
    modified_at: str = "1970-01-01T00:00:00Z"
    family: str = ""
    format: str = ""
    parameter_size: str = ""
    quantization_level: str = ""
    context_length: int | None = None
    capabilities: list[str] = field(default_factory=lambda: ["completion"])
    template: str = ""
    parameters: str = ""
    system: str = ""  # its system prompt (Ollama's SYSTEM: an Ollama model's own, a preset's)
    license: str = ""  # its license text (Ollama's LICENSE layer); where none is known, the file's general.license
    model_info: dict[str, Any] = field(default_factory=dict)  # Ollama's keys (general.*, <arch>.*), as it shows them
    file: str = ""  # the model file, when it is on this machine: the Modelfile's FROM, as Ollama names its blob
    # the server's own names for the model (llama-server's alias and model path), which clients moved over from it
    # keep asking for: they reach the model, unlisted
    served_as: list[str] = field(default_factory=list)
    # ShowResponse fields Velo keeps no model of, which /api/show passes on as they are: an Ollama backend's
    # (messages, projector_info, tensors, renderer, parser, remote_model, remote_host, requires), a GGUF's tensors
    shown: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunningModel:
    """One entry of /api/ps."""

    name: str
    size: int = 0
    size_vram: int = 0
    digest: str = ""
    expires_at: str = field(default_factory=lambda: rfc3339(time.time() + KEPT_LOADED_S))  # never unloaded
    context_length: int | None = None  # the context it was loaded with (Ollama's /api/ps), else the model's
    info: ModelInfo | None = None


def aggregate(chunks: list[Chunk]) -> Chunk:
    """Fold a whole stream into one chunk, as a non-streaming answer (texts joined once: `+=` on an attribute
    copies the whole text each time, 5 s of event loop for a 2 MB answer in 16-character chunks)."""
    out = Chunk(text="".join(c.text for c in chunks), thinking="".join(c.thinking for c in chunks))
    for c in chunks:
        out.tool_calls.extend(c.tool_calls)
        out.logprobs.extend(c.logprobs)
        out.finish_reason = c.finish_reason or out.finish_reason
        out.usage = c.usage or out.usage
        out.context = c.context if c.context is not None else out.context
        out.stop_sequence = c.stop_sequence or out.stop_sequence
    return out
