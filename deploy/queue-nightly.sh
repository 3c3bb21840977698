#!/usr/bin/env bash
# Queue the night's tuning jobs through the dstune API: one POST /v1/jobs per object of the JSON array in $1.
# Needs curl and python3; the bearer token comes from $DSTUNE_API_TOKEN_FILE (default /etc/dstune/token).
set -euo pipefail
JOBS=${1:-/etc/dstune/nightly-jobs.json}
API=${DSTUNE_API_URL:-http://127.0.0.1:8000}
TOKEN=$(cat "${DSTUNE_API_TOKEN_FILE:-/etc/dstune/token}")
python3 -c 'import json, sys; [print(json.dumps(job)) for job in json.load(open(sys.argv[1]))]' "$JOBS" |
while IFS= read -r job; do
    # -f: a 4xx/5xx answer fails the unit (systemd shows it); the answer names the job id and study.
    curl -fsS -X POST "$API/v1/jobs" \
        -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
        --data-binary "$job"
    echo
done
