"""The official `openai` Python client against `transformer serve` on loopback.

Run by tests/clients/run.sh (which starts the servers). Every call goes through the client's
own pydantic types (a response that does not validate raises), and the numbers are checked where
the client exposes them: chat plain and streamed (the stream reassembles to the whole answer,
usage in its own `choices: []` chunk with include_usage), logprobs (top_logprobs sorted, the chosen
token the best one under greedy), n choices, logit_bias, completions with echo + logprobs,
embeddings (float, base64 decoded by the client itself, dimensions renormalised), tools offered
(whole and streamed; the tiny random model answers in prose), a tool-call history, a forced
tool call and `parse()` with a pydantic model (constrained decoding), and a nested pydantic
model (`$defs`) as a forced tool, required and named, and as `response_format`.
"""
import json
import math
import sys

import openai

from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

lm_url, template_url, encoder_url = sys.argv[1:4]
# The client builds its objects leniently; every raw answer is also validated strictly here.
TYPES = {"/chat/completions": ChatCompletion, "/completions": Completion,
         "/embeddings": CreateEmbeddingResponse}


def strict(response):
    path = response.request.url.path
    kind = next(t for p, t in TYPES.items() if path.endswith(p))
    if response.status_code != 200 or response.headers.get("content-type", "").startswith("text/event-stream"):
        return
    response.read()
    body = json.loads(response.text)
    # The one known difference: with echo, the prompt's first token has null logprobs (as
    # OpenAI's legacy API and vLLM answer; lm-eval-harness reads it so), which the generated
    # types do not allow.
    for choice in body.get("choices", []):
        lp = choice.get("logprobs") or {}
        if lp.get("token_logprobs") and lp["token_logprobs"][0] is None:
            lp["token_logprobs"][0], lp["top_logprobs"][0] = 0.0, {}
    if any(isinstance(d.get("embedding"), str) for d in body.get("data", [])):
        return  # base64: the client decodes it into floats first (validated below)
    kind.model_validate(body)


def client(url):
    import httpx2 as httpx
    return openai.OpenAI(base_url=url, api_key="none",
                         http_client=httpx.Client(event_hooks={"response": [strict]}))


def chunks_of(stream):
    out = list(stream)
    for c in out:
        ChatCompletionChunk.model_validate(c.to_dict())
    return out


lm = client(lm_url)
tool_lm = client(template_url)
encoder = client(encoder_url)
messages = [{"role": "user", "content": "Speak, Romeo."}]

# Chat, whole and streamed.
whole = lm.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
assert whole.choices[0].message.role == "assistant"
stream = lm.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                    stream=True, stream_options={"include_usage": True})
chunks = chunks_of(stream)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text == whole.choices[0].message.content, (text, whole)
assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens

# Logprobs: top_logprobs sorted, greedy picks the best.
r = lm.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=0,
                               logprobs=True, top_logprobs=4)
for entry in r.choices[0].logprobs.content:
    tops = [t.logprob for t in entry.top_logprobs]
    assert tops == sorted(tops, reverse=True) and len(tops) == 4
    assert abs(entry.logprob - tops[0]) < 1e-6
    assert bytes(entry.bytes).decode() == entry.token

# n choices.
r = lm.chat.completions.create(model="m", messages=messages, max_tokens=4, n=3, temperature=1, seed=5)
assert [c.index for c in r.choices] == [0, 1, 2]
# Several prompts, token ids among them; logit_bias accepted (its numbers: tests/serving).
r = lm.completions.create(model="m", prompt=[[575, 45, 37], [575, 45]], max_tokens=2, temperature=0,
                          logit_bias={"77": 100})
assert [c.index for c in r.choices] == [0, 1] and r.usage.prompt_tokens == 5
echo = lm.completions.create(model="m", prompt="ROMEO. What light", max_tokens=3, temperature=0,
                             echo=True, logprobs=2)
lp = echo.choices[0].logprobs
assert lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:])
assert echo.choices[0].text.startswith("ROMEO. What light")

