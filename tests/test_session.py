"""ChatSession without Textual: events in, conversation and updates out, gc paired."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from loopchat.chat.conversation import BLOCKING, STREAM
from loopchat.chat.session import ChatSession, Refused
from loopchat.events import (
    Candidate,
    Finish,
    FinishReason,
    Message,
    ModelReady,
    Prefill,
    RunDone,
    Start,
    Step,
    WorkerError,
)
from loopchat.settings import SamplingSettings

READY = ModelReady("m", "/m.gguf", 2048, 100, 1, 5.0)


class Backend:
    """A backend that only records what it is asked (the test plays its events)."""

    can_generate = True
    live_settings = True
    name = "m"
    loading = None
    system_prompt = "Be brief."
    default_settings = SamplingSettings(temperature=0.5)
    model_names = ["m"]
    ready = None

    def __init__(self) -> None:
        self.runs: list[tuple[tuple[Message, ...], SamplingSettings]] = []
        self.settings_sent: list[SamplingSettings] = []
        self.cancelled = 0
        self.loaded: list[str] = []

    def describe(self, name):
        return ""

    def placeholder(self):
        return None

    def attach(self, sink):
        pass

    def start(self):
        pass

    def flush(self):
        pass

    def close(self):
        pass

    def load(self, name):
        self.loaded.append(name)

    def generate(self, request):
        self.runs.append((request.messages, request.settings))
        self.reuse_at_most = request.reuse_at_most
        return len(self.runs)

    def set_settings(self, settings):
        self.settings_sent.append(settings)

    def cancel(self):
        self.cancelled += 1


def reply_events(run: int, messages, text: str = "Hi there", settings=None) -> list:
    settings = (settings or SamplingSettings()).with_seed(1)
    start = Start("m", "/m.gguf", 1, 2048, 100, 1, tuple(messages), "doc", (1, 2), settings, 10)
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    cand = (Candidate(1, "x", 1.0),)
    steps = [
        Step(i, i, p, p, False, cand, cand, 1.0, 1, 1.0, 1, 0.0, 0.0, 1, 5.0, 1, 0.1, settings, (), 3 + i)
        for i, p in enumerate(pieces)
    ]
    finish = Finish(FinishReason.STOP, 2, len(steps), len(steps), 1.0, 2.0, 3.0, 4.0, 50.0, text, 10, 2048)
    return [start, Prefill(2, 0, 2, 1, 1.0), *steps, finish, RunDone(run)]


@pytest.fixture()
def session() -> ChatSession:
    s = ChatSession(Backend())
    s.consume([READY])
    return s


def test_a_message_becomes_a_turn_when_its_reply_finishes(session: ChatSession) -> None:
    rec = session.send("  Hello  ", STREAM)
    assert rec.started_at > 0  # the waiting view counts the seconds from it
    messages, settings = session.backend.runs[0]
    assert messages == (Message("system", "Be brief."), Message("user", "Hello"))
    assert settings == SamplingSettings(temperature=0.5) and session.generating
    u = session.consume(reply_events(1, messages)[:4])
    assert u.steps == 2 and not u.ended and session.conversation.turns == []
    assert [(r, [s.text for s in steps]) for r, steps in session.take_text()] == [(rec, ["Hi", " there"])]
    assert session.take_text() == []
    u = session.consume(reply_events(1, messages)[4:])
    assert u.finished == [rec] and not session.generating
    assert session.conversation.turns == [Message("user", "Hello"), Message("assistant", "Hi there")]
    assert session.pending_prompt is None


def test_nothing_runs_without_a_model_or_while_generating() -> None:
    s = ChatSession(Backend())
    with pytest.raises(Refused, match="No model is loaded"):
        s.send("hi", STREAM)
    s.consume([READY])
    s.send("hi", STREAM)
    with pytest.raises(Refused, match="Still generating"):
        s.send("again", STREAM)


def test_a_refused_prompt_drops_its_turn_and_gives_the_text_back(session: ChatSession) -> None:
    rec = session.send("a very long message", STREAM)
    u = session.consume([WorkerError("too long for the context", "generate"), RunDone(1)])
    assert u.dropped is rec and u.restore_prompt == "a very long message"
    assert session.conversation.replies == [] and session.current is None


def test_stopped_before_the_first_token_gives_the_message_back(session: ChatSession) -> None:
    session.send("hello", STREAM)
    messages = session.backend.runs[0][0]
    start, prefill = reply_events(1, messages)[:2]
    cancelled = Finish(FinishReason.CANCELLED, 2, 0, 0, 1.0, 0.0, 0.0, 1.0, 0.0, "", 2, 2048)
    u = session.consume([start, prefill, cancelled, RunDone(1)])
    assert u.restore_prompt == "hello" and session.conversation.turns == []
    # and the turn goes: not in the conversation (nor, through the app, the transcript and history)
    assert u.dropped is not None and session.conversation.replies == [] and session.current is None


def test_gc_is_frozen_for_a_run_and_thawed_by_its_run_done_on_every_path(session: ChatSession) -> None:
    gc.collect()
    base = gc.get_freeze_count()
    session.send("one", STREAM)
    assert gc.get_freeze_count() > base
    # an error before Start (the prompt refused): thawed by the run's RunDone
    session.consume([WorkerError("too long", "generate")])
    assert gc.get_freeze_count() > base  # RunDone not there yet
    session.consume([RunDone(1)])
    assert gc.get_freeze_count() == 0
    # Ctrl+N mid-reply: the old run's events are ignored, its RunDone still thaws
    session.send("two", STREAM)
    messages = session.backend.runs[1][0]
    session.consume(reply_events(2, messages)[:3])
    session.new_conversation()
    assert session.backend.cancelled == 1 and session.conversation.replies == []
    session.consume(reply_events(2, messages)[3:])
    assert gc.get_freeze_count() == 0 and session.conversation.turns == []
    # a run whose RunDone never comes (the app closes): close() thaws
    session.send("three", STREAM)
    session.close()
    assert gc.get_freeze_count() == 0


def test_a_stale_run_done_does_not_end_the_next_reply(session: ChatSession) -> None:
    session.send("one", STREAM)
    messages = session.backend.runs[0][0]
    events = reply_events(1, messages)
    session.consume(events[:-1])  # finished; its RunDone comes later
    rec2 = session.send("two", STREAM)
    session.consume([events[-1]])  # RunDone(1)
    assert not rec2.done and session.generating


def test_settings_changed_mid_reply_reach_the_reply_and_the_next_one(session: ChatSession) -> None:
    session.send("one", STREAM)
    session.change_settings(temperature=1.2)
    assert session.backend.settings_sent == [SamplingSettings(temperature=1.2)]
    assert session.settings.temperature == 1.2 and session.in_force().temperature == 1.2
    session.consume(reply_events(1, session.backend.runs[0][0]))
    session.change_settings(top_k=3)  # between replies: the next reply's only
    assert len(session.backend.settings_sent) == 1 and session.in_force().top_k == 3


def test_replay_in_the_other_mode_keeps_the_users_settings(session: ChatSession) -> None:
    session.send("one", STREAM)
    recorded = SamplingSettings(temperature=0.9, seed=77)
    first = session.current
    session.consume(reply_events(1, session.backend.runs[0][0], settings=recorded))
    session.change_settings(temperature=0.1)
    rec = session.replay_other_mode()
    assert rec.mode == BLOCKING and rec.replay_of == first.number and not rec.in_history
    assert session.backend.runs[1][1] == recorded.with_seed(1)
    assert session.backend.reuse_at_most == 0  # the prompt evaluated as the first time
    assert session.settings.temperature == 0.1
    session.consume(reply_events(2, session.backend.runs[1][0]))
    assert len(session.conversation.turns) == 2  # a replay is not a turn


def test_regenerate_replaces_the_last_turn_and_moves_a_pinned_seed(session: ChatSession) -> None:
    session.change_settings(seed=41)
    session.send("one", STREAM)
    session.consume(reply_events(1, session.backend.runs[0][0], text="First"))
    old, new = session.regenerate(STREAM)
    assert old.replaced_by == new.number and not old.in_history
    assert session.backend.runs[1][1].seed == 42 and session.settings.seed == 42
    assert session.conversation.turns == []
    session.consume(reply_events(2, session.backend.runs[1][0], text="Second"))
    assert [m.content for m in session.conversation.turns] == ["one", "Second"]


def test_completion_mode_sends_one_document_and_appends_to_it(session: ChatSession) -> None:
    from loopchat.events import DOCUMENT

    assert session.toggle_mode().startswith("Completion mode") and session.completion
    session.send("Once upon a time", STREAM)  # as it is: no strip, no system prompt
    messages = session.backend.runs[0][0]
    assert messages == (Message(DOCUMENT, "Once upon a time"),)
    session.consume(reply_events(1, messages, text=", a fox"))
    assert session.conversation.document() == "Once upon a time, a fox"
    session.send("", STREAM)  # an empty Enter: more of the document as it is
    assert session.backend.runs[1][0] == (Message(DOCUMENT, "Once upon a time, a fox"),)
    session.consume(reply_events(2, session.backend.runs[1][0], text=" ran"))
    session.send(" and then\n", STREAM)  # the user steers: appended as typed
    assert session.backend.runs[2][0] == (Message(DOCUMENT, "Once upon a time, a fox ran and then\n"),)
    session.consume(reply_events(3, session.backend.runs[2][0], text="Fin"))
    assert [(m.role, m.content) for m in session.conversation.turns] == [
        (DOCUMENT, "Once upon a time"),
        ("assistant", ", a fox"),
        (DOCUMENT, ""),
        ("assistant", " ran"),
        (DOCUMENT, " and then\n"),
        ("assistant", "Fin"),
    ]
    old, new = session.regenerate(STREAM)  # F5: the last continuation again, same document
    assert session.backend.runs[3][0] == session.backend.runs[2][0]
    assert session.conversation.document() == "Once upon a time, a fox ran"
    session.consume(reply_events(4, session.backend.runs[3][0], text="End"))
    assert session.conversation.document().endswith("ran and then\nEnd")
    assert session.conversation.shown_document(new) == session.conversation.replies[:2] + [new]


def test_the_mode_key_starts_a_new_conversation_in_the_other_mode(session: ChatSession) -> None:
    session.send("Hello", STREAM)
    with pytest.raises(Refused, match="Esc"):
        session.toggle_mode()  # not while a reply runs
    session.consume(reply_events(1, session.backend.runs[0][0]))
    session.toggle_mode()
    assert session.completion and session.conversation.replies == [] and session.conversation.turns == []
    with pytest.raises(Refused, match="document is empty"):
        session.send("", STREAM)
    session.consume([READY])  # a model that loads keeps the mode the user chose
    assert session.completion
    assert session.toggle_mode().startswith("Chat mode") and not session.completion
    assert session.takes("x") and not session.takes("  ")


def test_a_model_without_a_chat_template_opens_in_completion_mode_and_says_so() -> None:
    s = ChatSession(Backend())
    note = "m has no chat template in its GGUF file: ..."
    u = s.consume([ModelReady("m", "/m.gguf", 2048, 100, 1, 5.0, template_note=note, mode="completion")])
    assert s.completion
    assert u.warnings == ["completion mode: this model has no chat template; set chat_template in models.toml for chat"]
    s.toggle_mode()  # chat on it by hand: the template note says what it is fed
    u = s.consume([ModelReady("m", "/m.gguf", 2048, 100, 1, 5.0, template_note=note, mode="completion")])
    assert not s.completion and u.warnings == [note + "; in the chat, Ctrl+L switches to completion mode"]
    configured = ChatSession(Backend())  # models.toml's mode = "completion": no note
    u = configured.consume([ModelReady("m", "/m.gguf", 2048, 100, 1, 5.0, mode="completion")])
    assert configured.completion and u.warnings == []


def test_a_model_switch_keeps_a_document_under_way() -> None:
    s = ChatSession(Backend())
    s.consume([ModelReady("m", "/m.gguf", 2048, 100, 1, 5.0, mode="completion")])
    s.send("Once", STREAM)
    s.consume(reply_events(1, s.backend.runs[0][0], text=" upon"))
    s.switch_model("m")
    u = s.consume([READY])  # a chat model: the document goes on with it, no template
    assert s.completion and u.warnings == []
    s.send("", STREAM)
    assert s.backend.runs[1][0][0].content == "Once upon"
    s.new_conversation()  # a new document: the mode holds
    assert s.completion


def test_a_played_trace_makes_its_own_turns() -> None:
    s = ChatSession(Backend())
    msgs = (Message("user", "from the trace"),)
    u = s.consume(reply_events(1, msgs))
    [(user, rec)] = u.started
    assert user == "from the trace" and u.finished == [rec] and rec.text == "Hi there"


def test_the_token_cursor(session: ChatSession) -> None:
    with pytest.raises(Refused):
        session.next_token(None, -1)
    session.send("one", STREAM)
    session.consume(reply_events(1, session.backend.runs[0][0], text="a b c"))
    assert session.next_token(None, -1) == (1, 2)
    assert session.next_token((1, 2), -1) == (1, 1)
    assert session.next_token((1, 2), 1) is None


def test_the_session_and_the_engine_layer_import_no_textual() -> None:
    code = (
        "import sys, loopchat.chat.session, loopchat.backends.live, loopchat.backends.replay;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class BranchingBackend(Backend):
    can_branch = True
    branch_refusal = ""

    def __init__(self) -> None:
        super().__init__()
        self.ready = READY
        self.branches: list[tuple[tuple[int, ...], int | None]] = []

    def generate(self, request):
        self.branches.append((request.reply_prefix, request.first_token))
        return super().generate(request)


def test_a_branch_asks_for_the_prefix_and_the_token_and_is_refused_for_another_models_reply() -> None:
    s = ChatSession(BranchingBackend())
    s.consume([READY])
    rec = s.send("Hello", STREAM)
    messages, _ = s.backend.runs[0]
    s.consume(reply_events(1, messages, "one two three four"))
    old, new = s.branch(rec.number, 2, 77, STREAM)
    assert s.backend.branches[-1] == ((0, 1), 77)  # the steps' token ids before the branch point
    assert new.steps == old.steps[:2] and new.branch_at == 2 and old.hidden
    assert s.conversation.turns == []  # the turn waits for the new version
    s.cancel()
    s.consume([RunDone(2)])
    # the model was switched since (another file): the reply's tokens mean nothing to the new one
    rec2 = s.send("Again", STREAM)
    s.consume(reply_events(3, s.backend.runs[-1][0], "five six"))
    other = ModelReady("other", "/other.gguf", 2048, 100, 1, 5.0)
    s.consume([other])
    s.backend.ready = other
    with pytest.raises(Refused, match="switch back"):
        s.branch(rec2.number, 1, None, STREAM)
    # a new conversation forgets every version
    s.new_conversation()
    assert s.conversation.replies == [] and s.conversation.turns == []
