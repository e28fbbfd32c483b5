"""One reply's wire: the events it put (or would put) on the wire, with their sizes and
times, and the figures over them.

- A reply that received WireReceived events (a remote backend) is shown as received:
  each event's text, its bytes on the wire and its arrival time.
- Any other reply (the local engine, a played trace) is shown as `loopchat serve` would
  send it for the same steps, through `wire.WireSerializer` (the server's one code
  path), for the request the chat makes: `stream` as the reply's mode, `logprobs` with
  `top_logprobs` = the panel's candidate count, `stream_options.include_usage`. A reply
  whose one message is a DOCUMENT is a `/v1/completions` request.

`ReplyWire.sync()` feeds the serializer from the reply's recorded events, only the ones
it has not seen, and at most a budget of steps per call: the wire view calls it once a
frame while it is shown (nothing runs while it is hidden), and a long reply shown for
the first time is caught up over a few frames. In blocking mode nothing is serialized
until the reply's Finish: then the one response body.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass, field

from loopchat.chat.conversation import BLOCKING, ReplyRecord
from loopchat.chat.pass_stats import role, same_pass
from loopchat.events import DOCUMENT, Event, FinishReason, Step
from loopchat.wire import (
    DONE_LINE,
    MAX_COMPLETION_LOGPROBS,
    MAX_TOP_LOGPROBS,
    WireOptions,
    WireSerializer,
    new_id,
)

#: Steps serialized per sync (one frame) at most, while a long reply is caught up (what
#: that costs a frame: docs/performance.md, "A step on its way to the UI"); a streaming
#: reply adds far fewer per frame.
STEPS_PER_SYNC = 200

_DONE_TEXT = DONE_LINE.rstrip("\n")


def request_time(rec: ReplyRecord) -> int:
    """A modelled response's `created`: when the reply was asked for, on the wall clock
    (Unix seconds)."""
    now = time.time()
    return int(now - (time.monotonic() - rec.started_at)) if rec.started_at else int(now)


def body_text(body: dict) -> str:
    """A response body as a server sends it: compact JSON in UTF-8 (Starlette's
    JSONResponse writes it so)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@dataclass(eq=False)
class WireEntry:
    text: str  # the event without the blank line that ends it (`data: ...`), or a whole body
    nbytes: int  # bytes on the wire for it, the SSE framing included
    t_ms: float | None  # since the request (None: no time measured for it)
    step: int | None = None  # the step whose chunk this is (None: none)
    chunk: bool = True  # a data chunk (not `[DONE]`, not a comment)
    body: bool = False  # a whole response body (blocking mode)
    label: str = "received"  # what it is, for the note above it
    rows: tuple | None = None  # (width, fold, rows): the wire view's cache


@dataclass
class WireStats:
    """Totals, and rates from the first timed event to the last (the first event's own
    bytes and chunk are not counted in the rates: they arrive at the window's start)."""

    chunks: int = 0
    nbytes: int = 0
    t_first: float | None = None
    t_last: float | None = None
    span_chunks: int = 0
    span_bytes: int = 0

    def add(self, e: WireEntry) -> None:
        self.chunks += e.chunk
        self.nbytes += e.nbytes
        if e.t_ms is None:
            return
        if self.t_first is None:
            self.t_first = e.t_ms
        else:
            self.span_chunks += e.chunk
            self.span_bytes += e.nbytes
        self.t_last = e.t_ms

    @property
    def seconds(self) -> float:
        if self.t_first is None or self.t_last is None:
            return 0.0
        return (self.t_last - self.t_first) / 1000.0

    @property
    def chunks_per_s(self) -> float | None:
        s = self.seconds
        return self.span_chunks / s if s > 0 else None

    @property
    def bytes_per_s(self) -> float | None:
        s = self.seconds
        return self.span_bytes / s if s > 0 else None


