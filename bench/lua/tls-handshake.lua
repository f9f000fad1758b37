-- Scenario `tls-storm`, the storm's side: GET the card over https with `Connection: close`,
-- so the daemon closes after each answer and wrk connects again: every request is a new TCP
-- connection and a full TLS handshake (wrk keeps no TLS session to resume).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = dir .. "?.lua;" .. package.path
local common = require("common")

wrk.method = "GET"
wrk.headers["Connection"] = "close"
common.install{ expect = "\"name\"" }
