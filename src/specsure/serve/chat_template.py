"""The chat template the server renders messages with (the tokenizer's, or ``--chat-template``'s),
and what a request may tell it: ``chat_template_kwargs``, ``add_generation_prompt``, ``continue_final_message``."""

from __future__ import annotations

from typing import Any

from specsure.decode.engine import Engine
from specsure.serve.body import flag
from specsure.serve.errors import RequestError, shown
from specsure.serve.tool_calls import check_parser
from specsure.serve.tools import Tools


TEMPLATE_OWN = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
                "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
                "add_special_tokens")
"""apply_chat_template's own arguments, which chat_template_kwargs may not set."""


class ChatTemplate:
    """How the server renders messages (and the tools offered) into a prompt."""

    def __init__(self, engine: Engine, override: str | None, tool_call_parser: str | None) -> None:
        """Raises ValueError for an override that is not a Jinja template, an unknown parser, or a parser
        (auto tool choice) with a template that never shows the tools."""
        if override is not None:
            _check_syntax(override)
        self.special_tags = check_parser(tool_call_parser, engine.tokenizer) if tool_call_parser is not None else False
        """The tool-call parser's tags are special tokens: answers that may call are decoded with them."""
        self._engine = engine
        tok = engine.tokenizer
        given = override or (getattr(tok, "chat_template", None) if tok is not None else None)
        # A tokenizer may hold named templates; transformers renders a request with tools with
        # "tool_use" where there is one, and every other request with "default".
        named = given if isinstance(given, dict) else {"default": given}
        self.shown: str | dict[str, str] | None = given
        """The template as /tokenizer_info shows it: text, or the named templates."""
        self.text: str | None = named.get("default")
        """The template requests without tools render with."""
        tool_text = named.get("tool_use") or self.text
        self._override = override
        if tool_call_parser is not None and self.text and "tools" not in (tool_text or ""):
            raise ValueError(f"tool_call_parser = {tool_call_parser!r} turns on tool_choice auto, but the chat "
                             "template never mentions tools, so the model would never see them; give a "
                             "--chat-template that renders tools, or leave out --enable-auto-tool-choice "
                             "(required and named tool choices still work).")

    def check(self, model_name: str) -> None:
        """Refuse what this template cannot render."""
        if self._engine.tokenizer is None or not self.text:
            raise RequestError(f"model {model_name!r} has no chat template (no tokenizer, or one without "
                               "chat_template), so messages cannot be rendered; use POST /v1/completions, or start "
                               "the server with --chat-template.", "messages")

    def render(self, messages: list[dict[str, Any]], tools: Tools | None = None,
               add_generation_prompt: bool = True, variables: dict[str, Any] | None = None,
               continue_final_message: bool = False) -> list[int]:
        """The prompt's token ids; ``variables``: the request's chat_template_kwargs;
        ``continue_final_message``: the last message left open, for the answer to continue. A
        template's error is the client's 400."""
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        try:
            ids = self._engine.tokenizer.apply_chat_template(
                messages, tools=tools.for_template() if tools is not None else None, chat_template=self._override,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                tokenize=True, return_dict=False, **(variables or {}))
        except TemplateError as exc:
            if variables:  # a variable the template could not use is as likely as the messages
                raise RequestError(f"the chat template rejected these messages or chat_template_kwargs: {exc}. Fix "
                                   "them, or use POST /v1/completions with a plain prompt.",
                                   "chat_template_kwargs") from None
            raise RequestError(f"the chat template rejected these messages: {exc}. Fix the messages (for example "
                               "the order of roles), or use POST /v1/completions with a plain prompt.",
                               "messages") from None
        except (ValueError, TypeError, ArithmeticError) as exc:
            if continue_final_message and isinstance(exc, ValueError) and "final message" in str(exc):
                # transformers cuts the rendered text after the last message's content; a template that
                # does not write that content verbatim leaves nothing to cut at.
                raise RequestError(f"continue_final_message: the chat template could not leave the last message "
                                   f"open ({exc}); send the message's content as plain text, or use POST "
                                   "/v1/completions with the prompt written out.", "continue_final_message") from None
            if not variables:
                raise
            # transformers hands the variables to Jinja as they are: one of the wrong type fails inside it.
            raise RequestError(f"the chat template could not use chat_template_kwargs ({type(exc).__name__}: {exc}); "
                               "send the variables with the types the template expects.",
                               "chat_template_kwargs") from None
        return [int(t) for t in ids]


def _check_syntax(template: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # as transformers compiles templates

    try:
        ImmutableSandboxedEnvironment().parse(template)
    except TemplateSyntaxError as exc:
        raise ValueError(f"chat_template is not a valid Jinja template: {exc.message} (line {exc.lineno}); fix the "
                         "template given with --chat-template.") from None


def template_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message), vLLM's chat fields: at most one of them true."""
    opens, continues = (flag(body, key, default) for key, default in (("add_generation_prompt", True),
                                                                       ("continue_final_message", False)))
    if opens and continues:
        raise RequestError("continue_final_message continues the last message, and add_generation_prompt opens a new "
                           'assistant turn after it; send "add_generation_prompt": false with it.',
                           "continue_final_message")
    return opens, continues


def parse_template_kwargs(value: Any) -> dict[str, Any] | None:
    """The request's ``chat_template_kwargs``: an object, with none of apply_chat_template's own arguments."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError(f"chat_template_kwargs = {shown(value)} must be an object of variables for the chat "
                           'template, e.g. {"enable_thinking": false}.', "chat_template_kwargs")
    for key in value:
        if key in TEMPLATE_OWN:
            field = ("messages" if key in ("conversation", "messages") else key if key in (
                "tools", "add_generation_prompt", "continue_final_message") else None)
            fix = f"send it as the request's {field}" if field else "remove it"
            raise RequestError(f"chat_template_kwargs.{key} is set by the server, not by a template variable; {fix}.",
                               f"chat_template_kwargs.{key}")
    return value
