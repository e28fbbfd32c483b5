"""`loopchat run -n N` (issue 25, item 2): N replies in one batch, labelled, with the batch's
figures; a bad N, or an option a batch cannot take, is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import assert_one_line_error, loopchat

from loopchat.events import Finish, Start, Step
from loopchat.trace import read_trace

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_run_n_prints_each_reply_labelled_and_the_batch_figures(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    proc = loopchat(
        *("run", "Name a colour.", "-n", "3", "--temperature", "0", "--max-tokens", "12"),
        *("--threads", "1", "--flash-attn", "on", "--trace", str(trace)),
    )
    assert proc.returncode == 0, proc.stderr
    labels = [line for line in proc.stdout.splitlines() if line.startswith("── reply ")]
    assert [lab.split(" · ")[0] for lab in labels] == [f"── reply {j} of 3" for j in (1, 2, 3)]
    texts = [part.strip() for part in proc.stdout.split("──\n")[1:]]
    texts = [t.split("\n── reply")[0] for t in texts]
    assert len(texts) == 3 and texts[0] and texts.count(texts[0]) == 3  # temperature 0, flash attention on: exact
    summary = proc.stderr.strip().splitlines()[-1]
    assert summary.startswith("loopchat: 3 replies · ") and "tok/s together" in summary
    assert "a pass of 3: " in summary and "one sequence: " in summary, summary
    header, traced = read_trace(trace)
    assert not header.get("cut_short") and not any(t.synthetic for t in traced)
    events = [t.event for t in traced]
    starts = [e for e in events if isinstance(e, Start)]
    finishes = [e for e in events if isinstance(e, Finish)]
    assert sorted(s.sequence for s in starts) == [0, 1, 2] and sorted(f.sequence for f in finishes) == [0, 1, 2]
    steps = [e for e in events if isinstance(e, Step)]
    assert all(s.batch is not None for s in steps if s.index > 0)
    assert [f.text.strip() for f in sorted(finishes, key=lambda f: f.sequence)] == texts


@pytest.mark.parametrize(
    "args, needles",
    [
        (("-n", "0"), ("-n", "from 1 to 16")),
        (("-n", "17"), ("-n", "from 1 to 16")),
        (("-n", "two"), ("-n", "'two'")),
        (("-n", "2", "--lens"), ("-n 2", "--lens")),
        (("-n", "2", "--blocking"), ("-n 2", "--blocking")),
        (("-n", "2", "--draft", "lookup"), ("-n 2", "--draft lookup", "draft nothing")),
        (("-n", "2", "--url", "http://127.0.0.1:9"), ("-n 2", "--url")),
        (("-n", "8", "--max-tokens", "600"), ("8 replies of up to 600 tokens", "n at most", "max_tokens at most")),
    ],
)
def test_a_bad_n_is_one_line_and_exit_2(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    threads = () if "--url" in args else ("--threads", "1")
    assert_one_line_error(loopchat("run", "hi", *threads, *args), *needles)


def test_run_n_under_a_constraint_gives_each_reply_its_constraint_line_and_cut_note(tmp_path: Path) -> None:
    """Each reply of the batch says what the constraint did to it, as one reply's summary does, and
    whether it was cut before its structure closed: a grammar that ends after one word closes every
    reply; any JSON object in 3 tokens closes none."""
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    closed = loopchat(*("run", "Answer yes or no.", "-n", "2", "--threads", "1", "--grammar", str(grammar)))
    assert closed.returncode == 0, closed.stderr
    for j in (1, 2):
        line = next(x for x in closed.stderr.splitlines() if x.startswith(f"loopchat: reply {j} of 2: constraint "))
        assert (
            line.startswith(f"loopchat: reply {j} of 2: constraint grammar {grammar.name}: ")
            and " passes forced" in line
        )
    assert "cut before its structure closed" not in closed.stderr
    cut = loopchat(*("run", "Describe Paris as JSON.", "-n", "2", "--threads", "1", "--json", "--max-tokens", "3"))
    assert cut.returncode == 0, cut.stderr
    for j in (1, 2):
        assert f"loopchat: reply {j} of 2: constraint any JSON object: " in cut.stderr
        assert f"loopchat: note: reply {j} of 2: the reply was cut before its structure closed" in cut.stderr


def test_run_n_show_steps_prints_each_steps_stages_and_tokens_on_watch_under_its_reply() -> None:
    """--show-steps in a batch prints what it prints for one reply (--show-stages' waterfall, --watch's
    line), every line tagged with its reply."""
    proc = loopchat(
        *("run", "Name a colour.", "-n", "2", "--threads", "1", "--max-tokens", "2", "--seed", "3"),
        *("--show-steps", "--show-stages", "--watch", " blue"),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for j in (1, 2):
        mine = [x for x in lines if x.startswith(f"[{j}] ")]
        assert sum(1 for x in mine if x.startswith(f"[{j}]   watch ' blue' ")) == 2, mine
        assert sum(1 for x in mine if "Sampler, stage by stage" in x) == 2, mine
