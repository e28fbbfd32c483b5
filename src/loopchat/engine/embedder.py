"""Embeddings of texts (serve's POST /v1/embeddings): one vector per input, from the model file.

An input's embedding is the mean, over the input's tokens, of the model's last hidden state
(the output norm's result, the row the output head reads: `llama_get_embeddings_ith` with
pooling "none"), in float64, divided by its Euclidean length: a unit vector, as OpenAI's are.
A model file that names its own pooling (`<arch>.pooling_type`: an embedding model's CLS or
LAST) gets that instead (the first token's state, or the last one's); a chat model names none,
and gets MEAN (llama-server would refuse it without `--pooling mean`). docs/wire.md,
"Embeddings", says how to recompute one.

The states are taken in chunks of `chunk_for(n_vocab)` tokens, each a decode that continues the
input's cache (causal attention: a token's state depends on the tokens before it only), and the
mean is taken here: llama.cpp's own pooling needs the whole input in one micro-batch, and an
output buffer and a graph holding the logits of every token of it (llama.cpp computes them
beside the states): 1.2 GB more RSS for 422 tokens on Gemma 3 270M (vocabulary 262,144),
where chunks of 16 tokens keep it to a few dozen MB.

The `Embedder` owns a `Llama` of its own, loaded at the first request (a chat server that never
embeds pays nothing), on a thread of its own: the engine's thread and its context are never
touched, and a reply streaming meanwhile only shares the cores. The file is mapped, not read
into the engine's 2 MB pages: its pages are the page cache's (the model's size in RSS while
mapped).
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: an input's tokens at most (the embedder's context; OpenAI's own limit is 8,192)
MAX_TOKENS = 2048
#: llama.cpp's pooling types by number (llama.h): the ones used here
POOLING = {1: "mean", 2: "cls", 3: "last"}
MEAN = 1
#: a chunk's logits at most (floats: 16 MB), which llama.cpp computes for every token whose state is read
CHUNK_FLOATS = 1 << 22


def chunk_for(n_vocab: int) -> int:
    """Tokens a decode: the largest power of two whose logits fit CHUNK_FLOATS, from 8 to 256
    (64 on the default model, 16 on Gemma's 262,144 tokens)."""
    chunk = 8
    while chunk < 256 and chunk * 2 * n_vocab <= CHUNK_FLOATS:
        chunk *= 2
    return chunk


class EmbedInputError(ValueError):
    """An input that cannot be embedded (empty, too long, a token outside the vocabulary): its index."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class EmbedWidthError(ValueError):
    """A width asked for (`dimensions`) other than the model's: a vector cannot be cut shorter and
    stay what the model computed."""

    def __init__(self, n_embd: int, asked: Any) -> None:
        super().__init__(f"the model's embeddings have {n_embd} dimensions, not {asked!r}")
        self.n_embd, self.asked = n_embd, asked


class EmbedCancelled(Exception):
    """The asker left: the embedding stopped at a chunk's end."""


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: np.ndarray  # (inputs, n_embd) float32, each row of unit length
    counts: tuple[int, ...]  # each input's tokens
    pooling: str  # how the tokens' states became one vector ("mean", or the file's own)

    @property
    def tokens(self) -> int:
        """The inputs' tokens, all together (usage.prompt_tokens)."""
        return sum(self.counts)


def read_shape(path: Path) -> tuple[int, int]:
    """(the pooling the file names (`<arch>.pooling_type`), or MEAN where it names none or "none";
    its vocabulary, the token embedding's rows). The header's arrays are stepped over: 25 ms on the
    default model, 122 ms on Gemma's 262,144 tokens, so it is read at the first embedding, not at
    the server's start."""
    from loopchat.engine.gguf_tensors import GGUFHeader

    header = GGUFHeader(path)
    fields = header.fields
    arch = fields.get("general.architecture", "")
    named = fields.get(f"{arch}.pooling_type")
    pooling = named if isinstance(named, int) and named in POOLING else MEAN
    embd = header.tensors.get("token_embd.weight")  # (llama.cpp's name in every architecture it reads)
    n_vocab = int(embd.shape[1]) if embd is not None else 1 << 18  # (not found: chunks as small as Gemma's)
    return pooling, n_vocab


class Embedder:
    """Embeds lists of inputs (texts, or lists of token ids) on its own thread: `submit`."""

    def __init__(self, path: Path, threads: int) -> None:
        self.path, self.threads = Path(path), max(1, threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loopchat-embed")
        self._llm: Any = None  # (the pool's thread's: loaded, used and freed there)
        self._pooling = MEAN  # (the file's, read with it at the first embedding: _load)
        self._lock = threading.Lock()  # close() against a submit in flight
        self._stops: set[threading.Event] = set()  # the embeddings submitted and not done
        self._closed = False

    def submit(
        self, inputs: list[str | list[int]], stop: threading.Event | None = None, width: Any = None
    ) -> concurrent.futures.Future[Embedded]:
        """The inputs' embeddings, computed on the embedder's thread (EmbedInputError for a bad input;
        EmbedWidthError where `width`, if given, is not the model's). `stop` set (the client left):
        the work ends at its next chunk, with EmbedCancelled."""
        stop = stop or threading.Event()
        with self._lock:
            if self._closed:
                raise RuntimeError("the embedder is closed")
            self._stops.add(stop)
            job = self._pool.submit(self._embed, inputs, stop, width)
        job.add_done_callback(lambda _: self._stops.discard(stop))
        return job

    def close(self) -> None:
        """Stops the embeddings in flight (at their next chunk), then frees the model (on the embedder's thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop_all()
        self._pool.submit(self._free).result()
        self._pool.shutdown(wait=True)

    @property
    def busy(self) -> bool:
        """Whether an embedding is submitted and not done (GET /health's `embedding`)."""
        return bool(self._stops)

    def stop_all(self) -> None:
        """The embeddings in flight end at their next chunk, with EmbedCancelled (the server stops;
        any thread: it sets flags)."""
        for stop in list(self._stops):
            stop.set()

    def _free(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    def _load(self) -> Any:
        if self._llm is None:
            from llama_cpp import Llama

            from loopchat.engine.llama_log import captured_log, python_prints_to_log

            self._pooling, n_vocab = read_shape(self.path)
            chunk = chunk_for(n_vocab)
            with python_prints_to_log(), captured_log():
                llm = Llama(
                    model_path=str(self.path),
                    embedding=True,
                    pooling_type=0,  # ("none": each token's state, pooled here)
                    n_ctx=MAX_TOKENS,
                    n_batch=chunk,
                    n_ubatch=chunk,
                    n_threads=self.threads,
                    n_threads_batch=self.threads,
                    verbose=True,  # (verbose=False dup2()s fds 1 and 2: the log callback takes it)
                )
            llm.verbose = False
            self._llm = llm
        return self._llm

    def _embed(self, inputs: list[str | list[int]], stop: threading.Event, width: Any) -> Embedded:
        llm = self._load()
        if width is not None and width != llm.n_embd():
            raise EmbedWidthError(llm.n_embd(), width)
        token_lists = [self._tokens(llm, i, x) for i, x in enumerate(inputs)]
        out = np.empty((len(token_lists), llm.n_embd()), dtype=np.float32)
        for row, tokens in enumerate(token_lists):
            v = self._pooled(llm, tokens, stop)
            out[row] = v / np.linalg.norm(v)  # (a zero vector cannot come from a norm layer's output)
        llm._ctx.kv_cache_clear()
        llm._batch.reset()
        return Embedded(out, tuple(len(t) for t in token_lists), POOLING[self._pooling])

    def _pooled(self, llm: Any, tokens: list[int], stop: threading.Event) -> np.ndarray:
        """The input's tokens' last hidden states, pooled (float64): their mean, or the first's or
        the last's; the input evaluated alone, chunk by chunk, from position 0."""
        import llama_cpp

        n_embd, chunk, pooling = llm.n_embd(), llm.n_batch, self._pooling
        llm._ctx.kv_cache_clear()
        total, first, last = np.zeros(n_embd, dtype=np.float64), None, None
        for at in range(0, len(tokens), chunk):
            if stop.is_set():
                raise EmbedCancelled()
            part = tokens[at : at + chunk]
            llm._batch.reset()
            llm._batch.set_batch(part, n_past=at, logits_all=True)
            llm._ctx.decode(llm._batch)
            states = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings(llm._ctx.ctx), shape=(len(part), n_embd))
            total += states.sum(axis=0, dtype=np.float64)
            first = states[0].astype(np.float64) if first is None else first
            last = states[-1].astype(np.float64)
        assert first is not None and last is not None  # (an input holds a token at least)
        return {1: total / len(tokens), 2: first, 3: last}[pooling]

    @staticmethod
    def _tokens(llm: Any, index: int, item: str | list[int]) -> list[int]:
        """An input's tokens: a text's as the model's tokenizer gives them (with the start token the
        file asks for, no special tokens parsed), or the ids given, checked."""
        if isinstance(item, str):
            tokens = llm.tokenize(item.encode("utf-8"), add_bos=True, special=False)
        else:
            tokens = list(item)
            n_vocab = llm.n_vocab()
            bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise EmbedInputError(
                    index,
                    f"token {bad} is not in the model's vocabulary (0 to {n_vocab - 1}): token ids must be this "
                    "model's, not another tokenizer's (LangChain's OpenAIEmbeddings sends tiktoken's unless "
                    "check_embedding_ctx_length=False); or send the text",
                )
        if not tokens:
            raise EmbedInputError(index, "it is empty: give each input some text (or tokens)")
        if len(tokens) > MAX_TOKENS:
            raise EmbedInputError(
                index, f"it is {len(tokens)} tokens long, more than the {MAX_TOKENS} an embedding takes: split it"
            )
        return tokens
