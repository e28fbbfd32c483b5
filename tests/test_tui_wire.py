"""The wire view (F10): the side panel shows the reply as the SSE lines `loopchat serve`
would send for it (the local engine, through wire.WireSerializer) or as a server sent
them (WireReceived, a remote backend), with chunks/s and bytes/s measured from the
events' times. Real model for the local engine; events fed by a backend for the bytes
received."""

from __future__ import annotations

import json
import threading

import pytest
from rich.cells import cell_len
from tui_fixtures import (
    REPLY_TRACE,
    FakeBackend,
    StepGate,
    fake_app,
    palette_pick,
    wait_for,
    wait_run,
)

from loopchat.chat import wire_feed
from loopchat.chat.conversation import BLOCKING, STREAM, ReplyRecord
from loopchat.chat.prefs import Prefs, load_prefs
from loopchat.chat.wire_feed import STEPS_PER_SYNC, ReplyWire, body_text
from loopchat.events import Finish, FinishReason, Message, Prefill, RunDone, Step, WireReceived
from loopchat.settings import SamplingSettings
from loopchat.trace import read_trace
from loopchat.tui.app import LoopChatApp
from loopchat.tui.launch import create_app
from loopchat.tui.loop_panel import LoopPanel
from loopchat.tui.wire_lines import CONTENT, FOLDED, event_rows, styled
from loopchat.tui.wire_view import WireView, fmt_byte_rate, fmt_bytes, fmt_chunk_rate
from loopchat.wire import DONE_LINE, WireOptions, WireSerializer

SIZE = (160, 50)
PROMPT = "Write a short poem about the sea."


# ---------------------------------------------------------------------- helpers ----
def wire_text(app) -> str:
    return app.wire.text.plain


def shown_events(app) -> list[str]:
    """The events the view shows whole, as texts: each starts at a note row ('─ ...'),
    its rows joined (the view cuts rows without dropping a character)."""
    rows = wire_text(app).split("\n")
    events: list[list[str]] = []
    for row in rows:
        if row.startswith("─ "):
            events.append([])
        elif events:
            events[-1].append(row)
    return ["".join(r) for r in events]


def expected_lines(rec: ReplyRecord, ser_like: WireSerializer, finished: bool) -> list[str]:
    """What `loopchat serve` sends for rec's recorded events: a new serializer with the
    same id, created and options, fed the events in order."""
    ser = WireSerializer(ser_like.model, ser_like.options, id=ser_like.id, created=ser_like.created)
    lines = ser.lines(rec.start)
    for ev in (rec.trimmed, rec.prefill):
        if ev is not None:
            lines += ser.lines(ev)
    for st in rec.steps:
        lines += ser.lines(st)
    if finished:
        lines += ser.lines(rec.finish) + [DONE_LINE]
    return lines


def trace_record(mode: str = STREAM) -> ReplyRecord:
    _, traced = read_trace(REPLY_TRACE)
    events = [t.event for t in traced]
    start = events[0]
    rec = ReplyRecord(1, mode, start.messages, start=start)
    for ev in events[1:]:
        if isinstance(ev, Prefill):
            rec.prefill = ev
        elif isinstance(ev, Step):
            rec.steps.append(ev)
        elif isinstance(ev, Finish):
            rec.finish = ev
    return rec


# ---------------------------------------------------------------- the real model ----
@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def live_app(backend, tmp_path, max_tokens: int = 24, **prefs) -> LoopChatApp:
    prefs.setdefault("markdown", False)
    prefs.setdefault("wire_view", True)
    return create_app(
        backend=backend,
        prefs=Prefs(**prefs),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=42, max_tokens=max_tokens, temperature=0.8),
    )


async def send(pilot, text: str) -> None:
    await wait_for(pilot, pilot.app.model_ready.is_set, 30, "the model")
    await pilot.press(*text, "enter")


