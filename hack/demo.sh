#!/usr/bin/env bash
# `make demo`: the operator's whole job on this machine, no cluster needed.
#
# Starts etcd + kube-apiserver (the control plane the tests use, from
# hack/setup-envtest.sh), installs the CRDs with server-side apply, runs the manager
# (controllers + webhook receiver) and a fake billing provider as real processes,
# configures a WebhookProvider and a BillingProvider, then sends signed webhooks:
# duplicates, a conflicting reuse of an event ID, an out-of-order pair, a lost billing
# reply and a billing outage that recovers. It waits until everything has settled,
# prints the objects and the provider's ledger, checks that every accepted event
# reached a final or explicit state and that every settlement key was charged exactly
# once, and then keeps running so you can play (Ctrl-C stops everything it started).
#
# The archive: where the PostgreSQL server binaries are installed and the
# manager has --archive-database-url, the demo also starts a throwaway PostgreSQL
# (data in $DEMO_DIR/postgres, a free loopback port), runs the manager with it and a
# short --archive-after, shows the settlements leaving the cluster for the archive and
# found there, and checks every invariant over cluster ∪ archive. Otherwise it says
# why and runs without the archive, as before.
#
# Environment:
#   DEMO_EXIT=1   exit after the checks (CI): status 0 only if every invariant held
#   DEMO_DIR      state directory (default: .demo in the repository): kubeconfig, logs, binaries
#   DEMO_OUTAGE   how long the billing provider stays down, in seconds (default 10)
#   DEMO_ARCHIVE=0        run without the archive even where it could run
#   DEMO_ARCHIVE_AFTER    the manager's --archive-after (default 5s)
#   PG_BIN        directory holding initdb, pg_ctl and postgres (default: PATH, then
#                 /usr/lib/postgresql/<newest>/bin)
#   DEMO_BILLING  a usage-billing platform instead: Lago, Metronome or OpenMeter, a list
#                 (Lago,OpenMeter), or "platforms" for every platform whose fake is in this
#                 checkout. Its fake runs next to the manager and jobs are settled through
#                 it, with a duplicate delivery and a redelivery, checked against the
#                 platform's books (hack/demo/platforms.sh; without the archive). Unset:
#                 the tour above.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
state=${DEMO_DIR:-$root/.demo}
bin=$state/bin
logs=$state/logs
kubeconfig=$state/kubeconfig
ns=default
outage=${DEMO_OUTAGE:-10}
archive_after=${DEMO_ARCHIVE_AFTER:-5s}
t0=$SECONDS
failures=0

bold='' plain=''
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; fi
step() { printf '\n%s==> [%3ds] %s%s\n' "$bold" $((SECONDS - t0)) "$*" "$plain"; }
note() { printf '    %s\n' "$*"; }
die() { printf '\ndemo: error: %s\n' "$*" >&2; exit 1; }

# --- processes ------------------------------------------------------------------
# Every long-running process is started in its own process group (set -m), recorded
# in $state/pids, and stopped by group: SIGTERM, a grace period, then SIGKILL.

cmdline_of() {
  if [ -r "/proc/$1/cmdline" ]; then tr '\0' ' ' <"/proc/$1/cmdline"; else ps -o args= -p "$1" 2>/dev/null || true; fi
}

start_bg() { # name logfile command...
  local name=$1 log=$2
  shift 2
  set -m
  "$@" </dev/null >>"$log" 2>&1 &
  local pid=$!
  set +m
  echo "$name $pid" >>"$state/pids"
  eval "pid_$name=$pid"
}

stop_group() { # pid grace-seconds
  local pid=$1 grace=$2 wd
  # Never `wait` for a process that is already gone: inside an EXIT trap, bash can
  # block forever waiting for a child it reaped earlier.
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  # The watchdog polls, so it ends by itself once $pid is gone: nothing to kill later
  # (cleanup ignores TERM, and ignored signals are inherited).
  (
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt $((grace * 10)) ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL -- "-$pid" 2>/dev/null || true
  ) </dev/null >/dev/null 2>&1 &
  wd=$!
  wait "$pid" 2>/dev/null || true
  wait "$wd" 2>/dev/null || true
  kill -KILL -- "-$pid" 2>/dev/null || true # stragglers in the group, if any
}

