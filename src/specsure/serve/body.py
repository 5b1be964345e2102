"""The request body: read within a size limit, parsed as JSON, refused where no field could take it.

Every check here names where the fault is (OpenAI's ``param``: ``temperature``, ``messages[0].content``),
so a NaN, a huge integer or a lone surrogate is a 400 about that field, never a 500 deeper in.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request

from specsure.serve.errors import APIError, RequestError, shown

MAX_BODY_BYTES = 16 * 2**20
"""The largest request body kept; a larger one is a 413, never parsed."""
READ_TO_END_BYTES = 4 * MAX_BODY_BYTES
"""A body over MAX_BODY_BYTES up to this is read and dropped before its 413; one that declares
more gets the 413 at once (a client would otherwise hold the request open for its gigabytes)."""
MAX_JSON_DEPTH = 64
"""The most levels of arrays and objects a body may nest. A chat content part sits 5 deep, but a
response_format's schema written inline takes two levels for each object in it (properties, then
the property), and a tool's parameters as many."""
MAX_INT = 2**64
"""No field takes an integer this large (seeds stop just below it); a larger one is refused while
parsing, before any arithmetic on it can overflow."""


WHOLE_NUMBER_FIELDS = frozenset({
    "max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens", "n", "best_of", "seed", "top_k",
    "top_logprobs", "prompt_logprobs", "truncate_prompt_tokens"})
"""Top-level integer fields that take a whole float too (2.0 as 2), as vLLM's lax validation does:
JavaScript clients send every number as a float."""


def parse_json(raw: bytes) -> Any:
    """The body as JSON that every field parser can trust: finite numbers, valid Unicode, shallow."""
    example = 'send a JSON object such as {"prompt": "Hello", "max_tokens": 16}.'
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError(f"the request body nests too deeply to parse; {example}") from None
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: it is not UTF-8 ({exc}); {example}") from None
    except json.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON ({exc}); {example}") from None
    except ValueError:  # an integer with more digits than Python converts (sys.get_int_max_str_digits)
        raise RequestError(f"the request body holds an integer too long to read; no field takes one that large. "
                           f"{example[0].upper()}{example[1:]}") from None
    _check_values(body)
    if isinstance(body, dict):
        for name in WHOLE_NUMBER_FIELDS & body.keys():
            if isinstance(value := body[name], float) and value.is_integer() and abs(value) < MAX_INT:
                body[name] = int(value)
    return body


def _check_values(body: Any) -> None:
    """Refuse NaN, Infinity, huge integers, lone surrogates and deep nesting, naming where they are."""
    todo: list[tuple[Any, str, int]] = [(body, "", 0)]
    while todo:
        value, path, depth = todo.pop()
        name = path or "the request body"
        if isinstance(value, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise RequestError(f"{name} nests too deeply: more than {MAX_JSON_DEPTH} levels of arrays and "
                                   "objects. A JSON Schema nests less with its objects under $defs, each named by a "
                                   "$ref.", path or None)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _check_text(key, f"a field name in {name}", path)
                    child = f"{path}.{key}" if path else key
                else:
                    child = f"{path}[{key}]"
                todo.append((item, child, depth + 1))
        elif isinstance(value, float) and not math.isfinite(value):
            raise RequestError(f"{name} = {value} is not a number JSON allows: NaN and Infinity are not JSON "
                               "(RFC 8259), and a number too large for a double reads as Infinity. Send a finite "
                               "number.", path or None)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
            raise RequestError(f"{name} = {shown(value)} is out of range: no field of this API takes an integer "
                               "of 2**64 or more.", path or None)
        elif isinstance(value, str):
            _check_text(value, name, path)


def _check_text(text: str, name: str, path: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"{name} is not valid Unicode: it holds the lone surrogate "
                               f"{text[exc.start]!r} at index {exc.start} (a \\ud800-\\udfff escape without its "
                               "pair). Send valid UTF-8 text.", path or None) from None


async def read_body(request: Request) -> bytes:
    """The raw body; a 413 when it passes MAX_BODY_BYTES. A larger body is read to its end but not
    kept, so the client gets the 413 rather than a connection reset while it is still sending; one
    that declares more than READ_TO_END_BYTES gets it at once. A compressed body is a 415: it would
    otherwise read as JSON that is not UTF-8; so is one that says it is not JSON."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise APIError(f"Content-Encoding {encoding!r}: this server reads request bodies uncompressed; send the JSON "
                       "as it is, without the Content-Encoding header.", 415, code="unsupported_content_encoding")
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    # A web page may POST text/plain or a form to any server without asking it first (no CORS
    # preflight); read as JSON, such a body would start a generation for any site the browser visits.
    if media and media != "application/json" and not media.endswith("+json"):
        raise APIError(f"Content-Type {media!r}: this server reads JSON request bodies; send the body with "
                       "Content-Type: application/json (curl -d sends a form's type unless given "
                       "-H 'Content-Type: application/json').", 415, code="unsupported_media_type")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > READ_TO_END_BYTES:
        raise APIError(f"the request body declares {int(declared) / 2**20:,.1f} MiB, more than the "
                       f"{MAX_BODY_BYTES // 2**20} MiB this server reads; send a shorter prompt.", 413,
                       code="body_too_large")
    body, size = bytearray(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= MAX_BODY_BYTES:
            body += chunk
    if size > MAX_BODY_BYTES:
        raise APIError(f"the request body is {size / 2**20:.1f} MiB, more than the {MAX_BODY_BYTES // 2**20} MiB "
                       "this server reads; send a shorter prompt.", 413, code="body_too_large")
    return bytes(body)


def flag(body: dict[str, Any], key: str, default: bool, where: str | None = None) -> bool:
    """The body's boolean ``key``; ``default`` when absent or null. ``where``: the field's name in
    errors (``stream_options.include_usage``), ``key`` by default."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{where or key} = {shown(value)} must be true or false.", where or key)
    return value
