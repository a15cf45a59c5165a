"""Drives the brain's A2A server with the official Python SDK (PyPI a2a-sdk), for
brain/tests/all/a2a.rs. Prints one JSON object on stdout: what the client got, or the
error it raised (its class, message and the A2A error's data).

    client.py SCENARIO BASE_URL BEARER [ARG...]

BASE_URL is the agent's (http://host/a2a/<agent_id>); the card is resolved from it.
"""

import asyncio
import json
import sys
import uuid

import httpx
from google.protobuf.json_format import MessageToDict

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    ListTaskPushNotificationConfigsRequest,
)

# Generous: the machine running the tests is shared and may be slow.
TIMEOUT = httpx.Timeout(120.0)


def as_dict(message):
    return MessageToDict(message, preserving_proto_field_name=False)


def http(bearer):
    return httpx.AsyncClient(
        headers={"Authorization": f"Bearer {bearer}"}, timeout=TIMEOUT
    )


async def card_of(base_url, bearer):
    async with http(bearer) as client:
        return await A2ACardResolver(client, base_url).get_agent_card()


async def client_for(base_url, bearer, streaming):
    card = await card_of(base_url, bearer)
    config = ClientConfig(streaming=streaming, httpx_client=http(bearer))
    return ClientFactory(config).create(card)


def user_message(text, context_id=None):
    message = Message(
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        message_id=str(uuid.uuid4()),
    )
    if context_id:
        message.context_id = context_id
    return message


async def send(base_url, bearer, streaming, text, context_id=None):
    client = await client_for(base_url, bearer, streaming)
    events = []
    async for event in client.send_message(
        SendMessageRequest(message=user_message(text, context_id))
    ):
        events.append(as_dict(event))
    return {"events": events}


async def cancel_while_streaming(base_url, bearer, text):
    """Streams a send, cancels its task once text arrived, reads the stream to its end."""
    client = await client_for(base_url, bearer, True)
    canceller = await client_for(base_url, bearer, False)
    events, cancelled = [], None
    async for event in client.send_message(
        SendMessageRequest(message=user_message(text))
    ):
        events.append(as_dict(event))
        if cancelled is None and event.HasField("artifact_update"):
            task_id = event.artifact_update.task_id
            cancelled = as_dict(
                await canceller.cancel_task(CancelTaskRequest(id=task_id))
            )
    return {"events": events, "cancelled": cancelled}


async def run(scenario, base_url, bearer, args):
    if scenario == "card":
        return as_dict(await card_of(base_url, bearer))
    if scenario == "send":
        return await send(base_url, bearer, False, *args)
    if scenario == "stream":
        return await send(base_url, bearer, True, *args)
    if scenario == "cancel":
        return await cancel_while_streaming(base_url, bearer, *args)
    if scenario == "subscribe":
        client = await client_for(base_url, bearer, True)
        events = []
        async for event in client.subscribe(SubscribeToTaskRequest(id=args[0])):
            events.append(as_dict(event))
        return {"events": events}
    client = await client_for(base_url, bearer, False)
    if scenario == "get":
        return as_dict(await client.get_task(GetTaskRequest(id=args[0])))
    if scenario == "list":
        request = ListTasksRequest(include_artifacts=True)
        if args:
            request.context_id = args[0]
        return as_dict(await client.list_tasks(request))
    if scenario == "push":
        task_id, url = args
        created = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url=url, token="t0k")
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        return {"created": as_dict(created), "listed": as_dict(listed)}
    raise SystemExit(f"unknown scenario {scenario}")


async def main():
    scenario, base_url, bearer, *args = sys.argv[1:]
    try:
        result = await run(scenario, base_url, bearer, args)
    except Exception as e:  # the test asserts on what the client raised
        result = {
            "error": type(e).__name__,
            "message": str(e),
            "data": getattr(e, "data", None),
        }
    print(json.dumps(result))


asyncio.run(main())
