"""The official Anthropic Python SDK against CapGate with features and routes on (SPEC §8).

Run by Tests/CapGateTests/SDKTests.swift with CAPGATE_URL and CAPGATE_KEY set; the route table
makes `GET /v1/models*` and `count_tokens` free and `/v1/messages` cost one `analysis`, which the
key's plan allows twice a day; `chat` may be named with CapGate-Feature.
"""
import os
import sys

import anthropic

client = anthropic.Anthropic(base_url=os.environ["CAPGATE_URL"], api_key=os.environ["CAPGATE_KEY"], max_retries=0)
messages = [{"role": "user", "content": "Hello"}]

# Free: listing models and counting tokens, as often as the app likes.
for _ in range(3):
    models = client.models.list()
    assert len(models.data) > 0, models
count = client.messages.count_tokens(model="claude-test", messages=messages)
assert count.input_tokens == 7, count

# Counted: two analyses, then the feature's daily limit answers 402 with the feature object.
for _ in range(2):
    message = client.messages.create(model="claude-test", max_tokens=16, messages=messages)
    assert message.content[0].text == "Hello from the mock provider.", message
raw = client.messages.with_raw_response.create(
    model="claude-test", max_tokens=16, messages=messages, extra_headers={"CapGate-Feature": "chat"}
)
assert '"feature.chat.day"' not in raw.headers.get("ratelimit-policy", ""), raw.headers  # chat is unlimited
try:
    client.messages.create(model="claude-test", max_tokens=16, messages=messages)
except anthropic.APIStatusError as error:
    assert error.status_code == 402, error.status_code
    assert error.body["error"]["type"] == "feature_limit_exceeded", error.body
    assert error.body["usage"]["feature"]["id"] == "analysis", error.body
    assert error.body["usage"]["feature"]["window"] == "day", error.body
    print("402 message:", error.body["error"]["message"])
else:
    sys.exit("expected a 402 once the daily analysis limit was reached")

# A feature the gateway does not know, named by the client: 400 (BadRequestError).
try:
    client.messages.create(model="claude-test", max_tokens=16, messages=messages, extra_headers={"CapGate-Feature": "nope"})
except anthropic.BadRequestError as error:
    assert error.status_code == 400
else:
    sys.exit("expected a 400 for an unknown feature")

print("sdk features ok")
