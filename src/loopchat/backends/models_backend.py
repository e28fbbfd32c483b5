"""The models of a models.toml behind one Backend: the local ones run by one LiveBackend,
each model on a server (`url = ...`) by its own RemoteBackend. The chat's model list
switches between them by name, without knowing which is which.

Only the selected model's backend speaks to the chat: events of the others (a local
model still loading when the user switched to a server) are dropped. Run ids are this
backend's own, so two sources never hand the chat the same one. A switch that fails (a
server that cannot be reached) goes back to the model in use before, as LiveBackend does
for a file that cannot be found.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from loopchat.backends import Backend, Sink
from loopchat.backends.live import DEFAULT_HOST, LiveBackend, _Relay
from loopchat.events import ModelLoading, ModelReady, RunDone, WireReceived, WorkerError
from loopchat.flash_attn_setting import FlashAttn
from loopchat.model_spec import BUILTIN_CONFIG, Config
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.threads_setting import Threads


def remote_backend(spec: Any, **overrides: Any) -> Any:
    """The RemoteBackend of a models.toml entry with `url`; `overrides` that are not None
    replace the entry's (the command line's --api-key, --model-id, --timeout). ConfigError:
    the variable its key comes from is not set."""
    from loopchat.backends.remote import DEFAULT_TIMEOUT, RemoteBackend

    kw: dict[str, Any] = dict(
        name=spec.name,
        model_id=spec.model_id,
        api_key=None,
        system_prompt=spec.system_prompt,
        mode=spec.mode,
        settings=spec.sampling,
        description=spec.description,
        timeout=spec.timeout or DEFAULT_TIMEOUT,
        extensions=spec.extensions,
    )
    kw.update({k: v for k, v in overrides.items() if v is not None})
    if kw["api_key"] is None:
        kw["api_key"] = spec.key()
    return RemoteBackend(spec.location, **kw)


def configured_backend(config: Config | None = None, model: str | None = None, **local: Any) -> Backend:
    """The backend of the chat's models.toml (`config`, parsed once by the caller; None: the
    built-in models): a LiveBackend when every model runs here (as before remote models
    existed), else a ModelsBackend."""
    config = config if config is not None else BUILTIN_CONFIG
    if any(spec.remote for spec in config.models.values()):
        return ModelsBackend(config, model, **local)
    return LiveBackend(config, model, **local)


class ModelsBackend:
    can_generate = True

    def __init__(
        self,
        config: Config | None = None,
        model: str | None = None,
        *,
        verbose: bool = False,
        threads: Threads | None = None,
        host: str = DEFAULT_HOST,
        flash_attn: FlashAttn | None = None,
        draft_model: str | None = None,
    ) -> None:
        """`config`: models.toml as the caller parsed it (None: the built-in models); an
        unknown `model` raises ConfigError: the caller reports it."""
        self.config = config if config is not None else BUILTIN_CONFIG
        self._local_args: tuple[bool, Threads | None, str, FlashAttn | None] = (verbose, threads, host, flash_attn)
        self._local: LiveBackend | None = None
        self._draft_model = draft_model  # --draft-model (the local model's)
        self._remotes: dict[str, Any] = {}
        self._relay = _Relay()
        self._runs: dict[tuple[int, int], int] = {}  # (id of a backend, its run id) -> ours
        self._run_id = 0
        self._runs_lock = threading.Lock()  # a run's events wait until its id is mapped
        self._previous: Backend | None = None  # what a failing switch goes back to
        self.active: Backend = self._backend_for(self.config.get(model), model)
        self._extra = [model] if model is not None and model not in self.config.models else []

    def _backend_for(self, spec: Any, name: str | None = None) -> Any:
        if spec.remote:
            if spec.name not in self._remotes:
                backend = remote_backend(spec)
                backend.attach(lambda ev, b=backend: self._on(b, ev))
                self._remotes[spec.name] = backend
            return self._remotes[spec.name]
        if self._local is None:
            verbose, threads, host, flash_attn = self._local_args
            local = LiveBackend(
                self.config,
                name or spec.name,
                verbose=verbose,
                threads=threads,
                host=host,
                flash_attn=flash_attn,
                draft_model=self._draft_model,
            )
            local.attach(lambda ev: self._on(local, ev))
            self._local = local
        return self._local

    # ---- what the chat shows: the selected model's -------------------------------------
    @property
    def name(self) -> str:
        return self.active.name

    @property
    def loading(self) -> str | None:
        return self.active.loading

    @property
    def ready(self) -> ModelReady | None:
        return self.active.ready

    @property
    def system_prompt(self) -> str | None:
        return self.active.system_prompt

    def model_constraint(self) -> Any:
        """The selected model's constraint from models.toml (None: none, or a server's)."""
        ask = getattr(self.active, "model_constraint", None)
        return ask() if ask is not None else None

    @property
    def default_settings(self) -> SamplingSettings:
        return self.active.default_settings

    @property
    def live_settings(self) -> bool:
        return self.active.live_settings

    @property
    def can_step(self) -> bool:
        return self.active.can_step

    @property
    def step_refusal(self) -> str:
        return self.active.step_refusal

    @property
    def can_branch(self) -> bool:
        return self.active.can_branch

    @property
    def branch_refusal(self) -> str:
        return self.active.branch_refusal

    @property
    def control(self) -> Any:
        return self.active.control

    def vocabulary(self) -> list[str] | None:
        return self.active.vocabulary()

    def pending_probs(self, token_ids: Sequence[int]) -> list[tuple[float, float]] | None:
        return self.active.pending_probs(token_ids)

    @property
    def model_names(self) -> list[str]:
        return [*self.config.models, *self._extra]

    def describe(self, name: str) -> str:
        spec = self.config.get(name)
        return spec.description or f"{spec.source} {spec.location}"

    def placeholder(self) -> str | None:
        return None

    @property
    def busy(self) -> bool:
        return bool(getattr(self.active, "busy", False))

    # ---- events -----------------------------------------------------------------------
    def attach(self, sink: Sink | None) -> None:
        self._relay.attach(sink)

    def _on(self, backend: Any, event: Any) -> None:
        if backend is not self.active:
            return  # a model the user switched away from
        if isinstance(event, (RunDone, WireReceived)):
            with self._runs_lock:
                ours = self._runs.get((id(backend), event.run_id))
                if ours is not None and isinstance(event, RunDone):
                    del self._runs[(id(backend), event.run_id)]
            if ours is not None:
                if isinstance(event, RunDone):
                    event = RunDone(ours)
                else:
                    event = WireReceived(event.text, event.nbytes, event.t_ms, ours)
        elif isinstance(event, WorkerError) and event.during == "load":
            back = self._previous
            self._previous = None
            if back is not None and back is not backend and back.ready is not None:
                self.active = back  # the switch failed: the model in use stays
                self._relay.emit(WorkerError(f"{event.message}; still using {back.ready.name}", during="load"))
                self._relay.emit(back.ready)
                return
        elif isinstance(event, ModelReady):
            self._previous = None
        self._relay.emit(event)

    def flush(self) -> None:
        self.active.flush()

    # ---- models ------------------------------------------------------------------------
    def start(self) -> None:
        self.active.start()

    def load(self, name: str) -> None:
        try:
            spec = self.config.get(name)
            target = self._backend_for(spec, name)
        except Exception as exc:  # ConfigError (a key's variable not set): one line
            ready = self.active.ready
            self._relay.emit(WorkerError(str(exc) + (f"; still using {ready.name}" if ready else ""), during="load"))
            if ready is not None:
                self._relay.emit(ready)  # nothing changed: the chat goes on with it
            return
        if target is not self.active:
            self._previous = self.active
            self.active = target
        if target.ready is not None and target.ready.name == name and target.loading is None:
            self._relay.emit(ModelLoading(name=name, path=target.ready.path))
            self._relay.emit(target.ready)  # already there: the switch is instant
            self._previous = None
        elif self._local is not None and target is self._local:
            target.load(name)
        elif target.ready is None and target.loading is None:
            target.start()

    # ---- replies -----------------------------------------------------------------------
    def generate(self, request: ReplyRequest) -> int:
        backend = self.active
        with self._runs_lock:
            self._run_id += 1
            theirs = backend.generate(request)
            self._runs[(id(backend), theirs)] = self._run_id
        return self._run_id

    def set_settings(self, settings: SamplingSettings) -> None:
        self.active.set_settings(settings)

    def cancel(self) -> None:
        self.active.cancel()

    def close(self) -> None:
        self.attach(None)
        for backend in [self._local, *self._remotes.values()]:
            if backend is not None:
                backend.close()


__all__ = ["ModelsBackend", "configured_backend", "remote_backend"]
