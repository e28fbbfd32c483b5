"""Switching models in the chat (the real default model; a missing and a broken file)."""

from __future__ import annotations

import pytest
from tui_fixtures import wait_for, wait_run

from loopchat.backends.live import LiveBackend
from loopchat.chat.prefs import Prefs
from loopchat.config import load_config
from loopchat.model_files import builtin_model_path
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.model


def write_config(tmp_path):
    truncated = tmp_path / "truncated.gguf"
    with open(builtin_model_path(), "rb") as src:
        truncated.write_bytes(src.read(4 << 20))  # a real header, most tensors missing
    config = tmp_path / "models.toml"
    config.write_text(
        'default = "small"\n'
        '[models.small]\nbuiltin = "smollm2-135m-instruct"\nthreads = 1\n'
        f'[models.gone]\npath = "{tmp_path / "nowhere.gguf"}"\n'
        f'[models.broken]\npath = "{truncated}"\n'
    )
    return config


async def test_a_failed_switch_names_the_model_that_is_loaded(tmp_path) -> None:
    backend = LiveBackend(load_config(write_config(tmp_path)), None, threads=1)
    app = create_app(backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "the model")
            assert app.sub_title.startswith("small ·")
            # a file that is not there: nothing was unloaded, the chat goes on with `small`
            app.switch_model("gone")
            await wait_for(pilot, lambda: app.last_error is not None, 30, "the error")
            await wait_for(pilot, app.model_ready.is_set, 10, "the old model back")
            assert "nowhere.gguf" in app.last_error
            assert app.sub_title.startswith("small ·")
            await pilot.press(*"Say hi.", "enter")
            await wait_run(pilot)
            assert app.conversation.replies[0].finish.text
            # a file llama.cpp cannot load: the old model is gone, and the app says so
            app.last_error = None
            app.switch_model("broken")
            await wait_for(pilot, lambda: app.last_error is not None, 60, "the load error")
            await pilot.pause()
            assert "broken" not in app.sub_title and "small" not in app.sub_title
            assert app.sub_title.startswith("no model loaded")
            assert app.panel.view.model == "none loaded"
            assert not app.model_ready.is_set()
            assert "No model loaded" in str(app.prompt.placeholder)
    finally:
        backend.close()


async def test_a_full_path_model_is_named_by_its_file_in_the_title_and_the_box(tmp_path) -> None:
    """`--model /a/long/path/x.gguf` put the whole path in the header and the message box's
    placeholder, both cut at 80 columns before the model's file name was read."""
    from textual.widgets import TextArea

    folder = tmp_path / "a-folder-with-a-rather-long-name" / "and-another-one-below-it" / "models"
    folder.mkdir(parents=True)
    model = folder / "smollm2.gguf"
    model.symlink_to(builtin_model_path())
    backend = LiveBackend(None, str(model), threads=1)
    app = create_app(backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json", history=False)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "the model")
            await pilot.pause()
            assert app.sub_title.startswith("smollm2.gguf ·"), app.sub_title
            header = app.query_one("HeaderTitle")
            (row,) = [strip.text for strip in header.render_lines(header.size.region)][:1]
            assert "smollm2.gguf · streaming" in row and "a-folder" not in row, row
            box = app.query_one(TextArea)
            shown = "\n".join(strip.text for strip in box.render_lines(box.outer_size.region))
            assert "Message smollm2.gguf — Enter sends, Ctrl+J new line" in shown, shown
    finally:
        backend.close()
