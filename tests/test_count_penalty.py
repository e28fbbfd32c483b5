"""OpenAI's frequency and presence penalties (`frequency_penalty`, `presence_penalty`): a
stage of the sampler after the repeat penalty, as llama.cpp's penalties sampler applies
them (docs/trace-format.md, "Sampler stages"). Its logits equal llama.cpp's own sampler's
bit for bit; its report equals the waterfall reference (test_waterfall.py's grid has it too);
every way in takes them (the settings, `run`'s flags, `serve`'s request, the remote wire)."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from loopchat.engine import sampler
from loopchat.engine.sampler_math import top_indices
from loopchat.engine.sampler_stages import chain_for
from loopchat.settings import SamplingSettings, SettingsError, wire_values

OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}


def _llama_penalized(logits: np.ndarray, window: list[int], last_n: int, repeat: float, freq: float, pres: float):
    """llama.cpp's penalties sampler (llama_sampler_init_penalties) on these logits, the window's
    tokens accepted first: the logits it leaves, by token id."""
    n = logits.shape[0]
    smpl = llama_cpp.llama_sampler_init_penalties(n, last_n, repeat, freq, pres)
    try:
        for t in window:
            llama_cpp.llama_sampler_accept(smpl, t)
        data = (llama_cpp.llama_token_data * n)()
        view = np.ctypeslib.as_array(data)
        view["id"], view["logit"] = np.arange(n), logits
        arr = llama_cpp.llama_token_data_array(data, n, -1, False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
        after = np.ctypeslib.as_array(arr.data, shape=(arr.size,))
        out = np.empty(n, dtype=np.float32)
        out[after["id"]] = after["logit"]
        return out
    finally:
        llama_cpp.llama_sampler_free(smpl)


@pytest.mark.parametrize(
    ("repeat", "freq", "pres", "last_n"),
    [(1.0, 0.5, 0.0, 64), (1.0, 0.0, 0.6, 64), (1.3, 0.7, 0.4, 64), (1.1, -0.8, 1.9, 8), (1.0, 2.0, -2.0, 1000)],
)
def test_the_logits_equal_llama_cpp_s_penalties_sampler_bit_for_bit(repeat, freq, pres, last_n) -> None:
    rng = np.random.default_rng(7)
    n = 5000
    logits = (rng.standard_normal(n) * 3.0).astype(np.float32)
    window = [int(t) for t in rng.choice(40, 120)] + [7, 7, 7, 7, 11]  # counts from 1 to ~10
    s = SamplingSettings(**{**OFF, "repeat_penalty": repeat, "repeat_last_n": last_n}).replace(
        frequency_penalty=freq, presence_penalty=pres
    )
    chain = chain_for(s)
    names = [st.name for st in chain]
    assert names[:3] == ["repeat_penalty", "frequency_presence", "dry"]
    c = sampler.Candidates(logits, window, float(logits.max()), 1.0, top_indices(logits, 10), 10)
    for stage in chain[:3]:
        stage.apply(c)
    want = _llama_penalized(logits, window, last_n, repeat, freq, pres)
    assert np.array_equal(c.work, want), np.flatnonzero(c.work != want)[:10]
    changed = np.flatnonzero(want != logits)
    assert set(changed) <= set(window[-last_n:]) and len(changed) > 0


def test_the_stage_is_in_the_chain_only_when_set_and_reports_what_it_moved() -> None:
    logits = np.random.default_rng(3).standard_normal(4000).astype(np.float32)
    top = int(np.argmax(logits))
    recent = [top] * 5 + [1, 2]
    plain = sampler.sample(logits, recent, SamplingSettings(**OFF), sampler.make_rng(0))
    assert "frequency_presence" not in [r.stage for r in plain.stages]  # a chain without it is as before
    s = SamplingSettings(**OFF).replace(frequency_penalty=2.0, top_k=1)
    res = sampler.sample(logits, recent, s, sampler.make_rng(0))
    row = next(r for r in res.stages if r.stage == "frequency_presence")
    assert (row.removed, row.changed) == (0, 3) and row.moved_mass > 0
    # the top token, said 5 times, lost 10 from its logit: top-k 1 now keeps another
    assert res.token_id != top
    # no repeat_last_n: nothing counted (llama.cpp's penalty_last_n 0 turns its penalties off)
    none = sampler.sample(logits, recent, s.replace(repeat_last_n=0), sampler.make_rng(0))
    assert next(r for r in none.stages if r.stage == "frequency_presence").changed == 0
    assert none.token_id == top


def test_the_settings_take_openai_s_range_and_go_on_the_wire() -> None:
    s = SamplingSettings().replace(frequency_penalty=0.5, presence_penalty=-0.6)
    assert (s.frequency_penalty, s.presence_penalty) == (0.5, -0.6)
    with pytest.raises(SettingsError, match="presence_penalty"):
        s.replace(presence_penalty=2.5)
    wire = wire_values(s, extensions=False)  # OpenAI's own parameters: sent to any server
    assert (wire["frequency_penalty"], wire["presence_penalty"]) == (0.5, -0.6)
    assert "frequency_penalty" not in wire_values(SamplingSettings(), extensions=False)
    # a trace without them is as before; one with them reads back
    assert "frequency_penalty" not in SamplingSettings().to_dict()
    assert SamplingSettings.from_dict(s.to_dict()) == s
