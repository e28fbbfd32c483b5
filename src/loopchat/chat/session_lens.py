"""The logit lens of the pass the panel shows (issue 26, part 1), in the chat.

The lens is computed for the shown pass only, when asked (F11): its cost (one more
forward pass and the head applied to every layer, docs/performance.md) would take the
decode rate far below the plain loop's if paid at every pass. The pass is re-run as a
branch of its reply that starts with the token the reply drew there (`reply_prefix`:
the reply's tokens before it; `first_token`: the token; one step; `lens`): the engine
reuses its KV cache for the conversation, and the run's one Step carries the lens rows.
Its events are the probe's (`LensProbe.take`), never a reply of the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.session_core import Refused
from loopchat.events import LensRow, RunDone, Start, Step, WorkerError
from loopchat.request import ReplyRequest


@dataclass(slots=True, kw_only=True)
class LensRun:
    """A run asked for with the lens, not a reply of the conversation: its events are
    taken here (`take`), each Step handed to `on_step`. F11's LensProbe, Shift+F7's
    DepthProbe (lens_depth.py)."""

    run_id: int = 0
    note: str | None = None  # why there are no rows (the model's architecture, an error)
    done: bool = False
    #: a reply asked for meanwhile stops this run (session_core._start); False: it waits
    stops_for_a_reply: ClassVar[bool] = False

    def on_step(self, step: Step) -> None:
        """A Step of this run (with its lens rows, if the model has a lens)."""

    def on_done(self) -> None:
        """The run ended."""

    def take(self, event: Any) -> bool:
        """Whether `event` is this run's (then it is used here, not by the chat)."""
        match event:
            case Start():
                self.note = event.lens_note
            case Step():
                self.on_step(event)
            case WorkerError(during="generate"):
                self.note = event.message
            case RunDone():
                if event.run_id != self.run_id:
                    return False
                self.done = True
                self.on_done()
            case _ if getattr(event, "kind", None) in ("prefill", "finish", "context_trimmed"):
                pass
            case _:
                return False
        return True


@dataclass(slots=True)
class LensProbe(LensRun):
    """One lens asked for: the shown pass of reply `reply`'s step `step` (it is one pass:
    a reply asked for meanwhile waits for it)."""

    reply: int
    step: int
    rows: tuple[LensRow, ...] | None = None

    def on_step(self, step: Step) -> None:
        self.rows = step.lens


#: the refusal of a lens where the model runs on a server
NO_LENS_ON_SERVER = "No logit lens for a model on a server: its layers are not ours to read"


def check_same_model(backend: Any, rec: ReplyRecord, what: str) -> None:
    """Refused unless the model loaded is the one that wrote `rec` (its passes are read
    again on it; `what`: what the refusal names)."""
    ready = backend.ready
    if ready is not None and rec.start is not None and rec.start.model_path and ready.path:
        if str(ready.path) != rec.start.model_path:
            raise Refused(f"That reply was written by {rec.start.model_name}: switch back to it for {what}")


def lens_request(backend: Any, rec: ReplyRecord | None, step: Step | None) -> ReplyRequest:
    """The run that re-reads `step`'s pass with the lens (Refused: one that cannot)."""
    if not backend.can_branch:
        raise Refused(NO_LENS_ON_SERVER)
    if rec is None or step is None or not rec.done or rec.start is None or step.token_id is None:
        raise Refused("Select a token of a finished reply (Alt+←/→ or a click): F11 shows its pass's lens")
    check_same_model(backend, rec, "its lens")
    before = [s for s in rec.steps if s.index < step.index]
    if len(before) != step.index or any(s.token_id is None or s.is_stop for s in before):
        raise Refused("That token's earlier steps are not in the reply's record: its pass cannot be re-read")
    return ReplyRequest(
        rec.messages,
        rec.start.settings.replace(max_tokens=step.index + 1),
        reply_prefix=tuple(int(s.token_id) for s in before),  # type: ignore[arg-type]
        first_token=int(step.token_id),
        lens=True,
        report_k=1,
    )