@pytest.mark.model
async def test_streaming_shows_what_the_serializer_sends_as_the_steps_come(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path, wire_folded=False)
    # unfolded, one step's chunk is ~50 rows at this width: tall enough for the last one whole
    async with app.run_test(size=(160, 90)) as pilot:
        gate = StepGate(app, after=6)
        await send(pilot, PROMPT)
        # held after 6 steps: the view shows the role chunk and 6 chunks, no more
        await wait_for(pilot, lambda: "─ pass 6 ·" in wire_text(app), 30, "the 6th pass's chunk")
        assert gate.holding and not app.current.done
        rec = app.current
        w = app.wire.wire_of(rec)
        assert w.options == WireOptions(chat=True, stream=True, logprobs=True, top_logprobs=10, include_usage=True)
        lines = expected_lines(rec, w.serializer, finished=False)
        assert len(lines) == 7
        assert [e.text + "\n\n" for e in w.entries] == lines
        shown = shown_events(app)
        assert shown and shown == [line.rstrip("\n") for line in lines[-len(shown) :]]
        text = wire_text(app)
        assert "as loopchat serve would send it · /v1/chat/completions · stream · logprobs top 10 · usage" in " ".join(
            text.split("\n")[:4]
        ).replace("  ", " ")
        assert "Reply 1 · streaming · generating" in text
        gate.release()
        await wait_run(pilot)
        await wait_for(pilot, lambda: wire_text(app).rstrip().endswith("data: [DONE]"), 5, "the end of the stream")
        lines = expected_lines(rec, w.serializer, finished=True)
        assert [e.text + "\n\n" for e in w.entries] == lines
        shown = shown_events(app)
        assert len(shown) >= 3 and shown == [line.rstrip("\n") for line in lines[-len(shown) :]]
        # the figures: every byte of every line, and rates from the recorded times
        n_chunks = sum(1 for x in lines if x != DONE_LINE)
        flat = " ".join(wire_text(app).split("\n")[:6])
        assert f"{n_chunks:,} chunks · {fmt_bytes(sum(len(x.encode()) for x in lines))}" in flat
        timed = [(st.elapsed_ms, line) for st, line in zip(rec.steps, lines[1:]) if not st.is_stop]
        timed += [(rec.finish.total_ms, line) for line in lines[len(timed) + 1 :]]
        assert all(t > 0 for t, _ in timed)
        span_s = (timed[-1][0] - timed[0][0]) / 1000
        chunks = sum(1 for _, line in timed[1:] if line != DONE_LINE)
        nbytes = sum(len(line.encode()) for _, line in timed[1:])
        assert f"{fmt_chunk_rate(chunks / span_s)} · {fmt_byte_rate(nbytes / span_s)}" in flat


@pytest.mark.model
async def test_blocking_shows_nothing_until_the_one_body(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path, streaming=False)
    async with app.run_test(size=SIZE) as pilot:
        gate = StepGate(app, after=3)
        await send(pilot, PROMPT)
        await wait_for(pilot, lambda: gate.holding, 30, "3 steps")
        rec = app.current
        assert rec.mode == BLOCKING
        # the clock runs while the client waits; nothing is on the wire (or serialized)
        await wait_for(
            pilot,
            lambda: (
                "waiting for the response body… 0.0 s" not in wire_text(app)
                and "waiting for the response body…" in wire_text(app)
                and "3 passes run" in wire_text(app)
            ),
            5,
            "the wait's clock and the passes",
        )
        w = app.wire.wire_of(rec)
        assert w.entries == [] and w.serializer is None
        text = wire_text(app)
        assert "data:" not in text
        assert "3 passes run, nothing sent yet" in " ".join(text.split("\n")[:5])
        assert "as loopchat serve would send it · /v1/chat/completions · no stream: one body" in " ".join(
            text.split("\n")[:4]
        )
        gate.release()
        await wait_run(pilot)
        await wait_for(pilot, lambda: "one body ·" in wire_text(app), 5, "the body")
        assert len(w.entries) == 1
        ser = w.serializer
        expect = WireSerializer(ser.model, ser.options, id=ser.id, created=ser.created)
        assert ser.options.stream is False
        for ev in (rec.start, rec.prefill, *rec.steps, rec.finish):
            expect.feed(ev)
        body = expect.body()
        assert w.entries[0].text == body_text(body)
        assert json.loads(w.entries[0].text)["choices"][0]["message"]["content"] == rec.finish.text
        e = w.entries[0]
        assert e.nbytes == len(body_text(body).encode())
        text = wire_text(app)
        assert f"one body · {fmt_bytes(e.nbytes)} · at " in text
        assert "no stream: one body" in " ".join(text.split("\n")[:4])
        # shown from its start
        assert shown_events(app)[0].startswith('{"id":"chatcmpl-')


