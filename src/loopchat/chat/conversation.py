"""What the app remembers about the current conversation: messages and per-step records.

Every number the UI shows is read from these records, which hold the engine's events
as they arrived (Start, ContextTrimmed, Prefill, Step*, Finish).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loopchat.constraint import Constraint
from loopchat.engine.chat_prompt import CHAT, COMPLETION
from loopchat.event_lines import prefix_text
from loopchat.events import (
    DOCUMENT,
    ContextTrimmed,
    Finish,
    FinishReason,
    Message,
    Prefill,
    Start,
    Step,
    WireReceived,
)
from loopchat.step_control import SAMPLED

STREAM = "stream"
BLOCKING = "blocking"


@dataclass(eq=False)
class ReplyRecord:
    number: int  # 1-based, in order of appearance in the transcript
    mode: str  # STREAM | BLOCKING
    messages: tuple[Message, ...]  # exactly what was sent
    in_history: bool = True  # False for a side-by-side replay (not part of the conversation)
    replay_of: int | None = None  # the reply number this one re-runs
    replaced_by: int | None = None  # the reply number that regenerated this one (F5)
    run_id: int = 0
    start: Start | None = None
    trimmed: ContextTrimmed | None = None
    prefill: Prefill | None = None
    steps: list[Step] = field(default_factory=list)
    finish: Finish | None = None
    error: str | None = None
    #: what a remote backend received for this reply, as it arrived (the wire view), each
    #: with the number of steps recorded before it (the steps built from it follow it)
    wire: list[tuple[WireReceived, int]] = field(default_factory=list)
    started_at: float = 0.0  # UI monotonic clock when the request was sent (spinner only)
    shown_at: float | None = None  # UI clock when the text first appeared on screen
    note: str | None = None  # said at the end of its info line (e.g. the KV cache was rebuilt)
    #: the versions of this turn's reply (F5 and branches add to it), this one among them,
    #: in the order made: one list shared by all of them
    siblings: list[ReplyRecord] = field(default_factory=list)
    hidden: bool = False  # a sibling not shown now (another version of the turn is)
    in_turns: bool = False  # its text is the conversation's last assistant turn
    branch_from: int | None = None  # a branch: the reply number it continues ...
    branch_at: int | None = None  # ... from this step on (its steps before it are that reply's)
    #: where its message sits in the conversation's turns (how many turns come before it)
    turn_base: int = 0
    #: set aside with this version (another version of its turn is shown): the replies of
    #: the later turns, each with its (in_history, in_turns), and the later turns' messages
    tail: list[tuple[ReplyRecord, bool, bool]] = field(default_factory=list)
    tail_turns: list[Message] = field(default_factory=list)
    #: the lens depth of its tokens, read when asked (chat/lens_depth.py): step index ->
    #: the first layer from which on the lens ranks the drawn token first (None: not even
    #: the last); `lens_layers`: the model's layer count
    lens_depths: dict[int, int | None] = field(default_factory=dict)
    lens_layers: int = 0
    #: the grammar or JSON schema it was asked to follow (None: none, or a reply restored from
    #: the store, which keeps the figures of its constraint and not its source)
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if self not in self.siblings:  # a new list, or the versions it joins
            self.siblings.append(self)

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    @property
    def is_document(self) -> bool:
        """A completion-mode reply: it continues one document (no chat template)."""
        return len(self.messages) == 1 and self.messages[0].role == DOCUMENT

    @property
    def prompt_document(self) -> str:
        """A completion-mode reply: the document it continues ('' for a chat reply)."""
        return self.messages[0].content if self.is_document else ""

    @property
    def prefix_len(self) -> int:
        """A branch: how many of its first steps are the reply it continues (its run's
        steps follow them)."""
        if self.start is not None:
            return len(self.start.reply_prefix)
        return self.branch_at or 0

    @property
    def is_branch(self) -> bool:
        """It continues another reply from a point (made here, or stored with a prefix)."""
        return self.branch_at is not None or self.prefix_len > 0

    @property
    def own_steps(self) -> list[Step]:
        """The steps of this run (a branch's follow those of its prefix, which ran in the
        reply it continues)."""
        return self.steps[self.prefix_len :]

    def context_used(self, step: Step) -> int | None:
        """Tokens in the context once `step`'s token is appended: its n_past, else (a server
        that does not send it) the usage's prompt_tokens + the step's index + 1, once the
        reply's finish brings them (None before)."""
        if step.n_past is not None:
            return step.n_past
        f = self.finish
        return None if f is None or f.prompt_tokens is None else f.prompt_tokens + step.index + 1

    @property
    def text(self) -> str:
        if self.finish is not None:  # a run's Finish holds its own text, not a branch's prefix
            return prefix_text(self.start, self.steps) + self.finish.text
        return "".join(s.text for s in self.steps if not s.is_stop)

    @property
    def stepped(self) -> bool:
        """Some of this run's tokens were drawn or picked in step mode (a branch's token
        at its branch point was given with the request: no stop)."""
        own = self.own_steps[1:] if self.is_branch else self.own_steps
        return any(s.chosen_by != SAMPLED for s in own)

    @property
    def first_token_stopped(self) -> bool:
        """This run's first token waited in step mode (its TTFT holds the stop). A
        branch's first token is given with the request: it never waits."""
        own = self.own_steps
        return bool(own) and not self.is_branch and own[0].chosen_by != SAMPLED

    @property
    def version(self) -> tuple[int, int]:
        """(k, n): this is version k of the turn's n replies."""
        return self.siblings.index(self) + 1, len(self.siblings)

    @property
    def n_ctx(self) -> int | None:
        return self.start.n_ctx if self.start else None

    def live_tokens_per_s(self, window: int = 20) -> float | None:
        """Decode rate over the last `window` steps, from their forward + sampling times."""
        decode = self.steps[max(1, len(self.steps) - window) :]  # step 0's pass is the prefill
        total_ms = 0.0
        for s in decode:
            if s.forward_ms is None or s.sample_ms is None:  # not given (a server's reply): no rate
                return None
            total_ms += s.forward_ms + s.sample_ms
        if not decode or total_ms <= 0:
            return None
        return len(decode) * 1000.0 / total_ms


