"""Where a conversation's events come from, behind one interface.

A `Backend` turns requests (load a model, generate a reply with these settings, change
the settings mid-reply, cancel) into one stream of typed events (`events.HostEvent`),
handed to a sink on the backend's own thread. The chat (tui/session.py) only talks to
this interface and never asks which backend it has; what a backend cannot do it says
through `can_generate` and its notices. Today: `LiveBackend` (a local GGUF model, the
engine in a thread or a child process), `ReplayBackend` (a recorded trace),
`RemoteBackend` (a model on an OpenAI-compatible server) and `ModelsBackend` (the
models.toml entries, local and remote, switched by name). Step mode (the loop stopped
before a draw, stepped, a token picked by hand) goes through `can_step`, `control`,
`vocabulary`, `pending_probs` and the request's `step_paused`; branches (a reply
continued from the tokens of another) through `can_branch` and the request's
`reply_prefix` and `first_token`. A reply is asked for with one `ReplyRequest`
(request.py), passed on whole: what a backend cannot honour it says through its
`can_*` flags, or ignores as documented there (a server keeps its own KV cache).

Nothing here imports Textual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from loopchat.events import HostEvent, ModelReady
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.step_control import StepControl

Sink = Callable[[HostEvent], None]


@runtime_checkable
class Backend(Protocol):
    """What the chat asks of a source of events; the values a backend states are read-only here."""

    @property
    def can_generate(self) -> bool:
        """False for a source that only plays events (a trace): the chat then sends nothing."""
        ...

    @property
    def name(self) -> str:
        """The model's name as the chat shows it ("" before any is known)."""
        ...

    @property
    def loading(self) -> str | None:
        """The model being loaded, if any."""
        ...

    @property
    def ready(self) -> ModelReady | None:
        """The model loaded now (None: none, or a source without a model)."""
        ...

    @property
    def system_prompt(self) -> str | None:
        """The system prompt the current model's conversations start with (None: none)."""
        ...

    @property
    def default_settings(self) -> SamplingSettings:
        """The sampling settings a new chat starts from."""
        ...

    @property
    def model_names(self) -> list[str]:
        """What a user may switch to (empty: no switching)."""
        ...

    @property
    def live_settings(self) -> bool:
        """A settings change reaches the reply in flight at its next step (False: a remote server fixed the reply's
        settings when it was sent; a change waits for the next reply)."""
        ...

    @property
    def can_step(self) -> bool:
        """Step mode: the loop can stop before a draw, draw on request, take a token by hand."""
        ...

    @property
    def step_refusal(self) -> str:
        """Why not, when can_step is False (one line for a notice)."""
        ...

    @property
    def can_branch(self) -> bool:
        """Branches: a reply can continue from given first tokens (a past reply's, up to a point, with maybe another
        candidate there), reusing the KV cache up to there."""
        ...

    @property
    def branch_refusal(self) -> str:
        """Why not, when can_branch is False (one line for a notice)."""
        ...

    @property
    def control(self) -> StepControl | None:
        """The reply in flight's step control (None: no reply in flight, or no step mode)."""
        ...

    def vocabulary(self) -> list[str] | None:
        """Every token's text by id, for the step mode's search (None: not known)."""
        ...

    def pending_probs(self, token_ids: Sequence[int]) -> list[tuple[float, float]] | None:
        """While stopped: these tokens' probabilities at the pending draw, raw and after
        sampling (None: not stopped, or not known)."""
        ...

    def describe(self, name: str) -> str:
        """One line about a model of `model_names`."""
        ...

    def placeholder(self) -> str | None:
        """What the message box says when this source takes no messages (else None)."""
        ...

    def attach(self, sink: Sink | None) -> None:
        """Where events go from now on (None: nowhere); events before the first attach wait."""
        ...

    def start(self) -> None:
        """Begin: load the configured model, or start playing."""
        ...

    def load(self, name: str) -> None:
        """Switch to another model; ModelLoading, then ModelReady or WorkerError(load)."""
        ...

    def generate(self, request: ReplyRequest) -> int:
        """Start the reply `request` asks for; returns its run id (its RunDone carries it).
        A local loop runs the same whether `request.stream` or not; a remote server is
        asked for one whole body when not. `request.reply_prefix` / `first_token` only
        when `can_branch`; `request.step_paused` only when `can_step` (the reply's
        `control` then starts paused); `request.reuse_at_most` only where this process
        holds the KV cache."""
        ...

    def set_settings(self, settings: SamplingSettings) -> None:
        """The settings the reply in flight reads from its next step on."""
        ...

    def cancel(self) -> None:
        """Stop the reply in flight within one step (or the playing)."""
        ...

    def flush(self) -> None:
        """Hand over at once the events that have arrived (called once a frame)."""
        ...

    def close(self) -> None: ...


__all__ = ["Backend", "Sink"]
