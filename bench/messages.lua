-- wrk script: POST /v1/messages, rotating through the API keys in $KEYS_FILE
-- (through CapGate), or with no key at all (the direct provider). $STREAM=1 asks for SSE.
local keys = {}
local path = os.getenv("KEYS_FILE")
if path and path ~= "" then
  for line in io.lines(path) do keys[#keys + 1] = line end
end
local stream = os.getenv("STREAM") == "1"
local body = '{"model":"claude-bench","max_tokens":16,' .. (stream and '"stream":true,' or '') ..
  '"messages":[{"role":"user","content":"Hello"}]}'
local counter = 0

function setup(thread)
  thread:set("offset", math.random(1, 100000))
end

function request()
  counter = counter + 1
  local headers = { ["content-type"] = "application/json", ["anthropic-version"] = "2023-06-01" }
  if #keys > 0 then
    headers["x-api-key"] = keys[((counter + (offset or 0)) % #keys) + 1]
  end
  return wrk.format("POST", "/v1/messages", headers, body)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d duration_us=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
