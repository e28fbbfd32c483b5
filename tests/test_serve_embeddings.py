"""POST /v1/embeddings on `loopchat serve` (engine/embedder.py, serve/embeddings.py): OpenAI's
embeddings guide with its Python and Node SDKs on a real server. Each vector is recomputed
here without the server's code: llama.cpp's own MEAN pooling of the input's last hidden pooled
(the whole input in one micro-batch, where the server takes them chunk by chunk and averages
them itself), divided by its length (docs/wire.md, "Embeddings")."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI
from serve_process import KEY, NODE_MISSING, Serve, node_json

from loopchat.engine.embedder import MAX_TOKENS

pytestmark = [pytest.mark.model, pytest.mark.server]

TEXTS = ["The cat sat on the mat.", "A cat is sitting on a mat.", "Stock markets fell sharply today."]
#: 161 tokens: three of the server's chunks of 64 (engine/embedder.py, chunk_for)
LONG = "The lighthouse keeper climbed the stairs every evening, counting each step as the storm gathered. " * 8


@pytest.fixture(scope="module")
def client(queue_one_server: Serve) -> OpenAI:
    return queue_one_server.client(KEY)


@pytest.fixture(scope="module")
def pooled(model_path: Path):
    """text -> (its tokens, llama.cpp's MEAN pooling of their pooled), from a Llama of its own."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(model_path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=512, n_batch=512, n_ubatch=512, verbose=False,
    )  # fmt: skip
    try:
        yield lambda text: (
            llm.tokenize(text.encode(), add_bos=True, special=False),
            np.array(llm.embed(text), dtype=np.float64),
        )
    finally:
        llm.close()


def recomputed(pooled, text: str) -> np.ndarray:
    _, mean = pooled(text)
    assert mean.shape == (576,)
    return mean / np.linalg.norm(mean)


def test_the_guide_s_call_gives_each_text_its_recomputed_unit_vector(client: OpenAI, pooled) -> None:
    """The SDK's default asks for base64 (float32 bytes) and decodes it: the vectors are the
    mean of the tokens' pooled over its length, to float32's precision; usage counts the tokens."""
    got = client.embeddings.create(model="text-embedding-3-small", input=[*TEXTS, LONG])
    assert [d.index for d in got.data] == [0, 1, 2, 3] and got.model == "smollm2-135m-instruct"
    vectors = np.array([d.embedding for d in got.data], dtype=np.float64)
    for text, v in zip([*TEXTS, LONG], vectors):
        np.testing.assert_allclose(v, recomputed(pooled, text), atol=2e-7)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-6
    counts = [len(pooled(t)[0]) for t in [*TEXTS, LONG]]
    assert counts[3] > 128 and got.usage.prompt_tokens == got.usage.total_tokens == sum(counts)
    assert got.model_extra["loopchat"] == {"pooling": "mean", "normalized": "l2", "tokens": counts}
    # what the guide uses them for: the two sentences about a cat are nearer each other than the third
    cos = vectors[:3] @ vectors[:3].T
    assert cos[0, 1] > max(cos[0, 2], cos[1, 2])


def test_float_and_base64_give_the_same_float32_values(client: OpenAI) -> None:
    as_float = client.embeddings.create(model="m", input="hello there", encoding_format="float").data[0].embedding
    as_base64 = client.embeddings.create(model="m", input="hello there").data[0].embedding
    assert as_float == as_base64 and len(as_float) == 576
    assert np.array_equal(np.array(as_float, dtype=np.float32).astype(np.float64), np.array(as_float))


def test_token_ids_are_embedded_as_given(client: OpenAI, pooled) -> None:
    tokens, _ = pooled(TEXTS[0])
    by_ids = client.embeddings.create(model="m", input=[tokens, tokens[:3]])
    by_text = client.embeddings.create(model="m", input=TEXTS[0])
    assert by_ids.data[0].embedding == by_text.data[0].embedding
    assert by_ids.usage.prompt_tokens == len(tokens) + 3
    one_list = client.embeddings.create(model="m", input=tokens)  # a list of ids: one input
    assert len(one_list.data) == 1 and one_list.data[0].embedding == by_text.data[0].embedding


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        ({"input": ""}, "input", "input: it is empty"),
        ({"input": []}, "input", "not empty"),
        ({"input": "word " * (MAX_TOKENS + 10)}, "input", f"more than the {MAX_TOKENS} an embedding takes: split it"),
        ({"input": [[1, 2], [999_999]]}, "input", "input[1]: token 999999 is not in the model's vocabulary"),
        ({"input": ["a", 3]}, "input", "input[1]: input must be a string"),
        ({"input": "hi", "dimensions": 256}, "dimensions", "have 576 dimensions, and cannot be cut to 256"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format", 'must be "float" or "base64"'),
    ],
)
def test_what_cannot_be_embedded_is_a_400_that_says_why(client: OpenAI, kwargs, param, words) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="m", **kwargs)
    assert info.value.param == param and words in info.value.message


def test_the_api_key_is_asked_for(queue_one_server: Serve) -> None:
    with pytest.raises(openai.AuthenticationError):
        queue_one_server.client("not-the-key").embeddings.create(model="m", input="hi")


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_openai_s_node_sdk_gets_the_same_vector(queue_one_server: Serve, client: OpenAI) -> None:
    """The guide with the Node SDK (tests/clients/tutorial_embeddings.mjs): its float call and its
    default (base64, decoded into a Float32Array) give the vector the Python SDK gets."""
    printed = node_json(queue_one_server, "tutorial_embeddings.mjs")
    python = client.embeddings.create(model="m", input="Your text string goes here").data[0].embedding
    assert printed["float"] == printed["default"] == python
    assert printed["usage"]["prompt_tokens"] > 0


def test_a_client_that_leaves_stops_its_embedding(queue_one_server: Serve) -> None:
    """200 inputs of ~300 tokens (minutes of work here): the client leaves after a second; the
    embedder stops at its next chunk (a 499 in the log), and the next request is answered at once,
    not after the rest of that work (one embedding runs at a time)."""
    server, mark = queue_one_server, len(queue_one_server.err)
    body = {"model": "m", "input": [LONG * 2] * 200}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=1.0)
    server.wait_for(r"POST /v1/embeddings 499 · embeddings · the client disconnected", start=mark)
    quick = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert len(quick.embeddings.create(model="m", input="still here").data[0].embedding) == 576


def test_ctrl_c_ends_an_embedding_in_flight_with_a_503() -> None:
    """SIGINT while a long embedding runs: it stops at its next chunk, its client gets a 503
    (shutting_down), and the server ends within uvicorn's grace (not cancelling the request at its
    end, with a traceback)."""
    server = Serve()
    try:
        got: list[httpx.Response] = []
        body = {"model": "m", "input": [LONG * 2] * 200}
        post = threading.Thread(
            target=lambda: got.append(httpx.post(server.url + "/v1/embeddings", json=body, timeout=120))
        )
        post.start()
        while not httpx.get(server.url + "/health", timeout=10).json()[
            "embedding"
        ]:  # (its state, asked until it says so)
            assert post.is_alive()
        server.proc.send_signal(signal.SIGINT)
        server.proc.wait(30)
        post.join(30)
        server.wait_for(r"loopchat serve: stopped \(SIGINT\)")
        assert not any("graceful shutdown exceeded" in line or "Traceback" in line for line in server.err)
        assert got and got[0].status_code == 503 and got[0].json()["error"]["code"] == "shutting_down"
        server.wait_for(r"POST /v1/embeddings 503 · loopchat serve is shutting down")
    finally:
        server.stop()
