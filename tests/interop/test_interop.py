"""Interop tests: the official A2A Python SDK (a2a-sdk 1.3.0) as the client of a
running agentd, over the JSON-RPC binding.

Run through ``run.sh``; it starts agentd and sets ``AGENTD_URL``.

Why the extra wire checking
---------------------------
The SDK is deliberately *lenient*: every response goes through
``a2a.utils.proto_utils.parse_lenient`` (``ParseDict(...,
ignore_unknown_fields=True)``), and the card resolver also rewrites legacy
0.3 fields before parsing. That silently drops fields the proto does not have
and even turns an unknown enum string into the zero value. So "the SDK
accepted it" proves little about what agentd emits.

Every HTTP exchange made by a test therefore goes through a recording httpx
transport, and when the test finishes (the ``wire`` fixture's teardown) each
recorded JSON-RPC response -- including every SSE event -- is checked:

* the JSON-RPC envelope: ``jsonrpc: "2.0"``, the request's ``id`` echoed
  exactly, exactly one of ``result`` / ``error``;
* ``result`` parsed *strictly* into the SDK's own protobuf type for the
  method (``json_format.ParseDict`` without ``ignore_unknown_fields``);
* a canonical-ProtoJSON walk that catches what even strict ``ParseDict``
  accepts: snake_case keys, enums as numbers, ``null`` members, wrong JSON
  types;
* ``error`` has only ``code``/``message``/``data`` and every ``data`` item is
  a ``@type``d google.rpc message that parses strictly as ``google.protobuf.Any``.

The SDK client API itself is used wherever it can express a case, so the
tests also prove that the SDK's typed-error mapping works against agentd.
Where it cannot (malformed requests, missing headers, the extended card,
which the SDK short-circuits when the card says it is unsupported) the test
sends raw httpx requests, still through the recorder.
"""

from __future__ import annotations

import json
import os
import re
import uuid

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from google.protobuf import any_pb2, empty_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as ProtoMessage
from google.rpc import error_details_pb2  # noqa: F401 -- registers ErrorInfo/BadRequest for Any

from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SendMessageResponse,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    A2A_ERROR_REASONS,
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)


AGENTD_URL = os.environ.get('AGENTD_URL', '')
CARD_PATH = '/.well-known/agent-card.json'
A2A_DOMAIN = 'a2a-protocol.org'
ERROR_INFO_TYPE = 'type.googleapis.com/google.rpc.ErrorInfo'

# agentd answers an agentless SendMessage at once; these only bound a hang.
HTTP_TIMEOUT = 30.0
STREAM_TIMEOUT = 20.0

# The proto type each method's JSON-RPC `result` must parse into.
RESULT_TYPES: dict[str, type[ProtoMessage]] = {
    'SendMessage': SendMessageResponse,
    'SendStreamingMessage': StreamResponse,
    'GetTask': Task,
    'ListTasks': ListTasksResponse,
    'CancelTask': Task,
    'SubscribeToTask': StreamResponse,
    'CreateTaskPushNotificationConfig': TaskPushNotificationConfig,
    'GetTaskPushNotificationConfig': TaskPushNotificationConfig,
    'ListTaskPushNotificationConfigs': ListTaskPushNotificationConfigsResponse,
    'DeleteTaskPushNotificationConfig': empty_pb2.Empty,
    'GetExtendedAgentCard': AgentCard,
}


@pytest.fixture(scope='session')
def anyio_backend() -> str:
    # Session scope so the session-scoped async `seeded` fixture can share
    # the runner with the tests.
    return 'asyncio'


pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------------------
# Strict ProtoJSON checking
# ---------------------------------------------------------------------------

# Free-form JSON: nothing to check below these.
_FREE_JSON = {
    'google.protobuf.Struct',
    'google.protobuf.Value',
    'google.protobuf.ListValue',
}
_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_FIXED64,
}


