"""Reads a Prometheus text exposition on stdin with prometheus_client's own parser and
prints its samples as JSON: [{"family", "type", "name", "labels", "value"}, ...].

tests/e2e_metrics.rs runs it on what agentd's /metrics served: a line the parser cannot
read fails here (exit 1, the parser's error on stderr), so the test checks the format with
an independent reader, not only with its own string matching.
"""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> int:
    text = sys.stdin.read()
    out = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                value = s.value
                if math.isinf(value):
                    value = "+Inf" if value > 0 else "-Inf"
                out.append(
                    {
                        "family": family.name,
                        "type": family.type,
                        "name": s.name,
                        "labels": s.labels,
                        "value": value,
                    }
                )
    except Exception as e:  # the parser's ValueError, or anything else it raises
        print(f"the exposition does not parse: {e!r}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
