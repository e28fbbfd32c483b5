"""A sampling setting is one row of settings.SETTINGS: every list of settings elsewhere is
made from the table (issue 23). Proved two ways:

- every row of today's table goes through each place a setting goes: the remote backend's
  request body (by its wire name), `loopchat serve`'s request parser (what the remote
  backend sends comes out the same), the panel's rows and summary line, the F1 help and
  the branch picker (the knobs);
- a child process adds one row to settings.py's source (a made-up `typical_p`) and
  nothing else, then checks that `loopchat serve` accepts it, the remote backend sends it,
  the panel shows it, `loopchat run` has its flag and models.toml takes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Input
from tui_fixtures import fake_app, wait_for

from loopchat.backends.remote import RemoteBackend
from loopchat.events import Message
from loopchat.request import ReplyRequest
from loopchat.serve.requests import parse_chat
from loopchat.settings import EXTENSION_KEYS, KNOBS, SETTINGS, SamplingSettings
from loopchat.settings_text import knob_order_text, knob_steps_text, knobs_line, summary_lines
from loopchat.tui.help_screen import KEYS
from loopchat.tui.settings_dialog import SettingsDialog

#: DRY on, so that its other settings show in the panel's DRY item
BASE = SamplingSettings(dry_multiplier=0.8, seed=7)


def changed(spec) -> SamplingSettings:
    """BASE with this row's setting at another allowed value."""
    if spec.type is tuple:  # a setting of its own kind (the logit bias): a value of that kind
        return BASE.replace(**{spec.name: spec.kind.check({"7": spec.hi})})
    if spec.kind is not None:  # one word of a few (the draft): another of them
        return BASE.replace(**{spec.name: next(c for c in spec.kind.choices if c != getattr(BASE, spec.name))})
    value = spec.hi if getattr(BASE, spec.name) != spec.hi else spec.lo
    return BASE.replace(**{spec.name: spec.type(value)})


def test_the_remote_backend_sends_every_setting_and_serve_reads_it_back() -> None:
    for extensions in (True, False):
        backend = RemoteBackend("http://127.0.0.1:9/v1", model_id="m", extensions=extensions)
        try:
            for spec in SETTINGS:
                settings = changed(spec)
                _, body, _ = backend.request(ReplyRequest((Message("user", "hi"),), settings))
                sent = spec.openai or extensions
                assert (spec.wire in body) is sent, (spec.name, extensions, body)
                if sent:
                    assert body[spec.wire] == spec.wire_form(getattr(settings, spec.name))
                got = parse_chat(body, SamplingSettings(seed=7)).reply.settings
                want = (
                    settings
                    if extensions
                    else SamplingSettings(seed=7).replace(
                        **{s.name: getattr(settings, s.name) for s in SETTINGS if s.openai}
                    )
                )
                assert got == want, (spec.name, extensions)
        finally:
            backend.close()
    assert set(EXTENSION_KEYS) == {s.wire for s in SETTINGS if not s.openai}


def test_serve_takes_each_setting_by_its_wire_name_and_aliases() -> None:
    for spec in SETTINGS:
        settings = changed(spec)
        for key in (spec.wire, *spec.wire_aliases):
            body = {"messages": [{"role": "user", "content": "hi"}], key: spec.wire_form(getattr(settings, spec.name))}
            assert parse_chat(body, BASE).reply.settings == settings, (spec.name, key)


def test_every_setting_shows_on_screen() -> None:
    for spec in SETTINGS:
        settings = changed(spec)
        if spec.name in KNOBS:  # a row of its own in the panel; the help and the branch picker name it
            assert knobs_line(settings) != knobs_line(BASE), spec.name
            assert spec.spoken in knob_steps_text() and spec.spoken in knob_order_text()
        else:  # the panel's summary line under the knobs
            assert summary_lines(settings, 200) != summary_lines(BASE, 200), spec.name
    help_text = " ".join(what for _, what in KEYS)
    assert knob_steps_text() in help_text and knob_order_text() in help_text


async def test_the_f2_dialog_has_a_field_for_every_setting(tmp_path: Path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the dialog")
        for spec in SETTINGS:
            field = app.screen.query_one(f"#set-{spec.name}", Input)
            value = getattr(app.session.in_force(), spec.name)
            assert field.value == spec.text(value), spec.name
            assert field.value == ("" if value is None else str(value)) or spec.kind is not None, spec.name


async def test_the_f2_dialog_at_80x24_scrolls_its_rows_and_keeps_its_buttons(tmp_path: Path) -> None:
    """Its rows outgrew a 24-line terminal: the buttons were drawn below the screen. Now the rows
    scroll (Tab brings the last field into view) and the note and the buttons stay."""
    from textual.widgets import Button

    app = fake_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the dialog")
        screen = app.screen
        for button in screen.query(Button):
            assert button.region.height > 0 and button.region.bottom <= 24, button.region
        grid = screen.query_one("#settings-grid")
        last = list(screen.query(Input))[-1]
        assert not grid.region.contains_region(last.region)  # below the rows shown
        last.focus()
        await pilot.pause()
        await wait_for(pilot, lambda: grid.region.contains_region(last.region), 5, "the last field in view")


CHILD = r'''
import importlib.util, json, pathlib, sys, tempfile

import loopchat

path = pathlib.Path(loopchat.__file__).with_name("settings.py")
source = path.read_text(encoding="utf-8")
row = """    SettingSpec(
        "typical_p", float, 1.0, 0.0, 1.0, "1.0 disables typical sampling", "0–1 · 1 = off", short="typical",
        summary=lambda s: f"typical {s.typical_p:.2f}",
    ),
"""
marker = '    SettingSpec(\n        "seed",'
assert marker in source, "the seed's row is not where the test expects it"
spec = importlib.util.spec_from_loader("loopchat.settings", loader=None)
module = importlib.util.module_from_spec(spec)
module.__file__ = str(path)
sys.modules["loopchat.settings"] = module
exec(compile(source.replace(marker, row + marker, 1), str(path), "exec"), module.__dict__)
loopchat.settings = module

from loopchat.settings import SamplingSettings

settings = SamplingSettings(typical_p=0.5)
out = {}
from loopchat.backends.remote import RemoteBackend
from loopchat.events import Message
from loopchat.request import ReplyRequest

backend = RemoteBackend("http://127.0.0.1:9/v1", model_id="m")
try:
    _, body, _ = backend.request(ReplyRequest((Message("user", "hi"),), settings))
finally:
    backend.close()
out["remote sends it"] = body.get("typical_p") == 0.5
from loopchat.serve.requests import parse_chat

out["serve reads it"] = parse_chat(body, SamplingSettings()).reply.settings.typical_p == 0.5
try:
    from loopchat.settings_text import summary_lines

    out["the panel shows it"] = any("typical 0.50" in line for line in summary_lines(settings, 200))
except ImportError as exc:
    out["the panel shows it"] = str(exc)
from loopchat.cli.main import build_parser

args = build_parser().parse_args(["run", "--typical-p", "0.5", "hi"])
out["run has its flag"] = getattr(args, "typical_p", None) == 0.5
from loopchat.config import load_config

toml = pathlib.Path(tempfile.mkdtemp()) / "models.toml"
toml.write_text('[models.m]\nbuiltin = "smollm2-135m-instruct"\n[models.m.sampling]\ntypical_p = 0.5\n')
out["models.toml takes it"] = load_config(toml).get("m").sampling.typical_p == 0.5
print(json.dumps(out))
'''


@pytest.mark.server  # a child Python process
def test_a_new_row_is_all_a_new_setting_needs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == dict.fromkeys(out, True) and len(out) == 5, out
