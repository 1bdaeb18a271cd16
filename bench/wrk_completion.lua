-- wrk script for scripts/bench_serve.sh: non-streaming POST /v1/completions.
-- With max_tokens = 1 the response is complete when the first (only) token
-- is, so wrk's latency is time to first token plus the HTTP round trip.
--
--   wrk -t1 -c8 -d10s --latency -s bench/wrk_completion.lua http://127.0.0.1:8000/v1/completions
--
-- Environment: WRK_MODEL (default tiny), WRK_MAX_TOKENS (default 1),
-- WRK_PROMPT (default Hello; plain ASCII without quotes or backslashes, as it
-- is pasted into the JSON body unescaped).

local model = os.getenv("WRK_MODEL") or "tiny"
local max_tokens = tonumber(os.getenv("WRK_MAX_TOKENS") or "1")
local prompt = os.getenv("WRK_PROMPT") or "Hello"

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format('{"model":"%s","prompt":"%s","max_tokens":%d}', model, prompt, max_tokens)

-- One machine-readable line after wrk's own report, for the summary table:
-- requests/s over the run, latency percentiles in milliseconds, and every
-- failure (socket errors plus non-2xx responses) in one count.
function done(summary, latency, requests)
  local e = summary.errors
  local errors = e.connect + e.read + e.write + e.status + e.timeout
  io.write(string.format(
    "WRK_RESULT requests=%d requests_per_s=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f errors=%d\n",
    summary.requests, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3,
    latency.max / 1e3, errors))
end
