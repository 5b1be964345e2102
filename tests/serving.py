"""Serving helpers for the tests: the tiny chat model and a real uvicorn server; test-only code."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from specsure.decode.engine import Engine
from tiny import build_tiny_llama

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
WORDS = "w5 w6 w7 w8 w5 w6 w7 w8 w5"
PROMPT_IDS = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9]
CHAT = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": WORDS}]

TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
            "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def build_tiny_chat_model(folder: Path) -> Path:
    """The tiny Llama (vocab 128) plus a word-level tokenizer over that vocabulary and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    words = [*special, "user", "assistant", "system", *(f"w{i}" for i in range(120))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(special)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<pad>")
    fast.chat_template = TEMPLATE
    build_tiny_llama(folder, vocab_size=len(words))
    fast.save_pretrained(folder)
    return folder


def tiny_chat_engine(tmp_path_factory: pytest.TempPathFactory, name: str) -> Engine:
    """An ngram engine (float32) on a fresh tiny chat model; one per test module."""
    from specsure import make_engine

    return make_engine(str(build_tiny_chat_model(tmp_path_factory.mktemp(name))), NGRAM, dtype="float32")


def metric(text: str, name: str, **labels: str) -> float:
    """A sample's value from a Prometheus text page (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@contextmanager
def serving(app) -> Iterator[str]:  # noqa: ANN001 - a FastAPI app
    """Run ``app`` under uvicorn on 127.0.0.1 and a free port, in a thread; yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started, "uvicorn did not start within 10 s"
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive(), "uvicorn did not stop within 10 s"


class Trace:
    """Wraps the engine's scheduler: each step takes ``step_s`` more; records starts, ends and closes.

    Events are ``(what, max_tokens, steps)``, so tests tag requests by their max_tokens. A request
    aborted before its last update is 'closed'; one that reached it is 'end'.
    """

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()
        scheduler = engine.scheduler
        real_step, real_abort = scheduler.step, scheduler.abort
        steps: dict[int, int] = {}  # id(request) -> steps it took part in
        keep: list[object] = []  # holds the requests, so their ids stay theirs

        def step():  # noqa: ANN202
            updates = real_step()
            for request, update in updates:
                tag = request.params.max_tokens
                if id(request) not in steps:
                    keep.append(request)
                    steps[id(request)] = 0
                    self._log("start", tag, 0)
                steps[id(request)] += 1
                if update.completion is not None:
                    self._log("end", tag, steps[id(request)])
            time.sleep(step_s)
            return updates

        def abort(request) -> None:  # noqa: ANN001
            if id(request) in steps and request.completion is None:
                self._log("closed", request.params.max_tokens, steps[id(request)])
            real_abort(request)

        monkeypatch.setattr(scheduler, "step", step)
        monkeypatch.setattr(scheduler, "abort", abort)

    def _log(self, what: str, tag: int, steps: int) -> None:
        with self.lock:
            self.events.append((what, tag, steps))

    def wait_for(self, what: str, tag: int, timeout: float = 20) -> tuple[str, int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [e for e in self.events if e[:2] == (what, tag)]
            if found:
                return found[0]
            time.sleep(0.01)
        raise AssertionError(f"no {what!r} for max_tokens={tag} in {self.events}")
