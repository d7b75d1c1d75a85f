"""NatsChannelLayer: the Django Channels layer on top of the native library."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, cast

import msgpack
from channels.exceptions import ChannelFull, MessageTooLarge
from channels.layers import BaseChannelLayer

from . import _native, _results

_get_running_loop = asyncio.get_running_loop  # the receive's hot path: looked up once, not per call
_queue_of = _results.queue_of
_NOT_AGAIN = -_native.NOT_PENDING  # what a receive_again returns when the receive cannot start over

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
        "pending_size",
        "connect_timeout",
        "drain_timeout",
        "flush_timeout",
        "pending_msgs_limit",
        "ping_interval",
        "max_pings_outstanding",
    }
)
"""The keys of CONFIG["connect_options"] (the library checks them too)."""

NATS_PY_ALIASES = {
    "max_outstanding_pings": "max_pings_outstanding",
    "user_credentials": "creds",
    "nkeys_seed": "nkey_seed",
}
"""Keys of nats-py's connect() that mean the same as one of CONNECT_OPTIONS under another name:
a connect_options block of the nats-py layer works unchanged."""

NATS_PY_DEFAULTS = {
    "verbose": False,
    "pedantic": False,
    "allow_reconnect": True,
    "no_echo": False,
    "skip_subject_validation": False,
}
"""Keys of nats-py's connect() that are accepted with their default value only."""

NATS_PY_REFUSED = {
    "servers": "put the servers in CONFIG['servers']",
    "tls": "an ssl.SSLContext cannot reach the library; give files with tls_ca, tls_cert and tls_key "
    "(and a tls:// URL)",
    "tls_hostname": "connect with the host name the certificate names in the server URL",
    "error_cb": "the layer logs connection errors on the 'channels_nats' logger; attach a logging handler",
    "disconnected_cb": "the layer logs disconnects on the 'channels_nats' logger; attach a logging handler",
    "closed_cb": "the layer logs a closed connection on the 'channels_nats' logger; attach a logging handler",
    "reconnected_cb": "the layer logs reconnects on the 'channels_nats' logger; attach a logging handler",
    "discovered_server_cb": "the layer follows the servers a cluster announces by itself",
    "signature_cb": "give the key with nkey_seed (a file) or the credentials with creds",
    "user_jwt_cb": "give the JWT and seed with creds (a .creds file)",
    "nkeys_seed_str": "write the seed to a file and give its path with nkey_seed",
    "inbox_prefix": "the layer makes no requests, so it has no inboxes",
    "flusher_queue_size": "outbound data is bounded in bytes by pending_size",
    "ws_connection_headers": "the layer connects over TCP (nats:// or tls:// URLs), not WebSocket",
    "reconnect_to_server_handler": "the layer picks the next server itself; list the servers in the order "
    "to try in CONFIG['servers'] and set dont_randomize",
    "lame_duck_mode_cb": "the layer moves to another server by itself when one enters lame duck mode",
}
"""Keys of nats-py's connect() that have no equivalent here, with what to write instead."""


def _connect_options(given: dict[str, Any]) -> dict[str, Any]:
    """connect_options for the library: nats-py's names mapped to this layer's, and a TypeError
    that says what to write instead for a key that has no equivalent."""
    options: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # the name each option was given under
    for key, value in given.items():
        if key in NATS_PY_REFUSED:
            raise TypeError(f"NatsChannelLayer: connect_options key {key!r} is not supported: {NATS_PY_REFUSED[key]}")
        if key in NATS_PY_DEFAULTS:
            if value != NATS_PY_DEFAULTS[key]:
                raise TypeError(_NON_DEFAULT[key])
            continue  # the default value: nothing to do
        name = NATS_PY_ALIASES.get(key, key)
        if name not in CONNECT_OPTIONS:
            raise TypeError(
                f"NatsChannelLayer: unknown connect_options key {key!r}; "
                f"known keys: {', '.join(sorted(CONNECT_OPTIONS))}"
            )
        if name in options:
            raise TypeError(
                f"NatsChannelLayer: connect_options has both {given_as[name]!r} and {key!r}, which mean the same"
            )
        if name in _PATH_OPTIONS and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if callable(value) or not isinstance(value, (str, int, float, bool, type(None))):
            raise TypeError(
                f"NatsChannelLayer: connect_options {key!r} must be a string, a number or a bool"
                f"{' (a file path)' if name in _PATH_OPTIONS else ''}, not {type(value).__name__}"
            )
        options[name], given_as[name] = value, key
    return options