def request_options(rec: ReplyRecord) -> WireOptions:
    """The request the chat would make for `rec` to a loopchat server."""
    chat = not (len(rec.messages) == 1 and rec.messages[0].role == DOCUMENT)
    report = rec.start.top_k_report if rec.start is not None else MAX_TOP_LOGPROBS
    top = min(report, MAX_TOP_LOGPROBS if chat else MAX_COMPLETION_LOGPROBS)
    return WireOptions(
        chat=chat, stream=rec.mode != BLOCKING, logprobs=True, top_logprobs=top, include_usage=True, extension=True
    )


@dataclass(eq=False)
class ReplyWire:
    """The events of one reply on the wire, taken from its record by `sync()`."""

    rec: ReplyRecord
    entries: list[WireEntry] = field(default_factory=list)
    stats: WireStats = field(default_factory=WireStats)
    by_step: dict[int, int] = field(default_factory=dict)  # step index -> entry index
    remote: bool = False
    options: WireOptions | None = None  # local: the request modelled
    pending_steps: int = 0  # local: steps recorded but not serialized yet
    cancelled: bool = False  # local: stopped by the client, which closed the connection
    _ser: WireSerializer | None = None
    _fed_head: int = 0  # local: 1 after Start, 2 after ContextTrimmed/Prefill
    _fed_steps: int = 0
    _fed_finish: bool = False
    _passes: int = 0  # local: forward passes that gave the steps fed (under a draft, fewer than the steps)
    _fed_wire: int = 0  # remote: rec.wire entries taken
    _steps_before: list[int] = field(default_factory=list)  # remote: per entry, steps recorded before it

    @property
    def request(self) -> WireOptions | None:
        """Local: the request modelled (None: a remote reply, or before the reply's Start)."""
        if self.remote or self.source:
            return None
        if self.options is None and self.rec.start is not None:
            return request_options(self.rec)
        return self.options

    @property
    def serializer(self) -> WireSerializer | None:
        """Local: the serializer fed so far (None: none yet)."""
        return self._ser

    @property
    def stream(self) -> bool:
        return self.rec.mode != BLOCKING

    @property
    def waiting(self) -> bool:
        """Nothing is on the wire yet for a reply in flight."""
        return not self.entries and not self.rec.done

    def sync(self, budget: int = STEPS_PER_SYNC) -> None:
        """Take what the reply recorded since the last call (up to `budget` steps)."""
        rec = self.rec
        if rec.wire or self.source:
            if not self.remote:  # what arrives from a server, not what loopchat would send
                self._reset()
                self.remote = True
            self._sync_received()
        elif not self.remote:
            self._sync_local(budget)

    @property
    def source(self) -> str:
        """The URL of the server that generated the reply ("": this machine's engine)."""
        start = self.rec.start
        return start.source if start is not None else ""

    def _reset(self) -> None:
        self.entries.clear()
        self.by_step.clear()
        self.stats = WireStats()
        self._ser = None
        self.options = None
        self._fed_head = self._fed_steps = self._passes = 0
        self._fed_finish = False
        self.pending_steps = 0
        self.cancelled = False
        self._steps_before.clear()

    def _add(self, e: WireEntry) -> None:
        if e.step is not None:
            self.by_step.setdefault(e.step, len(self.entries))
        self.entries.append(e)
        self.stats.add(e)

    # ---- received (a remote backend) ------------------------------------------------
    def _sync_received(self) -> None:
        wire = self.rec.wire
        for i in range(self._fed_wire, len(wire)):
            ev, steps_before = wire[i]
            chunk, body, label = _kind(ev.text)
            self._steps_before.append(steps_before)
            self._add(WireEntry(ev.text, ev.nbytes, ev.t_ms, None, chunk, body, label))
        self._fed_wire = len(wire)

    def entry_of_step(self, index: int) -> int | None:
        """The entry that carried step `index` (None: none shown)."""
        if not self.remote:
            return self.by_step.get(index)
        # a received event is followed by the steps built from it: the step at position
        # p came with the last event that arrived when p steps were recorded
        steps = self.rec.steps
        p = (
            index
            if index < len(steps) and steps[index].index == index
            else next((i for i, s in enumerate(steps) if s.index == index), None)
        )
        if p is None:
            return None
        i = bisect.bisect_right(self._steps_before, p) - 1
        return i if i >= 0 else None

    # ---- serialized (the local engine, a trace) ----------------------------------------
    def _sync_local(self, budget: int) -> None:
        rec = self.rec
        if rec.start is None:
            return
        if not self.stream:
            if rec.finish is None:  # blocking: one body, after the loop
                return
            if rec.finish.reason is FinishReason.CANCELLED:
                self.cancelled = True  # the client went before the body: nothing was sent
                return
        if self._ser is None:
            self.options = o = request_options(rec)
            self._ser = WireSerializer(
                rec.start.model_name, o, id=new_id("chatcmpl" if o.chat else "cmpl"), created=request_time(rec)
            )
        ser = self._ser
        if self._fed_head == 0:
            self._emit(rec.start, None, None, ["role chunk · sent at the start"])
            self._fed_head = 1
        if self._fed_head == 1 and (rec.prefill is not None or rec.steps or rec.finish is not None):
            for ev in (rec.trimmed, rec.prefill):  # no chunk of their own: they ride on the next
                if ev is not None:
                    ser.feed(ev)
            self._fed_head = 2
        steps = rec.steps
        end = min(len(steps), self._fed_steps + budget)
        for i in range(self._fed_steps, end):
            st = steps[i]
            self._passes += not same_pass(steps[i - 1] if i else None, st)
            self._emit(st, _step_time(st), st.index, [_step_label(st, self._passes)])
        self._fed_steps = end
        self.pending_steps = len(steps) - end
        if self.pending_steps or self._fed_finish or rec.finish is None:
            return
        f = rec.finish
        self._fed_finish = True
        if f.reason is FinishReason.CANCELLED:
            # the chat stops a reply by closing the connection: the server cancels the
            # loop and sends nothing more (no finish chunk, no usage, no [DONE])
            ser.feed(f)
            self.cancelled = True
            return
        stop = steps[-1].index if steps and steps[-1].is_stop else None  # rides on the finish chunk
        if not self.stream:
            ser.feed(f)
            text = body_text(ser.body())
            self._add(WireEntry(text, len(text.encode("utf-8")), f.total_ms, None, False, True, "response body"))
            return
        self._emit(f, f.total_ms, stop, ["error" if f.error is not None else "finish chunk", "usage chunk"])
        self._add(WireEntry(_DONE_TEXT, len(DONE_LINE), f.total_ms, None, False, False, "end of stream"))

    def _emit(self, ev: Event, t_ms: float | None, step: int | None, labels: list[str]) -> None:
        """Feed `ev`; streaming, its SSE lines (`wire.WireSerializer.lines`) become entries."""
        assert self._ser is not None
        if not self.stream:
            self._ser.feed(ev)
            return
        for i, line in enumerate(self._ser.lines(ev)):
            label = labels[min(i, len(labels) - 1)]
            self._add(
                WireEntry(line.rstrip("\n"), len(line.encode("utf-8")), t_ms, step if i == 0 else None, label=label)
            )


def _kind(text: str) -> tuple[bool, bool, str]:
    """(a data chunk, a whole body, a label) for a received text: an SSE event (its
    lines: `data:`, or only comments and fields) or a response body (JSON)."""
    data = [line[5:].strip() for line in text.split("\n") if line.startswith("data:")]
    if data:
        if data == ["[DONE]"]:
            return False, False, "end of stream"
        return True, False, "chunk received"
    if text.lstrip()[:1] in ("{", "["):
        return False, True, "response body"
    return False, False, "received (no data: a comment or a keep-alive)"


def _step_label(st: Step, n: int) -> str:
    """The note above a step's chunk: its forward pass `n` (counted from 1, the prefill's);
    under a draft, when the pass gave it with others, the token and its part in the pass
    (pass_stats.py)."""
    if st.pass_report is None and n == st.index + 1:
        return f"pass {n}"
    what = f": {role(st)}" if st.pass_report is not None else ""
    return f"token {st.index + 1} · pass {n}{what}"


def _step_time(st: Step) -> float | None:
    """When the step's token was sampled, since the request (None: not recorded)."""
    t = st.elapsed_ms
    return t if t is not None and t > 0 else None
