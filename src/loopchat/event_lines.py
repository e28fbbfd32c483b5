"""One-line texts of a reply's events: the run's summary and a step's line.

`loopchat run` prints them (stderr, and each step with --show-steps); `loopchat serve` logs a
request's summary with the same words."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loopchat.events import Finish, Prefill, Start, Step


def threads_text(auto: bool, used: Sequence[int]) -> str:
    """The summary's thread counts: the last one, and the range auto went through."""
    if not used:
        return ""
    last, lo, hi = used[-1], min(used), max(used)
    if not auto:
        return f"threads {last}"
    return f"threads {last} auto" + (f" ({lo}–{hi} used)" if lo != hi else "")


NOT_GIVEN = "not given"


def summary_line(
    prefill: Prefill | None, finish: Finish, threads: str = "", server: str = "", client_times: bool = False
) -> str:
    """The run's figures on one line; `server`: the URL of the server that generated it
    (`client_times`: its times were measured here, on arrival). What the server did not
    send is "not given"."""
    prefill_text = "prefill " + (f"{finish.prefill_ms:.0f} ms" if finish.prefill_ms is not None else NOT_GIVEN)
    parts = [
        f"prompt {finish.prompt_tokens} tok" if finish.prompt_tokens is not None else f"prompt tokens {NOT_GIVEN}",
        prefill_text + (f" ({prefill.reused_tokens} reused)" if prefill and prefill.reused_tokens else ""),
    ]
    # a token at least (not a prompt scored, nor one stopped in its prefill): a first token's time, a rate
    drew = bool(finish.completion_tokens or finish.steps)
    if drew:
        parts.append(f"TTFT {finish.ttft_ms:.0f} ms" if finish.ttft_ms is not None else f"TTFT {NOT_GIVEN}")
    parts.append(
        f"{finish.completion_tokens} tok" if finish.completion_tokens is not None else f"reply tokens {NOT_GIVEN}"
    )
    if drew:
        parts.append(f"{finish.tokens_per_s:.1f} tok/s" if finish.tokens_per_s is not None else f"tok/s {NOT_GIVEN}")
    parts += [f"total {finish.total_ms / 1000:.2f} s", f"finish: {finish.reason.value}"]
    if threads:
        parts.insert(-2, threads)
    if server:
        measured = " (TTFT and tok/s at the client)" if client_times else ""
        parts.append(f"server {server}{measured}")
    line = " · ".join(parts)
    if finish.error:
        line += f" ({finish.error})"
    return line


def step_line(step: Step) -> str:
    if step.sampled_top is None:  # a remote server's logprobs: no sampled-from distribution
        return _server_step_line(step)
    others = [c for c in step.sampled_top if c.token_id != step.token_id][:3]
    alts = ", ".join(f"{c.text!r} {c.prob:.2f}" for c in others) or "(no alternatives)"
    fwd = f"{step.forward_ms:.1f} ms" if step.forward_ms is not None else f"forward {NOT_GIVEN}"
    line = (
        f"{step.index:>4}  {step.piece!r:<16} p={step.sampled_prob:.3f} (raw {step.raw_prob:.3f}) "
        f"rank {step.sampled_rank}/{step.raw_rank}  | {alts}  | {fwd}"
        + (f", {step.threads} thr" if step.threads else "")
    )
    if step.arrival_ms is not None:
        line += f", arrived +{step.arrival_ms:.1f} ms"
    return line


def _server_step_line(step: Step) -> str:
    """A step of a server that sends its top logprobs, not the distribution it sampled from."""
    others = [c for c in step.raw_top if not (c.text == step.piece and c.prob == step.raw_prob)][:3]
    alts = ", ".join(f"{c.text!r} {c.prob:.2f}" for c in others) or "(no alternatives)"
    if step.raw_prob is None:
        p = f"p {NOT_GIVEN} (no logprobs)"
    else:
        rank = f"rank {step.raw_rank}" if step.raw_rank is not None else f"not in top {len(step.raw_top)}"
        p = f"p={NOT_GIVEN} (server logprob p {step.raw_prob:.3f}, {rank})"
    gap = f"arrived +{step.arrival_ms:.1f} ms" if step.arrival_ms is not None else f"arrival {NOT_GIVEN}"
    return f"{step.index:>4}  {step.piece!r:<16} {p}  | {alts}  | {gap} (forward {NOT_GIVEN})"


def prefix_text(start: Start | None, steps: Iterable[Step]) -> str:
    """A branch's text before its run: that of its steps within `start.reply_prefix` (a
    run's Finish holds its own text only). '' for a reply from its start."""
    n = len(start.reply_prefix) if start is not None else 0
    return "".join(s.text for s in steps if s.index < n and not s.is_stop) if n else ""
