"""The official Anthropic Python SDK against CapGate with a cost budget (SPEC §11).

Run by Tests/CapGateTests/System/SDKTests.swift with CAPGATE_URL and CAPGATE_KEY set; the key's
company has a budget of 0.01 USD and `claude-test` is priced at 3 / 15 USD per million tokens.
"""
import os
import sys

import anthropic

client = anthropic.Anthropic(base_url=os.environ["CAPGATE_URL"], api_key=os.environ["CAPGATE_KEY"], max_retries=0)
messages = [{"role": "user", "content": "Hello"}]

# A call whose worst case fits: answered, with the budget in the RateLimit fields.
raw = client.messages.with_raw_response.create(model="claude-test", max_tokens=16, messages=messages)
assert raw.parse().usage.output_tokens == 7
assert '"company-cost";q=10000' in raw.headers.get("ratelimit-policy", ""), raw.headers.get("ratelimit-policy")

# A streamed one too.
with client.messages.stream(model="claude-test", max_tokens=16, messages=messages) as stream:
    final = stream.get_final_message()
assert final.usage.output_tokens == 7, final.usage

# max_tokens 8,000 could cost 0.12 USD: refused before anything is sent, as an error the app can show.
for streamed in (False, True):
    try:
        if streamed:
            with client.messages.stream(model="claude-test", max_tokens=8000, messages=messages) as stream:
                stream.get_final_message()
        else:
            client.messages.create(model="claude-test", max_tokens=8000, messages=messages)
    except anthropic.APIStatusError as error:
        assert error.status_code == 402, error.status_code
        assert error.body["error"]["type"] == "budget_exceeded", error.body
        cost = error.body["usage"]["cost"]
        assert cost["scope"] == "company" and cost["limit"] == "0.01", cost
        # 8,000 × 15 USD per million = 0.12, plus the prompt bound (the body's bytes + 1,000) × 3.
        assert 0.123 < float(cost["hold"]) < 0.124, cost
        print("402 message:", error.body["error"]["message"])
    else:
        sys.exit("expected 402 budget_exceeded for a call whose worst case does not fit")

# A model the price book does not know: 400, which the SDK raises as BadRequestError.
try:
    client.messages.create(model="claude-unpriced", max_tokens=16, messages=messages)
except anthropic.BadRequestError as error:
    assert error.body["error"]["type"] == "invalid_request_error", error.body
    assert "claude-unpriced" in error.body["error"]["message"], error.body
else:
    sys.exit("expected 400 for an unpriced model under a budget")

print("sdk budget ok")
