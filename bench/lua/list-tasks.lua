-- Load `ListTasks`: the first page of 50 tasks, as bench/scale_restart.py's head-of-line
-- load sends it (the newest first, every field). No task is created.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local common = require("common")

common.jsonrpc_headers()
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageSize":50}}'
common.install{ expect = "\"tasks\"" }
