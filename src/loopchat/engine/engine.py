"""The instrumented generation loop on llama-cpp-python (imports nothing from Textual).

One `Engine` owns one `Llama` from load to close. Create it and call every method on
it from one and the same thread (see `worker.py`): a `Llama` is not thread-safe, and two
threads touching it leave two OpenMP pools fighting over the cores. Only `cancel()` may
be called from another thread.

`generate()` yields the events of `events.py`: Start, [ContextTrimmed], Prefill, one
Step per sampled token, Finish. The raw llama.cpp calls are in `_llama_ffi.py`; the chat
template and the context policy in `chat_prompt.py`; `EngineOptions` (what it takes to
create an Engine, picklable) in `engine_options.py`.
"""

from __future__ import annotations

import codecs
import ctypes
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loopchat.engine import dry, sampler
from loopchat.engine.chat_prompt import (
    CHATML_TEMPLATE,
    ChatTemplate,
    FittedPrompt,
    fit_document,
    fit_prompt,
    opening_mode,
)
from loopchat.engine.options import EngineOptions, physical_cores  # noqa: F401 - importable from here too
from loopchat.engine.repeats import RepeatFinder
from loopchat.engine.thread_tuner import AUTO, Threads, ThreadTuner
from loopchat.errors import ContextOverflowError, EngineError, ModelLoadError  # noqa: F401 - the engine's errors, importable from here
from loopchat.events import (
    DOCUMENT,
    Candidate,
    Event,
    Finish,
    FinishReason,
    Message,
    Pending,
    Prefill,
    Start,
    Step,
    decode_rate,
)
from loopchat.model_files import gguf_problem
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings, new_seed
from loopchat.step_control import HAND, SAMPLED, StepControl
from loopchat.stop_strings import StopStrings
from loopchat.token_faces import partial_bytes, vocabulary_text


