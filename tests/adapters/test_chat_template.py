"""What a chat template can do is found by rendering it; rendering passes tools and the thinking switch."""
from __future__ import annotations

from dataclasses import replace

import pytest

from adapters.chat_template import capabilities, render
from adapters.protocol import ChatRequest, Message, Tool, ToolCall
from engine.tokenizer import Tokenizer
from tests.engine.tiny import CHATML, byte_tokenizer

TOOLS = CHATML + "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{% endif %}"
REFUSES = CHATML + "{% if tools %}{{ raise_exception('this model has no tools') }}{% endif %}"
MENTIONS = "{# tools are not supported #}" + CHATML  # names tools, renders none
QWEN3_LIKE = (CHATML + "{% if add_generation_prompt %}{% if enable_thinking is defined and not enable_thinking %}"
              "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")
# a switch for thinking with markers of its own, as Command R7B's template has
OTHER_MARKERS = (CHATML + "{% if add_generation_prompt and enable_thinking %}<|START_THINKING|>{% endif %}")
R1_LIKE = CHATML.replace("{{ m['content'] }}", "{{ m['content'].split('</think>')[-1] }}")  # names only its closer
READ = Tool("read_file", "Read", {"type": "object"})
# an assistant turn's calls as Qwen2.5's template writes them (`tojson` of whatever it gets), and as Qwen3's (a string
# as it is, else `tojson`)
_CALLS = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{% for c in m.tool_calls or [] %}"
          '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": ARGS}\n</tool_call>'
          "{% endfor %}<|im_end|>\n{% endfor %}")
QWEN25_CALLS = _CALLS.replace("ARGS", "{{ c.function.arguments | tojson }}")
QWEN3_CALLS = _CALLS.replace("ARGS", "{% if c.function.arguments is string %}{{ c.function.arguments }}"
                             "{% else %}{{ c.function.arguments | tojson }}{% endif %}")


def tokenizer(template: str | None) -> Tokenizer:
    return Tokenizer(byte_tokenizer(), template, None, "<|im_end|>", [])


@pytest.mark.parametrize("template, caps", [
    (CHATML, ["completion"]), (TOOLS, ["completion", "tools"]), (REFUSES, ["completion"]),
    (MENTIONS, ["completion"]), (QWEN3_LIKE, ["completion", "thinking"]), (OTHER_MARKERS, ["completion"]),
    (R1_LIKE, ["completion", "thinking"]), (None, ["completion"])])
def test_capabilities_come_from_rendering(template, caps):
    assert capabilities(tokenizer(template)) == caps


def test_fim_markers_in_the_vocabulary_add_insert():
    fim = Tokenizer(byte_tokenizer(("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")), TOOLS, None,
                    "<|im_end|>", [])
    assert capabilities(fim) == ["completion", "tools", "insert"]  # Ollama's order


def test_tools_render_natively_or_in_the_prompt():
    req = ChatRequest("m", [Message("user", "hi")], tools=[READ])
    assert "<tools>read_file</tools>" in render(tokenizer(TOOLS), req)
    prompted = render(tokenizer(CHATML), ChatRequest("m", req.messages, tools=[READ], tools_in_prompt=True))
    assert prompted.startswith("<|im_start|>system\n# Tools") and '"name": "read_file"' in prompted


def test_the_thinking_switch_reaches_the_template():
    req = ChatRequest("m", [Message("user", "hi")])
    assert render(tokenizer(QWEN3_LIKE), req).endswith("<think>\n")
    off = render(tokenizer(QWEN3_LIKE), ChatRequest("m", req.messages, think=False))
    assert off.endswith("<think>\n\n</think>\n\n")


def test_a_clients_template_variables_reach_the_engines_template():
    """DeepSeek-V3.1-style templates switch on a variable of their own (`thinking`), which clients set in
    `chat_template_kwargs`; the think switch goes over a variable of the same name."""
    deepseek_like = CHATML + "{% if add_generation_prompt and thinking %}<think>{% endif %}"
    req = ChatRequest("m", [Message("user", "hi")], template_kwargs={"thinking": True})
    assert render(tokenizer(deepseek_like), req).endswith("<think>")
    assert not render(tokenizer(deepseek_like), ChatRequest("m", req.messages)).endswith("<think>")
    switched = ChatRequest("m", req.messages, think=False, template_kwargs={"enable_thinking": True})
    assert render(tokenizer(QWEN3_LIKE), switched).endswith("<think>\n\n</think>\n\n")


