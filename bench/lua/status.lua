-- Scenario `status`: the command extension's status op, as the overview's curl example sends
-- it. The daemon answers a Message whose DataPart is the status document; no task is created,
-- so a sustained load must leave memory flat.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local common = require("common")

common.jsonrpc_headers()
wrk.headers["A2A-Extensions"] = "https://agentd.dev/a2a/ext/command"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m-1","extensions":["https://agentd.dev/a2a/ext/command"],"parts":[{"data":{"agentd":{"op":"status"}}}]}}}'
common.install{ expect = "\"instance\"" }
