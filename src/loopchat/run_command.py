"""`loopchat run`: one reply, headless, from the same events the TUI shows.

The engine runs on its own worker thread (which loads the model and runs every call on
it); the main thread prints what arrives, so Ctrl+C is handled at once and cancels the
run, during a long prefill too.
"""

from __future__ import annotations

import argparse
import queue
import sys
from typing import Any, TextIO

from .events import ContextTrimmed, Finish, Message, Prefill, Start, Step

_ENGINE_EVENTS = (Start, ContextTrimmed, Prefill, Step, Finish)
from .settings import LiveSettings, SamplingSettings

_SETTING_FLAGS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
    "seed": "seed",
    "max_tokens": "max_tokens",
}


def read_prompt(prompt: str, stdin: TextIO) -> str:
    from .cli import UsageError

    if prompt == "-":
        if stdin is None or stdin.closed:
            raise UsageError("the prompt is - but there is no standard input; pipe the prompt in or pass it as text")
        prompt = stdin.read()
    if not prompt.strip():
        raise UsageError("the prompt is empty: pass the message as text, or - to read it from stdin")
    return prompt


def settings_from_args(base: SamplingSettings, args: argparse.Namespace) -> SamplingSettings:
    changes = {field: getattr(args, flag) for flag, field in _SETTING_FLAGS.items() if getattr(args, flag, None) is not None}
    return base.replace(**changes)


def summary_line(prefill: Prefill | None, finish: Finish) -> str:
    parts = [
        f"prompt {finish.prompt_tokens} tok",
        f"prefill {finish.prefill_ms:.0f} ms" + (f" ({prefill.reused_tokens} reused)" if prefill and prefill.reused_tokens else ""),
        f"TTFT {finish.ttft_ms:.0f} ms",
        f"{finish.completion_tokens} tok",
        f"{finish.tokens_per_s:.1f} tok/s",
        f"total {finish.total_ms / 1000:.2f} s",
        f"finish: {finish.reason.value}",
    ]
    line = " · ".join(parts)
    if finish.error:
        line += f" ({finish.error})"
    return line


def step_line(step: Step) -> str:
    others = [c for c in step.sampled_top if c.token_id != step.token_id][:3]
    alts = ", ".join(f"{c.text!r} {c.prob:.2f}" for c in others) or "(no alternatives)"
    return (
        f"{step.index:>4}  {step.piece!r:<16} p={step.sampled_prob:.3f} (raw {step.raw_prob:.3f}) "
        f"rank {step.sampled_rank}/{step.raw_rank}  | {alts}  | {step.forward_ms:.1f} ms"
    )


def run_command(args: argparse.Namespace, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    from .config import load_config
    from .engine import EngineOptions
    from .paths import llama_log_path
    from .trace import TraceWriter
    from .worker import EngineWorker, ModelReady, RunDone, WorkerError

    out = out or sys.stdout
    prompt = read_prompt(args.prompt, stdin if stdin is not None else sys.stdin)
    config = load_config(getattr(args, "config", None))
    spec = config.get(getattr(args, "model", None))
    settings = settings_from_args(spec.sampling, args)
    if args.top_report < 1 or args.top_report > 100:
        from .cli import UsageError

        raise UsageError("--top-report must be between 1 and 100")
    model_path = spec.resolve_file()
    system = args.system if args.system is not None else spec.system_prompt
    messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
    trace = TraceWriter(args.trace) if args.trace else None

    events: queue.Queue[Any] = queue.Queue()
    worker = EngineWorker(events.put)
    options = EngineOptions(
        str(model_path),
        name=spec.name,
        n_ctx=spec.n_ctx,
        threads=spec.threads,
        chat_template=spec.chat_template,
        log_path=str(llama_log_path()),
        verbose=bool(getattr(args, "verbose", False)),
    )
    worker.load(options, spec.name, model_path)
    live = LiveSettings(settings)
    prefill: Prefill | None = None
    finish: Finish | None = None
    error: str | None = None
    interrupted = False
    try:
        generating = False
        while True:
            try:
                event = events.get(timeout=0.25)
            except queue.Empty:
                continue
            if isinstance(event, ModelReady):
                worker.generate(messages, live, report_k=args.top_report)
                generating = True
            elif isinstance(event, WorkerError):
                error = event.message
                if not generating or event.during == "generate":
                    break
            elif isinstance(event, RunDone):
                break
            elif isinstance(event, _ENGINE_EVENTS):
                if trace is not None:
                    trace.write(event)
                if isinstance(event, Prefill):
                    prefill = event
                elif isinstance(event, Step):
                    if args.show_steps:
                        print(step_line(event), file=out, flush=True)
                    elif event.text and not args.blocking:  # blocking: the whole text at the end
                        out.write(event.text)
                        out.flush()
                elif isinstance(event, Finish):
                    finish = event
    except KeyboardInterrupt:
        interrupted = True
        worker.cancel()
        # drain until the run reports its end (cancel stops it within one step)
        while True:
            try:
                event = events.get(timeout=5)
            except queue.Empty:
                break
            if trace is not None and isinstance(event, _ENGINE_EVENTS):
                trace.write(event)
            if isinstance(event, Finish):
                finish = event
            if isinstance(event, (RunDone, WorkerError)):
                break
    finally:
        worker.close()
        if trace is not None:
            trace.close()

    if finish is not None:
        if args.show_steps or args.blocking:
            out.write(finish.text)
        if not finish.text.endswith("\n"):
            out.write("\n")
        out.flush()
        print(summary_line(prefill, finish), file=sys.stderr)
    if error is not None:
        print(f"loopchat: {error}", file=sys.stderr)
        return 2
    if interrupted:
        print("loopchat: interrupted (Ctrl+C): the reply above is partial", file=sys.stderr)
        return 130
    if finish is not None and finish.error:
        print(f"loopchat: {finish.error}", file=sys.stderr)
        return 1
    return 0