# stop_control_plane_children kills etcd/kube-apiserver left behind if the control
# plane helper could not stop them (envtest runs them in their own process groups).
stop_control_plane_children() {
  local f=$state/control-plane.pids p
  [ -f "$f" ] || return 0
  while read -r p; do
    [ -n "$p" ] || continue
    case "$(cmdline_of "$p")" in
      *etcd* | *kube-apiserver*) kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true ;;
    esac
  done <"$f"
  rm -f "$f"
}

cleaned=
cleanup() {
  [ -z "$cleaned" ] || return 0
  cleaned=1
  trap '' INT TERM HUP
  [ -z "${sleeper:-}" ] || kill "$sleeper" 2>/dev/null || true
  if [ -n "${pid_controlplane:-}${pid_billing:-}${pid_manager:-}${pgdir:-}" ]; then
    printf '\nstopping the demo (manager, %s, %scontrol plane)...\n' "${fakes_desc:-fake billing provider}" "${pgdir:+PostgreSQL, }"
  fi
  [ -n "${pid_manager:-}" ] && stop_group "$pid_manager" 35
  [ -n "${pid_billing:-}" ] && stop_group "$pid_billing" 10
  [ -z "${platforms:-}" ] || platforms_stop
  if [ -n "${pgdir:-}" ]; then
    stop_postgres "$pgdir"
    # A directory of its own under /tmp (see start_postgres) goes; $state/postgres
    # stays for a look, and the next run starts it afresh.
    [ "$pgdir" = "$state/postgres" ] || rm -rf "$pgdir"
    rm -f "$state/postgres.dir"
  fi
  [ -n "${pid_controlplane:-}" ] && stop_group "$pid_controlplane" 45
  stop_control_plane_children
  rm -f "$state/pids" "$kubeconfig"
}

# A previous run that was killed with SIGKILL cannot have cleaned up: stop what it
# recorded (only processes that still run one of its binaries or the control plane).
stop_leftovers() {
  local name pid
  if [ -f "$state/pids" ]; then
    while read -r name pid; do
      if [ "$name" = script ]; then
        case "$(cmdline_of "$pid")" in
          *demo.sh*) die "another demo is running in $state (pid $pid); stop it first, or set DEMO_DIR" ;;
        esac
        continue
      fi
      case "$(cmdline_of "$pid")" in
        *"$state/bin/"*) note "stopping $name (pid $pid) left over from an earlier run"; kill -KILL -- "-$pid" 2>/dev/null || true ;;
      esac
    done <"$state/pids"
    rm -f "$state/pids"
  fi
  stop_control_plane_children
  if [ -f "$state/postgres.dir" ]; then
    local d
    d=$(cat "$state/postgres.dir")
    stop_postgres "$d" "left over from an earlier run"
    [ "$d" = "$state/postgres" ] || rm -rf "$d"
    rm -f "$state/postgres.dir"
  fi
}

# --- ports ------------------------------------------------------------------------
used_ports=" "
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() { # variable preferred-port: the first free port from there on
  local p=$2
  while [[ $used_ports == *" $p "* ]] || ! port_free "$p"; do p=$((p + 1)); done
  used_ports+="$p "
  printf -v "$1" '%s' "$p"
}

# --- PostgreSQL (the archive) -------------------------------------------------------
# A server for this run only: initialised afresh, password-protected, on a loopback port
# without a Unix socket, stopped by cleanup. PostgreSQL refuses to run as root, so as
# root it runs as nobody (as internal/archive/pgtest does).

