"""Streaming hold-back: content flows, a call is held until complete, whatever way the text is cut into chunks."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.openai_wire import ChatStream
from adapters.protocol import ChatRequest, Chunk, CompletionRequest, Message, Tool, ToolCall
from proxy.tools.calls import RepairReport, ToolCallInvalid
from proxy.tools.metrics import ModelCounts
from proxy.tools.stream import repair_message, repair_stream
from proxy.tools.structured import StructuredOutputInvalid
from tests.proxy.tools.test_calls import TOOLS

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}</tool_call>'


def _req(**kw) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message("user", "hi")], **kw)


async def _source(pieces: list[str], finish: str | None = "stop", stop: str | None = None) -> AsyncIterator[Chunk]:
    for p in pieces:
        yield Chunk(text=p)
    if finish:
        yield Chunk(finish_reason=finish, stop_sequence=stop)  # type: ignore[arg-type]


async def _run(pieces: list[str], req: ChatRequest, finish: str | None = "stop", **kw) -> list[Chunk]:
    """What reaches the client: chunks with something in them (a backend's empty ones the pipeline drops)."""
    return [c async for c in repair_stream(_source(pieces, finish), req, **kw) if not c.empty]


async def _next_sent(stream: AsyncIterator[Chunk]) -> Chunk:
    while (chunk := await stream.__anext__()).empty:
        pass
    return chunk


def _cut(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
async def test_call_is_held_until_complete_at_any_chunking(size: int) -> None:
    text = "Checking the weather. " + CALL + " Back soon."
    out = await _run(_cut(text, size), _req(tools=TOOLS))
    with_calls = [c for c in out if c.tool_calls]
    assert len(with_calls) == 1 and with_calls[0].tool_calls[0].arguments == {"city": "Paris", "days": 2}
    assert "".join(c.text for c in out) == "Checking the weather.  Back soon."
    assert "<" not in "".join(c.text for c in out) and out[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("stray", ["}", "]]", " }"])
async def test_stray_closers_after_a_bare_call_go_with_it_at_any_chunking(size: int, stray: str) -> None:
    """Qwen2.5-Coder-1.5B closed a call once too often; the lone `}` stayed in the content, which agent frameworks
    keep in the history and send back every turn."""
    text = 'Checking. {"name": "get_weather", "arguments": {"city": "Paris"}}' + stray + " Back soon."
    out = await _run(_cut(text, size), _req(tools=TOOLS))
    assert [c.tool_calls[0].arguments for c in out if c.tool_calls] == [{"city": "Paris"}]
    assert "".join(c.text for c in out) == "Checking.  Back soon."


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
async def test_a_call_writing_its_flattened_arguments_before_its_name_is_a_call_at_any_chunking(size: int) -> None:
    """Repaired whole it was a call; streamed, its first key named no call part and it went out as text."""
    out = await _run(_cut('{"city": "Paris", "name": "get_weather"}', size), _req(tools=TOOLS))
    assert [(c.name, c.arguments) for chunk in out for c in chunk.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(c.text for c in out) == ""


async def test_json_whose_first_key_is_no_offered_parameter_still_streams() -> None:
    stream = repair_stream(_source(['{"colour', '": "red", '], finish=None), _req(tools=TOOLS))
    assert (await _next_sent(stream)).text == '{"colour'


async def test_content_before_a_call_is_not_delayed() -> None:
    out = await _run(["Hello there, ", "<tool_", "call>{\"name\": "], _req(tools=TOOLS), finish=None)
    assert out[0].text == "Hello there, "


async def test_json_that_turns_out_not_to_be_a_call_is_released_early() -> None:
    pieces = ['Example: {"colour', '": "red", ', '"size": 3} end']
    source = _source(pieces, finish=None)
    stream = repair_stream(source, _req(tools=TOOLS))
    first = await _next_sent(stream)
    second = await _next_sent(stream)
    assert first.text == 'Example: {"colour' and second.text == '": "red", '


async def test_structured_calls_from_the_backend_are_validated_and_coerced() -> None:
    async def source() -> AsyncIterator[Chunk]:
        yield Chunk(tool_calls=[ToolCall("get_weather", {"city": "Oslo", "alerts": "true"}, "call_1")],
                    finish_reason="tool_calls")
    out = [c async for c in repair_stream(source(), _req(tools=TOOLS))]
    assert out[-1].tool_calls == [ToolCall("get_weather", {"city": "Oslo", "alerts": True}, "call_1")]


async def test_a_turn_whose_only_call_was_dropped_ends_in_stop_not_tool_calls() -> None:
    """The backend's call to a tool never offered is dropped after text was sent: the turn ended `tool_calls` with no
    call in it (an OpenAI client's `message.tool_calls` was None under finish_reason "tool_calls")."""
    async def source() -> AsyncIterator[Chunk]:
        yield Chunk(text="Let me look.")
        yield Chunk(tool_calls=[ToolCall("rm_rf", {}, "call_1")], finish_reason="tool_calls")
    out = [c async for c in repair_stream(source(), _req(tools=TOOLS)) if not c.empty]
    assert "".join(c.text for c in out) == "Let me look." and not any(c.tool_calls for c in out)
    assert out[-1].finish_reason == "stop"


async def test_only_failed_attempts_raise_before_anything_is_sent() -> None:
    stream = repair_stream(_source(_cut('{"name": "rm_rf", "arguments": {}}', 4)),
                           _req(tools=TOOLS, tool_choice="required"))
    with pytest.raises(ToolCallInvalid, match="rm_rf: not an offered tool"):
        await _next_sent(stream)
    schema_broken = '{"name": "get_weather", "arguments": {"unit": "kelvin"}}'  # no city, no such unit
    invalid = repair_stream(_source(_cut(schema_broken, 4)), _req(tools=TOOLS))
    with pytest.raises(ToolCallInvalid, match="get_weather: "):
        await _next_sent(invalid)


async def test_json_naming_no_offered_tool_is_the_answer_when_no_call_is_demanded() -> None:
    """A small model answers an unrelated question in JSON shaped like a call (`{"name": "hello", ...}`): Ollama and
    llama-server send it as content; a 502 was retried by the SDKs into the same answer."""
    text = '{"name": "hello", "arguments": {"greeting": "hi"}}'
    out = await _run(_cut(text, 4), _req(tools=TOOLS))
    assert "".join(c.text for c in out) == text and not any(c.tool_calls for c in out)
    assert out[-1].finish_reason == "stop"


async def test_a_call_cut_by_the_token_limit_is_sent_as_text() -> None:
    """The limit's doing, not the model's: its text with finish reason length, as OpenAI sends a cut answer."""
    out = await _run(_cut('{"name": "get_', 3), _req(tools=TOOLS, tool_choice="required"), finish="length")
    assert "".join(c.text for c in out) == '{"name": "get_' and not any(c.tool_calls for c in out)
    assert out[-1].finish_reason == "length"


@pytest.mark.parametrize("size", [3, 1000])
async def test_a_call_repair_could_close_is_text_when_the_limit_cut_it(size: int) -> None:
    """Qwen2.5-Coder-1.5B at max_tokens 36 stopped inside a string: closed by repair, the call went out whole
    (finish `tool_calls`) and the AI SDK ran the tool on a `bio` cut mid-sentence. The same text ended by the model
    itself is still closed (a small model's missing braces); a call whole before the cut is still a call."""
    text = '{"name": "get_weather", "arguments": {"city": "Par'
    cut = await _run(_cut(text, size), _req(tools=TOOLS, tool_choice="required"), finish="length")
    assert "".join(c.text for c in cut) == text and not any(c.tool_calls for c in cut)
    assert cut[-1].finish_reason == "length"
    ended = await _run(_cut(text, size), _req(tools=TOOLS))
    assert [c.tool_calls[0].arguments for c in ended if c.tool_calls] == [{"city": "Par"}]
    whole = await _run(_cut('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', size),
                       _req(tools=TOOLS), finish="length")
    assert [c.tool_calls[0].arguments for c in whole if c.tool_calls] == [{"city": "Paris"}]


@pytest.mark.parametrize("size", [3, 1000])
async def test_a_forced_call_a_stop_string_cut_is_text_not_a_guess(size: int) -> None:
    """The engine's forced `{"city": "Rome"}` cut by the client's stop string "Rome": repair closed it to
    `{"city": ""}` and the client got that call to run (finish `tool_calls`), or a 502 where another argument was
    required. The client's cut is sent as it came, with finish `stop`, as a cut by max_tokens is."""
    text = '{"name": "get_weather", "arguments": {"city": "'
    req = _req(tools=TOOLS, tool_choice="required")
    out = [c async for c in repair_stream(_source(_cut(text, size), stop="Rome"), req, constrained=True) if not c.empty]
    assert "".join(c.text for c in out) == text and not any(c.tool_calls for c in out)
    assert out[-1].finish_reason == "stop"


async def test_arguments_the_limit_cut_on_the_openai_wire_are_text() -> None:
    """A backend's structured call cut by max_tokens (`{"cmd": "cat no`, finish `length`) reaches repair as the
    adapter's text `{"name": ..., "arguments": {"cmd": "cat no}`, where a quote put back before the brace made
    it a whole call: Codex ran `cat no`. A cut turn's call that needed any repair is text, finish `length`."""
    parser = ChatStream()
    for event in ({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]}):
        parser.feed({"choices": [{"index": 0, "delta": event}]})
    parser.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    last = parser.last()
    out = await _run([last.text], _req(tools=TOOLS), finish="length")
    assert not any(c.tool_calls for c in out) and out[-1].finish_reason == "length"
    assert "".join(c.text for c in out) == '{"name": "get_weather", "arguments": {"city": "Par}'


async def test_a_forced_call_whose_arguments_look_like_a_schema_is_still_a_call() -> None:
    """The engine forces `{"name": "weather", "arguments": {"type": "object", "properties": {}}}` for a tool whose
    schema allows any object: smolagents and instructor got it as content, and no call. Unforced, it stays the
    schema echo small models write in prose."""
    tools = [Tool("weather", "", {"type": "object", "properties": {}})]
    text = '{"name": "weather", "arguments": {"type": "object", "properties": {}}}'
    forced = await _run([text], _req(tools=tools, tool_choice="required"), constrained=True)
    assert [c.tool_calls[0].name for c in forced if c.tool_calls] == ["weather"]
    free = await _run([text], _req(tools=tools))
    assert "".join(c.text for c in free) == text and not any(c.tool_calls for c in free)


async def test_tool_choice_none_turns_extraction_off() -> None:
    out = await _run([CALL], _req(tools=TOOLS, tool_choice="none"))
    assert out[0].text == CALL and not out[0].tool_calls


async def test_without_tools_or_format_the_stream_is_untouched() -> None:
    source = _source(["a"])
    assert repair_stream(source, _req()) is source


async def test_metrics_and_report_are_filled() -> None:
    metrics, report = ModelCounts(), RepairReport()
    again_in_a_fence = "```json\n" + CALL.removeprefix("<tool_call>").removesuffix("</tool_call>") + "\n```"
    await _run([CALL, again_in_a_fence], _req(tools=TOOLS), metrics=metrics, report=report)
    assert metrics.extracted == 1 and metrics.coerced == 1 and metrics.deduped == 1
    assert report.extracted == 1


async def test_structured_output_is_repaired_on_the_last_chunk() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = await _run(["```json\n{'n': ", "'3',}\n```"], _req(format=schema))
    assert [c.text for c in out] == ['{"n":3}'] and out[-1].finish_reason == "stop"


async def test_completions_get_structured_repair_too() -> None:
    req = CompletionRequest(model="m", prompt="p", format="json")
    out = [c async for c in repair_stream(_source(["{'a': 1"]), req)]
    assert out[-1].text == '{"a":1}'


async def test_structured_output_that_is_not_json_is_an_error() -> None:
    with pytest.raises(StructuredOutputInvalid, match="not JSON"):
        await _run(["I cannot do that."], _req(format="json"))


async def test_structured_output_off_schema_is_an_error() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with pytest.raises(StructuredOutputInvalid, match='"n" is a required property'):
        await _run(['{"m": 1}'], _req(format=schema))


async def test_buffered_structured_output_cut_by_its_limit_or_a_stop_string_is_sent_as_it_came() -> None:
    """From a backend that does not enforce the format (an OpenAI-compatible server): the cut `{"n": ` was repaired
    into `{}` and failed the schema, a 502 the SDKs retried into the same cut, where finish reason `length` makes
    them raise LengthFinishReasonError."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    cut = await _run(['{"n": '], _req(format=schema), finish="length")
    assert [(c.text, c.finish_reason) for c in cut] == [('{"n": ', "length")]

    async def stopped() -> AsyncIterator[Chunk]:
        yield Chunk(text='{"')
        yield Chunk(finish_reason="stop", stop_sequence="n")
    out = [c async for c in repair_stream(stopped(), _req(format=schema))]
    assert [(c.text, c.stop_sequence) for c in out] == [('{"', "n")]


async def test_grammar_constrained_structured_output_streams_token_by_token() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    pieces = ['{"n"', ': ', '3}']
    stream = repair_stream(_source(pieces), _req(format=schema), constrained=True)
    first = await stream.__anext__()  # sent before the answer is whole
    rest = [c async for c in stream]
    assert first.text == '{"n"' and [c.text for c in rest] == [": ", "3}", ""] and rest[-1].finish_reason == "stop"


async def test_grammar_constrained_output_that_breaks_the_schema_ends_in_an_error() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with pytest.raises(StructuredOutputInvalid):
        await _run(['{"m": 1}'], _req(format=schema), constrained=True)
    cut = await _run(['{"n": '], _req(format=schema), finish="length", constrained=True)
    assert cut[-1].finish_reason == "length"  # cut by max_tokens: sent as it is, as Ollama sends it


async def test_grammar_constrained_output_cut_by_the_clients_stop_string_is_sent_as_it_is() -> None:
    """As a cut by max_tokens, and as Ollama sends it: a 502 there was retried by the SDKs into the same cut."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    async def stopped() -> AsyncIterator[Chunk]:
        yield Chunk(text='{"')
        yield Chunk(finish_reason="stop", stop_sequence="n")
    out = [c async for c in repair_stream(stopped(), _req(format=schema), constrained=True)]
    assert "".join(c.text for c in out) == '{"' and out[-1].stop_sequence == "n"


async def test_closing_the_repaired_stream_closes_the_backend_stream() -> None:
    closed = []

    async def source() -> AsyncIterator[Chunk]:
        try:
            yield Chunk(text="Hello ")
            yield Chunk(text="world")
        finally:
            closed.append(True)
    stream = repair_stream(source(), _req(tools=TOOLS))
    await stream.__anext__()
    await stream.aclose()  # type: ignore[attr-defined]
    assert closed == [True]


SAMPLES = [
    "Checking. " + CALL + " Back soon.",
    'Here is data: {"colour": "red"} and a call ```json\n{"name": "search", "arguments": {"query": "q"}}\n```',
    "```python\nx = {'name': 'get_weather'}\n```\nThat is code.",
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}',
    '<|python_tag|>{"name": "search", "parameters": {"query": "a"}}<|eom_id|>',
    "I'd say [1, 2, 3] < 4 and `code` <b>bold</b> [TOOL_ok] {not json",
    '<function=search>{"query": "tiles"}</function> done',
    'Sure. {"city": "Paris", "name": "get_weather"} done',
]


@settings(max_examples=60, deadline=None)
@given(sample=st.sampled_from(SAMPLES), cuts=st.lists(st.integers(min_value=1, max_value=200), max_size=12))
def test_streamed_result_equals_whole_message_result(sample: str, cuts: list[int]) -> None:
    points = sorted({c % len(sample) for c in cuts} - {0})
    pieces = [sample[a:b] for a, b in zip([0, *points], [*points, len(sample)])]
    out = asyncio.run(_run(pieces, _req(tools=TOOLS)))
    content, calls, _ = repair_message(sample, [], TOOLS)
    streamed_calls = [(c.name, c.arguments) for chunk in out for c in chunk.tool_calls]
    assert streamed_calls == [(c.name, c.arguments) for c in calls]
    assert "".join(c.text for c in out).strip() == content, pieces


async def test_tool_choice_naming_a_function_offers_only_that_one() -> None:
    choice = {"type": "function", "function": {"name": "search"}}
    with pytest.raises(ToolCallInvalid, match="not an offered tool \\(offered: search\\)"):
        await _run([CALL], _req(tools=TOOLS, tool_choice=choice))


async def test_held_text_sends_nothing_until_the_call() -> None:
    """While a call is written, nothing goes up the pipeline (each empty chunk was a hop through every stage above):
    the route's heartbeats keep the client."""
    out = [c async for c in repair_stream(_source(_cut(CALL, 8)), _req(tools=TOOLS))]
    assert len(out) == 1 and out[0].tool_calls


async def test_buffered_structured_output_keeps_every_tokens_logprobs() -> None:
    """Held text gave up its logprobs: only the last chunk's reached the client."""
    from adapters.protocol import TokenLogprob

    async def pieces() -> AsyncIterator[Chunk]:
        yield Chunk(text='{"a":', logprobs=[TokenLogprob('{"a":', -0.1)])
        yield Chunk(text=" 1}", logprobs=[TokenLogprob(" 1}", -0.2)])
        yield Chunk(finish_reason="stop")
    out = [c async for c in repair_stream(pieces(), _req(format="json")) if not c.empty]
    assert [c.text for c in out] == ['{"a": 1}']
    assert [lp.token for lp in out[0].logprobs] == ['{"a":', " 1}"]


async def test_a_dict_in_a_fenced_block_of_code_stays_code_wherever_the_stream_is_cut() -> None:
    """A ```python block's call-shaped dict became a real call once the chunk holding the fence's header had gone
    (its next chunk was scanned afresh, outside the block); whole, it was always text. A call after the block is
    still one."""
    code = 'Here is how:\n```python\nclient.run({"name": "get_weather", "arguments": {"city": "Paris"}})\n```\nDone.'
    for cut in range(1, len(code)):
        out = await _run([code[:cut], code[cut:]], _req(tools=TOOLS))
        assert not [c for c in out if c.tool_calls] and "".join(c.text for c in out) == code, cut
    after = code + " " + CALL
    for cut in range(1, len(after), 7):
        out = await _run([after[:cut], after[cut:]], _req(tools=TOOLS))
        assert [c.tool_calls[0].name for c in out if c.tool_calls] == ["get_weather"], cut
