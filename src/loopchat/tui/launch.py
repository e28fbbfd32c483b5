"""Making and running the chat app: `create_app` (shared by the CLI, the tests and the
benchmarks) and `run_tui`."""

from __future__ import annotations

import sys
from pathlib import Path

from loopchat.backends import Backend
from loopchat.chat.prefs import Prefs
from loopchat.errors import UsageError
from loopchat.flash_attn_setting import FlashAttn
from loopchat.settings import SamplingSettings
from loopchat.threads_setting import Threads, threads_or_env
from loopchat.tui.app import LoopChatApp


def create_app(
    *,
    config_path: str | None = None,
    model: str | None = None,
    replay: str | None = None,
    replay_speed: float = 1.0,
    verbose: bool = False,
    backend: Backend | None = None,
    prefs: Prefs | None = None,
    prefs_path: Path | None = None,
    settings: SamplingSettings | None = None,
    host: str | None = None,
    threads: Threads | None = None,
    flash_attn: FlashAttn | None = None,
    draft_model: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
    model_id: str | None = None,
    timeout: float | None = None,
    history: bool | Path | str = True,
    mode: str | None = None,
) -> LoopChatApp:
    """The app on a live model (or a trace with replay=FILE, or the server at `url`);
    raises ConfigError/TraceError/UsageError.

    Pass `backend=` to share one loaded model between apps (it is then not closed on exit).
    `history`: keep the conversations in the store (history.store.default_store_path(),
    or the file given) while the History pref is on; False (--no-history) keeps nothing.
    A played trace is never stored. `mode`: "chat" or "completion" (--mode; None: the model's).
    """
    owns = backend is None
    if backend is None:
        if replay is not None:
            from loopchat.backends.replay import ReplayBackend

            backend = ReplayBackend(replay, speed=replay_speed)
        elif url is not None:
            backend = _server(url, api_key, model_id, timeout, model=model, threads=threads, flash_attn=flash_attn)
        else:
            from loopchat.backends.live import DEFAULT_HOST
            from loopchat.backends.models_backend import configured_backend

            for flag, value in (("--api-key", api_key), ("--model-id", model_id), ("--timeout", timeout)):
                if value is not None:
                    raise UsageError(
                        f"{flag} goes with --url (a models.toml model with url has its own: api_key_env, model, timeout)"
                    )
            from loopchat.config import load_config

            config = load_config(config_path)  # the one parse of models.toml for this launch
            backend = configured_backend(
                config,
                model,
                verbose=verbose,
                host=host or DEFAULT_HOST,
                threads=threads_or_env(threads),
                flash_attn=flash_attn,
                draft_model=draft_model,
            )
    store = None
    if history is not False and backend.can_generate:
        from loopchat.history.store import default_store_path

        store = default_store_path() if history is True else Path(history)
    return LoopChatApp(
        backend,
        prefs=prefs,
        prefs_path=prefs_path,
        owns_backend=owns,
        settings=settings,
        history_path=store,
        mode=mode,
    )


def _server(url: str, api_key: str | None, model_id: str | None, timeout: float | None, **local: object) -> Backend:
    """`loopchat --url URL`: the server's models (UsageError for options that do not fit)."""
    import os

    from loopchat.backends.remote import DEFAULT_TIMEOUT, RemoteBackend, URLProblem
    from loopchat.config import API_KEY_ENV

    if local.get("model") is not None:
        raise UsageError("--model and --url both name a model: with --url, --model-id picks the server's model")
    if local.get("threads") is not None:
        raise UsageError("--threads has no meaning for a model on a server: the server chooses its threads")
    if local.get("flash_attn") is not None:
        raise UsageError("--flash-attn has no meaning for a model on a server: the server chooses it")
    try:
        return RemoteBackend(
            url, model_id=model_id, api_key=api_key or os.environ.get(API_KEY_ENV), timeout=timeout or DEFAULT_TIMEOUT
        )
    except URLProblem as exc:
        raise UsageError(f"--url: {exc}") from None


def run_tui(
    *,
    config_path: str | None,
    model: str | None,
    replay: str | None = None,
    replay_speed: float = 1.0,
    verbose: bool = False,
    host: str | None = None,
    threads: Threads | None = None,
    flash_attn: FlashAttn | None = None,
    draft_model: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
    model_id: str | None = None,
    timeout: float | None = None,
    history: bool = True,
    mode: str | None = None,
) -> int:
    """Run the app until the user quits; returns the exit code (2: could not start)."""
    try:
        app = create_app(
            config_path=config_path,
            model=model,
            replay=replay,
            replay_speed=replay_speed,
            verbose=verbose,
            host=host,
            threads=threads,
            flash_attn=flash_attn,
            draft_model=draft_model,
            url=url,
            api_key=api_key,
            model_id=model_id,
            timeout=timeout,
            history=history,
            mode=mode,
        )
    except Exception as exc:  # ConfigError, TraceError: one-line messages
        print(f"loopchat: {exc}", file=sys.stderr)
        return 2
    app.handle_signals = True
    result = app.run()
    return int(result or 0)
