"""The migration guide (docs/migrating.md) against the package.

Every ```python block of the guide that defines CHANNEL_LAYERS is executed, and each layer it
configures is built with the test server's URL: a block marked "# works" or "# works unchanged"
must do a round trip (a process channel and a group), a block marked "# fails: TypeError: <text>"
must raise exactly that at construction. The guide's tables of CONFIG keys and connect_options
keys are parsed, checked for coverage (every CONFIG key of the nats-py layer 0.10.1, every keyword
argument of nats-py's connect(), every key of this layer) and each row is tried as it says.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import unique

from channels_nats import NatsChannelLayer
from channels_nats.layer import CONFIG_KEYS, CONNECT_OPTIONS, NATS_PY_ALIASES, NATS_PY_DEFAULTS, NATS_PY_REFUSED

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"

NATS_PY_LAYER_CONFIG_KEYS = frozenset(
    {
        "servers",
        "prefix",
        "expiry",
        "capacity",
        "channel_capacity",
        "group_expiry",
        "connect_options",
        "connect_deadline",
        "publish_deadline",
    }
)
"""The CONFIG keys (constructor keyword arguments) of the nats-py layer 0.10.1."""

NATS_PY_CONNECT_KEYWORDS = frozenset(
    {
        "servers",
        "error_cb",
        "disconnected_cb",
        "closed_cb",
        "discovered_server_cb",
        "reconnected_cb",
        "name",
        "pedantic",
        "verbose",
        "allow_reconnect",
        "connect_timeout",
        "reconnect_time_wait",
        "max_reconnect_attempts",
        "ping_interval",
        "max_outstanding_pings",
        "dont_randomize",
        "flusher_queue_size",
        "no_echo",
        "tls",
        "tls_hostname",
        "tls_handshake_first",
        "user",
        "password",
        "token",
        "drain_timeout",
        "signature_cb",
        "user_jwt_cb",
        "user_credentials",
        "nkeys_seed",
        "nkeys_seed_str",
        "inbox_prefix",
        "pending_size",
        "flush_timeout",
        "ws_connection_headers",
        "reconnect_to_server_handler",
        "lame_duck_mode_cb",
        "skip_subject_validation",
    }
)
"""The keyword arguments of nats-py 2.16.0's Client.connect() (nats/aio/client.py)."""

SAMPLES: dict[str, Any] = {
    "name": "migrating-guide",
    "user": "shop",
    "password": "change-me",
    "token": "change-me",
    "connect_timeout": 1,
    "reconnect_time_wait": 0.5,
    "max_reconnect_attempts": -1,
    "ping_interval": 20,
    "max_outstanding_pings": 3,
    "dont_randomize": True,
    "drain_timeout": 5,
    "pending_size": 1 << 20,
    "flush_timeout": 3,
}
"""Values other than nats-py's default for accepted keys that work against a plain test server."""

FILE_KEYS = frozenset({"creds", "nkey_seed"})
"""Keys whose value is a file path: tried with a missing file, which the connect must name."""

ROUND_TRIP_TIMEOUT = 5.0


# ---- reading the guide --------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    number: int
    marker: str
    source: str


@dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]

    def code(self, column: int) -> list[str]:
        """The code spans of a cell."""
        return re.findall(r"`([^`]*)`", self.cells[column])

    @property
    def key(self) -> str:
        spans = self.code(0)
        assert len(spans) == 1, f"the first cell of {self.cells} is not one `key`"
        return spans[0]


def guide_text() -> str:
    return GUIDE.read_text(encoding="utf-8")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def defines_channel_layers(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CHANNEL_LAYERS" for t in node.targets
        ):
            return True
    return False


def settings_blocks() -> list[Block]:
    blocks: list[Block] = []
    for source in python_blocks(guide_text()):
        if defines_channel_layers(source):
            blocks.append(Block(len(blocks) + 1, source.splitlines()[0], source))
    return blocks


