#!/bin/sh
# Test agent: exits with status 7 before reading anything.
echo "cannot start: no model configured" >&2
exit 7
