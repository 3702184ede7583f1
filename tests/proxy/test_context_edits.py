"""Context editing as Anthropic defines it: what clears, when, and what it reports; counted with a word count."""
from __future__ import annotations

from adapters.protocol import ChatRequest, Message, ToolCall
from proxy.context_edits import CLEARED, ClearThinking, ClearToolUses, apply


async def words(req: ChatRequest) -> int:
    return sum(len(m.content.split()) + len(m.thinking.split()) + sum(len(c.arguments) for c in m.tool_calls)
               for m in req.messages)


def agent_turns(n: int, tool: str = "read", result_words: int = 20) -> list[Message]:
    out = [Message("user", "fix the bug")]
    for i in range(n):
        call = ToolCall(tool, {"path": f"f{i}"}, f"{tool}{i}")
        out += [Message("assistant", "", thinking=f"step {i}", tool_calls=[call]),
                Message("tool", " ".join(["line"] * result_words), tool_call_id=f"{tool}{i}", tool_name=tool)]
    return out


async def test_the_oldest_results_clear_past_the_trigger_keeping_the_last_ones():
    req = ChatRequest("m", agent_turns(5))
    edited = await apply(req, (ClearToolUses(trigger_tokens=50, keep=2),), words)
    results = [m.content for m in edited.request.messages if m.role == "tool"]
    assert results[:3] == [CLEARED] * 3 and results[3:] == [" ".join(["line"] * 20)] * 2
    [done] = edited.applied
    assert (done.kind, done.cleared, done.tokens) == ("clear_tool_uses_20250919", 3, 3 * (20 - len(CLEARED.split())))
    assert [m.content for m in req.messages if m.role == "tool"][0] != CLEARED  # the client's request is untouched


async def test_nothing_clears_under_the_trigger_or_short_of_clear_at_least():
    req = ChatRequest("m", agent_turns(5))
    assert (await apply(req, (ClearToolUses(trigger_tokens=10_000),), words)).applied == []
    short = await apply(req, (ClearToolUses(trigger_tokens=50, keep=2, clear_at_least=43),), words)
    assert short.applied == [] and short.request is req
    assert (await apply(req, (ClearToolUses(trigger_tokens=50, keep=2, clear_at_least=42),), words)).applied


async def test_a_tool_uses_trigger_excluded_tools_and_cleared_inputs():
    req = ChatRequest("m", agent_turns(2, "grep") + agent_turns(3)[1:])
    assert (await apply(req, (ClearToolUses(trigger_tokens=None, trigger_uses=5),), words)).applied == []
    edited = await apply(req, (ClearToolUses(trigger_tokens=None, trigger_uses=4, keep=1, exclude=frozenset({"grep"}),
                                             clear_inputs=True),), words)
    calls = [(c.name, c.arguments) for m in edited.request.messages for c in m.tool_calls]
    assert calls == [("grep", {"path": "f0"}), ("grep", {"path": "f1"}), ("read", {}), ("read", {}),
                     ("read", {"path": "f2"})]
    assert [m.content == CLEARED for m in edited.request.messages if m.role == "tool"] == [False, False, True,
                                                                                          True, False]


async def test_a_cleared_input_drops_the_text_it_was_sent_as():
    """A call's arguments string (ToolCall.text) is what an OpenAI-compatible backend reads: kept on a call whose input
    the edit emptied, the backend would read the whole input still (Anthropic's calls, objects, carry none yet)."""
    req = ChatRequest("m", agent_turns(3))
    for m in req.messages:
        for c in m.tool_calls:
            c.text = '{"path": "%s"}' % c.arguments["path"]
    edited = await apply(req, (ClearToolUses(trigger_tokens=None, trigger_uses=2, keep=1, clear_inputs=True),),
                         words)
    sent = [c.arguments_json() for m in edited.request.messages for c in m.tool_calls]
    assert sent == ["{}", "{}", '{"path": "f2"}']


async def test_thinking_clears_from_all_but_the_last_turns():
    req = ChatRequest("m", agent_turns(3))
    edited = await apply(req, (ClearThinking(keep=1),), words)
    assert [m.thinking for m in edited.request.messages if m.role == "assistant"] == ["", "", "step 2"]
    assert (edited.applied[0].cleared, edited.applied[0].tokens) == (2, 4)
    assert (await apply(req, (ClearThinking(keep=None),), words)).applied == []
