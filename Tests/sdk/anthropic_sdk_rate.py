"""The official Anthropic Python SDK against CapGate's rate windows (SPEC §14).

Run by Tests/CapGateTests/System/SDKTests.swift with CAPGATE_URL and CAPGATE_KEY set; the key's
plan allows one call in flight per user (user_concurrency 1). A 429 is the SDK's to retry: it
waits the Retry-After it was given and sends the call again, with no code of the app's.
"""
import os
import sys
import threading

import anthropic

client = anthropic.Anthropic(base_url=os.environ["CAPGATE_URL"], api_key=os.environ["CAPGATE_KEY"], max_retries=4)
messages = [{"role": "user", "content": "Hello"}]

# One slow stream takes the user's only slot for about a second and a half.
def slow(admitted):
    with client.messages.stream(
        model="claude-test", max_tokens=16, messages=messages, extra_headers={"x-mock-chunk-delay-ms": "200"}
    ) as stream:
        admitted.set()  # the answer's head arrived: the call holds the slot
        stream.get_final_message()


admitted = threading.Event()
worker = threading.Thread(target=slow, args=(admitted,))
worker.start()
if not admitted.wait(10):
    sys.exit("the slow stream never started")

# The second call meets the full slot: 429 rate_limit_error with Retry-After 1, which the SDK
# retries by itself until the stream has ended and the slot is free.
raw = client.messages.with_raw_response.create(model="claude-test", max_tokens=16, messages=messages)
message = raw.parse()
assert message.usage.output_tokens == 7, message.usage
assert raw.retries_taken >= 1, raw.retries_taken
worker.join()

# With retries off, the SDK raises the 429 as RateLimitError, with CapGate's usage.rate.
quiet = anthropic.Anthropic(base_url=os.environ["CAPGATE_URL"], api_key=os.environ["CAPGATE_KEY"], max_retries=0)
held = threading.Event()
holder = threading.Thread(target=slow, args=(held,))
holder.start()
held.wait(10)
try:
    quiet.messages.create(model="claude-test", max_tokens=16, messages=messages)
except anthropic.RateLimitError as error:
    assert error.body["error"]["type"] == "rate_limit_error", error.body
    assert error.body["usage"]["rate"]["window"] == "user-concurrency", error.body
    assert error.response.headers["retry-after"] == "1", error.response.headers
    print("429 message:", error.body["error"]["message"])
else:
    sys.exit("expected 429 with the only slot taken")
holder.join()
print("429s retried:", raw.retries_taken)
print("sdk rate ok")
