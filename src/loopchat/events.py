"""The typed events one generation emits, in order:

    Start -> [ContextTrimmed] -> Prefill -> Step* -> Finish

Every consumer (headless CLI, TUI, trace file) reads the same objects. They are plain
frozen dataclasses: picklable (they may cross a process boundary) and convertible to and
from JSON (`to_json_dict` / `event_from_json_dict`) for the trace format documented in
docs/trace-format.md. Every number here is measured (clock readings) or computed from
the model's own logits; nothing is estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Union

from .settings import SamplingSettings

#: Bumped whenever a field is removed or changes meaning (adding fields does not).
SCHEMA_VERSION = 1


def _pickled_by_init(cls):
    """Pickle `cls` as a call of its __init__ with its fields. The default pickling of
    a frozen slots dataclass sets every field through a Python-level loop; a Step (two
    top-K lists of Candidates) then took ~80 us to pickle and as long to unpickle, per
    token, on its way from the engine process to the UI; this halves both."""
    names = tuple(f.name for f in fields(cls) if f.init)

    def __reduce__(self):
        return (cls, tuple([getattr(self, n) for n in names]))

    cls.__reduce__ = __reduce__
    return cls


class FinishReason(StrEnum):
    STOP = "stop"  # the model drew an end-of-generation token
    LENGTH = "length"  # max_tokens reached
    CONTEXT = "context"  # the context window (n_ctx) is full
    CANCELLED = "cancelled"  # the caller cancelled (Esc, Ctrl+C)
    ERROR = "error"  # llama.cpp reported an error; see Finish.error


#: The role of a message that is the model's whole input, not a chat turn: the engine
#: tokenizes its text as it is, with no chat template (completion mode, `loopchat run --raw`).
DOCUMENT = "document"


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # "system" | "user" | "assistant", or DOCUMENT (alone: the raw text to continue)
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@_pickled_by_init
@dataclass(frozen=True, slots=True)
class Candidate:
    """One entry of a top-K list: a token and its probability in that distribution."""

    token_id: int
    text: str  # the token's own bytes decoded for display (invalid UTF-8 shown as U+FFFD)
    prob: float


@dataclass(frozen=True, slots=True)
class Start:
    """What is about to run: enough to re-check the run without loopchat."""

    model_name: str
    model_path: str
    model_size_bytes: int
    n_ctx: int
    n_vocab: int
    threads: int  # llama.cpp threads in force at the start (the prefill's)
    messages: tuple[Message, ...]
    prompt_text: str  # the exact text rendered by the chat template
    prompt_token_ids: tuple[int, ...]  # the exact ids fed to the model, special tokens included
    settings: SamplingSettings
    top_k_report: int
    threads_auto: bool = False  # `threads = "auto"`: the engine chooses the count (thread_tuner.py)
    kind: str = field(default="start", init=False)


@dataclass(frozen=True, slots=True)
class ContextTrimmed:
    """The conversation did not fit n_ctx: the oldest turns were dropped (system prompt kept)."""

    policy: str
    dropped_messages: int
    prompt_tokens_before: int
    prompt_tokens_after: int
    n_ctx: int
    kind: str = field(default="context_trimmed", init=False)


@dataclass(frozen=True, slots=True)
class Prefill:
    """The prompt's forward pass(es): KV-cache reuse and the time it took."""

    prompt_tokens: int
    reused_tokens: int  # taken from the KV cache of the previous turn
    evaluated_tokens: int  # actually run through the model now
    batches: int
    ms: float
    kind: str = field(default="prefill", init=False)


