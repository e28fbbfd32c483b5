"""The candidates of a step (`Candidates`): the tokens still in the running as the sampler's
stages (sampler_stages) narrow them, the logits they read, and the mass they hold.

They take one of two forms, chosen for cost (see sampler_math): sorted (ids largest logit first,
at most SORT_LIMIT of them, with their float64 logits), or unsorted (more than SORT_LIMIT; `ids`
None for the whole vocabulary in id order), which is never sorted whole. A constraint that allows
most of the vocabulary right before a top-k of at most SORT_LIMIT leaves its ids unmade
(`defer_ids`): top-k reads its mask and the logits alone, and the ids are made only if a stage
asks for them (docs/performance.md, "Ninth session").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from loopchat.engine import sampler_fused, sampler_penalized, sampler_rawtop
from loopchat.engine.sampler_cuts import cut_after, cut_after_mask, top_and_cut
from loopchat.engine.sampler_math import SORT_LIMIT, top_indices, top_set
from loopchat.engine.sampler_pairwise import np_sum
from loopchat.stage_report import StageReport

__all__ = ["Candidates"]


class Candidates:
    """The tokens still in the running at one step, as the stages narrow them.

    `work`: the logits the stages read (the model's, or a penalized copy); `norm`: the
    sum of exp(work - raw_max) over the vocabulary (the mass unit); `mass`: the share of
    it the candidates hold. Sorted form: `ids` and `logits64` (float64), largest first.
    `z`: once a stage has scaled them, the candidates' float64 logits minus their max,
    divided by the temperature in the sorted form (None: not yet computed); `t`: the
    temperature the unsorted form's z is still to be divided by (the distribution divides
    it in the same pass as its exp, sampler_fused)."""

    __slots__ = (
        "logits",
        "work",
        "context",
        "n_vocab",
        "narrow_k",
        "raw_max",
        "norm",
        "raw_top_ids",
        "report_k",
        "_ids",
        "_ids_of",
        "_n_ids",
        "sorted",
        "logits64",
        "z",
        "t",
        "mass",
        "work_max",
        "work_max_id",
        "_allowed",
        "_allowed_of",
        "allowed_n",
        "bound",
        "source_cache",
        "source_exps",
        "source_top",
        "exps_wanted",
        "work_copy",
        "wide_top",
        "raw_wide",
        "changed_ids",
        "allowed_words",
        "ascending_ids",
        "sorted_exps",
    )

    def __init__(
        self,
        logits: np.ndarray,
        context: Sequence[int],
        raw_max: float,
        total: float,
        raw_top_ids: np.ndarray,
        report_k: int,
        bound: tuple[float, float] | None = None,
    ) -> None:
        self.logits = self.work = logits
        self.context = context  # the tokens before this step
        self.n_vocab = logits.shape[0]
        self.raw_max, self.norm = raw_max, total
        self.raw_top_ids, self.report_k = raw_top_ids, report_k
        self._ids: np.ndarray | None = None
        self._ids_of: Callable[[], np.ndarray] | None = None  # (deferred ids: what makes them)
        self._n_ids = 0
        #: the k of the top-k the chain takes right after the constraint (greedy: 1; 0: none or a larger k):
        #: the constraint then leaves its allowed ids unwritten (defer_ids), top-k reading its mask alone
        self.narrow_k = 0
        self.sorted = False
        self.logits64: np.ndarray | None = None
        self.z: np.ndarray | None = None
        self.t = 1.0
        self.mass = 1.0
        # the largest of `work` and a token that holds it (None: not known), kept through
        # the penalties' few changes: a pass over the vocabulary saved at each stage
        self.work_max: float | None = raw_max if raw_top_ids.shape[0] else None
        self.work_max_id = int(raw_top_ids[0]) if raw_top_ids.shape[0] else -1
        # a constraint that left most of the vocabulary: its mask (`allowed`), or what makes it (defer_allowed)
        self._allowed: np.ndarray | None = None
        self._allowed_of: Callable[[], np.ndarray] | None = None
        self.allowed_n = -1  # (how many tokens `allowed` allows, where the constraint counted them; -1: not known)
        #: (X, E): the exact sum of exp(float64(work) - raw_max) is within E of X (sampler_raw's bound)
        self.bound = bound
        self.source_cache: tuple | None = None  # (ids, work[ids], its max), gathered by the constraint's pass
        #: (src, q, shift, sample): q[i] = exp(float64(src[i]) - shift) for source_cache's src, the constraint's
        #: pass's float64 exps (the bits top-p's pass computes: it reads them where its shift is that one,
        #: exps_of), and src[::32] (top-p's strided sample: sample_of)
        self.source_exps: tuple | None = None
        #: (src, top): the positions of source_cache's src's report_k + 1 largest, largest first, where top-p's
        #: search found them (sampler_fused.top_p_deep: top_indices' answer, read instead of searched: top_of)
        self.source_top: tuple | None = None
        #: top-p will run over the constraint's candidates (top_p < 1, no top-k, not greedy): its exps are wanted
        self.exps_wanted = False
        #: scratch memory the raw pass already copied the logits into (sampler_raw's `copy`), or None
        self.work_copy: np.ndarray | None = None
        #: the model's k + 1 largest logits' ids, largest first, distinct, when sampler._wide_top found them
        self.wide_top: np.ndarray | None = None
        #: the model's M largest logits' ids (M + 1 distinct), where every allowed token is kept (sampler_rawtop)
        self.raw_wide: np.ndarray | None = None
        #: the ids whose logits the penalties changed (change_logits), each call's
        self.changed_ids: list[np.ndarray] = []
        #: the constraint's mask, 32 bits a word, where its allowed ids are source_cache's (sampler_rawtop)
        self.allowed_words: np.ndarray | None = None
        #: the constraint's allowed ids (ascending), while they are the candidates' (`ids is` them), else None
        self.ascending_ids: np.ndarray | None = None
        #: (logits64, raw_max, logits64 - raw_max, their exps as floats): top-k's mass (sorted_mass), which
        #: sampler_tail reads where its shift is the same (the top's logit unchanged by the penalties)
        self.sorted_exps: tuple | None = None

    @property
    def ids(self) -> np.ndarray | None:
        """The candidates' ids (None: the whole vocabulary); deferred ones are made on first read."""
        if self._ids_of is not None:
            self._ids, self._ids_of = self._ids_of(), None
        return self._ids

    @ids.setter
    def ids(self, ids: np.ndarray | None) -> None:
        self._ids, self._ids_of = ids, None

    @property
    def allowed(self) -> np.ndarray | None:
        """A constraint that left most of the vocabulary: its mask (a bool a token), for top-k and
        top-p's cut (None: none); a deferred one is made on first read (defer_allowed)."""
        make = self._allowed_of
        if make is not None:
            self.allowed = make()
        return self._allowed

    @allowed.setter
    def allowed(self, mask: np.ndarray | None) -> None:
        self._allowed, self._allowed_of = mask, None

    def defer_allowed(self, make: Callable[[], np.ndarray]) -> None:
        """The mask is what `make()` gives, made only if a stage reads it (before the matcher moves
        on: the stages' reads all come before it): on top-p's rows it is mostly not (sampler_topp)."""
        self._allowed, self._allowed_of = None, make

    @property
    def has_allowed(self) -> bool:
        """Whether a constraint's mask is set (made or deferred), without making it."""
        return self._allowed is not None or self._allowed_of is not None

    def defer_ids(self, n: int, make: Callable[[], np.ndarray]) -> None:
        """The candidates are n ids that `make()` gives, made only if a stage reads them."""
        self._ids, self._ids_of, self._n_ids = None, make, n

    @property
    def count(self) -> int:
        if self._ids_of is not None:
            return self._n_ids
        return self.n_vocab if self._ids is None else int(self._ids.shape[0])

    def source(self) -> np.ndarray:
        """The candidates' logits (float32), in the order of `ids` (source_cache's while `ids` is its own)."""
        if self.source_cache is not None and self.source_cache[0] is self.ids:
            return self.source_cache[1]
        return self.work if self.ids is None else self.work[self.ids]

    def source_max(self, src: np.ndarray) -> float:
        """The largest of `src` (from source()): known, for the whole vocabulary or a cached source, without a pass."""
        if self.source_cache is not None and src is self.source_cache[1]:
            return self.source_cache[2]
        return self.work_max if self.ids is None and self.work_max is not None else float(src.max())

    def top_of(self, src: np.ndarray, k: int) -> np.ndarray | None:
        """top_indices(src, k) where top-p's search found it for this very `src` (source_top), or where the
        constraint's allowed are all kept and the raw top shows it (sampler_rawtop), else None."""
        t = self.source_top
        if t is not None and src is t[0] and t[1].shape[0] >= k:
            return t[1][:k]
        wide, cache, ids = self.raw_wide, self.source_cache, self.ids  # (or among the raw top's: all allowed kept)
        if wide is None or cache is None or ids is None or src is not cache[1] or cache[0] is not ids:
            return None
        return sampler_rawtop.top_among(self, wide, ids, src, k, self.allowed_words)

    def exps_of(self, src: np.ndarray, shift: float) -> np.ndarray | None:
        """exp(float64(src) - shift), float64, where the constraint's pass computed them (source_exps), else None."""
        e = self.source_exps
        return e[1] if e is not None and src is e[0] and e[2] == shift else None

    def sample_of(self, src: np.ndarray) -> np.ndarray | None:
        """src[::32] where the constraint's pass wrote it beside src (source_exps), else None."""
        e = self.source_exps
        return e[3] if e is not None and src is e[0] else None

    def scaled_exps_of(self, src: np.ndarray, shift: float) -> np.ndarray | None:
        """The constraint's pass's exps of src where their shift (the raw max) is above `shift`, the
        candidates' largest logit (the raw top forbidden or penalized), by at most 64: each candidate's
        exp(float64(src) - shift) times one factor, exp(shift - the raw max) as the kernel computes it
        (top-p's search reads them so, sampler_math.top_p_positions' `scaled`); else None."""
        e = self.source_exps
        return e[1] if e is not None and src is e[0] and shift < e[2] <= shift + 64.0 else None

    def change_logits(self, ids: np.ndarray, values: np.ndarray | None, penalty: float = 0.0) -> tuple[int, float]:
        """Give the tokens `ids` new logits (on a copy of the model's; values None: the repeat
        penalty's, by `penalty`): sampler_penalized."""
        return sampler_penalized.change_logits(self, ids, values, penalty)

    def take_top(self, k: int) -> int:
        """Keep the k largest logits (k <= n_vocab): sorted if k <= SORT_LIMIT, else
        unsorted, never sorted whole (ids None if k is the whole vocabulary). Candidates an
        earlier stage narrowed (the constraint: ids set): the k largest of them. Returns the
        most likely token cut (the k+1-th largest; -1: none)."""
        if self._ids is not None or self._ids_of is not None:
            n, was_sorted, deferred = self.count, self.sorted, self._ids_of is not None
            before = None if deferred else self.ids
            self._take_top_of_ids(k)
            if self.count >= n:
                return -1
            if deferred:  # (the ids the mask allows, never made: the cut by the mask alone)
                assert self.allowed is not None and self.ids is not None
                return cut_after_mask(self.work, self.ids, self.allowed)
            assert before is not None and self.ids is not None
            return int(before[k]) if was_sorted else cut_after(self.work, before, self.ids, self.allowed)
        if k > SORT_LIMIT:
            if k >= self.n_vocab:
                self.ids = None
                return -1
            self.ids = top_set(
                self.work, k
            )  # (its order is the draw's: see sampler_distribution.unsorted_distribution)
            return cut_after(self.work, None, self.ids)
        wide, work = self.wide_top, self.work
        unchanged = work is self.logits
        raw_top = self.raw_top_ids if unchanged and k <= self.report_k else None
        if wide is not None and unchanged and wide.shape[0] == k + 1:  # (top_and_cut's answer)
            self.ids, cut = wide[:k], int(wide[k])
        elif raw_top is None and k + 1 < self.n_vocab and (top := sampler_fused.top_k(work, k + 1)) is not None:
            # (the kernel's k + 1 are distinct and strictly falling where it finds them: top_and_cut's
            # answer, without its test of their order)
            self.ids, cut = top[:k], int(top[k])
        else:
            self.ids, cut = top_and_cut(work, k, raw_top)
        self.sorted = True
        self.logits64 = work[self.ids].astype(np.float64)
        return cut

    def _take_top_of_ids(self, k: int) -> None:
        n = self.count
        if self.sorted:
            if k < n:
                self.keep_first(k)
            return
        if k >= n:
            if n <= SORT_LIMIT:
                self.sort()
            return
        if k <= SORT_LIMIT and self.allowed is not None:
            # most of the vocabulary allowed: the k largest allowed, by the kernel's pass over the
            # mask where they are distinct, else among the largest logits
            top = sampler_fused.top_k(self.work, k, self.allowed)
            self.ids = self._top_allowed(k) if top is None else top  # (deferred ids: still unmade)
            self.sorted = True
            self.logits64 = self.work[self.ids].astype(np.float64)
            return
        assert self.ids is not None
        src = self.work[self.ids]
        if k > SORT_LIMIT:
            self.ids = self.ids[top_set(src, k)]
            return
        self.ids = self.ids[top_indices(src, k)]
        self.sorted = True
        self.logits64 = self.work[self.ids].astype(np.float64)

    def _top_allowed(self, k: int) -> np.ndarray:
        """The k largest of `work` the mask allows, largest first: they are among the largest k +
        (the forbidden ones) logits; a few more than k is nearly always enough."""
        assert self.allowed is not None
        want = min(self.n_vocab, 2 * k + 16)
        while True:
            top = top_indices(self.work, want)
            top = top[self.allowed[top]]
            if top.shape[0] >= k or want >= self.n_vocab:
                return top[:k]
            want = min(self.n_vocab, want * 4)

    def sort(self) -> None:
        """The unsorted candidates in the sorted form (largest first, a stable sort)."""
        assert self.ids is not None
        self.sorted = True
        done = sampler_fused.sort_down(self.work, self.ids)  # (the kernel's one call: the same order)
        if done is not None:
            self.ids, self.logits64 = done
            return
        self.ids = self.ids[np.argsort(-self.work[self.ids], kind="stable")]
        self.logits64 = self.work[self.ids].astype(np.float64)

    def keep_first(self, n: int) -> None:
        """Sorted form: keep the n largest."""
        assert self.ids is not None and self.logits64 is not None
        self.ids, self.logits64 = self.ids[:n], self.logits64[:n]
        if self.z is not None:
            self.z = self.z[:n]

    def sorted_mass(self) -> float:
        """mass_of(logits64) of the sorted candidates, its differences and exps kept (sorted_exps)."""
        l64 = self.logits64
        assert l64 is not None
        x = l64 - self.raw_max
        e = np.exp(x).tolist()
        self.sorted_exps = (l64, self.raw_max, x, e)
        return np_sum(e) / self.norm  # (at most SORT_LIMIT: numpy's pairwise sum, mass_of's bits)

    def mass_of(self, logits64: np.ndarray) -> float:
        """The share of the mass unit these (float64) logits hold."""
        e = np.exp(logits64 - self.raw_max)
        # (a few: numpy's pairwise sum in Python floats, the same bits without a reduction's call into numpy)
        return (np_sum(e.tolist()) if e.shape[0] <= SORT_LIMIT else float(e.sum())) / self.norm

    def report(
        self, stage: str, entered: int, kept_mass: float, cut: int = -1, changed: int = 0, moved: float = 0.0
    ) -> StageReport:
        """A stage's report; the candidates now hold kept_mass (when it removed any); `cut`:
        the most likely token it removed (-1: none); `changed`, `moved`: see change_logits."""
        removed = entered - self.count
        removed_mass = 0.0
        if removed:
            removed_mass = max(self.mass - kept_mass, 0.0)
            self.mass = kept_mass
        cut_prob = 0.0
        if removed and cut >= 0:
            cut_prob = math.exp(float(self.work[cut]) - self.raw_max) / self.norm
        else:
            cut = -1
        return StageReport(stage, removed, removed_mass, self.count, self.mass, cut, cut_prob, changed, moved)