class Engine:
    """Loads a GGUF model and runs the instrumented loop on it."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        n_ctx: int = 4096,
        threads: Threads | None = AUTO,
        thread_tuner: ThreadTuner | None = None,
        gpu_layers: int = 0,
        n_batch: int = 512,
        chat_template: str | None = None,
        mode: str | None = None,
        log_path: Path | None = None,
        verbose: bool = False,
        warmup: bool = True,
    ) -> None:
        from llama_cpp import Llama

        from loopchat.engine._llama_ffi import AbortFlag, LlamaCalls
        from loopchat.engine.auto_threads import AutoThreads
        from loopchat.engine.llama_log import python_prints_to_log, route_llama_log

        self.model_path = Path(model_path)
        self.name = name or self.model_path.stem
        # threads: a pinned count, or AUTO (None too): the engine measures its own passes
        # and changes the count between them (auto_threads.py, thread_tuner.py). `threads`
        # is the count in force; `thread_tuner` lets a test or benchmark tune the choice.
        self.threads_auto = threads is None or threads == AUTO
        self._tuner = (thread_tuner or ThreadTuner(physical_cores())) if self.threads_auto else None
        self._pinned = self._tuner.threads if self._tuner else int(threads)  # type: ignore[arg-type]
        self._auto: AutoThreads | None = None
        problem = gguf_problem(self.model_path)
        if problem is not None:
            raise ModelLoadError(f"{self.model_path} {problem}; point the model's `path` at a .gguf model file")
        self.model_size = self.model_path.stat().st_size
        log_path = route_llama_log(log_path, echo=verbose)  # None if the log cannot be written
        try:
            with python_prints_to_log():
                self.llm = Llama(
                    model_path=str(self.model_path),
                    n_ctx=n_ctx,
                    n_batch=n_batch,
                    n_threads=self._pinned,
                    n_threads_batch=self._pinned,
                    n_gpu_layers=gpu_layers,  # ignored by a CPU-only build of llama.cpp
                    logits_all=False,
                    verbose=True,  # verbose=False dup2()s fds 1 and 2; our callback logs instead
                )
        except (ValueError, RuntimeError, OSError) as exc:
            where = f" (details in {log_path})" if log_path else ""
            raise ModelLoadError(
                f"llama.cpp could not load {self.model_path}: {str(exc).splitlines()[0]}{where}; "
                "check that it is a complete, uncorrupted GGUF file"
            ) from None
        self.llm.verbose = False  # no more prints from llama-cpp-python after the load
        self._c = LlamaCalls(self.llm)  # the raw llama.cpp calls (_llama_ffi.py)
        self._logits_address: int | None = None
        self._logits_view = np.zeros(0, dtype=np.float32)
        # One context size for everything: the number asked for. llama.cpp pads the
        # context it allocates (to a multiple of 256 in this version: 300 -> 512), but
        # llama-cpp-python sizes its token buffer (`input_ids`) to the number asked for,
        # so past it Llama.eval and _decode_one write out of bounds (an IndexError at
        # token 300). Capping at the requested size (rather than asking llama.cpp for its
        # padded size up front) keeps the number the user configured as the one shown
        # and enforced, and does not depend on llama.cpp's padding rule, which changes
        # between versions. The padding is a few KV-cache rows never used. Llama's own
        # n_ctx() still says 512: read self.n_ctx, never llm.n_ctx().
        self.n_ctx = min(self.llm.n_ctx(), len(self.llm.input_ids))
        self.n_vocab = self.llm.n_vocab()
        self.n_batch = n_batch
        self._pieces: dict[int, bytes] = {}
        self._abort = AbortFlag()
        self._c.set_abort_callback(self._abort)
        self._cancel = threading.Event()
        if self._tuner is not None:  # its probe guard shares the abort flag with cancel()
            self._auto = AutoThreads(self._c, self._abort, self._cancel.is_set, self._tuner)
        self._control: StepControl | None = None  # the reply in flight's step mode, if any
        #: while stopped in step mode: (logits, context tokens, settings) of the pending draw
        self._probe: tuple[np.ndarray, list[int], SamplingSettings] | None = None
        self.passes = 0  # llama_decode calls so far (prefill batches and steps): tests count them
        own_template = self.llm.metadata.get("tokenizer.chat_template")
        self.chat_template = chat_template or own_template or CHATML_TEMPLATE
        self.template_source = "models.toml" if chat_template else ("gguf" if own_template else "fallback")
        #: the mode the chat opens this model in (models.toml's `mode`, else chosen by its template)
        self.opening_mode = opening_mode(mode, self.template_source)
        try:
            self._template = ChatTemplate(
                self.chat_template,
                bos_token=self._special_text(self.llm.token_bos()),
                eos_token=self._special_text(self.llm.token_eos()),
                model=self.name,
                configured=bool(chat_template),
            )
        except ModelLoadError:
            self.close()
            raise
        self.add_bos = self._metadata_flag("tokenizer.ggml.add_bos_token", default=False)
        if warmup:
            # llama.cpp's own tools warm up too: the first forward pass pays for
            # allocations and page faults that would otherwise land in the first TTFT.
            self._eval([max(self.llm.token_bos(), 0)])
            if self._auto is not None:  # the tuner's first measurement (auto_threads.py)
                self._auto.calibrate(max(self.llm.token_bos(), 0), self.n_ctx)
            self.reset()

    @property
    def threads_reason(self) -> str:
        """Why the count in force (auto: the tuner's latest reason; pinned: "")."""
        return self._tuner.reason if self._tuner is not None else ""

    @property
    def threads(self) -> int:
        """The llama.cpp thread count in force (auto: the tuner's latest)."""
        return self._auto.threads if self._auto is not None else self._pinned

    def _metadata_flag(self, key: str, *, default: bool) -> bool:
        value = self.llm.metadata.get(key)
        if value is None:
            return default
        return str(value).lower() in ("true", "1")

    def _special_text(self, token_id: int) -> str:
        """A special token's text for the template (BOS, EOS; '' if the model has none)."""
        return self.piece_text(token_id) if token_id >= 0 else ""

    def render_prompt(self, messages: Sequence[Message]) -> str:
        """The exact text the chat template renders for this conversation."""
        return self._template.render(messages)

    def tokenize(self, text: str) -> list[int]:
        """The exact token ids fed to the model for `text` (special tokens parsed)."""
        bos = self.llm.token_bos()
        tokens = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if self.add_bos and bos >= 0 and (not tokens or tokens[0] != bos):
            tokens.insert(0, bos)
        return tokens

    def piece(self, token_id: int) -> bytes:
        """The bytes of one token (special tokens spelled out), cached."""
        b = self._pieces.get(token_id)
        if b is None:
            b = self._pieces[token_id] = self._c.token_to_piece(token_id)
        return b

    def piece_text(self, token_id: int) -> str:
        return self.piece(token_id).decode("utf-8", errors="replace")

    def token_texts(self, tokens: Sequence[int]) -> tuple[str, ...]:
        """What each token adds to the text: its bytes decoded, a character split between
        tokens given to the token that completes it (so the texts join to the exact text)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out = [decoder.decode(self.piece(t)) for t in tokens]
        if out:
            out[-1] += decoder.decode(b"", final=True)
        return tuple(out)

    def is_eog(self, token_id: int) -> bool:
        return self._c.is_eog(token_id)

    def fit_prompt(self, messages: Sequence[Message], max_tokens: int) -> FittedPrompt:
        """Render and tokenize; apply the context policy (CONTEXT_POLICY) if needed. A
        single DOCUMENT message is tokenized as it is (completion mode: no template)."""
        if len(messages) == 1 and messages[0].role == DOCUMENT:
            return fit_document(messages[0].content, self.n_ctx, self.tokenize)
        return fit_prompt(messages, max_tokens, self.n_ctx, self.render_prompt, self.tokenize)

    @property
    def template_note(self) -> str:
        """What a user should know about the chat template ('' when the model has its own
        or models.toml sets one)."""
        if self.template_source != "fallback":
            return ""
        return (
            f"{self.name} has no chat template in its GGUF file: chat messages are written in "
            "ChatML (<|im_start|>...), which a base model has never seen; set chat_template "
            "for it in models.toml, or give it a document to continue (loopchat run --raw)"
        )

    # ------------------------------------------------------------------ loop ----
    def cancel(self) -> None:
        """Stop the generation in progress within one step (or one prefill batch node).

        Safe to call from any thread."""
        self._cancel.set()
        self._abort.set()
        control = self._control
        if control is not None:
            control.wake()  # a loop waiting in step mode reads the cancel

    def reset(self) -> None:
        """Forget the KV cache (the next turn evaluates its whole prompt)."""
        self.llm.reset()
        self._c.forget_from(0)

    def _eval(self, tokens: Sequence[int]) -> None:
        self.passes += 1
        self.llm.eval(tokens)

    def _decode_one(self, token: int) -> None:
        """One token through the model: the per-step forward pass, with as little
        Python around llama_decode as possible (Llama.eval rebuilds its batch and
        trims the cache on every call). Keeps Llama's own token bookkeeping."""
        llm = self.llm
        self.passes += 1
        auto = self._auto  # auto threads: timed, fed to the tuner, a probe's pass guarded
        rc = auto.decode(token, llm.n_tokens) if auto else self._c.decode_one(token, llm.n_tokens)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        llm.input_ids[llm.n_tokens] = token
        llm.n_tokens += 1

    def _logits(self) -> np.ndarray:
        """The last token's logits, a view of llama.cpp's buffer (valid until the next
        decode). The view is kept while llama.cpp returns the same address: a new one
        each step (np.ctypeslib.as_array), and the pointer object llama_cpp's binding
        returns, were reference cycles: garbage that only the cycle collector frees, on
        the engine thread: `logits_address` returns a plain int."""
        address = self._c.logits_address()
        if address != self._logits_address:
            self._logits_address = address
            self._logits_view = np.frombuffer((ctypes.c_float * self.n_vocab).from_address(address), dtype=np.float32)
        return self._logits_view

    def _sync(self) -> None:
        self._c.synchronize()

    def generate(
        self,
        messages: Sequence[Message],
        settings: Callable[[], SamplingSettings] | SamplingSettings,
        *,
        control: StepControl | None = None,
        **fields: Any,
    ) -> Iterator[Event]:
        """`run_reply` with the request built from its fields (ReplyRequest's names): a
        short form for tests and benchmarks. `settings`: a snapshot, or a live source."""
        live = None if isinstance(settings, SamplingSettings) else settings
        start = settings if live is None else live()
        request = ReplyRequest(tuple(messages), start, **fields)
        return self.run_reply(request, live=live, control=control)

    def run_reply(
        self,
        request: ReplyRequest,
        *,
        live: Callable[[], SamplingSettings] | None = None,
        control: StepControl | None = None,
    ) -> Iterator[Event]:
        """Run one reply (request.py says what each field asks for).

        `live`: the settings source read at every step (a LiveSettings: a change applies
        at the next pass); None: `request.settings` throughout.

        `stop`: the reply ends before the first occurrence of a stop string (reason
        STOP); text that may begin one is held back from the steps' texts until it is
        known not to. `reply_prefix` (a branch) follows the prompt, reuses the KV cache
        as far as it holds it (the Prefill says how many were evaluated); the steps' and
        the Finish's texts are this run's only (the prefix's text is the caller's).
        `first_token`: its pass is run and recorded as any other, with
        `chosen_by == "hand"` and the token's probability in both distributions.

        `control`: step mode (step_control.py): the loop stops before a draw when it
        says so, emits a `Pending` event and waits for the user's decision.

        Raises EngineError (before any event) for input it cannot run. Errors in
        llama.cpp during the run end it with Finish(reason=ERROR).
        """
        settings = request.settings
        source: Callable[[], SamplingSettings] = live if live is not None else (lambda: settings)
        messages, report_k, ignore_eos = request.messages, request.report_k, request.ignore_eos
        reuse_at_most, stop = request.reuse_at_most, request.stop
        reply_prefix, first_token = request.reply_prefix, request.first_token
        t_request = time.perf_counter()
        self._cancel.clear()
        self._abort.clear()
        self._control = control
        # An unpinned seed (None) becomes one fresh random seed for this reply; every event
        # records the settings with it filled in, so the reply can be replayed exactly.
        reply_seed = new_seed()
        raw_settings = source()
        current = raw_settings.with_seed(reply_seed)
        prompt = self.fit_prompt(messages, current.max_tokens)
        prefix = [int(t) for t in reply_prefix]
        if any(not 0 <= t < self.n_vocab for t in prefix) or (
            first_token is not None and not 0 <= int(first_token) < self.n_vocab
        ):
            raise EngineError("the reply to continue holds a token that is not of this model's vocabulary")
        tokens = prompt.tokens + prefix
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the reply to continue does not fit the context: the prompt and the reply so far are "
                f"{len(tokens)} tokens and the model's context holds {self.n_ctx}"
            )
        if self._auto is not None:  # the prefill runs at a measured count, never a probe's
            self._auto.prefill_threads()
        yield Start(
            model_name=self.name,
            model_path=str(self.model_path),
            model_size_bytes=self.model_size,
            n_ctx=self.n_ctx,
            n_vocab=self.n_vocab,
            threads=self.threads,
            threads_auto=self.threads_auto,
            messages=prompt.messages,
            prompt_text=prompt.text,
            prompt_token_ids=tuple(prompt.tokens),
            prompt_token_texts=self.token_texts(prompt.tokens),
            prompt_special=tuple(i for i, t in enumerate(prompt.tokens) if self._c.is_control(t)),
            settings=current,
            top_k_report=report_k,
            stop=tuple(stop),
            reply_prefix=tuple(prefix),
        )
        if prompt.trimmed is not None:
            yield prompt.trimmed

        # ---- prefill, reusing the longest common prefix in the KV cache --------
        cached = self.llm.input_ids[: self.llm.n_tokens]
        n_common = 0
        limit = min(len(cached), len(tokens))
        if limit:
            same = np.asarray(cached[:limit]) == np.asarray(tokens[:limit], dtype=cached.dtype)
            n_common = limit if same.all() else int(np.argmin(same))
        n_common = min(n_common, len(tokens) - 1)  # evaluate >= 1 token to get fresh logits
        if reuse_at_most is not None:
            n_common = max(0, min(n_common, reuse_at_most))
        self.llm.n_tokens = n_common
        todo = tokens[n_common:]
        batches = 0
        t0 = time.perf_counter()
        reason: FinishReason | None = None
        error: str | None = None
        try:
            for i in range(0, len(todo), self.n_batch):
                if self._cancel.is_set():
                    reason = FinishReason.CANCELLED
                    break
                self._eval(todo[i : i + self.n_batch])
                batches += 1
            self._sync()
        except RuntimeError as exc:
            reason, error = self._decode_failure(exc)
        prefill_ms = (time.perf_counter() - t0) * 1000.0
        yield Prefill(
            prompt_tokens=len(tokens),
            reused_tokens=n_common,
            evaluated_tokens=len(todo) if reason is None else self.llm.n_tokens - n_common,
            batches=batches,
            ms=prefill_ms,
        )

        # ---- the loop: one forward pass, one sampled token per step ------------
        rng = sampler.make_rng(current.seed)
        seed = current.seed
        previous: SamplingSettings | None = None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if prefix:  # a character the prefix began is completed by this run's first token
            decoder.decode(b"".join(self.piece(t) for t in prefix))
        base = len(prefix)  # the steps' numbers go on from the prefix's
        stops = StopStrings(stop) if stop else None
        stopped = False  # a stop string ended the reply
        history = dry.History(tokens, self)  # DRY finds the model's sequence breakers through it
        repeats = RepeatFinder(prefix)  # the reply repeating itself (repeats.py): on each Step
        text_parts: list[str] = []
        completion = 0
        steps = 0
        ttft_ms = 0.0
        t_first = t_last = time.perf_counter()
        paused_s = paused_first_s = paused_last_s = (
            0.0  # step mode: the waits for the user (all; before the first, the last token)
        )
        forward_ms, forward_tokens = prefill_ms, len(todo)
        # the thread count of the pass behind each step's logits, and why (recorded on
        # step 0, wherever the tuner gave a new reason, and wherever the count changed)
        tuner = self._tuner
        pass_threads, cut_ms = self.threads, 0.0
        pass_reason, pass_change = (tuner.reason, tuner.changes) if tuner else ("", 0)
        noted_change, noted_threads = -1, pass_threads
        while reason is None:
            latest = source()
            if latest is not raw_settings:  # swapped: resolve its seed once, not per step
                raw_settings, current = latest, latest.with_seed(reply_seed)
            settings_now = current
            changed = settings_now.diff(previous)
            if settings_now.seed != seed:
                rng, seed = sampler.make_rng(settings_now.seed), settings_now.seed
            ts = time.perf_counter()
            logits = self._logits()
            chosen_by = SAMPLED
            waited = False  # stopped in step mode: sample_ms is the last sampling's, not the wait
            if steps == 0 and first_token is not None:  # a branch: the first token is given
                res = sampler.sample(logits, history, settings_now, rng, report_k, force=int(first_token))
                chosen_by = HAND
            elif control is not None and control.should_stop():
                waited = True
                # step mode: show the die before the roll and wait for the user's hand
                # (the preview is the very draw a free run makes: its rng state is kept
                # to redo the draw under new settings or to leave it to a hand pick)
                state = rng.bit_generator.state
                res = sampler.sample(logits, history, settings_now, rng, report_k)
                sample_ms = (time.perf_counter() - ts) * 1000.0
                self._probe = (logits, history, settings_now)
                yield self._pending(base + steps, res, settings_now, forward_ms, forward_tokens, sample_ms)
                while True:
                    tw = time.perf_counter()
                    decision = control.wait(self._cancel.is_set, lambda: source() is not raw_settings)
                    paused_s += time.perf_counter() - tw
                    if decision.kind == "cancel":
                        reason = FinishReason.CANCELLED
                        break
                    ts = time.perf_counter()
                    if decision.kind == "reshape":  # the same logits, no forward pass
                        raw_settings = source()
                        settings_now = current = raw_settings.with_seed(reply_seed)
                        if settings_now.seed != seed:
                            rng, seed = sampler.make_rng(settings_now.seed), settings_now.seed
                            state = rng.bit_generator.state
                        else:
                            rng.bit_generator.state = state
                        res = sampler.sample(logits, history, settings_now, rng, report_k)
                        sample_ms = (time.perf_counter() - ts) * 1000.0
                        self._probe = (logits, history, settings_now)
                        yield self._pending(base + steps, res, settings_now, forward_ms, forward_tokens, sample_ms)
                        continue
                    if decision.kind == "pick":
                        if not 0 <= (decision.token_id or 0) < self.n_vocab:
                            continue  # not a token of this vocabulary: keep waiting
                        rng.bit_generator.state = state  # nothing was drawn
                        res = sampler.sample(logits, history, settings_now, rng, report_k, force=decision.token_id)
                        sample_ms = (time.perf_counter() - ts) * 1000.0
                    chosen_by = decision.chosen_by
                    break
                self._probe = None
                if reason is not None:
                    break
                changed = settings_now.diff(previous)
            else:
                if control is not None:
                    chosen_by = control.take_credit()
                res = sampler.sample(logits, history, settings_now, rng, report_k)
            token = res.token_id
            is_stop = (not ignore_eos) and self.is_eog(token)
            if is_stop:
                text = ""
            else:
                text = decoder.decode(self.piece(token))
                completion += 1
            ending = self._end_reason(is_stop, base + completion, settings_now.max_tokens) is not None
            if ending:
                # the reply ends at this step: it carries the bytes of a character the
                # reply never finished (as U+FFFD), so the steps' texts add up to its text
                text += decoder.decode(b"", final=True)
            if stops is not None:
                text, stopped = stops.feed(text, final=ending)
            text_parts.append(text)
            if not waited:
                sample_ms = (time.perf_counter() - ts) * 1000.0
            if steps == 0:
                t_first = time.perf_counter()
                paused_first_s = paused_s
                ttft_ms = (t_first - t_request - paused_s) * 1000.0
            t_last = time.perf_counter()
            paused_last_s = paused_s  # the waits up to this token (a later one is not in decode_ms)
            history.append(token)
            threads_reason = ""
            if pass_change != noted_change or pass_threads != noted_threads:
                threads_reason, noted_change = pass_reason, pass_change
            noted_threads = pass_threads
            yield Step(
                index=base + steps,
                token_id=token,
                piece=self.piece_text(token),
                piece_bytes=self.piece(token),
                text=text,
                is_stop=is_stop,
                raw_top=self._candidates(res.raw_top_ids, res.raw_top_probs),
                sampled_top=self._candidates(res.sampled_top_ids, res.sampled_top_probs),
                raw_prob=res.raw_prob,
                raw_rank=res.raw_rank,
                sampled_prob=res.sampled_prob,
                sampled_rank=res.sampled_rank,
                raw_entropy=res.raw_entropy,
                sampled_entropy=res.sampled_entropy,
                candidates_kept=res.kept,
                forward_ms=forward_ms,
                forward_tokens=forward_tokens,
                sample_ms=sample_ms,
                settings=settings_now,
                settings_changed=changed,
                n_past=self.llm.n_tokens + (0 if is_stop else 1),
                elapsed_ms=(t_last - t_request) * 1000.0,
                threads=pass_threads,
                threads_reason=threads_reason,
                probe_cut_ms=cut_ms,
                chosen_by=chosen_by,
                repeat=None if (rep := repeats.feed(token)) is None else rep.as_tuple(),
            )
            steps += 1
            previous = settings_now
            # (a max_tokens change may have come meanwhile)
            reason = FinishReason.STOP if stopped else self._end_reason(is_stop, base + completion, source().max_tokens)
            if reason is not None:
                break
            if tuner is not None:
                pass_reason, pass_change = tuner.reason, tuner.changes
            tf = time.perf_counter()
            try:
                self._decode_one(token)  # auto threads: timed and fed to the tuner there
                self._sync()
            except RuntimeError as exc:
                reason, error = self._decode_failure(exc)
                break
            forward_ms, forward_tokens = (time.perf_counter() - tf) * 1000.0, 1
            pass_threads, cut_ms = (self._auto.pass_threads, self._auto.cut_ms) if self._auto else (self.threads, 0.0)

        # A reply that ended after its last step was sent (a cancel or a max_tokens change
        # that came while the step was being handed over, a failed forward pass) leaves
        # the bytes of an unfinished character, and text held back for a stop string,
        # out of the text too: the reply's text is always the steps' texts joined.
        decoder.decode(b"", final=True)
        self._abort.clear()
        t_end = time.perf_counter()
        decode_ms = (t_last - t_first - (paused_last_s - paused_first_s)) * 1000.0
        yield Finish(
            reason=reason,
            prompt_tokens=len(tokens),
            completion_tokens=completion,
            steps=steps,
            prefill_ms=prefill_ms,
            ttft_ms=ttft_ms,
            decode_ms=decode_ms,
            total_ms=(t_end - t_request) * 1000.0,
            tokens_per_s=decode_rate(steps, decode_ms),
            text="".join(text_parts),
            n_past=self.llm.n_tokens,
            n_ctx=self.n_ctx,
            error=error,
            paused_ms=paused_s * 1000.0,
        )

    def _end_reason(self, is_stop: bool, completion: int, max_tokens: int) -> FinishReason | None:
        """Why the reply ends at the step just sampled (None: it goes on)."""
        if is_stop:
            return FinishReason.STOP
        if self._cancel.is_set():
            return FinishReason.CANCELLED
        if completion >= max_tokens:
            return FinishReason.LENGTH
        if self.llm.n_tokens + 1 >= self.n_ctx:
            return FinishReason.CONTEXT
        return None

    def _decode_failure(self, exc: RuntimeError) -> tuple[FinishReason, str | None]:
        # The cache may hold part of an aborted batch: drop everything past n_tokens.
        self._c.forget_from(self.llm.n_tokens)
        if self._abort.is_set() and "returned 2" in str(exc):
            return FinishReason.CANCELLED, None
        return FinishReason.ERROR, f"llama.cpp failed to decode: {exc}"

    def pending_probs(self, token_ids: Sequence[int]) -> list[tuple[float, float]] | None:
        """Step mode: the probability of each of these tokens at the draw the loop is
        stopped before, raw and after sampling (0: the filters cut it), from the same
        logits and settings as the Pending shown. None when the loop is not stopped.
        Safe from another thread while the loop waits (it reads, the loop does not run)."""
        probe = self._probe
        if probe is None:
            return None
        logits, history, settings = probe
        rng = sampler.make_rng(0)  # not used by a forced token
        out = []
        for t in token_ids:
            if not 0 <= int(t) < self.n_vocab:
                out.append((0.0, 0.0))
                continue
            res = sampler.sample(logits, history, settings, rng, 1, force=int(t))
            out.append((float(res.raw_prob), float(res.sampled_prob or 0.0)))
        return out

    def vocabulary(self) -> list[str]:
        """Every token's text, by id (special tokens spelled out; a piece of a character: `<e2 82>`)."""
        return [vocabulary_text(self.piece(i)) for i in range(self.n_vocab)]

    def _pending(
        self,
        index: int,
        res: sampler.SampleResult,
        settings: SamplingSettings,
        forward_ms: float,
        forward_tokens: int,
        sample_ms: float,
    ) -> Pending:
        return Pending(
            index=index,
            raw_top=self._candidates(res.raw_top_ids, res.raw_top_probs),
            sampled_top=self._candidates(res.sampled_top_ids, res.sampled_top_probs),
            raw_entropy=res.raw_entropy,
            sampled_entropy=res.sampled_entropy,
            candidates_kept=res.kept,
            forward_ms=forward_ms,
            forward_tokens=forward_tokens,
            sample_ms=sample_ms,
            settings=settings,
            n_past=self.llm.n_tokens,
        )

    def _candidates(self, ids: np.ndarray, probs: np.ndarray) -> tuple[Candidate, ...]:
        return tuple(
            Candidate(int(i), self.piece_text(int(i)), float(p), partial_bytes(self.piece(int(i))))
            for i, p in zip(ids.tolist(), probs.tolist())
        )

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            if self._auto is not None:
                self._auto.close()
            llm.close()
            self._c.close()
            self.llm = None  # type: ignore[assignment]

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
