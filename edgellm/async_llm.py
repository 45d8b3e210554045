"""AsyncLLM: the engine on a background thread, one async iterator of RequestOutput deltas per request.

    caller coroutines                          engine thread (the only one touching LLMEngine)
    generate(prompt, params, id) ──(ADD)──► inbox ──► engine.add_request
      await queue.get() ◄── loop.call_soon_threadsafe(queue.put_nowait, delta) ◄── engine.step()
    abort(id) / iterator closed early ──(ABORT)──► inbox ──► engine.abort_request (blocks freed)

Commands cross into the thread through a thread-safe queue and results come back on
the caller's event loop, so LLMEngine needs no locks. The thread sleeps on the inbox
while there is nothing to run. A request's error (bad prompt) is raised from its own
iterator; an error inside a step fails every running request and stops the thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from typing import Any

from edgellm.engine.engine import LLMEngine, engine_config_from_args
from edgellm.engine.sampling_params import SamplingParams
from edgellm.outputs import RequestOutput

logger = logging.getLogger(__name__)

_SHUTDOWN = object()


class AsyncLLM:
    def __init__(self, model: str, device: str = "cpu", dtype: str = "auto", **engine_args: Any) -> None:
        """Same arguments as `LLM`; the engine loads here, then its thread starts."""
        self.engine = LLMEngine(engine_config_from_args(model, device, dtype, **engine_args))
        self._inbox: queue.Queue = queue.Queue()
        # request id -> (the caller's loop, its queue); written by callers, read by the engine thread
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="edgellm-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def generate(
        self, prompt: str | list[int], sampling_params: SamplingParams | None, request_id: str,
        add_special_tokens: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Deltas of one request until it finishes. Leaving the loop early (or cancelling) aborts it."""
        if self._error is not None:
            raise RuntimeError("AsyncLLM: the engine thread stopped") from self._error
        if request_id in self._streams:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), q)
        self._inbox.put(("add", request_id, prompt, sampling_params, add_special_tokens))
        finished = False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are freed at the engine's next turn. Unknown ids are ignored."""
        self._inbox.put(("abort", request_id))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Finish the current step, abort whatever is left, stop the thread."""
        self._inbox.put(_SHUTDOWN)
        self._thread.join(timeout)

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                # Block while idle; otherwise take what arrived and step.
                cmds = [self._inbox.get()] if not engine.has_unfinished_requests() else []
                while True:
                    try:
                        cmds.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                if _SHUTDOWN in cmds:
                    engine.abort_request(list(engine.output_processor.parents))
                    return
                for cmd in cmds:
                    self._apply(cmd)
                if engine.has_unfinished_requests():
                    for out in engine.step():
                        self._deliver(out.request_id, out)
        except BaseException as e:  # noqa: BLE001  every waiting caller must hear of it, not hang
            logger.exception("engine thread failed")
            self._error = e
            for rid in list(self._streams):
                self._deliver(rid, RuntimeError(f"engine thread failed: {e}"))

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "abort":
            self.engine.abort_request(cmd[1])
            return
        _, rid, prompt, params, add_special = cmd
        try:
            self.engine.add_request(rid, prompt, params, stream=True, add_special_tokens=add_special)
        except ValueError as e:
            self._deliver(rid, e)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            loop, q = stream
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                self._inbox.put(("abort", request_id))
