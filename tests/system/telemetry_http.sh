#!/usr/bin/env bash
# the job's telemetry over HTTP, checked with real clients. A 2-node job (two agents
# on this machine, 2 ranks each, the first hosting the rendezvous with --metrics-port 0):
#   - a real Prometheus (Debian's package) scrapes /metrics, and its query API returns the
#     series of every rank;
#   - headless Chromium (Debian's package) renders the live page twice: one table row per rank,
#     numbers that change between the loads; a screenshot is saved in the build tree;
#   - the hosting agent's end-of-job report covers both nodes, and --report-json agrees.
set -euo pipefail
source "$(dirname "$0")/common.sh"
: "${DLRUN:?}" "${SOURCE_DIR:?}" "${WORK_DIR:?}"
work="$WORK_DIR/telemetry_http.$$"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
pids=()
cleanup() {
  touch "$work/stop"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
on_exit 'cleanup'
fail() {
  dlrun_failed=1
  echo "FAIL (telemetry_http): $*" >&2
  for f in "$work"/*.log; do [[ -e "$f" ]] && { echo "--- $f" >&2; tail -n 40 "$f" >&2; }; done
  exit 1
}
command -v prometheus >/dev/null || fail "prometheus is missing: scripts/install-deps --system"
command -v chromium >/dev/null || fail "chromium is missing: scripts/install-deps --system"

# Every rank reports a step every 50-80 ms until the test creates the stop file.
cat >steps.py <<'EOF'
import os, time, dlrun_report
rank = int(os.environ["RANK"])
step = 0
while not os.path.exists(os.environ["STOP_FILE"]):
    t0 = time.monotonic()
    time.sleep(0.05 + 0.01 * rank)
    step += 1
    dt = time.monotonic() - t0
    dlrun_report.report_step(step, samples=4, step_s=dt, data_s=0.005, compute_s=dt - 0.001,
                             sync_s=0.001, loss=1.0 / step)
EOF
rdzv_port=$(free_port)
export DLRUN_RDZV_TOKEN="telemetry-$$" PYTHONPATH="$SOURCE_DIR/python" STOP_FILE="$work/stop"
export PYTHON_EXEC=${TEST_PYTHON:-/usr/bin/python3} OMP_NUM_THREADS=1
node=(--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$rdzv_port"
      --rdzv-id "telemetry-$$" --spare-workers off)
"$DLRUN" "${node[@]}" --metrics-port 0 --metrics-addr 127.0.0.1 --report-json report.json \
  steps.py >node0.log 2>&1 &
pids+=($!)
follow_until node0.log "hosting the rendezvous" 30 || fail "the first agent does not host"
"$DLRUN" "${node[@]}" --report-json node1.json steps.py >node1.log 2>&1 &
pids+=($!)
follow_until node0.log "job telemetry on http://127.0.0.1:[0-9]+/" 60 || fail "no metrics server"
mport=$(grep -oE "job telemetry on http://127.0.0.1:[0-9]+/" node0.log | grep -oE "[0-9]+/$" | tr -d /)
base="http://127.0.0.1:$mport"

# Prometheus, on a free port, scraping the job every second.
pport=$(free_port)
cat >prometheus.yml <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: dlrun
    static_configs:
      - targets: ["127.0.0.1:$mport"]
EOF
prometheus --config.file=prometheus.yml --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$pport" >prometheus.log 2>&1 &
pids+=($!)
# prom EXPR: the result of Prometheus' query API for EXPR as JSON ([] when it is not ready).
prom() {
  python3 - "http://127.0.0.1:$pport/api/v1/query" "$1" <<'EOF' 2>/dev/null || echo "[]"
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]})
print(json.dumps(json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]))
EOF
}
query() {  # query EXPR: how many series Prometheus returns now
  prom "$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'
}
deadline=$((SECONDS + 60))
until [[ $(query 'dlrun_step_time_seconds') == 4 && $(query 'dlrun_cpu_utilization') == 4 ]]; do
  ((SECONDS < deadline)) || fail "Prometheus has $(query dlrun_step_time_seconds) step-time series, expected 4 (one per rank)"
  sleep 0.5  # polling Prometheus' own scrape cycle, under the deadline above
done
for expr in 'dlrun_world_size == 4' 'dlrun_nodes == 2' 'dlrun_samples_per_second > 0' \
            'dlrun_straggler' 'dlrun_data_wait_fraction' 'dlrun_compute_seconds' \
            'dlrun_sync_wait_seconds' 'dlrun_rss_bytes' 'dlrun_loss'; do
  want=4
  [[ $expr == dlrun_world_size* || $expr == dlrun_nodes* ]] && want=1
  got=$(query "$expr")
  [[ $got == "$want" ]] || fail "Prometheus: '$expr' gave $got series, expected $want"
done
hosts=$(prom 'dlrun_step_time_seconds' |
        python3 -c 'import json,sys; print(sorted(r["metric"]["rank"] for r in json.load(sys.stdin)))')
[[ $hosts == "['0', '1', '2', '3']" ]] || fail "ranks in Prometheus: $hosts"

# The page, rendered by Chromium twice: a row per rank, and the step counts move.
render() {
  timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --user-data-dir="$work/chromium" --virtual-time-budget=4000 "$@" "$base/" 2>>chromium.log
}
render --dump-dom >page1.html
rows1=$(grep -oE 'id="rank-[0-9]+"' page1.html | sort -u | wc -l)
((rows1 == 4)) || fail "the page has $rows1 rank rows, expected 4"
steps_of() {  # the steps column (3rd cell) of each rank row
  python3 - "$1" <<'EOF'
import re, sys
html = open(sys.argv[1]).read()
rows = re.findall(r'<tr id="rank-(\d+)"[^>]*>(.*?)</tr>', html)
print(" ".join(re.findall(r"<td[^>]*>(.*?)</td>", cells)[2] for _, cells in rows))
EOF
}
s1=$(steps_of page1.html)
deadline=$((SECONDS + 30))
while :; do
  render --dump-dom >page2.html
  s2=$(steps_of page2.html)
  [[ -n $s2 && $s2 != "$s1" ]] && break
  ((SECONDS < deadline)) || fail "the page's step counts did not change: '$s1' then '$s2'"
done
grep -q 'class="state-running"' page2.html || fail "the page does not show the job running"
grep -q '<path d="M' page2.html || fail "the page has no chart line"
screenshot="$WORK_DIR/telemetry_page.png"
render --screenshot="$screenshot" --window-size=1280,1000 >/dev/null
[[ -s $screenshot ]] || fail "no screenshot"

# The end: the host's report covers both nodes.
touch stop
for p in "${pids[@]:0:2}"; do wait "$p" || fail "an agent failed"; done
grep -q "job report: succeeded after .* 4 rank(s) on 2 node(s)" node0.log ||
  fail "the hosting agent's report does not cover the job"
python3 - <<'EOF' || fail "report.json disagrees"
import json
j = json.load(open("report.json"))
assert j["scope"] == "job", j["scope"]
assert sorted(j["ranks"]) == ["0", "1", "2", "3"], j["ranks"].keys()
n1 = json.load(open("node1.json"))
assert n1["scope"] == "node"
for r in ("2", "3"):  # node 1's ranks: the host saw their final counts
    assert j["ranks"][r]["steps"] == n1["ranks"][r]["steps"], (j["ranks"][r], n1["ranks"][r])
for k in ("wall_s", "restarts", "samples_per_sec", "stragglers"):
    assert k in j, k
EOF
echo "PASS (telemetry_http): Prometheus scraped 4 ranks from port $mport; page rows 4, steps '$s1' -> '$s2'; screenshot $screenshot"