def tables(text: str) -> dict[str, list[Row]]:
    """Every table of the guide by the text of its first header cell."""
    found: dict[str, list[Row]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        rows: list[tuple[str, ...]] = []
        while i < len(lines) and lines[i].startswith("|"):
            rows.append(tuple(cell.strip() for cell in lines[i].strip().strip("|").split("|")))
            i += 1
        header, separator, body = rows[0], rows[1], rows[2:]
        assert all(set(cell) <= set("-: ") for cell in separator), f"no separator under {header}"
        for row in body:
            assert len(row) == len(header), f"row {row} has {len(row)} cells, its header {len(header)}"
        found[header[0]] = [Row(row) for row in body]
    return found


def table(name: str) -> list[Row]:
    found = tables(guide_text())
    assert name in found, f"docs/migrating.md has no table headed {name!r}"
    return found[name]


def literal(span: str) -> Any:
    return ast.literal_eval(span)


# ---- the connect_options table --------------------------------------------------------------------

ACCEPTED = ("same", "same except 0", "other meaning")


@dataclass(frozen=True)
class Option:
    key: str
    status: str  # one of ACCEPTED, "alias", "default only", "refused", "unknown"
    nats_py_default: Any
    target: str = ""  # the name here, for an alias
    message: str = ""  # the TypeError text of a refused or default-only key


def connect_options_table() -> list[Option]:
    options: list[Option] = []
    for row in table("nats-py key"):
        status = row.cells[1]
        defaults = row.code(2)
        assert len(defaults) == 1, f"{row.key}: the nats-py default is not one `value`"
        default = literal(defaults[0])
        if status in ACCEPTED:
            options.append(Option(row.key, status, default))
        elif status.startswith("alias of "):
            (target,) = row.code(1)
            options.append(Option(row.key, "alias", default, target=target))
        elif status in ("default only", "refused"):
            spans = row.code(4)
            assert spans, f"{row.key}: no message in the last cell"
            options.append(Option(row.key, status, default, message=spans[0]))
        elif status == "unknown":
            options.append(Option(row.key, status, default))
        else:
            pytest.fail(f"connect_options row {row.key}: unknown status {status!r}")
    return options


def option_params() -> list[Any]:
    return [pytest.param(option, id=option.key) for option in connect_options_table()]


def block_params() -> list[Any]:
    return [pytest.param(block, id=f"block{block.number}") for block in settings_blocks()]


# ---- helpers ------------------------------------------------------------------------------------


def run_block(block: Block) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"migrating_block_{block.number}"}
    exec(compile(block.source, f"docs/migrating.md block {block.number}", "exec"), namespace)
    layers = namespace["CHANNEL_LAYERS"]
    assert isinstance(layers, dict), f"block {block.number}: CHANNEL_LAYERS is not a dict"
    assert layers, f"block {block.number}: CHANNEL_LAYERS is empty"
    return layers


def backend(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def with_server(config: dict[str, Any], url: str) -> dict[str, Any]:
    return {**config, "servers": [url]}


async def round_trip(layer: NatsChannelLayer) -> None:
    """A process channel and a group, end to end; the layer is closed afterwards."""
    try:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "migrating.direct", "text": "one"})
        received = await asyncio.wait_for(layer.receive(channel), ROUND_TRIP_TIMEOUT)
        assert received == {"type": "migrating.direct", "text": "one"}
        group = unique("migrating")
        await layer.group_add(group, channel)
        await layer.group_send(group, {"type": "migrating.group", "payload": b"\x00\x01"})
        received = await asyncio.wait_for(layer.receive(channel), ROUND_TRIP_TIMEOUT)
        assert received == {"type": "migrating.group", "payload": b"\x00\x01"}
        await layer.group_discard(group, channel)
    finally:
        await layer.flush()
        await layer.close()


def is_nats_py_layer_block(config: dict[str, Any]) -> bool:
    options = config.get("connect_options") or {}
    return set(config) <= NATS_PY_LAYER_CONFIG_KEYS and set(options) <= NATS_PY_CONNECT_KEYWORDS


# ---- the settings blocks --------------------------------------------------------------------------


def test_the_guide_has_every_kind_of_settings_block() -> None:
    markers = [block.marker for block in settings_blocks()]
    assert "# works unchanged" in markers
    assert "# works" in markers
    assert any(marker.startswith("# fails: ") for marker in markers)


def test_every_python_block_compiles() -> None:
    for number, source in enumerate(python_blocks(guide_text()), 1):
        compile(source, f"docs/migrating.md python block {number}", "exec")


@pytest.mark.parametrize("block", block_params())
async def test_settings_block_does_what_the_guide_says(block: Block, nats_url: str) -> None:
    layers = run_block(block)
    failure = re.fullmatch(r"# fails: (\w+): (.+)", block.marker)
    assert block.marker in ("# works", "# works unchanged") or failure, (
        f"block {block.number} does not start with '# works', '# works unchanged' or '# fails: <Error>: <text>'"
    )
    for alias, settings in layers.items():
        assert backend(settings["BACKEND"]) is NatsChannelLayer, f"{alias}: BACKEND is {settings['BACKEND']!r}"
        config = with_server(settings.get("CONFIG", {}), nats_url)
        if block.marker == "# works unchanged" or failure:
            # The guide shows these as settings of the nats-py layer 0.10.1.
            assert is_nats_py_layer_block(config), f"{alias}: not a settings block of the nats-py layer 0.10.1"
        if failure:
            assert failure.group(1) == "TypeError", "construction errors are TypeErrors"
            with pytest.raises(TypeError) as raised:
                NatsChannelLayer(**config)
            assert str(raised.value) == failure.group(2)
        else:
            await round_trip(NatsChannelLayer(**config))


# ---- the CONFIG tables ----------------------------------------------------------------------------


