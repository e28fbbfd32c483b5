"""llama.cpp's OpenMP threads spin briefly at a barrier (omp_spin.py): set before
llama.cpp's library loads, unless the user chose a wait policy or a spin count."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

# the engine's first import of llama.cpp's library, as Engine() makes it
CHECK = (
    "import os, sys; import loopchat.engine.engine; assert 'llama_cpp' not in sys.modules; from llama_cpp import Llama; "
    "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
)


def _run(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run(
        [sys.executable, "-c", CHECK], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "env, seen",
    [({}, "1000 None"), ({"GOMP_SPINCOUNT": "5"}, "5 None"), ({"OMP_WAIT_POLICY": "passive"}, "None passive")],
)
def test_the_spin_count_is_set_before_llama_cpp_loads_unless_the_user_chose(env, seen) -> None:
    assert _run(**env) == seen


def test_libgomp_is_not_loaded_before_the_package_sets_it() -> None:
    """libgomp reads its environment once, when it is loaded: importing loopchat (which sets
    the count) must not load it."""
    code = "import loopchat.engine.engine, loopchat.config; print('gomp' in open('/proc/self/maps').read())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
