#!/bin/sh
# Every INTERVAL seconds: put a job into TUBE over HTTP, reserve it (long-poll)
# and delete it with its reservation token. Talks to beangate at BEANGATE_URL.
set -u
B=${BEANGATE_URL:-http://beangate:11301}
TUBE=${TUBE:-demo}
INTERVAL=${INTERVAL:-3}
trap 'echo "demo-worker: stopping"; exit 0' TERM INT

pause() { sleep "$1" & wait $!; }   # a wait that SIGTERM interrupts

n=0
while :; do
    n=$((n + 1))
    if ! put=$(curl -fsS --max-time 5 --data-binary "hello $n from $(hostname)" "$B/tubes/$TUBE/jobs"); then
        echo "demo-worker: put failed, retrying in ${INTERVAL}s"
        pause "$INTERVAL"
        continue
    fi
    echo "put      $put"
    # timeout=5: wait up to 5 s for a job; 204 (empty reply) means none came
    job=$(curl -fsS --max-time 10 -X POST "$B/tubes/$TUBE/reservations?timeout=5") || job=
    if [ -n "$job" ]; then
        id=$(printf '%s' "$job" | jq -r .id)
        token=$(printf '%s' "$job" | jq -r .reservation)
        echo "reserved $id: $(printf '%s' "$job" | jq -r '.body // .body_base64')"
        if curl -fsS --max-time 5 -o /dev/null -X DELETE "$B/jobs/$id?reservation=$token"; then
            echo "deleted  $id"
        fi
    else
        echo "demo-worker: nothing reserved"
    fi
    pause "$INTERVAL"
done