def _canonical(value: Any, desc: Descriptor, path: str, out: list[str]) -> None:
    """Collects what strict ParseDict tolerates but canonical ProtoJSON is not.

    ParseDict accepts the proto field name (``context_id``) as well as the
    JSON name, enum numbers as well as names, and ``null`` for any field; the
    A2A JSON-RPC binding is camelCase with enum names, and a peer written
    against it need not accept the others.
    """
    name = desc.full_name
    if name in _FREE_JSON:
        return
    if name in ('google.protobuf.Timestamp', 'google.protobuf.Duration'):
        if not isinstance(value, str):
            out.append(f'{path}: {name} must be a string, got {value!r}')
        return  # the format itself is checked by ParseDict
    if not isinstance(value, dict):
        out.append(f'{path}: expected a JSON object for {name}, got {value!r}')
        return
    if name == 'google.protobuf.Any':
        type_url = value.get('@type')
        if not isinstance(type_url, str):
            out.append(f'{path}: Any without a string "@type"')
            return
        try:
            packed = desc.file.pool.FindMessageTypeByName(
                type_url.rsplit('/', 1)[-1]
            )
        except KeyError:
            out.append(f'{path}: unknown @type {type_url!r}')
            return
        rest = {k: v for k, v in value.items() if k != '@type'}
        _canonical(rest, packed, path, out)
        return

    fields = {f.json_name: f for f in desc.fields}
    for key, item in value.items():
        p = f'{path}.{key}'
        f = fields.get(key)
        if f is None:
            by_proto_name = desc.fields_by_name.get(key)
            hint = (
                f' (proto name; JSON name is {by_proto_name.json_name!r})'
                if by_proto_name
                else ''
            )
            out.append(f'{p}: not a JSON field of {name}{hint}')
            continue
        if item is None:
            out.append(f'{p}: null (an unset field is omitted, not null)')
            continue
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            if not isinstance(item, dict):
                out.append(f'{p}: map must be a JSON object')
                continue
            value_field = f.message_type.fields_by_name['value']
            for k, v in item.items():
                _scalar_or_message(value_field, v, f'{p}[{k!r}]', out)
        elif f.is_repeated:
            if not isinstance(item, list):
                out.append(f'{p}: repeated field must be a JSON array')
                continue
            for i, v in enumerate(item):
                _scalar_or_message(f, v, f'{p}[{i}]', out)
        else:
            _scalar_or_message(f, item, p, out)


def _scalar_or_message(
    f: FieldDescriptor, v: Any, path: str, out: list[str]
) -> None:
    t = f.type
    if t == FieldDescriptor.TYPE_MESSAGE:
        _canonical(v, f.message_type, path, out)
    elif t == FieldDescriptor.TYPE_ENUM:
        if not isinstance(v, str):
            out.append(f'{path}: enum {f.enum_type.full_name} as {v!r}, not its name')
        elif v not in f.enum_type.values_by_name:
            out.append(f'{path}: {v!r} is not a {f.enum_type.full_name} name')
    elif t == FieldDescriptor.TYPE_STRING or t == FieldDescriptor.TYPE_BYTES:
        if not isinstance(v, str):
            out.append(f'{path}: expected a string, got {v!r}')
    elif t == FieldDescriptor.TYPE_BOOL:
        if not isinstance(v, bool):
            out.append(f'{path}: expected true/false, got {v!r}')
    elif t in _INT32:
        if isinstance(v, bool) or not isinstance(v, int):
            out.append(f'{path}: expected a JSON integer, got {v!r}')
    elif t in _INT64:
        if isinstance(v, bool) or not isinstance(v, int | str):
            out.append(f'{path}: expected an integer or decimal string, got {v!r}')


def strict_parse(data: Any, message: ProtoMessage, where: str = '') -> ProtoMessage:
    """ParseDict with no leniency, plus the canonical-form walk."""
    label = where or message.DESCRIPTOR.name
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as e:
        pytest.fail(
            f'{label}: not a valid {message.DESCRIPTOR.full_name}: {e}\n'
            f'{json.dumps(data, indent=1)[:4000]}'
        )
    problems: list[str] = []
    _canonical(data, message.DESCRIPTOR, '$', problems)
    if problems:
        pytest.fail(
            f'{label}: not canonical ProtoJSON for {message.DESCRIPTOR.full_name}:\n  '
            + '\n  '.join(problems)
        )
    return message


def check_error_object(err: Any, where: str) -> None:
    assert isinstance(err, dict), f'{where}: error is not an object: {err!r}'
    extra = set(err) - {'code', 'message', 'data'}
    assert not extra, f'{where}: error has unexpected members {extra}'
    code = err.get('code')
    assert isinstance(code, int) and not isinstance(code, bool), (
        f'{where}: error.code {code!r} is not an integer'
    )
    assert isinstance(err.get('message'), str) and err['message'], (
        f'{where}: error.message missing or empty'
    )
    if 'data' in err:
        data = err['data']
        assert isinstance(data, list), (
            f'{where}: error.data must be an array of @type objects, got {data!r}'
        )
        for i, item in enumerate(data):
            strict_parse(item, any_pb2.Any(), f'{where}: error.data[{i}]')


def json_id(value: Any) -> str:
    # Compare ids by their JSON text so 1 != 1.0 != "1" != true.
    return json.dumps(value)


# ---------------------------------------------------------------------------
# Recording transport
# ---------------------------------------------------------------------------


@dataclass
class Exchange:
    method: str
    url: httpx.URL
    request_headers: httpx.Headers
    request_body: bytes
    status: int
    headers: httpx.Headers
    body: bytearray = field(default_factory=bytearray)
    complete: bool = False  # the whole response body was read

    @property
    def content_type(self) -> str:
        return self.headers.get('content-type', '')

    @property
    def request_json(self) -> Any:
        return json.loads(self.request_body)

    def json(self) -> Any:
        return json.loads(bytes(self.body))

    def sse_data(self) -> list[str]:
        """The data of each complete SSE event (W3C event-stream parsing)."""
        text = bytes(self.body).decode('utf-8')
        lines = re.split(r'\r\n|\r|\n', text)
        if not self.complete or text.endswith(('\n', '\r')):
            lines = lines[:-1]  # drop a partial last line
        events, data = [], []
        for line in lines:
            if line == '':
                if data:
                    events.append('\n'.join(data))
                data = []
            elif line.startswith(':'):
                continue
            else:
                key, _, val = line.partition(':')
                if key == 'data':
                    data.append(val[1:] if val.startswith(' ') else val)
        return events