@pytest.mark.model
async def test_the_key_during_a_reply_and_nothing_serialized_while_hidden(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path, max_tokens=40, wire_view=False)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, PROMPT)
        await wait_run(pilot)
        assert app.wire.replies_kept == 0  # hidden: no serializer, no line
        gate = StepGate(app, after=4)
        await pilot.press(*"Again", "enter")
        await wait_for(pilot, lambda: gate.holding, 30, "4 steps")
        await pilot.press("f10")  # mid-reply: caught up at once
        assert app.wire.display and not app.panel.display
        await wait_for(pilot, lambda: "─ pass 4 ·" in wire_text(app), 5, "the 4 passes")
        await pilot.press("f10", "f10")
        gate.release()
        await wait_run(pilot)
        await wait_for(pilot, lambda: wire_text(app).rstrip().endswith("data: [DONE]"), 5, "the end")
        assert app.last_error is None


# ------------------------------------------------------------------ no model ----
async def test_f10_switches_to_the_wire_and_back_remembered(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.query_one(LoopPanel).display and not app.query_one(WireView).display
        await pilot.press("f10")  # no reply yet
        await pilot.pause()
        assert app.wire.display and not app.panel.display
        assert "The loop on the wire" in wire_text(app)
        assert load_prefs(tmp_path / "p.json").wire_view is True
        await pilot.press("f10")
        await pilot.pause()
        assert app.panel.display and not app.wire.display
        assert load_prefs(tmp_path / "p.json").wire_view is False
        assert "Wire view" in [c.title for c in app.key_commands()]
    app = fake_app(tmp_path, wire_view=True)  # the next start: as it was left
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.wire.display and not app.panel.display


async def test_the_command_palette_entry_and_a_click_fold(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await palette_pick(pilot, "Wire view")
        await wait_for(pilot, lambda: app.wire.display, 5, "the wire view")
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        await wait_for(pilot, lambda: "[DONE]" in wire_text(app), 5, "the stream's end")
        assert "{… " in wire_text(app) and "long values folded" in wire_text(app)
        await pilot.click(WireView)
        await wait_for(pilot, lambda: "whole lines ·" in wire_text(app), 5, "unfolded")
        assert "{… " not in wire_text(app)
        assert load_prefs(tmp_path / "p.json").wire_folded is False


async def test_a_selected_token_shows_its_chunk(tmp_path) -> None:
    app = fake_app(tmp_path, wire_view=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        await pilot.press("alt+left", "alt+left")  # " you" (the tokens: ... " you", "?")
        await pilot.pause()
        text = wire_text(app)
        assert "chunk of pass 7 (selected token)" in text
        last = shown_events(app)[-1]
        assert '"delta":{"content":" you"}' in last
        assert text.split("\n")[-1].strip()  # the selected chunk ends the view


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_stopped_reply_sends_nothing_more(tmp_path, streaming) -> None:
    """Esc: the chat closes the connection, so the server sends no finish chunk, no
    usage and no [DONE] (blocking: no body at all)."""
    app = fake_app(
        tmp_path, FakeBackend(tokens=[f" t{i}" for i in range(2000)], delay=0.005), wire_view=True, streaming=streaming
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: app.steps_seen >= 5, 10, "tokens")
        await pilot.press("escape")
        await wait_run(pilot, 10)
        rec = app.conversation.replies[0]
        assert rec.finish.reason == FinishReason.CANCELLED
        w = app.wire.wire_of(rec)
        if streaming:
            await wait_for(pilot, lambda: "nothing more was sent" in wire_text(app), 5, "the note")
            assert len(w.entries) == 1 + len(rec.steps)  # the role chunk and one per token, no more
            assert "[DONE]" not in wire_text(app) and 'finish_reason":"stop' not in wire_text(app)
        else:
            await wait_for(pilot, lambda: "stopped before the body" in wire_text(app), 5, "the note")
            assert w.entries == [] and w.serializer is None


def wheel(widget, up: bool):
    from textual import events

    cls = events.MouseScrollUp if up else events.MouseScrollDown
    return cls(widget, 2, 2, 0, -1 if up else 1, 0, False, False, False)


async def test_the_wheel_scrolls_back_through_the_events(tmp_path) -> None:
    app = fake_app(tmp_path, wire_view=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        await wait_for(pilot, lambda: wire_text(app).rstrip().endswith("data: [DONE]"), 5, "the end")

        def notes() -> list[str]:
            return [row.split(" · ")[0][2:] for row in wire_text(app).split("\n") if row.startswith("─ ")]

        assert notes()[-1] == "end of stream"
        for _ in range(4):
            app.wire.post_message(wheel(app.wire, up=True))
        await wait_for(pilot, lambda: not wire_text(app).rstrip().endswith("data: [DONE]"), 5, "scrolled")
        assert app.wire.scrolled == 12 and "end of stream" not in notes()
        for _ in range(6):  # past the newest: it stays at the newest
            app.wire.post_message(wheel(app.wire, up=False))
        await wait_for(pilot, lambda: wire_text(app).rstrip().endswith("data: [DONE]"), 5, "back at the end")
        assert app.wire.scrolled == 0


async def test_a_long_reply_is_caught_up_over_frames(tmp_path) -> None:
    n = 2 * STEPS_PER_SYNC + 50
    app = fake_app(tmp_path, FakeBackend(tokens=[f" t{i}" for i in range(n)], delay=0))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        w = ReplyWire(rec)
        w.sync()
        assert w.pending_steps == len(rec.steps) - STEPS_PER_SYNC  # one frame's budget
        await pilot.press("f10")
        await wait_for(pilot, lambda: wire_text(app).rstrip().endswith("data: [DONE]"), 10, "caught up")
        assert len(app.wire.wire_of(rec).entries) == 1 + n + 2 + 1  # role, tokens, finish, usage, [DONE]


# --------------------------------------------------------------- bytes received ----
class ReceivingBackend(FakeBackend):
    """Events as a remote backend hands them over: each SSE event's text as it arrived
    (WireReceived, here every 20 ms by a fixed clock), then the events built from it. The
    texts are a loopchat server's (WireSerializer); blocking, one body."""

    def __init__(self, tokens: list[str]) -> None:
        super().__init__(tokens=tokens, delay=0)
        self.stream = True
        self.sent: list[WireReceived] = []

    def generate(self, request) -> int:
        self.runs += 1
        self.stream = request.stream
        run = self.runs
        threading.Thread(target=self._play, args=(request.messages, request.settings, run), daemon=True).start()
        return run

    def _play(self, messages, settings, run) -> None:
        events = []
        super_sink, self.sink = self.sink, events.append
        try:
            FakeBackend._run(self, messages, settings)
        finally:
            self.sink = super_sink
        emit = self.sink
        body = [e for e in events if not isinstance(e, RunDone)]
        ser = WireSerializer("remote-model", WireOptions(stream=self.stream, logprobs=True, top_logprobs=3))
        t = 0.0
        if not self.stream:
            for ev in body:
                ser.feed(ev)
            text = body_text(ser.body())
            self._got(WireReceived(text, len(text.encode()), 500.0, run))
            for ev in body:
                emit(ev)
        else:
            for ev in body:
                for line in ser.lines(ev):
                    t += 20.0
                    self._got(WireReceived(line.rstrip("\n"), len(line.encode()), t, run))
                emit(ev)
            self._got(WireReceived(DONE_LINE.rstrip("\n"), len(DONE_LINE), t + 20.0, run))
        emit(RunDone(run))

    def _got(self, ev: WireReceived) -> None:
        self.sent.append(ev)
        self.sink(ev)


async def test_received_bytes_are_shown_as_they_arrived(tmp_path) -> None:
    backend = ReceivingBackend(["Hello", ",", " wire", "!"])
    app = fake_app(tmp_path, backend, wire_view=True, wire_folded=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        await wait_for(pilot, lambda: wire_text(app).rstrip().endswith("data: [DONE]"), 5, "the end")
        rec = app.conversation.replies[0]
        assert [ev for ev, _ in rec.wire] == backend.sent
        w = app.wire.wire_of(rec)
        assert w.remote and [e.text for e in w.entries] == [ev.text for ev in backend.sent]
        text = wire_text(app)
        assert "as received from the server · SSE stream" in text
        assert "loopchat serve would" not in text
        shown = shown_events(app)
        assert shown == [ev.text for ev in backend.sent][-len(shown) :]
        # totals and rates from the received sizes and arrival times
        sent = backend.sent
        chunks = sum(1 for ev in sent if ev.text != "data: [DONE]")
        span_s = (sent[-1].t_ms - sent[0].t_ms) / 1000
        rate_chunks = sum(1 for ev in sent[1:] if ev.text != "data: [DONE]") / span_s
        rate_bytes = sum(ev.nbytes for ev in sent[1:]) / span_s
        flat = " ".join(text.split("\n")[:6])
        assert f"{chunks} chunks · {fmt_bytes(sum(ev.nbytes for ev in sent))}" in flat
        assert f"{fmt_chunk_rate(rate_chunks)} · {fmt_byte_rate(rate_bytes)}" in flat
        # a selected token: the chunk it came in
        await pilot.press("alt+left", "alt+left")  # " wire"
        await pilot.pause()
        assert "chunk of pass 3 (selected token)" in wire_text(app)
        assert '"delta":{"content":" wire"}' in shown_events(app)[-1]


async def test_received_blocking_body(tmp_path) -> None:
    backend = ReceivingBackend(["Hello", "!"])
    app = fake_app(tmp_path, backend, wire_view=True, wire_folded=False, streaming=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        await wait_for(pilot, lambda: "one body ·" in wire_text(app), 5, "the body")
        body = backend.sent[0]
        assert len(backend.sent) == 1
        assert f"one body · {fmt_bytes(body.nbytes)} · at 500 ms" in wire_text(app)
        assert "as received from the server · one response body" in wire_text(app)
        assert shown_events(app)[0] == body.text[: len(shown_events(app)[0])]


# -------------------------------------------------------------------- the lines ----
def test_lines_are_the_text_styled_and_cut_without_losing_a_character() -> None:
    rec = trace_record()
    ser = WireSerializer("m", WireOptions(logprobs=True, top_logprobs=10, include_usage=True))
    lines = [line.rstrip("\n") for line in expected_lines(rec, ser, finished=True)]
    odd = 'data: {"choices":[{"delta":{"content":"日本語 ✓ 🌊\\n"},"x":"a\tb"}],"loopchat":{"k":[1,2]}}'
    for text in [*lines, odd, "data: [DONE]", ": ping"]:
        assert "".join(s for s, _ in styled(text, fold=False)) == text.replace("\t", "\u2409")
        for width in (7, 48, 75):
            rows = event_rows(text, width, fold=False)
            assert all(cell_len("".join(s for s, _ in row)) <= width for row in rows)
            assert "".join(s for row in rows for s, _ in row) == text.replace("\t", "\u2409")
    # the reply's text is highlighted, exactly the delta's content
    chunk = lines[2]
    content = json.loads(chunk[6:])["choices"][0]["delta"]["content"]
    assert [s for s, st in styled(chunk, fold=True) if st == CONTENT] == [json.dumps(content)]


def test_folded_values_say_their_exact_size() -> None:
    rec = trace_record()
    ser = WireSerializer("m", WireOptions(logprobs=True, top_logprobs=10))
    ser.feed(rec.start)
    ser.feed(rec.prefill)
    line = ser.lines(rec.steps[0])[0].rstrip("\n")
    obj = json.loads(line[6:])

    def size(value) -> int:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())

    folded = [s for s, st in styled(line, fold=True) if st == FOLDED]
    top = obj["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert folded == [f"[… {size(top):,} B]", f"{{… {size(obj['loopchat']):,} B}}"]


def test_a_row_does_not_end_at_the_comma_of_a_folded_size() -> None:
    """`{… 1,428 B}` broken after "1," read as two figures (a 120-column chat, the wire
    view beside the transcript): a row ends at another comma or where it is full."""
    rec = trace_record()
    ser = WireSerializer("m", WireOptions(logprobs=True, top_logprobs=10))
    ser.feed(rec.start)
    ser.feed(rec.prefill)
    line = ser.lines(rec.steps[0])[0].rstrip("\n")
    markers = [s for s, st in styled(line, fold=True) if st == FOLDED and "," in s]
    assert markers  # the loopchat extension is over 1,000 bytes
    for width in range(20, 100):
        texts = ["".join(s for s, _ in row) for row in event_rows(line, width, fold=True)]
        assert "".join(texts) == "".join(s for s, _ in styled(line, fold=True))
        for marker in markers:
            head, tail = marker.split(",", 1)
            # (a row that is full may end anywhere: JSON is cut character by character)
            assert not any(
                a.endswith(head + ",") and b.startswith(tail) and cell_len(a) < width for a, b in zip(texts, texts[1:])
            ), width


def test_the_sync_budget_and_the_same_lines_in_the_end() -> None:
    rec = trace_record()
    w = ReplyWire(rec)
    w.sync(budget=16)
    assert w.pending_steps == len(rec.steps) - 16 and len(w.entries) == 1 + 16
    while w.pending_steps:
        w.sync(budget=16)
    w.sync(budget=16)  # the finish
    lines = expected_lines(rec, w.serializer, finished=True)
    assert [e.text + "\n\n" for e in w.entries] == lines
    assert w.stats.nbytes == sum(len(x.encode()) for x in lines)


def test_a_document_is_a_completions_request() -> None:
    rec = trace_record()
    rec.messages = (Message("document", "Once upon a time"),)
    w = ReplyWire(rec)
    w.sync()
    assert w.options.chat is False and w.options.top_logprobs == 5
    assert json.loads(w.entries[1].text[6:])["object"] == "text_completion"


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
def test_snapshot_of_the_wire_view(snap_compare, tmp_path, monkeypatch, size) -> None:
    monkeypatch.setattr(wire_feed, "new_id", lambda prefix: f"{prefix}-0123456789abcdef01234567")
    monkeypatch.setattr(wire_feed, "request_time", lambda rec: 1764800000)

    async def wire(pilot) -> None:
        await wait_run(pilot, 10)
        await pilot.press("f10")
        await pilot.pause()

    app = create_app(replay=str(REPLY_TRACE), replay_speed=0, prefs=Prefs(), prefs_path=tmp_path / "p.json")
    assert snap_compare(app, terminal_size=size, run_before=wire)


# ------------------------------------------------------------- a real server ----
@pytest.mark.model
@pytest.mark.server
async def test_a_loopchat_servers_bytes_as_received_in_both_modes(tmp_path) -> None:
    """The chat on `loopchat serve` (the remote backend, a real server on a free port):
    the view shows the very texts received, streaming and blocking."""
    from remote_servers import LoopchatServer

    server = LoopchatServer()
    try:
        for streaming in (True, False):
            app = create_app(
                url=server.url,
                prefs=Prefs(markdown=False, wire_view=True, wire_folded=False, streaming=streaming),
                prefs_path=tmp_path / "p.json",
                settings=SamplingSettings(seed=5, max_tokens=12),
            )
            async with app.run_test(size=SIZE) as pilot:
                await send(pilot, "Hi there")
                await wait_run(pilot, 120)
                rec = app.conversation.replies[0]
                assert rec.finish is not None and rec.finish.text and app.last_error is None
                received = [ev for ev, _ in rec.wire]
                w = app.wire.wire_of(rec)
                await wait_for(
                    pilot, lambda w=w, received=received: len(w.entries) == len(received), 5, "every event shown"
                )
                assert w.remote and [e.text for e in w.entries] == [ev.text for ev in received]
                text = wire_text(app)
                assert f"as received from {server.url}/v1" in text
                total = fmt_bytes(sum(ev.nbytes for ev in received))
                if streaming:
                    assert received[-1].text == "data: [DONE]" and text.rstrip().endswith("data: [DONE]")
                    chunks = [json.loads(ev.text[6:]) for ev in received[:-1]]
                    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
                    assert content == rec.finish.text
                    assert f"{len(chunks)} chunks · {total}" in " ".join(text.split("\n")[:6])
                    shown = shown_events(app)
                    assert shown == [ev.text for ev in received][-len(shown) :]
                else:
                    assert len(received) == 1
                    body = json.loads(received[0].text)
                    assert body["choices"][0]["message"]["content"] == rec.finish.text
                    assert f"one body · {total} · at " in text
                    assert shown_events(app)[0] == received[0].text[: len(shown_events(app)[0])]
    finally:
        server.stop()
