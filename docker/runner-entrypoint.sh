#!/bin/sh
# Runner container: obtain a credential once (pairing code, or managed enrollment with a
# runner-role API key), keep it in $AGENTPLANE_RUNNER_HOME (a volume), then run the daemon.
set -eu
CLI="node /app/runner-daemon/dist/cli.js"
: "${AGENTPLANE_URL:?set AGENTPLANE_URL to the API base URL}"
if [ ! -f "${AGENTPLANE_RUNNER_HOME}/runner.json" ]; then
  if [ -n "${RUNNER_PAIRING_CODE:-}" ]; then
    $CLI pair --code "$RUNNER_PAIRING_CODE" --url "$AGENTPLANE_URL" --label "${RUNNER_LABEL:-$(hostname)}"
  elif [ -n "${RUNNER_API_KEY:-}" ] && [ -n "${RUNNER_POOL_ID:-}" ]; then
    $CLI enroll --api-key "$RUNNER_API_KEY" --pool "$RUNNER_POOL_ID" --url "$AGENTPLANE_URL" --label "${RUNNER_LABEL:-$(hostname)}"
  else
    echo "no runner credential: set RUNNER_PAIRING_CODE, or RUNNER_API_KEY and RUNNER_POOL_ID" >&2
    exit 2
  fi
fi
$CLI doctor || echo "doctor reported problems; starting anyway (see above)" >&2
exec $CLI start
