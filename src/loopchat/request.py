"""One reply's request: everything a reply needs, passed whole (issue 23, item 1).

The asker (the chat session, `loopchat run`, `loopchat serve`, a replay) builds one
`ReplyRequest`; the backend and the host that owns the engine pass it on unchanged (the
process host pickles it through its pipe); the engine runs it. A new per-reply option is
declared here, once, with its default; no signature between the asker and the engine
spells the options out again.

Two things a reply needs are not in the request, because they are live objects shared
with the asker while the reply runs: the settings source read at every pass (a
`LiveSettings`: a change in F2 applies at the next pass) and the step-mode control
(`StepControl`). `settings` here is the snapshot the reply starts with.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from loopchat.constraint import Constraint
from loopchat.events import DOCUMENT, Message, _pickled_by_init
from loopchat.settings import SamplingSettings


@_pickled_by_init  # once per reply through the process host's pipe: as cheap as the events
@dataclass(frozen=True, slots=True)
class ReplyRequest:
    #: the conversation so far, or one DOCUMENT message alone (the raw text to continue)
    messages: tuple[Message, ...]
    #: the sampling settings the reply starts with (seed None: a fresh random seed per reply)
    settings: SamplingSettings
    #: stop strings (stop_strings.py): the reply ends before the first occurrence of any
    stop: tuple[str, ...] = ()
    #: reuse at most this many prompt tokens from the KV cache; a replay passes the
    #: original reply's Prefill.reused_tokens, so the prompt is evaluated in the same
    #: batches and the logits are the same to the last bit
    reuse_at_most: int | None = None
    #: the reply's first tokens, already chosen (a branch); the loop continues after them,
    #: its steps numbered from len(reply_prefix), max_tokens counting the prefix
    reply_prefix: tuple[int, ...] = ()
    #: the run's first step takes this token instead of drawing one (chosen_by "hand")
    first_token: int | None = None
    #: the run's steps take these tokens in turn instead of drawing (chosen_by "hand"): a
    #: finished reply's passes read again (the lens depth of each of its tokens); with
    #: first_token set, it comes first
    forced: tuple[int, ...] = ()
    #: the size of the top-K lists each step reports (raw and sampled-from)
    report_k: int = 10
    #: keep going past end-of-generation tokens (benchmarks: a fixed number of tokens)
    ignore_eos: bool = False
    #: the asker wants each step as it is drawn (False: blocking, the events at the end)
    stream: bool = True
    #: start in step mode: the loop stops before its first draw
    step_paused: bool = False
    #: the prompt's own logprobs (prompt_scores.py): None, not computed; k >= 0: each prompt
    #: token's logprob and the model's top max(k, 1) guesses at its position, in the Prefill
    prompt_logprobs: int | None = None
    #: a document given as token ids (serve's /v1/completions token prompts): evaluated as they
    #: are, in place of `messages`' text, which the Start then gives as their pieces' text. (): none
    prompt_ids: tuple[int, ...] = ()
    #: the prompt is evaluated (and scored, with prompt_logprobs) and nothing is drawn: the reply
    #: ends after its Prefill, reason "length", no Step (serve's max_tokens 0 on /v1/completions:
    #: "how surprising was this text", as OpenAI's echo with max_tokens 0 and lm-eval's loglikelihood)
    score_only: bool = False
    #: the logit lens of each pass (engine/lens.py), in each Step: a row per layer
    lens: bool = False
    #: tokens on watch (watch.py): the first token of each string, followed in every Step
    watch: tuple[str, ...] = ()
    #: a grammar or JSON schema the reply must follow (constraint.py): the engine builds its
    #: matcher for the reply and masks each pass with it; None: unconstrained
    constraint: Constraint | None = None
    #: parallel sequences (batch.py): write this many replies to the prompt in one batch (1: one reply)
    n: int = 1
    #: speculative decoding replayed (passes.py): (pass number, drafts checked) of each
    #: verifying pass of the reply replayed; the run drafts exactly so many at those passes and
    #: none at the others, instead of choosing by measured costs (which depend on the
    #: machine's pace): with prompt lookup the passes are batched as the first time, so the
    #: logits, and under the same seed the tokens, are the same. (): choose as it goes
    draft_plan: tuple[tuple[int, int], ...] = ()
    #: OpenAI's Predicted Outputs: the text the reply is expected to be much like; its tokens
    #: are the drafts (drafts.PredictionDrafter, source "prediction") in place of the settings'
    #: `draft`. "": none
    prediction: str = ""
    #: a pass shared with other requests (serve --parallel) is measured against one sequence's
    #: (the probes behind BatchPass.single_ms: a decode each) for this request's steps; False: its
    #: asker shows no batch figures (a served request with the extension off, `loopchat: false`)
    batch_probes: bool = True
    #: each Step's figures that only a reader of the whole record shows: the sampled-from top list,
    #: the stage reports' cut texts, the repeat. False: an asker that reads of a Step only its
    #: token, its text and its raw figures (a served request with the extension off: its chunks
    #: carry the raw top list): Step.sampled_top None (not given), each stage report's cut_text ""
    #: (not known), Step.repeat None; the rest of the Step is as ever
    step_detail: bool = True

    def __post_init__(self) -> None:
        # callers may pass lists; the request stays hashable and immutable
        for name in ("messages", "stop", "reply_prefix", "forced", "watch", "draft_plan", "prompt_ids"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    @classmethod
    def document(cls, text: str, settings: SamplingSettings, **fields: Any) -> ReplyRequest:
        """A completion-mode request: continue `text` as written, no chat template."""
        return cls((Message(DOCUMENT, text),), settings, **fields)

    @property
    def is_document(self) -> bool:
        return len(self.messages) == 1 and self.messages[0].role == DOCUMENT

    def with_(self, **changes: Any) -> ReplyRequest:
        """This request with some fields changed."""
        return replace(self, **changes)
