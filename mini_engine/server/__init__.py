"""mini_engine's front door: an OpenAI-compatible HTTP server around the engine one level up
(vLLM's API server, AsyncLLM and output processor, small). Read it in the order a request
travels:

    __main__.py       `python -m mini_engine.server --model PATH`: the engine's settings as
                      flags, the model loaded, uvicorn started; Ctrl-C or SIGTERM stops it
    api.py            the routes (FastAPI, one APIRouter of plain functions that read the
                      engine from app.state): a request checked, handed to the engine, and its
                      answer made from its output queue, whole or streamed; a client that
                      leaves aborts its request
    async_engine.py   the step loop, apart from the event loop (in the main thread, uvicorn
                      in a second), an inbox of typed messages (Add, Abort, Stop), and one
                      output queue a request
    detokenizer.py    a request's text token by token: no broken character, stop strings
    metrics.py        /metrics under vLLM's names, so the lab's tools read both servers

It imports FastAPI, uvicorn, sse-starlette, prometheus_client and transformers' tokenizer; the
engine itself imports none of them.
"""