def test_a_chat_ending_in_an_assistant_turn_is_continued():
    """Prefill (Anthropic's API, Ollama's templates, llama-server): the prompt stops right after the assistant's
    text, with no end of turn and no new turn; a template that trims messages (Llama 3.1) is cut at the trimmed
    text, and one that drops the text gets a new turn as before."""
    asked = [Message("user", "Say hello"), Message("assistant", "Hello,")]
    assert render(tokenizer(CHATML), ChatRequest("m", asked)).endswith("<|im_start|>assistant\nHello,")
    trimming = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    spaced = [asked[0], Message("assistant", "Hello, ")]
    assert render(tokenizer(trimming), ChatRequest("m", spaced)).endswith("assistant\nHello,")
    dropping = CHATML.replace("{{ m['content'] }}", "{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}")
    assert render(tokenizer(dropping), ChatRequest("m", asked)).endswith("<|im_end|>\n<|im_start|>assistant\n")
    calls = [asked[0], Message("assistant", "Reading", tool_calls=[ToolCall("read_file", {})])]
    assert render(tokenizer(CHATML), ChatRequest("m", calls)).endswith("<|im_start|>assistant\n")


LLAMA31_LIKE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
                "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@pytest.mark.parametrize("template", [CHATML, LLAMA31_LIKE], ids=["chatml", "trims"])
@pytest.mark.parametrize("prefill", ["Hello,", "Hello, ", "\n", "  ", " x ", '{"a": '])
def test_a_prefill_is_continued_as_transformers_continues_it(template, prefill):
    """As `continue_final_message` cuts the prompt: the prefilled text was looked for in the rendered prompt, and
    "\n" was found at the closed turn's end, so the model was asked to write after `<|im_end|>`."""
    from transformers.utils.chat_template_utils import render_jinja_template
    asked = [Message("user", "Say  hello"), Message("assistant", prefill)]
    [expected], _ = render_jinja_template([[{"role": m.role, "content": m.content} for m in asked]],
                                          chat_template=template, continue_final_message=True)
    assert render(tokenizer(template), ChatRequest("m", asked)) == expected


def test_an_earlier_turns_thinking_reaches_templates_that_read_it():
    """Qwen3's template renders an assistant turn's `reasoning_content`, gpt-oss's its `thinking`: Velo passed
    neither, so the reasoning a client sent back (Anthropic thinking blocks, Responses reasoning items) was dropped."""
    reads = ("{% for m in messages %}[{{ m.role }}:{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
             "</think>{% endif %}{% if m.thinking %}({{ m.thinking }}){% endif %}{{ m.content }}]{% endfor %}")
    req = ChatRequest(model="m", messages=[Message("user", "hi"), Message("assistant", "ok", thinking="they said hi"),
                                           Message("user", "and?")])
    assert render(tokenizer(reads), req) == \
        "[user:hi][assistant:<think>they said hi</think>(they said hi)ok][user:and?]"


def test_a_template_that_marks_the_assistants_text_for_training_renders():
    """transformers' `{% generation %}` tag (LFM2's, Laguna's templates): a TemplateSyntaxError here."""
    marked = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}A:{{ m.content }}"
              "{% endgeneration %}{% else %}U:{{ m.content }}{% endif %}{% endfor %}")
    req = ChatRequest(model="m", messages=[Message("user", "hi"), Message("assistant", "yo"), Message("user", "x")])
    assert render(tokenizer(marked), req) == "U:hiA:yoU:x"


def test_thinking_beside_content_and_calls_is_not_given_as_gpt_oss_refuses_it():
    """gpt-oss's template raises on an assistant turn with calls and both content and `thinking`: that chat was a
    400 once thinking was passed on."""
    gpt_oss_like = ("{% for m in messages %}{% if m.tool_calls and m.content and m.thinking %}"
                    "{{ raise_exception('Cannot pass both content and thinking in an assistant message with tool "
                    "calls!') }}"
                    "{% endif %}[{{ m.role }}:{{ m.reasoning_content or '' }}]{% endfor %}")
    call = ToolCall("read_file", {"path": "a"}, "c1")
    req = ChatRequest(model="m", messages=[Message("user", "hi"),
                                           Message("assistant", "Reading.", thinking="need a", tool_calls=[call])])
    assert render(tokenizer(gpt_oss_like), req) == "[user:][assistant:need a]"


def test_a_history_call_keeps_its_text_where_the_template_prints_strings():
    """The arguments a client sent back (ToolCall.text) as they are, where the template prints a string as it is:
    rendered again from the object, the engine's prompt no longer held the tokens the model generated (its prefix
    cache missed from that turn on). Where the template runs `tojson` on anything, a string would be a quoted string: it
    gets the object."""
    raw = '{"path": "caf\\u00e9.txt",  "n": 1.0}'
    call = ToolCall("read", {"path": "café.txt", "n": 1.0}, "call_1", text=raw)
    req = ChatRequest("m", [Message("user", "hi"), Message("assistant", tool_calls=[call])])
    assert f'"arguments": {raw}}}' in render(tokenizer(QWEN3_CALLS), req)
    assert '"arguments": {"path": "café.txt", "n": 1.0}}' in render(tokenizer(QWEN25_CALLS), req)
    anthropic = ChatRequest("m", [req.messages[0], Message("assistant", tool_calls=[replace(call, text="")])])
    assert '"arguments": {"path": "café.txt", "n": 1.0}}' in render(tokenizer(QWEN3_CALLS), anthropic)
