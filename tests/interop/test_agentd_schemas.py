"""agentd's own bundles (schemas/) read by Python's ``jsonschema``: a validator that is
not agentd's.

* every golden example validates against its checked-in bundle;
* the bundles agree with the published reference bundles (../shared/reference/agentd):
  our examples validate against theirs and theirs against ours;
* live answers of the running daemon validate: the status document against the command
  bundle's result schema, and task annotations against the task-annotations bundle.
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid

import httpx
import pytest
from jsonschema import Draft202012Validator, FormatChecker

REPO = pathlib.Path(__file__).resolve().parents[2]
OURS = REPO / 'schemas'
# AGENTD_REFERENCE names the directory; else AGENTD_SHARED or ../shared holds reference/ (as for
# the Rust agreement checks).
REFERENCE = pathlib.Path(
    os.environ.get('AGENTD_REFERENCE')
    or pathlib.Path(os.environ.get('AGENTD_SHARED') or REPO.parent / 'shared') / 'reference/agentd'
)
NAMES = ['command', 'events', 'task-annotations']
COMMAND_URI = 'https://agentd.dev/a2a/ext/command'
ANNOTATIONS_URI = 'https://agentd.dev/a2a/ext/task-annotations'


def load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def validator(schema: dict, sub: str | None = None) -> Draft202012Validator:
    """A validator for the bundle, or for a schema inside it (a JSON pointer), with the
    bundle as the resolution root so its internal $refs work."""
    target = schema if sub is None else {'$ref': f'{schema["$id"]}#{sub}', '$defs': {}}
    if sub is not None:
        from referencing import Registry, Resource
        registry = Registry().with_resource(schema['$id'], Resource.from_contents(schema))
        return Draft202012Validator(target, registry=registry, format_checker=FormatChecker())
    return Draft202012Validator(target, format_checker=FormatChecker())


def errors(v: Draft202012Validator, doc: object) -> list[str]:
    return [f'{"/".join(map(str, e.path))}: {e.message}' for e in v.iter_errors(doc)]


def examples(root: pathlib.Path, name: str) -> list[pathlib.Path]:
    return sorted(p for p in (root / name / 'examples').glob('*.json'))


def reference_available() -> bool:
    if REFERENCE.exists():
        return True
    if os.environ.get('CI'):
        pytest.fail(f'reference bundles missing in CI: {REFERENCE}', pytrace=False)
    return False


@pytest.mark.parametrize('name', NAMES)
def test_bundle_is_a_valid_schema(name: str) -> None:
    Draft202012Validator.check_schema(load(OURS / name / 'schema.json'))


@pytest.mark.parametrize('name', ['command', 'task-annotations'])
def test_golden_examples_validate_against_our_bundle(name: str) -> None:
    v = validator(load(OURS / name / 'schema.json'))
    found = examples(OURS, name)
    assert found, f'no golden examples for {name}'
    for path in found:
        assert not errors(v, load(path)), f'{path.name}: {errors(v, load(path))}'


@pytest.mark.parametrize('name', ['command', 'task-annotations'])
def test_our_examples_validate_against_the_reference(name: str) -> None:
    if not reference_available():
        pytest.skip(f'reference bundles not found at {REFERENCE} (set AGENTD_SHARED or AGENTD_REFERENCE)')
    theirs = load(REFERENCE / name / 'schema.json')
    # The seed adds askChannel to the annotations; the older published bundle is closed
    # without it, so that one member is the documented difference.
    if name == 'task-annotations':
        theirs['properties'].setdefault('askChannel', {'type': 'string'})
    v = validator(theirs)
    for path in examples(OURS, name):
        assert not errors(v, load(path)), f'{path.name}: {errors(v, load(path))}'


@pytest.mark.parametrize('name', ['command', 'task-annotations'])
def test_reference_examples_validate_against_ours(name: str) -> None:
    if not reference_available():
        pytest.skip(f'reference bundles not found at {REFERENCE} (set AGENTD_SHARED or AGENTD_REFERENCE)')
    v = validator(load(OURS / name / 'schema.json'))
    for path in sorted((REFERENCE / name / 'examples').glob('*.json')):
        assert not errors(v, load(path)), f'{path.name}: {errors(v, load(path))}'


@pytest.fixture(scope='module')
def http() -> httpx.Client:
    with httpx.Client(base_url=os.environ['AGENTD_URL'], timeout=10) as c:
        yield c


def post(http: httpx.Client, body: dict, extensions: list[str]) -> httpx.Response:
    headers = {'content-type': 'application/json', 'a2a-version': '1.0'}
    if extensions:
        headers['a2a-extensions'] = ', '.join(extensions)
    return http.post('/', headers=headers, json=body)


def test_live_status_document_matches_the_command_bundle(http: httpx.Client) -> None:
    bundle = load(OURS / 'command' / 'schema.json')
    r = post(http, {'jsonrpc': '2.0', 'id': 1, 'method': 'SendMessage', 'params': {'message': {
        'role': 'ROLE_USER', 'messageId': str(uuid.uuid4()), 'extensions': [COMMAND_URI],
        'parts': [{'data': {'agentd': {'op': 'status'}}}]}}}, [COMMAND_URI])
    assert r.headers.get('a2a-extensions') == COMMAND_URI
    message = r.json()['result']['message']
    assert message['extensions'] == [COMMAND_URI]
    document = message['parts'][0]['data']
    v = validator(bundle, '/$defs/ops/status/result')
    assert not errors(v, document), errors(v, document)
    # The check bites: a document missing a required member fails.
    assert errors(v, {k: val for k, val in document.items() if k != 'instance'})


def test_live_annotations_match_the_task_annotations_bundle(http: httpx.Client) -> None:
    v = validator(load(OURS / 'task-annotations' / 'schema.json'))
    r = post(http, {'jsonrpc': '2.0', 'id': 2, 'method': 'SendMessage', 'params': {'message': {
        'role': 'ROLE_USER', 'messageId': str(uuid.uuid4()), 'parts': [{'text': 'hi'}]}}}, [ANNOTATIONS_URI])
    assert r.headers.get('a2a-extensions') == ANNOTATIONS_URI
    annotations = r.json()['result']['task']['metadata'][ANNOTATIONS_URI]
    assert not errors(v, annotations), errors(v, annotations)
    states = [h['state'] for h in annotations['statusHistory']]
    assert states[0] == 'TASK_STATE_SUBMITTED' and states[-1] == 'TASK_STATE_REJECTED'
    # Without activation: no metadata at all.
    plain = post(http, {'jsonrpc': '2.0', 'id': 3, 'method': 'GetTask',
                        'params': {'id': r.json()['result']['task']['id']}}, [])
    assert 'a2a-extensions' not in plain.headers
    assert 'metadata' not in plain.json()['result']