_NON_DEFAULT = {
    "verbose": "NatsChannelLayer: connect_options verbose=True (+OK for every command) is not supported; remove it",
    "pedantic": "NatsChannelLayer: connect_options pedantic=True is not supported; remove it",
    "allow_reconnect": "NatsChannelLayer: connect_options allow_reconnect=False is written max_reconnect_attempts=0 "
    "here (the layer then opens a new connection itself when one is lost)",
    "no_echo": "NatsChannelLayer: connect_options no_echo=True would keep a process from receiving what it sends "
    "to its own channels and groups; remove it",
    "skip_subject_validation": "NatsChannelLayer: connect_options skip_subject_validation=True is not supported: "
    "the layer checks every name before it becomes a subject; remove it",
}

_PATH_OPTIONS = frozenset({"creds", "nkey_seed", "tls_ca", "tls_cert", "tls_key"})

CONFIG_KEYS = (
    "servers",
    "prefix",
    "expiry",
    "group_expiry",
    "capacity",
    "channel_capacity",
    "mailbox_grace",
    "release_linger",
    "connect_deadline",
    "publish_deadline",
    "host_reads",
    "connect_options",
)
"""The keys of a CHANNEL_LAYERS CONFIG block."""


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
        connect_deadline: float = 5,
        publish_deadline: float = 10,
        host_reads: bool = True,
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
        options = _connect_options(connect_options or {})
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
            "connect_deadline": connect_deadline,
            "publish_deadline": publish_deadline,
            "host_reads": host_reads,
            "connect_options": options,
        }
        for key in _NUMBERS:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise TypeError(f"NatsChannelLayer: {key} must be a number >= 0, not {value!r}")
        if not isinstance(host_reads, bool):
            raise TypeError(f"NatsChannelLayer: host_reads must be True or False, not {host_reads!r}")
        self.prefix = prefix
        self._config = json.dumps(config).encode()
        self._lock = threading.Lock()
        self._client = 0
        self._connecting: _Connecting | None = None
        self._reader: _results.LoopQueue | None = None  # the loop that reads the connection, if one does
        self._channel_names = _CheckedNames()
        self._group_names = _CheckedNames()
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

    def _channel(self, name: str) -> bytes:
        """The checked, encoded form of a channel name."""
        encoded = self._channel_names.recent.get(name) if type(name) is str else None
        if encoded is None:
            encoded = self._channel_names.recall(name, self.require_valid_channel_name)
        return encoded

    def _group(self, name: str) -> bytes:
        encoded = self._group_names.recent.get(name) if type(name) is str else None
        if encoded is None:
            encoded = self._group_names.recall(name, self.require_valid_group_name)
        return encoded

    # ---- connection -------------------------------------------------------------------------

    async def _connection(self) -> int:
        """The client handle, connecting on first use. Returns without suspending when connected."""
        if self._client:
            return self._client
        ffi, lib = _native.load()
        queue = _results.for_running_loop()
        with self._lock:
            if self._client:
                return self._client
            attempt = self._connecting
            if attempt is None:
                handle = ffi.new("cn_client *")
                _native.check(lib.cn_connect(self._config, _log_callback(), ffi.NULL, queue.handle, ffi.NULL, handle))
                attempt = self._connecting = _Connecting(self, int(handle[0]), queue)
        return await attempt.wait()

    def _connected(self, attempt: _Connecting, ok: bool) -> None:
        """On the thread of the loop that connected, which from now on reads the connection."""
        with self._lock:
            if self._connecting is attempt:
                self._connecting = None
                if ok:
                    self._client = attempt.client
                    self._reader = attempt.queue if attempt.queue.read_connection(attempt.client) else None

    # ---- channels ---------------------------------------------------------------------------

    async def new_channel(self, prefix: str = "specific") -> str:
        """A new process channel name of this client, with its mailbox ready (S1)."""
        prefix = prefix.rstrip(".!")
        client = self._client or await self._connection()
        ffi, lib = _native.load()
        queue = _results.for_running_loop()
        out = ffi.new("char **")
        status = lib.cn_new_channel(client, prefix.encode(), queue.handle, ffi.NULL, out, queue.op)
        if status == _native.OK:
            name = _native.text(out[0])
            lib.cn_free(out[0])
            return name
        _native.check(status)
        return await _wait(queue, queue.op[0], client)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Sends a message to a channel; a message nobody receives is lost (S1). Waits only while
        the outbound buffer is full (PublishTimeout after publish_deadline)."""
        _, lib = _native.load()
        await self._publish(lib.cn_send, self._channel(channel), message)

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message of a channel; cancelling it never loses a message (S14)."""
        # for_running_loop, inlined (after a fork the parent's queues are gone, and it refuses)
        queue = _queue_of(_get_running_loop()) or _results.for_running_loop()
        # The last receive on this channel, when it waited and the take that brought its message
        # was the last: it starts over, with no name to look up (it was checked when that receive
        # began) and no new operation.
        again = queue.again
        if again and type(channel) is str and (op := again.pop(channel, 0)):
            client = self._client or await self._connection()
            got = queue.receive_again(client, op, queue.handle)
            if got == _NOT_AGAIN:  # its mailbox was reclaimed or flushed meanwhile
                got = queue.receive(client, self._channel(channel), queue.handle)
        else:
            try:
                name = self._channel_names.recent[channel]  # checked and encoded before
            except (KeyError, TypeError):  # a name met for the first time in a while, or not a str
                name = self._channel(channel)
            client = self._client or await self._connection()
            got = queue.receive(client, name, queue.handle)
        if type(got) is not int:
            return got  # the message that was waiting, decoded
        if got == 0:
            # A consumer draining a backlog gets its messages without suspending: this is the
            # READY_STREAK-th in a row, which lets the loop run others first. Nothing was taken,
            # so a cancellation here loses nothing.
            await asyncio.sleep(0)
            return await self.receive(channel)
        if got < 0:
            _native.raise_for(-got, _native.last_error())
        # _wait, inlined: this is the hot path of every fan-out.
        op = got
        future = queue.loop.create_future()
        queue.waiting[op] = (future, client, False)
        try:
            message = await future
        except asyncio.CancelledError:
            queue.waiting.pop(op, None)
            _native.load()[1].cn_cancel(client, op)
            raise
        queue.again[channel] = op
        return message

    # ---- groups -----------------------------------------------------------------------------

    async def group_add(self, group: str, channel: str) -> None:
        """Adds a channel to a group in this process; returns once the server confirmed (S1)."""
        group_name, channel_name = self._group(group), self._channel(channel)
        client = self._client or await self._connection()
        ffi, lib = _native.load()
        queue = _results.for_running_loop()
        status = lib.cn_group_add(client, group_name, channel_name, queue.handle, ffi.NULL, queue.op)
        if status != _native.OK:
            _native.check(status)
            await _wait(queue, queue.op[0], client)

    async def group_discard(self, group: str, channel: str) -> None:
        """Removes a channel from a group in this process."""
        group_name, channel_name = self._group(group), self._channel(channel)
        if not self._client:
            return  # no client, no membership
        _, lib = _native.load()
        status = lib.cn_group_discard(self._client, group_name, channel_name)
        if status != _native.CLOSED:
            _native.check(status)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Sends a message to every member of a group, in every process: one publish."""
        _, lib = _native.load()
        await self._publish(lib.cn_group_send, self._group(group), message)

    async def _publish(self, publish: Any, name: bytes, message: dict[str, Any]) -> None:
        """cn_send or cn_group_send of message to name: done when the outbound buffer took it,
        else it waits for room, or raises (PublishTimeout after publish_deadline)."""
        body = _pack(message)
        client = self._client or await self._connection()
        ffi, _ = _native.load()
        queue = _results.for_running_loop()
        status = publish(client, name, body, len(body), queue.handle, ffi.NULL, queue.op)
        if status == _native.OK:
            return
        if status != _native.PENDING:
            _native.raise_for(status, _native.last_error())
        await _wait(queue, queue.op[0], client, publishing=True)

    # ---- lifecycle --------------------------------------------------------------------------

    async def flush(self) -> None:
        """Resets this layer's state in this process (S15); never raises on a dead connection."""
        client = self._client
        if not client:
            return
        _, lib = _native.load()
        status = lib.cn_flush(client)
        if status not in (_native.OK, _native.CLOSED):
            _native.check(status)

    async def close(self) -> None:
        """Closes the connection (S16): waiting receives end with ChannelLayerClosed, buffered
        publishes are written within drain_timeout (what is not is counted and logged). Never
        raises. The next call reconnects."""
        with self._lock:
            client, self._client = self._client, 0
            attempt, self._connecting = self._connecting, None
            reader, self._reader = self._reader, None
        if attempt is not None:
            client = attempt.client  # abandon the connect in progress
        if not client or _native.forked():
            return  # a forked child cannot reach its parent's client: there is nothing to close
        ffi, lib = _native.load()
        queue = _results.for_running_loop()
        if reader is not None:
            reader.stop_reading(client)
        if lib.cn_close(client, queue.handle, ffi.cast("void *", _results.CLOSE)) != _native.PENDING:
            return  # closed already
        closed: asyncio.Future[None] = queue.loop.create_future()
        queue.closing[client] = closed
        await asyncio.shield(closed)

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


