#!/usr/bin/env bash
# Writes the seed corpora of the fuzz targets (fuzz/corpus/ is git-ignored; this script is
# how it is made again). Realistic requests: the card, every A2A JSON-RPC method, pipelines,
# chunked bodies, Expect: 100-continue and framing errors.
#
# Each seed is two control bytes and the peer's bytes (see the targets' headers). For
# http_connection, `@@0`..`@@7` stand for the ids the instance draws first (@@0 is the first
# task's id and @@1 its context's), so one seed can create a task and then use it.
#
#   fuzz/seeds.sh            # writes fuzz/corpus/<target>/seed-* for every target
#
# Also: jsonrpc_envelope (request bodies), extensions_header (header lines), command_envelope
# (command envelopes under several callers) and config_file (the README's configuration
# examples, tests/e2e_runtime.rs's WORKFLOWS and variations).
set -euo pipefail
export LC_ALL=C

here="$(cd "$(dirname "$0")" && pwd)"
conn_dir="$here/corpus/http_connection"
parser_dir="$here/corpus/request_parser"
mkdir -p "$conn_dir" "$parser_dir"

CRLF=$'\r\n'
HOST="Host: 127.0.0.1:8420${CRLF}"
VERSION="A2A-Version: 1.0${CRLF}"
JSON="Content-Type: application/json${CRLF}"

