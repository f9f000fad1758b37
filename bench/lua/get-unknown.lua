-- Scenario `get-unknown`: GetTask for an id that does not exist. The daemon answers HTTP 200
-- with JSON-RPC error -32001 (TaskNotFound): a full parse + dispatch + error render, no state.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local common = require("common")

common.jsonrpc_headers()
-- A fixed body: wrk pre-builds the request once, so the generator costs almost nothing.
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"no-such-task"}}'
common.install{ expect = "-32001" }
