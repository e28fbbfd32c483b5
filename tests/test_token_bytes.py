"""Candidates that are pieces of one character (an emoji's bytes split between tokens):
their text is U+FFFD for every one of them, so they are shown by their bytes, `<f0 9f>`,
everywhere a candidate is shown; the bytes travel in the trace, the history and the wire."""

from __future__ import annotations

import pytest
from textual.widgets import Input, OptionList
from tui_fixtures import panel_text, wait_for

from loopchat.chat.prefs import Prefs
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import DOCUMENT, Message, Step
from loopchat.history.step_codec import decode_steps, encode_steps
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app
from loopchat.tui.step_mode import TokenSearch
from loopchat.wire import _top

pytestmark = pytest.mark.model

#: after an emoji's first bytes, the model's candidates are all continuation bytes
EMOJI = "Emoji list: 😀 😃 😄 😁 😆 😅 🤣 😂 🙂 🙃 😉 😊 😇 🥰 😍 🤩 😘"


def face(raw: bytes) -> str:
    return "<" + " ".join(f"{b:02x}" for b in raw) + ">"


def emoji_steps(engine, n: int = 2) -> list[Step]:
    settings = SamplingSettings(seed=1, max_tokens=n, temperature=0.0)
    return [e for e in engine.generate([Message(DOCUMENT, EMOJI)], settings) if isinstance(e, Step)]


def test_a_piece_of_a_character_carries_its_bytes_through_trace_history_and_wire(engine) -> None:
    steps = emoji_steps(engine)
    pieces = [c for s in steps for c in s.raw_top if c.text.endswith("\ufffd")]
    assert len(pieces) >= 10
    for c in pieces:
        assert c.piece_bytes == engine.piece(c.token_id) and c.piece_bytes is not None
    assert len({c.piece_bytes for c in steps[1].raw_top}) == 10  # ten rows, ten faces (they were ten "�")
    whole = [c for s in steps for c in s.raw_top if "\ufffd" not in c.text]
    assert all(c.piece_bytes is None for c in whole)  # a whole character: its text, as before
    for s in steps:
        assert event_from_json_dict(to_json_dict(s)) == s  # the trace
    assert decode_steps(encode_steps(steps)) == steps  # the history
    c = pieces[0]
    assert _top(c)["bytes"] == list(c.piece_bytes)  # the wire: it sent null


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


async def test_the_die_and_the_search_show_the_pieces_bytes(backend, engine, tmp_path) -> None:
    """The die of a pass whose candidates are all continuation bytes showed ten rows of
    "�"; the token search listed the pieces as "�" too."""
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
        history=False,
        settings=SamplingSettings(seed=1, max_tokens=6, temperature=0.0),
        mode="completion",
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("f12")
        app.prompt.value = EMOJI
        await pilot.press("enter")
        s = app.session
        await wait_for(pilot, lambda: s.stopped and s.pending.index == 0, 30, "stopped before the first draw")
        await pilot.press("enter")  # draws the emoji's first bytes
        await wait_for(pilot, lambda: s.stopped and s.pending.index == 1, 30, "stopped before the second")
        await pilot.pause()
        text = panel_text(app)
        faces = [face(engine.piece(c.token_id)) for c in s.pending.raw_top]
        assert all(c.text.endswith("\ufffd") for c in s.pending.raw_top)
        for shown in faces[:8]:
            assert shown in text, (shown, text)
        assert "\ufffd" not in text, text
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, TokenSearch), 5, "the search")
        search = app.screen
        await pilot.press(*"<f0 9f")
        await wait_for(pilot, lambda: search.query_one(Input).value == "<f0 9f" and search.results, 5, "results")
        options = search.query_one(OptionList)
        rows = [options.get_option_at_index(i).prompt.plain for i in range(options.option_count)]
        assert any(r.split()[0] == "<f0" and "9f>" in r for r in rows), rows
        assert not any("\ufffd" in r for r in rows)
        await pilot.press("escape", "ctrl+c")


def test_every_tokens_bytes_are_the_same_through_the_kernels_call_and_ctypes(engine) -> None:
    """The C kernel's piece_of (LlamaCalls.token_to_piece where it is built) gives the bytes of the
    ctypes call it replaces for every token of the vocabulary: special ones spelled out, pieces
    longer than ctypes' first 64-byte buffer (the default model has some) included."""
    calls = engine._c
    assert calls._piece_of is not None  # (built: tests/test_sampler_kernel.py checks the build)
    kernel_pieces = [calls.token_to_piece(t) for t in range(engine.n_vocab)]
    calls._piece_of, kept = None, calls._piece_of
    try:
        ctypes_pieces = [calls.token_to_piece(t) for t in range(engine.n_vocab)]
    finally:
        calls._piece_of = kept
    assert kernel_pieces == ctypes_pieces
    assert max(len(p) for p in kernel_pieces) > 64
    assert b"<|im_end|>" in kernel_pieces