class _TeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, ex: Exchange):
        self._inner = inner
        self._ex = ex

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._ex.body += chunk
            yield chunk
        self._ex.complete = True

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RecordingTransport(httpx.AsyncBaseTransport):
    """One per httpx client (a client closes its transport); all of them
    append to their Recorder's shared list."""

    def __init__(self, exchanges: list[Exchange]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._exchanges = exchanges

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        response = await self._inner.handle_async_request(request)
        ex = Exchange(
            method=request.method,
            url=request.url,
            request_headers=request.headers,
            request_body=body,
            status=response.status_code,
            headers=response.headers,
        )
        self._exchanges.append(ex)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, ex),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class Recorder:
    """Keeps a copy of every HTTP exchange made through its clients."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def http(self, **kwargs: Any) -> httpx.AsyncClient:
        # An explicit transport also keeps httpx from routing loopback
        # traffic through a proxy named in the environment.
        return httpx.AsyncClient(
            transport=_RecordingTransport(self.exchanges), timeout=HTTP_TIMEOUT, **kwargs
        )

    def posts(self) -> list[Exchange]:
        return [ex for ex in self.exchanges if ex.method == 'POST']

    def last_error(self) -> dict[str, Any]:
        """The JSON-RPC error of the last POST (plain JSON body)."""
        ex = self.posts()[-1]
        body = ex.json()
        assert 'error' in body, f'last response is not an error: {body}'
        return body['error']

    # -- verification (run by the `wire` fixture after every test) --------

    def verify_all(self) -> None:
        for n, ex in enumerate(self.exchanges):
            verify_exchange(ex, f'exchange #{n} {ex.method} {ex.url}')


def verify_exchange(ex: Exchange, where: str) -> None:
    if ex.method == 'GET' and ex.url.path == CARD_PATH:
        if ex.status == 200 and ex.complete:
            assert ex.content_type.startswith('application/json'), (
                f'{where}: card content-type {ex.content_type!r}'
            )
            strict_parse(ex.json(), AgentCard(), f'{where}: agent card')
        return
    if ex.method != 'POST' or ex.status != 200:
        return  # e.g. the 415 case: no JSON-RPC body is promised

    try:
        request = json.loads(ex.request_body)
    except ValueError:
        request = None
    if isinstance(request, dict):
        method, request_id = request.get('method'), request.get('id')
    else:  # unparseable or a batch: the answer's id must be null
        method, request_id = None, None

    if ex.content_type.startswith('text/event-stream'):
        assert method in ('SendStreamingMessage', 'SubscribeToTask'), (
            f'{where}: SSE answer to {method!r}'
        )
        events = ex.sse_data()
        assert events or not ex.complete, f'{where}: SSE stream with no events'
        for i, data in enumerate(events):
            try:
                response = json.loads(data)
            except ValueError:
                pytest.fail(f'{where}: SSE event {i} is not JSON: {data!r}')
            check_response(response, method, request_id, f'{where} event {i}')
    elif ex.content_type.startswith('application/json'):
        if ex.complete:
            check_response(ex.json(), method, request_id, where)
    else:
        pytest.fail(f'{where}: HTTP 200 with content-type {ex.content_type!r}')


def check_response(response: Any, method: str | None, request_id: Any, where: str) -> None:
    assert isinstance(response, dict), f'{where}: response is not an object: {response!r}'
    assert response.get('jsonrpc') == '2.0', f'{where}: jsonrpc member {response.get("jsonrpc")!r}'
    assert 'id' in response, f'{where}: response has no id member'
    assert json_id(response['id']) == json_id(request_id), (
        f'{where}: id {response["id"]!r} does not echo {request_id!r}'
    )
    members = set(response) - {'jsonrpc', 'id'}
    assert members in ({'result'}, {'error'}), (
        f'{where}: response members {sorted(response)}; want exactly one of result/error'
    )
    if 'error' in response:
        check_error_object(response['error'], where)
        return
    result_type = RESULT_TYPES.get(method or '')
    assert result_type is not None, f'{where}: a result for unknown method {method!r}'
    if result_type is empty_pb2.Empty and response['result'] is None:
        return
    strict_parse(response['result'], result_type(), f'{where}: {method} result')


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------


@pytest.fixture(scope='session', autouse=True)
def _agentd_url() -> str:
    if not AGENTD_URL:
        pytest.fail('AGENTD_URL is not set; run tests/interop/run.sh <agentd>')
    return AGENTD_URL


@pytest.fixture
def wire() -> Iterator[Recorder]:
    """Records this test's HTTP traffic; checks all of it strictly afterwards."""
    recorder = Recorder()
    yield recorder
    recorder.verify_all()


