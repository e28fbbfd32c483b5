"""The instrumented generation loop on llama-cpp-python (imports nothing from Textual).

One `Engine` owns one `Llama` from load to close. Create it and call every method on
it from one and the same thread (see `worker.py`): a `Llama` is not thread-safe, and two
threads touching it leave two OpenMP pools fighting over the cores. Only `cancel()` may
be called from another thread.

`run_reply()` yields the events of `events.py`: Start, [ContextTrimmed], Prefill, one
Step per sampled token, Finish; the reply's loop itself is a `ReplyRun` (run.py), which
reaches the model through the methods of run_host.py's `RunHost`. The raw llama.cpp calls
are in `_llama_ffi.py`; the chat template and the context policy in `chat_prompt.py`;
`EngineOptions` (what it takes to create an Engine, picklable: the factory a worker
calls) in `options.py`, which builds the Engine (this module does not import it).
"""

from __future__ import annotations

import codecs
import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loopchat.constraint import Constraint
from loopchat.engine.batch_run import AnyRun, open_run
from loopchat.engine.chat_prompt import (
    CHATML_TEMPLATE,
    ChatTemplate,
    FittedPrompt,
    fit_document,
    fit_prompt,
    opening_mode,
    template_note,
)
from loopchat.engine.cores import physical_cores
from loopchat.engine.flash_attn import model_default
from loopchat.engine.llama_load import load_llama
from loopchat.engine.prompt_scores import ScoreMemory
from loopchat.engine.thread_tuner import ThreadTuner
from loopchat.errors import ModelLoadError
from loopchat.events import DOCUMENT, Event, FinishReason, Message, Pending
from loopchat.flash_attn_setting import FlashAttn
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.step_control import StepControl
from loopchat.threads_setting import AUTO, Threads
from loopchat.token_faces import vocabulary_text

__all__ = ["Engine"]