class _Connecting:
    """A connect in progress; every caller that needs the client meanwhile waits for it, on its
    own loop. The result arrives in the queue of the loop that started it."""

    def __init__(self, layer: NatsChannelLayer, client: int, queue: _results.LoopQueue) -> None:
        self.layer = layer
        self.client = client
        self.queue = queue
        self.result: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.result.add_done_callback(self._done)
        queue.waiting[client] = (self.result, client, False)

    def _done(self, result: concurrent.futures.Future[None]) -> None:
        self.layer._connected(self, result.exception() is None)  # pyright: ignore[reportPrivateUsage]

    async def wait(self) -> int:
        await asyncio.shield(asyncio.wrap_future(self.result))
        return self.client


async def _wait(queue: _results.LoopQueue, op: int, client: int, publishing: bool = False) -> Any:
    """Awaits the result of pending operation op. A cancelled caller withdraws it; if its result
    had come already, the library takes it back (a message returns to its mailbox, a membership is
    removed), because the caller sees CancelledError instead (S14)."""
    future = queue.expect(op, client, publishing)
    try:
        return await future
    except asyncio.CancelledError:
        queue.waiting.pop(op, None)
        _, lib = _native.load()
        lib.cn_cancel(client, op)
        raise


_NUMBERS = (
    "expiry",
    "group_expiry",
    "capacity",
    "mailbox_grace",
    "release_linger",
    "connect_deadline",
    "publish_deadline",
)