# pg_bin_dir prints the directory holding initdb, pg_ctl and postgres: $PG_BIN, else
# the one on PATH, else the newest /usr/lib/postgresql/*/bin.
pg_bin_dir() {
  local d candidates=()
  if [ -n "${PG_BIN:-}" ]; then
    candidates=("$PG_BIN")
  else
    if d=$(command -v initdb 2>/dev/null); then candidates+=("$(dirname "$d")"); fi
    while IFS= read -r d; do candidates+=("$d"); done < <(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4,4nr)
    candidates+=(/usr/local/pgsql/bin)
  fi
  for d in "${candidates[@]}"; do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # one single-quoted sh word

as_pg() { # command args...: run as the server's owner (nobody when we are root)
  if [ "$(id -u)" -ne 0 ]; then
    env LC_ALL=C "$@"
    return
  fi
  local a cmd=""
  for a in "$@"; do cmd+=" $(sq "$a")"; done
  su -s /bin/sh nobody -c "exec env LC_ALL=C$cmd"
}

# start_postgres initialises and starts the server, creates the archive's database
# and writes its URL to $state/archive-url (the URL holds the password: it is passed
# by file or environment, never on a command line).
start_postgres() {
  local password
  pgdir=$state/postgres
  rm -rf "$pgdir"
  mkdir -p "$pgdir"
  chmod 700 "$pgdir"
  if [ "$(id -u)" -eq 0 ]; then
    chown nobody "$pgdir"
    if ! as_pg test -w "$pgdir"; then
      # nobody cannot reach $state (a checkout under /root, say): a directory of its own.
      rm -rf "$pgdir"
      pgdir=$(mktemp -d "${TMPDIR:-/tmp}/settlement-demo-postgres.XXXXXX")
      chown nobody "$pgdir"
      note "nobody cannot reach $state, so the server's data is in $pgdir (removed at exit)"
    fi
  fi
  echo "$pgdir" >"$state/postgres.dir"
  password=$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
  (umask 077 && printf '%s\n' "$password" >"$pgdir/pwfile")
  [ "$(id -u)" -ne 0 ] || chown nobody "$pgdir/pwfile"
  as_pg "$pgbin/initdb" -D "$pgdir/data" -U postgres --pwfile="$pgdir/pwfile" -A scram-sha-256 -E UTF8 --no-sync \
    >"$pgdir/initdb.log" 2>&1 || die "initdb failed; see $pgdir/initdb.log (DEMO_ARCHIVE=0 runs the demo without the archive)"
  rm -f "$pgdir/pwfile"
  as_pg "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/postgres.log" -w -t 60 \
    -o "-p $pg_port -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off -c full_page_writes=off -c max_connections=50" \
    start >"$pgdir/pg_ctl.log" 2>&1 || die "PostgreSQL did not start; see $pgdir/postgres.log and $pgdir/pg_ctl.log"
  ln -sf "$pgdir/postgres.log" "$logs/postgres.log"
  PGPASSWORD=$password "$psql" -X -q -v ON_ERROR_STOP=1 "postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable" \
    -c 'CREATE DATABASE settlement_archive' || die "could not create the archive's database; see $logs/postgres.log"
  (umask 077 && printf 'postgres://postgres:%s@127.0.0.1:%s/settlement_archive?sslmode=disable\n' "$password" "$pg_port" >"$state/archive-url")
}

# stop_postgres DIR [why]: fast shutdown (SIGINT to the postmaster: open sessions are
# cut), then SIGKILL after a grace period. Only a postgres process is signalled.
stop_postgres() {
  local dir=$1 why=${2:-} pid i
  [ -f "$dir/data/postmaster.pid" ] || return 0
  pid=$(head -n 1 "$dir/data/postmaster.pid")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 0
  case "$(cmdline_of "$pid")" in *postgres*) ;; *) return 0 ;; esac
  [ -z "$why" ] || note "stopping PostgreSQL (pid $pid) $why"
  kill -INT "$pid" 2>/dev/null || true
  for i in $(seq 1 200); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# psql_archive [psql args] <<<SQL: a query against the archive (password from the URL
# file). SQL comes on stdin because psql interpolates :'variables' only there.
psql_archive() {
  "$psql" -X -q -v ON_ERROR_STOP=1 "$(cat "$state/archive-url")" "$@"
}

