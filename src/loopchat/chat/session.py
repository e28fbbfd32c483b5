"""The chat without its widgets: the conversation, the reply in flight, and what each
event from the backend does to them.

`ChatSession` owns the conversation, the reply being generated, the message waiting to
become a turn (`pending_prompt`), the streamed steps not yet drawn (`take_text`), the
user's sampling settings and those of the reply in flight, and Python's garbage
collector freeze while a reply runs (paired with that run's RunDone, which every run
ends with, whatever ends it). The app feeds it the events a frame drained
(`consume`) and shows the `Update` it returns. No Textual here: tests drive it with a
backend alone.

In three parts, each on the one below: session_core.py (the state, a reply's start, the
gc freeze, settings, step mode), session_events.py (`consume`), and here the requests.
"""

from __future__ import annotations

from typing import Any

from loopchat.batch import CHAT_N, cells_needed, fit_problem
from loopchat.chat.batch_replies import BatchIntake
from loopchat.chat.conversation import BLOCKING, STREAM, Conversation, ReplyRecord
from loopchat.chat.lens_depth import DepthProbe, depth_request
from loopchat.chat.session_core import REBUILT_NOTE, Refused, Update
from loopchat.chat.session_events import EventSession
from loopchat.chat.session_lens import LensProbe, lens_request
from loopchat.engine.chat_prompt import CHAT, COMPLETION
from loopchat.events import Step
from loopchat.request import ReplyRequest
from loopchat.step_control import HAND

__all__ = ["REBUILT_NOTE", "ChatSession", "Refused", "Update"]


class ChatSession(EventSession):
    """The user's requests: a message, another version of a reply (regenerate, branch,
    switch), a replay in the other mode, a new or stored conversation, another model;
    and what the app reads (the step shown, the token cursor). Its state, a reply's
    start and step mode: session_core.py; the backend's events: session_events.py."""

    # ---- requests ----------------------------------------------------------------
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

    def write_n(self, mode: str, n: int = CHAT_N) -> tuple[ReplyRecord, ReplyRecord, list[ReplyRecord]]:
        """Shift+F5: the last reply written again N times in one batch (batch_replies.py), the
        N replies versions of it: (old, the one shown, the N-1 set aside)."""
        self.check_can_run()
        if not self.backend.can_branch:
            raise Refused("N replies in one batch need the model run here (a server's replies come one at a time)")
        if self.step_armed:
            raise Refused("Step mode writes one reply at a time: press F12 to leave it, then Shift+F5")
        old = self.conversation.last_in_history()
        if old is None or not old.done:
            raise Refused("No reply to write again yet: send a message first")
        start = old.start  # (its prompt is the batch's: refused here, before the reply is set aside)
        if start is not None and start.prompt_token_ids is not None and start.n_ctx is not None:
            prompt, most = len(start.prompt_token_ids), self.settings.max_tokens
            if fit_problem(prompt, n, most, start.n_ctx) is not None:
                raise Refused(
                    f"{n} replies of up to {most} tokens after this {prompt}-token prompt need {cells_needed(prompt, n, most)} "
                    f"cells of the {start.n_ctx}-token context: set max_tokens to {(start.n_ctx - prompt) // n} at most (F2)"
                )
        self.conversation.set_aside(old)
        if self.settings.seed is not None:  # reply j draws with the seed + j: move past the old one's
            self.settings = self.settings.replace(seed=(self.settings.seed + 1) % 2**32)
        kw: dict[str, Any] = {"siblings": old.siblings, "turn_base": old.turn_base}
        main = self._start(ReplyRequest(old.messages, self.settings, n=n), mode, in_history=True, **kw)
        extras = [
            self.conversation.new_reply(mode, old.messages, in_history=False, hidden=True, **kw) for _ in range(n - 1)
        ]
        for rec in extras:
            rec.run_id, rec.started_at, rec.constraint = main.run_id, main.started_at, main.constraint
        old.replaced_by = main.number
        self.batch = BatchIntake(self.conversation, main, extras)
        return old, main, extras

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
        cur: ReplyRecord | None
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
        plan = tuple({s.pass_report.number: s.pass_report.drafted for s in rec.steps if s.pass_report}.items())
        constraint = rec.constraint  # (the store keeps a reply's constraint figures, not its source: the one set now)
        if constraint is None and any(s.constraint is not None for s in rec.steps):
            constraint = self.constraint
        request = ReplyRequest(
            rec.messages, rec.start.settings, reuse_at_most=reuse, draft_plan=plan, constraint=constraint
        )
        branch: dict = {}
        if rec.is_branch:  # the same prefix, the same token picked at its point
            own = rec.own_steps
            first = own[0].token_id if own and own[0].chosen_by == HAND else None
            request = request.with_(reply_prefix=rec.start.reply_prefix, first_token=first)
            branch = {"branch_from": rec.branch_from, "branch_at": rec.branch_at if rec.branch_at is not None else n}
        new = self._start(
            request,
            other,
            own_constraint=True,
            in_history=False,
            replay_of=rec.replay_of or rec.number,
            turn_base=rec.turn_base,
            **branch,
        )
        new.steps.extend(rec.steps[:n])
        return new

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

    # ---- what the app reads --------------------------------------------------------
    def lens(self, selection: tuple[int, int] | None) -> LensProbe:
        """The logit lens of the pass the panel shows (session_lens.py), asked of the
        engine; the probe fills in when its run's events come (Refused: it cannot)."""
        self.check_can_run()
        rec, step, _ = self.shown_step(selection)
        request = lens_request(self.backend, rec, step)
        assert rec is not None and step is not None  # (lens_request refuses otherwise)
        return self.ask_probe(LensProbe(rec.number, step.index), request)

    def lens_depths(self, selection: tuple[int, int] | None) -> DepthProbe | None:
        """The lens depth of the shown reply's tokens (lens_depth.py), asked of the engine
        for those not known yet (None: all are; Refused: they cannot be read)."""
        self.check_can_run()
        rec, _, _ = self.shown_step(selection)
        asked = depth_request(self.backend, rec)
        if asked is None:
            return None
        assert rec is not None  # (depth_request refuses otherwise)
        request, total = asked
        return self.ask_probe(DepthProbe(rec, total), request)

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
        out: list[tuple[int, int]] = []
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
