"""The official Anthropic Python SDK over HTTPS to CapGate's own listener (http.tls.*).

Run by Tests/CapGateTests/System/ListenerTLSTests.swift with CAPGATE_URL (https://127.0.0.1:…),
CAPGATE_KEY and CAPGATE_CA_FILE (the test CA that issued the gateway's certificate) set. Only
base_url, api_key and the HTTP client's trust change.
"""
import os
import ssl
import sys

import anthropic

url, key = os.environ["CAPGATE_URL"], os.environ["CAPGATE_KEY"]
messages = [{"role": "user", "content": "Hello"}]

# The SDK's own HTTP client, told to trust the test CA (verify= the CA file, as an SSL context:
# httpx deprecates a path string).
trusting = anthropic.DefaultHttpxClient(verify=ssl.create_default_context(cafile=os.environ["CAPGATE_CA_FILE"]))
client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, http_client=trusting)
message = client.messages.create(model="claude-test", max_tokens=16, messages=messages)
assert message.content[0].text == "Hello from the mock provider.", message
assert message.usage.output_tokens == 7, message.usage

# Without the CA the certificate is not trusted (the system's roots do not hold it): the SDK
# raises APIConnectionError and nothing reaches the gateway's HTTP layer.
try:
    anthropic.Anthropic(base_url=url, api_key=key, max_retries=0).messages.create(
        model="claude-test", max_tokens=16, messages=messages
    )
except anthropic.APIConnectionError:
    pass
else:
    sys.exit("expected the certificate to be refused without the test CA")

print("sdk tls ok")
