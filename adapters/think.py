"""A model's thinking told apart from its answer in streamed text, for backends that hand Velo raw text (the
engine, llama-server's /completion): `<think>...</think>`, as Qwen3 and the DeepSeek-R1 distills write it. A tag
split across pieces is held back until it is whole, so neither field ever shows half a tag."""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from .protocol import Chunk

OPEN, CLOSE = "<think>", "</think>"


_START, _THINKING, _ANSWER = "start", "thinking", "answer"


@dataclass
class ThinkSplitter:
    """As Ollama's thinking parser reads a model's text (thinking/parser.go): `<think>` opens the block only as the
    answer's start (whitespace before it is layout; any other text first means no thinking at all); the first
    `</think>` ends it, and everything after is the answer, a tag there included; whitespace right inside the block
    and right after it is layout. Whitespace, or what may be a tag, is held until the next piece tells."""

    opened: InitVar[bool] = False  # the prompt ends with <think> (Qwen3's template with thinking on)
    state: str = field(init=False)
    held: str = ""
    skip_space: bool = field(init=False)  # whitespace here is layout

    def __post_init__(self, opened: bool) -> None:
        self.state, self.skip_space = (_THINKING, True) if opened else (_START, False)

    def feed(self, text: str) -> tuple[str, str]:
        """(thinking, answer) text that is safe to send now."""
        text, self.held = self.held + text, ""
        if self.state == _START:
            lead = text.lstrip()
            if not lead or (OPEN.startswith(lead) and lead != OPEN):  # whitespace, or a tag not yet whole
                self.held = text
                return "", ""
            if not lead.startswith(OPEN):
                self.state = _ANSWER
                return "", text  # as it came: there was no block, so its whitespace is the answer's
            self.state, self.skip_space, text = _THINKING, True, lead[len(OPEN):]
        if self.state == _THINKING:
            at = text.find(CLOSE)
            if at < 0:
                keep = _partial_tag(text, CLOSE)
                self.held = text[len(text) - keep:]
                return self._lead(text[:len(text) - keep]), ""
            thought, text = self._lead(text[:at]), text[at + len(CLOSE):]
            self.state, self.skip_space = _ANSWER, True
            return thought, self._lead(text)
        return "", self._lead(text)

    def flush(self) -> tuple[str, str]:
        held, self.held = self.held, ""
        return (held, "") if self.state == _THINKING else ("", held if self.state == _START else self._lead(held))

    def split(self, chunk: Chunk, last: bool) -> None:
        """A streamed chunk's text as thinking and answer, in place; the `last` one's with what was held back."""
        chunk.thinking, chunk.text = self.feed(chunk.text)
        if last:
            held_thinking, held_text = self.flush()
            chunk.thinking, chunk.text = chunk.thinking + held_thinking, chunk.text + held_text

    def _lead(self, text: str) -> str:
        if self.skip_space:
            text = text.lstrip()
            self.skip_space = not text
        return text


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def opens_thinking(prompt: str) -> bool:
    """The rendered prompt ends with <think>: the model's first tokens are thinking (Ollama's test, server/
    routes.go). A user's message that named the tag had the whole answer sent as thinking."""
    return prompt.rstrip().endswith(OPEN)


def template_thinks(template: str) -> bool:
    """A chat template that writes <think> blocks (Qwen3's, whose switch is `enable_thinking`; DeepSeek-R1's older
    ones name only `</think>`): where Velo splits the text itself (the engine, llama-server's /completion), Ollama's
    "thinking" capability, which clients take to mean the thinking comes apart from the answer. A switch alone is
    not enough there: Command R7B's and Gemma's markers are others, which the splitter cannot read, so their
    reasoning landed in an answer a client had been told would hold none."""
    return OPEN in template or CLOSE in template