# --- start ------------------------------------------------------------------------
command -v go >/dev/null || die "go is not on PATH (the demo builds the operator from this checkout)"
platforms=''
if [ -n "${DEMO_BILLING:-}" ] && [ "$DEMO_BILLING" != HTTP ]; then
  . hack/demo/platforms.sh # the usage-billing platforms variant
  platforms_select "$DEMO_BILLING"
  fakes_desc="the fakes of ${platforms// /, }"
fi
mkdir -p "$bin" "$logs"
stop_leftovers
rm -rf "$state/tmp"
rm -f "$state/archive-url" "$state/archived-key" # an earlier run's archive is gone with its server
echo "script $$" >"$state/pids"
trap 'cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
for f in "$logs"/*.log; do if [ -e "$f" ]; then : >"$f"; fi; done

step "control plane binaries (hack/setup-envtest.sh; built from source on first use)"
assets=$(hack/setup-envtest.sh)
kubectl=$assets/kubectl
ln -sf "$kubectl" "$bin/kubectl"
note "$assets"
k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }

step "building the manager, the fake billing provider, send-webhook and the demo toolbox"
go build -o "$bin/manager" ./cmd
go build -o "$bin/" ./cmd/fake-billing ./cmd/send-webhook ./hack/demo
rm -f "$bin/kubectl-settlement"
if [ -d cmd/kubectl-settlement ] && [ -z "$platforms" ]; then # the variant has no archive to show
  go build -o "$bin/kubectl-settlement" ./cmd/kubectl-settlement
  note "and the kubectl plugin (kubectl settlement)"
fi
[ -z "$platforms" ] || platforms_build
note "into $bin"

# The archive runs when the manager has the flag and PostgreSQL is installed.
archive='' pgbin='' psql=''
manager_help=$("$bin/manager" --help 2>&1 || true) # flag's -help exits 2
if [ "${DEMO_ARCHIVE:-1}" = 0 ]; then
  note "archive: off (DEMO_ARCHIVE=0)"
elif [ -n "$platforms" ]; then
  note "archive: off (DEMO_BILLING: every record stays in the cluster, next to the platform's books)"
elif ! grep -q -- '-archive-database-url' <<<"$manager_help"; then
  note "archive: off (this manager has no --archive-database-url flag yet)"
elif ! pgbin=$(pg_bin_dir); then
  note "archive: off: the PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found${PG_BIN:+ in PG_BIN=$PG_BIN}."
  note "  Install them (Debian/Ubuntu: sudo apt-get install -y postgresql), or set PG_BIN to their directory"
  note "  (e.g. PG_BIN=/usr/lib/postgresql/16/bin), to see settlements leave the cluster for the archive."
elif ! psql=$(command -v "$pgbin/psql" || command -v psql); then
  note "archive: off: psql was not found next to $pgbin/initdb nor on PATH (Debian/Ubuntu: sudo apt-get install -y postgresql-client)"
else
  archive=1
  note "archive: on (PostgreSQL from $pgbin; the manager archives finished records after --archive-after=$archive_after)"
fi

step "starting etcd and kube-apiserver on 127.0.0.1"
rm -f "$kubeconfig"
mkdir -p "$state/tmp"
start_bg controlplane "$logs/control-plane.log" env TMPDIR="$state/tmp" "$bin/demo" control-plane -assets "$assets" -kubeconfig "$kubeconfig"
for _ in $(seq 1 900); do
  [ -s "$kubeconfig" ] && break
  kill -0 "$pid_controlplane" 2>/dev/null || die "the control plane did not start; see $logs/control-plane.log"
  sleep 0.1
done
[ -s "$kubeconfig" ] || die "the control plane did not start within 90s; see $logs/control-plane.log"
note "$(k version 2>/dev/null | sed -n 's/^Server Version: /kube-apiserver /p')   kubeconfig: $kubeconfig"

step "installing the CRDs: kubectl apply --server-side -f config/crd/bases"
k apply --server-side -f config/crd/bases | sed 's/^/    /'
k wait --for=condition=Established crd --all --timeout=60s >/dev/null

pick_port receiver_port 8090
pick_port billing_port 8091
pick_port metrics_port 8080
pick_port probe_port 8081
billing_url=http://127.0.0.1:$billing_port
receiver_url=http://127.0.0.1:$receiver_port/webhooks/$ns/inference

umask 077
printf '%s' "$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')" >"$state/billing-token"
printf 'whsec_%s' "$(head -c 24 /dev/urandom | base64)" >"$state/webhook-secret"
umask 022
if [ -z "$platforms" ]; then # the variant starts its platforms' fakes instead
  step "starting the fake billing provider on $billing_url"
  start_bg billing "$logs/fake-billing.log" "$bin/fake-billing" -addr "127.0.0.1:$billing_port" -token-file "$state/billing-token"
  "$bin/demo" wait-http -url "$billing_url/_admin/ledger" -timeout 30s || die "the fake billing provider did not start; see $logs/fake-billing.log"
fi

manager_env=(KUBECONFIG="$kubeconfig")
manager_args=(
  --receiver-bind-address="127.0.0.1:$receiver_port"
  --metrics-bind-address="127.0.0.1:$metrics_port"
  --metrics-secure=false   # plain HTTP on loopback, so `curl` reads it; in a cluster metrics need a token
  --health-probe-bind-address="127.0.0.1:$probe_port"
)
# Settlements are archived once a reconciliation pass has confirmed them: with the
# archive, passes come every few seconds instead of every minute.
reconcile_interval=1m
if [ -n "$archive" ]; then
  pick_port pg_port 15432
  step "starting PostgreSQL for the archive on 127.0.0.1:$pg_port (database settlement_archive)"
  start_postgres
  note "$("$psql" --version)   data $pgdir   log $logs/postgres.log"
  note "URL (with its password) in $state/archive-url; the manager gets it as ARCHIVE_DATABASE_URL"
  manager_args+=(--archive-after="$archive_after")
  reconcile_interval=5s
fi

step "starting the manager (controllers + receiver) as a real process"
# The archive's URL goes through the environment (exported for this one process), so
# its password is on no command line.
if [ -n "$archive" ]; then export ARCHIVE_DATABASE_URL; ARCHIVE_DATABASE_URL=$(cat "$state/archive-url"); fi
start_bg manager "$logs/manager.log" env "${manager_env[@]}" "$bin/manager" "${manager_args[@]}"
unset ARCHIVE_DATABASE_URL
"$bin/demo" wait-http -url "http://127.0.0.1:$probe_port/readyz" -timeout 60s || die "the manager did not become ready; see $logs/manager.log"
note "receiver http://127.0.0.1:$receiver_port   metrics http://127.0.0.1:$metrics_port/metrics   log $logs/manager.log"
if [ -n "$archive" ] && command -v curl >/dev/null; then
  note "$(curl -s "http://127.0.0.1:$metrics_port/metrics" | grep '^settlement_archive_enabled' || echo 'settlement_archive_enabled: not exported')"
fi

# payload JOB VERSION STATE TOKENS CUSTOMER: what the inference platform reports,
# in the shape config/samples/hooks_v1alpha1_webhookprovider.yaml reads.
payload() {
  printf '{"type":"job.completed","data":{"job_id":"%s","version":%d,"state":"%s","completed_at":"2026-11-30T12:00:0%dZ","customer":"%s","usage":{"tokens":%d}}}' \
    "$1" "$2" "$3" "$2" "$5" "$4"
}
# send EXPECTED-STATUS EVENT-ID JOB VERSION STATE TOKENS [CUSTOMER]: one signed delivery.
send() {
  local want=$1 id=$2 body out code
  body=$(payload "$3" "$4" "$5" "$6" "${7:-cus_acme}")
  out=$("$bin/send-webhook" -url "$receiver_url" -secret-file "$state/webhook-secret" -id "$id" -data "$body" 2>"$state/send.err") || true
  [ -n "$out" ] || out=$(cat "$state/send.err")
  code=${out%% *}
  last_event=$(printf '%s' "$out" | sed -n 's/.*"event":"\([^"]*\)".*/\1/p')
  printf '    %-16s %-34s %s\n' "$id" "$3 v$4 $5, $6 tokens" "$out"
  if [ "$code" != "$want" ]; then
    note "^ expected $want"
    failures=$((failures + 1))
  fi
}

