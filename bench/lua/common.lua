-- Shared by every scenario script: per-thread response checks and one machine-readable
-- summary line that bench/run.sh parses (wrk's own text output is kept only for humans).
--
-- Usage from a scenario script (wrk loads it with -s):
--   local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
--   package.path = dir .. "?.lua;" .. package.path
--   require("common").install{ expect = "substring a good body must contain" }
-- run.sh may override `expect` per target: `wrk ... -- <run_id> [<expect>]`.
--
-- wrk runs setup() and done() in the main Lua state and init()/request()/response() in one
-- Lua state per thread, so counters live in thread globals and done() sums them with
-- thread:get().

local M = {}

local threads = {}

function M.install(opts)
  opts = opts or {}
  local expect = opts.expect

  setup = function(thread)
    thread:set("tid", #threads + 1)        -- distinct per thread: makes messageIds unique
    table.insert(threads, thread)
  end

  init = function(args)
    -- run_id comes from run.sh (`wrk ... -- <run_id>`), so ids never repeat across runs
    -- against the same daemon process.
    run_id = args[1] or tostring(os.time())
    -- An optional second argument overrides the scenario's marker: run.sh passes one where a
    -- target's correct answer differs (see expect_for there). Each thread's Lua state runs
    -- install() and then init(), so this sets the `expect` that thread's response() reads.
    if args[2] and args[2] ~= "" then expect = args[2] end
    non2xx = 0
    unexpected = 0
  end

  -- Defining response() makes wrk hand us each status and body. wrk itself only counts
  -- status > 399; we count anything outside 2xx, and, for JSON-RPC scenarios where errors
  -- come back at HTTP 200, bodies that lack the expected marker.
  response = function(status, headers, body)
    if status < 200 or status > 299 then
      non2xx = non2xx + 1
    elseif expect and not (body and string.find(body, expect, 1, true)) then
      unexpected = unexpected + 1
    end
  end

  done = function(summary, latency, requests)
    local n2, un = 0, 0
    for _, t in ipairs(threads) do
      n2 = n2 + (t:get("non2xx") or 0)
      un = un + (t:get("unexpected") or 0)
    end
    local e = summary.errors
    local secs = summary.duration / 1e6
    io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d max_us=%d " ..
      "connect=%d read=%d write=%d timeout=%d status=%d non2xx=%d unexpected=%d\n",
      summary.requests, summary.duration,
      secs > 0 and summary.requests / secs or 0,
      latency:percentile(50), latency:percentile(99), latency.max,
      e.connect, e.read, e.write, e.timeout, e.status, n2, un))
  end
end

-- Helpers for POST scenarios.
function M.jsonrpc_headers()
  wrk.method = "POST"
  wrk.path = "/"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["A2A-Version"] = "1.0"
end

return M
