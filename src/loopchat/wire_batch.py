"""N choices on the wire (OpenAI's `n`): the N replies of one batch (batch.py) as one response.

`BatchSerializer` has `WireSerializer`'s interface (`feed`, `lines`, `body`, `done`, `error`) and
one WireSerializer per choice: an event of sequence j (its Start, Steps, Finish) goes to choice
j's, whose chunks then carry `"index": j`; an event every reply shares (the batch's Prefill, a
ContextTrimmed) goes to each. So every choice's chunks carry its own logprobs and its own
`loopchat` extension records, exactly as a reply alone's. With `stream_options.include_usage`
one usage chunk comes after the last choice's finish: the prompt once, the choices' tokens
summed (OpenAI's usage for n > 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from loopchat.event_json import to_json_dict
from loopchat.events import Event, Finish
from loopchat.wire import EXTENSION_KEY, WireOptions, WireSerializer, sse_line


class BatchSerializer:
    """The chunks (or the body) of one response with `n` choices."""

    def __init__(self, model: str, options: WireOptions, n: int) -> None:
        self.options = options
        self.n = n
        first = WireSerializer(model, dataclasses.replace(options, include_usage=False))
        self.id, self.created = first.id, first.created
        self.choices = [first] + [
            WireSerializer(model, first.options, id=first.id, created=first.created) for _ in range(n - 1)
        ]
        self.error: str | None = None
        self._finishes: dict[int, Finish] = {}
        self._events: list[dict[str, Any]] = []  # every event in order, for the body's extension

    @property
    def done(self) -> bool:
        return len(self._finishes) == self.n

    def lines(self, event: Event) -> list[str]:
        return [sse_line(c) for c in self.feed(event)]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        seq = getattr(event, "sequence", None)
        if self.options.extension and not self.options.stream:
            self._events.append(to_json_dict(event))
        targets = range(self.n) if seq is None else (seq,)
        out: list[dict[str, Any]] = []
        for j in targets:
            for chunk in self.choices[j].feed(event):
                for choice in chunk.get("choices", ()):
                    choice["index"] = j
                out.append(chunk)
        if isinstance(event, Finish) and seq is not None:
            self._finishes[seq] = event
            self.error = self.error or self.choices[seq].error
            if self.done and self.options.include_usage and self.options.stream:
                out.append(self._usage_chunk())
        return out

    def _usage(self) -> dict[str, Any]:
        usages = [s._usage(self._finishes[j]) for j, s in enumerate(self.choices)]
        prompt = usages[0]["prompt_tokens"]
        completions = [u["completion_tokens"] for u in usages]
        completion = None if None in completions else sum(completions)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion if prompt is not None and completion is not None else None,
            "prompt_tokens_details": usages[0]["prompt_tokens_details"],
        }

    def _usage_chunk(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.options.chat else "text_completion",
            "created": self.created,
            "model": self.choices[0].model,
        }
        if self.options.chat:
            obj["system_fingerprint"] = None
        obj["choices"] = []
        obj["usage"] = self._usage()
        return obj

    def body(self) -> dict[str, Any]:
        """The non-streaming response: every choice, the usage summed, every event in the extension."""
        bodies = [s.body() for s in self.choices]
        failed = next((b for b in bodies if "error" in b), None)
        if failed is not None:
            return failed
        obj = bodies[0]
        obj["choices"] = [dict(b["choices"][0], index=j) for j, b in enumerate(bodies)]
        obj["usage"] = self._usage()
        if self.options.extension:
            obj[EXTENSION_KEY] = {"events": self._events}
        return obj


def serializer_for(model: str, options: WireOptions, n: int) -> WireSerializer | BatchSerializer:
    """The serializer of a response with `n` choices."""
    return WireSerializer(model, options) if n == 1 else BatchSerializer(model, options, n)


__all__ = ["BatchSerializer", "serializer_for"]