# The platforms variant takes over here (hack/demo/platforms.sh) and does not return.
[ -z "$platforms" ] || platforms_main

step "configuring a WebhookProvider (Standard Webhooks) and a BillingProvider"
k create secret generic inference-webhook-secret -n "$ns" --from-file=key="$state/webhook-secret" | sed 's/^/    /'
k create secret generic billing-api-token -n "$ns" --from-file=token="$state/billing-token" | sed 's/^/    /'
# The operator sends a token only where its Secret says it may go (docs/decisions.md
# "Credentials"): the use as a label, the endpoint as an annotation.
k label secret billing-api-token -n "$ns" hooks.settlement.dev/credential-for=billing | sed 's/^/    /'
k annotate secret billing-api-token -n "$ns" hooks.settlement.dev/credential-destinations="$billing_url" | sed 's/^/    /'
k apply --server-side -n "$ns" -f config/samples/hooks_v1alpha1_webhookprovider.yaml | sed 's/^/    /'
k apply --server-side -f - <<EOF | sed 's/^/    /'
apiVersion: hooks.settlement.dev/v1alpha1
kind: BillingProvider
metadata:
  name: billing
  namespace: $ns
spec:
  type: HTTP
  endpoint: $billing_url
  allowInsecureHTTP: true # the fake listens on loopback without TLS
  credentialsSecretRef: {name: billing-api-token, key: token}
  requestTimeout: 2s
  retry: {maxAttempts: 20, maxElapsed: 10m, initialBackoff: 500ms, maxBackoff: 4s}
  reconciliation: {interval: $reconcile_interval, stuckAfter: 5m, eventStaleAfter: 5m, keepReports: 5}
