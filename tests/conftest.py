"""Shared fixtures: the real default model, loaded once per session (as an Engine, and in
a LiveBackend for the chat tests); the second model (Gemma 3 270M, tests/gemma_model.py),
its path and an Engine on it, loaded once per session.

The markers (registered in pyproject.toml) say what a test costs: `model` (it loads a
model, here or in a child process), `server` (it starts a server or a `loopchat`
process), `slow`. `make test-fast` runs the tests that carry none of them. `alone`: the
test measures the machine's load; `make test` runs it after the two-worker run, by
itself (suite_tally.py), and it must carry `model` or `slow` too. A test that
asks for a model fixture without the `model` marker is refused at collection, so the
fast run never loads a model by accident."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from gemma_model import gemma_path as _gemma_path
from pilot_pace import quicken
from serve_process import KEY, Serve
from suite_order import SuiteOrder
from suite_tally import ALONE_FILES_ENV, alone_files_left_out, alone_without_cost_marker, record
from tui_fixtures import loaded_live_backend

from loopchat.engine.engine import Engine
from loopchat.model_files import builtin_model_path
from loopchat.threads_setting import THREADS_ENV

#: the fixtures that load a model: a test using one (directly or through another fixture)
#: must carry the `model` marker
MODEL_FIXTURES = frozenset({"engine", "gemma_engine", "live_backend", "queue_one_server"})

# A test run started in the background by a shell without job control (a script's `&`)
# inherits SIGINT ignored, and so would every process it starts: the Ctrl+C tests would
# send a signal nobody hears. A handler here gives the children SIGINT's default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep tests away from the user's config, data and log folders; the `loopchat`
    processes the tests start run one llama thread (SUBPROCESS_THREADS)."""
    base = tmp_path_factory.mktemp("loopchat-home")
    os.environ["LOOPCHAT_CONFIG_DIR"] = str(base / "config")
    os.environ["LOOPCHAT_DATA_DIR"] = str(base / "data")
    os.environ["LOOPCHAT_LOG_DIR"] = str(base / "log")
    os.environ[THREADS_ENV] = SUBPROCESS_THREADS
    # The suite loads the model hundreds of times (engines, `loopchat` processes); read into 2 MB
    # pages each load costs ~0.1 s more CPU than a mapping (docs/performance.md, "The weights in 2 MB
    # pages") and the clean-clone suite took 6:40 instead of ~5:40. The logits are the same bit for
    # bit either way (test_huge_pages, which sets the variable itself and tests the pages), so the
    # other tests map the file.
    os.environ["LOOPCHAT_HUGE_PAGES"] = "0"


@pytest.fixture(scope="session")
def model_path() -> Path:
    return builtin_model_path()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The assembled Gemma 3 270M file. Missing, the test fails (no skip: `make test`
    always assembles it, so a missing file is a broken set-up)."""
    try:
        return _gemma_path()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


#: the shared engines' llama threads. One, not auto: `make test` runs three workers on two
#: cores, where a 2-thread pass waits at OpenMP's barriers for a thread the OS has
#: descheduled; measured on the loaded 2-core machine, 300 tokens of the default model cost
#: 17.6 ms of CPU a token at 1 thread, 42.3 ms under auto and 54.2 ms at 2 threads, for the
#: same wall time (docs/performance.md). The tokens and logits do not depend on the count
#: (test_probe_guard: bit for bit); auto itself is tested on engines of its own
#: (test_auto_threads, test_probe_guard, test_engine's default, test_serve_threads, test_cli).
SHARED_ENGINE_THREADS = 1

#: LOOPCHAT_THREADS for every `loopchat` process the tests start (run, serve, the chat, web's
#: tabs), and for the chat apps the tests build from models.toml: one llama thread, as the
#: shared engines, for the same reason (a 60-token `loopchat run` beside other workers: 3.44 s
#: of CPU under auto, 2.51 s at one thread; docs/performance.md). A test of auto's own choice
#: says `--threads auto` or sets LOOPCHAT_THREADS to "" for its process (test_cli, test_serve_threads).
SUBPROCESS_THREADS = "1"


@pytest.fixture(scope="session")
def engine(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    log = tmp_path_factory.mktemp("log") / "llama.log"
    eng = Engine(model_path, n_ctx=2048, threads=SHARED_ENGINE_THREADS, log_path=log)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def gemma_engine(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """Gemma 3 270M in an Engine (n_ctx 512), loaded once for every module that reads it."""
    log = tmp_path_factory.mktemp("log") / "llama.log"
    eng = Engine(gemma_path, n_ctx=512, threads=SHARED_ENGINE_THREADS, log_path=log)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def live_backend():
    """The default model in a LiveBackend (one llama thread), loaded once for every chat
    test module: each module's `backend` fixture hands it on (tui_fixtures.loaded_live_backend)."""
    yield from loaded_live_backend()


@pytest.fixture(scope="session")
def queue_one_server():
    """`loopchat serve --queue 1` with the API key serve_process.KEY, started once for
    test_serve, test_dry_settings, test_repeats, test_serve_stack, test_serve_prediction,
    test_serve_tools and test_serve_embeddings (each
    request there says its own seed; the log checks read from a mark taken before their
    request). Under `make test` there
    is one per worker that runs one of those modules."""
    with Serve("--queue", "1", env={"LOOPCHAT_API_KEY": KEY}) as s:
        yield s


def pytest_configure(config: pytest.Config) -> None:
    # the files' order for make test's workers, the longest first (suite_order.py)
    config.pluginmanager.register(SuiteOrder(), "loopchat_suite_order")
    # the Pilot's idle poll every 2 ms instead of 20 (pilot_pace.py)
    left = quicken()
    if left:
        config.issue_config_time_warning(pytest.PytestWarning(left), stacklevel=2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())) and item.get_closest_marker("model") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests load a model but have no `model` marker (add `pytestmark = pytest.mark.model` to their "
            "file): " + ", ".join(unmarked[:10])
        )
    stray = alone_without_cost_marker(items)
    if stray:
        raise pytest.UsageError("these `alone` tests need a `model` or `slow` marker too: " + ", ".join(stray[:10]))
    missing = alone_files_left_out(items, os.environ.get(ALONE_FILES_ENV))
    if missing:
        raise pytest.UsageError(
            "these files have `alone` tests but make test's alone part does not collect them (the Makefile's "
            "ALONE_FILES finds them by the text `pytest.mark.alone`): " + ", ".join(missing)
        )


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """`make test`'s two pytest runs each leave their counts for its closing line (suite_tally.py)."""
    record(terminalreporter, exitstatus, config)
