"""A chat stream's token chunk written straight as its line (wire_line.py) is the very text of
the chunk object's `sse_line`: recorded replies' steps and made-up ones whose texts, bytes and
probabilities reach every case of the JSON encoder's (escapes, characters outside ASCII, a
piece of a character, probabilities 0, tiny and NaN), at every option the line depends on."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

from loopchat import wire_line
from loopchat.events import Candidate, Step
from loopchat.trace import read_trace
from loopchat.wire import WireOptions, WireSerializer

DATA = Path(__file__).parent / "data"
TEXTS = [
    "",
    " the",
    'say "hi"',
    "back\\slash",
    "tab\tnew\nline\r",
    "\x00\x01\x1f\x7f",
    "naïve ✓ 日本",
    "\u2028\u2029",
    "\ufffd",
    "🙂",
]
PROBS = [1.0, 0.5, 1e-300, 5e-324, 0.0, None, float("nan"), 0.1 + 0.2]


def recorded_steps() -> list[Step]:
    steps = []
    for name in ("reply.jsonl", "compare.jsonl", "document.jsonl"):
        _, traced = read_trace(DATA / name)
        steps += [t.event for t in traced if isinstance(t.event, Step) and not t.event.is_stop]
    return steps


def made_up_steps(base: Step, n: int = 300) -> list[Step]:
    rng = random.Random(5)

    def candidate() -> Candidate:
        text = rng.choice(TEXTS)
        raw = rng.choice([None, text.encode("utf-8"), b"\xe6\x97", b""])
        return Candidate(rng.randrange(50_000), text, rng.choice(PROBS) or 0.0, raw)

    out = []
    for _ in range(n):
        piece = rng.choice(TEXTS)
        out.append(
            replace(
                base,
                text=rng.choice(TEXTS),
                piece=piece,
                piece_bytes=rng.choice([None, piece.encode("utf-8"), b"\xf0\x9f"]),
                raw_prob=rng.choice(PROBS) or 0.0,
                raw_top=tuple(candidate() for _ in range(rng.randrange(0, 25))),
            )
        )
    return out


def test_the_token_line_is_the_chunk_objects_line() -> None:
    recorded = recorded_steps()
    assert len(recorded) > 50
    steps = recorded + made_up_steps(recorded[0])
    options = [
        WireOptions(logprobs=lp, top_logprobs=k, include_usage=usage, extension=False, prompt=False)
        for lp, k, usage in itertools.product((True, False), (0, 1, 5, 20), (True, False))
    ]
    for opts in options:
        fast = WireSerializer('model "m" ✓', opts, id="chatcmpl-\u2028x", created=1_800_000_000)
        slow = WireSerializer(fast.model, opts, id=fast.id, created=fast.created)
        slow._line = None  # (the chunk object's path)
        assert fast._line is not None
        for step in steps:
            assert fast.lines(step) == slow.lines(step), (opts, step.piece, step.text)
        assert fast._text == slow._text and fast._offset == slow._offset


def test_the_faces_table_is_shared_and_cleared_when_full(monkeypatch) -> None:
    """Every writer reads one table of faces, kept from reply to reply; past FACES_MAX it is
    cleared, and the lines are the same."""
    monkeypatch.setattr(wire_line, "FACES_MAX", 7)
    recorded = recorded_steps()
    steps = recorded + made_up_steps(recorded[0], 60)
    opts = WireOptions(logprobs=True, top_logprobs=20, extension=False, prompt=False)
    first, second = (WireSerializer("m", opts, id="chatcmpl-x", created=1) for _ in range(2))
    assert first._line is not None and second._line is not None
    assert first._line._faces is second._line._faces
    first._line._faces.clear()  # (earlier tests' faces)
    slow = WireSerializer("m", opts, id="chatcmpl-x", created=1)
    slow._line = None
    for i, step in enumerate(steps):
        assert (first if i % 2 else second).lines(step) == slow.lines(step), (step.piece, step.text)
        assert len(first._line._faces) <= 7


def test_the_other_events_and_the_extension_take_the_objects_path() -> None:
    """A stop token's step, the extension on, a blocking body or the legacy completions: no line of its own."""
    assert WireSerializer("m", WireOptions(extension=True))._line is None
    assert WireSerializer("m", WireOptions(extension=False, stream=False))._line is None
    assert WireSerializer("m", WireOptions(extension=False, chat=False))._line is None
    step = recorded_steps()[0]
    ser = WireSerializer("m", WireOptions(logprobs=True, top_logprobs=5, extension=False))
    assert ser.lines(replace(step, is_stop=True)) == []  # (rides on the finish chunk, as before)
