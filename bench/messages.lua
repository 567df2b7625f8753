-- wrk script: POST /v1/messages, rotating through the API keys in $KEYS_FILE
-- (through CapGate), or with no key at all (the direct provider). $STREAM=1 asks for SSE.
-- $LATENCY_FILE (concurrency 1 runs): each thread writes every call's latency in microseconds,
-- one per line, to $LATENCY_FILE.<thread>, as measured, without the coordinated-omission
-- correction wrk applies to its own percentiles.
local keys = {}
local path = os.getenv("KEYS_FILE")
if path and path ~= "" then
  for line in io.lines(path) do keys[#keys + 1] = line end
end
local stream = os.getenv("STREAM") == "1"
-- $BODY_FILE: the request body to send, read once (bench.py writes conversation bodies of
-- several sizes, shaped as the SDK sends them). Unset: the one-line "Hello" call.
local body_file = os.getenv("BODY_FILE")
local body
if body_file and body_file ~= "" then
  local f = assert(io.open(body_file, "rb"))
  body = f:read("*a")
  f:close()
  if stream then body = body:gsub('^{', '{"stream":true,', 1) end
else
  body = '{"model":"claude-bench","max_tokens":16,' .. (stream and '"stream":true,' or '') ..
    '"messages":[{"role":"user","content":"Hello"}]}'
end
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("offset", math.random(1, 100000))
  thread:set("index", threads)
end

local latency_file = os.getenv("LATENCY_FILE")
local now_us, sent_at, out
if latency_file and latency_file ~= "" then
  local ffi = require("ffi")
  ffi.cdef [[
    typedef struct { long tv_sec; long tv_nsec; } capgate_bench_timespec;
    int clock_gettime(int clock, capgate_bench_timespec *tp);
  ]]
  local ts = ffi.new("capgate_bench_timespec")
  now_us = function()
    ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
    return tonumber(ts.tv_sec) * 1000000 + tonumber(ts.tv_nsec) / 1000
  end

  function init(args)
    out = io.open(latency_file .. "." .. (index or 0), "w")
    out:setvbuf("line") -- wrk ends its threads without a hook: nothing may wait in a buffer
  end

  function response(status, headers, body)
    if sent_at then
      out:write(string.format("%d\n", now_us() - sent_at))
      sent_at = nil
    end
  end
end

function request()
  counter = counter + 1
  local headers = { ["content-type"] = "application/json", ["anthropic-version"] = "2023-06-01" }
  if #keys > 0 then
    headers["x-api-key"] = keys[((counter + (offset or 0)) % #keys) + 1]
  end
  if now_us then sent_at = now_us() end
  return wrk.format("POST", "/v1/messages", headers, body)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d duration_us=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
