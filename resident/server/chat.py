"""OpenAI `/v1/chat/completions` request bodies, validated into what the engine takes.

The messages are checked, rendered by the chat template (chat_template.py) into one prompt
string and tokenized without the tokenizer's own special tokens (the template writes them).
The fields both endpoints share (sampling, `stop`, `n`, `stream_options`) are validation.py's.
Chat's own: `max_completion_tokens` (else `max_tokens`; with neither, up to max_model_len),
`logprobs` (true/false) with `top_logprobs` (0..20), and vLLM's `chat_template_kwargs` (more
template variables, e.g. `enable_thinking`). Tools, functions and structured output are not
supported: those fields are refused unless they hold their neutral value.
"""

from __future__ import annotations

from typing import Any

from resident.server.chat_template import ChatTemplate, ChatTemplateError
from resident.server.tokenizer import Tokenizer
from resident.server.validation import (
    PENALTIES,
    VLLM_EXTENSIONS,
    CompletionRequest,
    bad_request,
    bool_field,
    check_body,
    check_neutral,
    check_unicode,
    encode_text,
    generation_request,
    int_field,
    logprobs_count,
    show,
)

ROLES = ("system", "developer", "user", "assistant", "tool")
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    **PENALTIES,
    **VLLM_EXTENSIONS,
}


def parse_chat_request(body: Any, tokenizer: Tokenizer, template: ChatTemplate,
                       model_name: str, vocab_size: int, max_model_len: int
                       ) -> CompletionRequest:
    """Validates a /v1/chat/completions body; its prompt_ids are the rendered messages'.

    Raises ApiError: 404 for another model's name, 400 naming the field (or the template's
    refusal) for anything else. Unknown fields are ignored; null means a field's default."""
    check_neutral(check_body(body, model_name), _NEUTRAL)
    messages = _messages(body.get("messages"))
    try:
        text = template.render(messages, _template_kwargs(body))
    except ChatTemplateError as error:
        raise bad_request(f"the chat template refused the messages: {error}") from None
    prompt_ids = encode_text(text, "messages", tokenizer, vocab_size, add_special_tokens=False)
    return generation_request(body, prompt_ids, _max_tokens(body, len(prompt_ids), max_model_len),
                              _logprobs(body), vocab_size, max_model_len)


def _messages(value: Any) -> list[dict[str, str]]:
    """The messages as the template sees them: {"role", "content"} with text content."""
    if value is None:
        raise bad_request("'messages' is required")
    if not isinstance(value, list):
        raise bad_request(f"'messages' must be a list of messages, got {show(value)}")
    if not value:
        raise bad_request("'messages' must not be empty")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(value)]


def _message(message: Any, name: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise bad_request(f"'{name}' must be an object with 'role' and 'content', got "
                          f"{show(message)}")
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(f"'{name}.role' must be one of {', '.join(ROLES)}; got {show(role)}")
    content = message.get("content")
    if content is None and role == "assistant":  # an assistant turn that only called tools
        content = ""
    return {"role": role, "content": _content(content, f"{name}.content")}


def _content(content: Any, name: str) -> str:
    """A string, or a list of text parts ({"type": "text", "text": ...}) joined by newlines
    (as vLLM flattens them for string-content templates)."""
    if isinstance(content, str):
        check_unicode(content, name)
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{name}' must be a string or a list of text parts, got "
                          f"{show(content)}")
    texts = []
    for i, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text"
                and isinstance(part.get("text"), str)):
            raise bad_request(f"'{name}[{i}]' must be a text part ({{\"type\": \"text\", "
                              f"\"text\": ...}}); this server takes text only, got {show(part)}")
        check_unicode(part["text"], f"{name}[{i}].text")
        texts.append(part["text"])
    return "\n".join(texts)


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise bad_request(f"'chat_template_kwargs' must be an object, got {show(kwargs)}")
    return kwargs


def _max_tokens(body: dict[str, Any], num_prompt_tokens: int, max_model_len: int) -> int:
    """`max_completion_tokens`, else `max_tokens`, else what max_model_len leaves."""
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            return int_field(body, name, 0)
    if num_prompt_tokens >= max_model_len:
        raise bad_request(f"the rendered messages are {num_prompt_tokens} tokens, which leaves "
                          f"no room to generate within max_model_len {max_model_len}")
    return max_model_len - num_prompt_tokens


def _logprobs(body: dict[str, Any]) -> int | None:
    """Chat's form: `logprobs: true` for each token's logprob, `top_logprobs` for how many
    alternatives come with it."""
    top = logprobs_count(body, "top_logprobs")
    if not bool_field(body, "logprobs", False):
        if top:
            raise bad_request("'top_logprobs' needs 'logprobs': true")
        return None
    return top or 0