@dataclass
class Conversation:
    system_prompt: str | None = None
    replies: list[ReplyRecord] = field(default_factory=list)
    #: messages of the conversation so far (user + assistant turns, no system prompt); in
    #: completion mode the document's pieces: what the user wrote (role DOCUMENT), what
    #: the model continued it with (assistant), in order
    turns: list[Message] = field(default_factory=list)
    #: CHAT: messages through the chat template; COMPLETION: one document the model continues
    mode: str = CHAT

    @property
    def completion(self) -> bool:
        return self.mode == COMPLETION

    def document(self) -> str:
        """Completion mode: the document so far (what was written and continued)."""
        return "".join(m.content for m in self.turns)

    def messages_for(self, user_text: str) -> tuple[Message, ...]:
        """What the next reply is sent: in chat mode the turns and the message (stripped),
        in completion mode one DOCUMENT, the document so far with the text appended as
        it is (an empty text: the document continued as it is)."""
        if self.completion:
            return (Message(DOCUMENT, self.document() + user_text),)
        sys = (Message("system", self.system_prompt),) if self.system_prompt else ()
        return (*sys, *self.turns, Message("user", user_text.strip()))

    def turn_of(self, rec: ReplyRecord, text: str) -> list[Message]:
        """The turns a finished reply adds: its message and its text (in completion mode
        the piece of the document the user added before it, and its continuation)."""
        asked = rec.messages[-1]
        if rec.is_document:
            before = self.document()
            doc = asked.content
            asked = Message(DOCUMENT, doc[len(before) :] if doc.startswith(before) else doc)
        return [asked, Message("assistant", text)]

    def shown_document(self, rec: ReplyRecord) -> list[ReplyRecord]:
        """Completion mode: the continuations the document shown with `rec` holds, in
        order, each continuing the one before: those shown for their turn, `rec` among
        them (a version of an earlier turn: the later turns built on it follow it). The
        last is the latest continuation."""
        shown = sorted(
            (r for r in self.replies if r.is_document and (r is rec or (r.in_history and not r.hidden and r.done))),
            key=lambda r: (r.turn_base, r.number),
        )
        chain: list[ReplyRecord] = []
        for r in shown:
            if not chain or r.prompt_document.startswith(chain[-1].prompt_document + chain[-1].text):
                chain.append(r)
        if rec in chain:
            return chain
        doc = rec.prompt_document  # (not in line with the others: the document it continues)
        return [*(r for r in chain if r.turn_base < rec.turn_base and doc.startswith(r.prompt_document + r.text)), rec]

    def new_reply(self, mode: str, messages: tuple[Message, ...], **kw: Any) -> ReplyRecord:
        kw.setdefault("turn_base", len(self.turns))
        rec = ReplyRecord(number=len(self.replies) + 1, mode=mode, messages=messages, **kw)
        self.replies.append(rec)
        return rec

    # ---- the versions of a turn's reply (F5, branches): one shown, the others set aside ----
    def later(self, rec: ReplyRecord) -> list[ReplyRecord]:
        """The replies shown after `rec`'s turn: the later turns', and the side-by-side
        replays of its turn's versions."""
        k = rec.turn_base
        return [
            r
            for r in self.replies
            if not r.hidden
            and r not in rec.siblings
            and (r.turn_base > k or (r.turn_base == k and r.replay_of is not None))
        ]

    def set_aside(self, rec: ReplyRecord) -> None:
        """`rec` is no longer the version shown for its turn: the later turns built on it
        go with it (`tail`, `tail_turns`), out of the conversation."""
        later = self.later(rec)
        rec.tail = [(r, r.in_history, r.in_turns) for r in later]
        for r in later:
            r.hidden, r.in_history = True, False
        turns = self.turns
        if rec.in_turns:
            rec.tail_turns = turns[rec.turn_base + 2 :]
            del turns[rec.turn_base :]
        rec.in_turns = False
        rec.in_history, rec.hidden = False, True

    def show_version(self, rec: ReplyRecord) -> None:
        """`rec` is the version shown for its turn, with the later turns it had."""
        rec.in_history, rec.hidden = True, False
        if self.take_turn(rec):
            self.turns.extend(rec.tail_turns)
        for r, in_history, in_turns in rec.tail:
            r.hidden, r.in_history, r.in_turns = False, in_history, in_turns
        rec.tail, rec.tail_turns = [], []

    def take_turn(self, rec: ReplyRecord) -> bool:
        """A finished reply with text becomes the conversation's last turn."""
        f = rec.finish
        text = rec.text
        if f is None or f.reason == FinishReason.ERROR or not text:
            return False
        self.turns.extend(self.turn_of(rec, text))
        rec.in_turns = True
        return True

    def last_in_history(self) -> ReplyRecord | None:
        for rec in reversed(self.replies):
            if rec.in_history:
                return rec
        return None

    def reply(self, number: int) -> ReplyRecord | None:
        if 1 <= number <= len(self.replies):
            return self.replies[number - 1]
        return None


def with_space(document: str, text: str) -> str:
    """Completion mode's space (the pref, on by default): `text` with a space before it
    when the document ends in a non-space and `text` starts with a letter or a digit, so
    that a word typed after the model's is not glued to it ("people?In short")."""
    if document and not document[-1].isspace() and text[:1].isalnum():
        return " " + text
    return text


def finish_label(finish: Finish) -> str:
    return {
        FinishReason.STOP: "end of reply",
        FinishReason.LENGTH: "max_tokens reached",
        FinishReason.CONTEXT: "context full",
        FinishReason.CANCELLED: "stopped",
        FinishReason.ERROR: "error",
    }.get(finish.reason, str(finish.reason))
