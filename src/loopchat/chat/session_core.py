"""The chat session's state and the start of a reply: what the session holds, whether a
new reply can run now, a reply asked of the backend (`_start`), Python's garbage
collector frozen while it runs, settings changed, and step mode (the die the reply in
flight is stopped before). The layers above: session_events.py applies the backend's
events, session.py (ChatSession) answers the user's requests. No Textual here.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

from loopchat.backends import Backend
from loopchat.chat.conversation import BLOCKING, Conversation, ReplyRecord
from loopchat.constraint import Constraint
from loopchat.events import ModelLoading, ModelReady, Pending, Step, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings

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
    shown_again: ReplyRecord | None = None  # `dropped` was a version (F5, a branch): the one it replaced, back
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


class SessionCore:
    """The session's state, a reply's start, settings and step mode (ChatSession is the whole)."""

    def __init__(self, backend: Backend, settings: SamplingSettings | None = None, mode: str | None = None) -> None:
        """`mode`: "chat" or "completion" for the session (--mode); None: each model's own."""
        self.backend = backend
        #: what the next reply uses (the keys and the dialog change it)
        self.settings = settings or backend.default_settings
        #: what the reply in flight reads at its next step (None: no reply in flight)
        self.run_settings: SamplingSettings | None = None
        self.conversation = Conversation(system_prompt=backend.system_prompt)
        #: a grammar or JSON schema the next replies follow (constraint.py; None: none)
        self.constraint: Constraint | None = None
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
        #: the document view is open: each reply's prompt is scored (its tokens' surprisals)
        self.read_prompt = False
        #: the logit lens asked for last (session_lens.py; None: none)
        #: the lenses asked for whose runs have not ended, oldest first: their runs' events
        #: are theirs (session_lens.py, lens_depth.py)
        self.probes: list[Any] = []
        self.watch: tuple[str, ...] = ()  # tokens on watch in the next replies (watch.py)
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

    # ---- whether a reply can run -----------------------------------------------------
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
        if token is None:
            raise Refused("This backend gives no token ids: a candidate cannot be picked by hand")
        self.pick(token)
        return token

    def _start(self, request: ReplyRequest, mode: str, *, own_constraint: bool = False, **kw: object) -> ReplyRecord:
        """A new reply record (`kw`: its fields), and its run asked of the backend:
        `request` as the caller built it, streamed unless `mode` is blocking, stopped
        before its first draw when step mode is armed; under the session's constraint unless
        the request has one, or `own_constraint` (F9's replay: the replayed reply's, or none)."""
        request = request.with_(stream=mode != BLOCKING, step_paused=self.step_armed, watch=self.watch)
        self.stop_lens_depths()  # the reply goes first
        if self.constraint is not None and request.constraint is None and not own_constraint:  # (palette: Constraint…)
            request = request.with_(constraint=self.constraint)
        if self.read_prompt and request.prompt_logprobs is None:
            request = request.with_(prompt_logprobs=1)
        rec = self.conversation.new_reply(mode, request.messages, **kw)
        rec.constraint = request.constraint
        rec.started_at = time.monotonic()  # the view's "waiting · 1.2 s" counts from here
        self.current = rec
        self.pending = None
        self.step_armed = False  # an armed step mode is this reply's
        self.run_settings = request.settings
        rec.run_id = self.backend.generate(request)
        self._freeze(rec.run_id)  # its events and its RunDone are consumed on this thread, later
        return rec

    def stop_lens_depths(self) -> None:
        """Stop the lens depths being read (lens_depth.py), if that is what runs; the
        depths read so far stay."""
        running = next((p for p in self.probes if not p.done), None)
        if running is not None and running.stops_for_a_reply:
            self.backend.cancel()

    def ask_probe(self, probe: Any, request: ReplyRequest) -> Any:
        """Ask the engine for a lens's run; its events go to `probe`."""
        self.probes = [p for p in self.probes if not p.done] + [probe]
        probe.run_id = self.backend.generate(request)
        return probe

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
