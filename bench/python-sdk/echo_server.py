"""Echo agent on the official A2A Python SDK (a2a-sdk 1.3.0): the `python-sdk` peer of bench/run.sh.

Built the way the SDK's own server side is meant to be assembled in 1.3.0 (there is no
ready-made app class any more; the SDK hands out Starlette routes):

  - an `AgentCard` with one `AgentInterface` (protocol_binding JSONRPC, protocol_version 1.0)
    at http://<host>:<port>/, served by `create_agent_card_routes` at
    /.well-known/agent-card.json;
  - `DefaultRequestHandler` (= `DefaultRequestHandlerV2`) over an `InMemoryTaskStore`;
  - `create_jsonrpc_routes(handler, '/')`: the JSON-RPC binding on POST /, which insists on
    the `A2A-Version: 1.0` header (without it the request is treated as 0.3 and refused);
  - a Starlette app with those routes, served by uvicorn (one process, one event loop).

The agent answers every SendMessage by completing a task: it publishes the Task (SUBMITTED,
with the user message in its history), one artifact whose single text part echoes the user's
text, then a COMPLETED status. A blocking SendMessage therefore returns
`{"result": {"task": {... "state": "TASK_STATE_COMPLETED", "artifacts": [...]}}}`.
That is the SDK's full task path (task store writes, the active-task registry, the event
queue), the closest match to agentd's `send` scenario, where the daemon also creates and
stores a task for every message.

Usage: python echo_server.py --host 127.0.0.1 --port N
"""

from __future__ import annotations

import argparse
import logging

import uvicorn
from starlette.applications import Starlette

from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
)


class EchoAgentExecutor(AgentExecutor):
    """Completes each task with one artifact that echoes the user's text."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.add_artifact([Part(text=context.get_user_input())], name='echo')
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def build_card(url: str) -> AgentCard:
    return AgentCard(
        name='bench-echo',
        description='Echo agent for the agentd benchmark (a2a-sdk reference server).',
        version='1.0.0',
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding='JSONRPC', protocol_version='1.0'),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[
            AgentSkill(
                id='echo',
                name='echo',
                description='Echoes the text it is sent, as an artifact of a completed task.',
                tags=['echo', 'bench'],
            ),
        ],
    )


def build_app(url: str) -> Starlette:
    card = build_card(url)
    handler = DefaultRequestHandler(
        agent_executor=EchoAgentExecutor(),
        task_store=InMemoryTaskStore(),
        agent_card=card,
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, '/')
    return Starlette(routes=routes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--port', type=int, required=True)
    args = ap.parse_args()
    if args.host not in ('127.0.0.1', 'localhost', '::1'):
        ap.error('loopback only')
    app = build_app(f'http://{args.host}:{args.port}/')
    # warning: no access log line per request (agentd logs none either under load).
    logging.basicConfig(level=logging.WARNING)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop='uvloop',
        http='httptools',
        access_log=False,
        log_level='warning',
        lifespan='off',
        timeout_graceful_shutdown=1,
    )


if __name__ == '__main__':
    main()
