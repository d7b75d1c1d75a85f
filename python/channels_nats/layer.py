"""NatsChannelLayer: the Django Channels layer on top of the native library."""

from __future__ import annotations

import asyncio
import atexit
import json
import re
import threading
import weakref
from typing import Any, ClassVar, cast

import msgpack
from channels.exceptions import ChannelFull, MessageTooLarge
from channels.layers import BaseChannelLayer

from . import _bridge, _buffers, _native

CONNECT_OPTIONS = frozenset(
    {
        "name",
        "token",
        "user",
        "password",
        "creds",
        "nkey_seed",
        "tls_cert",
        "tls_key",
        "tls_ca",
        "tls_handshake_first",
        "dont_randomize",
        "reconnect_time_wait",
        "max_reconnect_attempts",
        "reconnect_buffer_size",
        "connect_timeout",
        "drain_timeout",
        "flush_timeout",
        "pending_msgs_limit",
    }
)
"""The keys of CONFIG["connect_options"] (the library checks them too)."""

CONFIG_KEYS = (
    "servers",
    "prefix",
    "expiry",
    "group_expiry",
    "capacity",
    "channel_capacity",
    "mailbox_grace",
    "release_linger",
    "connect_options",
)
"""The keys of a CHANNEL_LAYERS CONFIG block."""


class _Connecting(_bridge.Pending):
    """A connect in progress; every caller that needs the client meanwhile waits for it, on its
    own loop."""

    def __init__(self, layer: NatsChannelLayer) -> None:
        self.layer = layer
        self.client = 0
        self.status = _native.PENDING
        self.detail = ""
        self.waiters: list[tuple[_bridge.LoopInbox, asyncio.Future[None]]] = []
        self.register()

    def finish(self, status: int, detail: str, body: bytes | None) -> None:
        layer = self.layer
        with layer._lock:  # pyright: ignore[reportPrivateUsage]
            self.status, self.detail = status, detail
            if layer._connecting is self:  # pyright: ignore[reportPrivateUsage]
                layer._connecting = None  # pyright: ignore[reportPrivateUsage]
                if status == _native.OK:
                    layer._buffers = _buffers.ReceiveBuffers(self.client, layer.expiry)  # pyright: ignore[reportPrivateUsage]
                    layer._client = self.client  # pyright: ignore[reportPrivateUsage]
            waiters, self.waiters = self.waiters, []
        for inbox, future in waiters:
            inbox.push(lambda f=future: None if f.done() else f.set_result(None))

    def result(self) -> int:
        if self.status != _native.OK:
            _native.raise_for(self.status, self.detail)
        return self.client


