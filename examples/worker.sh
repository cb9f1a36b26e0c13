#!/bin/sh
# A shell worker for trying out `atlasboost run`: prints what the launcher told it, checks
# that the rank table exists, and prints three progress lines.
#
# Usage: atlasboost run --sim 8 -- sh examples/worker.sh

for var in RANK_ID RANK_SIZE DEVICE_ID RANK_TABLE_FILE; do
    eval "value=\${$var-}"
    if [ -z "$value" ]; then
        echo "worker.sh: $var is not set or empty; start me with atlasboost run" >&2
        exit 2
    fi
done

echo "rank $RANK_ID of $RANK_SIZE on device $DEVICE_ID, table $RANK_TABLE_FILE"
if [ ! -f "$RANK_TABLE_FILE" ]; then
    echo "worker.sh: rank $RANK_ID: rank table $RANK_TABLE_FILE does not exist" >&2
    exit 2
fi
for i in 1 2 3; do
    sleep 0.1
    echo "rank $RANK_ID: progress $i/3"
done
