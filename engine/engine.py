"""The engine loop: scheduler -> model runner -> sampler -> postprocess, in one background thread.

Callers on any thread use `add_request` / `abort` / `embed` (they only post to an inbox, `add_request` after compiling
the request's grammar); asyncio callers use `generate`, which the loop feeds through its event loop's mailbox
(engine/mailbox.py: one wake-up a step).
Only the loop thread touches the scheduler, the block manager and the KV cache, so none of them needs a lock.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from engine.config import EngineConfig
from engine.constrained import Constrainer
from engine.draft_model import DraftModelProposer, load_draft
from engine.kv_cache import BlockManager
from engine.loader import load
from engine.mailbox import mailbox_for
from engine.model_runner import ModelRunner, StepInput, num_blocks_for
from engine.requests import RequestOutput, RequestState, Sink
from engine.sampling import Sample, SampleRow, Sampler, SamplingParams
from engine.scheduler import ScheduledItem, Scheduler, StepPlan
from engine.sequence import Sequence
from engine.speculative import Draft, Speculator, eligible
from engine.threads import ThreadBudget, in_passing_thread
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, model_info: dict, config: EngineConfig,
                 num_blocks: int, draft: DraftModelProposer | None = None):
        self.runner, self.tokenizer, self.config = runner, tokenizer, config
        self.model_info = model_info | {"kv_blocks": num_blocks, "block_size": config.block_size}
        self.blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_cache)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_step_tokens, config.prefill_chunk)
        self.sampler = Sampler(config.seed)
        self.speculator = Speculator(config.speculative, draft) if config.speculative else None
        self._constrainer: Constrainer | None = None  # built on the first request with a grammar
        self._constrainer_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox_lock, self._closed = threading.Lock(), False  # closed: the loop has stopped taking the inbox
        self._stepping: list[Sequence] = []  # the sequences of the step under way
        self._stats = {"steps": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0,
                       "preemptions": 0}
        self._snapshot = self._metrics_now()
        self._thread = threading.Thread(target=self._loop, name="velo-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(cls, path: str, config: EngineConfig | None = None) -> "LLMEngine":
        """Load a .gguf file or a Hugging Face folder and start the engine thread. The building (weights, KV
        cache) happens on a passing thread, so the caller's thread keeps no OpenMP team (engine/threads.py)."""
        return in_passing_thread(cls._build, path, config or EngineConfig())

    @classmethod
    def _build(cls, path: str, config: EngineConfig) -> "LLMEngine":
        dtype = config.torch_dtype()
        loaded = load(path, dtype, config.device, progress=config.progress, int4=config.int4_weights)
        num_blocks = num_blocks_for(loaded.model, config.kv_memory, config.block_size, dtype, config.device,
                                    config.kv_int8)
        spec = config.speculative
        draft = None if not spec or spec.method != "draft" else load_draft(
            spec.draft_model, loaded.model, loaded.tokenizer, num_blocks, config.block_size, dtype, config.device,
            config.progress, spec.draft_vocab, config.int4_weights, config.cuda_graphs, spec.max_batch)
        runner = ModelRunner(loaded.model, num_blocks, config.block_size, config.kv_int8, config.compile,
                             config.cuda_graphs, config.max_num_seqs)
        if config.compile:
            runner.warm_up()
        for graphs in (runner.graphs, draft and draft.runner.graphs):  # the draft's too: none captured mid-request
            if graphs is not None:
                graphs.capture_all()
        return cls(runner, loaded.tokenizer, loaded.info, config, num_blocks, draft)

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + output) one request may reach: the model's context or the KV cache."""
        return min(self.model_info["context_length"], self.blocks.num_blocks * self.blocks.block_size + 1)

    # -- public API (any thread) ---------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams, sink: Sink, cache_scope: str = "") -> int:
        """Queue a request; `sink` is called from the engine thread with each RequestOutput (or an
        exception if the engine fails). Returns the request id for `abort`. It reuses and leaves prompt prefixes
        in the radix cache only within `cache_scope` (an API key's)."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        room = self.max_context - len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds the context length {self.max_context} "
                             f"(model context {self.model_info['context_length']}, or KV memory if smaller)")
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.tokenizer.eos_token_ids))
        matcher = None
        if params.grammar is not None:  # an invalid schema fails here, in the caller's thread
            with self._constrainer_lock:  # one view of the tokenizer, whichever thread asks first
                if self._constrainer is None:
                    self._constrainer = Constrainer(self.tokenizer, self.runner.model.cfg.vocab_size)
            matcher = self._constrainer.matcher(params.grammar)
        seq = Sequence(next(self._ids), list(prompt_ids), min(params.max_tokens, room), frozenset(stops),
                       request=RequestState(params, self.tokenizer, sink, matcher), cache_scope=cache_scope)
        self._post("add", seq)
        return seq.seq_id

    def abort(self, request_id: int) -> None:
        """Cancel a request; its blocks are freed before the next step."""
        self._inbox.put(("abort", request_id))

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       cache_scope: str = "") -> AsyncIterator[RequestOutput]:
        """Stream RequestOutputs; leaving the loop early (break, cancel, close) aborts the request. A request with a
        grammar is added from a worker thread: the first builds llguidance's view of the tokenizer (~0.3 s), and
        each compiles its grammar, which the caller's event loop, serving everyone else, should not wait on."""
        import asyncio
        loop, outputs = asyncio.get_running_loop(), asyncio.Queue()
        box = mailbox_for(loop)
        args = (prompt_ids, params, lambda out: box.post(outputs, out), cache_scope)
        if params.grammar is None:
            request_id = self.add_request(*args)
        else:
            adding = loop.run_in_executor(None, self.add_request, *args)
            try:
                request_id = await asyncio.shield(adding)
            except asyncio.CancelledError:  # the caller left while it was being added: abort it once it is
                def abort_added(f: asyncio.Future) -> None:
                    if not f.cancelled() and f.exception() is None:
                        self.abort(f.result())
                adding.add_done_callback(abort_added)
                raise
        done = False
        try:
            while not done:
                out = await outputs.get()
                if isinstance(out, BaseException):
                    raise out
                done = out.finished
                yield out
        finally:
            if not done:
                self.abort(request_id)

    def embed(self, texts: list[str] | list[list[int]], normalize: bool = True,
              window: int | None = None) -> list[list[float]]:
        """One vector per text, or per list of token ids (embedded as they are): the mean of the final (normed)
        hidden states over its first `window` tokens (at most the context), L2-normalised unless `normalize` is
        False.
        A causal LM's pooled states make usable but not state-of-the-art embeddings. Runs between steps on the
        engine thread (engine/threads.py says why), so the caller blocks until then."""
        done: Future = Future()
        limit = min(window or self.model_info["context_length"], self.model_info["context_length"])
        self._post("call", (functools.partial(self._embed, normalize=normalize, window=limit), texts, done))
        while True:
            try:
                return done.result(timeout=1)
            except FutureTimeout:
                if not self.alive:
                    raise RuntimeError("engine shut down") from None

    def _embed(self, texts: list[str] | list[list[int]], normalize: bool, window: int) -> list[list[float]]:
        vectors = []
        for text in texts:
            ids = (text if isinstance(text, list) else self.tokenizer.encode(text))[:window] or [0]
            hidden = self.runner.hidden_states(ids).float().mean(dim=0)
            vectors.append((torch.nn.functional.normalize(hidden, dim=0) if normalize else hidden).tolist())
        return vectors

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def metrics(self) -> dict:
        """A snapshot taken after the last step (running/waiting, KV use and waste, cache hits, tokens)."""
        return dict(self._snapshot)

    def shutdown(self) -> None:
        self._inbox.put(("stop", None))
        self._thread.join(timeout=30)

    def _post(self, kind: str, arg: object) -> None:
        """Onto the inbox, or RuntimeError once the loop stopped taking it: a request queued behind the stop was never
        read, and its caller waited forever (the engine backend's until its first_token_timeout, 5 minutes)."""
        with self._inbox_lock:
            if self._closed:
                raise RuntimeError("engine shut down")
            self._inbox.put((kind, arg))

    # -- the loop (engine thread only) ---------------------------------------------------------

    def _loop(self) -> None:
        if self.config.num_threads:  # OpenMP's thread count is per calling thread: the caller's stays as it was
            torch.set_num_threads(self.config.num_threads)
        budget = ThreadBudget(torch.get_num_threads())
        while self._drain_inbox(block=not self.scheduler.has_work, on_wake=budget.restart):
            budget.apply()
            try:
                self._step()
            except Exception as exc:  # fail every live request rather than hang their streams
                log.exception("engine step failed")
                # with those the step finished before it could say so: they are in no queue any more
                for seq in [*self.scheduler.running, *self.scheduler.waiting, *self._stepping]:
                    self.scheduler.abort(seq.seq_id)
                    seq.request.fail(exc)
            self._snapshot = self._metrics_now()
        self._close_inbox()
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self.scheduler.abort(seq.seq_id)
            seq.request.fail(RuntimeError("engine shut down"))

    def _drain_inbox(self, block: bool, on_wake: Callable[[], None]) -> bool:
        """Apply queued adds and aborts (waiting for one if `block`, then calling on_wake); False once shutdown
        was asked for."""
        while True:
            try:
                kind, arg = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if block:
                on_wake()
            block = False
            if kind == "stop":
                return False
            if kind == "add":
                self.scheduler.add(arg)
            elif kind == "call":
                fn, args, done = arg
                try:
                    done.set_result(fn(args))
                except Exception as exc:  # the caller's to handle
                    done.set_exception(exc)
            elif (seq := self.scheduler.abort(arg)) is not None:
                seq.request.finish(seq, "abort")

    def _close_inbox(self) -> None:
        """Stop taking the inbox, and fail the requests and calls that came after the stop."""
        with self._inbox_lock:
            self._closed = True
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                arg.request.fail(RuntimeError("engine shut down"))
            elif kind == "call":
                arg[2].set_exception(RuntimeError("engine shut down"))

    def _step(self) -> None:
        drafts = self._propose()
        plan = self.scheduler.schedule({sid: d.tokens for sid, d in drafts.items()})
        self._stepping = [item.seq for item in plan.items]
        self._stats["preemptions"] += len(plan.preempted)
        for seq in plan.preempted:
            seq.request.requeue(seq)
        if not plan.is_empty:
            logits = self.runner.execute(_step_inputs(plan), plan.copies)
            samples = self._sample(plan.sampling, logits, drafts)
            self._postprocess(plan, samples)
        self._stepping = []  # streamed: they need not outlive the step (their sinks hold their event loops)

    def _propose(self) -> dict[int, Draft]:
        """Speculative drafts for the running, decoding, eligible sequences (none without speculation or
        while more sequences decode than config.max_batch)."""
        if self.speculator is None:
            return {}
        decoding = [s for s in self.scheduler.running if not s.is_prefilling]
        if len(decoding) > self.speculator.config.max_batch:
            return {}
        seqs = [s for s in decoding if eligible(s.request.params)]
        return self.speculator.propose(seqs, [_row(s) for s in seqs], self.sampler.generator)

    def _sample(self, items: list[ScheduledItem], logits: torch.Tensor, drafts: dict[int, Draft]) -> list[Sample]:
        """Per sampling item, its new token (constrained where the request has a grammar) or, for an
        item with a draft, the verified tokens. Logits hold 1 + len(draft) rows per item."""
        starts = list(itertools.accumulate((1 + len(item.draft) for item in items), initial=0))
        plain = [i for i, item in enumerate(items) if not item.draft]
        out: list[Sample] = [Sample([])] * len(items)
        if plain:
            seqs = [items[i].seq for i in plain]
            rows = logits[[starts[i] for i in plain]]
            if any(s.request.matcher for s in seqs):
                rows = self._constrainer.mask(rows, [s.request.matcher for s in seqs])
            result = self.sampler(rows, [_row(s) for s in seqs])
            for row, i in enumerate(plain):
                out[i] = result.sample(row)
        for i, item in enumerate(items):
            if item.draft:
                out[i] = Sample(self.speculator.verify(item.seq, logits[starts[i]:starts[i + 1]],
                                                       drafts[item.seq.seq_id], _row(item.seq), self.sampler.generator))
        return out

    def _postprocess(self, plan: StepPlan, samples: list[Sample]) -> None:
        """The scheduler appends the tokens and finishes sequences (Sequence.append decides which); then each
        sampled request streams what it gained."""
        self._stats["steps"] += 1
        for seq in (item.seq for item in plan.sampling if not item.seq.output_ids):  # a prompt, counted once
            self._stats["prompt_tokens"] += seq.num_prompt_tokens
            self._stats["cached_prompt_tokens"] += seq.num_cached_prompt
        self.scheduler.postprocess(plan, {item.seq.seq_id: s.tokens for item, s in zip(plan.sampling, samples)})
        for item, sample in zip(plan.sampling, samples):
            self._stats["generated_tokens"] += item.seq.request.emit(item.seq, sample)
        for item in plan.items:
            if not item.samples and item.seq.request is not None:  # a prompt's chunk: its progress
                item.seq.request.progress(item.seq)
        if self.speculator is not None:
            self.speculator.retain({s.seq_id for s in self.scheduler.running})

    def _metrics_now(self) -> dict:
        b = self.blocks
        return self._stats | {
            "running": self.scheduler.num_running, "waiting": self.scheduler.num_waiting,
            "kv_blocks_total": b.num_blocks, "kv_blocks_free": b.num_free_blocks, "kv_usage": b.usage,
            "kv_waste": b.kv_waste(), "cache_hit_tokens": self._stats["cached_prompt_tokens"]} \
            | (self.speculator.stats.as_dict() if self.speculator else {})


def _step_inputs(plan: StepPlan) -> list[StepInput]:
    return [StepInput(item.token_ids, item.start, item.slots, item.seq.block_table, item.samples, 1 + len(item.draft),
                      prompt=item.start < item.seq.num_prompt_tokens) for item in plan.items]


def _row(seq: Sequence) -> SampleRow:
    return SampleRow(seq.request.params, seq.prompt_ids, seq.output_ids, seq.request.generator)