@asynccontextmanager
async def sdk_client(recorder: Recorder, *, streaming: bool) -> AsyncIterator[Client]:
    """An SDK client built as the SDK intends: A2ACardResolver fetches the
    card, ClientFactory.create(card) picks the interface from it -- so every
    call goes to the URL agentd advertises, not to AGENTD_URL."""
    async with recorder.http() as http:
        card = await A2ACardResolver(http, AGENTD_URL).get_agent_card()
        # ClientFactory adds `A2A-Version: 1.0` to a caller-supplied client.
        factory = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http))
        client = factory.create(card)
        # The factory picks the transport from the card's protocolVersion; a
        # card that slipped to "0.3" would silently get the 0.3 compat
        # transport (old method names) and test the wrong protocol.
        assert type(client._transport) is JsonRpcTransport, client._transport
        try:
            yield client
        finally:
            await client.close()


@pytest.fixture
async def client(wire: Recorder) -> AsyncIterator[Client]:
    """Unary client: SendMessage goes out as `SendMessage`, not streamed."""
    async with sdk_client(wire, streaming=False) as c:
        yield c


@pytest.fixture
async def streaming_client(wire: Recorder) -> AsyncIterator[Client]:
    """Streaming client: SendMessage goes out as `SendStreamingMessage`."""
    async with sdk_client(wire, streaming=True) as c:
        yield c


@pytest.fixture
async def raw(wire: Recorder) -> AsyncIterator[httpx.AsyncClient]:
    """Plain httpx for what the SDK cannot express; no default headers."""
    async with wire.http() as http:
        yield http


def user_message(text: str, *, task_id: str = '', context_id: str = '') -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )


async def send_unary(client: Client, message: Message) -> Task:
    """SendMessage through the SDK; agentd must answer with a Task."""
    with anyio.fail_after(STREAM_TIMEOUT):
        events = [ev async for ev in client.send_message(SendMessageRequest(message=message))]
    assert len(events) == 1, events
    assert events[0].WhichOneof('payload') == 'task', f'expected a Task, got {events[0]}'
    return events[0].task


async def rpc(
    http: httpx.AsyncClient,
    method: str,
    params: Any,
    *,
    request_id: Any = 'raw-1',
    version: str | None = '1.0',
    headers: dict[str, str] | None = None,
) -> tuple[httpx.Response, Any]:
    """One raw JSON-RPC POST; returns the response and its decoded body."""
    hdrs = {'A2A-Version': version} if version is not None else {}
    hdrs.update(headers or {})
    payload = {'jsonrpc': '2.0', 'id': request_id, 'method': method, 'params': params}
    response = await http.post(AGENTD_URL, json=payload, headers=hdrs)
    return response, response.json()


def assert_rpc_error(response: httpx.Response, body: Any, code: int, request_id: Any) -> dict[str, Any]:
    """JSON-RPC errors are HTTP 200, application/json, with the id echoed."""
    assert response.status_code == 200, response.status_code
    assert response.headers.get('content-type', '').startswith('application/json')
    assert isinstance(body, dict) and 'error' in body, body
    assert body['error']['code'] == code, body['error']
    assert json_id(body['id']) == json_id(request_id), body
    return body['error']


def error_info(error: dict[str, Any]) -> dict[str, Any] | None:
    for item in error.get('data') or []:
        if isinstance(item, dict) and item.get('@type') == ERROR_INFO_TYPE:
            return item
    return None


def assert_typed(excinfo: pytest.ExceptionInfo, cls: type[A2AError], code: int, wire: Recorder) -> None:
    """The SDK raised its own class for `code`, and the wire agrees.

    A2A-specific errors (-32001..-32009) also carry a google.rpc.ErrorInfo
    whose reason is the one the SDK's own table gives for that class.
    """
    assert type(excinfo.value) is cls, f'SDK raised {excinfo.value!r}, not {cls.__name__}'
    assert JSON_RPC_ERROR_CODE_MAP[cls] == code
    error = wire.last_error()
    assert error['code'] == code, error
    if -32099 <= code <= -32000:
        info = error_info(error)
        assert info is not None, f'no ErrorInfo in {error}'
        assert info['reason'] == A2A_ERROR_REASONS[cls], info
        assert info['domain'] == A2A_DOMAIN, info


@dataclass
class Seed:
    task: Task
    message: Message


@pytest.fixture(scope='session')
async def seeded(anyio_backend: str) -> list[Seed]:
    """Three tasks made once through the SDK, each in its own new context,
    for the read-side tests (GetTask, ListTasks, Cancel, Subscribe...)."""
    recorder = Recorder()
    seeds = []
    async with sdk_client(recorder, streaming=False) as c:
        for n in range(3):
            message = user_message(f'interop seed {n}')
            seeds.append(Seed(await send_unary(c, message), message))
    recorder.verify_all()
    assert len({s.task.id for s in seeds}) == 3, 'task ids are not unique'
    return seeds


