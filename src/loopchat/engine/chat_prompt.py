"""What the model reads: the conversation rendered by the chat template, and the context
policy that drops the oldest messages when the conversation outgrows the context window.

The engine (engine.py) supplies the tokenizer; nothing here touches llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from loopchat.errors import ContextOverflowError, EngineError, ModelLoadError
from loopchat.events import DOCUMENT, ContextTrimmed, Message

if TYPE_CHECKING:
    from llama_cpp.llama_types import ChatCompletionRequestMessage

    from loopchat.request import ReplyRequest

CONTEXT_POLICY = (
    "drop the oldest messages (the system prompt is kept) until the prompt leaves room "
    "for the reply: max_tokens, at most a quarter of n_ctx"
)

#: Used when a GGUF carries no chat template of its own (and none is configured).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


CHAT = "chat"
COMPLETION = "completion"
#: what the chat says when a model opens in completion mode for want of a chat template
NO_TEMPLATE_NOTE = "completion mode: this model has no chat template; set chat_template in models.toml for chat"


def opening_mode(configured: str | None, template_source: str) -> str:
    """The mode the chat opens a model in: models.toml's `mode` if set, else completion
    for a model whose GGUF has no chat template and none configured (template_source
    "fallback": it would be fed ChatML it has never seen), else chat."""
    if configured is not None:
        return configured
    return COMPLETION if template_source == "fallback" else CHAT


def template_note(name: str, template_source: str) -> str:
    """What a user should know about the chat template ('' when the model has its own or
    models.toml sets one)."""
    if template_source != "fallback":
        return ""
    return (
        f"{name} has no chat template in its GGUF file: chat messages are written in "
        "ChatML (<|im_start|>...), which a base model has never seen; set chat_template "
        "for it in models.toml, or give it a document to continue (loopchat run --raw)"
    )


class ChatTemplate:
    """A model's chat template, compiled (by llama-cpp-python's Jinja2ChatFormatter: its
    sandboxed environment and extensions, as the model's authors expect)."""

    def __init__(self, template: str, *, bos_token: str, eos_token: str, model: str, configured: bool) -> None:
        """ModelLoadError, naming the model and what to set, if `template` does not compile.
        configured: it comes from models.toml (else from the GGUF file)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.template = template
        try:
            self._formatter = Jinja2ChatFormatter(
                template=template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=True
            )
        except Exception as exc:  # jinja2's TemplateSyntaxError and friends
            from loopchat.config import template_error_text

            if configured:
                where, fix = "chat_template", "fix it in models.toml, or remove it to use the model's own"
            else:
                where, fix = "the chat template in its GGUF file", "set a chat_template for it in models.toml"
            raise ModelLoadError(
                f"model {model!r}: {where} is not a valid Jinja template ({template_error_text(exc)}); {fix}"
            ) from None

    def render(self, messages: Sequence[Message]) -> str:
        """The exact text the template renders for this conversation."""
        try:
            # {role, content} dicts, as templates read them (llama-cpp-python types them per role)
            wanted = cast("list[ChatCompletionRequestMessage]", [m.to_dict() for m in messages])
            return self._formatter(messages=wanted).prompt
        except Exception as exc:  # a template error is the user's (or the model's) to fix
            raise EngineError(f"the chat template failed to render: {exc}") from None


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    messages: tuple[Message, ...]  # those kept
    text: str
    tokens: list[int]
    trimmed: ContextTrimmed | None  # None if nothing was dropped


def fit_document(text: str, n_ctx: int, tokenize: Callable[[str], list[int]]) -> FittedPrompt:
    """A document (completion mode): its text as it is, no template, no trimming (the
    model continues the end of it, so dropping its start would change what it continues)."""
    if not text:
        raise EngineError("the document is empty: give the text for the model to continue")
    tokens = tokenize(text)
    if len(tokens) >= n_ctx:
        raise ContextOverflowError(
            f"the document is too long for the context: it is {len(tokens)} tokens and the "
            f"model's context holds {n_ctx}; shorten it or raise n_ctx in models.toml"
        )
    return FittedPrompt((Message(DOCUMENT, text),), text, tokens, None)


def prompt_of(request: ReplyRequest, host: Any, max_tokens: int) -> FittedPrompt:
    """The request's prompt on `host` (a RunHost): its token ids as given, or its messages fitted."""
    if request.prompt_ids:
        return given_document(request.prompt_ids, host.n_vocab, host.n_ctx, host.token_texts)
    return host.fit_prompt(request.messages, max_tokens)


def given_document(
    ids: Sequence[int], n_vocab: int, n_ctx: int, texts: Callable[[Sequence[int]], tuple[str, ...]]
) -> FittedPrompt:
    """A document given as token ids (ReplyRequest.prompt_ids): evaluated as they are (no
    template, no trimming); its text, their pieces' (`texts`: the host's token_texts)."""
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise EngineError(
            f"prompt token {bad} is not in the model's vocabulary (0 to {n_vocab - 1}): token ids must be "
            "this model's; or send the text"
        )
    if len(ids) >= n_ctx:
        raise ContextOverflowError(
            f"the document is too long for the context: it is {len(ids)} tokens and the "
            f"model's context holds {n_ctx}; shorten it or raise n_ctx in models.toml"
        )
    text = "".join(texts(ids))
    return FittedPrompt((Message(DOCUMENT, text),), text, list(ids), None)


def fit_prompt(
    messages: Sequence[Message],
    max_tokens: int,
    n_ctx: int,
    render: Callable[[Sequence[Message]], str],
    tokenize: Callable[[str], list[int]],
) -> FittedPrompt:
    """Render and tokenize; apply the context policy (CONTEXT_POLICY) if needed."""
    msgs = tuple(messages)
    if not msgs:
        raise EngineError("the conversation is empty: type a message first")
    text = render(msgs)
    tokens = tokenize(text)
    reserve = max(1, min(max_tokens, n_ctx // 4))
    if len(tokens) + reserve <= n_ctx:
        return FittedPrompt(msgs, text, tokens, None)
    before = len(tokens)
    system = tuple(m for m in msgs[:1] if m.role == "system")
    rest = list(msgs[len(system) :])
    dropped = 0
    while len(rest) > 1 and len(tokens) + reserve > n_ctx:
        rest.pop(0)
        dropped += 1
        # never start the kept history with an assistant turn
        while len(rest) > 1 and rest[0].role == "assistant":
            rest.pop(0)
            dropped += 1
        text = render(system + tuple(rest))
        tokens = tokenize(text)
    if len(tokens) >= n_ctx:
        raise ContextOverflowError(
            f"the message is too long for the context: the prompt is {len(tokens)} tokens "
            f"and the model's context holds {n_ctx}; shorten the message or raise n_ctx "
            "in models.toml"
        )
    kept = system + tuple(rest)
    trimmed = ContextTrimmed(
        policy=CONTEXT_POLICY,
        dropped_messages=dropped,
        prompt_tokens_before=before,
        prompt_tokens_after=len(tokens),
        n_ctx=n_ctx,
    )
    return FittedPrompt(kept, text, tokens, trimmed if dropped else None)
