"""The instrumented generation loop on llama-cpp-python (imports nothing from Textual).

One `Engine` owns one `Llama` from load to close. Create it and call every method on
it from one and the same thread (see `worker.py`): a `Llama` is not thread-safe, and two
threads touching it leave two OpenMP pools fighting over the cores. Only `cancel()` may
be called from another thread.

`generate()` yields the events of `events.py`: Start, [ContextTrimmed], Prefill, one
Step per sampled token, Finish.
"""

from __future__ import annotations

import codecs
import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import sampler
from .events import (
    Candidate,
    ContextTrimmed,
    Event,
    Finish,
    FinishReason,
    Message,
    Prefill,
    Start,
    Step,
)
from .model_files import gguf_problem
from .settings import SamplingSettings, new_seed

CONTEXT_POLICY = (
    "drop the oldest messages (the system prompt is kept) until the prompt leaves room "
    "for the reply: max_tokens, at most a quarter of n_ctx"
)

#: Used when a GGUF carries no chat template of its own (and none is configured).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class EngineError(Exception):
    """A problem the user can act on; the message is one line that says what to do."""


class ModelLoadError(EngineError):
    pass


class ContextOverflowError(EngineError):
    pass


def physical_cores() -> int:
    """The machine's physical core count (llama-cpp-python's default is half the CPUs)."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil is a dependency
        n = None
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        available = os.cpu_count() or 1
    return max(1, min(n or available, available))


class _AbortFlag:
    """A flag llama.cpp's abort callback reads from C without taking the GIL.

    ggml calls the abort callback once per graph node. A Python callback would take the
    GIL hundreds of times per forward pass and stall whenever a UI thread holds it, so
    the callback is libc's strlen() on a 2-byte buffer: it returns 0 (go on) while the
    buffer is empty and 1 (abort) once the first byte is set.
    """

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)
        self._py_callback = None
        libc_name = ctypes.util.find_library("c")
        try:
            import llama_cpp

            libc = ctypes.CDLL(libc_name)
            address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
            self.callback = llama_cpp.ggml_abort_callback(address)
        except (OSError, AttributeError):  # pragma: no cover - no libc strlen
            import llama_cpp

            self._py_callback = llama_cpp.ggml_abort_callback(lambda _data: self.is_set())
            self.callback = self._py_callback

    @property
    def data(self) -> ctypes.c_void_p:
        return ctypes.cast(self._buf, ctypes.c_void_p)

    def set(self) -> None:
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._buf[0] != b"\x00"


@dataclass(frozen=True)
class EngineOptions:
    """Everything needed to create an Engine: picklable, so it can cross to a process.

    Calling it creates the Engine (use it as the factory of a worker)."""

    model_path: str
    name: str | None = None
    n_ctx: int = 4096
    threads: int | None = None
    n_batch: int = 512
    chat_template: str | None = None
    log_path: str | None = None
    verbose: bool = False

    def __call__(self) -> "Engine":
        return Engine(
            self.model_path,
            name=self.name,
            n_ctx=self.n_ctx,
            threads=self.threads,
            n_batch=self.n_batch,
            chat_template=self.chat_template,
            log_path=Path(self.log_path) if self.log_path else None,
            verbose=self.verbose,
        )


@dataclass(frozen=True, slots=True)
class _Prompt:
    messages: tuple[Message, ...]
    text: str
    tokens: list[int]
    trimmed: ContextTrimmed | None


class Engine:
    """Loads a GGUF model and runs the instrumented loop on it."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        n_ctx: int = 4096,
        threads: int | None = None,
        n_batch: int = 512,
        chat_template: str | None = None,
        log_path: Path | None = None,
        verbose: bool = False,
        warmup: bool = True,
    ) -> None:
        import llama_cpp
        from llama_cpp import Llama

        from .llama_log import python_prints_to_log, route_llama_log

        self.model_path = Path(model_path)
        self.name = name or self.model_path.stem
        self.threads = threads or physical_cores()
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
                    n_threads=self.threads,
                    n_threads_batch=self.threads,
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
        self._llama_cpp = llama_cpp
        self._one_token, self._one_batch = self._single_token_batch()
        self._logits_ith = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
            ("llama_get_logits_ith", llama_cpp.llama_cpp._lib)
        )
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
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._pieces: dict[int, bytes] = {}
        self._abort = _AbortFlag()
        llama_cpp.llama_set_abort_callback(self.llm.ctx, self._abort.callback, self._abort.data)
        self._cancel = threading.Event()
        own_template = self.llm.metadata.get("tokenizer.chat_template")
        template = chat_template or own_template or CHATML_TEMPLATE
        self.chat_template = template
        try:
            self._formatter = self._make_formatter(template)
        except Exception as exc:  # jinja2's TemplateSyntaxError and friends
            from .config import template_error_text

            self.close()
            if chat_template:
                where, fix = "chat_template", "fix it in models.toml, or remove it to use the model's own"
            else:
                where, fix = "the chat template in its GGUF file", "set a chat_template for it in models.toml"
            raise ModelLoadError(
                f"model {self.name!r}: {where} is not a valid Jinja template ({template_error_text(exc)}); {fix}"
            ) from None
        self.add_bos = self._metadata_flag("tokenizer.ggml.add_bos_token", default=False)
        if warmup:
            # llama.cpp's own tools warm up too: the first forward pass pays for
            # allocations and page faults that would otherwise land in the first TTFT.
            self._eval([max(self.llm.token_bos(), 0)])
            self.reset()

    def _single_token_batch(self):
        """A llama_batch for one token at an explicit position (owned by this engine)."""
        lc = self._llama_cpp
        batch = lc.llama_batch_init(1, 0, 1)
        self._batch_owner = batch  # freed in close()
        batch.n_tokens = 1
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = True
        return batch.token, batch

    # ---------------------------------------------------------------- prompt ----
    def _metadata_flag(self, key: str, *, default: bool) -> bool:
        value = self.llm.metadata.get(key)
        if value is None:
            return default
        return str(value).lower() in ("true", "1")

    def _make_formatter(self, template: str):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        def token_text(token_id: int) -> str:
            if token_id < 0:
                return ""
            return self.piece(token_id).decode("utf-8", errors="replace")

        return Jinja2ChatFormatter(
            template=template,
            eos_token=token_text(self.llm.token_eos()),
            bos_token=token_text(self.llm.token_bos()),
            add_generation_prompt=True,
        )

    def render_prompt(self, messages: Sequence[Message]) -> str:
        """The exact text the chat template renders for this conversation."""
        try:
            return self._formatter(messages=[m.to_dict() for m in messages]).prompt
        except Exception as exc:  # a template error is the user's (or the model's) to fix
            raise EngineError(f"the chat template failed to render: {exc}") from None

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
            # llama-cpp-python's LlamaModel.token_to_piece returns its whole 32-byte
            # buffer (NUL-padded): use the length llama.cpp returns instead.
            buf = ctypes.create_string_buffer(64)
            n = self._llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
            b = buf.raw[: max(n, 0)]
            self._pieces[token_id] = b
        return b

    def piece_text(self, token_id: int) -> str:
        return self.piece(token_id).decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    def fit_prompt(self, messages: Sequence[Message], max_tokens: int) -> _Prompt:
        """Render and tokenize; apply the context policy (CONTEXT_POLICY) if needed."""
        msgs = tuple(messages)
        if not msgs:
            raise EngineError("the conversation is empty: type a message first")
        text = self.render_prompt(msgs)
        tokens = self.tokenize(text)
        reserve = max(1, min(max_tokens, self.n_ctx // 4))
        if len(tokens) + reserve <= self.n_ctx:
            return _Prompt(msgs, text, tokens, None)
        before = len(tokens)
        system = tuple(m for m in msgs[:1] if m.role == "system")
        rest = list(msgs[len(system) :])
        dropped = 0
        while len(rest) > 1 and len(tokens) + reserve > self.n_ctx:
            rest.pop(0)
            dropped += 1
            # never start the kept history with an assistant turn
            while len(rest) > 1 and rest[0].role == "assistant":
                rest.pop(0)
                dropped += 1
            text = self.render_prompt(system + tuple(rest))
            tokens = self.tokenize(text)
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the message is too long for the context: the prompt is {len(tokens)} tokens "
                f"and the model's context holds {self.n_ctx}; shorten the message or raise n_ctx "
                "in models.toml"
            )
        kept = system + tuple(rest)
        trimmed = ContextTrimmed(
            policy=CONTEXT_POLICY,
            dropped_messages=dropped,
            prompt_tokens_before=before,
            prompt_tokens_after=len(tokens),
            n_ctx=self.n_ctx,
        )
        return _Prompt(kept, text, tokens, trimmed if dropped else None)

    # ------------------------------------------------------------------ loop ----
    def cancel(self) -> None:
        """Stop the generation in progress within one step (or one prefill batch node).

        Safe to call from any thread."""
        self._cancel.set()
        self._abort.set()

    def reset(self) -> None:
        """Forget the KV cache (the next turn evaluates its whole prompt)."""
        self.llm.reset()
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)

    def _eval(self, tokens: Sequence[int]) -> None:
        self.llm.eval(tokens)

    def _decode_one(self, token: int) -> None:
        """One token through the model: the per-step forward pass, with as little
        Python around llama_decode as possible (Llama.eval rebuilds its batch and
        trims the cache on every call). Keeps Llama's own token bookkeeping."""
        llm = self.llm
        self._one_token[0] = token
        self._one_batch.pos[0] = llm.n_tokens
        rc = self._llama_cpp.llama_decode(llm.ctx, self._one_batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        llm.input_ids[llm.n_tokens] = token
        llm.n_tokens += 1

    def _logits(self) -> np.ndarray:
        """The last token's logits, a view of llama.cpp's buffer (valid until the next
        decode). The view is kept while llama.cpp returns the same address: a new one
        each step (np.ctypeslib.as_array), and the pointer object llama_cpp's binding
        returns, were reference cycles: garbage that only the cycle collector frees, on
        the engine thread. `_logits_ith` is the same C function returning a plain int."""
        address = self._logits_ith(self.llm.ctx, -1)
        if address != self._logits_address:
            self._logits_address = address
            self._logits_view = np.frombuffer((ctypes.c_float * self.n_vocab).from_address(address), dtype=np.float32)
        return self._logits_view

    def _sync(self) -> None:
        self._llama_cpp.llama_synchronize(self.llm.ctx)

    def generate(
        self,
        messages: Sequence[Message],
        settings: Callable[[], SamplingSettings] | SamplingSettings,
        *,
        report_k: int = 10,
        ignore_eos: bool = False,
    ) -> Iterator[Event]:
        """Run one reply. `settings` is read at every step (a LiveSettings or a callable).

        Raises EngineError (before any event) for input it cannot run. Errors in
        llama.cpp during the run end it with Finish(reason=ERROR).
        """
        source: Callable[[], SamplingSettings] = (
            (lambda: settings) if isinstance(settings, SamplingSettings) else settings
        )
        t_request = time.perf_counter()
        self._cancel.clear()
        self._abort.clear()
        # An unpinned seed (None) becomes one fresh random seed for this reply; every event
        # records the settings with it filled in, so the reply can be replayed exactly.
        reply_seed = new_seed()
        raw_settings = source()
        current = raw_settings.with_seed(reply_seed)
        prompt = self.fit_prompt(messages, current.max_tokens)
        tokens = prompt.tokens

        yield Start(
            model_name=self.name,
            model_path=str(self.model_path),
            model_size_bytes=self.model_size,
            n_ctx=self.n_ctx,
            n_vocab=self.n_vocab,
            threads=self.threads,
            messages=prompt.messages,
            prompt_text=prompt.text,
            prompt_token_ids=tuple(tokens),
            settings=current,
            top_k_report=report_k,
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
        history = list(tokens)
        text_parts: list[str] = []
        completion = 0
        steps = 0
        ttft_ms = 0.0
        t_first = t_last = time.perf_counter()
        forward_ms, forward_tokens = prefill_ms, len(todo)
        while reason is None:
            latest = source()
            if latest is not raw_settings:  # swapped: resolve its seed once, not per step
                raw_settings, current = latest, latest.with_seed(reply_seed)
            settings_now = current
            changed = settings_now.diff(previous)
            if settings_now.seed != seed:
                rng, seed = sampler.make_rng(settings_now.seed), settings_now.seed
            ts = time.perf_counter()
            res = sampler.sample(self._logits(), history, settings_now, rng, report_k)
            token = res.token_id
            is_stop = (not ignore_eos) and self.is_eog(token)
            if is_stop:
                text = ""
            else:
                text = decoder.decode(self.piece(token))
                text_parts.append(text)
                completion += 1
            sample_ms = (time.perf_counter() - ts) * 1000.0
            if steps == 0:
                t_first = time.perf_counter()
                ttft_ms = (t_first - t_request) * 1000.0
            t_last = time.perf_counter()
            history.append(token)
            yield Step(
                index=steps,
                token_id=token,
                piece=self.piece_text(token),
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
            )
            steps += 1
            previous = settings_now
            if is_stop:
                reason = FinishReason.STOP
            elif self._cancel.is_set():
                reason = FinishReason.CANCELLED
            elif completion >= source().max_tokens:
                reason = FinishReason.LENGTH
            elif self.llm.n_tokens + 1 >= self.n_ctx:
                reason = FinishReason.CONTEXT
            if reason is not None:
                break
            tf = time.perf_counter()
            try:
                self._decode_one(token)
                self._sync()
            except RuntimeError as exc:
                reason, error = self._decode_failure(exc)
                break
            forward_ms, forward_tokens = (time.perf_counter() - tf) * 1000.0, 1

        tail = decoder.decode(b"", final=True)
        if tail:
            text_parts.append(tail)
        self._abort.clear()
        t_end = time.perf_counter()
        decode_ms = (t_last - t_first) * 1000.0
        yield Finish(
            reason=reason,
            prompt_tokens=len(tokens),
            completion_tokens=completion,
            steps=steps,
            prefill_ms=prefill_ms,
            ttft_ms=ttft_ms,
            decode_ms=decode_ms,
            total_ms=(t_end - t_request) * 1000.0,
            tokens_per_s=(steps - 1) / (decode_ms / 1000.0) if steps > 1 and decode_ms > 0 else 0.0,
            text="".join(text_parts),
            n_past=self.llm.n_tokens,
            n_ctx=self.n_ctx,
            error=error,
        )

    def _decode_failure(self, exc: RuntimeError) -> tuple[FinishReason, str | None]:
        # The cache may hold part of an aborted batch: drop everything past n_tokens.
        self.llm._ctx.kv_cache_seq_rm(-1, self.llm.n_tokens, -1)
        if self._abort.is_set() and "returned 2" in str(exc):
            return FinishReason.CANCELLED, None
        return FinishReason.ERROR, f"llama.cpp failed to decode: {exc}"

    def _candidates(self, ids: np.ndarray, probs: np.ndarray) -> tuple[Candidate, ...]:
        return tuple(
            Candidate(int(i), self.piece_text(int(i)), float(p))
            for i, p in zip(ids.tolist(), probs.tolist())
        )

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self._llama_cpp.llama_batch_free(self._batch_owner)
            self.llm = None  # type: ignore[assignment]

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