# The body's length once the target has replaced each @@N with a 36-character id.
expanded_len() {
    local body="$1" stripped
    stripped="${body//@@[0-7]/}"
    echo $(( ${#body} + 11 * (${#body} - ${#stripped}) ))
}

# rpc METHOD PARAMS [EXTRA_HEADERS] — one JSON-RPC request with a Content-Length body.
rpc() {
    local body="{\"jsonrpc\":\"2.0\",\"id\":${ID:-1},\"method\":\"$1\",\"params\":$2}"
    printf 'POST / HTTP/1.1\r\n%s%s%s%sContent-Length: %s\r\n\r\n%s' \
        "$HOST" "$VERSION" "$JSON" "${3:-}" "$(expanded_len "$body")" "$body"
}

# post BODY [HEADERS] — a POST to the JSON-RPC endpoint with this body, framed by length.
post() {
    printf 'POST / HTTP/1.1\r\n%s%sContent-Length: %s\r\n\r\n%s' \
        "$HOST" "${2-$VERSION$JSON}" "$(expanded_len "$1")" "$1"
}

# rpc_chunked METHOD PARAMS — the same with a chunked body (two chunks, an extension, a
# trailer), into $R: it ends in a line break, which $(...) would drop.
rpc_chunked() {
    local body="{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"$1\",\"params\":$2}"
    local half=$(( ${#body} / 2 ))
    local a="${body:0:half}" b="${body:half}"
    printf -v R 'POST / HTTP/1.1\r\n%s%s%sTransfer-Encoding: chunked\r\n\r\n%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nx-trailer: 1\r\n\r\n' \
        "$HOST" "$VERSION" "$JSON" "$(expanded_len "$a")" "$a" "$(expanded_len "$b")" "$b"
}

MSG='{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hello"}]}}'
MSG_NOW='{"message":{"messageId":"m2","role":"ROLE_USER","parts":[{"text":"hi"},{"data":{"k":[1,2]}}]},"configuration":{"returnImmediately":true,"historyLength":2}}'
MSG_CTX='{"message":{"messageId":"m3","contextId":"ctx-1","role":"ROLE_USER","parts":[{"text":"a","mediaType":"text/plain"}]},"configuration":{"returnImmediately":true}}'
MSG_FOLLOW='{"message":{"messageId":"m4","taskId":"@@0","contextId":"@@1","role":"ROLE_USER","parts":[{"text":"more"}]}}'
MSG_RAW='{"message":{"messageId":"m5","role":"ROLE_USER","parts":[{"raw":"aGVsbG8=","mediaType":"image/png"}]}}'
MSG_PUSH='{"message":{"messageId":"m6","role":"ROLE_USER","parts":[{"text":"x"}]},"configuration":{"taskPushNotificationConfig":{"url":"http://x/"}}}'
PUSH_CFG='{"taskId":"@@0","pushNotificationConfig":{"url":"https://example.com/hook"}}'

n=0
# seed NAME CONTENT — writes CONTENT under several instances, drivers and hosts (byte 0:
# reads, principal, switches, listener; byte 1: host and driver; see http_connection.rs):
#   \x00\x01 operator, whole reads, the host completes turns;
#   \x04\x81 operator, 8-byte reads, a chatty host;
#   \x01\x2b operator, 1-byte reads, held turns, input-required, a moving clock;
#   \x05\x16 operator, reads of up to 32 bytes, a slow reader, turns left working;
#   \x03\x8b operator, reads of up to 3 bytes, held turns, chatty: checked against whole reads;
#   \x6e\x09 bearer tokens, introspection, device grant, events and CORS on, 256-byte
#             reads, held turns (checked too);
#   \x90\x00 a unix peer, whole reads, turns rejected, commands refused;
#   \x38\x81 a public listener (bearer tokens, `any` is a user), the device grant on;
#   \x10\x01 an embedder's fixed principal (a peer agent with grants);
#   \x00\x2b operator, whole reads, held work, input-required, a moving clock (deadlines).
seed() {
    local name="$1" content="$2" ctl
    for ctl in '\x00\x01' '\x04\x81' '\x01\x2b' '\x05\x16' '\x03\x8b' '\x6e\x09' '\x90\x00' '\x00\x2b' '\x38\x81' '\x10\x01'; do
        n=$((n + 1))
        { printf "$ctl"; printf '%s' "$content"; } > "$conn_dir/seed-$name-${ctl//\\x/}"
    done
    # The parser sees the same stream with ids left as they are: default and small limits.
    for ctl in '\x00\x00' '\x06\x00' '\x02\x41'; do
        { printf "$ctl"; printf '%s' "$content"; } > "$parser_dir/seed-$name-${ctl//\\x/}"
    done
}

# The agent card.
seed card-get "GET /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}Accept: application/json${CRLF}${CRLF}"
seed card-head "HEAD /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}${CRLF}"
seed card-options "OPTIONS /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}Origin: http://a${CRLF}${CRLF}"
seed card-inm "GET /.well-known/agent-card.json?x=1 HTTP/1.1${CRLF}${HOST}If-None-Match: W/\"abc\", *${CRLF}${CRLF}"
seed card-http10 "GET /.well-known/agent-card.json HTTP/1.0${CRLF}Connection: keep-alive${CRLF}${CRLF}GET /.well-known/agent-card.json HTTP/1.0${CRLF}${CRLF}"
seed card-absolute "GET http://127.0.0.1:8420/.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}Connection: close${CRLF}${CRLF}"
seed card-post "POST /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}Content-Length: 2${CRLF}${CRLF}{}"
seed rpc-options "OPTIONS / HTTP/1.1${CRLF}${HOST}Access-Control-Request-Method: POST${CRLF}${CRLF}"
seed rpc-get "GET / HTTP/1.1${CRLF}${HOST}${CRLF}"
seed not-found "GET /nope HTTP/1.1${CRLF}${HOST}${CRLF}DELETE * HTTP/1.1${CRLF}${HOST}${CRLF}"

# Every A2A method.
seed send "$(rpc SendMessage "$MSG")"
seed send-now "$(rpc SendMessage "$MSG_NOW")"
seed send-ctx "$(rpc SendMessage "$MSG_CTX")"
seed send-raw "$(rpc SendMessage "$MSG_RAW")"
seed send-push "$(rpc SendMessage "$MSG_PUSH")"
seed send-invalid "$(rpc SendMessage '{"message":{"role":"ROLE_AGENT","parts":[]}}')"
seed stream "$(rpc SendStreamingMessage "$MSG")"
seed stream-http10 "$(rpc SendStreamingMessage "$MSG" | sed '1s|HTTP/1.1|HTTP/1.0|')"
seed get-task "$(rpc GetTask '{"id":"@@0","historyLength":1}')"
seed list-tasks "$(rpc ListTasks '{"pageSize":2,"status":"TASK_STATE_COMPLETED","statusTimestampAfter":"2025-01-01T00:00:00Z","includeArtifacts":true,"historyLength":"3"}')"
seed list-tasks-token "$(rpc ListTasks '{"pageToken":"bm9wZQ","contextId":"@@1"}')"
seed cancel-task "$(rpc CancelTask '{"id":"@@0"}')"
seed subscribe "$(rpc SubscribeToTask '{"id":"@@0"}')"
seed push-create "$(rpc CreateTaskPushNotificationConfig "$PUSH_CFG")"
seed push-get "$(rpc GetTaskPushNotificationConfig '{"taskId":"@@0","id":"cfg"}')"
seed push-list "$(rpc ListTaskPushNotificationConfigs '{"taskId":"@@0"}')"
seed push-delete "$(rpc DeleteTaskPushNotificationConfig '{"taskId":"@@0","id":"cfg"}')"
seed extended-card "$(rpc GetExtendedAgentCard '{}')"
seed unknown-method "$(rpc message/send "$MSG")"
seed events-method "$(rpc agentd.events/SubscribeToEvents '{}')"
seed no-version "$(post '{"jsonrpc":"2.0","id":"a","method":"GetTask"}' "$JSON")"
seed bad-version "$(post '{"jsonrpc":"2.0","id":"a","method":"GetTask"}' "A2A-Version: 0.3${CRLF}${JSON}")"
seed bad-json "$(post '{"jsonrpc":')"
seed no-id "$(post '{"jsonrpc":"2.0","method":"GetTask","params":{"id":"@@0"}}')"
seed bad-jsonrpc "$(post '{"jsonrpc":"1.0","id":null,"method":5,"params":[]}')"
seed batch "$(post '[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]')"
seed not-json "$(post '{}' "${VERSION}Content-Type: text/plain${CRLF}")"
seed json-params "$(post '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"message_id":"m","role":1,"parts":[{"text":"t","metadata":{"a":{}}}],"reference_task_ids":["@@0"]},"configuration":{"history_length":"-1"}}}' "${VERSION}Content-Type: Application/JSON; charset=utf-8${CRLF}")"

# Conversations: a task made, then used, on one connection (pipelined).
seed pipeline-lifecycle "$(rpc SendMessage "$MSG_NOW")$(ID=2 rpc GetTask '{"id":"@@0"}')$(ID=3 rpc SubscribeToTask '{"id":"@@0"}')$(ID=4 rpc CancelTask '{"id":"@@0"}')$(ID=5 rpc ListTasks '{}')"
seed pipeline-followup "$(rpc SendMessage "$MSG")$(ID=2 rpc SendMessage "$MSG_FOLLOW")$(ID=3 rpc GetTask '{"id":"@@0","historyLength":10}')"
seed pipeline-stream-followup "$(rpc SendStreamingMessage "$MSG")$(ID=2 rpc SendStreamingMessage "$MSG_FOLLOW")"
seed pipeline-many "$(rpc SendMessage "$MSG_NOW")$(ID=2 rpc SendMessage "$MSG_CTX")$(ID=3 rpc SendMessage "$MSG_NOW")$(ID=4 rpc ListTasks '{"pageSize":1}')GET /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}Connection: close${CRLF}${CRLF}"

# The command extension: a DataPart {"agentd": {"op": ...}} in a send, activated by the
# header and marked in message.extensions. Message ops answer with a document, task ops
# start a task. A command draws its context id first, so its task is @@1, not @@0.
CMD_URI="https://agentd.dev/a2a/ext/command"
ANN_URI="https://agentd.dev/a2a/ext/task-annotations"
EVENTS_URI="https://agentd.dev/a2a/ext/events"
ACT="A2A-Extensions: ${CMD_URI}, ${ANN_URI}${CRLF}"
cmd() { # cmd ENVELOPE [CONFIGURATION] — SendMessage params carrying one command
    printf '{"message":{"messageId":"c1","role":"ROLE_USER","extensions":["%s"],"parts":[{"data":{"agentd":%s}}]}%s}' \
        "$CMD_URI" "$1" "${2:+,\"configuration\":$2}"
}
seed cmd-status "$(rpc SendMessage "$(cmd '{"op":"status"}')" "$ACT")"
seed cmd-config "$(rpc SendMessage "$(cmd '{"op":"config"}')" "$ACT")"
seed cmd-status-stream "$(rpc SendStreamingMessage "$(cmd '{"op":"status"}')" "$ACT")"
seed cmd-run "$(rpc SendMessage "$(cmd '{"op":"workflow.run","workflow":"w","inputs":{"a":1}}')" "$ACT")"
seed cmd-run-stream "$(rpc SendStreamingMessage "$(cmd '{"op":"workflow.run","workflow":"w"}')" "$ACT")"
seed cmd-run-now "$(rpc SendMessage "$(cmd '{"op":"workflow.run","workflow":"w"}' '{"returnImmediately":true}')" "$ACT")$(ID=2 rpc GetTask '{"id":"@@1"}' "$ACT")$(ID=3 rpc SubscribeToTask '{"id":"@@1"}' "$ACT")$(ID=4 rpc CancelTask '{"id":"@@1"}' "$ACT")"
seed cmd-declared "$(rpc SendMessage "$(cmd '{"op":"deploy","target":"prod","dry_run":true}')" "$ACT")"
seed cmd-admin-set "$(rpc SendMessage "$(cmd '{"op":"admin.set","path":"agent.approval","value":"never"}')" "$ACT")"
seed cmd-admin-drain "$(rpc SendStreamingMessage "$(cmd '{"op":"admin.drain","reason":"r"}')" "$ACT")"
seed cmd-workflow-status "$(rpc SendMessage "$(cmd '{"op":"workflow.status","run":"r1"}')" "$ACT")"
seed cmd-conversation "$(rpc SendMessage "$(cmd '{"op":"conversation.get","id":"c","limit":3}')" "$ACT")"
seed cmd-debug-events "$(rpc SendMessage "$(cmd '{"op":"debug.events"}')" "$ACT")"
seed cmd-device-approve "$(rpc SendMessage "$(cmd '{"op":"auth.device.approve","user_code":"ABCD-EFGH","as":"alice","scope":"user"}')" "$ACT")"
seed cmd-device-deny "$(rpc SendMessage "$(cmd '{"op":"auth.device.deny","all":true}')" "$ACT")"
seed cmd-sessions "$(rpc SendMessage "$(cmd '{"op":"auth.sessions"}')" "$ACT")"
seed cmd-reserved "$(rpc SendMessage "$(cmd '{"op":"_instance.emit","handle":"h","stream":"s","event":{}}')" "$ACT")"
seed cmd-removed "$(rpc SendMessage "$(cmd '{"op":"config.set"}')" "$ACT")"
seed cmd-unknown "$(rpc SendMessage "$(cmd '{"op":"nope"}')" "$ACT")"
seed cmd-bad-args "$(rpc SendMessage "$(cmd '{"op":"workflow.run","workflow":"","extra":1}')" "$ACT")"
seed cmd-no-op "$(rpc SendMessage "$(cmd '{"op":""}')" "$ACT")"
seed cmd-not-object "$(rpc SendMessage "$(cmd '"status"')" "$ACT")"
seed cmd-text-only "$(rpc SendMessage "$(cmd '{"op":"status"}' '{"acceptedOutputModes":["text/plain"]}')" "$ACT")"
seed cmd-not-activated "$(rpc SendMessage "$(cmd '{"op":"status"}')")"
seed cmd-not-marked "$(rpc SendMessage '{"message":{"messageId":"c","role":"ROLE_USER","parts":[{"data":{"agentd":{"op":"status"}}}]}}' "$ACT")"
seed cmd-two "$(rpc SendMessage "{\"message\":{\"messageId\":\"c\",\"role\":\"ROLE_USER\",\"extensions\":[\"$CMD_URI\"],\"parts\":[{\"data\":{\"agentd\":{\"op\":\"status\"}}},{\"data\":{\"agentd\":{\"op\":\"config\"}}}]}}" "$ACT")"
seed cmd-task-id "$(rpc SendMessage "{\"message\":{\"messageId\":\"c\",\"taskId\":\"@@0\",\"role\":\"ROLE_USER\",\"extensions\":[\"$CMD_URI\"],\"parts\":[{\"data\":{\"agentd\":{\"op\":\"status\"}}}]}}" "$ACT")"
seed cmd-pipeline "$(rpc SendMessage "$(cmd '{"op":"status"}')" "$ACT")$(ID=2 rpc SendMessage "$(cmd '{"op":"workflow.run","workflow":"w"}')" "$ACT")$(ID=3 rpc CancelTask '{"id":"@@3"}' "$ACT")$(ID=4 rpc ListTasks '{}' "$ACT")"
seed annotations "$(rpc SendMessage "$MSG_NOW" "A2A-Extensions: ${ANN_URI}${CRLF}")$(ID=2 rpc GetTask '{"id":"@@0"}' "A2A-Extensions: ${ANN_URI}, https://unknown.example/x${CRLF}")"
seed events "$(rpc agentd.events/SubscribeToEvents '{}' "A2A-Extensions: ${EVENTS_URI}${CRLF}")"

# Identity: bearer tokens (known in the bearer modes), browsers, CORS; the device grant's
# OAuth endpoints (served while it is enabled).
AUTH_USER="Authorization: Bearer alice-token${CRLF}"
AUTH_AGENT="Authorization: Bearer agent-token${CRLF}"
AUTH_OP="Authorization: Bearer operator-token${CRLF}"
ORIGIN="Origin: http://app.example${CRLF}"
seed auth-user "$(rpc SendMessage "$MSG_NOW" "$AUTH_USER")$(ID=2 rpc GetTask '{"id":"@@0"}' "$AUTH_USER")$(ID=3 rpc ListTasks '{}' "$AUTH_AGENT")$(ID=4 rpc GetTask '{"id":"@@0"}' "$AUTH_OP")"
seed auth-agent-cmd "$(rpc SendMessage "$(cmd '{"op":"workflow.run","workflow":"w"}')" "$AUTH_AGENT$ACT")$(ID=2 rpc SendMessage "$(cmd '{"op":"deploy","target":"x"}')" "$AUTH_USER$ACT")"
seed auth-bad "$(rpc GetTask '{"id":"x"}' "Authorization: Bearer nope${CRLF}")$(ID=2 rpc GetTask '{"id":"x"}' "Authorization: Basic YTpi${CRLF}")$(ID=3 rpc GetTask '{"id":"x"}' "Authorization: Bearer agentd_at_x${CRLF}")"
seed auth-extended-card "$(rpc GetExtendedAgentCard '{}' "$AUTH_OP")$(ID=2 rpc GetExtendedAgentCard '{}' "$AUTH_USER")"
seed browser "$(rpc GetTask '{"id":"x"}' "$ORIGIN")GET /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}${ORIGIN}${CRLF}"
seed cors-preflight "OPTIONS / HTTP/1.1${CRLF}${HOST}${ORIGIN}Access-Control-Request-Method: POST${CRLF}Access-Control-Request-Headers: authorization, content-type, a2a-version${CRLF}${CRLF}$(rpc ListTasks '{}' "$ORIGIN$AUTH_USER")"
seed cors-other "OPTIONS / HTTP/1.1${CRLF}${HOST}Origin: http://evil.example${CRLF}Access-Control-Request-Method: POST${CRLF}${CRLF}"
form() { # form PATH BODY [HEADERS]
    printf 'POST %s HTTP/1.1\r\n%sContent-Type: application/x-www-form-urlencoded\r\n%sContent-Length: %s\r\n\r\n%s' \
        "$1" "$HOST" "${3:-}" "${#2}" "$2"
}
seed oauth-metadata "GET /.well-known/oauth-authorization-server HTTP/1.1${CRLF}${HOST}${CRLF}"
seed oauth-device "$(form /oauth2/device_authorization 'client_id=cli&scope=user')$(form /oauth2/token 'grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code=abc&client_id=cli')"
seed oauth-device-operator "$(form /oauth2/device_authorization 'client_id=cli&scope=operator+user')"
seed oauth-token-bad "$(form /oauth2/token 'grant_type=password&username=a&password=b')$(form /oauth2/token 'a=%zz&&=')"
seed oauth-revoke "$(form /oauth2/revoke 'token=agentd_at_abc&token_type_hint=access_token')"
seed oauth-page "GET /oauth2/device?user_code=ABCD-EFGH HTTP/1.1${CRLF}${HOST}${CRLF}"
seed oauth-approve "$(form /oauth2/device_authorization 'client_id=cli')$(rpc SendMessage "$(cmd '{"op":"auth.device.pending"}')" "$ACT")$(ID=2 rpc SendMessage "$(cmd '{"op":"auth.sessions"}')" "$ACT")$(ID=3 rpc SendMessage "$(cmd '{"op":"auth.sessions.revoke","all":true}')" "$ACT")"
seed events-stream "$(rpc SendMessage "$MSG_NOW")$(ID=2 rpc agentd.events/SubscribeToEvents '{}' "A2A-Extensions: ${EVENTS_URI}${CRLF}")"

# Framing: chunked bodies, 100-continue, bad lengths, both CL and TE, limits.
rpc_chunked SendMessage "$MSG"; seed chunked "$R"
rpc_chunked SendStreamingMessage "$MSG"; seed chunked-stream "$R"
rpc_chunked GetTask '{"id":"x"}'; seed chunked-get "$R$(ID=2 rpc ListTasks '{}')"
seed expect-continue "$(rpc SendMessage "$MSG_NOW" "Expect: 100-continue${CRLF}")"
seed expect-continue-refused "POST /elsewhere HTTP/1.1${CRLF}${HOST}Expect: 100-continue${CRLF}Content-Length: 5${CRLF}${CRLF}hello"
seed expect-bad "POST / HTTP/1.1${CRLF}${HOST}Expect: magic${CRLF}Content-Length: 0${CRLF}${CRLF}"
seed cl-bad "POST / HTTP/1.1${CRLF}${HOST}${JSON}Content-Length: 1x${CRLF}${CRLF}{}"
seed cl-conflict "POST / HTTP/1.1${CRLF}${HOST}${JSON}Content-Length: 2, 3${CRLF}${CRLF}{}"
seed cl-twice "POST / HTTP/1.1${CRLF}${HOST}${JSON}Content-Length: 2${CRLF}Content-Length: 2${CRLF}${CRLF}{}"
seed cl-huge "POST / HTTP/1.1${CRLF}${HOST}${JSON}Content-Length: 99999999999999999999${CRLF}${CRLF}"
seed cl-too-large "POST / HTTP/1.1${CRLF}${HOST}${JSON}Content-Length: 2097153${CRLF}${CRLF}{"
seed cl-short "POST / HTTP/1.1${CRLF}${HOST}${VERSION}${JSON}Content-Length: 100${CRLF}${CRLF}{\"jsonrpc\":\"2.0\"}"
seed cl-and-te "POST / HTTP/1.1${CRLF}${HOST}${JSON}Content-Length: 5${CRLF}Transfer-Encoding: chunked${CRLF}${CRLF}0${CRLF}${CRLF}"
seed te-gzip "POST / HTTP/1.1${CRLF}${HOST}${JSON}Transfer-Encoding: gzip, chunked${CRLF}${CRLF}0${CRLF}${CRLF}"
seed te-http10 "POST / HTTP/1.0${CRLF}${JSON}Transfer-Encoding: chunked${CRLF}${CRLF}0${CRLF}${CRLF}"
seed chunk-bad-size "POST / HTTP/1.1${CRLF}${HOST}${JSON}Transfer-Encoding: chunked${CRLF}${CRLF}zz${CRLF}{}${CRLF}0${CRLF}${CRLF}"
seed chunk-overrun "POST / HTTP/1.1${CRLF}${HOST}${JSON}Transfer-Encoding: chunked${CRLF}${CRLF}1${CRLF}{}${CRLF}0${CRLF}${CRLF}"
seed chunk-bare-lf "POST / HTTP/1.1${CRLF}${HOST}${VERSION}${JSON}Transfer-Encoding: chunked${CRLF}${CRLF}2"$'\n''{}'$'\n''0'$'\n'$'\n'
seed no-host "GET /.well-known/agent-card.json HTTP/1.1${CRLF}${CRLF}"
seed two-hosts "GET /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}${HOST}${CRLF}"
seed http2 "PRI * HTTP/2.0${CRLF}${CRLF}SM${CRLF}${CRLF}"
seed http11-lf "GET /.well-known/agent-card.json HTTP/1.1"$'\n'"Host: x"$'\n'$'\n'
seed leading-crlf "${CRLF}${CRLF}GET /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}${CRLF}"
seed header-big "GET /.well-known/agent-card.json HTTP/1.1${CRLF}${HOST}X-Big: $(head -c 17000 /dev/zero | tr '\0' a)${CRLF}${CRLF}"
many=""
for i in $(seq 70); do many+="X-$i: v${CRLF}"; done
seed headers-many "GET / HTTP/1.1${CRLF}${HOST}${many}${CRLF}"
seed half-head "GET /.well-known/agent-card.json HTTP/1.1${CRLF}Host: x"

echo "wrote $n http_connection seeds to $conn_dir and the same streams to $parser_dir"

# client_response: three control bytes (split, limits, flags: 1 = HEAD, 2 = server closes)
# and a server's byte stream, as agentd's outbound client reads it.
client_dir="$here/corpus/client_response"
CR=$'\r'
mkdir -p "$client_dir"
cn=0
cseed() { # cseed NAME CONTROL CONTENT
    { printf "$2"; printf '%s' "$3"; } > "$client_dir/seed-$1"
    cn=$((cn + 1))
}
RES='{"jsonrpc":"2.0","id":1,"result":'
TASK='{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}}'
DONE='{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_COMPLETED"}}}'
ART='{"artifactUpdate":{"taskId":"t","artifact":{"artifactId":"a","parts":[{"text":"x"}]}}}'
CARD='{"name":"p","capabilities":{"streaming":true,"extensions":[{"uri":"https://agentd.dev/a2a/ext/command"}]},"supportedInterfaces":[{"url":"http://127.0.0.1:8420/","protocolBinding":"JSONRPC","protocolVersion":"1.0","tenant":"t"}]}'
body_json() { printf 'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: public, max-age=60\r\nContent-Length: %s\r\n\r\n%s' "${#1}" "$1"; }
# chunk DATA — appends one chunk to $CHUNKS (printf -v: command substitution would strip
# the trailing newlines of SSE data).
chunk() { local c; printf -v c '%x\r\n%s\r\n' "${#1}" "$1"; CHUNKS+="$c"; }
cseed card '\x07\x00\x00' "$(body_json "$CARD")"
cseed send-task '\x03\x00\x00' "$(body_json "$RES$TASK}")"
cseed rpc-error '\x02\x00\x00' "$(body_json '{"jsonrpc":"2.0","id":1,"error":{"code":-32004,"message":"no","data":[{"reason":"UNSUPPORTED_OPERATION"}]}}')"
LF2=$'\n\n'
e1="data: $RES$TASK}$LF2"; e2="data: $RES$ART}$LF2"; e3="data: $RES$DONE}$LF2"
CHUNKS=""; chunk "$e1"; chunk ": keep-alive$LF2"; chunk "$e2"; chunk "$e3"
cseed sse-chunked '\x05\x00\x00' "HTTP/1.1 200 OK${CRLF}Content-Type: text/event-stream${CRLF}Transfer-Encoding: chunked${CRLF}${CRLF}${CHUNKS}0${CRLF}X-Trailer: 1${CRLF}${CRLF}"
cseed sse-close '\x01\x00\x02' "HTTP/1.1 200 OK${CRLF}Content-Type: text/event-stream${CRLF}${CRLF}id: 1${CRLF}event: m${CRLF}retry: 10${CRLF}data: $RES$TASK}${CRLF}${CRLF}data: a${CR}data: b${CR}${CR}"
cseed interim '\x06\x00\x00' "HTTP/1.1 100 Continue${CRLF}${CRLF}HTTP/1.1 204 No Content${CRLF}${CRLF}HTTP/1.1 404 Not Found${CRLF}Content-Length: 0${CRLF}${CRLF}"
cseed head '\x04\x00\x01' "HTTP/1.1 200 OK${CRLF}Content-Length: 99${CRLF}${CRLF}"
cseed truncated '\x04\x00\x02' "HTTP/1.1 200 OK${CRLF}Content-Length: 99${CRLF}${CRLF}{"
cseed small-limits '\x02\x13\x02' "HTTP/1.1 200 OK${CRLF}Transfer-Encoding: chunked${CRLF}${CRLF}1a${CRLF}0123456789abcdef0123456789${CRLF}0${CRLF}${CRLF}"
cseed http10 '\x03\x00\x02' "HTTP/1.0 200 OK${CRLF}Connection: keep-alive${CRLF}Content-Length: 2${CRLF}${CRLF}{}"
echo "wrote $cn client_response seeds to $client_dir"

# ---------------------------------------------------------------------------------------
# jsonrpc_envelope: request bodies as they are, no control bytes.
env_dir="$here/corpus/jsonrpc_envelope"
mkdir -p "$env_dir"
body() { printf '%s' "$2" > "$env_dir/seed-$1"; }
for m in SendMessage SendStreamingMessage GetTask ListTasks CancelTask SubscribeToTask \
    CreateTaskPushNotificationConfig GetTaskPushNotificationConfig \
    ListTaskPushNotificationConfigs DeleteTaskPushNotificationConfig GetExtendedAgentCard; do
    body "$m" "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$m\",\"params\":$MSG}"
done
body cmd "{\"jsonrpc\":\"2.0\",\"id\":\"c-1\",\"method\":\"SendMessage\",\"params\":$(cmd '{"op":"workflow.run","workflow":"w"}')}"
body events '{"jsonrpc":"2.0","id":"e","method":"agentd.events/SubscribeToEvents","params":{"fromSeq":3}}'
body id-string-escapes '{"jsonrpc":"2.0","id":"a\u0041\n\"","method":"GetTask","params":{"id":"x"}}'
body id-numbers '{"id":-1.5e-3,"jsonrpc":"2.0","method":"GetTask","params":null}'
body id-huge '{"jsonrpc":"2.0","id":123456789012345678901234567890e400,"method":"GetTask"}'
body id-null '{"jsonrpc":"2.0","id":null,"method":"GetTask"}'
body id-object '{"jsonrpc":"2.0","id":{"a":1},"method":"GetTask"}'
body id-bool '{"jsonrpc":"2.0","id":true,"method":"GetTask"}'
body no-id '{"jsonrpc":"2.0","method":"GetTask"}'
body escaped-names '{"jso\u006erpc":"2.0","\u0069d":1,"method":"G\u0065tTask","x\u0000":[]}'
body dup-id '{"jsonrpc":"2.0","id":1,"id":2,"method":"GetTask"}'
body dup-escaped '{"jsonrpc":"2.0","id":1,"\u0069d":2,"method":"GetTask"}'
body version '{"jsonrpc":"2.00","id":1,"method":"GetTask"}'
body method-empty '{"jsonrpc":"2.0","id":1,"method":""}'
body method-number '{"jsonrpc":"2.0","id":1,"method":5}'
body params-array '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}'
body params-string '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":"x"}'
body batch '[{"jsonrpc":"2.0","id":1,"method":"GetTask"},{"jsonrpc":"2.0","id":2,"method":"GetTask"}]'
body scalar '"hello"'
body truncated '{"jsonrpc":"2.0","id":1,"meth'
body whitespace $' \t\r\n{ "jsonrpc" : "2.0" , "id" : 7 , "method" : "ListTasks" , "params" : { } }\n'
body deep "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"y\":$(printf '[%.0s' $(seq 130))$(printf ']%.0s' $(seq 130))}"
body deep-params "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":{\"a\":$(printf '[%.0s' $(seq 200))$(printf ']%.0s' $(seq 200))}}"
printf '{"jsonrpc":"2.0","id":4,"method":"GetTask","x":"\xff"}' > "$env_dir/seed-bad-utf8"

# ---------------------------------------------------------------------------------------
# extensions_header: byte 0 the method (low 4 bits; 11+ the events method) and events on
# (bit 7); byte 1 bit 0 clear: header lines split at \n.
hdr_dir="$here/corpus/extensions_header"
mkdir -p "$hdr_dir"
header() { { printf "$2"; printf '%s' "$3"; } > "$hdr_dir/seed-$1"; }
header send-all '\x80\x00' "$CMD_URI, $ANN_URI, $EVENTS_URI"
header get-two-lines '\x02\x00' " $ANN_URI ,https://unknown.example/x"$'\n'"$CMD_URI"
header events '\x8b\x00' "$EVENTS_URI,$ANN_URI"
header events-off '\x0b\x00' "$EVENTS_URI"
header card '\x8a\x00' "$CMD_URI, $ANN_URI, $EVENTS_URI"
header empties '\x00\x00' ",, ,$CMD_URI,,"
header many "\x80\x00" "$(printf 'https://example.com/x,%.0s' $(seq 32))$CMD_URI"
header long '\x00\x00' "$CMD_URI$(head -c 600 /dev/zero | tr '\0' ' ')"
header case '\x00\x00' "HTTPS://AGENTD.DEV/A2A/EXT/COMMAND, $CMD_URI/"
# Bit 0 of byte 1 set: each byte picks a token; bit 7 ends a line.
header picked '\x80\x01\x00\x07\x0e\x81\x15\x16\x17' ''
header picked-many '\x80\x01\x00' "$(head -c 40 /dev/zero | tr '\0' '\025')"

# ---------------------------------------------------------------------------------------
# command_envelope: byte 0 the caller (bits 0-2), switches (3-5), activated (6), marked
# (7); byte 1 bit 0 set: the rest is the envelope as JSON; bits 1-2 carriers; bit 3 a
# taskId; bits 4-5 accepted output modes. Bit 0 clear: byte 2 picks the op, the rest
# drives a generator over its schema.
cmd_dir="$here/corpus/command_envelope"
mkdir -p "$cmd_dir"
command_seed() { { printf "$2"; printf '%s' "$3"; } > "$cmd_dir/seed-$1"; }
i=0
for env in '{"op":"status"}' '{"op":"config"}' '{"op":"workflow.run","workflow":"w","inputs":{"a":1}}' \
    '{"op":"deploy","target":"prod","dry_run":true}' '{"op":"build","anything":[1]}' \
    '{"op":"admin.set","path":"agent.approval","value":"never"}' '{"op":"admin.drain","reason":"r"}' \
    '{"op":"workflow.status","run":"r1"}' '{"op":"conversation.get","id":"c","limit":3}' \
    '{"op":"debug.events"}' '{"op":"auth.device.approve","user_code":"ABCD-EFGH","as":"alice","scope":"user"}' \
    '{"op":"auth.device.approve","user_code":"ABCD-EFGH","as":"operator"}' \
    '{"op":"auth.device.deny","all":true}' '{"op":"auth.sessions"}' '{"op":"auth.sessions.revoke","all":true}' \
    '{"op":"_instance.emit","handle":"h","stream":"s","event":{}}' '{"op":"config.set"}' '{"op":"nope"}' \
    '{"op":"workflow.run","workflow":"","extra":1}' '{"op":""}' '"status"' '{"op":7}'; do
    i=$((i + 1))
    # operator with every switch, a user, a granted agent, anonymous; one carrier.
    for ctl in '\xf8\x03' '\xc1\x03' '\xfa\x03' '\xc4\x03'; do
        command_seed "json-$i-${ctl//\\x/}" "$ctl" "$env"
    done
done
command_seed not-activated '\x80\x03' '{"op":"status"}'
command_seed not-marked '\x40\x03' '{"op":"status"}'
command_seed two '\xc0\x05' '{"op":"status"}'
command_seed behind '\xc0\x07' '{"op":"status"}'
command_seed task-id '\xc0\x0b' '{"op":"status"}'
command_seed text-only '\xc0\x23' '{"op":"status"}'
command_seed json-params '\xc0\x33' '{"op":"status"}'
# Generated envelopes: every op by byte 2 (the table, the declared, removed and unknown
# names), the generator's choices all "present, first value".
for op in $(seq 0 40); do
    command_seed "gen-$op" "\\xf8\\x02\\x$(printf %02x "$op")" "$(head -c 64 /dev/zero | tr '\0' '\001')"
done

# ---------------------------------------------------------------------------------------
# config_file: the configuration examples of the README and the e2e suite's workflows.
cfg_dir="$here/corpus/config_file"
mkdir -p "$cfg_dir"
root="$here/.."
awk '/^```toml$/{n++; f=1; next} /^```$/{f=0} f{print > (dir "/seed-readme-" n)}' dir="$cfg_dir" "$root/README.md"
awk '/^const WORKFLOWS: &str = r#"$/{f=1; next} /^"#;$/{f=0} f' "$root/tests/e2e_runtime.rs" > "$cfg_dir/seed-e2e-workflows"
awk '/^    const GOOD: &str = r#"$/{f=1; next} /^"#;$/{f=0} f' "$root/src/runtime/workflow.rs" > "$cfg_dir/seed-workflow-good"
cat > "$cfg_dir/seed-full" <<'TOML'
[agent]
name = "reviewer"
approval = "ask"
command = ["/usr/bin/agent", "--json"]
turn_timeout_ms = 1000
env = { A = "1" }

[[subagents]]
name = "helper"
command = ["/usr/bin/helper"]

[a2a]
listen = ["tcp://127.0.0.1:0", "https://0.0.0.0:8443", "unix:///run/agentd/a.sock"]
bearer = "{{secret:HOME}}"

[[a2a.principals]]
id = "peer-a"
role = "agent"
grants = ["workflow.*", "deploy"]
match = { bearer_ref = "{{secret:PATH}}" }

[[a2a.principals]]
id = "guest"
role = "user"
match = { any = true }

[a2a.cors]
origins = ["https://ui.example.com", "http://localhost:3000"]

[a2a.device_grant]
enabled = true
scopes = ["user", "operator"]
token_ttl_s = 300
code_ttl_s = 60

[a2a.introspection]
enabled = true

[a2a.events]
enabled = true
ring = 4
stream_deadline_ms = 800

[limits]
max_body_bytes = 1
stream_queue = 4096
max_tasks = 1
max_connections = 2
TOML
printf '[a2a]\nlisten = "tcp://0.0.0.0:1"\n' > "$cfg_dir/seed-public-plain"
printf '[a2a]\nlisten = []\n' > "$cfg_dir/seed-listen-none"
printf '[limits]\nmax_headers = 0\n' > "$cfg_dir/seed-limit-zero"
printf '[a2a]\nbearer = "{{secret:NOPE_UNSET}}"\n[[a2a.principals]]\nid = "x"\nrole = "operator"\nmatch = { any = true }\n' > "$cfg_dir/seed-bad-rules"
printf '[[a2a.principals]]\nid = "c"\nrole = "agent"\nmatch = { san = "*.example" }\n[a2a.tls]\nclient_ca = "/nonexistent"\n' > "$cfg_dir/seed-cert-rule"
printf '[[workflows]]\nname = "w"\n[[workflows.steps]]\nid = "start"\nkind = "a2a"\ncommand = "config.set"\n' > "$cfg_dir/seed-removed-op"

# task_json: two bytes of room, then the task's messages and artifacts as JSON.
tj_dir="$here/corpus/task_json"
mkdir -p "$tj_dir"
printf '\x03\x00{"history":[{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"a\\"b\\n\\u0001\\u00e9"}]}]}' > "$tj_dir/seed-history"
printf '\x00\x01{"artifacts":[{"artifactId":"a","name":"n","parts":[{"data":{"k":[1,"x"]},"filename":"f"},{"raw":"aGk=","mediaType":"m"},{"url":"https://x/"}]}],"status":{"messageId":"s","role":"ROLE_AGENT","parts":[{"text":""}],"metadata":{"q":1}}}' > "$tj_dir/seed-artifacts"
printf '\x00\x00{"metadata":{"a":"b"},"history":[{"messageId":"m","contextId":"c","extensions":["e"],"referenceTaskIds":["t"],"taskId":"t","role":"ROLE_AGENT","parts":[]}]}' > "$tj_dir/seed-empty-parts"

echo "wrote the seeds of jsonrpc_envelope, extensions_header, command_envelope, config_file and task_json"