async def list_all(client: Client, **filters: Any) -> ListTasksResponse:
    response = await client.list_tasks(ListTasksRequest(page_size=100, **filters))
    assert response.next_page_token == '', 'more than 100 tasks: the run is polluted'
    return response


# ---------------------------------------------------------------------------
# Agent card
# ---------------------------------------------------------------------------


async def test_agent_card(wire: Recorder) -> None:
    # No A2A-Version header and no credential: the card must still answer.
    async with wire.http() as http:
        card = await A2ACardResolver(http, AGENTD_URL).get_agent_card()
    assert card.name
    assert card.supported_interfaces, 'no supportedInterfaces'
    iface = card.supported_interfaces[0]
    assert iface.protocol_binding == 'JSONRPC'
    assert iface.protocol_version == '1.0'
    assert iface.url == AGENTD_URL
    caps = card.capabilities
    assert caps.HasField('streaming') and caps.streaming is True
    assert caps.push_notifications is False
    assert caps.extended_agent_card is False

    # The resolver parsed leniently after rewriting legacy fields; parse the
    # bytes that came over the wire strictly (verify_all does it again).
    (ex,) = wire.exchanges
    assert 'A2A-Version' not in ex.request_headers
    strict_parse(ex.json(), AgentCard(), 'agent card')


# ---------------------------------------------------------------------------
# SendMessage
# ---------------------------------------------------------------------------


async def test_send_message_is_rejected_without_agent(client: Client, wire: Recorder) -> None:
    message = user_message('hello from the a2a-sdk interop suite')
    task = await send_unary(client, message)

    assert wire.posts()[-1].request_json['method'] == 'SendMessage'
    assert task.id
    assert task.context_id
    assert task.status.state == TaskState.TASK_STATE_REJECTED

    # The rejection explains itself in an agent-authored status message.
    assert task.status.HasField('message')
    status_message = task.status.message
    assert status_message.role == Role.ROLE_AGENT
    text = ' '.join(p.text for p in status_message.parts if p.HasField('text'))
    assert re.search(r'\bagent\b', text, re.I) and 'configured' in text.lower(), text

    # The user's message is kept, under the id the client chose.
    sent = [m for m in task.history if m.message_id == message.message_id]
    assert len(sent) == 1, [m.message_id for m in task.history]
    assert sent[0].role == Role.ROLE_USER
    assert [p.text for p in sent[0].parts] == [message.parts[0].text]


async def test_send_message_to_terminal_task_is_unsupported(
    client: Client, wire: Recorder, seeded: list[Seed]
) -> None:
    done = seeded[0].task
    with pytest.raises(A2AError) as excinfo:
        await send_unary(
            client, user_message('one more thing', task_id=done.id, context_id=done.context_id)
        )
    assert_typed(excinfo, UnsupportedOperationError, -32004, wire)


async def test_send_message_in_existing_context_starts_a_new_task(
    client: Client, seeded: list[Seed]
) -> None:
    # A contextId without a taskId is the A2A way to continue a conversation
    # after its task ended; the ListTasks context filter relies on it too.
    base = seeded[0].task
    task = await send_unary(client, user_message('same context', context_id=base.context_id))
    assert task.id and task.id != base.id
    assert task.context_id == base.context_id
    assert task.status.state == TaskState.TASK_STATE_REJECTED


# ---------------------------------------------------------------------------
# SendStreamingMessage
# ---------------------------------------------------------------------------


