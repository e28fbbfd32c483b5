"""`loopchat serve` with `--threads auto`: one tuner for every request (the engine's),
and the start-up line says what it chose while the model loaded (issue 22)."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from test_serve import KEY, MODEL, Serve

from loopchat.engine.cores import physical_cores

pytestmark = [pytest.mark.model, pytest.mark.server]


def steps(url: str, tokens: int) -> list[dict]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "loopchat": True,
    }
    out = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, timeout=120, headers={"Authorization": f"Bearer {KEY}"}
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                step = json.loads(line[6:]).get("loopchat", {}).get("step")
                if step is not None:
                    out.append(step)
    return out


def test_the_start_up_line_says_what_auto_chose_and_requests_share_the_tuner() -> None:
    s = Serve("--threads", "auto", env={"LOOPCHAT_API_KEY": KEY})
    try:
        line = next(x for x in s.out if "listening on" in x)
        m = re.search(r" · threads auto: (chose (\d+) threads?: [^·]*\(first measurement\)[^·]*) · queue", line)
        assert m, line
        assert 1 <= int(m.group(2)) <= physical_cores()
        first = steps(s.url, 40)
        # the first reply starts under the choice made at load
        assert first[0]["threads_reason"] == m.group(1)
        in_force = [x["threads_reason"] for x in first if x["threads_reason"]][-1]
        # the next request goes on with the same tuner: the reason in force at the end of
        # the last reply, or a later one where a probe of that tuner ended in between (seen
        # under load); a tuner per request would start again from "until measured"
        second = steps(s.url, 20)
        reason = second[0]["threads_reason"]
        assert reason == in_force or (
            "until measured" not in reason and "(first measurement)" not in reason and "measured yet" not in reason
        ), (reason, in_force)
    finally:
        s.stop()
