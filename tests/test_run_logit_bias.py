"""`loopchat run --logit-bias TEXT=BIAS` (the text's first token with the model's tokenizer,
repeatable) and `--show-stages` (the waterfall under each step), issue 24."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopchat.cli import main as cli
from loopchat.events import Step
from loopchat.trace import read_trace

PROMPT = "Name the capital of France."


@pytest.mark.model
def test_run_bans_and_boosts_texts_and_shows_the_waterfall(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--threads", "1", "--max-tokens", "4", "--temperature", "0"]
    assert cli.main([*argv, PROMPT]) == 0
    assert capsys.readouterr().out.startswith("The capital")  # greedy, without a bias
    trace = tmp_path / "t.jsonl"
    biased = [*argv, "--logit-bias", "The=-100", "--logit-bias", " Paris=12", "--show-stages", "--trace", str(trace)]
    assert cli.main([*biased, PROMPT]) == 0
    out = capsys.readouterr().out
    steps = [t.event for t in read_trace(trace)[1] if isinstance(t.event, Step)]
    assert sorted(b for _, b in steps[0].settings.logit_bias) == [-100.0, 12.0]
    banned = next(t for t, b in steps[0].settings.logit_bias if b < 0)
    assert steps[0].piece == " Paris" and banned not in [s.token_id for s in steps]
    assert out.splitlines()[-1].startswith(" Paris")  # the reply's text, after the steps' lines
    for step in steps:
        bias = next(r for r in step.stages if r.stage == "logit_bias")
        assert bias.changed == 2 and bias.moved_mass > 0
    assert out.count("Sampler, stage by stage") == len(steps)
    assert "bias 2 tok    changed 2 logits · moved" in out and "greedy T 0" in out


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("Paris", "--logit-bias 'Paris': write TEXT=BIAS"),
        (" Paris=lots", "'lots' is not a number"),
        (" Paris=500", "the bias must be between -100 and 100"),
    ],
)
def test_a_bad_logit_bias_is_one_line(value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--logit-bias", value, PROMPT]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("loopchat: ") and says in err and "\n" not in err, err
