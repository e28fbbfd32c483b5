"""Finished replies as Markdown (F4): an ordered list keeps its numbers' periods, and the
reply's first line is its text, not a blank line."""

from __future__ import annotations

from tui_fixtures import FakeBackend, drawn, fake_app, reply_to

LIST = ["1", ".", " **Be", " patient**", "\n", "2", ".", " Be", " kind", "\n", "3", ".", " Rest"]


async def test_a_numbered_list_keeps_its_periods_and_no_blank_line_opens_the_reply(tmp_path) -> None:
    """`1. **Be patient**` showed as ` 1 Be patient`, after a blank line."""
    app = fake_app(tmp_path, FakeBackend(tokens=LIST), markdown=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_to(pilot, "Tips?")
        await pilot.pause()
        (view,) = app.transcript.reply_views()
        rows = [r.rstrip() for r in drawn(view).splitlines()]
        title = next(i for i, r in enumerate(rows) if "Assistant · reply 1" in r)
        assert rows[title + 1 : title + 4] == ["│  1. Be patient", "│  2. Be kind", "│  3. Rest"], rows
        await pilot.press("f4")  # plain tokens: the text as written
        await pilot.pause()
        rows = [r.rstrip() for r in drawn(view).splitlines()]
        assert rows[title + 1] == "│ 1. **Be patient**", rows


async def test_a_paragraph_then_a_list_keeps_the_blank_line_between_them(tmp_path) -> None:
    app = fake_app(tmp_path, FakeBackend(tokens=["Tips", ":", "\n\n", *LIST[:9]]), markdown=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_to(pilot, "Tips?")
        await pilot.pause()
        (view,) = app.transcript.reply_views()
        rows = [r.rstrip() for r in drawn(view).splitlines()]
        title = next(i for i, r in enumerate(rows) if "Assistant · reply 1" in r)
        assert rows[title + 1 : title + 5] == ["│ Tips:", "│", "│  1. Be patient", "│  2. Be kind"], rows
