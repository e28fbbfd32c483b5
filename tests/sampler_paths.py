"""The sampler's two paths (sampler_fused): the C kernel and numpy. A test that takes the
`sampler_path` fixture runs once on each; "kernel" fails (it is not skipped) where the
kernel was not built, so a broken build cannot pass unseen (`LOOPCHAT_SAMPLER_KERNEL=0`
runs the numpy path on purpose, and then skips it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest

from loopchat.engine import sampler_fused

PATHS = ["kernel", "numpy"]


def built_kernel() -> ModuleType:
    """The C kernel module (imported whatever LOOPCHAT_SAMPLER_KERNEL says)."""
    from loopchat.engine import _sampler_kernel

    return _sampler_kernel


@pytest.fixture(params=PATHS)
def sampler_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "kernel":
        if os.environ.get("LOOPCHAT_SAMPLER_KERNEL") == "0":
            pytest.skip("LOOPCHAT_SAMPLER_KERNEL=0: the numpy path only")
        monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
    else:
        monkeypatch.setattr(sampler_fused, "kernel", None)
    yield request.param
