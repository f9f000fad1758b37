"""agentd's answers validated against the A2A project's published JSON Schema for 1.0
(../shared/reference/a2a/a2a-v1.0.1.schema.json), by Python's ``jsonschema``: a validator
that is not ours, over a schema we did not write.

The published bundle's ``$ref``s name per-file documents (``lf.a2a.v1.Task.jsonschema.json``)
that the bundle does not contain; its definitions are keyed by the same names with spaces
inserted ("Task Status"). The registry below resolves each reference to its definition.
The bundle carries no ``required`` lists and allows snake_case aliases, so it checks field
names, types and enum values; the strict protobuf parsing in test_interop.py covers the rest.
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO = pathlib.Path(__file__).resolve().parents[2]
# AGENTD_A2A_SCHEMA names the file; else AGENTD_SHARED or ../shared holds reference/ (as for
# the Rust agreement checks).
SCHEMA = pathlib.Path(
    os.environ.get('AGENTD_A2A_SCHEMA')
    or pathlib.Path(os.environ.get('AGENTD_SHARED') or REPO.parent / 'shared')
    / 'reference/a2a/a2a-v1.0.1.schema.json'
)


def _load() -> tuple[dict, Registry]:
    if not SCHEMA.exists():
        # At import time: a failure is a collection error (pytest exits non-zero), a skip
        # must say it is for the whole module.
        if os.environ.get('CI'):
            pytest.fail(f'reference schema missing in CI: {SCHEMA}', pytrace=False)
        pytest.skip(
            f'reference schema not found at {SCHEMA} (set AGENTD_SHARED or AGENTD_A2A_SCHEMA): '
            'the agreement checks against the published A2A schema are skipped',
            allow_module_level=True,
        )
    bundle = json.loads(SCHEMA.read_text())
    definitions = bundle['definitions']
    resources = []
    for name, schema in definitions.items():
        proto = name.replace(' ', '')
        package = 'google.protobuf' if proto in ('Struct', 'Timestamp', 'Value') else 'lf.a2a.v1'
        uri = f'{package}.{proto}.jsonschema.json'
        resources.append((uri, Resource(contents=schema, specification=DRAFT202012)))
    return definitions, Registry().with_resources(resources)


DEFINITIONS, REGISTRY = _load()


def validate(definition: str, instance: object) -> None:
    validator = Draft202012Validator(DEFINITIONS[definition], registry=REGISTRY)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f'{definition}: ' + '; '.join(
        f'{"/".join(map(str, e.path))}: {e.message}' for e in errors
    )


@pytest.fixture(scope='module')
def http() -> httpx.Client:
    with httpx.Client(base_url=os.environ['AGENTD_URL'], timeout=10) as c:
        yield c


def call(http: httpx.Client, method: str, params: dict) -> dict:
    r = http.post(
        '/',
        headers={'content-type': 'application/json', 'a2a-version': '1.0'},
        json={'jsonrpc': '2.0', 'id': 1, 'method': method, 'params': params},
    )
    body = r.json()
    assert 'result' in body, body
    return body['result']


def message(text: str) -> dict:
    return {'role': 'ROLE_USER', 'messageId': str(uuid.uuid4()), 'parts': [{'text': text}]}


def test_schema_resolves_and_rejects_what_it_should(http: httpx.Client) -> None:
    # The check bites: a 0.3-style task (kind discriminator, lower-case state) fails.
    with pytest.raises(AssertionError):
        validate('Task', {'kind': 'task', 'id': 't', 'status': {'state': 'completed'}})


def test_card(http: httpx.Client) -> None:
    validate('Agent Card', http.get('/.well-known/agent-card.json').json())


def test_send_get_list_cancel_results(http: httpx.Client) -> None:
    sent = call(http, 'SendMessage', {'message': message('hi')})
    validate('Send Message Response', sent)
    task_id = sent['task']['id']
    validate('Task', call(http, 'GetTask', {'id': task_id}))
    validate('List Tasks Response', call(http, 'ListTasks', {'pageSize': 5, 'includeArtifacts': True}))
    immediate = call(http, 'SendMessage', {'message': message('x'), 'configuration': {'returnImmediately': True}})
    validate('Send Message Response', immediate)


def test_stream_frames(http: httpx.Client) -> None:
    frames = []
    with http.stream(
        'POST',
        '/',
        headers={'content-type': 'application/json', 'a2a-version': '1.0', 'accept': 'text/event-stream'},
        json={'jsonrpc': '2.0', 'id': 's', 'method': 'SendStreamingMessage', 'params': {'message': message('hi')}},
    ) as r:
        assert r.headers['content-type'] == 'text/event-stream'
        for line in r.iter_lines():
            if line.startswith('data: '):
                frames.append(json.loads(line[len('data: '):]))
    assert len(frames) >= 2
    for f in frames:
        validate('Stream Response', f['result'])
