"""The HTTP side: OpenAI's routes on FastAPI, what each request asked for checked before it
reaches the engine, and each answer made from the request's output queue (vLLM's
serving_completion.py and serving_chat.py, in one file).

    POST /v1/completions        a prompt (text, or token ids) -> its continuation
    POST /v1/chat/completions   messages, through the model's chat template -> the reply
    GET  /v1/models  /health  /metrics

Either answer comes whole (JSON), or streamed as server-sent events, a chunk a step and then
`data: [DONE]` (sse-starlette's EventSourceResponse frames them, and it notices a client that
goes away: the stream is cancelled, and the request aborted, its pages back at once).

A bad request gets OpenAI's error JSON, {"error": {"message", "type", "param", "code"}}, with
status 400 (404 for a model this server does not serve, as vLLM and OpenAI answer), before
anything reaches the engine: a bad request never touches the requests running beside it.

The routes are functions of this module on one APIRouter, in the order a request travels:
each reads the engine, the tokenizer and the model's name from app.state (Served, set once by
build_app), as vLLM's entrypoints/openai/api_server.py reads its engine client there.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from sse_starlette import EventSourceResponse

from mini_engine.server.async_engine import AsyncEngine, EngineDead, Output, Request
from mini_engine.server.detokenizer import Detokenizer

# Sampling options mini_engine does not have: accepted only at the value that changes nothing
NEUTRAL = {"n": 1, "best_of": 1, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
           "presence_penalty": 0.0, "frequency_penalty": 0.0, "logprobs": None, "echo": False}


TYPE_ERRORS = {"prompt": "prompt must be a string, or a list of token ids (integers)",
               "messages": "messages must be a list of {role, content} with text content"}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def error_json(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status)


class Sampling(BaseModel):
    """What both routes share. Strict types: a prompt of numbers in quotes is refused, not
    guessed at. Fields OpenAI has and mini_engine does not are ignored (seed, user...)."""
    model_config = ConfigDict(extra="allow")
    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: float | None = None     # None: OpenAI's default, 1
    stop: StrictStr | list[StrictStr] | None = None
    stream: bool = False
    stream_options: dict | None = None
    min_tokens: StrictInt = 0            # vLLM's extensions
    ignore_eos: bool = False

    def unsupported(self) -> str | None:
        """The first option asked for at a value mini_engine cannot honour."""
        for name, neutral in NEUTRAL.items():
            value = (self.model_extra or {}).get(name, neutral)
            # top_k 0 and logprobs false say "none" too, in vLLM's and the chat API's words
            if value != neutral and (name, value) not in (("top_k", 0), ("logprobs", False)):
                return name
        return None


class CompletionBody(Sampling):
    prompt: StrictStr | list[StrictInt]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr


class ChatBody(Sampling):
    messages: list[Message]
    max_completion_tokens: StrictInt | None = None


@dataclass
class Served:
    """What every route reads, kept on app.state by build_app."""
    engine: AsyncEngine
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int       # the ids both the tokenizer and the model's embedding know


def served(http: HttpRequest) -> Served:
    return http.app.state.served


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.served.engine.attach(asyncio.get_running_loop())
    yield


def build_app(engine: AsyncEngine, tokenizer, model_name: str, max_model_len: int) -> FastAPI:
    app = FastAPI(title="mini_engine", lifespan=lifespan)
    app.state.served = Served(engine, tokenizer, model_name, max_model_len,
                              min(len(tokenizer), engine.engine.model.shape.vocab_size))
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(BadRequest, refused)
    app.include_router(router)
    return app


async def invalid(_, exc: RequestValidationError):
    """Malformed JSON, a missing field, a field of the wrong type: 400, as vLLM answers."""
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return error_json(f"the body is not valid JSON ({first['msg']})")
    field = str(first["loc"][1]) if len(first["loc"]) > 1 else None
    message = TYPE_ERRORS.get(field, f"{field}: {first['msg']}")
    return error_json(message, 400, field)


async def refused(_, exc: BadRequest):
    return error_json(str(exc), exc.status, exc.param)


router = APIRouter()


@router.get("/health")
async def health(http: HttpRequest):
    return Response(status_code=503 if served(http).engine.error else 200)


@router.get("/v1/models")
async def models(http: HttpRequest):
    s = served(http)
    return {"object": "list", "data": [{"id": s.model_name, "object": "model",
                                        "owned_by": "mini_engine",
                                        "max_model_len": s.max_model_len}]}


@router.get("/metrics")
async def metrics(http: HttpRequest):
    registry = served(http).engine.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/completions")
async def completions(body: CompletionBody, http: HttpRequest):
    s = served(http)
    ids = (body.prompt if isinstance(body.prompt, list) else
           s.tokenizer.encode(body.prompt) if body.prompt else [])
    max_tokens = 16 if body.max_tokens is None else body.max_tokens   # OpenAI's default
    request = admit(s, body, ids, max_tokens)
    return await answer(s, http, body, request, Answer("text_completion", s.model_name))


@router.post("/v1/chat/completions")
async def chat(body: ChatBody, http: HttpRequest):
    s = served(http)
    messages = [m.model_dump() for m in body.messages]
    try:
        text = s.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=False)
    except Exception as e:   # the template's own refusal (a role it does not know...)
        raise BadRequest(f"the chat template refused the messages: {e}", "messages")
    ids = s.tokenizer.encode(text, add_special_tokens=False)
    wanted = body.max_tokens if body.max_completion_tokens is None else \
        body.max_completion_tokens             # OpenAI's newer name first
    request = admit(s, body, ids, wanted)
    return await answer(s, http, body, request, Answer("chat.completion", s.model_name))


def admit(s: Served, body: Sampling, prompt_ids: list[int], max_tokens: int | None) -> Request:
    """The request as the engine gets it, or BadRequest saying what is wrong with it."""
    if body.model != s.model_name:
        raise BadRequest(f"The model `{body.model}` does not exist.", "model", 404)
    if (name := body.unsupported()) is not None:
        raise BadRequest(f"{name} is not supported by mini_engine (only {NEUTRAL[name]})",
                         name)
    if not prompt_ids:
        raise BadRequest("the prompt is empty", "prompt")
    if any(not 0 <= t < s.vocab_size for t in prompt_ids):
        raise BadRequest(f"a token id of the prompt is outside the vocabulary (0 to "
                         f"{s.vocab_size - 1})", "prompt")
    max_model_len = s.max_model_len
    if max_tokens is None:                      # vLLM's default: as many as fit
        max_tokens = max_model_len - len(prompt_ids)
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    if len(prompt_ids) + max_tokens > max_model_len:
        raise BadRequest(f"This model's maximum context length is {max_model_len} tokens. "
                         f"However, you requested {len(prompt_ids) + max_tokens} tokens "
                         f"({len(prompt_ids)} in the prompt, {max_tokens} in the "
                         "completion).", "max_tokens")
    temperature = 1.0 if body.temperature is None else body.temperature
    if not 0.0 <= temperature <= 2.0:
        raise BadRequest(f"temperature must be in [0, 2], got {temperature}.",
                         "temperature")
    if not 0 <= body.min_tokens <= max_tokens:
        raise BadRequest(f"min_tokens must be in [0, max_tokens], got {body.min_tokens}.",
                         "min_tokens")
    return Request(prompt_ids, max_tokens, max_tokens if body.ignore_eos else body.min_tokens,
                   temperature)


async def answer(s: Served, http: HttpRequest, body: Sampling, request: Request,
                 shape: "Answer"):
    stop = [body.stop] if isinstance(body.stop, str) else body.stop or []
    detok = Detokenizer(s.tokenizer, request.prompt_ids, stop, body.min_tokens)
    try:
        s.engine.add(request)
    except EngineDead as e:          # the server is shutting down, or a step failed
        return error_json(str(e), 503)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return EventSourceResponse(stream(s.engine, request, detok, shape, include_usage),
                                   sep="\n")
    return await whole(s.engine, http, request, detok, shape)


async def outputs(engine: AsyncEngine, request: Request, detok: Detokenizer):
    """(new text, finish reason or None, tokens so far) each step, until the request ends;
    a stop string ends it here, and the engine is told to stop it."""
    num_tokens = 0
    while True:
        out: Output = await request.queue.get()
        if out.error:
            raise EngineDead(out.error)
        num_tokens += len(out.token_ids)
        text = detok.add(out.token_ids, finished=out.finish_reason is not None)
        reason = out.finish_reason
        if detok.stopped:            # a stop string: "stop", whatever else ended it
            if reason is None:
                engine.abort(request, "stop")
            reason = "stop"
        yield text, reason, num_tokens
        if reason:
            return


async def stream(engine: AsyncEngine, request: Request, detok: Detokenizer, shape: "Answer",
                 include_usage: bool):
    done, num_tokens = False, 0
    try:
        if shape.is_chat:
            yield json.dumps(shape.chunk({"role": "assistant", "content": ""}, None))
        # a chunk a step, its text empty while a character waits for its other bytes (as
        # vLLM streams): a client's inter-token gaps are the steps'
        async for text, reason, num_tokens in outputs(engine, request, detok):
            yield json.dumps(shape.chunk(text, reason))
        done = True
        if include_usage:
            yield json.dumps(shape.usage_chunk(len(request.prompt_ids), num_tokens))
    except EngineDead as e:
        done = True
        yield json.dumps({"error": {"message": str(e), "type": "InternalServerError",
                                    "code": 500}})
    finally:
        if not done:                 # the client went away (the stream was cancelled)
            engine.abort(request)
    yield "[DONE]"


async def whole(engine: AsyncEngine, http: HttpRequest, request: Request, detok: Detokenizer,
                shape: "Answer"):
    async def collect():
        texts, reason, num_tokens = [], None, 0
        async for text, reason, num_tokens in outputs(engine, request, detok):
            texts.append(text)
        return "".join(texts), reason, num_tokens

    async def gone():                # the client hung up before the answer was ready
        while (await http.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.ensure_future(collect()), asyncio.ensure_future(gone())
    await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    if not work.done():
        work.cancel()
        engine.abort(request)
        return Response(status_code=499)    # nobody reads it: nginx's "client closed"
    try:
        text, reason, num_tokens = work.result()
    except EngineDead as e:
        return error_json(str(e), 500)
    return shape.whole(text, reason, len(request.prompt_ids), num_tokens)


class Answer:
    """The JSON of one answer, as a completion or a chat, whole or a chunk at a time."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.is_chat = kind == "chat.completion"
        self.id = f"{'chatcmpl' if self.is_chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, text, reason: str | None) -> dict:
        if self.is_chat:   # text: the delta (a dict for the first chunk, which names the role)
            delta = text if isinstance(text, dict) else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
            return self._head("chat.completion.chunk") | {"choices": [choice]}
        return self._head("text_completion") | {
            "choices": [{"index": 0, "text": text, "finish_reason": reason}]}

    def usage_chunk(self, num_prompt: int, num_completion: int) -> dict:
        kind = "chat.completion.chunk" if self.is_chat else "text_completion"
        return self._head(kind) | {"choices": [], "usage": usage(num_prompt, num_completion)}

    def whole(self, text: str, reason: str | None, num_prompt: int, num_completion: int) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": reason} if self.is_chat else
                  {"index": 0, "text": text, "finish_reason": reason})
        return self._head(self.kind) | {"choices": [choice],
                                        "usage": usage(num_prompt, num_completion)}


def usage(num_prompt: int, num_completion: int) -> dict:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion}
