"""One reply, from its request to its Finish: the engine's loop as an object.

An LLM writes one token per forward pass: run the model on the context, get a probability
for every token of its vocabulary, draw one, append it, repeat. `ReplyRun.events()` is
that loop, phase by phase:

    open        the prompt fitted to the context: Start (and ContextTrimmed)
    prefill     the prompt through the model, reusing the KV cache as far as it holds it
    then one step per forward pass, until the reply ends:
      draw        the sampler on the pass's logits (a branch's first token is given; in
                  step mode, wait for the user's hand first: Pending events meanwhile)
      record      the Step: the token, its text, both distributions, the times
      feed back   the token through the model: the next pass's logits
    finish      Finish

The run's state lives in named collaborators, each usable without a model: `ReplySettings` (the
live settings, the seed, the generator), `StepGate` (step mode), `Branch` (a reply prefix and a given
first token), `PassThreads` (the thread tuner's record per pass), `ReplyText` (UTF-8 and stop strings),
`RunDie` (the die of each draw in its events' shape: run_die.py), the DRY context (`dry.History`) and
the repeat finder; its clocks in `RunClock`. The model is reached
only through `RunHost` (run_host.py): the Engine, or a host that replays recorded logits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from loopchat.batch import BatchPass
from loopchat.engine import dry
from loopchat.engine.branch import Branch
from loopchat.engine.chat_prompt import prompt_of
from loopchat.engine.lens_run import NoLens
from loopchat.engine.pass_threads import PassThreads
from loopchat.engine.prompt_scores import PlainFeed, ScoredFeed
from loopchat.engine.repeats import RepeatFinder
from loopchat.engine.reply_text import ReplyText
from loopchat.engine.run_die import RunDie
from loopchat.engine.run_drafts import RunDrafts
from loopchat.engine.run_host import RunHost
from loopchat.engine.run_settings import ReplySettings
from loopchat.engine.sampler import SampleResult, sample
from loopchat.engine.sampler_watch import watched
from loopchat.engine.step_gate import Drawn, PendingDraw, StepGate
from loopchat.errors import ContextOverflowError, EngineError
from loopchat.events import Event, Finish, FinishReason, Pending, Prefill, Start, Step, decode_rate
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings, new_seed
from loopchat.step_control import HAND, StepControl


@dataclass(slots=True)
class RunClock:
    """The run's clocks (perf_counter seconds) and the times its events report."""

    request: float
    first: float = 0.0  # the first step recorded
    last: float = 0.0  # the latest step recorded
    paused_first_s: float = 0.0  # the waits for the user before the first step
    paused_last_s: float = 0.0  # ... and before the latest (a later one is not in decode_ms)
    ttft_ms: float = 0.0
    prefill_ms: float = 0.0
    forward_ms: float = 0.0  # the pass behind the next step's logits (step 0: the prefill)
    forward_tokens: int = 0

    def decode_ms(self) -> float:
        return (self.last - self.first - (self.paused_last_s - self.paused_first_s)) * 1000.0


