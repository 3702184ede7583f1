"""A chat through a model's own Jinja chat template (engine.tokenizer renders it), and what that template can do.

Whether a template renders tools is found by rendering it, not by reading it: SmolLM2's template mentions no tools
and drops them, while some templates name "tools" only to raise an error. A model whose template cannot render
them gets them from adapters/tool_prompt.py instead.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from engine.chat_jinja import chat_template_env

from .errors import BadRequest
from .protocol import ChatRequest, Message
from .think import template_thinks
from .tool_prompt import in_prompt

if TYPE_CHECKING:  # the type only: a llama-server's listing asks what a template can do without loading `tokenizers`
    from engine.tokenizer import Tokenizer

_PROBE = [{"role": "user", "content": "hi"}]
_PROBE_TOOL = [{"type": "function", "function": {"name": "velo_probe_tool", "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}]


def message_dict(m: Message, argument_strings: bool = False) -> dict[str, Any]:
    """A message as Hugging Face chat templates expect it. An earlier turn's thinking under the names templates read
    it by (Qwen3's `reasoning_content`, gpt-oss's `thinking`): left out, the reasoning a client sent back
    (Anthropic's thinking blocks, Responses' reasoning items) never reached the model. Not as `thinking` beside
    both content and calls, which gpt-oss's template refuses (one or the other is its analysis). A call's arguments
    as the client sent them (ToolCall.text) where the template prints a string as it is (`argument_strings`)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.thinking:
        out["reasoning_content"] = m.thinking
        if not (m.content and m.tool_calls):
            out["thinking"] = m.thinking
    if m.tool_calls:
        out["tool_calls"] = [{"type": "function", "id": c.id, "function": {
            "name": c.name, "arguments": c.text if argument_strings and c.text else c.arguments}}
            for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_name:
        out["name"] = m.tool_name
    return out


def render(tokenizer: Tokenizer, req: ChatRequest) -> str:
    """The prompt text of a chat; `think` reaches templates that switch thinking (`enable_thinking`, Qwen3), over
    the client's own template variables."""
    if req.tools_in_prompt:
        req = in_prompt(req)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                "parameters": t.parameters}} for t in req.tools] or None
    switches = req.template_variables
    strings = prints_argument_strings(tokenizer.chat_template or "", tokenizer.bos_token, tokenizer.eos_token)
    messages = [message_dict(m, strings) for m in req.messages]
    try:
        if req.prefill and (cut := _continued(tokenizer.apply_chat_template(
                _tagged(messages), tools=tools, add_generation_prompt=False, **switches))):
            return cut
        return tokenizer.apply_chat_template(messages, tools=tools, **switches)
    except Exception as exc:  # jinja errors, raise_exception() in the template
        raise BadRequest(f"chat template: {exc}") from exc


# What Hugging Face's `continue_final_message` appends to the last message and cuts the rendered prompt at. Looking
# for the prefilled text itself found whitespace anywhere: a prefill of "\n" matched the closed turn's last newline.
_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tagged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + _TAG}]


def _continued(rendered: str) -> str:
    """The prompt cut where the prefilled text ends, as `continue_final_message` cuts it: at the tag, or, where the
    template trimmed the message (Llama 3.1's), before the trailing space it took; "" when the template dropped the
    text."""
    at = rendered.rfind(_TAG.strip())
    if at < 0:
        return ""
    return rendered[:at] if rendered.startswith(_TAG, at) else rendered[:at].rstrip()


def capabilities(tokenizer: Tokenizer) -> list[str]:
    """Ollama's capability names for what the model's template does: "completion", "tools" when it renders
    them, "insert" when its vocabulary has fill-in-the-middle markers, "thinking" when it has <think> blocks."""
    template = tokenizer.chat_template or ""
    return (["completion"] + (["tools"] if renders_tools(template, tokenizer.bos_token, tokenizer.eos_token) else [])
            + (["insert"] if tokenizer.fim_tokens else [])
            + (["thinking"] if template_thinks(template) else []))


@functools.lru_cache(maxsize=64)
def renders_tools(template: str, bos_token: str | None = None, eos_token: str | None = None) -> bool:
    """Whether a chat template renders the tools it is given (llama-server's `supports_tools` probes it the same
    way); once a template: a stopped llama-server's listing asks it at each listing."""
    return "velo_probe_tool" in _probe(template, bos_token, eos_token, _PROBE)


# Two spaces, which no `tojson` of an object writes, and a string's `tojson` escapes the quotes.
_NEEDLE = '{"velo_probe":  1}'
_PROBE_CALL = [*_PROBE, {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "id": "call_velo_probe", "function": {"name": "velo_probe_tool", "arguments": _NEEDLE}}]}]


@functools.lru_cache(maxsize=64)
def prints_argument_strings(template: str, bos_token: str | None = None, eos_token: str | None = None) -> bool:
    """Whether a template prints a call's arguments given as a string as they are (Qwen3's `is string` branch), as
    llama-server's probe decides to pass them on as a string. Qwen2.5's applies `tojson` to whatever it gets: a string
    became a quoted one, so it gets the object (its `tojson` then re-spells what the model wrote)."""
    return _NEEDLE in _probe(template, bos_token, eos_token, _PROBE_CALL)


def _probe(template: str, bos_token: str | None, eos_token: str | None, messages: list[dict[str, Any]]) -> str:
    """The template's rendering of `messages` with the probe tool; "" where it has none or refuses them."""
    if not template:
        return ""
    try:
        return chat_template_env().from_string(template).render(
            messages=messages, tools=_PROBE_TOOL, add_generation_prompt=True, bos_token=bos_token or "",
            eos_token=eos_token or "")
    except Exception:  # noqa: BLE001 - a template that refuses tools (or a string's arguments) does not render them
        return ""
