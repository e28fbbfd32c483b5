"""Model configuration: models.toml parsing, its error messages, and model file lookup.

Real files in tmp_path; the Hugging Face tests use a real hub cache layout in tmp_path
and HF_HUB_OFFLINE=1, so nothing touches the network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loopchat.config import BUILTIN_CONFIG, ConfigError, format_models_listing, load_config
from loopchat.model_files import ModelFileError, builtin_model_path, check_gguf, hf_download, parse_hf_spec
from loopchat.paths import default_config_path
from loopchat.settings import SamplingSettings

EXAMPLE = Path(__file__).resolve().parents[1] / "models.example.toml"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF_SPEC = "someorg/Tiny-GGUF:tiny-q4.gguf"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """No test reads the real user config or the real Hugging Face cache."""
    monkeypatch.setenv("LOOPCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write(tmp_path: Path, text: str, name: str = "models.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- valid files ---------------------------------------------------------------------


def test_example_file_loads_as_is():
    config = load_config(EXAMPLE)
    assert config.path == EXAMPLE
    assert config.default == "smollm2"
    spec = config.get(None)
    assert spec.source == "builtin" and spec.location == "smollm2-135m-instruct"
    builtin = BUILTIN_CONFIG.get()  # the example spells out the bundled model's own defaults
    assert (spec.sampling, spec.system_prompt) == (builtin.sampling, builtin.system_prompt)
    assert "smollm2-135m-instruct" in config.models  # the built-in is always there


def test_example_file_commented_examples_are_valid(tmp_path):
    """Uncommenting every example block still gives a valid file."""
    code = re.compile(r"^# (\[models\.[^\]]+\]|[a-z_]+ = .*)$")
    lines = [line[2:] if code.match(line) else line for line in EXAMPLE.read_text().splitlines()]
    config = load_config(write(tmp_path, "\n".join(lines)))
    assert {"qwen2_5-0_5b", "llama3_2-1b", "smollm2-1_7b", "phi3_5-mini", "gemma2-2b", "mine"} <= set(config.models)
    assert config.models["smollm2-1_7b"].sampling.temperature == 0.2
    assert config.models["gemma3-270m"].mode == "completion"
    mine = config.models["mine"]
    assert (mine.source, mine.n_ctx, mine.threads) == ("path", 2048, 2)
    assert mine.local_path() == Path.home() / "models" / "x.gguf"


def test_no_file_gives_builtin_config_with_a_real_model_file():
    assert not default_config_path().exists()
    config = load_config()
    assert config is BUILTIN_CONFIG and config.path is None
    spec = config.get(None)
    path = spec.resolve_file()
    assert path == builtin_model_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert path.read_bytes()[:4] == b"GGUF"


def test_default_config_path_is_read(tmp_path):
    default_config_path().parent.mkdir(parents=True)
    default_config_path().write_text('[models.a]\npath = "a.gguf"\n')
    config = load_config()
    assert config.path == default_config_path()
    assert config.default == "a"  # no `default`: the first model in the file
    assert config.get("a").local_path() == default_config_path().parent / "a.gguf"


def test_full_model_entry(tmp_path):
    path = write(
        tmp_path,
        """
