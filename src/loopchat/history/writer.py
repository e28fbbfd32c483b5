"""StoreWriter: the thread that runs every write to the store, so the UI never waits on
the disk. Each call is a queue put; ids come back later through `Ref`s, which later calls
take in place of ints (a reply's events can be queued before its row exists).

The first failure (disk full, read-only file, damaged file...) is reported once through
`on_error` (one line, called on the writer thread); the writer then drops every further
write and the chat goes on without history.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from loopchat.errors import one_line
from loopchat.history.store import ConversationStore, StoreError


class Ref:
    """The id a queued write will give (a conversation's, a message's, a reply's)."""

    __slots__ = ("_done", "_id", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._id: int | None = None
        self._error: str | None = None

    def _resolve(self, value: int) -> None:
        self._id = value
        self._done.set()

    def _fail(self, message: str) -> None:
        self._error = message
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> int:
        """The id once written; StoreError if the write failed or was dropped, TimeoutError
        if it is not written within `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError("the history write is still queued")
        if self._error is not None:
            raise StoreError(self._error)
        assert self._id is not None
        return self._id


#: what the writer's queue carries (None: stop)
_Item: TypeAlias = tuple[str | Callable[[], object], tuple[Any, ...], Ref | None]


def disk_problem(exc: BaseException, path: Path) -> str:
    """One line for a failed write, saying what to do."""
    text = one_line(str(exc))
    if isinstance(exc, StoreError):
        return text
    low = text.lower()
    if "full" in low:
        return f"history not saved: the disk holding {path} is full (free some space; the chat goes on without history)"
    if "readonly" in low or "read-only" in low:
        return f"history not saved: {path} cannot be written (read-only; the chat goes on without history)"
    return f"history not saved: writing {path} failed ({text}); the chat goes on without history"


class StoreWriter:
    """A thread that owns its own connection (ConversationStore.open(path)) and runs every write.
    The UI calls only these; each returns at once (a queue put)."""

    def __init__(
        self,
        path: Path | str | None = None,
        on_error: Callable[[str], None] | None = None,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        """`on_error`: a failure's line (history goes off); `on_notice`: the store's one
        notice once open (ConversationStore.notice), both called on the writer's thread."""
        from loopchat.history.store import default_store_path

        self.path = Path(path) if path is not None else default_store_path()
        self.on_error = on_error
        self.on_notice = on_notice
        self.failed: str | None = None  # the failure's line, once writes are dropped
        # (a store method's name, its arguments, the Ref it fills); flush's marker: (a callable, (), None)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="loopchat-history", daemon=True)
        self._thread.start()

    # ---- the UI's side: each a queue put --------------------------------------------------
    def _put(self, method: str, *args: Any, ref: bool = False) -> Ref | None:
        r = Ref() if ref else None
        if self._closed:
            if r is not None:
                r._fail("the history writer is closed")
            return r
        self._queue.put((method, args, r))
        return r

    def new_conversation(self, **kw: Any) -> Ref:
        return self._put("new_conversation", kw, ref=True)  # type: ignore[return-value]

    def add_message(self, conversation: Ref | int, parent: Ref | int | None, role: str, content: str) -> Ref:
        return self._put("add_message", conversation, parent, role, content, ref=True)  # type: ignore[return-value]

    def begin_reply(self, conversation: Ref | int, parent: Ref | int | None, mode: str, start: Any) -> Ref:
        return self._put("begin_reply", conversation, parent, mode, start, ref=True)  # type: ignore[return-value]

    def add_events(self, reply: Ref | int, events: Sequence[Any]) -> None:
        if events:
            self._put("add_events", reply, tuple(events))

    def finish_reply(self, reply: Ref | int, finish: Any) -> None:
        self._put("finish_reply", reply, finish)

    def rename(self, conversation: Ref | int, title: str) -> None:
        self._put("rename", conversation, title)

    def delete(self, conversation: Ref | int) -> None:
        self._put("delete", conversation)

    def delete_node(self, conversation: Ref | int, node: Ref | int) -> None:
        self._put("delete", conversation, node)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every write queued so far is done (or dropped); False on timeout."""
        if not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put((done.set, (), None))
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread (waits at most `timeout` seconds)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)

    # ---- the writer thread ------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        if self.failed is None:
            self.failed = message
            if self.on_error is not None:
                try:
                    self.on_error(message)
                except Exception:  # noqa: BLE001 - the notice's own failure must not stop the thread
                    pass

    def _run(self) -> None:
        store: ConversationStore | None = None
        try:
            store = ConversationStore.open(self.path)
            if store.notice and self.on_notice is not None:
                try:
                    self.on_notice(store.notice)
                except Exception:  # noqa: BLE001 - the notice's own failure must not turn history off
                    pass
        except StoreError as exc:
            self._fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - anything else: one line, history off
            self._fail(disk_problem(exc, self.path))
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    break
                method, args, ref = item
                if callable(method):  # flush's marker
                    method()
                    continue
                if self.failed is not None or store is None:
                    if ref is not None:
                        ref._fail(self.failed or "history is off")
                    continue
                try:
                    args = tuple(a.result(0) if isinstance(a, Ref) else a for a in args)
                except StoreError as exc:  # it depends on a write that failed on its own (a bad id...)
                    if ref is not None:
                        ref._fail(str(exc))
                    continue
                try:
                    result = self._call(store, method, args)
                except sqlite3.IntegrityError as exc:  # a bad id: that write only
                    if ref is not None:
                        ref._fail(f"history write failed: {one_line(str(exc))}")
                except (sqlite3.Error, OSError, StoreError) as exc:
                    self._fail(disk_problem(exc, self.path))
                    if ref is not None:
                        ref._fail(self.failed or str(exc))
                except Exception as exc:  # noqa: BLE001 - a bad call (unknown id...): that write only
                    if ref is not None:
                        ref._fail(f"history write failed: {one_line(str(exc)) or type(exc).__name__}")
                else:
                    if ref is not None:
                        ref._resolve(result)
        finally:
            if store is not None:
                try:
                    store.close()
                except sqlite3.Error:
                    pass

    @staticmethod
    def _call(store: ConversationStore, method: str, args: tuple) -> Any:
        if method == "new_conversation":
            return store.new_conversation(**args[0])
        return getattr(store, method)(*args)
