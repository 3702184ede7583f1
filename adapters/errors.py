"""Domain errors, raised anywhere below the edge and turned into each dialect's error shape only there."""
from __future__ import annotations


class VeloError(Exception):
    """Base error: `status` is the HTTP status the client sees, `kind` the error `type` the OpenAI dialects send (a
    404's is worded as OpenAI's `invalid_request_error` there, dialects/openai.py; Anthropic's type follows the status,
    dialects/anthropic.py), `code` OpenAI's machine-readable `code` (a string clients test, such as
    "context_length_exceeded", or None)."""

    status = 500
    kind = "server_error"
    code: str | None = None
    quotes_answer = False  # the message quotes what the model wrote: the log leaves it out without log_prompts
    # The same request would fail the same way (a greedy or seeded answer that stays invalid): the client is told not
    # to retry (`x-should-retry: false`, which the openai and anthropic SDKs obey; they retried such a 502 3 times).
    repeats = False

    def __init__(self, message: str, *, param: str | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    def logged(self, answers: bool) -> str:
        """The message as a log line may carry it: without `answers` (log_prompts), its kind alone where it quotes
        what the model wrote."""
        return self.message if answers or not self.quotes_answer else \
            f"{self.kind} (its message quotes the answer: shown with log_prompts)"


class BadRequest(VeloError):
    status = 400
    kind = "invalid_request_error"


class UnusableFormat(BadRequest):
    """The output format's JSON Schema cannot be used (no output matches it, it does not compile): each dialect names
    its own field for it (Ollama's `format`, OpenAI chat's `response_format`, the Responses API's `text`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="format")


class Unauthorized(VeloError):
    status = 401
    kind = "authentication_error"
    code = "invalid_api_key"  # OpenAI's, which clients test to tell the user to check the key


class Forbidden(VeloError):
    status = 403
    kind = "permission_error"


class ModelNotFound(VeloError):
    status = 404
    kind = "not_found_error"
    code = "model_not_found"

    def __init__(self, model: str, message: str | None = None):
        super().__init__(message or f"model '{model}' not found", param="model")  # Ollama's words since v0.12.6
        self.model = model


class ContextOverflow(BadRequest):
    """The prompt does not fit the model's context window; each dialect words it as its own API does."""

    code = "context_length_exceeded"

    def __init__(self, tokens: int, limit: int, param: str = "messages", why: str = ""):
        super().__init__(f"the prompt is {tokens} tokens, more than the context window of {limit} tokens{why}",
                         param=param)
        self.tokens, self.limit = tokens, limit


class ModelLacks(BadRequest):
    """The model cannot do what the request asks (thinking, insert, tools, images): Ollama's 400 and wording."""

    def __init__(self, model: str, feature: str):
        super().__init__(f'"{model}" does not support {feature}', param="model")
        self.feature = feature  # a dialect names the field that asked for it (proxy/dialects/openai.py)


class NotFound(VeloError):
    status = 404
    kind = "not_found_error"


class PayloadTooLarge(VeloError):
    status = 413
    kind = "invalid_request_error"


class RequestTimeout(VeloError):
    """The client did not send its whole request body in time (slow or stalled uploads hold a connection)."""

    status = 408
    kind = "invalid_request_error"


class Unsupported(VeloError):
    """The chosen backend cannot do this (embeddings on a chat-only llama-server, /api/pull on llama-server): the
    client's 400 in every dialect, as a missing model feature is, never a 5xx, which the SDKs retry (LiteLLM and the
    OpenAI SDK sent a 501 three times)."""

    status = 400
    kind = "invalid_request_error"


class Answered(VeloError):
    """A backend's own error answer, passed on as it came by a route that relays the backend's API (llama-server's
    /completion, /infill, ...): its clients read llama-server's status and fields (`exceed_context_size_error` with
    `n_prompt_tokens` and `n_ctx`, a 501 for a feature the server was started without), which Velo's words lost."""

    def __init__(self, status: int, body: bytes, message: str):
        super().__init__(message)
        self.status, self.body = status, body


class Overloaded(VeloError):
    """Queue full: the client should retry after `retry_after` seconds."""

    status = 429
    kind = "rate_limit_error"


class BackendError(VeloError):
    """The backend answered with an error or broke the connection."""

    status = 502
    kind = "backend_error"
    # The backend read the request, then dropped the connection or cut its answer: it may have run it, or crashed on
    # it, so no other replica is asked (each one was, and a request that crashed one crashed them all).
    taken = False

    def taken_by_backend(self) -> "BackendError":
        self.taken = True
        return self


class NonFiniteEmbedding(BackendError):
    """An embedding with NaN or an infinity in it (or null, as llama-server's JSON writer, nlohmann::json, writes
    those): the backend's fault, refused as Ollama refuses it (server/routes.go, normalize). The same input embeds
    the same way, so the client is told not to retry."""

    repeats = True


class BackendUnavailable(BackendError):
    status = 503
    kind = "service_unavailable"


class BackendTimeout(BackendError):
    status = 504
    kind = "timeout_error"
