"""The peer side of `make bench-peer`: LangGraph's smallest agent, one node that makes one
streamed chat-completions call on the messages state. It calls the same scripted provider
the brain calls (OPENAI_BASE_URL / OPENAI_API_KEY are set by the bench), so the two sides
differ only in the runtime between the client and the model."""

import os

from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph

model = ChatOpenAI(
    model="gpt-test",
    streaming=True,
    base_url=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
)


async def call_model(state: MessagesState) -> dict:
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("call_model", call_model)
builder.add_edge(START, "call_model")
graph = builder.compile()