class NatsChannelLayer(BaseChannelLayer):
    """A channel layer on NATS (see the README for CONFIG and semantics).

    One instance holds one NATS connection per process, shared by every event loop and thread
    that uses it. It connects on first use; close() ends the connection, and the next call opens
    a new one with a new client id.
    """

    extensions: ClassVar[list[str]] = ["groups"]
    MessageTooLarge: ClassVar[type[Exception]] = MessageTooLarge
    ChannelFull: ClassVar[type[Exception]] = ChannelFull  # never raised: full mailboxes drop and count (S2)

    def __init__(
        self,
        servers: str | list[str] | tuple[str, ...] = "nats://127.0.0.1:4222",
        prefix: str = "channels",
        expiry: float = 60,
        group_expiry: float = 86400,
        capacity: int = 100,
        channel_capacity: dict[Any, int] | list[dict[str, Any]] | None = None,
        mailbox_grace: float = 60,
        release_linger: float = 0.3,
        connect_options: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(
                f"NatsChannelLayer: unknown config key(s) {', '.join(sorted(unknown))}; "
                f"known keys: {', '.join(CONFIG_KEYS)}"
            )
        capacities = _capacity_patterns(channel_capacity)
        # Channels types expiry as int; this layer takes fractions of a second too.
        super().__init__(expiry=expiry, capacity=capacity)  # pyright: ignore[reportArgumentType]
        # The compiled list is what get_capacity() reads, as in Channels' own layers (the stubs
        # describe the uncompiled dict).
        self.channel_capacity = self.compile_capacities(capacities)  # pyright: ignore[reportAttributeAccessIssue]
        self.group_expiry = group_expiry
        options = dict(connect_options or {})
        bad = sorted(set(options) - CONNECT_OPTIONS)
        if bad:
            raise TypeError(
                f"NatsChannelLayer: unknown connect_options key(s) {', '.join(bad)}; "
                f"known keys: {', '.join(sorted(CONNECT_OPTIONS))}"
            )
        if isinstance(servers, str):
            servers = [servers]
        if not servers or not all(isinstance(s, str) for s in servers):
            raise TypeError("NatsChannelLayer: servers must be a URL or a list of URLs")
        config: dict[str, Any] = {
            "servers": list(servers),
            "prefix": prefix,
            "expiry": expiry,
            "group_expiry": group_expiry,
            "capacity": capacity,
            "channel_capacity": _capacity_rules(capacities),
            "mailbox_grace": mailbox_grace,
            "release_linger": release_linger,
            "connect_options": options,
        }
        for key in ("expiry", "group_expiry", "capacity", "mailbox_grace", "release_linger"):
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise TypeError(f"NatsChannelLayer: {key} must be a number >= 0, not {value!r}")
        self.prefix = prefix
        self._config = json.dumps(config).encode()
        self._lock = threading.Lock()
        self._client = 0
        self._connecting: _Connecting | None = None
        self._buffers: _buffers.ReceiveBuffers | None = None  # of the current client
        _open_layers.add(self)

    # ---- names --------------------------------------------------------------------------------

    def require_valid_channel_name(self, name: object, receive: bool = False) -> bool:
        """Channels' rules, plus what a NATS subject needs, checked before any I/O (C1)."""
        if type(name) is str and len(name) < self.MAX_NAME_LENGTH and _PLAIN_CHANNEL.fullmatch(name):
            if not receive or "!" not in name or name.endswith("!"):
                return True  # the common shape, which passes every rule below
        super().require_valid_channel_name(name, receive)  # raises TypeError unless a valid str
        _require_subject_tokens("Channel", str(name).partition("!")[0])
        return True

    def require_valid_group_name(self, name: object) -> bool:
        if type(name) is str and len(name) < self.MAX_NAME_LENGTH and _PLAIN_GROUP.fullmatch(name):
            return True
        super().require_valid_group_name(name)
        _require_subject_tokens("Group", str(name))
        return True

    # ---- connection -------------------------------------------------------------------------

    async def _connection(self) -> int:
        """The client handle, connecting on first use. Returns without suspending when connected."""
        if self._client:
            return self._client
        ffi, lib = _native.load()
        complete, log = _bridge.callbacks()
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._client:
                return self._client
            attempt = self._connecting
            if attempt is None:
                attempt = self._connecting = _Connecting(self)
                handle = ffi.new("cn_client *")
                status = lib.cn_connect(self._config, log, ffi.NULL, complete, attempt.closure(), handle)
                attempt.client = int(handle[0])
                if status != _native.PENDING:  # refused before it started
                    attempt.forget()
                    self._connecting = None
                    _native.check(status)
                # Results of this client's operations wait in the process's result queue until
                # an event loop takes them: no library thread enters Python for a message.
                _native.check(lib.cn_set_result_queue(attempt.client, _bridge.results().handle))
            waiter: asyncio.Future[None] = loop.create_future()
            attempt.waiters.append((_bridge.inbox_for(loop), waiter))
        await waiter
        return attempt.result()

    # ---- channels ---------------------------------------------------------------------------

    async def new_channel(self, prefix: str = "specific") -> str:
        """A new process channel name of this client, with its mailbox ready (S1)."""
        prefix = prefix.rstrip(".!")
        client = await self._connection()
        ffi, lib = _native.load()
        out = ffi.new("char **")
        detail, _ = await self._call(
            lambda complete, closure, op: lib.cn_new_channel(client, prefix.encode(), complete, closure, out, op),
            client,
        )
        if out[0] != ffi.NULL:
            name = _native.text(out[0])
            lib.cn_free(out[0])
            return name
        return detail

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Sends a message to a channel; a message nobody receives is lost (S1)."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message, "the __asgi_channel__ key is reserved"
        _, lib = _native.load()
        await self._publish(lib.cn_send, channel, _pack(message))

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message of a channel; cancelling it never loses a message (S14)."""
        buffers = self._buffers
        buffer = buffers.by_channel.get(channel) if buffers is not None and type(channel) is str else None
        if buffer is not None:  # a channel with a buffer was checked before
            assert buffers is not None
            buffered = buffers.take(buffer)
            if buffered is not None:
                return msgpack.unpackb(buffered, raw=False)
        else:
            self.require_valid_channel_name(channel)
        client = self._client or await self._connection()
        buffers = self._buffers
        if buffers is not None and "!" in channel:
            got = buffers.next(channel, asyncio.get_running_loop())
            if type(got) is bytes:
                return msgpack.unpackb(got, raw=False)
            if got is not None:  # None: no stream yet, the classic receive below subscribes
                assert isinstance(got, asyncio.Future)
                try:
                    _, body = await got
                except asyncio.CancelledError:
                    buffers.withdraw(channel, got)
                    raise
                return msgpack.unpackb(body, raw=False)
        ffi, lib = _native.load()
        complete, _ = _bridge.callbacks()
        name = channel.encode()
        scratch = _scratch()
        token = _bridge.next_token()
        status = lib.cn_receive(client, name, complete, _bridge.closure(token), scratch.body, scratch.len, scratch.op)
        if status == _native.OK:  # a message was waiting: a backlog, worth taking ahead
            body = scratch.body[0]
            try:
                message = msgpack.unpackb(ffi.buffer(body, scratch.len[0]), raw=False)
            finally:
                lib.cn_free(body)
            if buffers is not None and "!" in channel:
                buffers.fill(channel)
            return message
        _native.check(status)

        def put_back(status: int, body: bytes | None) -> None:
            if status == _native.OK and body is not None:
                lib.cn_put_back(client, name, body, len(body))

        op = scratch.op[0]
        completion = _bridge.Completion(token, put_back)
        try:  # inline, not through _wait: this is the hot path of every fan-out
            _, body = await completion.future
        except asyncio.CancelledError:
            _withdraw(completion, client, op)
            raise
        assert body is not None
        return msgpack.unpackb(body, raw=False)

    # ---- groups -----------------------------------------------------------------------------

    async def group_add(self, group: str, channel: str) -> None:
        """Adds a channel to a group in this process; returns once the server confirmed (S1)."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        client = await self._connection()
        _, lib = _native.load()

        def leave(status: int, _body: bytes | None) -> None:
            if status == _native.OK:  # it completed for a caller that was cancelled: undo it (S14)
                lib.cn_group_discard(client, group.encode(), channel.encode())

        await self._call(
            lambda complete, closure, op: lib.cn_group_add(
                client, group.encode(), channel.encode(), complete, closure, op
            ),
            client,
            abandon=leave,
        )

    async def group_discard(self, group: str, channel: str) -> None:
        """Removes a channel from a group in this process."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        if not self._client:
            return  # no client, no membership
        _, lib = _native.load()
        status = lib.cn_group_discard(self._client, group.encode(), channel.encode())
        if status != _native.CLOSED:
            _native.check(status)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Sends a message to every member of a group, in every process: one publish."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        _, lib = _native.load()
        await self._publish(lib.cn_group_send, group, _pack(message))

    # ---- lifecycle --------------------------------------------------------------------------

    async def flush(self) -> None:
        """Resets this layer's state in this process (S15); never raises on a dead connection."""
        client = self._client
        if not client:
            return
        if self._buffers is not None:
            self._buffers.flush()  # what they hold is emptied with the mailboxes
        _, lib = _native.load()
        status = lib.cn_flush(client)
        if status not in (_native.OK, _native.CLOSED):
            _native.check(status)

    async def close(self) -> None:
        """Closes the connection (S16): waiting receives end with ChannelLayerClosed, buffered
        publishes are drained within drain_timeout. Never raises. The next call reconnects."""
        with self._lock:
            client, self._client = self._client, 0
            attempt, self._connecting = self._connecting, None
            buffers, self._buffers = self._buffers, None
        if attempt is not None:
            client = attempt.client  # abandon the connect in progress
        if not client or _native.forked():
            return  # a forked child cannot reach its parent's client: there is nothing to close
        if buffers is not None:  # the close accounts for buffered messages with the mailboxes
            buffers.close(_native.ChannelLayerClosed("channels_nats: the layer is closed"))
        _, lib = _native.load()
        complete, _ = _bridge.callbacks()
        done = _bridge.Completion()
        status = lib.cn_close(client, complete, done.closure())
        if status == _native.PENDING:
            await asyncio.shield(done.future)
        else:
            done.forget()

    def stats(self) -> dict[str, Any]:
        """The counters of this layer's client (S20), or {} before it connected."""
        client = self._client
        if not client:
            return {}
        ffi, lib = _native.load()
        out = ffi.new("char **")
        _native.check(lib.cn_stats(client, out))
        try:
            return json.loads(ffi.string(out[0]))
        finally:
            lib.cn_free(out[0])

    # ---- plumbing ---------------------------------------------------------------------------

    async def _call(self, start: Any, client: int, abandon: _bridge.Abandon | None = None) -> tuple[str, bytes | None]:
        """Starts an operation with start(callback, closure, op); awaits its result only when it
        could not finish at once. Returns (text, body) of a pending operation, or ("", None)."""
        complete, _ = _bridge.callbacks()
        token, op = _bridge.next_token(), _scratch().op
        status = start(complete, _bridge.closure(token), op)
        if status != _native.PENDING:
            _native.check(status)
            return "", None
        return await self._wait(token, op[0], client, abandon)

    async def _publish(self, publish: Any, target: str, body: bytes) -> None:
        """cn_send or cn_group_send of body to target; waits only when the library must."""
        client = self._client or await self._connection()
        complete, _ = _bridge.callbacks()
        token, op = _bridge.next_token(), _scratch().op
        status = publish(client, target.encode(), body, len(body), complete, _bridge.closure(token), op)
        if status != _native.PENDING:
            _native.check(status)
            return
        await self._wait(token, op[0], client)

    async def _wait(
        self, token: int, op: int, client: int, abandon: _bridge.Abandon | None = None
    ) -> tuple[str, bytes | None]:
        """Awaits the result of the pending operation op (started with token as its closure)."""
        completion = _bridge.Completion(token, abandon)
        try:
            return await completion.future
        except asyncio.CancelledError:
            _withdraw(completion, client, op)
            raise


def _withdraw(completion: _bridge.Completion, client: int, op: int) -> None:
    """The task awaiting a pending operation was cancelled: withdraw the operation, or hand a
    result that came anyway to the completion's abandon hook (a message goes back, S14)."""
    future = completion.future
    if future.done() and not future.cancelled():
        # The result arrived, but the task was cancelled before it could resume: nobody takes
        # it, so it is returned.
        if future.exception() is None:
            completion.give_up(_native.OK, future.result()[1])
        return
    _, lib = _native.load()
    if lib.cn_cancel(client, op) == _native.OK:
        completion.forget()  # withdrawn: no result will come
    else:
        # It finished, and its result is in the queue already: take it now, so that settle()
        # finds the future cancelled and hands it to abandon.
        _bridge.results().take()


class _Scratch(threading.local):
    """Out-parameters for the library, allocated once per thread: every call reads them right
    after it returns, before anything else can run on that thread."""

    def __init__(self) -> None:
        ffi, _ = _native.load()
        self.op = ffi.new("cn_op *")
        self.body = ffi.new("uint8_t **")
        self.len = ffi.new("size_t *")


class _ScratchHolder:
    value: _Scratch | None = None


_scratch_holder = _ScratchHolder()


def _scratch() -> _Scratch:
    if _scratch_holder.value is None:
        _scratch_holder.value = _Scratch()  # threading.local: each thread gets its own fields
    return _scratch_holder.value


_PLAIN_GROUP = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")
_PLAIN_CHANNEL = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*(?:![A-Za-z0-9_\-.]*)?")
"""Names made of dot-separated ASCII tokens, with an optional "!suffix" for channels: valid under
Channels' rules and as NATS subjects, so the checks below need not run for them."""


def _require_subject_tokens(kind: str, part: str) -> None:
    """The part of a name that becomes NATS subject tokens must not make an empty token, and
    Channels' pattern lets a trailing newline through. The library checks the same again."""
    if part.startswith(".") or part.endswith(".") or ".." in part or "\n" in part:
        raise TypeError(
            f"{kind} name {part!r}: a leading, trailing or doubled '.' (or a newline) "
            "would make an invalid NATS subject"
        )


def _pack(message: dict[str, Any]) -> bytes:
    try:
        return cast(bytes, msgpack.packb(message, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"channels_nats: the message cannot be sent as msgpack: {e}") from e


def _capacity_patterns(channel_capacity: dict[Any, int] | list[dict[str, Any]] | None) -> dict[Any, int]:
    """channel_capacity as Channels takes it: {glob or compiled regex: capacity}, first match wins.
    The list form of the C ABI configuration ({"pattern"|"regex": ..., "capacity": n}) is accepted too."""
    if channel_capacity is None:
        return {}
    if isinstance(channel_capacity, dict):
        return dict(channel_capacity)
    patterns: dict[Any, int] = {}
    for rule in channel_capacity:
        if not isinstance(rule, dict) or ("pattern" in rule) == ("regex" in rule) or "capacity" not in rule:
            raise TypeError(
                f"NatsChannelLayer: channel_capacity rule {rule!r} needs a capacity and a pattern or a regex"
            )
        try:
            key = rule["pattern"] if "pattern" in rule else re.compile(rule["regex"])
        except re.error as e:
            raise TypeError(f"NatsChannelLayer: channel_capacity regex {rule['regex']!r}: {e}") from e
        patterns[key] = rule["capacity"]
    return patterns


def _capacity_rules(channel_capacity: dict[Any, int]) -> list[dict[str, Any]]:
    """channel_capacity for the library: globs stay globs, compiled patterns become regexes."""
    rules: list[dict[str, Any]] = []
    for pattern, capacity in channel_capacity.items():
        if isinstance(pattern, re.Pattern):
            rules.append({"regex": pattern.pattern, "capacity": capacity})
        elif isinstance(pattern, str):
            rules.append({"pattern": pattern, "capacity": capacity})
        else:
            raise TypeError(f"NatsChannelLayer: channel_capacity key {pattern!r} is not a glob or a compiled regex")
    return rules


_open_layers: weakref.WeakSet[NatsChannelLayer] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Closes every client before the interpreter goes away, so no library thread calls into a
    finalizing interpreter."""
    if _native._state.lib is None or _native._state.forked:  # pyright: ignore[reportPrivateUsage]
        return
    ffi, lib = _native.load()
    for layer in list(_open_layers):
        client, layer._client = layer._client, 0  # pyright: ignore[reportPrivateUsage]
        if client:
            lib.cn_close(client, ffi.NULL, ffi.NULL)
