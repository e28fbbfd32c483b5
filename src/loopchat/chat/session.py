"""The chat without its widgets: the conversation, the reply in flight, and what each
event from the backend does to them.

`ChatSession` owns the conversation, the reply being generated, the message waiting to
become a turn (`pending_prompt`), the streamed steps not yet drawn (`take_text`), the
user's sampling settings and those of the reply in flight, and Python's garbage
collector freeze while a reply runs (paired with that run's RunDone, which every run
ends with, whatever ends it). The app feeds it the events a frame drained
(`consume`) and shows the `Update` it returns. No Textual here: tests drive it with a
backend alone.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from loopchat.backends import Backend
from loopchat.chat.conversation import BLOCKING, STREAM, Conversation, ReplyRecord
from loopchat.engine.chat_prompt import CHAT, COMPLETION, NO_TEMPLATE_NOTE
from loopchat.events import (
    DOCUMENT,
    ContextTrimmed,
    Finish,
    FinishReason,
    HostEvent,
    ModelLoading,
    ModelReady,
    Pending,
    Prefill,
    RunDone,
    Start,
    Step,
    WireReceived,
    WorkerError,
)
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.step_control import HAND

#: the note on the first reply after a stored conversation was opened (its prefill reuses nothing)
REBUILT_NOTE = "KV cache rebuilt from the stored conversation"


#: gc is frozen for whichever run ends next (a played trace's reply: its run id is the
#: player's count, unknown until its RunDone)
_ANY_RUN = -1


class Refused(Exception):
    """What the user asked for cannot be done now; the message says why (one line)."""


@dataclass
class Update:
    """What one batch of events changed, for the app to show."""

    started: list[tuple[str, ReplyRecord]] = field(default_factory=list)  # a trace's turns: (user text, reply)
    finished: list[ReplyRecord] = field(default_factory=list)  # replies that ended, in order
    dropped: ReplyRecord | None = None  # a turn withdrawn (prompt refused, or stopped before its first token)
    errors: list[WorkerError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    loading: ModelLoading | None = None
    ready: ModelReady | None = None
    restore_prompt: str | None = None  # give this text back to the message box (if it is empty)
    steps: int = 0
    pending: bool = False  # step mode: a new die (the loop stopped, or a setting reshaped it)

    @property
    def ended(self) -> bool:
        """A reply ended (finished, failed or dropped)."""
        return bool(self.finished) or self.dropped is not None


class ChatSession:
    def __init__(self, backend: Backend, settings: SamplingSettings | None = None, mode: str | None = None) -> None:
        """`mode`: "chat" or "completion" for the session (--mode); None: each model's own."""
        self.backend = backend
        #: what the next reply uses (the keys and the dialog change it)
        self.settings = settings or backend.default_settings
        #: what the reply in flight reads at its next step (None: no reply in flight)
        self.run_settings: SamplingSettings | None = None
        self.conversation = Conversation(system_prompt=backend.system_prompt)
        self.current: ReplyRecord | None = None
        self.pending_prompt: str | None = None
        self.model_ready = False
        self.steps_seen = 0
        self._text_due: list[tuple[ReplyRecord, list[Step]]] = []  # per reply, in order
        self._frozen_run: int | None = None  # the run for which gc is frozen
        #: the conversation was opened from the store: the next reply's prefill evaluates
        #: every stored turn (the KV cache holds another conversation, or none)
        self.rebuild_cache = False
        #: step mode: the die of the draw the reply in flight is stopped before (None: not stopped)
        self.pending: Pending | None = None
        #: step mode armed: the next reply stops before its first draw
        self.step_armed = False
        #: the user chose the mode (the mode key, --mode): a model that loads keeps it
        self.mode_chosen = mode is not None
        if mode is not None:
            self.conversation.mode = mode

    @property
    def generating(self) -> bool:
        return self.current is not None and not self.current.done

    def in_force(self) -> SamplingSettings:
        """What a change starts from: the settings the reply in flight's next step uses,
        else (between replies, or a remote reply, whose settings the server fixed when it
        was sent) the next reply's."""
        if self.generating and self.run_settings is not None and self.backend.live_settings:
            return self.run_settings
        return self.settings

    def settings_note(self) -> str | None:
        """What to tell the user after a change: that it waits for the next reply, when
        the reply in flight cannot take it (None: it applies from the next step)."""
        if self.generating and not self.backend.live_settings:
            return "The server fixed this reply's settings when it was sent: the change applies to the next reply"
        return None

    # ---- requests ----------------------------------------------------------------
    def check_can_run(self, what: str = "") -> None:
        """Raise Refused unless a new reply can start now."""
        b = self.backend
        if not b.can_generate:
            raise Refused("This is a replay of a recorded trace: no model is loaded")
        if self.generating:
            if self.stopped:  # not "still generating": the loop waits for the user
                raise Refused(
                    "The reply is stopped before a draw (step mode): Esc ends it, F12 lets it run to its end" + what
                )
            raise Refused("Still generating: press Esc to stop first" + what)
        if not self.model_ready:
            if b.loading:
                raise Refused("The model is still loading" + what)
            raise Refused("No model is loaded: pick one with Ctrl+P → Switch model" + what)

    @property
    def completion(self) -> bool:
        """Completion mode: the user writes a document, the model continues it."""
        return self.conversation.completion

    def takes(self, text: str) -> bool:
        """Enter sends this text: a message, or in completion mode anything (an empty
        text continues the document as it is)."""
        return bool(text.strip()) or self.completion

    def send(self, text: str, mode: str) -> ReplyRecord:
        """Send a user message, or in completion mode append `text` to the document and
        let the model continue it (raises Refused: the text then stays with the caller)."""
        self.check_can_run(" (your message stays in the box)")
        messages = self.conversation.messages_for(text)
        if self.completion and not messages[0].content:
            raise Refused("The document is empty: write the text for the model to continue, then Enter")
        self.pending_prompt = text
        rebuild, self.rebuild_cache = self.rebuild_cache, False
        rec = self._start(
            ReplyRequest(messages, self.settings, reuse_at_most=0 if rebuild else None),
            mode,
            in_history=True,
        )
        if rebuild:
            rec.note = REBUILT_NOTE
        return rec

    def regenerate(self, mode: str) -> tuple[ReplyRecord, ReplyRecord]:
        """The last reply of the conversation again, as another version of it (a
        sibling shown in its place); returns (old, new)."""
        self.check_can_run()
        old = self.conversation.last_in_history()
        if old is None or not old.done:
            raise Refused("No reply to regenerate yet")
        self.conversation.set_aside(old)
        if self.settings.seed is not None:  # the same seed would give the same reply
            self.settings = self.settings.replace(seed=(self.settings.seed + 1) % 2**32)
        new = self._start(
            ReplyRequest(old.messages, self.settings),
            mode,
            in_history=True,
            siblings=old.siblings,
            turn_base=old.turn_base,
        )
        old.replaced_by = new.number
        return old, new

    def branch(self, reply: int, step: int, token_id: int | None, mode: str) -> tuple[ReplyRecord, ReplyRecord]:
        """Reply `reply` continued from its step `step`: that step takes `token_id` (a
        candidate, or any token) or, for None, a new draw with the current settings. The
        new reply is another version of the turn, shown in its place; the engine reuses
        the KV cache up to the branch point. Returns (old, new)."""
        self.check_can_run()
        b = self.backend
        if not b.can_branch:
            raise Refused(b.branch_refusal)
        old = self.conversation.reply(reply)
        if old is None or not old.done or old.start is None:
            raise Refused("Select a token of a finished reply (Alt+←/→ or a click) to branch from it")
        if not old.in_history or old.hidden:
            raise Refused("That reply is a replay or a version not shown: branch from the reply shown for the turn")
        if not old.in_turns and self.conversation.later(old):
            raise Refused("That reply is not part of the conversation (it failed): branch from another one")
        ready = b.ready
        if ready is not None and old.start.model_path and ready.path and str(ready.path) != old.start.model_path:
            raise Refused(f"That reply was written by {old.start.model_name}: switch back to it to branch from it")
        before = [s for s in old.steps if s.index < step]
        if len(before) != step or any(s.token_id is None or s.is_stop for s in before):
            raise Refused("That token's step is not in the reply's record: it cannot be branched from")
        self.conversation.set_aside(old)
        prefix = tuple(int(s.token_id) for s in before)  # type: ignore[arg-type]
        new = self._start(
            ReplyRequest(old.messages, self.settings, reply_prefix=prefix, first_token=token_id),
            mode,
            in_history=True,
            siblings=old.siblings,
            turn_base=old.turn_base,
            branch_from=old.number,
            branch_at=step,
        )
        new.steps.extend(before)  # the same passes: shown, clickable, and stored with it
        return old, new

    def switch_version(self, direction: int, reply: int | None = None) -> tuple[ReplyRecord, ReplyRecord]:
        """Show the previous (-1) or next (+1) version of reply `reply`'s turn (None: the
        last turn's). The conversation goes on from it: the later turns built on the
        version set aside go with it, and those built on the one shown come back.
        Returns (shown before, shown now)."""
        if self.generating:
            raise Refused("Still generating: press Esc to stop first")
        picked = self.conversation.reply(reply) if reply is not None else None
        if picked is not None and not picked.hidden and picked.replay_of is None:
            cur = next((r for r in picked.siblings if not r.hidden), picked)
        else:
            cur = self.conversation.last_in_history()
        if cur is None:
            raise Refused("No reply yet")
        versions = [r for r in cur.siblings if r.done]
        if len(versions) < 2:
            raise Refused(
                "This reply has one version: F5 regenerates the last one, Ctrl+R branches from a selected token"
            )
        if not cur.in_turns and self.conversation.later(cur):
            raise Refused("That reply is not part of the conversation (it failed): its versions cannot be switched")
        new = versions[(versions.index(cur) + direction) % len(versions)] if cur in versions else versions[-1]
        self.conversation.set_aside(cur)
        self.conversation.show_version(new)
        return cur, new

    def replay_other_mode(self) -> ReplyRecord:
        """The last finished reply again in the other mode: same messages, same settings
        (seed included: the same tokens); the user's own settings stay as they are."""
        self.check_can_run()
        rec = self.last_done_reply()
        if rec is None or rec.start is None:
            raise Refused("No finished reply to replay yet")
        other = STREAM if rec.mode == BLOCKING else BLOCKING
        reuse = rec.prefill.reused_tokens if rec.prefill is not None else None
        n = rec.prefix_len
        request = ReplyRequest(rec.messages, rec.start.settings, reuse_at_most=reuse)
        branch: dict = {}
        if rec.is_branch:  # the same prefix, the same token picked at its point
            own = rec.own_steps
            first = own[0].token_id if own and own[0].chosen_by == HAND else None
            request = request.with_(reply_prefix=rec.start.reply_prefix, first_token=first)
            branch = {"branch_from": rec.branch_from, "branch_at": rec.branch_at if rec.branch_at is not None else n}
        new = self._start(
            request,
            other,
            in_history=False,
            replay_of=rec.replay_of or rec.number,
            turn_base=rec.turn_base,
            **branch,
        )
        new.steps.extend(rec.steps[:n])
        return new

    def change_settings(self, **changes: object) -> SamplingSettings:
        """Change the user's settings and those of the reply in flight (SettingsError if
        a value is out of range); the loop uses them from its next step."""
        new = self.settings.replace(**changes)
        if self.generating and self.run_settings is not None and self.backend.live_settings:
            run = self.run_settings.replace(**changes)
            self.run_settings = run
            self.backend.set_settings(run)
        self.settings = new
        return new

    def cancel(self) -> bool:
        if self.generating:
            self.backend.cancel()
            return True
        return False

    # ---- step mode ------------------------------------------------------------------
    @property
    def stepping(self) -> bool:
        """The reply in flight is in step mode (stopped, or drawing the steps asked for)."""
        c = self.backend.control if self.generating else None
        return c is not None and c.paused

    @property
    def stopped(self) -> bool:
        """The reply in flight waits before a draw (its die is `pending`)."""
        return self.pending is not None and self.stepping

    def toggle_step(self) -> str:
        """The step key: stop the reply in flight before its next draw, or let it run
        freely again; between replies, arm (or disarm) step mode for the next reply.
        Returns what to tell the user (raises Refused with why not)."""
        b = self.backend
        if not b.can_step:
            raise Refused(b.step_refusal or "This model cannot be stepped")
        if self.generating:
            c = b.control
            if c is None:
                raise Refused("This reply was started without step mode")
            if c.paused:
                c.resume()
                self.pending = None
                return "Running freely again"
            c.pause()
            return "Stopping before the next draw…"
        self.step_armed = not self.step_armed  # the next reply's request asks for it (step_paused)
        if self.step_armed:
            return "Step mode: the next reply stops before its first draw"
        return "Step mode off: the next reply runs freely"

    def _control(self) -> object:
        c = self.backend.control
        if not self.stopped or c is None:
            raise Refused("The loop is not stopped: the step key (F12) stops it before a draw")
        return c

    def draw(self, n: int = 1) -> None:
        """Stopped: let the sampler draw `n` tokens with the current settings."""
        self._control().step(n)  # type: ignore[attr-defined]
        self.pending = None

    def pick(self, token_id: int) -> None:
        """Stopped: the pending draw takes this token (recorded as picked by hand)."""
        self._control().pick(token_id)  # type: ignore[attr-defined]
        self.pending = None

    def pick_rank(self, rank: int) -> int:
        """Stopped: pick the candidate listed at `rank` (1 = most likely, raw softmax
        order, as the panel lists them); returns its token id."""
        p = self.pending
        if p is None or not self.stopped:
            self._control()
        assert p is not None
        if not 1 <= rank <= len(p.raw_top):
            raise Refused(f"Only {len(p.raw_top)} candidates are listed")
        token = p.raw_top[rank - 1].token_id
        self.pick(token)
        return token

    def new_conversation(self) -> None:
        self.cancel()  # its events are ignored from now on; its RunDone still unfreezes
        self.current = None
        self.pending = None
        self._text_due = []
        self.conversation = Conversation(system_prompt=self.backend.system_prompt, mode=self.conversation.mode)
        self.rebuild_cache = False

    def toggle_mode(self) -> str:
        """The mode key: chat ⇄ completion mode, for the rest of the session. A
        conversation under way is left (it stays in the history) for a new one in the
        other mode. Returns what to tell the user (raises Refused while a reply runs)."""
        if self.generating:
            raise Refused("Still generating: press Esc to stop first, then switch the mode")
        mode = CHAT if self.completion else COMPLETION
        self.mode_chosen = True
        if self.conversation.replies:
            self.new_conversation()
        self.conversation.mode = mode
        if mode == COMPLETION:
            return "Completion mode: write a document, Enter lets the model continue it (an empty Enter: more)"
        note = getattr(self.backend.ready, "template_note", "")
        return "Chat mode: messages through the chat template" + (f". Note: {note}" if note else "")

    def open_conversation(self, conversation: Conversation) -> None:
        """Continue a stored conversation (raises Refused while a reply runs)."""
        if self.generating:
            raise Refused("Stop the reply first (Esc), then open a conversation")
        self.new_conversation()
        self.conversation = conversation
        self.rebuild_cache = True

    def switch_model(self, name: str) -> None:
        if self.generating:
            raise Refused("Stop the reply first (Esc), then switch the model")
        if not self.backend.model_names:
            raise Refused("A replay has no model to switch")
        self.model_ready = False
        self.backend.load(name)

    def _start(self, request: ReplyRequest, mode: str, **kw: object) -> ReplyRecord:
        """A new reply record (`kw`: its fields), and its run asked of the backend:
        `request` as the caller built it, streamed unless `mode` is blocking, stopped
        before its first draw when step mode is armed."""
        request = request.with_(stream=mode != BLOCKING, step_paused=self.step_armed)
        rec = self.conversation.new_reply(mode, request.messages, **kw)
        rec.started_at = time.monotonic()  # the view's "waiting · 1.2 s" counts from here
        self.current = rec
        self.pending = None
        self.step_armed = False  # an armed step mode is this reply's
        self.run_settings = request.settings
        rec.run_id = self.backend.generate(request)
        self._freeze(rec.run_id)  # its events and its RunDone are consumed on this thread, later
        return rec

    def _freeze(self, run_id: int) -> None:
        """The cycle collector would rescan every object the app holds (the conversation,
        its steps, the widgets) while a reply streams: tens of ms at a time, taken from
        the loop. Until the run's RunDone it sees only the objects made since."""
        self._unfreeze()
        gc.freeze()
        self._frozen_run = run_id

    def _unfreeze(self) -> None:
        if self._frozen_run is not None:
            self._frozen_run = None
            gc.unfreeze()

    def close(self) -> None:
        self.cancel()
        self._unfreeze()

    # ---- events ------------------------------------------------------------------
    def take_text(self) -> list[tuple[ReplyRecord, list[Step]]]:
        """The streamed steps not yet drawn, per reply (and forget them)."""
        due, self._text_due = self._text_due, []
        return due

    def consume(self, events: Iterable[HostEvent]) -> Update:
        u = Update()
        for ev in events:
            rec = self.current
            match ev:
                case Pending():  # step mode: the loop stopped before a draw (or reshaped its die)
                    if rec is not None and not rec.done:
                        self.pending = ev
                        u.pending = True
                case Step():
                    if rec is not None and not rec.done:
                        if self.pending is not None and ev.index >= self.pending.index:
                            self.pending = None
                        rec.steps.append(ev)
                        due = self._text_due
                        if due and due[-1][0] is rec:
                            due[-1][1].append(ev)
                        else:
                            due.append((rec, [ev]))
                        self.steps_seen += 1
                        u.steps += 1
                case Start():
                    if rec is None or rec.done:  # a played trace: its turn starts here
                        rec = self._played_turn(ev, u)
                    rec.start = ev
                case Prefill():
                    if rec is not None:
                        rec.prefill = ev
                case ContextTrimmed():
                    if rec is not None:
                        rec.trimmed = ev
                    u.warnings.append(
                        f"The conversation no longer fits the context ({ev.n_ctx} tokens): "
                        f"the {ev.dropped_messages} oldest message(s) were left out of this prompt."
                    )
                case Finish():
                    if rec is not None and not rec.done:
                        rec.finish = ev
                        self._finished(rec, u)
                case ModelLoading():
                    u.loading = ev
                case ModelReady():
                    if not self.mode_chosen and not self.conversation.replies:
                        self.conversation.mode = ev.mode  # models.toml's, or chosen by the template
                    if self.completion and ev.mode == COMPLETION and ev.template_note:
                        u.warnings.append(NO_TEMPLATE_NOTE)
                    elif ev.template_note and not self.completion:
                        u.warnings.append(ev.template_note + "; in the chat, Ctrl+L switches to completion mode")
                    self.model_ready = True
                    self.conversation.system_prompt = self.backend.system_prompt  # the new model's
                    u.ready = ev
                case WorkerError():
                    self._error(ev, u)
                case WireReceived():
                    # the reply in flight's (by its run id, if it has one: a blocking
                    # body may come after its Finish; a cancelled run's late bytes do not)
                    if rec is not None and (rec.run_id == ev.run_id != 0 or (not ev.run_id and not rec.done)):
                        rec.wire.append((ev, len(rec.steps)))
                case RunDone():
                    if rec is not None and not rec.done and rec.run_id in (0, ev.run_id):
                        rec.error = "stopped"  # e.g. a trace that stopped half-way
                        self._finished(rec, u)
                    if self._frozen_run in (ev.run_id, _ANY_RUN):
                        self._unfreeze()
        return u

    def _played_turn(self, start: Start, u: Update) -> ReplyRecord:
        users = [m.content for m in start.messages if m.role in ("user", DOCUMENT)]
        rec = self.conversation.new_reply(STREAM, start.messages)
        rec.started_at = time.monotonic()
        self.current = rec
        self._freeze(_ANY_RUN)  # a played reply streams too: its RunDone follows its Finish
        u.started.append((users[-1] if users else "", rec))
        return rec

    def _finished(self, rec: ReplyRecord, u: Update) -> None:
        f = rec.finish
        if rec.in_history and self.conversation.take_turn(rec):
            self.pending_prompt = None
        elif rec.in_history and f is not None and not rec.text and f.reason == FinishReason.CANCELLED:
            if self.pending_prompt:  # stopped before any text: the message goes back to the box, its turn goes
                u.restore_prompt, u.dropped, self.current = self.pending_prompt, rec, None
                self.conversation.replies.remove(rec)
                u.warnings.append("Stopped before the first token: your message is back in the box")
            self.pending_prompt = None
        if f is not None and f.reason == FinishReason.ERROR:
            u.errors.append(WorkerError(f.error or "the engine failed during the reply", "generate"))
            self._give_back(u)
        self.run_settings = None
        self.pending = None
        u.finished.append(rec)

    def _error(self, err: WorkerError, u: Update) -> None:
        u.errors.append(err)
        if err.during == "load":
            self.model_ready = False
            return
        self.pending = None
        rec = self.current
        if rec is not None and not rec.done and rec.start is None:
            # the prompt was never accepted: the turn goes, the text comes back
            rec.error = err.message
            self.conversation.replies.remove(rec)
            self.current = None
            self.run_settings = None
            u.dropped = rec
        elif rec is not None and not rec.done:
            rec.error = err.message
            self.run_settings = None
            u.finished.append(rec)
        self._give_back(u)

    def _give_back(self, u: Update) -> None:
        if self.pending_prompt:
            u.restore_prompt = self.pending_prompt
        self.pending_prompt = None

    # ---- what the app reads --------------------------------------------------------
    def shown_step(self, selection: tuple[int, int] | None) -> tuple[ReplyRecord | None, Step | None, bool]:
        """What the loop panel shows: (reply, step, pinned). The selected token's step
        (pinned), else the latest step of the reply in flight or of the last reply."""
        rec, step = self.current, None
        if rec is not None and rec.hidden:  # another version of it is shown now
            rec = None
        if selection is not None:
            rec = self.conversation.reply(selection[0])
            if rec is not None:
                step = next((st for st in rec.steps if st.index == selection[1]), None)
        pinned = step is not None
        if rec is None:
            rec = next((r for r in reversed(self.conversation.replies) if not r.hidden), None)
        if rec is not None and step is None and rec.steps:
            step = rec.steps[-1]
        return rec, step, pinned

    def last_done_reply(self) -> ReplyRecord | None:
        for rec in reversed(self.conversation.replies):
            if rec.done and rec.finish is not None and not rec.hidden:
                return rec
        return None

    def tokens(self) -> list[tuple[int, int]]:
        """(reply number, step index) of every token of the finished replies, in order."""
        out = []
        for rec in self.conversation.replies:
            if rec.done and not rec.hidden:
                out.extend((rec.number, s.index) for s in rec.steps if s.text and not s.is_stop)
        return out

    def next_token(self, selection: tuple[int, int] | None, direction: int) -> tuple[int, int] | None:
        """The token cursor moved by `direction` from `selection` (None: off the end)."""
        tokens = self.tokens()
        if not tokens:
            raise Refused("No finished reply yet: token cursor has nothing to select")
        if selection is None or selection not in tokens:
            return tokens[-1] if direction < 0 else tokens[0]
        i = tokens.index(selection) + direction
        return tokens[i] if 0 <= i < len(tokens) else None
