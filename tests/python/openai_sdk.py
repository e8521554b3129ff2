"""Drives Baton's compatible endpoint with the unmodified OpenAI Python SDK.

Run by tests/api/python_sdk.rs with BATON_BASE_URL and BATON_API_KEY set; prints one JSON
report the Rust test checks against what the mock provider was told to answer.
"""
import json
import os

import openai

client = openai.OpenAI(base_url=os.environ["BATON_BASE_URL"], api_key=os.environ["BATON_API_KEY"])
report = {}

sync = client.chat.completions.create(
    model="openai/gpt-4o-mini",
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hi"}],
    temperature=0.3,
)
report["sync"] = {
    "text": sync.choices[0].message.content,
    "finish_reason": sync.choices[0].finish_reason,
    "prompt_tokens": sync.usage.prompt_tokens,
    "completion_tokens": sync.usage.completion_tokens,
    "id": sync.id,
}

stream = client.chat.completions.create(
    model="anthropic/claude-haiku-4-5",
    messages=[{"role": "user", "content": "Stream please"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, usage = "", None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if chunk.usage is not None:
        usage = {"prompt_tokens": chunk.usage.prompt_tokens, "completion_tokens": chunk.usage.completion_tokens}
report["stream"] = {"text": text, "usage": usage}

tools = client.chat.completions.create(
    model="openai/gpt-4o-mini",
    messages=[{"role": "user", "content": "Weather in Paris?"}],
    tools=[{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }],
    tool_choice="auto",
)
call = tools.choices[0].message.tool_calls[0]
report["tools"] = {
    "name": call.function.name,
    "arguments": json.loads(call.function.arguments),
    "finish_reason": tools.choices[0].finish_reason,
}

structured = client.chat.completions.create(
    model="openai/gpt-4o-mini",
    messages=[{"role": "user", "content": "Give me a city"}],
    response_format={
        "type": "json_schema",
        "json_schema": {
            "name": "city",
            "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
)
report["json_schema"] = json.loads(structured.choices[0].message.content)

errors = {}
for name, kwargs in {
    "unknown_model": {"model": "nope/model"},
    "bad_temperature": {"model": "openai/gpt-4o-mini", "temperature": 2.5},
}.items():
    try:
        client.chat.completions.create(messages=[{"role": "user", "content": "x"}], **kwargs)
        errors[name] = None
    except openai.APIStatusError as err:
        body = err.body if isinstance(err.body, dict) else {}
        errors[name] = {"status": err.status_code, "code": body.get("code"), "class": type(err).__name__}
report["errors"] = errors

models = [model.id for model in client.models.list()]
report["models"] = {"count": len(models), "has_mini": "openai/gpt-4o-mini" in models}

print(json.dumps(report))