_RESOLVED = {1: "on", 0: "off"}  # llama.cpp's LLAMA_FLASH_ATTN_TYPE_ENABLED, _DISABLED


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
        flash_attn: FlashAttn | None = None,
    ) -> None:
        from loopchat.engine._llama_ffi import AbortFlag, LlamaCalls
        from loopchat.engine.auto_threads import AutoThreads

        self.model_path = Path(model_path)
        self.name = name or self.model_path.stem
        # threads: a pinned count, or AUTO (None too): the engine measures its own passes
        # and changes the count between them (auto_threads.py, thread_tuner.py). `threads`
        # is the count in force; `thread_tuner` lets a test or benchmark tune the choice.
        self.threads_auto = threads is None or threads == AUTO
        self._tuner = (thread_tuner or ThreadTuner(physical_cores())) if self.threads_auto else None
        self._pinned = self._tuner.threads if self._tuner else int(threads)  # type: ignore[arg-type]
        self._auto: AutoThreads | None = None
        fa = flash_attn or model_default(self.model_path)  # None: the model's measured choice (flash_attn.py)
        self.llm = load_llama(self.model_path, n_ctx, n_batch, self._pinned, gpu_layers, log_path, verbose, fa)
        #: flash attention as llama.cpp resolved it: "on", "off" (None: its log did not say)
        self.flash_attn = _RESOLVED.get(self.llm.context_params.flash_attn_type)
        self.huge_pages_mb: int = self.llm.huge_pages_mb  # (MB in 2 MB pages: huge_pages.py)
        self.model_size = self.model_path.stat().st_size
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
        self._run: AnyRun | None = None  # the reply in flight (pending_probs reads its step gate)
        self.passes = 0  # llama_decode calls so far (prefill batches and steps): tests count them
        self.prompt_memory = ScoreMemory()  # the cached tokens' prompt logprobs (prompt_scores.py)
        self._lens: Any = None  # the logit lens (lens_run.py), opened when first asked for
        self.draft_model: Any = None  # a drafts.ModelDrafter, when one is attached (options.py)
        self._open_template(chat_template, mode)
        self.add_bos = self._metadata_flag("tokenizer.ggml.add_bos_token", default=False)
        if warmup:
            # llama.cpp's own tools warm up too: the first forward pass pays for
            # allocations and page faults that would otherwise land in the first TTFT.
            self.evaluate([max(self.llm.token_bos(), 0)])
            if self._auto is not None:  # the tuner's first measurement (auto_threads.py)
                self._auto.calibrate(max(self.llm.token_bos(), 0), self.n_ctx)
            self.reset()

    def _open_template(self, chat_template: str | None, mode: str | None) -> None:
        """The chat template: models.toml's, else the GGUF's, else ChatML (ModelLoadError:
        one that does not render; the model is closed)."""
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
        return default if value is None else str(value).lower() in ("true", "1")

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

    def text_tokens(self, text: str) -> list[int]:
        """`text`'s tokens as the tokenizer splits it alone (no BOS, no special tokens parsed)."""
        return [int(t) for t in self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)]

    def first_token(self, text: str) -> int:
        """`text`'s first token, alone (text_tokens); ValueError: none (run_host.py)."""
        if not (tokens := self.text_tokens(text)):
            raise ValueError(f"{text!r} has no token")
        return tokens[0]

    def piece(self, token_id: int) -> bytes:
        """The bytes of one token (special tokens spelled out), cached."""
        if (b := self._pieces.get(token_id)) is None:
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
        """What a user should know about the chat template ('' when the model has its own or models.toml sets one)."""
        return template_note(self.name, self.template_source)

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
        self.prompt_memory.clear()

    # ------------------------------------- what a reply run needs of the model (run_host.py) ----
    def evaluate(self, tokens: Sequence[int]) -> None:
        """A batch of tokens through the model (a prefill's)."""
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

    def forward(self, token: int) -> None:
        """One token through the model, waited for: the next step's logits."""
        self._decode_one(token)
        self.sync()

    def logits(self) -> np.ndarray:
        """The last token's logits, a view of llama.cpp's buffer (valid until the next
        decode). The view is kept while llama.cpp returns the same address: a new one
        each step (np.ctypeslib.as_array), and the pointer object llama_cpp's binding
        returns, were reference cycles: garbage that only the cycle collector frees, on
        the engine thread: `logits_address` returns a plain int."""
        address = self._c.logits_address()
        if address != self._logits_address:
            self._logits_address = address
            self._logits_view = _floats_at(address, self.n_vocab)
        return self._logits_view

    def sync(self) -> None:
        self._c.synchronize()

    @property
    def n_past(self) -> int:
        return int(self.llm.n_tokens)

    def cached_tokens(self) -> np.ndarray:
        return self.llm.input_ids[: self.llm.n_tokens]

    def keep_cached(self, n: int) -> None:
        self.llm.n_tokens = n
        self.prompt_memory.keep(n)

    def evaluate_scored(self, tokens: Sequence[int]) -> np.ndarray:
        """A chunk of a prompt through the model with every position's logits kept
        (prompt_scores.py): the rows (len(tokens) x n_vocab), valid until the next decode."""
        llm, n, n0 = self.llm, len(tokens), int(self.llm.n_tokens)
        self._c.forget_from(n0)  # as Llama.eval does: nothing cached past n_tokens
        self.passes += 1
        rc = self._c.decode_all(list(tokens), n0)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        llm.input_ids[n0 : n0 + n] = tokens
        llm.n_tokens = n0 + n
        first = self._c.logits_row_address(0)  # (llama_get_logits_ith waits for the decode)
        if self._c.logits_row_address(n - 1) == first + (n - 1) * self.n_vocab * 4:  # rows in order, contiguous
            return _floats_at(first, n * self.n_vocab).reshape(n, -1)
        return np.stack([_floats_at(self._c.logits_row_address(i), self.n_vocab) for i in range(n)])

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """A verifying pass (speculate.py): `tokens` (the one drawn, then the drafts) with
        every position's logits; the context holds the first one (advance() adds each draft kept)."""
        rows = self.evaluate_scored(tokens)
        self.llm.n_tokens -= len(tokens) - 1
        return rows

    def advance(self) -> None:
        """A drafted token the verifying pass kept: its KV cell, already there, is the context's."""
        self.llm.n_tokens += 1

    def trim(self, n: int) -> None:
        """Keep the cache's first `n` positions, drop the cells after them (llama_memory_seq_rm)."""
        self._c.forget_from(n)
        self.keep_cached(n)

    def is_control(self, token_id: int) -> bool:
        return bool(self._c.is_control(token_id))

    def prefill_threads(self, watch: bool = False) -> None:
        if self._auto is not None:  # a pass of many tokens: the count in force, never more than one measured
            self._auto.prefill_threads(watch)

    @property
    def tuner(self) -> ThreadTuner | None:
        return self._tuner

    def pass_threads(self) -> tuple[int, float]:
        auto = self._auto
        return (auto.pass_threads, auto.cut_ms) if auto is not None else (self.threads, 0.0)

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def end_reply(self) -> None:
        self._abort.clear()

    def decode_failure(self, exc: RuntimeError) -> tuple[FinishReason, str | None]:
        # The cache may hold part of an aborted batch: drop everything past n_tokens.
        self._c.forget_from(self.llm.n_tokens)
        if self._abort.is_set() and "returned 2" in str(exc):
            return FinishReason.CANCELLED, None
        return FinishReason.ERROR, f"llama.cpp failed to decode: {exc}"

    # the names tests and benchmarks reach for
    _eval = evaluate
    _logits = logits
    _sync = sync
    _decode_failure = decode_failure

    # ------------------------------------------------------------------ replies ----

    def generate(
        self,
        messages: Sequence[Message],
        settings: Callable[[], SamplingSettings] | SamplingSettings,
        *,
        control: StepControl | None = None,
        **fields: Any,
    ) -> Iterator[Event | Pending]:
        """`run_reply` with the request built from its fields (ReplyRequest's names): a
        short form for tests and benchmarks. `settings`: a snapshot, or a live source."""
        if isinstance(settings, SamplingSettings):
            return self.run_reply(ReplyRequest(tuple(messages), settings, **fields), control=control)
        return self.run_reply(ReplyRequest(tuple(messages), settings(), **fields), live=settings, control=control)

    def run_reply(
        self,
        request: ReplyRequest,
        *,
        live: Callable[[], SamplingSettings] | None = None,
        control: StepControl | None = None,
    ) -> Iterator[Event | Pending]:
        """Run one reply (request.py says what each field asks for; run.py how it runs).

        `live`: the settings source read before every draw (a LiveSettings: a change applies
        at the next pass); None: `request.settings` throughout. `control`: step mode
        (step_control.py): the loop stops before a draw when it says so, emits a `Pending`
        event and waits for the user's decision.

        Raises EngineError (before any event) for input it cannot run. Errors in llama.cpp
        during the run end it with Finish(reason=ERROR).
        """
        self._cancel.clear()
        self._abort.clear()
        self._control = control
        run = self._run = open_run(self, request, live, control)  # (n > 1: batch_run.py)
        try:
            yield from run.events()
        finally:
            if self._run is run:  # (a newer run may have begun before this one was closed)
                self._run = None

    def pending_probs(self, token_ids: Sequence[int]) -> list[tuple[float, float]] | None:
        """Step mode: each token's probability, raw and sampled, at the pending draw (step_gate.probe_probs)."""
        from loopchat.engine.step_gate import probe_probs

        run = self._run
        return None if run is None else probe_probs(run.gate.probe, token_ids, self.n_vocab, run.constraint)

    def vocabulary(self) -> list[str]:
        """Every token's text, by id (special tokens spelled out; a piece of a character: `<e2 82>`)."""
        return [vocabulary_text(self.piece(i)) for i in range(self.n_vocab)]

    def open_lens(self) -> Any:
        """The logit lens on this model (lens_run.py: a PassLens, or the line saying why none)."""
        if self._lens is None:
            from loopchat.engine.lens_run import open_lens

            self._lens = open_lens(self.llm, self.model_path, self.n_ctx, self.threads, self.piece_text)
        return self._lens

    def open_constraint(self, spec: Constraint) -> Any:
        """A reply's constraint stage on this model's vocabulary (sampler_constraint.py)."""
        from loopchat.engine.sampler_constraint import open_stage

        return open_stage(self.llm, spec, self.n_vocab, self.piece_text)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            if self._lens is not None and not isinstance(self._lens, str):
                self._lens.close()
            if self._auto is not None:
                self._auto.close()
            if self.draft_model is not None:
                self.draft_model.close()
            llm.close()
            self._c.close()
            self.llm = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _floats_at(address: int, count: int) -> np.ndarray:
    """A float32 view of `count` floats of llama.cpp's memory at `address` (valid while
    llama.cpp keeps them there)."""
    floats: Any = (ctypes.c_float * count).from_address(address)  # (a buffer numpy's stubs do not list)
    return np.frombuffer(floats, dtype=np.float32)