_NAMES_KEPT = 16384
"""How many names a layer's memory of checked names of one kind holds as recent (_CheckedNames)."""


class _CheckedNames:
    """Names checked once and encoded for the library: those met since the last turnover
    (recent) and those met in the span before it (older). A turnover, when _NAMES_KEPT names are
    recent, forgets the older ones, so memory stays bounded while consumers come and go. A name
    used again within a span stays remembered: a process's set of up to _NAMES_KEPT receiving
    channels is checked once. (Forgetting all at once made every name of a set a little larger
    than the memory miss on every use.)"""

    __slots__ = ("older", "recent")

    def __init__(self) -> None:
        self.recent: dict[str, bytes] = {}
        self.older: dict[str, bytes] = {}

    def recall(self, name: str, check: Callable[[Any], bool]) -> bytes:
        """The encoded name, checked with check (which raises) unless it is remembered."""
        encoded = self.older.pop(name, None) if type(name) is str else None
        if encoded is None:
            check(name)
            encoded = name.encode()
        if len(self.recent) >= _NAMES_KEPT:
            self.older, self.recent = self.recent, {}
        self.recent[name] = encoded
        return encoded


class _LogCallback:
    value: Any = None


_log_holder = _LogCallback()


def _log_callback() -> Any:
    """The C callback for log records, made once per process (each costs executable memory in
    cffi's ABI mode)."""
    if _log_holder.value is None:
        ffi, _ = _native.load()
        _log_holder.value = ffi.callback("void(void *, int, const char *)", _on_log)
    return _log_holder.value


