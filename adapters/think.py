"""A model's thinking told apart from its answer in streamed text, for backends that hand Velo raw text (the
engine): `<think>...</think>`, as Qwen3 and the DeepSeek-R1 distills write it. A tag split across pieces is held
back until it is whole, so neither field ever shows half a tag."""
from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass
class ThinkSplitter:
    thinking: bool = False  # inside <think> (a template may open it in the prompt, as Qwen3's does)
    held: str = ""  # what may be the start of a tag
    skip_space: bool = False  # after </think>: the whitespace before the answer is layout

    def feed(self, text: str) -> tuple[str, str]:
        """(thinking, answer) text that is safe to send now."""
        text, self.held = self.held + text, ""
        thought, answer = [], []
        while text:
            tag = CLOSE if self.thinking else OPEN
            at = text.find(tag)
            end = at if at >= 0 else len(text) - _partial_tag(text, tag)
            piece, self.held = text[:end], "" if at >= 0 else text[end:]
            if self.thinking:
                thought.append(piece)
            elif at < 0 or piece.strip():  # whitespace before <think> is layout too
                answer.append(self._answer(piece))
            if at < 0:
                break
            text, self.thinking = text[at + len(tag):], not self.thinking
            self.skip_space = not self.thinking
        return "".join(thought), "".join(answer)

    def flush(self) -> tuple[str, str]:
        held, self.held = self.held, ""
        return (held, "") if self.thinking else ("", self._answer(held))

    def _answer(self, text: str) -> str:
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
    """The rendered prompt ends inside <think>: the model's first tokens are thinking."""
    tail = prompt.rstrip()
    return tail.rfind(OPEN) > tail.rfind(CLOSE)


def template_thinks(template: str) -> bool:
    """A chat template that has <think> blocks, or a switch for them (`enable_thinking`, Qwen3): Ollama's
    "thinking" capability."""
    return OPEN in template or "enable_thinking" in template
