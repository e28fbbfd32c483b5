"""What an OpenAI-compatible server sent for one reply, turned into loopchat's events.

From a loopchat server (its chunks carry the `loopchat` extension, wire.py) the events
are the server engine's very own: Start (marked with the server's URL as its `source`),
Prefill, Step (each given the client's `arrival_ms`), Finish. The panel is then as
complete as a local one.

From any other server the events are built from what the wire gives, and only that:
- each token of `logprobs.content` is a Step: `raw_top` from its `top_logprobs`
  (probability = exp(logprob), most likely first, at most the top_logprobs asked for),
  `raw_prob` from its logprob, `raw_rank` its place in that list when it is in the top
  asked for (servers such as llama-cpp-python append the drawn token when it is not: its
  rank is then not known), `piece_bytes` from `bytes`;
- a step's only timing is `arrival_ms`, the gap between its chunk reaching the client
  and the one before (not a forward pass), and `elapsed_ms` since the request;
- Finish from `finish_reason`, the token counts from `usage` (when sent), and the
  prefill's time from llama.cpp's `timings.prompt_ms` (when sent);
- token ids where the server sends them (llama.cpp's `id`); the Start's n_ctx, n_vocab
  and model size where GET /models gave them (llama.cpp's `meta`: model_meta.py);
- everything else (the sampled-from distribution, entropies, forward and sampling
  times, threads, n_past, the prompt's text and tokens) is None.

No I/O here (the JSON's pieces are read by wire_parts.py): `backends/remote.py` feeds it the decoded JSON and the arrival times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loopchat.backends.model_meta import ModelMeta
from loopchat.backends.wire_parts import (
    ServerError,
    WireError,
    entry_id,
    entry_piece,
    error_message,
    kind_of,
    logprob_entries,
    prob_of,
    split_text,
    token_count,
)
from loopchat.events import Candidate, Event, Finish, FinishReason, Message, Prefill, Start, Step, decode_rate
from loopchat.settings import SamplingSettings
from loopchat.token_faces import partial_bytes
from loopchat.wire import EXTENSION_KEY, extension_events

_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class WireReader:
    """One reply's chunks (or body) in, events out. `chunk`/`body` raise WireError for
    something malformed and ServerError for an error the server sent."""

    def __init__(
        self,
        *,
        source: str,
        model: str,
        messages: Sequence[Message],
        settings: SamplingSettings,
        top_logprobs: int,
        stop: tuple[str, ...] = (),
        meta: ModelMeta | None = None,
    ) -> None:
        self.meta = meta or ModelMeta()  # what GET /models said of the model (llama-server's n_ctx...)
        self.source = source
        self.stop = stop  # the stop strings the request sent
        self.model = model
        self.messages = tuple(messages)
        self.settings = settings
        self.top_logprobs = top_logprobs
        self.extended: bool | None = None  # a loopchat server (None: not known yet)
        self.start: Start | None = None
        self.prefill: Prefill | None = None
        self.steps: list[Step] = []
        self.finish: Finish | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self._last_arrival = 0.0
        self._counted = True  # every step came with its logprobs entry (a counted token)
        self.prompt_ms: float | None = None  # the server's own prefill time (llama.cpp's timings)

    # ---- streaming ------------------------------------------------------------------
    def chunk(self, obj: Any, t_ms: float) -> list[Event]:
        """The events one streamed chunk carries (`t_ms`: its arrival since the request),
        but not the Finish: `end()` gives it once the stream is over."""
        if not isinstance(obj, dict):
            raise WireError(f"a chunk is {kind_of(obj)}, not a JSON object")
        message = error_message(obj)
        if message is not None:
            raise ServerError(message)
        self.chunks += 1
        if self.extended is None and "choices" in obj:
            self.extended = EXTENSION_KEY in obj
        if self.extended:
            return self._extension(obj, t_ms)
        choices = obj.get("choices")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        self._timings(obj)
        if choices is None:
            if usage is None:
                raise WireError("a chunk has neither choices nor usage")
            return []
        if not isinstance(choices, list):
            raise WireError(f"a chunk's choices is {kind_of(choices)}, not a list")
        if not choices:
            return []
        choice = choices[0]
        if not isinstance(choice, dict):
            raise WireError(f"a chunk's choice is {kind_of(choice)}, not an object")
        out: list[Event] = []
        if self.start is None:
            out.append(self._start(obj))
        if "delta" in choice:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise WireError(f"a chunk's delta is {kind_of(delta)}, not an object")
            content = delta.get("content")
        else:  # /v1/completions: text_completion chunks
            content = choice.get("text")
        if content is not None and not isinstance(content, str):
            raise WireError(f"a chunk's content is {kind_of(content)}, not text")
        out.extend(self._tokens(content or "", choice.get("logprobs"), t_ms))
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise WireError(f"a chunk's finish_reason is {kind_of(reason)}, not text")
            self.finish_reason = reason
        return out

    def _extension(self, obj: dict[str, Any], t_ms: float) -> list[Event]:
        try:
            events = extension_events(obj)
        except ValueError as exc:
            raise WireError(str(exc)) from None
        out: list[Event] = []
        gap_taken = False
        for ev in events:
            if isinstance(ev, Start):
                ev = replace(ev, source=self.source, messages=ev.messages or self.messages)  # (sent back if asked)
                self.start = ev
            elif isinstance(ev, Prefill):
                self.prefill = ev
            elif isinstance(ev, Step):
                gap = 0.0 if gap_taken else t_ms - self._last_arrival
                gap_taken = True
                ev = replace(ev, arrival_ms=gap)
                self.steps.append(ev)
            elif isinstance(ev, Finish):
                self.finish = ev  # handed on by end(), after everything else received
                continue
            out.append(ev)
        if gap_taken:
            self._last_arrival = t_ms
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if isinstance(reason, str):
                self.finish_reason = reason
        return out

    def _timings(self, obj: dict[str, Any]) -> None:
        """llama.cpp's server adds `timings` to its last chunk: its prefill's time."""
        timings = obj.get("timings")
        if isinstance(timings, dict):
            ms = timings.get("prompt_ms")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:
                self.prompt_ms = float(ms)

    def _start(self, obj: dict[str, Any]) -> Start:
        model = obj.get("model")
        self.start = Start(
            model_name=model if isinstance(model, str) and model else self.model,
            model_path=None,
            model_size_bytes=self.meta.size_bytes,
            n_ctx=self.meta.n_ctx,
            n_vocab=self.meta.n_vocab,
            threads=None,
            messages=self.messages,
            prompt_text=None,
            prompt_token_ids=None,
            settings=self.settings,
            top_k_report=self.top_logprobs,
            source=self.source,
            stop=self.stop,
        )
        return self.start

    def _tokens(self, content: str, logprobs: Any, t_ms: float) -> list[Step]:
        entries = logprob_entries(logprobs)
        if entries is None:  # no logprobs for this chunk: one step, its text only
            if not content:
                return []
            self._counted = False
            return [self._step(content, None, content, t_ms)]
        if not entries:
            if content:
                self._counted = False
                return [self._step(content, None, content, t_ms)]
            return []
        parsed = [entry_piece(e) for e in entries]
        texts = split_text(content, [p[0] for p in parsed])
        return [
            self._step(piece, (entry, data), text, t_ms, first=i == 0)
            for i, ((piece, data), entry, text) in enumerate(zip(parsed, entries, texts))
        ]

    def _step(
        self, piece: str, given: tuple[dict[str, Any], bytes | None] | None, text: str, t_ms: float, first: bool = True
    ) -> Step:
        """One token; `first`: the first of its chunk (the later ones arrived with it: gap 0)."""
        raw_top: tuple[Candidate, ...] = ()
        raw_prob = raw_rank = token_id = None
        data = None
        if given is not None:
            entry, data = given
            raw_prob = prob_of(entry.get("logprob"))
            top = entry.get("top_logprobs") or []
            if not isinstance(top, list):
                raise WireError(f"top_logprobs is {kind_of(top)}, not a list")
            token_id = entry_id(entry)
            ranked = []
            for c in top:
                if not isinstance(c, dict):
                    raise WireError(f"a top_logprobs entry is {kind_of(c)}, not an object")
                ranked.append((prob_of(c.get("logprob")), *entry_piece(c), entry_id(c)))
            ranked.sort(key=lambda pc: -pc[0])  # stable: the server's order among equals
            listed = ranked[: self.top_logprobs]
            raw_top = tuple(Candidate(i, t, p, partial_bytes(b)) for p, t, b, i in listed)
            for i, (p, t, _, tid) in enumerate(listed):
                if (tid == token_id if token_id is not None else t == piece) and p == raw_prob:
                    raw_rank = i + 1
                    break
        index = len(self.steps)
        gap = t_ms - self._last_arrival if first else 0.0
        self._last_arrival = t_ms
        step = Step(
            index=index,
            token_id=token_id,
            piece=piece,
            text=text,
            is_stop=False,
            raw_top=raw_top,
            sampled_top=None,
            raw_prob=raw_prob,
            raw_rank=raw_rank,
            sampled_prob=None,
            sampled_rank=None,
            raw_entropy=None,
            sampled_entropy=None,
            candidates_kept=None,
            forward_ms=None,
            forward_tokens=None,
            sample_ms=None,
            settings=self.settings,
            settings_changed=(),
            n_past=None,
            elapsed_ms=t_ms,
            threads=None,
            piece_bytes=data,
            arrival_ms=gap,
        )
        self.steps.append(step)
        return step

    # ---- a whole body (blocking) ---------------------------------------------------------
    def body(self, obj: Any, t_ms: float) -> list[Event]:
        """The events of a non-streaming response (`t_ms`: when it arrived); `end()` then
        gives its Finish."""
        if not isinstance(obj, dict):
            raise WireError(f"the response is {kind_of(obj)}, not a JSON object")
        message = error_message(obj)
        if message is not None:
            raise ServerError(message)
        self.chunks += 1
        if EXTENSION_KEY in obj:
            self.extended = True
            extended = self._extension(obj, t_ms)
            if self.finish is None:
                raise WireError(f"the response's {EXTENSION_KEY!r} extension has no finish event")
            return extended
        self.extended = False
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise WireError("the response has no choices")
        choice = choices[0]
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        self._timings(obj)
        if "message" in choice:
            message_obj = choice.get("message")
            if not isinstance(message_obj, dict):
                raise WireError(f"the response's message is {kind_of(message_obj)}, not an object")
            content = message_obj.get("content")
        else:
            content = choice.get("text")
        if content is not None and not isinstance(content, str):
            raise WireError(f"the response's content is {kind_of(content)}, not text")
        out: list[Event] = [self._start(obj)]
        out.extend(self._tokens(content or "", choice.get("logprobs"), t_ms))
        reason = choice.get("finish_reason")
        self.finish_reason = reason if isinstance(reason, str) else None
        return out

    # ---- the end -------------------------------------------------------------------------
    def end(self, t_ms: float, reason: FinishReason | None = None, error: str | None = None) -> Finish:
        """The reply's Finish: the server's own (a loopchat server that sent it), else
        made from what arrived. `reason` overrides (CANCELLED, ERROR)."""
        if self.finish is not None and reason is None:
            return self.finish
        if reason is None:
            reason = _REASONS.get(self.finish_reason or "", FinishReason.STOP)
        steps = self.steps
        start, usage = self.start, self.usage or {}
        first = steps[0].elapsed_ms if steps else None
        decode = steps[-1].elapsed_ms - steps[0].elapsed_ms if steps else None
        prompt = token_count(usage.get("prompt_tokens"))
        completion = token_count(usage.get("completion_tokens"))
        if start is not None and start.prompt_token_ids is not None:  # a loopchat server
            prompt = len(start.prompt_token_ids)
        if self.extended or (completion is None and self._counted):
            completion = sum(1 for s in steps if not s.is_stop)
        n_past = None
        if self.extended and steps and steps[-1].n_past is not None:
            n_past = steps[-1].n_past - (0 if steps[-1].is_stop else 1)
        self.finish = Finish(
            reason=reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
            steps=len(steps),
            prefill_ms=self.prefill.ms if self.prefill is not None else self.prompt_ms,
            ttft_ms=first,
            decode_ms=decode,
            total_ms=t_ms,
            tokens_per_s=decode_rate(len(steps), decode) if decode and len(steps) > 1 else None,
            text="".join(s.text for s in steps),
            n_past=n_past,
            n_ctx=start.n_ctx if start is not None else None,
            error=error,
        )
        return self.finish


__all__ = ["ServerError", "WireError", "WireReader", "error_message", "split_text"]
