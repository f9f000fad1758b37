"""Reads OTLP/HTTP JSON export bodies (a JSON array of them) on stdin with the
OpenTelemetry project's own protobuf classes (opentelemetry-proto) and prints the spans as
JSON: [{"traceId", "spanId", "parentSpanId", "name", "kind", "service"}, ...].

tests/e2e_traces.rs runs it on what agentd exported: each body must be an
ExportTraceServiceRequest that protobuf's strict JSON parser accepts (no unknown field, every
value of its field's type). OTLP/JSON differs from protobuf's JSON mapping in one place: the
trace and span ids are hex, not base64. They are checked here (lowercase hex, 16 and 8 bytes)
and turned to base64 before parsing, as an OTLP receiver does.
"""

import base64
import json
import sys

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

ID_BYTES = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def ids_to_base64(node):
    """Rewrites every hex id in an OTLP/JSON document as protobuf JSON's base64."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_BYTES and isinstance(value, str):
                if value == "" and key == "parentSpanId":
                    continue
                raw = bytes.fromhex(value)
                if len(raw) != ID_BYTES[key] or value != value.lower():
                    raise ValueError(f"{key} {value!r} is not {ID_BYTES[key]} bytes of lowercase hex")
                node[key] = base64.b64encode(raw).decode()
            else:
                ids_to_base64(value)
    elif isinstance(node, list):
        for value in node:
            ids_to_base64(value)


def main() -> int:
    out = []
    try:
        for body in json.load(sys.stdin):
            ids_to_base64(body)
            req = json_format.ParseDict(body, ExportTraceServiceRequest())
            for rs in req.resource_spans:
                service = next(
                    (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"),
                    None,
                )
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        if s.end_time_unix_nano < s.start_time_unix_nano:
                            raise ValueError(f"span {s.name} ends before it starts")
                        out.append(
                            {
                                "traceId": s.trace_id.hex(),
                                "spanId": s.span_id.hex(),
                                "parentSpanId": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": Span.SpanKind.Name(s.kind),
                                "service": service,
                            }
                        )
    except Exception as e:  # the parser's ParseError, or a bad id
        print(f"the export does not parse as OTLP: {e!r}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
