"""The order in which `make test`'s workers take the files (issue 23, item 8).

Under `--dist loadfile` a file is one unit of work, handed to the next worker that runs
short. xdist's default order is by number of tests, most first, so the files of few but
long tests (test_web's browsers, test_tui_lens, test_speculative_cli: 1-3 tests each) came
out last, where the worker that takes one runs it while the others may have nothing left.
`make test` passes `--no-loadscope-reorder` and SuiteOrder (registered by conftest.py)
orders the files here instead: the longest first (the files of COST_S, by their cost),
then the rest by number of tests as xdist did, so the short files fill the gaps at the end.

COST_S: each listed file's CPU in one process, seconds: user+sys of the test process and
of the children it reaped during the file (a session's shared server is not counted);
docs/performance.md, "The suite in the sixth session", and the seventh's where they moved
(test_cli, test_repeats, test_serve_clients, test_workers, test_history_crash; test_shared_run is new),
and the eighth's ("engine files": the files it cut; test_gemma and test_request, not listed before),
and the ninth's (test_speculative, test_engine, test_prompt_logprobs: "The suite in the ninth session").
Approximate is enough: the order,
not the figure, is what is used. A file not listed is taken as short; a listed file that
no longer exists fails test_suite_order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

COST_S: dict[str, float] = {
    "tests/test_cli.py": 50.1,
    "tests/test_speculative.py": 61.5,
    "tests/test_sampler_chain.py": 27.0,
    "tests/test_render_fallback.py": 30.2,
    "tests/test_engine.py": 18.4,
    "tests/test_repeats.py": 25.2,
    "tests/test_serve_clients.py": 18.8,
    "tests/test_serve_responses.py": 8.0,
    "tests/test_serve_tools.py": 27.5,
    "tests/test_serve_prediction.py": 11.9,
    "tests/test_serve_embeddings.py": 5.0,
    "tests/test_serve_prompt_list.py": 8.0,
    "tests/test_history_store.py": 16.7,
    "tests/test_tui_branch.py": 22.2,
    "tests/test_tui_step.py": 20.5,
    "tests/test_prompt_logprobs.py": 15.9,
    "tests/test_web.py": 19.6,
    "tests/test_lens.py": 15.3,
    "tests/test_dry_settings.py": 12.6,
    "tests/test_tui_live.py": 11.6,
    "tests/test_tui_lens.py": 11.5,
    "tests/test_gemma.py": 12.6,
    "tests/test_workers.py": 10.4,
    "tests/test_batch_run.py": 10.2,
    "tests/test_request.py": 10.1,
    "tests/test_speculative_cli.py": 8.9,
    "tests/test_constraint.py": 7.4,
    "tests/test_probe_guard.py": 6.8,
    "tests/test_watch.py": 5.9,
    "tests/test_history_crash.py": 5.5,
    "tests/test_seed.py": 5.3,
    "tests/test_tui_constraint.py": 14.0,
    "tests/test_waterfall.py": 4.4,
    "tests/test_remote_seed.py": 4.2,
    "tests/test_shared_run.py": 4.1,
    "tests/test_compositor.py": 4.0,
    "tests/test_tui_waterfall.py": 3.9,
    "tests/test_remote_llama_server.py": 3.9,
    "tests/test_dry_llama.py": 3.6,
    "tests/test_tui_terminal.py": 3.4,
    "tests/test_serve_threads.py": 3.3,
    "tests/test_token_bytes.py": 3.3,
}


def file_of(nodeid: str) -> str:
    """The file part of a test's node id (`tests/test_x.py::test_y[p]` -> `tests/test_x.py`)."""
    return nodeid.split("::", 1)[0]


def ordered(items: Sequence[Any]) -> list[Any]:
    """`items` (pytest's, with `.nodeid`) with each file's tests kept together and in their
    order, the files of COST_S first (most costly first), then the others by number of
    tests (most first; ties in collection order: xdist's own order for them)."""
    files: dict[str, list[Any]] = {}
    for item in items:
        files.setdefault(file_of(item.nodeid), []).append(item)
    rank = sorted(files, key=lambda f: (-COST_S.get(f, 0.0), -len(files[f])))
    return [item for f in rank for item in files[f]]


class SuiteOrder:
    """The plugin conftest.py registers: it orders the items last of the collection's
    hooks, once `-m` and `-k` have deselected theirs, so the files are counted as they run."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = ordered(items)
