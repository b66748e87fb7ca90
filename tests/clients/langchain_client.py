"""`langchain-openai` against `transformer serve` on loopback.

Run by tests/clients/run.sh (which starts the servers): ChatOpenAI plain and streamed (the
stream reassembles to the whole answer), `bind_tools` with a forced tool (the reply is parsed by
LangChain into `tool_calls` with arguments that match the tool's schema), `with_structured_output`
with a pydantic model (LangChain's default method, `json_schema`: the reply is parsed and
validated by LangChain itself) and OpenAIEmbeddings.

OpenAIEmbeddings is used with `check_embedding_ctx_length=False`: its default tokenises with
tiktoken, which downloads its BPE tables at run time (no network here); the token-id input it
would then send is checked by the openai client test and tests/serving.
"""
import math
from typing import Literal
import sys

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field

lm_url, template_url, encoder_url = sys.argv[1:4]


def chat(url, max_tokens=8):
    return ChatOpenAI(base_url=url, api_key="none", model="m", temperature=0, max_tokens=max_tokens)


# Plain and streamed.
lm = chat(lm_url)
whole = lm.invoke("Speak, Romeo.")
assert isinstance(whole, AIMessage) and isinstance(whole.content, str)
assert whole.usage_metadata["output_tokens"] >= 1
streamed = None
for chunk in lm.stream("Speak, Romeo."):
    assert isinstance(chunk, AIMessageChunk)
    streamed = chunk if streamed is None else streamed + chunk
assert streamed.content == whole.content, (streamed.content, whole.content)


# Bounded strings and numbers: a tiny random model, constrained, otherwise writes a string until
# max_tokens (nothing makes it close the quote).
class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


# Tools: a forced call parses into tool_calls whose arguments match the schema.
@tool(args_schema=Weather)
def get_weather(city: str, days: int) -> str:
    """The weather forecast for a city, for a number of days."""
    return "sunny"


tool_lm = chat(template_url, max_tokens=256)
forced = tool_lm.bind_tools([get_weather], tool_choice="get_weather")
reply = forced.invoke("Weather in Paris for the next 3 days?")
assert reply.tool_calls, reply
call = reply.tool_calls[0]
assert call["name"] == "get_weather", call
Weather.model_validate(call["args"])
assert reply.response_metadata["finish_reason"] == "tool_calls", reply.response_metadata
# Streamed, the chunks reassemble into the same call.
merged = None
for chunk in forced.stream("Weather in Paris for the next 3 days?"):
    merged = chunk if merged is None else merged + chunk
assert merged.tool_calls and merged.tool_calls[0]["args"] == call["args"], (merged, call)


# Structured output: LangChain parses and validates the reply into the pydantic model.
class Person(BaseModel):
    name: str = Field(description="the person's name", max_length=10)
    age: int = Field(description="age in years", ge=0, le=120)
    tags: list[Literal["poet", "sailor"]] = Field(max_length=2)
    retired: bool


person = chat(template_url, max_tokens=200).with_structured_output(Person)
p = person.invoke("Invent a person.")
assert isinstance(p, Person), p

# Embeddings.
emb = OpenAIEmbeddings(base_url=encoder_url, api_key="none", model="m", check_embedding_ctx_length=False)
vectors = emb.embed_documents(["A man is eating food.", "The weather is lovely today."])
assert len(vectors) == 2 and len(vectors[0]) == 384
for v in vectors:
    assert abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-5
assert emb.embed_query("A man is eating food.") == vectors[0]
print("langchain client: all checks passed")
