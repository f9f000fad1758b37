-- Scenario `card`: GET the public agent card. The URL path comes from run.sh.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local common = require("common")

wrk.method = "GET"
common.install{ expect = "\"name\"" }  -- every AgentCard has a name
