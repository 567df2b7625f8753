"""The official Anthropic Python SDK against a running CapGate: only base_url and api_key change.

Run by Tests/CapGateTests/SDKTests.swift with CAPGATE_URL and CAPGATE_KEY set; the key's plan
allows exactly three calls.
"""
import os
import sys

import anthropic

client = anthropic.Anthropic(base_url=os.environ["CAPGATE_URL"], api_key=os.environ["CAPGATE_KEY"], max_retries=0)
messages = [{"role": "user", "content": "Hello"}]

# 1: a normal answer
message = client.messages.create(model="claude-test", max_tokens=16, messages=messages)
assert message.content[0].text == "Hello from the mock provider.", message
assert message.usage.output_tokens == 7, message.usage

# 2: a streamed answer, event by event
text = ""
with client.messages.stream(model="claude-test", max_tokens=16, messages=messages) as stream:
    for piece in stream.text_stream:
        text += piece
    final = stream.get_final_message()
assert text.strip() == "Hello from the mock provider.", text
assert final.usage.output_tokens == 7, final.usage

# 3: the last call the cap allows, read with the raw response to see the headers
raw = client.messages.with_raw_response.create(model="claude-test", max_tokens=16, messages=messages)
assert raw.headers.get("request-id", "").startswith("req_"), dict(raw.headers)
assert '"user";r=0' in raw.headers.get("ratelimit", ""), raw.headers.get("ratelimit")

# 4: over the cap: the SDK raises APIStatusError with status 402 and our envelope
try:
    client.messages.create(model="claude-test", max_tokens=16, messages=messages)
except anthropic.APIStatusError as error:
    assert error.status_code == 402, error.status_code
    assert error.body["error"]["type"] == "usage_cap_exceeded", error.body
    assert error.body["usage"]["scope"] == "user", error.body
    print("402 message:", error.body["error"]["message"])
else:
    sys.exit("expected a 402 once the cap was reached")

# A wrong key: AuthenticationError (401)
try:
    anthropic.Anthropic(base_url=os.environ["CAPGATE_URL"], api_key="cg_wrong", max_retries=0).messages.create(
        model="claude-test", max_tokens=16, messages=messages
    )
except anthropic.AuthenticationError as error:
    assert error.status_code == 401
else:
    sys.exit("expected a 401 for a wrong key")

print("sdk ok")