def test_config_table_covers_every_key_of_the_nats_py_layer() -> None:
    rows = table("0.10.1 key")
    keys = [row.key for row in rows]
    assert sorted(keys) == sorted(NATS_PY_LAYER_CONFIG_KEYS)
    for row in rows:
        assert row.key in CONFIG_KEYS, f"{row.key} is a 0.10.1 key this layer does not accept"
        assert row.cells[1] in ("same", "different"), f"{row.key}: meaning {row.cells[1]!r}"


def test_config_tables_cover_every_key_here_with_its_default() -> None:
    parameters = inspect.signature(NatsChannelLayer.__init__).parameters
    rows = {row.key: (row, 3) for row in table("0.10.1 key")}
    rows.update({row.key: (row, 1) for row in table("new key")})
    assert sorted(rows) == sorted(CONFIG_KEYS)
    for key, (row, column) in rows.items():
        (shown,) = row.code(column)
        default = parameters[key].default
        if key == "connect_options":
            default = default or {}  # None in the signature stands for {}
        assert literal(shown) == default, f"{key}: the guide says {shown}, the layer's default is {default!r}"


def test_new_keys_are_not_keys_of_the_nats_py_layer() -> None:
    assert not {row.key for row in table("new key")} & NATS_PY_LAYER_CONFIG_KEYS


# ---- the connect_options tables -------------------------------------------------------------------


def test_connect_options_table_covers_every_keyword_of_nats_py_connect() -> None:
    keys = [option.key for option in connect_options_table()]
    assert len(keys) == len(set(keys)), "a key is listed twice"
    assert set(keys) == NATS_PY_CONNECT_KEYWORDS


def test_every_key_here_is_in_the_guide() -> None:
    options = connect_options_table()
    only_here = {row.key for row in table("key only here")}
    same_name = {o.key for o in options if o.status in ACCEPTED}
    targets = {o.target for o in options if o.status == "alias"}
    assert only_here <= CONNECT_OPTIONS
    assert not only_here & NATS_PY_CONNECT_KEYWORDS
    assert same_name | targets | only_here == CONNECT_OPTIONS


def test_connect_options_table_matches_the_layer_tables() -> None:
    """What the table says of each key is what layer.py's tables say (a row goes stale when they change)."""
    handled = set(NATS_PY_ALIASES) | set(NATS_PY_DEFAULTS) | set(NATS_PY_REFUSED)
    extra = handled - NATS_PY_CONNECT_KEYWORDS
    assert not extra, f"the layer handles keys nats-py does not have: {extra}"
    for option in connect_options_table():
        if option.status in ACCEPTED:
            assert option.key in CONNECT_OPTIONS, option.key
            assert option.key not in handled, option.key
        elif option.status == "alias":
            assert NATS_PY_ALIASES.get(option.key) == option.target, option.key
        elif option.status == "default only":
            assert option.key in NATS_PY_DEFAULTS, option.key
            assert NATS_PY_DEFAULTS[option.key] == option.nats_py_default, option.key
        elif option.status == "refused":
            assert NATS_PY_REFUSED.get(option.key) == option.message, option.key
        else:
            assert option.key not in handled, option.key
            assert option.key not in CONNECT_OPTIONS, option.key


@pytest.mark.parametrize("option", option_params())
async def test_connect_option_is_handled_as_the_table_says(option: Option, nats_url: str) -> None:
    def layer(**connect_options: Any) -> NatsChannelLayer:
        return NatsChannelLayer(servers=[nats_url], connect_deadline=2, connect_options=connect_options)

    def refusal(value: Any) -> str:
        with pytest.raises(TypeError) as raised:
            layer(**{option.key: value})
        return str(raised.value)

    key, default = option.key, option.nats_py_default
    if option.status in ACCEPTED:
        await round_trip(layer(**{key: default}))  # nats-py's default written out
        if key in SAMPLES:
            await round_trip(layer(**{key: SAMPLES[key]}))
    elif option.status == "alias":
        value = f"/nonexistent/migrating-{key}" if option.target in FILE_KEYS else SAMPLES.get(key, default)
        with pytest.raises(TypeError, match="which mean the same"):
            layer(**{key: value, option.target: value})
        if option.target in FILE_KEYS:
            aliased = layer(**{key: value})
            try:
                with pytest.raises(ConnectionError, match=re.escape(value)):
                    await aliased.new_channel()
            finally:
                await aliased.close()
        else:
            await round_trip(layer(**{key: value}))
    elif option.status == "default only":
        await round_trip(layer(**{key: default}))
        assert isinstance(default, bool), f"{key}: a default-only key that is not a flag"
        assert refusal(not default) == option.message
    elif option.status == "refused":
        message = f"NatsChannelLayer: connect_options key {key!r} is not supported: {option.message}"
        assert refusal(object()) == message
        assert refusal(default) == message
    else:
        assert refusal(default).startswith(f"NatsChannelLayer: unknown connect_options key {key!r}; known keys: ")
