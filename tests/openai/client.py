"""The official OpenAI Python SDK against the brain's OpenAI-compatible API, for
brain/tests/all/openai.rs: `client.py <base_url> <api_key> <request json>` prints one JSON
report. The request's `op` is `models`, `chat`, `responses` (streamed through `client.responses.stream`,
whose manager rebuilds the response from the events), `retrieve`, `cancel`, `background_stream`
(a background response streamed, cut, and resumed) or `resume` (`retrieve(stream=True,
starting_after=...)`); a refusal is reported as
`{"error": {"status", "code", "type", "message"}}`, as the SDK raised it."""

import json
import sys

import openai


def chat(client, request):
    kwargs = {"model": request["model"], "messages": request["messages"]}
    for name in ("user", "metadata"):
        if name in request:
            kwargs[name] = request[name]
    if "chat_id" in request:
        kwargs["extra_headers"] = {"X-Chat-Id": request["chat_id"]}
    if request.get("stream"):
        kwargs["stream"] = True
        if request.get("include_usage"):
            kwargs["stream_options"] = {"include_usage": True}
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        chunks = [chunk.model_dump() for chunk in raw.parse()]
        content = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        return {
            "chat_id": raw.headers.get("x-chat-id"),
            "content": content,
            "chunks": chunks,
            "finish_reason": finish[-1] if finish else None,
            "usage": usage[-1] if usage else None,
            "tool_calls": any(
                c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"]
            ),
        }
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    completion = raw.parse()
    return {
        "chat_id": raw.headers.get("x-chat-id"),
        "id": completion.id,
        "object": completion.object,
        "content": completion.choices[0].message.content,
        "finish_reason": completion.choices[0].finish_reason,
        "tool_calls": completion.choices[0].message.tool_calls,
        "usage": completion.usage.model_dump() if completion.usage else None,
    }


def responses(client, request):
    kwargs = {"model": request["model"], "input": request["input"]}
    for name in ("previous_response_id", "instructions", "user", "background"):
        if name in request:
            kwargs[name] = request[name]
    if request.get("stream"):
        with client.responses.stream(**kwargs) as stream:
            events = [event.model_dump() for event in stream]
            final = stream.get_final_response()
        return {
            "response": final.model_dump(),
            "output_text": final.output_text,
            "events": [e["type"] for e in events],
            "sequence": [e["sequence_number"] for e in events],
            "deltas": [e["delta"] for e in events if e["type"] == "response.output_text.delta"],
        }
    raw = client.responses.with_raw_response.create(**kwargs)
    response = raw.parse()
    return {
        "chat_id": raw.headers.get("x-chat-id"),
        "response": response.model_dump(),
        "output_text": response.output_text,
    }


def brief(events):
    """The type, number and delta of each event, and the response the last one carries."""
    dumped = [e.model_dump() for e in events]
    return {
        "events": [{"type": e["type"], "sequence_number": e["sequence_number"],
                    "delta": e.get("delta")} for e in dumped],
        "response": next((e["response"] for e in reversed(dumped) if "response" in e), None),
    }


def background_stream(client, request):
    """A background response streamed until `cut` deltas arrived, the stream closed, then
    resumed by `retrieve(stream=True, starting_after=<the last number seen>)`."""
    first = []
    stream = client.responses.create(model=request["model"], input=request["input"],
                                     background=True, stream=True)
    for event in stream:
        first.append(event)
        if sum(1 for e in first if e.type == "response.output_text.delta") >= request["cut"]:
            break
    stream.close()
    response_id = first[0].response.id
    after = first[-1].sequence_number
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=after))
    return {"id": response_id, "first": brief(first), "rest": brief(rest)}


def main():
    base_url, api_key, request = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    try:
        if request["op"] == "models":
            report = {"models": [m.model_dump() for m in client.models.list()]}
        elif request["op"] == "responses":
            report = responses(client, request)
        elif request["op"] == "retrieve":
            report = {"response": client.responses.retrieve(request["id"]).model_dump()}
        elif request["op"] == "background_stream":
            report = background_stream(client, request)
        elif request["op"] == "resume":
            report = brief(client.responses.retrieve(request["id"], stream=True,
                                                     starting_after=request["after"]))
        elif request["op"] == "cancel":
            report = {"response": client.responses.cancel(request["id"]).model_dump()}
        else:
            report = chat(client, request)
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        report = {"error": {"status": e.status_code, "code": e.code, "type": e.type,
                            "message": e.message, "body": body}}
    except openai.APIError as e:
        # An error event inside a stream: no status, the error object as the body.
        report = {"error": {"status": None, "code": e.code, "type": e.type,
                            "message": e.message}}
    print(json.dumps(report))


main()
