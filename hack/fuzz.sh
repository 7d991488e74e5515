#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each, one after the other, and
# fails on any finding (docs/decisions.md, "Fuzzing").
#
#   FUZZTIME=1m hack/fuzz.sh                        # `make fuzz`
#   FUZZTIME=3s hack/fuzz.sh --skip '^FuzzReceiver$' # `make fuzz-smoke`
#   FUZZTIME=20s hack/fuzz.sh --only '^FuzzReceiver$'
#
# Each target's whole output is kept in a log directory (printed at the end) and shown
# when the target fails. A target fails on "Failing input written to" (a crasher, left
# in the package's testdata/fuzz for you to look at) and on any other non-zero exit,
# with one exception: the fuzzing engine sometimes exits 1 with only "context deadline
# exceeded" when -fuzztime expires while a worker is mid-input (golang/go#51484). That
# run fuzzed for its full time and found nothing; it is reported as the engine's known
# flake and does not fail the run.
#
# Targets in ENVTEST_TARGETS start a control plane (etcd, kube-apiserver) in the fuzzing
# worker: they run with one worker, bounded minimization and a TMPDIR of their own, and
# whatever control-plane process a killed worker left behind in that TMPDIR is stopped
# afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-1m}"
ENVTEST_TARGETS="${ENVTEST_TARGETS:-FuzzReceiver}"
skip='^$'
only='.'
while [ $# -gt 0 ]; do
  case "$1" in
    --skip) skip="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "usage: FUZZTIME=1m $0 [--skip REGEX] [--only REGEX]" >&2; exit 2 ;;
  esac
done

logdir="$(mktemp -d "${TMPDIR:-/tmp}/fuzz-logs.XXXXXX")"
assets=""
failed=0
flaked=0
passed=0

# stop_leftovers stops every process whose command line names dir: the etcd and
# kube-apiserver a killed fuzzing worker could not stop (they run in their own process
# group, so they outlive it).
stop_leftovers() {
  local dir="$1" pids=() f pid
  for f in /proc/[0-9]*/cmdline; do
    pid="${f#/proc/}"; pid="${pid%/cmdline}"
    # A process may end between the glob and the read: that is not an error.
    if { tr '\0' ' ' <"$f"; } 2>/dev/null | grep -qF -- "$dir"; then pids+=("$pid"); fi
  done
  if [ ${#pids[@]} -gt 0 ]; then
    echo "  stopping ${#pids[@]} control-plane process(es) a fuzzing worker left behind"
    kill "${pids[@]}" 2>/dev/null || true
    sleep 2
    kill -9 "${pids[@]}" 2>/dev/null || true
  fi
}

# bare_deadline is true when the log's only failure is the engine's "context deadline
# exceeded" (golang/go#51484): no crasher, no panic, no other failure line.
bare_deadline() {
  local log="$1"
  grep -qE '^[[:space:]]+context deadline exceeded$' "$log" || return 1
  ! grep -vE '^(fuzz: |warning: starting with empty corpus$|--- FAIL: Fuzz[A-Za-z0-9_]+ \([0-9.]+s\)$|[[:space:]]+context deadline exceeded$|FAIL$|exit status 1$|FAIL[[:space:]]+[^[:space:]]+[[:space:]]+[0-9.]+s$)' "$log" | grep -q .
}

for dir in $(go list -f '{{.Dir}}' ./...); do
  pkg="./${dir#"$PWD"/}"
  for target in $(cat "$dir"/*_test.go 2>/dev/null | sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/p'); do
    if ! [[ "$target" =~ $only ]] || [[ "$target" =~ $skip ]]; then continue; fi
    log="$logdir/$target.log"
    args=(-run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME")
    envtest=false
    if [[ " $ENVTEST_TARGETS " == *" $target "* ]]; then
      envtest=true
      if [ -z "$assets" ]; then assets="$(hack/setup-envtest.sh)"; fi
      args+=(-parallel=1 -fuzzminimizetime=20x)
      tmp="$(mktemp -d "${TMPDIR:-/tmp}/fuzz-$target.XXXXXX")"
    fi
    start=$SECONDS
    rc=0
    if $envtest; then
      TMPDIR="$tmp" KUBEBUILDER_ASSETS="$assets" go test "${args[@]}" "$pkg" >"$log" 2>&1 || rc=$?
      stop_leftovers "$tmp"
      rm -rf "$tmp"
    else
      go test "${args[@]}" "$pkg" >"$log" 2>&1 || rc=$?
    fi
    took=$((SECONDS - start))
    execs="$(grep -oE 'execs: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)"
    interesting="$(grep -oE 'new interesting: [0-9]+' "$log" | tail -1 | cut -d' ' -f3 || true)"
    summary="$pkg $target: ${took}s, ${execs:-0} execs, ${interesting:-0} new interesting"
    if [ "$rc" -eq 0 ]; then
      echo "ok    $summary"
      passed=$((passed + 1))
    elif ! grep -q 'Failing input written to' "$log" && bare_deadline "$log"; then
      echo "flake $summary: only \"context deadline exceeded\" at the end of -fuzztime (golang/go#51484), nothing found"
      flaked=$((flaked + 1))
    else
      echo "FAIL  $summary"
      sed 's/^/    /' "$log"
      failed=$((failed + 1))
    fi
  done
done

echo "fuzz: $passed passed, $flaked engine flake(s), $failed failed, ${FUZZTIME} each; logs in $logdir"
[ "$failed" -eq 0 ]