EOF
k wait --for=condition=Ready -n "$ns" webhookprovider/inference --timeout=60s >/dev/null
k get whp,bp -n "$ns" | sed 's/^/    /'

fault() { # JSON: queue faults at the fake billing provider
  local out
  out=$("$bin/demo" post -url "$billing_url/_admin/faults" -data "$1") || die "POST /_admin/faults $1 failed: $out"
  printf '    POST %s/_admin/faults %s -> %s\n' "$billing_url" "$1" "$out"
}

step "1. five jobs complete: one signed delivery each (POST $receiver_url)"
send 200 msg_job-1001_v1 job-1001 1 succeeded 1523 cus_acme
send 200 msg_job-1002_v1 job-1002 1 succeeded 880 cus_globex
send 200 msg_job-1003_v1 job-1003 1 succeeded 4096 cus_initech
send 200 msg_job-1004_v1 job-1004 1 succeeded 120 cus_acme
send 200 msg_job-1005_v1 job-1005 1 succeeded 2750 cus_globex

step "2. the sender retries: the same deliveries again, sequentially and 8 at once"
send 200 msg_job-1001_v1 job-1001 1 succeeded 1523 cus_acme
send 200 msg_job-1002_v1 job-1002 1 succeeded 880 cus_globex
body=$(payload job-1006 1 succeeded 640 cus_initech)
burst=()
for i in 1 2 3 4 5 6 7 8; do
  "$bin/send-webhook" -url "$receiver_url" -secret-file "$state/webhook-secret" -id msg_job-1006_v1 -data "$body" \
    >"$state/burst.$i" 2>&1 &
  burst+=($!)