default = "tiny"
[models.tiny]
hf = "org/repo:file.gguf"
description = "a tiny one"
n_ctx = 2048
threads = 3
system_prompt = ""
chat_template = \"\"\"{% for m in messages %}{{ m.content }}{% endfor %}\"\"\"
[models.tiny.sampling]
temperature = 0
seed = 7
""",
    )
    spec = load_config(path).get("tiny")
    assert (spec.source, spec.location, spec.n_ctx, spec.threads) == ("hf", "org/repo:file.gguf", 2048, 3)
    assert spec.system_prompt is None
    assert spec.chat_template.startswith("{% for m")
    assert spec.sampling == SamplingSettings(temperature=0.0, seed=7)
    assert spec.base_dir == tmp_path


def test_user_entry_overrides_builtin_name(tmp_path):
    path = write(tmp_path, '[models.smollm2-135m-instruct]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = 1024\n')
    config = load_config(path)
    assert config.get("smollm2-135m-instruct").n_ctx == 1024


# --- the bundled model: what its model card uses ---------------------------------------

SMOLLM2_CARD_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_builtin_model_has_its_model_card_settings_and_a_repeat_penalty():
    # huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct: generate(temperature=0.2, top_p=0.9,
    # do_sample=True), transformers' top_k 50; plus DRY 0.8 and a repeat penalty of 1.05 over 256
    # tokens (docs/default-settings.md: without them the model loops); the system prompt is the one
    # its chat template puts in when there is none
    spec = BUILTIN_CONFIG.get()
    assert spec.system_prompt == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    s = spec.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.2, 0.9, 50, 0.0)
    assert (s.repeat_penalty, s.repeat_last_n) == (1.05, 256)
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n) == (0.8, 1.75, 2, 4096)
    assert (s.seed, s.max_tokens) == (SamplingSettings().seed, SamplingSettings().max_tokens)


@pytest.mark.model
def test_builtin_model_prompt_is_its_chatml_exactly(engine):
    from loopchat.events import Message

    question = Message("user", "What is the capital of France?")
    text = engine.render_prompt([Message("system", BUILTIN_CONFIG.get().system_prompt), question])
    assert text == SMOLLM2_CARD_PROMPT
    assert engine.render_prompt([question]) == SMOLLM2_CARD_PROMPT  # the template's own default

    tokens = engine.tokenize(text)
    (im_start,), (im_end,) = engine.tokenize("<|im_start|>"), engine.tokenize("<|im_end|>")
    # the GGUF's BOS is <|im_start|> and add_bos_token is false: nothing goes in front
    assert tokens[0] == im_start and tokens[1] != im_start
    assert (tokens.count(im_start), tokens.count(im_end)) == (3, 2)
    tail = engine.tokenize("<|im_start|>assistant\n")
    assert tokens[-len(tail) :] == tail
    assert engine.is_eog(im_end)


@pytest.mark.model
def test_builtin_model_reply_ends_at_its_stop_token(engine):
    from loopchat.events import Finish, FinishReason, Message

    spec = BUILTIN_CONFIG.get()
    messages = [Message("system", spec.system_prompt), Message("user", "What is 2+2?")]
    # greedy, without the repeat penalty: its greedy answer is "... is 4." and the stop token
    # (with the penalty, "is" of the question is penalized and the answer rambles on to
    # the limit: docs/default-settings.md)
    events = list(engine.generate(messages, spec.sampling.replace(temperature=0.0, max_tokens=60, repeat_penalty=1.0)))
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason == FinishReason.STOP
    assert finish.text.strip() and "<|im_" not in finish.text


# --- invalid files: one-line messages naming the file and the key ---------------------


INVALID = [
    # (file text, dotted key expected in the message, another expected fragment)
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nn_ctxx = 10\n', "models.tiny.n_ctxx", "allowed:"),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\ntemperature = 0.5\n',
        "models.tiny.temperature",
        "[models.tiny.sampling]",
    ),
    ('[modelz.tiny]\nbuiltin = "smollm2-135m-instruct"\n', "modelz", "allowed: default, models"),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\ntemprature = 1\n',
        "models.tiny.sampling.temprature",
        "allowed:",
    ),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = "big"\n', "models.tiny.n_ctx", "whole number"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = 4096.0\n', "models.tiny.n_ctx", "whole number"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\ndescription = 5\n', "models.tiny.description", "string"),
    ("[models.tiny]\npath = 5\n", "models.tiny.path", "string"),
    ('[models.tiny]\npath = ""\n', "models.tiny.path", "empty"),
    ("models = 3\n", "models", "table"),
    ('[models]\ntiny = "x.gguf"\n', "models.tiny", "table"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nsampling = 1\n', "models.tiny.sampling", "table"),
    ('[models.tiny]\ndescription = "no source"\n', "models.tiny", "got none"),
    ('[models.tiny]\npath = "a.gguf"\nhf = "o/r:f.gguf"\n', "models.tiny", "path and hf"),
    ('[models.tiny]\nbuiltin = "gpt-5"\n', "models.tiny.builtin", "smollm2-135m-instruct"),
    ('[models.tiny]\nhf = "just-a-name"\n', "models.tiny.hf", "org/repo:file.gguf"),
    ('[models.tiny]\nhf = "org/repo:README.md"\n', "models.tiny.hf", "org/repo:file.gguf"),
    ('[models.tiny]\nhf = "org/repo/extra:f.gguf"\n', "models.tiny.hf", "org/repo:file.gguf"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = 8\n', "models.tiny.n_ctx", "between 16 and 1048576"),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = 2000000\n',
        "models.tiny.n_ctx",
        "between 16 and 1048576",
    ),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nthreads = 0\n', "models.tiny.threads", "between 1"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nthreads = true\n', "models.tiny.threads", "whole number"),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nthreads = "many"\n',
        "models.tiny.threads",
        '"auto" or a whole number',
    ),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nchat_template = "  "\n', "models.tiny.chat_template", "empty"),
    ('default = "nope"\n[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n', "default", "'nope'"),
    ("default = 1\n", "default", "string"),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\ntemperature = 9.0\n',
        "models.tiny.sampling.temperature",
        "between 0 and 5, got 9.0",
    ),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\ntop_p = 0\n',
        "models.tiny.sampling.top_p",
        "above 0",
    ),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\ntop_k = 1.5\n',
        "models.tiny.sampling.top_k",
        "whole number",
    ),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\ntop_k = 2000000\n',
        "models.tiny.sampling.top_k",
        "between 0 and 1000000",
    ),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\nrepeat_last_n = -1\n',
        "models.tiny.sampling.repeat_last_n",
        "between 0 and 100000",
    ),
    (
        '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n[models.tiny.sampling]\nseed = "x"\n',
        "models.tiny.sampling.seed",
        "number",
    ),
    ('[models."bad name"]\nbuiltin = "smollm2-135m-instruct"\n', 'models."bad name"', "model name"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nflash_attn = "fast"\n', "models.tiny.flash_attn", "'fast'"),
    ('[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nflash_attn = 1\n', "models.tiny.flash_attn", "an integer 1"),
    ('[models.tiny]\nurl = "http://127.0.0.1:9/v1"\nflash_attn = true\n', "models.tiny.flash_attn", "on a server"),
]


def config_error(tmp_path, text: str) -> tuple[Path, str]:
    """(the file, its one-line error): models.toml `text` must fail with a fix in it."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert " — " in message  # the fix
    return path, message


