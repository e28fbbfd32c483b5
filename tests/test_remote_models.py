"""Models on a server in models.toml (`url = ...`) beside local ones: the file's checks,
`loopchat models`, `loopchat run --model NAME`, and the chat's model list switching
between a local model and a server (a real one, started here: tests/remote_servers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from remote_servers import MODEL, MODEL_2, free_port, misbehaving_server
from tui_fixtures import panel_text, wait_for, wait_run

from loopchat.backends.live import LiveBackend
from loopchat.backends.models_backend import ModelsBackend, configured_backend
from loopchat.backends.remote import RemoteBackend
from loopchat.chat.prefs import Prefs
from loopchat.cli import main as cli
from loopchat.config import ConfigError, format_models_listing, load_config
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def server():
    with misbehaving_server() as (url, state):
        yield url, state


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    return path


REMOTE = """
default = "box"

[models.box]
url = "{url}"
model = "{model}"
description = "the box down the hall"
api_key_env = "LOOPCHAT_TEST_KEY"
timeout = 30
system_prompt = "Be brief."

[models.box.sampling]
temperature = 0.3
max_tokens = 20

[models.local]
builtin = "smollm2-135m-instruct"
"""


def test_a_url_entry_is_read_with_its_keys(tmp_path, monkeypatch) -> None:
    config = load_config(write(tmp_path, REMOTE.format(url="http://10.0.0.2:8080", model="qwen")))
    spec = config.get("box")
    assert spec.remote and spec.location == "http://10.0.0.2:8080" and spec.model_id == "qwen"
    assert spec.timeout == 30.0 and spec.extensions is True and spec.system_prompt == "Be brief."
    assert spec.sampling.temperature == 0.3
    monkeypatch.delenv("LOOPCHAT_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$LOOPCHAT_TEST_KEY, which is not set — export it"):
        spec.key()
    monkeypatch.setenv("LOOPCHAT_TEST_KEY", "sk-1")
    assert spec.key() == "sk-1"
    listing = format_models_listing(config)
    line = next(x for x in listing.splitlines() if "box" in x)
    assert "url http://10.0.0.2:8080 qwen" in line and "remote, key $LOOPCHAT_TEST_KEY" in line
    assert "n_ctx" not in line and "the box down the hall" in line


@pytest.mark.parametrize(
    "body, needle",
    [
        ('url = "http://h:1/v1"\nn_ctx = 2048', "models.box.n_ctx has no meaning for a model on a server"),
        ('url = "http://h:1/v1"\nthreads = 2', "models.box.threads has no meaning"),
        ('url = "ftp://h/v1"', "models.box.url"),
        ('url = "http://h:1/v1"\napi_key = "a"\napi_key_env = "B"', "has both api_key and api_key_env"),
        ('url = "http://h:1/v1"\napi_key_env = "not a name"', "must name an environment variable"),
        ('url = "http://h:1/v1"\ntimeout = 0', "models.box.timeout must be a number of seconds above 0"),
        ('url = "http://h:1/v1"\nextensions = "no"', "models.box.extensions must be true or false"),
        ('builtin = "smollm2-135m-instruct"\nmodel = "x"', "models.box.model is only for a model on a server"),
        ('url = "http://h:1/v1"\npath = "x.gguf"', "needs exactly one of path, hf, builtin, url"),
    ],
)
def test_a_bad_url_entry_is_one_line(tmp_path, body, needle) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, f"[models.box]\n{body}\n"))
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_chat_gets_a_plain_live_backend_without_url_entries(tmp_path) -> None:
    path = write(tmp_path, '[models.a]\nbuiltin = "smollm2-135m-instruct"\n')
    backend = configured_backend(load_config(path), None, threads=1)
    try:
        assert isinstance(backend, LiveBackend) and backend.live_settings
    finally:
        backend.close()


def test_loopchat_run_with_a_url_entry(server, tmp_path, monkeypatch, capsys) -> None:
    url, state = server
    path = write(tmp_path, REMOTE.format(url=url + "/ok", model=MODEL_2))
    monkeypatch.delenv("LOOPCHAT_TEST_KEY", raising=False)
    assert cli.main(["run", "--config", str(path), "Hello?"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LOOPCHAT_TEST_KEY, which is not set" in err
    monkeypatch.setenv("LOOPCHAT_TEST_KEY", "sk-test")
    assert cli.main(["run", "--config", str(path), "Hello?"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hié there\n"
    body = state["requests"][-1]
    assert body["model"] == MODEL_2 and body["max_tokens"] == 20 and body["temperature"] == 0.3
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert cli.main(["run", "--config", str(path), "--threads", "2", "Hello?"]) == 2
    assert "--threads has no meaning for a model on a server" in capsys.readouterr().err


def test_the_models_command_lists_url_entries(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("LOOPCHAT_TEST_KEY", "x")
    path = write(tmp_path, REMOTE.format(url="http://10.0.0.2:8080/v1", model="qwen"))
    assert cli.main(["models", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "* box" in out and "url http://10.0.0.2:8080/v1 qwen" in out and "local" in out


async def test_the_chat_switches_between_a_local_model_and_a_server(server, tmp_path, monkeypatch) -> None:
    url, state = server
    monkeypatch.setenv("LOOPCHAT_TEST_KEY", "sk-test")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    path = write(tmp_path, REMOTE.format(url=url + "/ok", model=MODEL) + f'\n[models.gone]\nurl = "{dead}"\n')
    backend = ModelsBackend(load_config(path), "local", threads=1)
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
        settings=SamplingSettings(seed=1, max_tokens=6),
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "the local model")
            assert backend.name == "local" and backend.live_settings
            assert backend.model_names == ["box", "local", "gone", "smollm2-135m-instruct"]
            await pilot.press(*"Hi", "enter")
            await wait_run(pilot)
            assert app.conversation.replies[0].start.source == ""
            # to the server
            app.switch_model("box")
            await wait_for(pilot, app.model_ready.is_set, 20, "the server's model list")
            assert backend.name == "box" and not backend.live_settings
            assert app.conversation.system_prompt == "Be brief."  # the entry's
            await pilot.press(*"Hello?", "enter")
            await wait_run(pilot)
            rec = app.conversation.replies[1]
            assert rec.text == "Hié there" and rec.start.source == url + "/ok/v1"
            assert state["requests"][-1]["model"] == MODEL
            assert f"server {url}/ok/v1" in panel_text(app)
            # a server that cannot be reached: one line, and the server in use stays
            app.switch_model("gone")
            await wait_for(pilot, lambda: app.last_error is not None, 20, "the failed switch")
            await wait_for(pilot, app.model_ready.is_set, 20, "the model in use again")
            assert "cannot connect to" in app.last_error and "still using box" in app.last_error
            assert backend.name == "box"
            # back to the local model: it is still loaded, the switch is instant
            app.switch_model("local")
            await wait_for(pilot, app.model_ready.is_set, 20, "the local model")
            assert backend.name == "local" and backend.live_settings
            await pilot.press(*"Bye", "enter")
            await wait_run(pilot)
            assert app.conversation.replies[2].start.source == "" and app.conversation.replies[2].finish.text
            runs = [r.run_id for r in app.conversation.replies]
            assert runs == sorted(set(runs))  # one id per reply, whichever source ran it
    finally:
        backend.close()


async def test_url_alone_offers_the_servers_models(server, tmp_path) -> None:
    url, state = server
    backend = RemoteBackend(url + "/ok")
    app = create_app(backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 20, "the model list")
            assert backend.name == MODEL and backend.model_names == [MODEL, MODEL_2]
            app.switch_model(MODEL_2)
            await wait_for(pilot, app.model_ready.is_set, 20, "the other model")
            assert backend.name == MODEL_2
            await pilot.press(*"Hi", "enter")
            await wait_run(pilot)
            assert state["requests"][-1]["model"] == MODEL_2
    finally:
        backend.close()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--url", "http://127.0.0.1:1/v1", "--model", "x", "Hi"], "--model and --url both name a model"),
        (["run", "--url", "http://127.0.0.1:1/v1", "--top-report", "30", "Hi"], "at most 20 for a server"),
        (["run", "--url", "ftp://h/v1", "Hi"], "--url: 'ftp://h/v1' is not an http:// or https:// URL"),
        (["run", "--api-key", "k", "Hi"], "--api-key is for a model on a server: give --url too"),
        (["run", "--url", "http://127.0.0.1:1/v1", "--timeout", "0", "Hi"], "--timeout"),
        (["--url", "ftp://h/v1"], "--url: 'ftp://h/v1' is not an http:// or https:// URL"),
        (["--model-id", "m"], "--model-id goes with --url"),
        (["--url", "http://127.0.0.1:1/v1", "--threads", "2"], "--threads has no meaning for a model on a server"),
    ],
)
def test_options_that_do_not_fit_are_one_line(capsys, args, needle) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loopchat: ") and needle in err, err


async def test_a_switch_to_an_entry_whose_key_is_not_set_keeps_the_model(server, tmp_path, monkeypatch) -> None:
    url, _ = server
    monkeypatch.delenv("LOOPCHAT_TEST_KEY", raising=False)
    path = write(tmp_path, REMOTE.format(url=url + "/ok", model=MODEL) + '\n[models.open]\nurl = "' + url + '/ok"\n')
    backend = ModelsBackend(load_config(path), "open")
    app = create_app(backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 20, "the server's model list")
            app.switch_model("box")
            await wait_for(pilot, lambda: app.last_error is not None, 10, "the error")
            await wait_for(pilot, app.model_ready.is_set, 10, "the model in use again")
            assert "LOOPCHAT_TEST_KEY, which is not set" in app.last_error and "still using open" in app.last_error
            assert backend.name == "open"
    finally:
        backend.close()