done
wait "${burst[@]}" || true
ok=$(cat "$state"/burst.* | grep -c '^200 ' || true)
acc=$(cat "$state"/burst.* | grep -c '"accepted"' || true)
dup=$(cat "$state"/burst.* | grep -c '"duplicate"' || true)
rm -f "$state"/burst.*
printf '    %-16s %-34s %s\n' msg_job-1006_v1 "a new job, 8 deliveries at once" "$ok x 200: $acc accepted, $dup duplicate"
if [ "$ok" != 8 ] || [ "$acc" != 1 ]; then note "^ expected 8 x 200 with exactly 1 accepted"; failures=$((failures + 1)); fi

step "3. a buggy sender reuses an event ID with another payload: 409, kept in quarantine"
send 409 msg_job-1003_v1 job-1003 1 succeeded 9999 cus_initech

step "4. out of order: job-2001 failed (v1), succeeded on retry (v2); v2 arrives first"
send 200 msg_job-2001_v2 job-2001 2 succeeded 2048 cus_acme
send 200 msg_job-2001_v1 job-2001 1 failed 2048 cus_acme
"$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout 60s | sed 's/^/    /'
note "msg_job-2001_v1's operations: $(k get whe -n "$ns" "$last_event" \
  -o jsonpath='{range .status.operations[*]}{.type}={.outcome}  {end}')(the job stays at v2)"

step "5. job-5001 failed: it completes, but the sample charges only succeeded jobs (its settlement's when)"
send 200 msg_job-5001_v1 job-5001 1 failed 900 cus_initech
"$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout 60s | sed 's/^/    /'
note "msg_job-5001_v1's operations: $(k get whe -n "$ns" "$last_event" \
  -o jsonpath='{range .status.operations[*]}{.type}={.outcome}  {end}')(no BillingSettlement)"
if [ -n "$(k get whe -n "$ns" "$last_event" -o jsonpath='{.spec.settlements}')" ]; then
  note "^ expected no settlement for a failed job"
  failures=$((failures + 1))
fi

step "6. the billing provider charges job-4001 but its reply is lost (held until the client times out)"
fault '{"commit_then_timeout_next":1}'
send 200 msg_job-4001_v1 job-4001 1 succeeded 512 cus_globex
"$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout 60s | sed 's/^/    /'

step "7. the billing provider goes down for ${outage}s; deliveries are still accepted"
fault "{\"down_for_ms\":$((outage * 1000))}"
send 200 msg_job-3001_v1 job-3001 1 succeeded 300 cus_acme
send 200 msg_job-3002_v1 job-3002 1 succeeded 1200 cus_globex
send 200 msg_job-3003_v1 job-3003 1 succeeded 75 cus_initech
sleep 3
note "3s into the outage, the settlements that are not Settled yet:"
k get billingsettlements -n "$ns" | awk 'NR == 1 || !/Settled/' | sed 's/^/    /'

step "8. waiting until every event, job and settlement has reached a final or explicit state"
"$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout $((outage + 60))s | sed 's/^/    /' ||
  failures=$((failures + 1))

step "9. kubectl get whe,jc,bs,rr -o wide"
k get whe,jc,bs,rr -n "$ns" -o wide
n=10

if [ -n "$archive" ]; then
  step "$n. the archive: Settled settlements leave the cluster once a pass confirmed them and --archive-after=$archive_after passed"
  n=$((n + 1))
  rm -f "$state/archived-key"
  "$bin/demo" wait-archived -kubeconfig "$kubeconfig" -namespace "$ns" -archive-url-file "$state/archive-url" \
    -key-out "$state/archived-key" -timeout 90s 2>&1 | sed 's/^/    /' || failures=$((failures + 1))
  note "kubectl get bs:"
  k get bs -n "$ns" 2>&1 | sed 's/^/      /'
  if [ -s "$state/archived-key" ]; then
    key=$(cat "$state/archived-key")
    if [ -x "$bin/kubectl-settlement" ]; then
      note "kubectl settlement archive get $key:"
      (
        export PATH="$bin:$PATH" KUBECONFIG="$kubeconfig" SETTLEMENT_ARCHIVE_URL
        SETTLEMENT_ARCHIVE_URL=$(cat "$state/archive-url")
        kubectl settlement archive get "$key"
      ) 2>&1 | sed 's/^/      /' || {
        note "^ expected the archived settlement"
        failures=$((failures + 1))
      }
    else
      note "the archive's row for $key (psql; cmd/kubectl-settlement is not in this checkout yet):"
      psql_archive -v key="$key" <<<"SELECT name, state, reconciled, provider_ref, settled_at, archived_at
        FROM settlements WHERE settlement_key = :'key';" 2>&1 | sed 's/^/      /' || failures=$((failures + 1))
    fi
  fi