async def test_send_streaming_message(
    streaming_client: Client, client: Client, wire: Recorder
) -> None:
    message = user_message('stream this')
    request = SendMessageRequest(message=message)
    # fail_after: "the stream ends" -- a stream left open would hang here.
    with anyio.fail_after(STREAM_TIMEOUT):
        events = [ev async for ev in streaming_client.send_message(request)]

    ex = next(e for e in wire.posts() if e.request_json['method'] == 'SendStreamingMessage')
    assert ex.content_type.startswith('text/event-stream'), ex.content_type
    assert ex.complete

    kinds = [ev.WhichOneof('payload') for ev in events]
    assert kinds and kinds[0] == 'task', kinds
    first = events[0].task
    assert first.id and first.context_id
    assert first.status.state == TaskState.TASK_STATE_SUBMITTED

    assert kinds[-1] == 'status_update', kinds
    last = events[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_REJECTED
    assert (last.task_id, last.context_id) == (first.id, first.context_id)

    # Everything in between belongs to the same task; no bare Message.
    for ev, kind in zip(events[1:], kinds[1:], strict=True):
        assert kind in ('task', 'status_update', 'artifact_update'), kind
        inner = getattr(ev, kind)
        task_id = inner.id if kind == 'task' else inner.task_id
        assert task_id == first.id

    # The streamed task is stored like any other.
    stored = await client.get_task(GetTaskRequest(id=first.id))
    assert stored.status.state == TaskState.TASK_STATE_REJECTED
    assert message.message_id in [m.message_id for m in stored.history]


# ---------------------------------------------------------------------------
# GetTask
# ---------------------------------------------------------------------------


async def test_get_task_history_length(client: Client, wire: Recorder, seeded: list[Seed]) -> None:
    seed = seeded[0]

    full = await client.get_task(GetTaskRequest(id=seed.task.id))
    assert (full.id, full.context_id) == (seed.task.id, seed.task.context_id)
    assert full.status.state == TaskState.TASK_STATE_REJECTED
    assert seed.message.message_id in [m.message_id for m in full.history]
    assert 'historyLength' not in wire.posts()[-1].request_json['params']

    none = await client.get_task(GetTaskRequest(id=seed.task.id, history_length=0))
    # historyLength has presence in the proto, so the SDK really sends the 0.
    assert wire.posts()[-1].request_json['params'].get('historyLength') == 0
    assert list(none.history) == []
    assert none.status.state == TaskState.TASK_STATE_REJECTED


async def test_get_task_unknown_id(client: Client, wire: Recorder) -> None:
    with pytest.raises(A2AError) as excinfo:
        await client.get_task(GetTaskRequest(id=str(uuid.uuid4())))
    assert_typed(excinfo, TaskNotFoundError, -32001, wire)


# ---------------------------------------------------------------------------
# ListTasks
# ---------------------------------------------------------------------------


async def test_list_tasks_returns_created_tasks(client: Client, seeded: list[Seed]) -> None:
    response = await list_all(client)
    ids = [t.id for t in response.tasks]
    assert len(ids) == len(set(ids)), 'a task is listed twice'
    assert {s.task.id for s in seeded} <= set(ids)
    assert response.total_size == len(ids)


async def test_list_tasks_paging(client: Client, seeded: list[Seed]) -> None:
    expected = {t.id for t in (await list_all(client)).tasks}

    seen: list[str] = []
    token = ''
    for _ in range(len(expected) + 2):  # bound: a token loop must not hang the run
        page = await client.list_tasks(ListTasksRequest(page_size=1, page_token=token))
        assert len(page.tasks) <= 1
        assert page.page_size == 1
        assert page.total_size == len(expected)
        seen.extend(t.id for t in page.tasks)
        token = page.next_page_token
        if token == '':
            break
    else:
        pytest.fail(f'paging did not end after {len(seen)} pages')

    assert len(seen) == len(set(seen)), f'a task came back on two pages: {seen}'
    assert set(seen) == expected


async def test_list_tasks_by_context(client: Client, seeded: list[Seed]) -> None:
    context_id = seeded[1].task.context_id
    response = await list_all(client, context_id=context_id)
    assert response.tasks
    assert all(t.context_id == context_id for t in response.tasks)
    ids = {t.id for t in response.tasks}
    assert seeded[1].task.id in ids
    assert seeded[2].task.id not in ids  # its own context
    assert response.total_size == len(response.tasks)


async def test_list_tasks_by_status(client: Client, seeded: list[Seed]) -> None:
    rejected = await list_all(client, status=TaskState.TASK_STATE_REJECTED)
    assert {s.task.id for s in seeded} <= {t.id for t in rejected.tasks}
    assert all(t.status.state == TaskState.TASK_STATE_REJECTED for t in rejected.tasks)

    # Nothing completes without an agent, so this filter must match nothing.
    completed = await list_all(client, status=TaskState.TASK_STATE_COMPLETED)
    assert list(completed.tasks) == []
    assert completed.total_size == 0


async def test_list_tasks_omits_artifacts_unless_asked(raw: httpx.AsyncClient, seeded: list[Seed]) -> None:
    # Checked on the raw JSON: a parsed proto cannot tell `[]` from absent.
    response, body = await rpc(raw, 'ListTasks', {'pageSize': 100})
    assert response.status_code == 200
    tasks = body['result']['tasks']
    assert tasks
    assert not [t['id'] for t in tasks if 'artifacts' in t]


@pytest.mark.parametrize('page_size', [0, 101])
async def test_list_tasks_page_size_out_of_range(client: Client, wire: Recorder, page_size: int) -> None:
    with pytest.raises(A2AError) as excinfo:
        await client.list_tasks(ListTasksRequest(page_size=page_size))
    # pageSize has presence, so even 0 is on the wire.
    assert wire.posts()[-1].request_json['params'] == {'pageSize': page_size}
    assert_typed(excinfo, InvalidParamsError, -32602, wire)


async def test_list_tasks_garbage_page_token(client: Client, wire: Recorder) -> None:
    with pytest.raises(A2AError) as excinfo:
        await client.list_tasks(ListTasksRequest(page_token='not-a-token!'))
    assert_typed(excinfo, InvalidParamsError, -32602, wire)


# ---------------------------------------------------------------------------
# CancelTask
# ---------------------------------------------------------------------------


async def test_cancel_terminal_task(client: Client, wire: Recorder, seeded: list[Seed]) -> None:
    with pytest.raises(A2AError) as excinfo:
        await client.cancel_task(CancelTaskRequest(id=seeded[0].task.id))
    assert_typed(excinfo, TaskNotCancelableError, -32002, wire)


async def test_cancel_unknown_task(client: Client, wire: Recorder) -> None:
    with pytest.raises(A2AError) as excinfo:
        await client.cancel_task(CancelTaskRequest(id=str(uuid.uuid4())))
    assert_typed(excinfo, TaskNotFoundError, -32001, wire)


# ---------------------------------------------------------------------------
# SubscribeToTask
# ---------------------------------------------------------------------------


async def _drain_subscription(client: Client, task_id: str) -> None:
    with anyio.fail_after(STREAM_TIMEOUT):
        async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            pytest.fail(f'subscription yielded an event: {event}')


async def test_subscribe_to_terminal_task(
    streaming_client: Client, wire: Recorder, seeded: list[Seed]
) -> None:
    with pytest.raises(A2AError) as excinfo:
        await _drain_subscription(streaming_client, seeded[0].task.id)
    # The refusal comes before any stream starts: plain JSON, not an SSE
    # error event. The SDK accepts both, so look at the wire.
    ex = wire.posts()[-1]
    assert ex.request_headers.get('accept') == 'text/event-stream'
    assert ex.content_type.startswith('application/json'), ex.content_type
    assert_typed(excinfo, UnsupportedOperationError, -32004, wire)


async def test_subscribe_to_unknown_task(streaming_client: Client, wire: Recorder) -> None:
    with pytest.raises(A2AError) as excinfo:
        await _drain_subscription(streaming_client, str(uuid.uuid4()))
    assert wire.posts()[-1].content_type.startswith('application/json')
    assert_typed(excinfo, TaskNotFoundError, -32001, wire)


# ---------------------------------------------------------------------------
# Push notification configs (agentd declares pushNotifications: false)
# ---------------------------------------------------------------------------

PUSH_CALLS = {
    'CreateTaskPushNotificationConfig': lambda c, task_id: c.create_task_push_notification_config(
        TaskPushNotificationConfig(task_id=task_id, url='https://push.invalid/hook')
    ),
    'GetTaskPushNotificationConfig': lambda c, task_id: c.get_task_push_notification_config(
        GetTaskPushNotificationConfigRequest(task_id=task_id, id='cfg-1')
    ),
    'ListTaskPushNotificationConfigs': lambda c, task_id: c.list_task_push_notification_configs(
        ListTaskPushNotificationConfigsRequest(task_id=task_id)
    ),
    'DeleteTaskPushNotificationConfig': lambda c, task_id: c.delete_task_push_notification_config(
        DeleteTaskPushNotificationConfigRequest(task_id=task_id, id='cfg-1')
    ),
}


@pytest.mark.parametrize('method', sorted(PUSH_CALLS))
async def test_push_config_methods_unsupported(
    client: Client, wire: Recorder, seeded: list[Seed], method: str
) -> None:
    # An existing task, so "not supported" cannot be confused with "not found".
    with pytest.raises(A2AError) as excinfo:
        await PUSH_CALLS[method](client, seeded[0].task.id)
    assert wire.posts()[-1].request_json['method'] == method
    assert_typed(excinfo, PushNotificationNotSupportedError, -32003, wire)


# ---------------------------------------------------------------------------
# GetExtendedAgentCard
# ---------------------------------------------------------------------------


async def test_extended_agent_card_unsupported(raw: httpx.AsyncClient) -> None:
    # Raw on purpose: with capabilities.extendedAgentCard false the SDK's
    # get_extended_agent_card() returns the public card without a request.
    response, body = await rpc(raw, 'GetExtendedAgentCard', {}, request_id='card-1')
    error = assert_rpc_error(response, body, -32004, 'card-1')
    info = error_info(error)
    assert info and info['reason'] == 'UNSUPPORTED_OPERATION' and info['domain'] == A2A_DOMAIN


# ---------------------------------------------------------------------------
# Raw JSON-RPC / HTTP edge cases
# ---------------------------------------------------------------------------


async def test_unknown_method(raw: httpx.AsyncClient) -> None:
    # The 0.3 method name: a 1.0 daemon must not half-understand it.
    params = {'message': json_format.MessageToDict(user_message('old-style'))}
    response, body = await rpc(raw, 'message/send', params, request_id='m-1')
    assert_rpc_error(response, body, -32601, 'm-1')


async def test_invalid_json(raw: httpx.AsyncClient) -> None:
    response = await raw.post(
        AGENTD_URL,
        content=b'{"jsonrpc": "2.0", "id": 1, "method": ',
        headers={'content-type': 'application/json', 'A2A-Version': '1.0'},
    )
    body = response.json()
    # The id could not be read, so it is null -- present, not omitted.
    assert 'id' in body and body['id'] is None
    assert_rpc_error(response, body, -32700, None)


async def test_batch_is_refused(raw: httpx.AsyncClient) -> None:
    batch = [{'jsonrpc': '2.0', 'id': 1, 'method': 'ListTasks', 'params': {}}]
    response = await raw.post(AGENTD_URL, json=batch, headers={'A2A-Version': '1.0'})
    body = response.json()
    assert isinstance(body, dict), f'batch answered with {type(body).__name__}'
    assert_rpc_error(response, body, -32600, None)


async def test_missing_version_header(raw: httpx.AsyncClient) -> None:
    response, body = await rpc(raw, 'ListTasks', {}, request_id='v-1', version=None)
    error = assert_rpc_error(response, body, -32009, 'v-1')
    info = error_info(error)
    assert info is not None, error
    assert info['reason'] == 'VERSION_NOT_SUPPORTED'
    assert info['domain'] == A2A_DOMAIN


async def test_text_plain_is_unsupported_media_type(raw: httpx.AsyncClient) -> None:
    payload = json.dumps({'jsonrpc': '2.0', 'id': 1, 'method': 'ListTasks', 'params': {}})
    response = await raw.post(
        AGENTD_URL,
        content=payload.encode(),
        headers={'content-type': 'text/plain', 'A2A-Version': '1.0'},
    )
    assert response.status_code == 415


async def test_json_content_type_with_charset(raw: httpx.AsyncClient) -> None:
    # Other clients (browsers' fetch, some SDKs) add a charset parameter.
    payload = json.dumps({'jsonrpc': '2.0', 'id': 5, 'method': 'ListTasks', 'params': {}})
    response = await raw.post(
        AGENTD_URL,
        content=payload.encode(),
        headers={'content-type': 'application/json; charset=utf-8', 'A2A-Version': '1.0'},
    )
    assert response.status_code == 200
    assert 'result' in response.json()


@pytest.mark.parametrize(
    'request_id',
    ['req-7f3a', '', 42, 0, -7, 9007199254740993],
    ids=['string', 'empty-string', 'number', 'zero', 'negative', 'beyond-f64'],
)
async def test_id_is_echoed_exactly(raw: httpx.AsyncClient, request_id: Any) -> None:
    # 2**53 + 1 does not survive a round trip through a float.
    response, body = await rpc(raw, 'ListTasks', {'pageSize': 1}, request_id=request_id)
    assert response.status_code == 200
    assert 'result' in body, body
    assert json_id(body['id']) == json_id(request_id)


# ---------------------------------------------------------------------------
# A workflow task through the command extension, with its input-required turn
# ---------------------------------------------------------------------------

COMMAND_URI = 'https://agentd.dev/a2a/ext/command'


def data_part(value: Any) -> Part:
    return json_format.ParseDict({'data': value, 'mediaType': 'application/json'}, Part())


async def test_workflow_task_with_an_input_required_turn(client: Client, wire: Recorder) -> None:
    # The command: one DataPart under `agentd`, marked in message.extensions and
    # activated by the A2A-Extensions header the SDK sends from the call context.
    command = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER)
    command.extensions.append(COMMAND_URI)
    command.parts.append(data_part({'agentd': {'op': 'interop.start', 'ticket': 42}}))
    context = ClientCallContext(service_parameters={'A2A-Extensions': COMMAND_URI})
    with anyio.fail_after(STREAM_TIMEOUT):
        events = [
            ev async for ev in client.send_message(SendMessageRequest(message=command), context=context)
        ]
    assert events[0].WhichOneof('payload') == 'task', events
    task = events[0].task
    sent = wire.posts()[-1]
    assert sent.request_json['method'] == 'SendMessage'

    # The blocking send returns at the gate: input-required, the question in the status.
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
    question = ' '.join(p.text for p in task.status.message.parts if p.HasField('text'))
    assert question == 'Approve ticket 42?', question

    # An answer the gate's schema does not admit is refused; the gate stays open.
    with pytest.raises(A2AError) as excinfo:
        await send_unary(client, user_message('maybe', task_id=task.id, context_id=task.context_id))
    assert_typed(excinfo, InvalidParamsError, -32602, wire)
    still = await client.get_task(GetTaskRequest(id=task.id))
    assert still.status.state == TaskState.TASK_STATE_INPUT_REQUIRED

    # The answer continues the same task to its end; the result artifact is the last
    # step's output.
    answer = Message(
        message_id=str(uuid.uuid4()), role=Role.ROLE_USER, task_id=task.id, context_id=task.context_id
    )
    answer.parts.append(data_part({'approve': True}))
    done = await send_unary(client, answer)
    assert done.id == task.id
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    results = [a for a in done.artifacts if a.artifact_id == f'{task.id}.result']
    assert len(results) == 1, [a.artifact_id for a in done.artifacts]
    assert json_format.MessageToDict(results[0].parts[0])['data'] == {'ticket': 42, 'approved': True}
    assert answer.message_id in [m.message_id for m in done.history]
