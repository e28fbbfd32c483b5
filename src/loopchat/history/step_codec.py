"""A batch of Steps as one compact blob, and back: the values the events hold, exactly.

A blob is one marker byte then msgpack (b"m") or zlib of msgpack (b"z", used when it
is smaller) of `[format, settings, rows]` (format 0: `[0, field names, settings, rows]`):

- `rows`: one list per step with the step's fields in the order of FIELDS[format]
  (no names, no `kind`); a top-K list is flattened to [id, text, prob, id, text, prob, ...]
  (a candidate whose bytes are a piece of a character: its bytes in text's place, the
  text being their decoding);
  `piece_bytes` stays bytes;
- `settings`: the distinct SamplingSettings of the batch (as dicts); a row holds the
  index of its step's. They change rarely, so a batch usually holds one.

Floats are msgpack's float64: what the events hold, bit for bit (a probability is a
Python float computed from float32 logits; keeping it as float32 would change the
value `load` gives back). A Step field added later gets a new format number with its
own field list (until then format 0 names the fields in each blob); an older blob's
rows lack the field and its default fills in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import msgpack

from loopchat.batch import batch_pass
from loopchat.constraint import ConstraintReport
from loopchat.events import Candidate, LensRow, Step
from loopchat.passes import RejectedDraft, pass_report
from loopchat.settings import SamplingSettings
from loopchat.stage_report import stage_reports
from loopchat.watch import WatchedToken

#: The Step fields each format stores, in row order.
FIELDS: dict[int, tuple[str, ...]] = {
    1: (
        "index",
        "token_id",
        "piece",
        "text",
        "is_stop",
        "raw_top",
        "sampled_top",
        "raw_prob",
        "raw_rank",
        "sampled_prob",
        "sampled_rank",
        "raw_entropy",
        "sampled_entropy",
        "candidates_kept",
        "forward_ms",
        "forward_tokens",
        "sample_ms",
        "settings",
        "settings_changed",
        "n_past",
        "elapsed_ms",
        "threads",
        "threads_reason",
        "piece_bytes",
        "arrival_ms",
    ),
}
FIELDS[2] = FIELDS[1] + ("chosen_by",)  # step mode (issue 13): sampled / step / hand
# issue 22: the reply repeating itself ((start, period) or None); auto threads: a probe's
# pass cut; a candidate that is a piece of a character stores its bytes in its text's slot
FIELDS[3] = FIELDS[2] + ("repeat", "probe_cut_ms")
FIELDS[4] = FIELDS[3] + ("lens",)  # issue 26: the logit lens of the pass (None: not asked for)
FIELDS[5] = FIELDS[4] + ("stages",)  # issue 24: each sampler stage's report (the waterfall)
FIELDS[6] = FIELDS[5] + ("watched",)  # issue 24: the tokens on watch (None: none asked for)
FIELDS[7] = FIELDS[6] + ("constraint",)  # issue 24: what a grammar or schema did at the pass (None: none)
FIELDS[8] = FIELDS[7] + ("pass_report", "drafted", "rejected")  # issue 25: speculative decoding (passes.py)
FIELDS[9] = FIELDS[8] + ("sequence", "batch")  # issue 25: one of N replies in one batch (batch.py)
_TOPS = ("raw_top", "sampled_top")
#: The fields a Step has in this version of loopchat, in order.
CURRENT_FIELDS = tuple(f.name for f in fields(Step) if f.name != "kind")
#: The format written: the numbered one that lists exactly the Step's fields, else 0: a
#: blob that carries its field names (a field added to Step is then kept all the same,
#: at some bytes per batch, until a format number is added for it).
FORMAT = next((n for n, names in FIELDS.items() if names == CURRENT_FIELDS), 0)


class StepCodecError(ValueError):
    """A blob that is not a step batch this code can read."""


def _default(value: Any) -> Any:
    """numpy scalars (an engine may hand them over) as the Python numbers they are."""
    item = getattr(value, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"cannot store a {type(value).__name__} in a step record")


def _flat(cands: tuple[Candidate, ...] | None) -> list[Any] | None:
    if cands is None:
        return None
    out: list[Any] = []
    for c in cands:
        out += (c.token_id, c.text if c.piece_bytes is None else c.piece_bytes, c.prob)
    return out


def _cands(flat: list[Any] | None) -> tuple[Candidate, ...] | None:
    if flat is None:
        return None
    out = []
    for i in range(0, len(flat), 3):
        text = flat[i + 1]
        if isinstance(text, bytes):  # a piece of a character: its bytes
            out.append(Candidate(flat[i], text.decode("utf-8", errors="replace"), flat[i + 2], text))
        else:
            out.append(Candidate(flat[i], text, flat[i + 2]))
    return tuple(out)


def encode_steps(steps: Sequence[Step], fmt: int | None = None) -> bytes:
    """The batch as one blob, in format `fmt` (default FORMAT; the tests write the others)."""
    fmt = FORMAT if fmt is None else fmt
    names = FIELDS[fmt] if fmt else CURRENT_FIELDS
    settings: list[dict[str, Any]] = []
    index: dict[SamplingSettings, int] = {}
    rows = []
    for step in steps:
        row: list[Any] = []
        for name in names:
            value = getattr(step, name)
            if name in _TOPS:
                value = _flat(value)
            elif name == "settings":
                at = index.get(value)
                if at is None:
                    at = index[value] = len(settings)
                    settings.append(value.to_dict())
                value = at
            row.append(value)
        rows.append(row)
    head: list[Any] = [fmt] if fmt else [0, list(names)]
    packed = msgpack.packb([*head, settings, rows], use_bin_type=True, default=_default)
    squeezed = zlib.compress(packed, 6)
    return b"z" + squeezed if len(squeezed) < len(packed) else b"m" + packed


def decode_steps(blob: bytes) -> list[Step]:
    try:
        if blob[:1] == b"z":
            packed = zlib.decompress(blob[1:])
        elif blob[:1] == b"m":
            packed = blob[1:]
        else:
            raise StepCodecError("unknown marker")
        parts = msgpack.unpackb(packed, raw=False, use_list=True)
        if parts[0] == 0:
            _, names, settings_dicts, rows = parts
        else:
            fmt, settings_dicts, rows = parts
            names = FIELDS[fmt]
    except StepCodecError:
        raise
    except Exception as exc:  # zlib.error, msgpack's errors, a bad format number
        raise StepCodecError(f"not a step batch ({type(exc).__name__})") from None
    settings = [SamplingSettings.from_dict(d) for d in settings_dicts]
    steps = []
    for row in rows:
        kwargs: dict[str, Any] = {}
        for name, value in zip(names, row):
            if name not in CURRENT_FIELDS:
                continue
            if name in _TOPS:
                value = _cands(value)
            elif name == "settings":
                value = settings[value]
            elif name == "settings_changed" or (name == "repeat" and value is not None):
                value = tuple(value)
            elif name == "lens" and value is not None:
                value = tuple(LensRow(*r) for r in value)
            elif name == "stages":
                value = stage_reports(value)
            elif name == "watched" and value is not None:
                value = tuple(WatchedToken(*w) for w in value)
            elif name == "constraint" and value is not None:
                value = ConstraintReport(*value)
            elif name == "batch" and value is not None:  # one of N replies in one batch (batch.py)
                value = batch_pass(value)
            elif name == "pass_report" and value is not None:
                value = pass_report(value)
            elif name == "rejected" and value is not None:
                value = RejectedDraft(*value)
            kwargs[name] = value
        steps.append(Step(**kwargs))
    return steps
