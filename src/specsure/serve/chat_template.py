"""The chat template the server renders messages with: the tokenizer's, or ``--chat-template``'s."""

from __future__ import annotations

from typing import Any

from specsure.decode.engine import Engine
from specsure.serve.errors import RequestError
from specsure.serve.tool_calls import check_parser
from specsure.serve.tools import Tools


class ChatTemplate:
    """How the server renders messages (and the tools offered) into a prompt."""

    def __init__(self, engine: Engine, override: str | None, tool_call_parser: str | None) -> None:
        """Raises ValueError for an override that is not a Jinja template, or a parser this tokenizer hides."""
        if override is not None:
            _check_syntax(override)
        if tool_call_parser is not None:
            check_parser(tool_call_parser, engine.tokenizer)
        self._engine = engine
        tok = engine.tokenizer
        self.text: str | None = override or (getattr(tok, "chat_template", None) if tok is not None else None)
        if isinstance(self.text, dict):  # a tokenizer with several named templates: the default one
            self.text = self.text.get("default")
        self._override = override
        self._parser = tool_call_parser
        self.renders_tools = bool(self.text) and "tools" in self.text
        """Whether the template mentions ``tools``; one that does not never shows them to the model."""

    def check(self, model_name: str, tools: Tools | None) -> None:
        """Refuse what this template cannot render."""
        if self._engine.tokenizer is None or not self.text:
            raise RequestError(f"model {model_name!r} has no chat template (no tokenizer, or one without "
                               "chat_template), so messages cannot be rendered; use POST /v1/completions, or start "
                               "the server with --chat-template.", "messages")
        if tools is not None and tools.choice == "auto" and not self.renders_tools:
            raise RequestError(f"tool_choice auto: the chat template of {model_name!r} does not render tools, so "
                               "the model would never see them; start the server with a --chat-template that "
                               f"renders tools in the {self._parser} format, or send \"tool_choice\": \"required\" "
                               "or a named function (enforced, though the model sees no tools).", "tool_choice")

    def render(self, messages: list[dict[str, Any]], tools: Tools | None = None,
               add_generation_prompt: bool = True) -> list[int]:
        """The prompt's token ids; a template's error is the client's 400."""
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        try:
            ids = self._engine.tokenizer.apply_chat_template(
                messages, tools=tools.for_template() if tools is not None else None, chat_template=self._override,
                add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False)
        except TemplateError as exc:
            raise RequestError(f"the chat template rejected these messages: {exc}. Fix the messages (for example "
                               "the order of roles), or use POST /v1/completions with a plain prompt.",
                               "messages") from None
        return [int(t) for t in ids]


def _check_syntax(template: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # as transformers compiles templates

    try:
        ImmutableSandboxedEnvironment().parse(template)
    except TemplateSyntaxError as exc:
        raise ValueError(f"chat_template is not a valid Jinja template: {exc.message} (line {exc.lineno}); fix the "
                         "template given with --chat-template.") from None
