"""Per-request postprocessing on the engine thread: detokenize, cut at stop strings, build outputs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.config import RequestOutput
from engine.sampling import SampleResult, SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


class RequestState:
    """Lives in `Sequence.payload`. Holds back only the text at the end that begins some stop string (it may
    still become one), so a stop string split across tokens is never streamed before it is recognised, and text
    that cannot start one is sent at once."""

    def __init__(self, params: SamplingParams, tokenizer: Tokenizer, sink: Callable):
        self.params, self.tokenizer, self.sink = params, tokenizer, sink
        self.detok = IncrementalDetokenizer(tokenizer)
        self.generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self.text, self.sent = "", 0
        self.longest_stop = max((len(s) for s in params.stop), default=0)
        self.done = False
        self.matcher = None  # llguidance matcher when the output must match a grammar (engine.constrained)

    def on_token(self, seq: Sequence, row: int, result: SampleResult | None, finished: Sequence | None,
                 num_new: int = 1) -> bool:
        """Handle the num_new tokens just appended to seq (several after speculative verification);
        True if a stop string ended the request here."""
        tokens = seq.output_ids[-num_new:]
        reason = finished.finish_reason if finished else None
        hit_stop_token = reason == "stop" and tokens[-1] in seq.stop_token_ids
        before = len(self.text)
        for token in tokens[:-1] if hit_stop_token else tokens:
            self.text += self.detok.push(token)
        if reason:
            self.text += self.detok.flush()
        cut = self._find_stop(max(0, before - self.longest_stop + 1))
        if cut is not None:
            self.text, reason = self.text[:cut], "stop"
        end = len(self.text) if reason else max(self.sent, len(self.text) - self._open_stop())
        self._emit(seq, self.text[self.sent:end], tokens, reason, self._logprobs(tokens[-1], row, result))
        self.sent = end
        return cut is not None

    def finish(self, seq: Sequence, reason: str) -> None:
        """End without a new token (abort): flush what is held back."""
        self.text += self.detok.flush()
        self._emit(seq, self.text[self.sent:], [], reason, None)

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self.done = True
            self._send(exc)

    def _find_stop(self, start: int) -> int | None:
        hits = [i for s in self.params.stop if s and (i := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

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
                                 seq.num_cached_prefix, len(seq.output_ids), logprobs))

    def _send(self, out) -> None:
        try:
            self.sink(out)
        except RuntimeError:  # the caller's event loop is gone; nobody is listening any more
            pass

    def _logprobs(self, token: int, row: int, result: SampleResult) -> list[dict] | None:
        if not (self.params.logprobs or self.params.top_logprobs) or result.logprobs is None:
            return None
        decode = self.tokenizer.decode
        top = [{"token_id": t, "token": decode([t], skip_special_tokens=False), "logprob": lp}
               for t, lp in result.top_logprobs[row]]
        return [{"token_id": token, "token": decode([token], skip_special_tokens=False),
                 "logprob": result.logprobs[row], "top_logprobs": top}]
