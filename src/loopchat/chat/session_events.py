"""What each event from the backend does to the chat session (`consume`): the reply in
flight's steps, its start, prefill and finish, a model loaded, an error, a played trace's
turns. Returns the `Update` the app shows. No Textual here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from loopchat.chat.batch_replies import BatchIntake
from loopchat.chat.conversation import STREAM, ReplyRecord
from loopchat.chat.session_core import _ANY_RUN, SessionCore, Update
from loopchat.constraint import ConstraintError
from loopchat.engine.chat_prompt import COMPLETION, NO_TEMPLATE_NOTE
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


class EventSession(SessionCore):
    """The session as the backend's events change it (ChatSession adds the requests)."""

    batch: BatchIntake | None = None  # N replies in one batch in flight (Shift+F5): its other versions

    # ---- events ------------------------------------------------------------------
    def take_text(self) -> list[tuple[ReplyRecord, list[Step]]]:
        """The streamed steps not yet drawn, per reply (and forget them)."""
        due, self._text_due = self._text_due, []
        return due

    def consume(self, events: Iterable[HostEvent]) -> Update:
        u = Update()
        for ev in events:
            # a lens asked for (session_lens.py, lens_depth.py): its run's events are its own
            probe = next((p for p in self.probes if not p.done), None)
            if probe is not None and probe.take(ev):
                continue
            routed = self._route(ev, u)
            if routed is None:
                continue
            ev = routed
            rec = self.current
            match ev:
                case Pending():  # step mode: the loop stopped before a draw (or reshaped its die)
                    if rec is not None and not rec.done:
                        self.pending = ev
                        u.pending = True
                        if ev.refused is not None:  # a token picked by hand the constraint forbids
                            u.warnings.append(ev.refused[0].upper() + ev.refused[1:])
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
                    self._model_constraint(u)
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

    def _route(self, ev: HostEvent, u: Update) -> HostEvent | None:
        """N replies in one batch: another sequence's event goes to its version (batch_replies.py;
        None: taken there); a played trace of a batch plays its first reply."""
        if self.batch is not None:
            routed = self.batch.route(ev, u.finished)
            if self.batch.over:
                self.batch = None
            return routed
        if getattr(ev, "sequence", None) not in (None, 0):
            if isinstance(ev, Start) and ev.sequence == 1:
                u.warnings.append(f"This trace holds {ev.sequences} replies written in one batch: the first is played")
            return None
        return ev

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
            # the prompt was never accepted: the turn goes, the text comes back (a version: the one
            # it was to replace is shown again)
            rec.error = err.message
            back = self._replaced(rec)
            self.conversation.replies.remove(rec)
            self.current = None
            self.run_settings = None
            u.dropped, u.shown_again = rec, back
            if back is not None:
                rec.siblings.remove(rec)
                self.conversation.show_version(back)
        elif rec is not None and not rec.done:
            rec.error = err.message
            self.run_settings = None
            u.finished.append(rec)
        self._give_back(u)

    def _replaced(self, rec: ReplyRecord) -> ReplyRecord | None:
        """The version `rec` was set to replace (F5: the one it regenerated; a branch: the one it
        branched from), if it is one still set aside."""
        conv = self.conversation
        old = next((r for r in rec.siblings if r.replaced_by == rec.number), None)
        if old is None and rec.branch_from is not None:
            old = conv.reply(rec.branch_from)
        return old if old is not None and old is not rec and old in rec.siblings and old.hidden else None

    def _give_back(self, u: Update) -> None:
        if self.pending_prompt:
            u.restore_prompt = self.pending_prompt
        self.pending_prompt = None

    def _model_constraint(self, u: Update) -> None:
        """The model's grammar or JSON schema from models.toml, for the next replies (the
        palette's Constraint… changes it; a model switch brings the new model's)."""
        ask = getattr(self.backend, "model_constraint", None)
        try:
            self.constraint = ask() if ask is not None else None
        except ConstraintError as exc:
            self.constraint = None
            u.warnings.append(f"models.toml: {exc}; the replies are not constrained")