@pytest.mark.parametrize(("text", "key", "fragment"), INVALID, ids=[case[1] + ":" + case[2] for case in INVALID])
def test_invalid_file_gives_one_line_error(tmp_path, text, key, fragment):
    path, message = config_error(tmp_path, text)
    assert message.startswith(f"{path}: {key} ")
    assert fragment in message


def test_invalid_toml_reports_line_and_column(tmp_path):
    path = write(tmp_path, '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = = 3\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "invalid TOML" in message and "line 3" in message


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def test_unknown_model_name_lists_known_ones(tmp_path):
    path = write(tmp_path, '[models.tiny]\nbuiltin = "smollm2-135m-instruct"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path).get("huge")
    message = str(info.value)
    assert "'huge'" in message and "tiny" in message and "smollm2-135m-instruct" in message
    assert str(path) in message and "\n" not in message


# --- model files ---------------------------------------------------------------------


def test_corrupt_model_file(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"this is not a model at all")
    path = write(tmp_path, '[models.bad]\npath = "bad.gguf"\n')
    spec = load_config(path).get("bad")
    with pytest.raises(ModelFileError) as info:
        spec.resolve_file()
    message = str(info.value)
    assert "\n" not in message and "not a GGUF file" in message and "'bad'" in message


def test_missing_and_directory_model_paths(tmp_path):
    (tmp_path / "adir.gguf").mkdir()
    path = write(tmp_path, '[models.gone]\npath = "~/surely/not/here.gguf"\n[models.dir]\npath = "adir.gguf"\n')
    config = load_config(path)
    with pytest.raises(ModelFileError, match="does not exist"):
        config.get("gone").resolve_file()
    with pytest.raises(ModelFileError, match="is a directory"):
        config.get("dir").resolve_file()


def test_absolute_path_model(tmp_path):
    gguf = tmp_path / "ok.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 16)
    path = write(tmp_path, f'[models.ok]\npath = "{gguf}"\n')
    assert load_config(path).get("ok").resolve_file() == gguf
    check_gguf(gguf)


def test_hf_spec_parsing():
    assert parse_hf_spec("org/repo:sub/f.gguf") == ("org/repo", "sub/f.gguf")
    for bad in ("org/repo", "repo:f.gguf", "org/repo:", "org/repo:f.bin", ":f.gguf"):
        with pytest.raises(ModelFileError):
            parse_hf_spec(bad)


def _fill_hub_cache(cache: Path, spec: str, target: Path) -> Path:
    """huggingface_hub's own cache layout: refs/main -> snapshots/<commit>/<file>."""
    repo_id, filename = parse_hf_spec(spec)
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    snapshot = repo_dir / "snapshots" / COMMIT / filename
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(target)
    return snapshot


def test_hf_model_from_cache_without_network(tmp_path):
    pytest.importorskip("huggingface_hub")
    snapshot = _fill_hub_cache(tmp_path / "hf-cache", HF_SPEC, builtin_model_path())
    path = write(tmp_path, f'[models.tiny]\nhf = "{HF_SPEC}"\n')
    config = load_config(path)
    assert config.get("tiny").resolve_file(progress=False) == snapshot
    assert hf_download(HF_SPEC) == snapshot
    assert "cached" in format_models_listing(config)


def test_hf_model_not_cached_offline(tmp_path):
    pytest.importorskip("huggingface_hub")
    path = write(tmp_path, '[models.tiny]\nhf = "someorg/Other-GGUF:other.gguf"\n')
    with pytest.raises(ModelFileError) as info:
        load_config(path).get("tiny").resolve_file(progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert "someorg/Other-GGUF:other.gguf" in message and "HF_HUB_OFFLINE" in message


# --- `loopchat models` ---------------------------------------------------------------


def test_listing_of_a_file(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    path = write(
        tmp_path,
        'default = "web"\n'
        '[models.web]\nhf = "someorg/Other-GGUF:other.gguf"\ndescription = "from the hub"\n'
        '[models.gone]\npath = "missing.gguf"\n'
        '[models.bad]\npath = "bad.gguf"\n',
    )
    text = format_models_listing(load_config(path))
    lines = text.splitlines()
    assert str(path) in lines[0]
    by_name = {line.split()[1] if line.lstrip().startswith("*") else line.split()[0]: line for line in lines[2:-2]}
    assert set(by_name) == {"web", "gone", "bad", "smollm2-135m-instruct"}
    assert by_name["web"].lstrip().startswith("* web")
    assert "not downloaded" in by_name["web"] and "from the hub" in by_name["web"]
    assert "file missing" in by_name["gone"]
    assert "not a GGUF file" in by_name["bad"]
    assert "installed" in by_name["smollm2-135m-instruct"]


def test_listing_without_a_file():
    text = format_models_listing(load_config())
    assert "built-in defaults" in text and str(default_config_path().name) in text
    assert "* smollm2-135m-instruct" in text and "installed" in text


def test_unreachable_hub_is_a_fast_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    import socket
    import time

    from loopchat.model_files import ModelFileError, hf_download

    with socket.socket() as s:  # a local port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.monotonic()
    with pytest.raises(ModelFileError) as err:
        hf_download("org/repo:model.gguf", progress=False)
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    assert "\n" not in msg and "could not reach the Hugging Face Hub" in msg and "path = ..." in msg


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{% for m in messages %}{{ m.content }", "(line 1: unexpected '}')"),
        ("{{ messages | no_such_filter }}", "no_such_filter"),
        ("line one\n{% if add_generation_prompt %}", "(line 2: "),
    ],
)
def test_a_chat_template_that_does_not_compile_is_a_config_error(tmp_path, template, fragment):
    text = '[models.x]\nbuiltin = "smollm2-135m-instruct"\nchat_template = """' + template + '"""\n'
    path, message = config_error(tmp_path, text)
    assert message.startswith(f"{path}: models.x.chat_template is not a valid Jinja template (")
    assert fragment in message


def test_a_chat_template_with_the_extensions_llama_cpp_python_allows_is_valid(tmp_path):
    # compiled in llama-cpp-python's own environment: {% generation %} and loop controls
    template = (
        "{% for m in messages %}{% if m.role == 'x' %}{% continue %}{% endif %}"
        "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}"
    )
    path = write(tmp_path, '[models.x]\nbuiltin = "smollm2-135m-instruct"\nchat_template = """' + template + '"""\n')
    assert load_config(path).get("x").chat_template == template


def test_engine_options_from_a_configured_model(tmp_path, monkeypatch):
    from loopchat.engine.options import EngineOptions

    monkeypatch.setenv("LOOPCHAT_LOG_DIR", str(tmp_path / "logs"))
    text = '[models.tiny]\npath = "m.gguf"\nn_ctx = 2048\nthreads = 3\nchat_template = "{{ messages }}"\n'
    spec = load_config(write(tmp_path, text)).get("tiny")
    options = EngineOptions.from_spec(spec, tmp_path / "m.gguf")
    assert options == EngineOptions(
        str(tmp_path / "m.gguf"),
        name="tiny",
        n_ctx=2048,
        threads=3,
        chat_template="{{ messages }}",
        log_path=str(tmp_path / "logs" / "llama.log"),
        verbose=False,
    )
    other = EngineOptions.from_spec(spec, "m.gguf", verbose=True, threads=1, log_path=tmp_path / "x.log")
    assert (other.threads, other.verbose, other.log_path) == (1, True, str(tmp_path / "x.log"))
    # threads: "auto" unless pinned; "auto" from the command line overrides a pinned count
    auto = load_config(write(tmp_path, '[models.a]\npath = "m.gguf"\n[models.b]\npath = "m.gguf"\nthreads = "auto"\n'))
    assert auto.get("a").threads == auto.get("b").threads == "auto"
    assert EngineOptions.from_spec(auto.get("a"), "m.gguf").threads == "auto"
    assert EngineOptions.from_spec(spec, "m.gguf", threads="auto").threads == "auto"


def test_gpu_layers_pass_through_to_llama_cpp(tmp_path, model_path) -> None:
    from loopchat.engine.options import EngineOptions

    path = write(tmp_path, f'[models.g]\npath = "{model_path}"\ngpu_layers = 7\n')
    spec = load_config(path).get("g")
    assert spec.gpu_layers == 7
    options = EngineOptions.from_spec(spec, model_path, log_path=tmp_path / "llama.log")
    assert options.gpu_layers == 7
    engine = options()
    try:  # a CPU-only build ignores the layers, but llama.cpp was asked for them
        assert engine.llm.model_params.n_gpu_layers == 7
    finally:
        engine.close()
    assert load_config(write(tmp_path, '[models.g]\nbuiltin = "smollm2-135m-instruct"\n')).get("g").gpu_layers == 0
    _, message = config_error(tmp_path, '[models.g]\nbuiltin = "smollm2-135m-instruct"\ngpu_layers = -2\n')
    assert "models.g.gpu_layers" in message and "-1" in message


# --- mode: chat or completion (issue 13) -----------------------------------------------


def test_mode_is_parsed_per_model_and_unset_by_default(tmp_path):
    text = (
        '[models.base]\nbuiltin = "smollm2-135m-instruct"\nmode = "completion"\n'
        '[models.talk]\nbuiltin = "smollm2-135m-instruct"\nmode = "chat"\n'
        '[models.plain]\nbuiltin = "smollm2-135m-instruct"\n'
        '[models.far]\nurl = "http://127.0.0.1:9/v1"\nmode = "completion"\n'
    )
    config = load_config(write(tmp_path, text))
    assert config.get("base").mode == "completion"
    assert config.get("talk").mode == "chat"
    assert config.get("plain").mode is None  # chosen by the model's template when it loads
    assert config.get("far").mode == "completion"


@pytest.mark.parametrize("value", ['"raw"', '"Chat"', "1", "true"])
def test_an_unknown_mode_is_a_one_line_config_error_naming_the_entry(tmp_path, value):
    path, message = config_error(tmp_path, f'[models.x]\nbuiltin = "smollm2-135m-instruct"\nmode = {value}\n')
    assert message.startswith(f'{path}: models.x.mode must be "chat" or "completion", got ')
    assert "\n" not in message and 'mode = "completion"' in message


def test_the_opening_mode_follows_mode_then_the_template():
    from loopchat.engine.chat_prompt import opening_mode

    assert opening_mode(None, "gguf") == "chat"
    assert opening_mode(None, "models.toml") == "chat"
    assert opening_mode(None, "fallback") == "completion"  # no template: never silently ChatML
    assert opening_mode("chat", "fallback") == "chat"  # asked for: ChatML, with the template note
    assert opening_mode("completion", "gguf") == "completion"
