"""A request as the engine thread keeps it, and what it streams back: detokenize, cut at stop strings, send."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import llguidance
import torch

from engine.constrained import Constrainer
from engine.sampling import Sample, SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class RequestOutput:
    """One streamed step of a request. `text` is the new text since the previous output (never a
    broken UTF-8 character, never part of a stop string); `token_ids` the new tokens. One with neither, not
    finished, reports progress through a prompt read in chunks."""
    request_id: int
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None   # "stop", "length" or "abort"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0         # prompt tokens served from the prefix cache
    num_output_tokens: int = 0
    # of the tokens whose text begins in this output's (or an earlier one's): {"token_id", "token", "logprob",
    # "top_logprobs"}, and "bytes" where the token is part of a character; none for text a stop string cut, or for
    # the end-of-sequence token
    logprobs: list[dict] | None = None
    stop_string: str | None = None  # the stop string that ended the request, on its last output
    extra: dict = field(default_factory=dict)
    requeued: bool = False  # preempted for KV memory: queued again, to read its whole sequence again once admitted

    @property
    def progress(self) -> bool:
        """Only a report of progress through the prompt (RequestState.progress, or a requeue): no text, no token, no
        end."""
        return not (self.token_ids or self.text or self.finished)


Sink = Callable[[RequestOutput | BaseException], None]


class RequestState:
    """Lives in `Sequence.request`: a request's knobs, its generator and grammar matcher, and its output text.
    Holds back only the text at the end that begins some stop string (it may still become one), so a stop string
    split across tokens is never streamed before it is recognised, and text that cannot start one is sent at
    once."""

    def __init__(self, params: SamplingParams, tokenizer: Tokenizer, sink: Sink,
                 matcher: llguidance.LLMatcher | None = None):
        self.params, self.tokenizer, self.sink = params, tokenizer, sink
        self.matcher = matcher  # when the output must match a grammar (engine.constrained)
        self.detok = IncrementalDetokenizer(tokenizer)
        self.generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self.text, self.sent = "", 0
        self.num_sent_tokens = 0
        self.longest_stop = max((len(s) for s in params.stop), default=0)
        self.stopped_by: str | None = None  # the stop string found in the text
        self.done = False
        # Log-probabilities go out with the text they describe: each waits, with where its token's text begins,
        # until that text is sent, and those of text a stop string cut (or of the end-of-sequence token, which
        # shows none) never go, as Ollama's runner truncates them; they described tokens the answer lacks.
        self.scored_at: int | None = None  # where the text of this step's last token begins (None: not shown)
        self.held: list[tuple[int, dict]] = []

    def push(self, tokens: list[int], reason: str | None) -> int | None:
        """Take the tokens just appended to the sequence (Sequence.append; reason "stop" means the last one is a
        stop token, whose text is not shown): advance the grammar, extend the text. Where a stop string ended the
        text, how many of `tokens` the answer keeps: up to the one that completed it (a speculative step appends
        several, and those after it went out in `token_ids` and the usage); else None."""
        for token in tokens if self.matcher is not None else ():
            Constrainer.advance(self.matcher, token)
        self.scored_at = None
        shown = tokens[:-1] if reason == "stop" else tokens
        for i, token in enumerate(shown):
            before = len(self.text)
            if i == len(tokens) - 1:
                self.scored_at = before
            self.text += self.detok.push(token)
            if self.longest_stop and self._stopped(before):
                return i + 1
        if reason:
            before = len(self.text)
            self.text += self.detok.flush()
            if self.longest_stop and self._stopped(before):
                return len(tokens)
        return None

    def _stopped(self, before: int) -> bool:
        """Whether a stop string ends the text, given the text before the last piece came: the text is cut there."""
        found = self._find_stop(max(0, before - self.longest_stop + 1))
        if found is not None:
            cut, self.stopped_by = found
            self.text = self.text[:cut]
        return found is not None

    def emit(self, seq: Sequence, sample: Sample) -> int:
        """Stream what seq gained this step (text past the hold-back, or all of it once finished); returns the
        number of new tokens."""
        tokens = seq.output_ids[self.num_sent_tokens:]
        self.num_sent_tokens = len(seq.output_ids)
        end = len(self.text) if seq.finished else max(self.sent, len(self.text) - self._open_stop())
        self._emit(seq, self.text[self.sent:end], tokens, seq.finish_reason, self._scored(tokens[-1], sample, end))
        self.sent = end
        return len(tokens)

    def _scored(self, token: int, sample: Sample, end: int) -> list[dict] | None:
        """The log-probabilities of the tokens whose text begins before `end` (what is sent so far)."""
        scored = self._logprobs(token, sample)
        if scored is None:
            return None
        if self.scored_at is not None:
            self.held += [(self.scored_at, entry) for entry in scored]
        ready = next((i for i, (at, _) in enumerate(self.held) if at >= end), len(self.held))
        sent, self.held = [entry for _, entry in self.held[:ready]], self.held[ready:]
        return sent

    def progress(self, seq: Sequence) -> None:
        """A chunk of the prompt read and no token yet: an output with nothing in it, as llama-server reports its
        progress through a prompt, so that a reader's wait for the first token starts again (a CPU reads a long
        prompt for minutes, longer than that wait)."""
        if not self.done:
            self._send(RequestOutput(seq.seq_id, "", [], num_prompt_tokens=seq.num_prompt_tokens,
                                     num_cached_tokens=seq.num_cached_prompt))

    def requeue(self, seq: Sequence) -> None:
        """Preempted: an output that says so, since its next token waits for others to free KV memory, as a first
        token waits to be admitted (the engine backend's first_token_timeout, not its idle_timeout)."""
        if not self.done:
            self._send(RequestOutput(seq.seq_id, "", [], num_prompt_tokens=seq.num_prompt_tokens,
                                     num_cached_tokens=seq.num_cached_prompt, requeued=True))

    def finish(self, seq: Sequence, reason: str) -> None:
        """End without a new token (abort): flush what is held back."""
        self.text += self.detok.flush()
        self._emit(seq, self.text[self.sent:], [], reason, None)

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self.done = True
            self._send(exc)

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        """Where the earliest stop string begins, and which it is."""
        hits = [(i, s) for s in self.params.stop if s and (i := self.text.find(s, start)) >= 0]
        return min(hits, key=lambda hit: hit[0]) if hits else None

    def _open_stop(self) -> int:
        """How many characters at the end of the text are the start of some stop string."""
        text, held = self.text, 0
        for stop in self.params.stop:
            for k in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:k]):
                    held = k
                    break
        return held

    def _emit(self, seq: Sequence, text: str, token_ids: list[int], reason: str | None, logprobs) -> None:
        if self.done:
            return
        self.done = reason is not None
        self._send(RequestOutput(seq.seq_id, text, token_ids, reason is not None, reason, seq.num_prompt_tokens,
                                 seq.num_cached_prompt, len(seq.output_ids), logprobs,
                                 self.stopped_by if reason is not None else None))

    def _send(self, out: RequestOutput | BaseException) -> None:
        try:
            self.sink(out)
        except RuntimeError:  # the caller's event loop is gone; nobody is listening any more
            pass

    def _logprobs(self, token: int, sample: Sample) -> list[dict] | None:
        if not (self.params.logprobs or self.params.top_logprobs) or sample.logprob is None:
            return None
        top = [{**self._token(t), "logprob": lp} for t, lp in sample.top_logprobs]
        return [{**self._token(token), "logprob": sample.logprob, "top_logprobs": top}]

    def _token(self, token_id: int) -> dict:
        """A token's text, and its bytes where that text is not whole characters (a character split across tokens
        decodes to U+FFFD)."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        raw = self.tokenizer.token_bytes(token_id) if "\ufffd" in text else None
        return {"token_id": token_id, "token": text, **({"bytes": raw} if raw is not None else {})}