def _on_log(_closure: Any, level: int, message: Any) -> None:
    logger.log(level, _native.text(message))


logger = logging.getLogger("channels_nats")

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
    """The wire form of a message (S8). Refused before any I/O with TypeError: what is not a dict,
    the reserved key, and values msgpack cannot carry (the library checks the rest)."""
    if type(message) is not dict and not isinstance(message, dict):
        raise TypeError(f"channels_nats: a message must be a dict, not {type(message).__name__}")
    if "__asgi_channel__" in message:
        raise TypeError("channels_nats: the message key __asgi_channel__ is reserved for Channels")
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
            rules.append({"regex": _inline_flags(pattern), "capacity": capacity})
        elif isinstance(pattern, str):
            rules.append({"pattern": pattern, "capacity": capacity})
        else:
            raise TypeError(f"NatsChannelLayer: channel_capacity key {pattern!r} is not a glob or a compiled regex")
    return rules


_INLINE_FLAGS = {re.IGNORECASE: "i", re.MULTILINE: "m", re.DOTALL: "s"}


def _inline_flags(pattern: re.Pattern[Any]) -> str:
    """A compiled pattern as the library's regexp reads it: its flags written inline. Flags it has
    no form for (re.VERBOSE, re.ASCII, bytes patterns) are refused."""
    if not isinstance(pattern.pattern, str):
        raise TypeError(f"NatsChannelLayer: channel_capacity regex {pattern.pattern!r} must be a str pattern")
    flags = pattern.flags & ~re.UNICODE
    inline = "".join(letter for flag, letter in _INLINE_FLAGS.items() if flags & flag)
    rest = flags & ~(re.IGNORECASE | re.MULTILINE | re.DOTALL)
    if rest:
        raise TypeError(
            f"NatsChannelLayer: channel_capacity regex {pattern.pattern!r} uses flags the layer cannot apply "
            f"({re.RegexFlag(rest)!r}); only re.IGNORECASE, re.MULTILINE and re.DOTALL (or inline (?ims))"
        )
    return f"(?{inline}){pattern.pattern}" if inline else pattern.pattern


_open_layers: weakref.WeakSet[NatsChannelLayer] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Closes every client (bounded by its drain) and frees every result queue before the
    interpreter goes away, so no library thread calls into a finalizing interpreter."""
    if _native._state.lib is None or _native._state.forked:  # pyright: ignore[reportPrivateUsage]
        return
    for layer in list(_open_layers):
        client, layer._client = layer._client, 0  # pyright: ignore[reportPrivateUsage]
        if client:
            _results.wait_blocking(client, timeout=10)
    _results.free_all()
