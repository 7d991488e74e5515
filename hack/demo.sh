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
# Environment:
#   DEMO_EXIT=1   exit after the checks (CI): status 0 only if every invariant held
#   DEMO_DIR      state directory (default: .demo in the repository): kubeconfig, logs, binaries
#   DEMO_OUTAGE   how long the billing provider stays down, in seconds (default 10)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
state=${DEMO_DIR:-$root/.demo}
bin=$state/bin
logs=$state/logs
kubeconfig=$state/kubeconfig
ns=default
outage=${DEMO_OUTAGE:-10}
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
  if [ -n "${pid_controlplane:-}${pid_billing:-}${pid_manager:-}" ]; then
    printf '\nstopping the demo (manager, fake billing provider, control plane)...\n'
  fi
  [ -n "${pid_manager:-}" ] && stop_group "$pid_manager" 35
  [ -n "${pid_billing:-}" ] && stop_group "$pid_billing" 10
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

# --- start ------------------------------------------------------------------------
command -v go >/dev/null || die "go is not on PATH (the demo builds the operator from this checkout)"
mkdir -p "$bin" "$logs"
stop_leftovers
rm -rf "$state/tmp"
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
note "into $bin"

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

step "starting the fake billing provider on $billing_url"
umask 077
printf '%s' "$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')" >"$state/billing-token"
printf 'whsec_%s' "$(head -c 24 /dev/urandom | base64)" >"$state/webhook-secret"
umask 022
start_bg billing "$logs/fake-billing.log" "$bin/fake-billing" -addr "127.0.0.1:$billing_port" -token-file "$state/billing-token"
"$bin/demo" wait-http -url "$billing_url/_admin/ledger" -timeout 30s || die "the fake billing provider did not start; see $logs/fake-billing.log"

step "starting the manager (controllers + receiver) as a real process"
start_bg manager "$logs/manager.log" env KUBECONFIG="$kubeconfig" "$bin/manager" \
  --receiver-bind-address="127.0.0.1:$receiver_port" \
  --metrics-bind-address="127.0.0.1:$metrics_port" \
  --health-probe-bind-address="127.0.0.1:$probe_port"
"$bin/demo" wait-http -url "http://127.0.0.1:$probe_port/readyz" -timeout 60s || die "the manager did not become ready; see $logs/manager.log"
note "receiver http://127.0.0.1:$receiver_port   metrics http://127.0.0.1:$metrics_port/metrics   log $logs/manager.log"

step "configuring a WebhookProvider (Standard Webhooks) and a BillingProvider"
k create secret generic inference-webhook-secret -n "$ns" --from-file=key="$state/webhook-secret" | sed 's/^/    /'
k create secret generic billing-api-token -n "$ns" --from-file=token="$state/billing-token" | sed 's/^/    /'
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
  reconciliation: {interval: 1m, stuckAfter: 5m, eventStaleAfter: 5m, keepReports: 5}
EOF
k wait --for=condition=Ready -n "$ns" webhookprovider/inference --timeout=60s >/dev/null
k get whp,bp -n "$ns" | sed 's/^/    /'

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

step "5. the billing provider charges job-4001 but its reply is lost (held until the client times out)"
fault '{"commit_then_timeout_next":1}'
send 200 msg_job-4001_v1 job-4001 1 succeeded 512 cus_globex
"$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout 60s | sed 's/^/    /'

step "6. the billing provider goes down for ${outage}s; deliveries are still accepted"
fault "{\"down_for_ms\":$((outage * 1000))}"
send 200 msg_job-3001_v1 job-3001 1 succeeded 300 cus_acme
send 200 msg_job-3002_v1 job-3002 1 succeeded 1200 cus_globex
send 200 msg_job-3003_v1 job-3003 1 succeeded 75 cus_initech
sleep 3
note "3s into the outage, the settlements that are not Settled yet:"
k get billingsettlements -n "$ns" | awk 'NR == 1 || !/Settled/' | sed 's/^/    /'

step "7. waiting until every event, job and settlement has reached a final or explicit state"
"$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout $((outage + 60))s | sed 's/^/    /' ||
  failures=$((failures + 1))

step "8. kubectl get whe,jc,bs,rr -o wide"
k get whe,jc,bs,rr -n "$ns" -o wide

step "9. the provider's ledger (GET $billing_url/_admin/ledger), per settlement key"
if ! "$bin/demo" report -kubeconfig "$kubeconfig" -namespace "$ns" -billing-url "$billing_url" -expect-quarantined 1; then
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

Metrics: curl -s http://127.0.0.1:$metrics_port/metrics | grep ^settlement_
Logs:    $logs/{manager,fake-billing,control-plane}.log
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
