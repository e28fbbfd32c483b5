"""DRY against llama.cpp's own: `llama-server` (built from the pinned llama-cpp-python's
llama.cpp, as tests/test_remote_llama_server.py builds it) samples a repetitive text with
only DRY and temperature 1 in its chain; what it subtracted is what dry.penalties gives."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
from remote_servers import start_llama_server

from loopchat.engine import dry
from loopchat.engine.engine import Engine

pytestmark = [pytest.mark.model, pytest.mark.server]

#: weaker than the default, so that the penalized tokens stay among the 10 reported after it
DRY = dict(dry_multiplier=0.3, dry_base=1.1, dry_allowed_length=2, dry_penalty_last_n=1024)
TEXT = (
    "Rule one: the cat sat on the mat and the dog sat on the log. Rule two: the cat sat on the mat "
    "and the dog sat on the log. Rule three: the cat sat on the mat and the dog"
)


@pytest.fixture(scope="module")
def llama_server(model_path: Path):
    server = start_llama_server(model_path, 1024)
    yield server
    server.stop()


def _completion(server, prompt: list[int], **kw) -> list[dict]:
    body = {
        "prompt": prompt,
        "cache_prompt": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "seed": 5,
        **kw,
    }
    r = httpx.post(server.url + "/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["completion_probabilities"]


def test_llama_server_s_dry_subtracts_loopchat_s_penalties(llama_server, engine: Engine) -> None:
    """llama-server generates with DRY and reports each step's distribution after it; asked
    again for the same context without DRY it gives the raw one. For every token both
    show, log(after) - log(raw) + loopchat's penalty is the same number: llama.cpp
    subtracted exactly the penalties dry.penalties computes (same logits, no noise from
    another build)."""
    prompt = engine.tokenize(TEXT)
    steps = _completion(
        llama_server, prompt, n_predict=30, n_probs=10, post_sampling_probs=True, samplers=["dry", "temperature"], **DRY
    )
    tokens = [p["id"] for p in steps]
    breakers = dry.model_breakers(engine)
    penalized, longest = 0, 0.0
    for i, step in enumerate(steps):
        context = prompt + tokens[:i]
        (raw,) = _completion(llama_server, context, n_predict=1, n_probs=10, samplers=["temperature"])
        before = {t["id"]: math.exp(t["logprob"]) for t in raw["top_logprobs"]}  # (pre-sampling: logprobs)
        after = {t["id"]: t["prob"] for t in step["top_probs"]}
        ids, pen = dry.penalties(context, breakers, 0.3, 1.1, 2, 1024)
        penalty = dict(zip(ids.tolist(), pen.tolist()))
        both = [t for t in after if t in before and after[t] > 1e-3 and before[t] > 1e-3]
        shifts = [math.log(after[t]) - math.log(before[t]) + penalty.get(t, 0.0) for t in both]
        assert len(both) >= 2 and max(shifts) - min(shifts) < 0.02, (i, both, shifts, penalty)
        penalized += sum(t in penalty for t in both)
        longest = max(longest, max((penalty[t] for t in both if t in penalty), default=0.0))
    # DRY acted on tokens compared, up to a repeat of 12 tokens (seed 5: 4 tokens, 0.3 × 1.1^10)
    assert penalized >= 4 and longest > 0.3 * 1.1**5, (penalized, longest)
