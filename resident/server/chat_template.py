"""The chat template: how /v1/chat/completions turns messages into one prompt string.

Resolution (`load_chat_template`), first found wins, in the checkpoint directory:
1. `chat_template.jinja` (where transformers 5 saves it);
2. `tokenizer_config.json`'s `chat_template` (a string, or a list of {name, template}: the one
   named "default");
3. FALLBACK_TEMPLATE, ChatML as Qwen uses it, for configs without one (the random-weight
   configs ship no tokenizer files at all).

Templates are Hub code, so they run in jinja2's ImmutableSandboxedEnvironment with the
environment transformers renders them in (trim_blocks, lstrip_blocks, loop controls, the
`{% generation %}` tag, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII),
and the usual context: `messages`, `add_generation_prompt` (true), `bos_token`, `eos_token`
(the strings tokenizer_config.json names, else ""), no `tools`. This module imports jinja2,
never torch: it runs in the API process.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger("resident.api")

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
FALLBACK_NAME = "chatml (fallback)"
# ChatML as Qwen's templates write it, without tools or thinking
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """Messages the template refused (its raise_exception) or could not render."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders
    its body; we have no use for the mask."""

    tags = {"generation"}

    def parse(self, parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace without underscore-prefixed attributes (as transformers hardens it:
    they would reach CPython internals)."""

    def __init__(*args, **kwargs) -> None:  # noqa: N805 - jinja's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r}")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters, which a prompt must not see
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    return env


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with.

    Raises ValueError naming `source` when the template does not compile."""

    def __init__(self, source: str, text: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source  # where it came from: a path, or FALLBACK_NAME
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(text)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"the chat template {source} does not compile: line "
                             f"{error.lineno}: {error.message}") from None

    def render(self, messages: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
        """The prompt for `messages` (each {"role", "content": str}), ending with the assistant
        turn's opening. `extra`: more template variables (the request's chat_template_kwargs),
        which cannot replace the standard ones. Raises ChatTemplateError."""
        context = {**(extra or {}), "messages": messages, "add_generation_prompt": True,
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            return self._template.render(context)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as error:  # SecurityError, UndefinedError, ...
            raise ChatTemplateError(f"{type(error).__name__}: {error}") from None
        except Exception as error:  # noqa: BLE001 - template code on client data: a 400,
            # never a crash (a TypeError adding a list to a string, ...)
            raise ChatTemplateError(f"{type(error).__name__}: {error}") from None


def load_chat_template(model_dir: str | None) -> ChatTemplate:
    """The checkpoint's chat template, in the order the module docstring gives, else the
    ChatML fallback. Raises ValueError for an unreadable or malformed template or config."""
    directory = Path(model_dir) if model_dir else None
    config = _tokenizer_config(directory) if directory else {}
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    if directory and (directory / TEMPLATE_FILE).is_file():
        path = directory / TEMPLATE_FILE
        return ChatTemplate(str(path), path.read_text(encoding="utf-8"), bos, eos)
    text = _config_template(config.get("chat_template"), directory)
    if text is not None:
        return ChatTemplate(str(directory / TOKENIZER_CONFIG), text, bos, eos)
    if directory:
        log.info("%s has no chat template; chat uses the ChatML fallback", directory)
    return ChatTemplate(FALLBACK_NAME, FALLBACK_TEMPLATE, bos, eos)


def _tokenizer_config(directory: Path) -> dict[str, Any]:
    path = directory / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")
    return config


def _config_template(value: Any, directory: Path | None) -> str | None:
    """tokenizer_config.json's `chat_template`: a string, or named templates (the "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(f"{directory / TOKENIZER_CONFIG}: 'chat_template' must be a string or a "
                     f"list of named templates with a 'default'")


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