# Tools: offered (whole and streamed), and a history with a call and its result.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ask = [{"role": "user", "content": "Weather in Paris?"}]
r = tool_lm.chat.completions.create(model="m", messages=ask, tools=tools, max_tokens=8, temperature=0)
assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
streamed = chunks_of(tool_lm.chat.completions.create(model="m", messages=ask, tools=tools, max_tokens=8,
                                                temperature=0, stream=True))
assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == (r.choices[0].message.content or "")
history = ask + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
]
tool_lm.chat.completions.create(model="m", messages=history, tools=tools, max_tokens=4)
try:
    tool_lm.chat.completions.create(model="m", messages=ask, tools=tools, max_tokens=4,
                                    tool_choice={"type": "function", "function": {"name": "no_such_tool"}})
    raise AssertionError("tool_choice naming an unknown tool accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice", e.body

# Structured output: parse() sends the pydantic model as a strict json_schema; the reply is
# parsed and validated by the client itself. Strings and lists are bounded so that the tiny
# random model, constrained, ends them.
from typing import Literal

from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=10)
    population: int = Field(ge=0, le=10_000_000)
    kind: Literal["town", "city"]
    rivers: list[Literal["Seine", "Rhine", "Loire"]] = Field(max_length=2)
    capital: bool


parsed = tool_lm.chat.completions.parse(model="m", messages=[{"role": "user", "content": "A city?"}],
                                        response_format=City, max_tokens=200, temperature=0)
assert parsed.choices[0].finish_reason == "stop", parsed
assert isinstance(parsed.choices[0].message.parsed, City), parsed
# A forced tool call: arguments parsed by the client and valid for the tool's schema.
bounded = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                           "required": ["city"]}}}]
forced = tool_lm.chat.completions.create(model="m", messages=ask, tools=bounded, max_tokens=256, temperature=0,
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
call = forced.choices[0].message.tool_calls[0]
assert forced.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather", forced
assert isinstance(json.loads(call.function.arguments)["city"], str), call

# Nested pydantic models (parameters with "$defs" and "#/$defs/Address" references, as
# openai.pydantic_function_tool writes them) as a forced tool, required and named, and as
# response_format: the client parses each call's arguments into the model (parsed_arguments).


class Address(BaseModel):
    street: str = Field(max_length=12)
    number: int = Field(ge=1, le=999)


class Person(BaseModel):
    name: str = Field(max_length=10)
    home: Address
    work: Address


person_tool = openai.pydantic_function_tool(Person, name="save_person", description="Save a person")
assert "$defs" in person_tool["function"]["parameters"], person_tool
for choice in ("required", {"type": "function", "function": {"name": "save_person"}}):
    nested = tool_lm.chat.completions.parse(model="m", messages=ask, tools=[person_tool], tool_choice=choice,
                                            max_tokens=400, temperature=0)
    assert nested.choices[0].finish_reason == "tool_calls", nested
    call = nested.choices[0].message.tool_calls[0]
    assert call.function.name == "save_person", call
    assert isinstance(call.function.parsed_arguments, Person), call
    assert isinstance(call.function.parsed_arguments.home, Address), call
person = tool_lm.chat.completions.parse(model="m", messages=[{"role": "user", "content": "A person?"}],
                                        response_format=Person, max_tokens=300, temperature=0)
assert isinstance(person.choices[0].message.parsed, Person), person
assert isinstance(person.choices[0].message.parsed.work, Address), person

# Embeddings: float, base64 (decoded by the client), dimensions.
texts = ["A man is eating food.", "The weather is lovely today."]
floats = encoder.embeddings.create(model="m", input=texts, encoding_format="float")
b64 = encoder.embeddings.create(model="m", input=texts)  # the client asks base64 by default
CreateEmbeddingResponse.model_validate(b64.to_dict())
for a, b in zip(floats.data, b64.data):
    assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) == 0.0
short = encoder.embeddings.create(model="m", input=texts, dimensions=32, encoding_format="float")
for full, cut in zip(floats.data, short.data):
    norm = math.sqrt(sum(x * x for x in full.embedding[:32]))
    assert len(cut.embedding) == 32
    assert max(abs(c - x / norm) for c, x in zip(cut.embedding, full.embedding[:32])) < 1e-6
print("openai client: all checks passed")
