#!/usr/bin/env bash
# The terminations of a rollout as a table, from their records alone: envoy-drain's summary lines
# with `--log-format json` (docs/usage.md, "The record"), read from stdin among any other lines
# (the app's own, a log collector's export, `kubectl logs`), one row per record. For example,
# while the pods terminate:
#   kubectl logs -n shop -l app=reviews --all-containers -f --max-log-requests 20 | bash examples/records.sh
# Needs jq.
set -euo pipefail
echo "| namespace | pod | command | preset | outcome | exit | held | since last arrival | quiet time | count | warnings |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
# A line that is not JSON, or JSON that is not a summary, is skipped.
jq -R -r '
  fromjson? | select(type == "object" and .event == "summary") |
  def s: if . == null then "-" else "\(. / 1000)s" end;
  "| \(.namespace // "-") | \(.pod // "-") | \(.command) | \(.preset) | \(.outcome) | \(.exit_code) | \(.elapsed_ms | s) | \(.since_last_arrival_ms | s) | \(.quiet_ms | s) | \(if .count == null then "-" else "\(.count) (\(.count_unit), \(.count_source))" end) | \(.warnings | length) |"
'