fi

step "$n. the provider's ledger (GET $billing_url/_admin/ledger), per settlement key${archive:+; records counted in the cluster and in the archive}"
if ! "$bin/demo" report -kubeconfig "$kubeconfig" -namespace "$ns" -billing-url "$billing_url" -expect-quarantined 1 \
  ${archive:+-archive-url-file "$state/archive-url"}; then
  failures=$((failures + 1))
fi
if [ "$failures" -eq 0 ]; then
  printf '\n%sdemo: every check passed in %ds.%s\n' "$bold" $((SECONDS - t0)) "$plain"
else
  printf '\n%sdemo: %d check(s) failed; logs are in %s%s\n' "$bold" "$failures" "$logs" "$plain"
fi

cat >"$state/env" <<EOF
export KUBECONFIG=$kubeconfig
export PATH="$bin:\$PATH"
EOF
if [ -n "$archive" ]; then
  echo "export SETTLEMENT_ARCHIVE_URL=\"\$(cat $state/archive-url)\"" >>"$state/env"
fi

if [ "${DEMO_EXIT:-}" = 1 ]; then
  [ "$failures" -eq 0 ] || exit 1
  exit 0
fi

cat <<EOF

The operator keeps running. In another terminal:

  source $state/env      # KUBECONFIG and PATH (kubectl, send-webhook)
  kubectl get billingsettlements -w
  kubectl get settlement                  # every kind at once
  kubectl describe webhookevent \$(kubectl get whe -o name | head -1 | cut -d/ -f2)

Send another webhook (a new job; change the id and job to send more):

  send-webhook -url $receiver_url \\
    -secret-file $state/webhook-secret -id msg_job-9001_v1 \\
    -data '$(payload job-9001 1 succeeded 1000 cus_acme)'

Take the billing provider down for 20s, and read its ledger:

  curl -X POST $billing_url/_admin/faults -d '{"down_for_ms":20000}'
  curl -s $billing_url/_admin/ledger

EOF
if [ -n "$archive" ]; then
  cat <<EOF
The archive (PostgreSQL on 127.0.0.1:$pg_port, database settlement_archive; the URL, with
its password, is in $state/archive-url):

  psql "\$SETTLEMENT_ARCHIVE_URL" -c 'SELECT settlement_key, state, archived_at FROM settlements'   # $state/env sets it
EOF
  if [ -x "$bin/kubectl-settlement" ]; then
    cat <<EOF
  kubectl settlement archive list
  kubectl settlement archive get '$(cat "$state/archived-key" 2>/dev/null || echo '<key|job-id|event-id|name>')'
EOF
  fi
  echo
fi
cat <<EOF
Metrics: curl -s http://127.0.0.1:$metrics_port/metrics | grep ^settlement_
Logs:    $logs/{manager,fake-billing,control-plane${archive:+,postgres}}.log
Stop:    Ctrl-C here (stops everything the demo started; DEMO_EXIT=1 make demo exits by itself)
EOF
[ -t 0 ] || echo "(no terminal on stdin: this keeps running until it gets SIGINT/SIGTERM; set DEMO_EXIT=1 to exit after the checks)"

while kill -0 "$pid_manager" 2>/dev/null && kill -0 "$pid_billing" 2>/dev/null && kill -0 "$pid_controlplane" 2>/dev/null; do
  sleep 1 &
  sleeper=$!
  wait "$sleeper" || true
  sleeper=
done
die "a demo process exited on its own; see the logs in $logs"