class ReplyRun:
    """One reply's run on `host`. `live`: the settings source read before every draw (None:
    the request's settings throughout); `control`: step mode (step_control.py)."""

    def __init__(
        self,
        host: RunHost,
        request: ReplyRequest,
        live: Callable[[], SamplingSettings] | None = None,
        control: StepControl | None = None,
    ) -> None:
        self.host = host
        self.request = request
        fixed = request.settings
        self.settings = ReplySettings(live if live is not None else (lambda: fixed), new_seed())
        self.gate = StepGate(control, host.cancelled)
        self.clock = RunClock(time.perf_counter())
        self.reason: FinishReason | None = None
        self.error: str | None = None
        self.steps = 0  # steps recorded by this run
        self.completion = 0  # tokens of the reply so far, the prefix's included (not a stop token)
        self.stopped = False  # a stop string ended the reply
        # set by open(), prefill():
        self.branch = Branch()
        self.watch: tuple[tuple[str, int], ...] = ()  # tokens on watch: (the string, its first token)
        self.tokens: list[int] = []
        self.context: dry.History = dry.History()
        self.repeats = RepeatFinder()
        self.text = ReplyText()
        self.threads = PassThreads(None, 0)
        self.lens: NoLens = NoLens()  # the logit lens of each pass, when asked (lens_run.py)
        self.constraint: Any = None  # the constraint stage, when asked (sampler_constraint.py)
        self.drafts = RunDrafts(host, request)  # speculative decoding's verifying passes (run_drafts.py)
        self.die = RunDie(host, request.step_detail)  # the die in the events' shape (run_die.py)

    # ---------------------------------------------------------------- driver ----
    def events(self) -> Iterator[Event | Pending]:
        """The reply's events: Start, [ContextTrimmed], Prefill, a Step per token
        (Pendings before a draw in step mode), Finish."""
        yield from self.open()
        yield self.prefill()
        while self.reason is None:
            drawn = yield from self.draw()
            if drawn is None:  # cancelled while waiting for the user
                self.reason = FinishReason.CANCELLED
                break
            step = self.record(drawn)
            yield from self.drafts.took(step, drawn.result, self.reason is not None, self.clock)
            if self.reason is not None:
                break
            if not self.drafts.open:  # (the pass's next row gives the next draw: nothing to feed)
                self.feed_back(drawn.result.token_id)
        yield self.finish()

    # ---------------------------------------------------------------- phases ----
    def open(self) -> Iterator[Event]:
        """Fit the prompt to the context (EngineError, before any event, for input the model
        cannot run); the Start event, and ContextTrimmed if the prompt was cut."""
        host, request = self.host, self.request
        prompt = prompt_of(request, host, self.settings.now.max_tokens)  # (EngineError: one it cannot run)
        self.branch = Branch.of(request, host.n_vocab)
        self.tokens = prompt.tokens + list(self.branch.prefix)
        if len(self.tokens) >= host.n_ctx:
            raise ContextOverflowError(
                f"the reply to continue does not fit the context: the prompt and the reply so far are "
                f"{len(self.tokens)} tokens and the model's context holds {host.n_ctx}"
            )
        if request.constraint is not None:  # (ConstraintError: a grammar it cannot use, before any event)
            self.constraint = host.open_constraint(request.constraint)
            self._constrain_branch()
        self.drafts.check(self.settings.now)  # (EngineError: a draft model asked for, none attached)
        host.prefill_threads()  # auto threads: the count in force (auto_threads.py)
        self.watch = tuple((text, host.first_token(text)) for text in request.watch)  # (texts not empty: watch.py)
        lens = host.open_lens() if request.lens else NoLens()
        self.lens, lens_note = (NoLens(), lens) if isinstance(lens, str) else (lens, None)
        yield Start(
            model_name=host.name,
            model_path=str(host.model_path),
            model_size_bytes=host.model_size,
            n_ctx=host.n_ctx,
            n_vocab=host.n_vocab,
            threads=host.threads,
            threads_auto=host.threads_auto,
            flash_attn=host.flash_attn,
            huge_pages_mb=host.huge_pages_mb,
            messages=prompt.messages,
            prompt_text=prompt.text,
            prompt_token_ids=tuple(prompt.tokens),
            prompt_token_texts=host.token_texts(prompt.tokens),
            prompt_special=tuple(i for i, t in enumerate(prompt.tokens) if host.is_control(t)),
            settings=self.settings.now,
            top_k_report=request.report_k,
            stop=tuple(request.stop),
            reply_prefix=self.branch.prefix,
            lens_note=lens_note,
            watch=self.watch or None,
        )
        if prompt.trimmed is not None:
            yield prompt.trimmed

    def prefill(self) -> Prefill:
        """The prompt (and a branch's prefix) through the model in batches, after the
        longest common prefix the KV cache already holds (at least one token is evaluated,
        for fresh logits; `reuse_at_most` caps the reuse)."""
        host, tokens = self.host, self.tokens
        feed = self._feed()  # plain, or scoring each prompt token (prompt_scores.py)
        n_common = _common_prefix(host.cached_tokens(), tokens)
        n_common = min(n_common, len(tokens) - 1)
        if self.request.reuse_at_most is not None:
            n_common = max(0, min(n_common, self.request.reuse_at_most))
        n_common = feed.reuse(n_common)
        host.keep_cached(n_common)
        todo = tokens[n_common:]
        batches = 0
        t0 = time.perf_counter()
        try:
            for i in range(0, len(todo), feed.chunk):
                if host.cancelled():
                    self.reason = FinishReason.CANCELLED
                    break
                feed.evaluate(n_common + i, todo[i : i + feed.chunk])
                batches += 1
            host.sync()
        except RuntimeError as exc:
            self.reason, self.error = host.decode_failure(exc)
        if self.request.score_only and self.reason is None:  # (the prompt scored: nothing is drawn)
            self.reason = FinishReason.LENGTH
        clock = self.clock
        clock.prefill_ms = clock.forward_ms = (time.perf_counter() - t0) * 1000.0
        clock.forward_tokens = len(todo)
        self.ready()
        return Prefill(
            prompt_tokens=len(tokens),
            reused_tokens=n_common,
            evaluated_tokens=len(todo) if self.reason is None else host.n_past - n_common,
            batches=batches,
            ms=clock.prefill_ms,
            **feed.fields(),
        )

    def _feed(self) -> PlainFeed:
        k = self.request.prompt_logprobs
        if k is None:
            return PlainFeed(self.host)
        return ScoredFeed(self.host, self.tokens, k, lambda ids, lps: self.die.candidates(np.asarray(ids), np.exp(lps)))

    def ready(self) -> None:
        """The state the steps start from, once the prompt is in the context."""
        host, prefix = self.host, self.branch.prefix
        self.text = ReplyText(self.request.stop, b"".join(host.piece(t) for t in prefix))
        self.context = dry.History(self.tokens, host)  # DRY finds the model's sequence breakers through it
        self.repeats = RepeatFinder(prefix)  # the reply repeating itself (repeats.py): on each Step
        self.threads = PassThreads(host.tuner, host.threads)
        self.lens.start(self.tokens, len(self.tokens) - len(prefix))
        self.clock.first = self.clock.last = time.perf_counter()

    def draw(self) -> Generator[Pending, None, Drawn | None]:
        """The sampler on this pass's logits with the settings in force now. A branch's
        first token is given (chosen_by "hand"); in step mode the loop may stop here and
        wait for the user (Pending events; None: cancelled meanwhile)."""
        if self.gate.control is None or self.drafts.open or self.branch.given(self.steps) is not None:
            return self.draw_now()  # (it does not stop: a verifying pass's draws are made as one)
        if not self.gate.stops():
            return self.draw_now()
        self.settings.refresh()
        started = time.perf_counter()
        k, cons = self.request.report_k, self.constraint
        pending = PendingDraw(self.host.logits(), self.context, k, self.host.n_vocab, self._pending, cons)
        return (yield from self.gate.hold(pending, self.settings, started))

    def draw_now(self) -> Drawn:
        """draw() where it does not wait (no step mode, a given token, a verifying pass's draws, or
        step mode letting this draw through), as a plain call: a shared run's takes it directly,
        no generator made and stopped a token."""
        settings = self.settings.refresh()
        started = time.perf_counter()
        logits = self.drafts.row() if self.drafts.open else self.host.logits()
        k, cons = self.request.report_k, self.constraint
        given = self.branch.given(self.steps)
        if given is not None:
            res = sample(logits, self.context, settings, self.settings.rng, k, force=given, constraint=cons)
            return Drawn(res, HAND, started)
        chosen_by = self.gate.credit()
        return Drawn(sample(logits, self.context, settings, self.settings.rng, k, constraint=cons), chosen_by, started)

    def record(self, drawn: Drawn, batch: BatchPass | None = None) -> Step:
        """The Step of the token drawn: its text, both distributions, the times (`batch`: the
        batched pass behind its logits, if any); sets `reason` if the reply ends with it."""
        host, res, settings, clock = self.host, drawn.result, self.settings.now, self.clock
        token = res.token_id
        is_stop = (not self.request.ignore_eos) and host.is_eog(token)
        if not is_stop:
            self.completion += 1
        ending = self._end_reason(is_stop, settings.max_tokens) is not None
        seen = watched(res, [t for _, t in self.watch]) if self.watch else None  # (in the draw's time)
        text, self.stopped = self.text.feed(None if is_stop else host.piece(token), ending)
        now = time.perf_counter()
        sample_ms = (now - drawn.started) * 1000.0 if drawn.sample_ms is None else drawn.sample_ms
        paused_s = self.gate.paused_s
        if self.steps == 0:
            clock.first, clock.paused_first_s = now, paused_s
            clock.ttft_ms = (now - clock.request - paused_s) * 1000.0
        clock.last, clock.paused_last_s = now, paused_s
        lens = self.lens.rows(token)  # (its time is the run's, in no pass's ms)
        self.lens.fed(token)
        self.context.append(token)
        step = Step(
            index=self.branch.base + self.steps,
            token_id=token,
            piece=host.piece_text(token),
            piece_bytes=host.piece(token),
            text=text,
            is_stop=is_stop,
            raw_prob=res.raw_prob,
            raw_rank=res.raw_rank,
            sampled_prob=res.sampled_prob,
            sampled_rank=res.sampled_rank,
            sample_ms=sample_ms,
            **self.die.of(res, self.clock.forward_ms, self.clock.forward_tokens),
            settings=settings,
            settings_changed=self.settings.changed(),
            n_past=host.n_past + (0 if is_stop else 1),
            elapsed_ms=(now - clock.request) * 1000.0,
            threads=self.threads.threads,
            threads_reason=self.threads.reason_to_record(),
            probe_cut_ms=self.threads.cut_ms,
            chosen_by=drawn.chosen_by,
            repeat=self._repeat(token),
            lens=lens,
            watched=seen,
            constraint=None if self.constraint is None else self.constraint.report,
            batch=batch,
        )
        self.steps += 1
        self.settings.recorded()
        # (a max_tokens change may have come meanwhile)
        self.reason = (
            FinishReason.STOP if self.stopped else self._end_reason(is_stop, self.settings.source().max_tokens)
        )
        if self.constraint is not None and not host.is_eog(token):  # (an end token is no text of the grammar's)
            self._constrain(token)
        return step

    def _constrain_branch(self) -> None:
        """The grammar moves on by a branch's prefix, then must take its given token: else EngineError."""
        cons, given = self.constraint, self.branch.given(0)
        if not all(cons.consume(t) for t in self.branch.prefix):
            raise EngineError(
                f"the reply so far does not follow the {cons.spec.label()} constraint: clear it to branch"
            )
        if given is not None and (refused := cons.refusal(given)) is not None:
            raise EngineError(f"{refused}: pick a token it allows, or clear the constraint")

    def _constrain(self, token: int) -> None:
        """The grammar moves on by the token: the reply ends where the grammar does (STOP), or
        with an error where the grammar could not go on (a token picked by hand it forbids)."""
        cons = self.constraint
        if not cons.consume(token) or cons.error is not None:
            self.reason = FinishReason.ERROR
            self.error = f"{cons.refusal(token)} ({cons.error})"
        elif cons.stopped and self.reason in (None, FinishReason.LENGTH):
            self.reason = FinishReason.STOP

    def feed_back(self, token: int) -> None:
        """The token through the model: the next step's logits (a failed pass ends the reply)."""
        self.threads.before_pass()
        tf = time.perf_counter()
        try:
            verified = self.drafts.feed(token, self)
            if verified is None:
                self.host.forward(token)  # auto threads: timed and fed to the tuner there
        except RuntimeError as exc:
            self.reason, self.error = self.host.decode_failure(exc)
            return
        if verified is not None:  # a verifying pass: its ms on its first step, at the count in force
            self.clock.forward_ms, self.clock.forward_tokens = verified
            self.threads.after_pass(self.host.threads, 0.0)
            return
        self.clock.forward_ms, self.clock.forward_tokens = (time.perf_counter() - tf) * 1000.0, 1
        self.drafts.plain(self.clock.forward_ms)
        self.threads.after_pass(*self.host.pass_threads())

    def finish(self) -> Finish:
        host, clock = self.host, self.clock
        text = self.text.close()
        host.end_reply()
        decode_ms = clock.decode_ms()
        assert self.reason is not None  # the loop ends only with a reason
        return Finish(
            reason=self.reason,
            prompt_tokens=len(self.tokens),
            completion_tokens=self.completion,
            steps=self.steps,
            prefill_ms=clock.prefill_ms,
            ttft_ms=clock.ttft_ms,
            decode_ms=decode_ms,
            total_ms=(time.perf_counter() - clock.request) * 1000.0,
            tokens_per_s=decode_rate(self.steps, decode_ms),
            text=text,
            n_past=host.n_past,
            n_ctx=host.n_ctx,
            error=self.error,
            paused_ms=self.gate.paused_s * 1000.0,
            constraint_closed=None if self.constraint is None else bool(self.constraint.matcher.is_accepting()),
        )

    # --------------------------------------------------------------- helpers ----
    def _end_reason(self, is_stop: bool, max_tokens: int) -> FinishReason | None:
        """Why the reply ends at the step just drawn (None: it goes on)."""
        if is_stop:
            return FinishReason.STOP
        if self.host.cancelled():
            return FinishReason.CANCELLED
        if self.branch.ends(self.completion, max_tokens):
            return FinishReason.LENGTH
        if self.host.n_past + 1 >= self.host.n_ctx:
            return FinishReason.CONTEXT
        return None

    def _pending(self, res: SampleResult, settings: SamplingSettings, sample_ms: float) -> Pending:
        return Pending(
            index=self.branch.base + self.steps,
            sample_ms=sample_ms,
            settings=settings,
            n_past=self.host.n_past,
            **self.die.of(res, self.clock.forward_ms, self.clock.forward_tokens),
        )

    def _repeat(self, token: int) -> tuple[int, int] | None:
        """Step.repeat for the token just drawn (None without `step_detail`: the finder not fed)."""
        if not self.request.step_detail:
            return None
        rep = self.repeats.feed(token)
        return None if rep is None else rep.as_tuple()


def _common_prefix(cached: np.ndarray, tokens: list[int]) -> int:
    """How many tokens at the start of `tokens` the cache already holds."""
    limit = min(len(cached), len(tokens))
    if not limit:
        return 0
    same = np.asarray(cached[:limit]) == np.asarray(tokens[:limit], dtype=cached.dtype)
    return limit if same.all() else int(np.argmin(same))
