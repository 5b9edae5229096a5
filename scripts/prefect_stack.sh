#!/usr/bin/env bash
# Start and stop the local Prefect server, the work pool's worker and the deployments.
#
#   scripts/prefect_stack.sh server-start   # prefect server on 127.0.0.1:$PREFECT_PORT
#   scripts/prefect_stack.sh worker-start [orchestration.deploy options, e.g. --cron "0 3 * * 1",
#                                          --cluster tcp://HOST:8786]
#       # creates the process work pool 'regrab' if missing, registers the deployments
#       # regrab-scheduled/weekly and regrab-retrain/experiment (python -m orchestration.deploy),
#       # then starts 'prefect worker start --pool regrab' in the background
#   scripts/prefect_stack.sh run [prefect deployment run options, e.g. --param cluster=tcp://HOST:8786]
#       # triggers $PREFECT_DEPLOYMENT (default regrab-scheduled/weekly) and watches it
#   scripts/prefect_stack.sh status
#   scripts/prefect_stack.sh stop           # worker first, then the server
#
# PIDs and logs live in $PREFECT_RUN_DIR (default <repo>/.prefect-run); the server's
# database lives in $PREFECT_RUN_DIR/home (PREFECT_HOME), so it never touches ~/.prefect.
# Every process is stopped by the PID this script recorded, never by name.
#
# Environment: PYTHON (interpreter with the project installed; default python),
# PREFECT_RUN_DIR, PREFECT_PORT (4200), PREFECT_START_TIMEOUT (s, 180),
# PREFECT_STOP_TIMEOUT (s, 30), PREFECT_RUN_TIMEOUT (s to watch a run, 7200),
# PREFECT_DEPLOYMENT (what 'run' triggers), PREFECT_POOL (regrab).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="${PREFECT_RUN_DIR:-$ROOT/.prefect-run}"
PORT="${PREFECT_PORT:-4200}"
PYTHON="${PYTHON:-python}"
START_TIMEOUT="${PREFECT_START_TIMEOUT:-180}"
STOP_TIMEOUT="${PREFECT_STOP_TIMEOUT:-30}"
RUN_TIMEOUT="${PREFECT_RUN_TIMEOUT:-7200}"
DEPLOYMENT="${PREFECT_DEPLOYMENT:-regrab-scheduled/weekly}"
POOL="${PREFECT_POOL:-regrab}"
API_URL="http://127.0.0.1:${PORT}/api"

export PREFECT_HOME="$RUN_DIR/home"
export PREFECT_API_URL="$API_URL"
# No network here, and the heartbeat only adds SQLite lock errors to the log.
export PREFECT_SERVER_ANALYTICS_ENABLED=false

die() { echo "error: $*" >&2; exit 2; }

healthy() {
    "$PYTHON" - "$API_URL/health" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)
PY
}

