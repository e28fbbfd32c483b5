"""llama.cpp's OpenMP threads spin briefly at a barrier (omp_spin.py): set before
llama.cpp's library loads, unless the user chose a wait policy or a spin count."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = "import os, loopchat._llama_ffi; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"


def _run(**env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", CHECK], env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "env, seen",
    [({}, "1000 None"), ({"GOMP_SPINCOUNT": "5"}, "5 None"), ({"OMP_WAIT_POLICY": "passive"}, "None passive")],
)
def test_the_spin_count_is_set_before_llama_cpp_loads_unless_the_user_chose(env, seen) -> None:
    assert _run(**env) == seen


def test_it_is_set_before_the_library_is_loaded() -> None:
    """libgomp reads its environment once, when llama.cpp's library loads it: the module
    that loads it must set the count first (import order, checked in the source)."""
    from pathlib import Path

    import loopchat

    for name in ("_llama_ffi.py", "llama_log.py"):
        text = (Path(loopchat.__file__).parent / name).read_text(encoding="utf-8")
        assert text.index("omp_spin.apply()") < text.index("import llama_cpp"), name
