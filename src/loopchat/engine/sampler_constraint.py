"""The constraint as a stage of the sampler's chain: a grammar's or a JSON schema's mask.

At each pass llguidance's matcher (built per reply from the request's Constraint,
constraint_grammar.py) fills the bitmask of the tokens the grammar allows next; the stage
keeps those alone as the candidates (the unsorted form of sampler_stages, sorted when few:
the stages after it narrow them further, none looks at a forbidden token again) and
reports, besides its StageReport, what it did to the model's own distribution
(`ConstraintReport`, docs/trace-format.md "The constraint"):

- allowed: how many tokens of the vocabulary the grammar allows;
- forbidden_mass: the raw probability of the others, F / T with T = sum over the vocabulary
  of exp(float64(logit) - max) and F the same sum over the forbidden tokens (computed as
  T minus the allowed tokens' sum when they are the fewer);
- the most likely forbidden token (largest raw logit, the lowest id of equal ones) and its
  raw probability exp(float64(logit) - max) / T;
- forced: exactly one token allowed.

Its place in the chain: after the penalties (and the logit bias), before top-k
(sampler_stages.with_constraint). After the draw, `consume` moves the matcher on by the token drawn;
`stopped` says the grammar has ended (the reply then ends: no token could follow).
The mask is llguidance's (Rust; microseconds for a JSON schema on a 49,152-token vocabulary).
With the C kernel, every figure comes from one pass over the logits and the mask's 32-bit words
(`constraint_scan`: the total, the smaller side's sum, the top forbidden token, and, when most
of the vocabulary is allowed, the allowed ids with their logits, which the later stages read as
the candidates' source, `Candidates.source_cache`, and where top-p follows their float64 exps and
every 32nd allowed logit: its masses and strided sample, `Candidates.source_exps`); without it,
numpy's passes (`_measure`), the same figures (tests/test_constraint_scan.py; docs/performance.md,
"The constraint stage in one pass").
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any, cast

import numpy as np
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from loopchat.constraint import Constraint, ConstraintError, ConstraintReport
from loopchat.engine import sampler_fused
from loopchat.engine.constraint_grammar import check
from loopchat.engine.sampler_math import SORT_LIMIT
from loopchat.engine.sampler_scratch import scratch
from loopchat.engine.sampler_stages import Candidates, StageReport

_LANES = np.arange(32)


class ConstraintStage:
    """One reply's constraint: its matcher, and the report of the latest pass it masked."""

    name = "constraint"

    def __init__(self, spec: Constraint, tokenizer: Any, n_vocab: int, piece_text: Any) -> None:
        self.spec = spec
        self.matcher = LLMatcher(tokenizer, check(spec, tokenizer), log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(f"{spec.kind_name} {spec.source}: {self.matcher.get_error()}")
        self.n_vocab = n_vocab
        self._bitmask = allocate_token_bitmask(1, n_vocab)
        self._filled = False  # the mask holds the matcher's present state (consume fills it)
        self._piece_text = piece_text
        self.report: ConstraintReport | None = None
        self.error: str | None = None  # the matcher's error (a token it could not take)

    # ------------------------------------------------------------------ the mask ----
    def allowed_bits(self) -> np.ndarray:
        """One bool per token of the vocabulary: True if the grammar allows it next."""
        self._fill()
        return self._unpacked()

    def _fill(self) -> None:
        fill_next_token_bitmask(self.matcher, self._bitmask)
        self._filled = True

    def _unpacked(self) -> np.ndarray:
        return np.unpackbits(self._bitmask[0].view(np.uint8), count=self.n_vocab, bitorder="little").view(bool)

    def _allowed(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(the allowed ids, ascending; the mask as bools, None when few are allowed: their
        32-bit words alone are unpacked, not the vocabulary's bits). The mask filled."""
        words = self._bitmask[0]
        set_words = np.flatnonzero(words)
        if set_words.shape[0] * 64 > self.n_vocab:  # many: the whole mask
            bits = self._unpacked()
            return np.flatnonzero(bits), bits
        return self._ids_in(words, set_words), None

    def _ids_in(self, words: np.ndarray, set_words: np.ndarray) -> np.ndarray:
        """The ids of the set bits of these (few) words, ascending."""
        sub = np.unpackbits(words[set_words].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little").view(bool)
        ids = (set_words[:, None] * 32 + _LANES)[sub]
        return ids[ids < self.n_vocab]

    def apply(self, c: Candidates) -> StageReport:
        entered = c.count
        if not self._filled:  # (the reply's first pass: consume fills the others' masks)
            self._fill()
        kernel = sampler_fused.kernel
        if kernel is not None and c.logits.dtype == np.float32 and c.logits.flags.c_contiguous:
            return self._apply_scan(c, entered, kernel)
        allowed, bits = self._allowed()
        n = int(allowed.shape[0])
        if n == 0 or n >= c.n_vocab:
            return self._nothing_to_measure(c, entered, n)
        if bits is None:
            bits = np.zeros(c.n_vocab, dtype=bool)
            bits[allowed] = True
        self.report, kept_mass = self._measure(c, bits, allowed)
        return self._narrow(c, entered, allowed, bits, kept_mass)

    def _nothing_to_measure(self, c: Candidates, entered: int, n: int) -> StageReport:
        """No token allowed (the matcher failed: the candidates are left as they are), or every one."""
        if n == 0:
            self.error = self.matcher.get_error() or "the grammar allows no token here"
        self.report = ConstraintReport(n, 0.0, -1, "", 0.0, False)
        return c.report(self.name, entered, c.mass)

    def _narrow(
        self, c: Candidates, entered: int, allowed: np.ndarray, bits: np.ndarray | None, kept_mass: float
    ) -> StageReport:
        """The candidates become the allowed ids (sorted when few; with the mask when most of
        the vocabulary: top-k then looks among the largest logits, sampler_stages)."""
        n = int(allowed.shape[0])
        c.ids = c.ascending_ids = allowed
        if n <= SORT_LIMIT:
            c.sort()
        elif bits is not None and n * 2 > c.n_vocab:
            c.allowed, c.allowed_n = bits, n
        return c.report(self.name, entered, kept_mass)

    def _apply_scan(self, c: Candidates, entered: int, kernel: Any) -> StageReport:
        """The kernel's one pass (constraint_scan) over the logits and the mask's words: the
        count, the raw total, the smaller side's sum (and the same over the penalized logits:
        the chain's unit), the top forbidden token and, when most tokens are allowed, their
        ids. The same figures as _measure (the total bit for bit, the sides within 1e-15 of
        it), without a byte a token of mask or a list of the forbidden ids."""
        words, n_vocab, logits = self._bitmask[0], c.n_vocab, c.logits
        ids, src = scratch.get("constraint_ids", n_vocab, np.int64), scratch.get("constraint_src", n_vocab, np.float32)
        work = None if c.work is logits else c.work
        by_mask = 0 < c.narrow_k <= SORT_LIMIT  # (a top-k by the mask follows: the ids not written)
        # (the allowed tokens' float64 exps at the raw max stored for top-p, where it follows over them
        # (Candidates.exps_wanted): its pass then reads them, one exp pass over ~250,000 candidates saved on
        # Gemma; scaled by one factor where their largest logit is below the raw max: scaled_exps_of, chain24)
        q = scratch.get("constraint_q", n_vocab, np.float64) if c.exps_wanted else None
        # (and with them src[::32], top-p's strided sample, written where it writes src: no second strided
        # read of the ~1 MB it just wrote, 74 us a step on Gemma; chain24)
        smp = scratch.get("constraint_sample", n_vocab // 32 + 1, np.float32) if q is not None else None
        n, total, side_sum, work_sum, top, src_max, q_written = kernel.constraint_scan(
            logits, work, words, c.raw_max, None if by_mask else ids, src, q, smp
        )
        if n == 0 or n >= n_vocab:
            return self._nothing_to_measure(c, entered, n)
        many = n * 2 > n_vocab  # (the side summed: the forbidden tokens, else the allowed ones)
        forbidden = side_sum if many else max(total - side_sum, 0.0)
        kept = max(c.mass - work_sum / c.norm if many else work_sum / c.norm, 0.0)
        p_top = float(np.exp(np.float64(logits[top]) - c.raw_max)) / total
        self.report = ConstraintReport(n, forbidden / total, top, self._piece_text(top), p_top, n == 1)
        if many and by_mask:  # (the ids made only if a stage reads them: top-k reads the mask)
            bits = self._unpacked()
            c.allowed, c.allowed_n = bits, n
            c.defer_ids(n, functools.partial(np.flatnonzero, bits))
            return c.report(self.name, entered, kept)
        # (the kernel wrote the allowed ids, many or few, where it was given `ids`)
        allowed = ids[:n] if not by_mask else self._ids_in(words, np.flatnonzero(words))
        if many:  # the allowed tokens' (penalized) logits, gathered in the pass: the later stages' source()
            values = src[:n]
            c.source_cache, c.allowed_words = (allowed, values, src_max), words
            if q_written:  # (and their float64 exps at the raw max: top-p's masses, at its shift or scaled)
                c.source_exps = (values, cast(np.ndarray, q)[:n], c.raw_max, cast(np.ndarray, smp)[: (n + 31) // 32])
        if many and n > SORT_LIMIT:  # (the mask unpacked only if a stage reads it: top-p's cut mostly does not)
            c.ids = c.ascending_ids = allowed
            c.defer_allowed(self._unpacked)
            c.allowed_n = n
            return c.report(self.name, entered, kept)
        return self._narrow(c, entered, allowed, None, kept)

    def _measure(self, c: Candidates, bits: np.ndarray, allowed: np.ndarray) -> tuple[ConstraintReport, float]:
        """The pass's ConstraintReport, and the mass the allowed tokens keep in the chain's unit
        (numpy's passes: the kernel's constraint_scan does them in one, _apply_scan)."""
        logits, m = c.logits, c.raw_max
        total = sampler_fused.exp_sum(logits, m, None)
        few_allowed = allowed.shape[0] * 2 <= c.n_vocab
        side = allowed if few_allowed else np.flatnonzero(~bits)  # the fewer: one gather
        side_sum = sampler_fused.exp_sum(logits[side], m, None)
        forbidden = max(total - side_sum, 0.0) if few_allowed else side_sum
        # the chain's unit (the penalized logits, c.norm): the same sum when nothing was penalized
        work_sum = side_sum if c.work is logits else sampler_fused.exp_sum(c.work[side], m, None)
        kept = work_sum / c.norm if few_allowed else c.mass - work_sum / c.norm
        top = next((int(i) for i in c.raw_top_ids if not bits[i]), -1)
        if top >= 0:  # the largest forbidden logit: its lowest id (the raw top orders equal ones its own way)
            top = int(np.flatnonzero((logits == logits[top]) & ~bits)[0])
        elif not few_allowed:  # the raw top-K all allowed: the largest forbidden logit
            top = int(side[np.argmax(logits[side])])  # (ascending ids: the lowest of equal ones)
        else:
            top = int(np.argmax(np.where(bits, np.float32(-np.inf), logits)))
        p_top = float(np.exp(np.float64(logits[top]) - m)) / total
        report = ConstraintReport(
            int(allowed.shape[0]), forbidden / total, top, self._piece_text(top), p_top, allowed.shape[0] == 1
        )
        return report, max(kept, 0.0)

    # ------------------------------------------------------------ the matcher ----
    def consume(self, token: int) -> bool:
        """Move the grammar on by the token drawn (False: the grammar does not take it), and
        compute the next pass's mask now, while the matcher's tables are in the caches: after
        the forward pass has run through them, the same mask costs ~10x (0.096 ms against
        0.010 on both models; docs/performance.md, "The constraint stage in one pass")."""
        self._filled = False
        ok = bool(self.matcher.consume_token(token))
        if not ok or self.matcher.is_error():
            error = (self.matcher.get_error() or "").strip()  # (llguidance's: a line, then its whole state)
            self.error = error.splitlines()[0] if error else f"the grammar does not allow token {token} here"
            return False
        if not self.matcher.is_stopped():
            self._fill()
        return True

    def refusal(self, token: int) -> str | None:
        """None if the grammar takes `token` next (its present state); else one line saying it
        does not, for a token picked by hand (step mode, a branch)."""
        if not (self.matcher.is_stopped() or self.matcher.is_error()):
            if not self._filled:
                self._fill()
            if (int(self._bitmask[0][token >> 5]) >> (token & 31)) & 1:
                return None
        return f"the {self.spec.label()} constraint does not allow {self._piece_text(token)!r} here"

    @property
    def stopped(self) -> bool:
        """The grammar has ended: no token can follow."""
        return bool(self.matcher.is_stopped())


#: each loaded model's llguidance tokenizer (built from its vocab once: ~0.5 s on 49,152 tokens)
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def open_stage(llm: Any, spec: Constraint, n_vocab: int, piece_text: Any) -> ConstraintStage:
    """A reply's constraint stage on a loaded `Llama` (its tokenizer kept while the model is)."""
    tokenizer = _TOKENIZERS.get(llm)
    if tokenizer is None:
        tokenizer = _TOKENIZERS[llm] = llg_tokenizer(llm)
    return ConstraintStage(spec, tokenizer, n_vocab, piece_text)


def llg_tokenizer(llm: Any) -> Any:
    """llguidance's tokenizer of the model's vocabulary: lltokenizer_from_vocab's, its loop over the
    tokens in C where the kernel was built (`kernel_pieces`: the same bytes; 0.18 of its 0.34 s on the
    default model, 1.2 of 2.0 s on Gemma 3's 262,144 tokens, at a process's first constrained reply)."""
    import llama_cpp
    from llguidance import LLTokenizer
    from llguidance.llamacpp import lltokenizer_from_vocab

    from loopchat.engine._llama_ffi import address

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    pieces = kernel_pieces(vocab)
    if pieces is None:
        with warnings.catch_warnings():  # (it calls llama_token_get_attr, deprecated, per token)
            warnings.simplefilter("ignore", DeprecationWarning)
            return lltokenizer_from_vocab(vocab)
    return LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
        tokens=pieces,
        vocab_ptr=vocab,
        tokenize_fptr=address(llama_cpp.llama_cpp._lib.llama_tokenize),
        eos_token=llama_cpp.llama_vocab_eos(vocab),
        slices=None,
    )


def kernel_pieces(vocab: Any) -> list[bytes] | None:
    """Every token's bytes as lltokenizer_from_vocab reads them (special tokens rendered, a control
    token prefixed with 0xff), by the kernel's `vocab_pieces`; None where the kernel was not built."""
    import llama_cpp

    from loopchat.engine._llama_ffi import address

    kernel = sampler_fused.kernel
    if kernel is None or not hasattr(kernel, "vocab_pieces"):
        return None
    lib = llama_cpp.llama_cpp._lib
    return cast(
        "list[bytes]",
        kernel.vocab_pieces(
            address(vocab),
            address(lib.llama_token_to_piece),
            address(lib.llama_vocab_get_attr),
            llama_cpp.llama_vocab_n_tokens(vocab),
            llama_cpp.LLAMA_TOKEN_ATTR_CONTROL,
            llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED,
        ),
    )
