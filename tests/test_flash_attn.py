"""Flash attention (issue 25, item 0): the setting reaches llama.cpp's context (llama.cpp's
own log says what it was asked), the Start event records what llama.cpp resolved, a bad
value is one line, and with flash attention on the probabilities a step reports are those
of a fresh evaluation with the same setting (what the truth checks recompute)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from loopchat.engine.engine import Engine
from loopchat.engine.flash_attn import resolved_from_log
from loopchat.events import Message, Start, Step
from loopchat.flash_attn_setting import DEFAULT_FLASH_ATTN, FlashAttn, parse_flash_attn
from loopchat.settings import SamplingSettings

# what llama.cpp 0.3.36's context creation logs (llama-context.cpp), cut to the lines read
AUTO_ON = "llama_context: flash_attn            = auto\n...\nresolve_fused_ops: Flash Attention enabled\n"
AUTO_OFF = (
    "llama_context: flash_attn            = auto\nresolve_fused_ops: Flash Attention not supported, set to disabled\n"
)


def test_the_setting_parses_from_the_command_line_and_models_toml() -> None:
    assert [parse_flash_attn(v) for v in ("auto", "on", "off", " ON ", True, False, "true")] == [
        "auto",
        "on",
        "off",
        "on",
        "on",
        "off",
        "on",
    ]
    for bad in ("yes", 1, None, ""):
        with pytest.raises(ValueError, match='must be "auto", on'):
            parse_flash_attn(bad)
    assert parse_flash_attn(DEFAULT_FLASH_ATTN) == DEFAULT_FLASH_ATTN


def test_the_resolved_value_is_read_from_llama_cpps_log() -> None:
    assert resolved_from_log(AUTO_ON) == "on"
    assert resolved_from_log(AUTO_OFF) == "off"
    assert resolved_from_log("llama_context: flash_attn            = enabled\n") == "on"
    assert resolved_from_log("llama_context: flash_attn            = disabled\n") == "off"
    # never guessed: a log that does not say gives None
    assert resolved_from_log("llama_context: flash_attn            = auto\n") is None
    assert resolved_from_log("") is None
    # the line read is the one after this context's own "flash_attn =" line
    assert resolved_from_log(AUTO_ON.replace("enabled", "x") + AUTO_OFF) == "off"


def test_a_bad_value_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    for args in (["run", "--flash-attn", "fast", "Hi"], ["--flash-attn", "2"], ["serve", "--flash-attn", "yes"]):
        proc = subprocess.run([sys.executable, "-m", "loopchat", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "--flash-attn" in lines[0] and 'must be "auto", on (true) or off (false)' in lines[0], lines[0]
    proc = subprocess.run(
        [sys.executable, "-m", "loopchat", "run", "--url", "http://127.0.0.1:9/v1", "--flash-attn", "on", "Hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "loopchat: --flash-attn has no meaning for a model on a server: the server chooses it"
    ), proc.stderr


def _asked(log: Path) -> str:
    """The value llama.cpp read from the context params of the last context created."""
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("llama_context: flash_attn ")]
    return lines[-1].split("=")[-1].strip()


def _fa_engine(model_path: Path, factory: pytest.TempPathFactory, setting: FlashAttn) -> Iterator[tuple[Engine, Path]]:
    """An engine of its own with flash attention `setting`, and its llama.cpp log."""
    log = factory.mktemp("log") / "llama.log"
    eng = Engine(model_path, n_ctx=512, threads=1, log_path=log, flash_attn=setting)
    yield eng, log
    eng.close()


@pytest.fixture(scope="module")
def fa_off(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Path]]:
    yield from _fa_engine(model_path, tmp_path_factory, "off")


@pytest.fixture(scope="module")
def fa_on(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Path]]:
    yield from _fa_engine(model_path, tmp_path_factory, "on")


def _start(engine: Engine) -> Start:
    settings = SamplingSettings(max_tokens=1, seed=1)
    return next(e for e in engine.generate([Message("user", "Hi")], settings) if isinstance(e, Start))


@pytest.mark.model
def test_the_setting_reaches_the_context_and_the_start_event_records_the_resolved_value(
    fa_off: tuple[Engine, Path], fa_on: tuple[Engine, Path], model_path: Path, tmp_path: Path
) -> None:
    (off, off_log), (on, on_log) = fa_off, fa_on
    # llama.cpp's own reading of the params, what the engine says, what the Start event records
    assert _asked(off_log) == "disabled" and off.flash_attn == "off" and _start(off).flash_attn == "off"
    assert _asked(on_log) == "enabled" and on.flash_attn == "on" and _start(on).flash_attn == "on"
    log = tmp_path / "auto.log"
    with Engine(model_path, n_ctx=256, threads=1, log_path=log, flash_attn="auto", warmup=False) as eng:
        assert _asked(log) == "auto"
        # llama.cpp resolved it (on, on the CPU) and said so; the Start event has it
        assert eng.flash_attn == "on" and _start(eng).flash_attn == "on"
        # the lens's context copies the engine's: the resolved value, not "auto"
        assert eng.llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert off.llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def _softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def _fresh_probs(model_path: Path, flash_attn: bool, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """A separate context (llama-cpp-python's own Llama, C API logits): the prompt in one
    batch, then each token alone, as the loop feeds them; the softmax before each draw."""
    ref = llama_cpp.Llama(str(model_path), n_ctx=512, n_threads=1, flash_attn=flash_attn, verbose=False)
    try:
        out = []
        ref.eval(prompt)
        for t in [None, *tokens]:
            if t is not None:
                ref.eval([t])
            ptr = llama_cpp.llama_get_logits_ith(ref.ctx, -1)
            out.append(_softmax64(np.ctypeslib.as_array(ptr, shape=(ref.n_vocab(),)).copy()))
        return out
    finally:
        ref.close()


@pytest.mark.model
def test_with_flash_attention_on_the_raw_probabilities_are_a_fresh_evaluations(
    fa_on: tuple[Engine, Path], model_path: Path
) -> None:
    engine = fa_on[0]
    settings = SamplingSettings(temperature=0.8, top_k=20, seed=11, max_tokens=8)
    events = list(engine.generate([Message("user", "Name a colour.")], settings, reuse_at_most=0))
    start = next(e for e in events if isinstance(e, Start))
    steps = [e for e in events if isinstance(e, Step)]
    assert start.flash_attn == "on" and len(steps) >= 4
    drawn = [s.token_id for s in steps[:-1]]
    fresh = _fresh_probs(model_path, True, list(start.prompt_token_ids), drawn)
    for step, p in zip(steps, fresh, strict=True):
        assert step.raw_prob == pytest.approx(p[step.token_id], abs=1e-5)
        assert [c.prob for c in step.raw_top] == pytest.approx(p[[c.token_id for c in step.raw_top]], abs=1e-5)
    # the check can fail: the same tokens through a context with flash attention off give
    # other numbers (the reason a reference must use the engine's setting)
    off = _fresh_probs(model_path, False, list(start.prompt_token_ids), drawn)
    worst = max(abs(s.raw_prob - float(p[s.token_id])) for s, p in zip(steps, off, strict=False))
    assert worst > 1e-5, worst


def test_models_toml_and_the_command_line_choose_it_per_model(tmp_path: Path, model_path: Path) -> None:
    from loopchat.config import load_config
    from loopchat.engine.flash_attn import model_default
    from loopchat.engine.options import EngineOptions

    path = tmp_path / "models.toml"
    path.write_text(
        '[models.a]\nbuiltin = "smollm2-135m-instruct"\n[models.b]\nbuiltin = "smollm2-135m-instruct"\n'
        'flash_attn = true\n[models.c]\npath = "m.gguf"\n[models.d]\npath = "m.gguf"\nflash_attn = "auto"\n'
    )
    config = load_config(path)
    assert [config.get(n).flash_attn for n in "abcd"] == [None, "on", None, "auto"]  # None: not set
    log = tmp_path / "x.log"
    assert EngineOptions.from_spec(config.get("a"), model_path, log_path=log).flash_attn is None
    assert EngineOptions.from_spec(config.get("b"), model_path, log_path=log, flash_attn="off").flash_attn == "off"
    # not set: the model's measured choice (docs/performance.md): the bundled SmolLM2 off, others auto
    assert model_default(model_path) == "off" and model_default(tmp_path / "gemma-3-270m-q4_k_m.gguf") == "auto"


def test_the_settings_are_llama_cpp_s_enum() -> None:
    import llama_cpp

    from loopchat.engine.flash_attn import FLASH_ATTN_TYPES

    assert FLASH_ATTN_TYPES == {
        "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
        "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    }