@_pickled_by_init
@dataclass(frozen=True, slots=True)
class Step:
    """One sampled token: the distribution it came from and what the sampler did.

    Step 0 samples from the logits the prefill produced; step i > 0 from the forward
    pass over the token drawn at step i - 1. `forward_ms` is the time of the forward
    pass that produced this step's logits (for step 0: the whole prefill, see
    `forward_tokens`).
    """

    index: int
    token_id: int
    piece: str  # this token's own bytes, decoded for display (may be a partial character)
    text: str  # what this step adds to the reply (incomplete UTF-8 is held back until whole)
    is_stop: bool  # an end-of-generation token (not part of the reply text)
    raw_top: tuple[Candidate, ...]  # softmax of the raw logits, top-K, most likely first
    sampled_top: tuple[Candidate, ...]  # distribution actually sampled from, top-K
    raw_prob: float  # chosen token's probability in the raw softmax
    raw_rank: int  # 1 = most likely
    sampled_prob: float  # chosen token's probability in the sampled-from distribution
    sampled_rank: int
    raw_entropy: float  # bits
    sampled_entropy: float  # bits
    candidates_kept: int  # tokens left with non-zero probability after the filters
    forward_ms: float
    forward_tokens: int
    sample_ms: float
    settings: SamplingSettings  # in force at this step
    settings_changed: tuple[str, ...]  # fields that differ from the previous step's settings
    n_past: int  # tokens in the context after this step's token is appended
    elapsed_ms: float = 0.0  # from the request to this token being sampled (step 0: the TTFT)
    threads: int = 0  # llama.cpp threads of the forward pass that produced these logits (0: not recorded)
    threads_reason: str = ""  # why that count: set on step 0 and where the count or its reason changed
    piece_bytes: bytes | None = None  # this token's exact bytes (None: not recorded); hex in a trace
    kind: str = field(default="step", init=False)


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int  # sampled tokens that are part of the reply (stop token excluded)
    steps: int  # forward passes sampled from (stop token included)
    prefill_ms: float
    ttft_ms: float  # from the request to the first token's text being available
    decode_ms: float  # from the first token to the last
    total_ms: float
    tokens_per_s: float  # decode rate, tokens a second: (steps - 1) / (decode_ms / 1000)
    text: str  # the whole reply
    n_past: int
    n_ctx: int
    error: str | None = None
    kind: str = field(default="finish", init=False)


def decode_rate(steps: int, decode_ms: float) -> float:
    """Finish.tokens_per_s: tokens a second from the first token to the last (0 for one)."""
    return (steps - 1) / (decode_ms / 1000.0) if steps > 1 and decode_ms > 0 else 0.0


Event = Union[Start, ContextTrimmed, Prefill, Step, Finish]

# ---- what a host (the worker that owns the engine, or a trace player) says besides
# the generation events; they are not written to traces.


@dataclass(frozen=True, slots=True)
class ModelLoading:
    """A model starts loading."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class ModelReady:
    name: str
    path: str
    n_ctx: int
    n_vocab: int
    threads: int
    load_ms: float
    template_note: str = ""  # set when chat messages are rendered by a fallback template: what to do


@dataclass(frozen=True, slots=True)
class WorkerError:
    """A one-line, actionable error (model failed to load, prompt too long, ...)."""

    message: str
    during: str  # "load" | "generate"
    internal: bool = False  # an unexpected exception (a bug), not a problem the user caused


@dataclass(frozen=True, slots=True)
class WireReceived:
    """What a remote backend received for the reply in flight, as it arrived: one
    server-sent event's text (`data: {...}`, without the blank line that ends it) or,
    for a blocking request, the whole response body. The wire view shows it."""

    text: str
    nbytes: int  # bytes on the wire for it (the SSE framing included)
    t_ms: float  # since the request was sent
    run_id: int = 0


@dataclass(frozen=True, slots=True)
class RunDone:
    """The worker is idle again after a generate command (whatever its outcome)."""

    run_id: int


#: Everything a backend hands to its sink.
HostEvent = Union[Event, ModelLoading, ModelReady, WorkerError, WireReceived, RunDone]

_KINDS: dict[str, type] = {
    "start": Start,
    "context_trimmed": ContextTrimmed,
    "prefill": Prefill,
    "step": Step,
    "finish": Finish,
}


def _plain(value: Any) -> Any:
    if isinstance(value, SamplingSettings):
        return value.to_dict()
    if isinstance(value, (Message,)):
        return value.to_dict()
    if isinstance(value, Candidate):
        return [value.token_id, value.text, value.prob]
    if isinstance(value, FinishReason):
        return value.value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def to_json_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict for one event (`kind` first). Candidates are [id, text, prob]."""
    out: dict[str, Any] = {"kind": event.kind}
    for f in fields(event):
        if f.name != "kind":
            out[f.name] = _plain(getattr(event, f.name))
    return out


def event_from_json_dict(data: dict[str, Any]) -> Event:
    """Inverse of `to_json_dict` (unknown keys are ignored, for newer traces)."""
    kind = data.get("kind")
    cls = _KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "kind" or f.name not in data:
            continue
        value = data[f.name]
        if f.name == "settings":
            value = SamplingSettings.from_dict(value)
        elif f.name == "messages":
            value = tuple(Message(**m) for m in value)
        elif f.name in ("raw_top", "sampled_top"):
            value = tuple(Candidate(int(c[0]), str(c[1]), float(c[2])) for c in value)
        elif f.name == "piece_bytes" and value is not None:
            value = bytes.fromhex(value)
        elif f.name == "reason":
            value = FinishReason(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)