# pid_of NAME: the recorded PID if that process is still alive, else nothing.
pid_of() {
    local file="$RUN_DIR/$1.pid" pid
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file")"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

server_start() {
    mkdir -p "$RUN_DIR" "$PREFECT_HOME"
    local pid t0
    pid="$(pid_of server)"
    if [[ -n "$pid" ]]; then echo "server already running (pid $pid) at http://127.0.0.1:$PORT"; return 0; fi
    healthy && die "something else already answers at $API_URL; stop it or set PREFECT_PORT"
    t0="$(now)"
    nohup "$PYTHON" -m prefect server start --host 127.0.0.1 --port "$PORT" \
        >"$RUN_DIR/server.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$RUN_DIR/server.pid"
    local deadline=$((SECONDS + START_TIMEOUT))
    until healthy; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$RUN_DIR/server.log" >&2
            rm -f "$RUN_DIR/server.pid"
            die "prefect server exited during start-up; log: $RUN_DIR/server.log"
        fi
        if ((SECONDS >= deadline)); then
            die "prefect server (pid $pid) not healthy after ${START_TIMEOUT}s; log: $RUN_DIR/server.log (stop it: $0 stop)"
        fi
        sleep 0.5
    done
    echo "server up in $(elapsed "$t0") s (pid $pid): UI http://127.0.0.1:$PORT, API $API_URL"
    echo "PREFECT_HOME=$PREFECT_HOME, log $RUN_DIR/server.log"
}

worker_start() {
    local pid t0
    healthy || die "no Prefect server answers at $API_URL; run '$0 server-start' (make prefect-server) first"
    t0="$(now)"
    if ! "$PYTHON" -m prefect work-pool inspect "$POOL" >/dev/null 2>&1; then
        "$PYTHON" -m prefect work-pool create "$POOL" --type process >/dev/null \
            || die "could not create work pool '$POOL'"
        echo "work pool '$POOL' created (type process)"
    fi
    (cd "$ROOT" && "$PYTHON" -m orchestration.deploy --pool "$POOL" "$@") \
        || die "deployments not registered (see the error above)"
    pid="$(pid_of worker)"
    if [[ -n "$pid" ]]; then echo "worker already running (pid $pid)"; return 0; fi
    # The flows load from this project (flow.from_source): its packages on the path.
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec nohup "$PYTHON" -m prefect \
        worker start --pool "$POOL" --type process >"$RUN_DIR/worker.log" 2>&1 </dev/null) &
    pid=$!
    echo "$pid" >"$RUN_DIR/worker.pid"
    local deadline=$((SECONDS + START_TIMEOUT))
    # The worker prints "Worker '...' started!" once it polls the pool.
    until grep -q "started" "$RUN_DIR/worker.log" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$RUN_DIR/worker.log" >&2
            rm -f "$RUN_DIR/worker.pid"
            die "worker exited during start-up; log: $RUN_DIR/worker.log"
        fi
        ((SECONDS < deadline)) || die "worker (pid $pid) not ready after ${START_TIMEOUT}s; log: $RUN_DIR/worker.log"
        sleep 0.5
    done
    echo "worker on pool '$POOL' up in $(elapsed "$t0") s (pid $pid); log $RUN_DIR/worker.log"
}

run_deployment() {
    healthy || die "no Prefect server answers at $API_URL, so '$DEPLOYMENT' cannot be triggered; run '$0 server-start' then '$0 worker-start' (make prefect-server prefect-worker)"
    [[ -n "$(pid_of worker)" ]] || echo "warning: no worker recorded in $RUN_DIR; the run stays Scheduled until '$0 worker-start'" >&2
    "$PYTHON" -m prefect deployment run "$DEPLOYMENT" --watch --watch-timeout "$RUN_TIMEOUT" "$@"
}

# stop_one NAME: SIGTERM the recorded PID, wait for it to exit, SIGKILL after the timeout.
stop_one() {
    local name="$1" pid
    pid="$(pid_of "$name")"
    if [[ -z "$pid" ]]; then echo "$name: not running"; rm -f "$RUN_DIR/$name.pid"; return 0; fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            echo "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        sleep 0.2
    done
    rm -f "$RUN_DIR/$name.pid"
    echo "$name (pid $pid) stopped"
}

status() {
    local pid
    pid="$(pid_of server)"
    if [[ -n "$pid" ]]; then echo "server: pid $pid"; else echo "server: not running"; fi
    if healthy; then echo "api: $API_URL healthy"; else echo "api: $API_URL not answering"; fi
    pid="$(pid_of worker)"
    if [[ -n "$pid" ]]; then echo "worker: pid $pid (pool $POOL)"; else echo "worker: not running"; fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
    server-start) server_start ;;
    worker-start) worker_start "$@" ;;
    run) run_deployment "$@" ;;
    # The worker first: a run it holds is reported to the server before the server goes.
    stop) stop_one worker; stop_one server ;;
    status) status ;;
    *) echo "usage: $0 {server-start|worker-start [deploy opts]|run [run opts]|status|stop}" >&2; exit 2 ;;
esac
