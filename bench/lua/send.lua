-- Scenario `send`: SendMessage with one text part. Each request creates a task (with no agent
-- configured the daemon rejects it and answers), so this measures the write path, including
-- durability. messageIds are unique per request: <run_id>-<thread>-<counter>.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local common = require("common")

common.jsonrpc_headers()
common.install{ expect = "\"result\"" }  -- a JSON-RPC success (the rejected task), not an error

local template = '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":' ..
  '{"role":"ROLE_USER","messageId":"m-%s-%d-%d","parts":[{"text":"hello"}]}}}'
local counter = 0

request = function()
  counter = counter + 1
  -- nil method/path/headers: wrk.format falls back to wrk.method/path/headers and sets
  -- Content-Length from the body.
  return wrk.format(nil, nil, nil, string.format(template, run_id, tid, counter))
end
