# The usage-billing platforms variant of `make demo`, sourced by hack/demo.sh when
# DEMO_BILLING names a platform (Lago, Metronome, OpenMeter, a comma-separated list,
# or "platforms" for every one whose fake is in this checkout).
#
# It uses the demo's control plane, manager and helpers (start_bg, step, note, send,
# payload, k) and replaces its scripted tour: for each platform it starts the
# platform's fake as a real process (test/fake<name>/cmd: its URL on stdout's first
# line, GET /_admin/effects for its books), and in a namespace of its own
# (demo-<name>) creates the platform's BillingProvider (the credential's Secret opted
# in to the fake's URL), the sample WebhookProvider routed to it, and sends signed
# webhooks: two jobs, one of them delivered twice under the same ID (a duplicate) and
# once more under a new ID (a redelivery). It waits until every job is Applied and
# every settlement Settled, prints the settlements and the platform's books, and
# checks that each settlement key was billed exactly once there (hack/demo
# platform-report). The variant runs without the archive.
#
# A platform is described by three functions, platform_<Type>_{start,provider,key}:
# adding one means adding its three functions and its name to platforms_known.

# platforms_known: the BillingProvider types the variant knows, in the order it runs them.
platforms_known=(Lago Metronome OpenMeter)

# platforms_select VALUE sets $platforms (a space-separated list) from DEMO_BILLING,
# or dies saying what it accepts. "platforms" is every known type whose fake exists.
platforms_select() {
  local v=$1 p q ok chosen=()
  if [ "$v" = platforms ]; then
    for p in "${platforms_known[@]}"; do
      [ -d "test/fake${p,,}/cmd" ] && chosen+=("$p")
    done
    [ "${#chosen[@]}" -gt 0 ] || die "DEMO_BILLING=platforms: no platform fake (test/fake<name>/cmd) in this checkout"
  else
    IFS=, read -r -a v <<<"$v"
    for q in "${v[@]}"; do
      q=${q// /}
      ok=
      for p in "${platforms_known[@]}"; do
        if [ "${q,,}" = "${p,,}" ]; then ok=$p; fi
      done
      [ -n "$ok" ] || die "DEMO_BILLING=$DEMO_BILLING: unknown platform \"$q\"; the variant knows ${platforms_known[*]} (or \"platforms\" for all; unset DEMO_BILLING for the generic HTTP provider)"
      [ -d "test/fake${ok,,}/cmd" ] || die "DEMO_BILLING=$DEMO_BILLING: $ok's fake (test/fake${ok,,}/cmd) is not in this checkout"
      [[ " ${chosen[*]} " == *" $ok "* ]] || chosen+=("$ok")
    done
  fi
  platforms="${chosen[*]}"
}

# platforms_build builds each chosen platform's fake into $bin/fake<name>.
platforms_build() {
  local p
  for p in $platforms; do
    go build -o "$bin/fake${p,,}" "./test/fake${p,,}/cmd"
  done
  note "and the platform fakes: $(for p in $platforms; do printf 'fake%s ' "${p,,}"; done)"
}

# platforms_stop stops the fakes (cleanup calls it).
platforms_stop() {
  local p pid
  for p in ${platforms:-}; do
    pid=$(eval "echo \${pid_fake_${p,,}:-}")
    [ -z "$pid" ] || stop_group "$pid" 10
  done
}

# --- Lago (test/fakelago; README "Billing through Lago") -----------------------------
# The credential is the organization's API key; the settlement's usage meter maps to
# the fake organization's billable metric llm_tokens, which sums the property tokens.
platform_Lago_start() { # port
  start_bg fake_lago "$logs/fake-lago.log" "$bin/fakelago" -addr "127.0.0.1:$1" -api-key-file "$state/lago-credential"
}
platform_Lago_provider() { # name endpoint secret
  cat <<EOF
apiVersion: hooks.settlement.dev/v1alpha1
kind: BillingProvider
metadata:
  name: $1
spec:
  type: Lago
  endpoint: $2
  allowInsecureHTTP: true # the fake listens on loopback without TLS
  credentialsSecretRef: {name: $3, key: key}
  requestTimeout: 2s
  retry: {maxAttempts: 20, maxElapsed: 10m, initialBackoff: 500ms, maxBackoff: 4s}
  lago:
    metrics:
    - {meter: inference-tokens, code: llm_tokens, fieldName: tokens}
EOF
}
platform_Lago_key() { echo key; } # the Secret's key holding the credential

# --- Metronome (test/fakemetronome; README "Billing through Metronome") -------------
# The credential is an API bearer token; the usage meter is sent as events of type
# inference_tokens, the quantity in the property tokens.
platform_Metronome_start() { # port
  start_bg fake_metronome "$logs/fake-metronome.log" "$bin/fakemetronome" -addr "127.0.0.1:$1" -token-file "$state/metronome-credential"
}
platform_Metronome_provider() { # name endpoint secret
  cat <<YAML
apiVersion: hooks.settlement.dev/v1alpha1
kind: BillingProvider
metadata:
  name: $1
spec:
  type: Metronome
  endpoint: $2
  allowInsecureHTTP: true # the fake listens on loopback without TLS
  credentialsSecretRef: {name: $3, key: token}
  idempotencyWindow: 816h # Metronome ignores a reused transaction_id for 34 days
  requestTimeout: 2s
  retry: {maxAttempts: 20, maxElapsed: 10m, initialBackoff: 500ms, maxBackoff: 4s}
  metronome:
    meters:
    - {meter: inference-tokens, eventType: inference_tokens, quantityProperty: tokens}
YAML
}
platform_Metronome_key() { echo token; }

# --- OpenMeter (test/fakeopenmeter; README "Billing through OpenMeter") ------------
# The credential is an API token. The fake runs as a self-hosted OpenMeter does by
# default, without deduplication, and the BillingProvider says so (no
# spec.openMeter.deduplication): a second event under a key would count as usage
# again, so the books show that the operator sent each charge once.
platform_OpenMeter_start() { # port
  start_bg fake_openmeter "$logs/fake-openmeter.log" "$bin/fakeopenmeter" -addr "127.0.0.1:$1" -token-file "$state/openmeter-credential"
}
platform_OpenMeter_provider() { # name endpoint secret
  cat <<YAML
apiVersion: hooks.settlement.dev/v1alpha1
kind: BillingProvider
metadata:
  name: $1
spec:
  type: OpenMeter
  endpoint: $2
  allowInsecureHTTP: true # the fake listens on loopback without TLS
  credentialsSecretRef: {name: $3, key: token}
  requestTimeout: 2s
  retry: {maxAttempts: 20, maxElapsed: 10m, initialBackoff: 500ms, maxBackoff: 4s}
  openMeter:
    meters:
    - {meter: inference-tokens, eventType: prompt.tokens, valueProperty: tokens}
YAML
}
platform_OpenMeter_key() { echo token; }

# platforms_main runs the variant after the manager is ready, and never returns: it
# exits after the checks with DEMO_EXIT=1, else keeps everything running.
platforms_main() {
  local p lp ns port url bp secret wh n=1 fakes_ok
  declare -A urls=()
  for p in $platforms; do
    lp=${p,,}
    ns=demo-$lp
    pick_port port "$(platform_port "$p")"
    step "$n. $p: starting its fake (test/fake$lp) on 127.0.0.1:$port"
    n=$((n + 1))
    umask 077
    printf '%s_%s' "$lp" "$(head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')" >"$state/$lp-credential"
    umask 022
    : >"$logs/fake-$lp.log"
    "platform_${p}_start" "$port"
    url=
    for _ in $(seq 1 300); do
      url=$(head -n 1 "$logs/fake-$lp.log" 2>/dev/null || true)
      [[ $url == http://* ]] && break
      url=
      kill -0 "$(eval "echo \$pid_fake_$lp")" 2>/dev/null || break
      sleep 0.1
    done
    [ -n "$url" ] || die "$p's fake did not start; see $logs/fake-$lp.log"
    "$bin/demo" wait-http -url "$url/_admin/effects" -timeout 30s || die "$p's fake does not answer; see $logs/fake-$lp.log"
    urls[$p]=$url
    note "$url (its first line on stdout)   books $url/_admin/effects   log $logs/fake-$lp.log"

    bp=$lp secret=$lp-credential
    step "$n. $p: namespace $ns, a BillingProvider of type $p pointed at the fake, the sample WebhookProvider routed to it"
    n=$((n + 1))
    k create namespace "$ns" | sed 's/^/    /'
    k create secret generic inference-webhook-secret -n "$ns" --from-file=key="$state/webhook-secret" | sed 's/^/    /'
    k create secret generic "$secret" -n "$ns" --from-file="$(platform_"${p}"_key)=$state/$lp-credential" | sed 's/^/    /'
    # The operator sends a credential only where its Secret says it may go
    # (docs/decisions.md "Credentials"): the use as a label, the endpoint as an annotation.
    k label secret "$secret" -n "$ns" hooks.settlement.dev/credential-for=billing | sed 's/^/    /'
    k annotate secret "$secret" -n "$ns" hooks.settlement.dev/credential-destinations="$url" | sed 's/^/    /'
    "platform_${p}_provider" "$bp" "$url" "$secret" | k apply --server-side -n "$ns" -f - | sed 's/^/    /'
    wh=$(sed "s/billingProviderRef: billing\$/billingProviderRef: $bp/" config/samples/hooks_v1alpha1_webhookprovider.yaml)
    grep -q "billingProviderRef: $bp\$" <<<"$wh" ||
      die "config/samples/hooks_v1alpha1_webhookprovider.yaml no longer has \"billingProviderRef: billing\" to route to $p"
    k apply --server-side -n "$ns" -f - <<<"$wh" | sed 's/^/    /'
    k wait --for=condition=Ready -n "$ns" webhookprovider/inference --timeout=60s >/dev/null
    k get whp,bp -n "$ns" | sed 's/^/    /'

    receiver_url=http://127.0.0.1:$receiver_port/webhooks/$ns/inference
    step "$n. $p: signed webhooks to $receiver_url: a job, its duplicate delivery, its redelivery, another job"
    n=$((n + 1))
    send 200 "msg_$lp-1_v1" "job-$lp-1" 1 succeeded 1523 cus_acme
    send 200 "msg_$lp-1_v1" "job-$lp-1" 1 succeeded 1523 cus_acme # the same delivery again
    send 200 "msg_$lp-1_v1_redelivered" "job-$lp-1" 1 succeeded 1523 cus_acme # the same job under a new ID
    send 200 "msg_$lp-2_v1" "job-$lp-2" 1 succeeded 880 cus_globex
  done

  for p in $platforms; do
    lp=${p,,}
    ns=demo-$lp
    step "$n. $p: waiting until every job is Applied and every settlement Settled (namespace $ns)"
    n=$((n + 1))
    "$bin/demo" settle -kubeconfig "$kubeconfig" -namespace "$ns" -timeout 90s | sed 's/^/    /' ||
      failures=$((failures + 1))
    k get bs -n "$ns" | sed 's/^/    /'
    step "$n. $p: the settlements and $p's books (GET ${urls[$p]}/_admin/effects)"
    n=$((n + 1))
    "$bin/demo" platform-report -kubeconfig "$kubeconfig" -namespace "$ns" -platform "$p" \
      -effects-url "${urls[$p]}/_admin/effects" -expect-settlements 2 | sed 's/^/    /' ||
      failures=$((failures + 1))
  done

  if [ "$failures" -eq 0 ]; then
    printf '\n%sdemo (%s): every check passed in %ds.%s\n' "$bold" "${platforms// /, }" $((SECONDS - t0)) "$plain"
  else
    printf '\n%sdemo (%s): %d check(s) failed; logs are in %s%s\n' "$bold" "${platforms// /, }" "$failures" "$logs" "$plain"
  fi
  cat >"$state/env" <<EOF
export KUBECONFIG=$kubeconfig
export PATH="$bin:\$PATH"
EOF
  if [ "${DEMO_EXIT:-}" = 1 ]; then
    [ "$failures" -eq 0 ] || exit 1
    exit 0
  fi

  p=${platforms%% *}
  lp=${p,,}
  cat <<EOF

The operator keeps running. In another terminal:

  source $state/env      # KUBECONFIG and PATH (kubectl, send-webhook)
  kubectl get jc,bs -A

Send another job through $p:

  send-webhook -url http://127.0.0.1:$receiver_port/webhooks/demo-$lp/inference \\
    -secret-file $state/webhook-secret -id msg_$lp-9_v1 \\
    -data '$(payload "job-$lp-9" 1 succeeded 1000 cus_acme)'

Read the platforms' books:

EOF
  for p in $platforms; do printf '  curl -s %s/_admin/effects   # %s\n' "${urls[$p]}" "$p"; done
  cat <<EOF

Logs:    $logs/{manager,$(for p in $platforms; do printf 'fake-%s,' "${p,,}"; done)control-plane}.log
Stop:    Ctrl-C here (stops everything the demo started; DEMO_EXIT=1 exits by itself)
EOF
  [ -t 0 ] || echo "(no terminal on stdin: this keeps running until it gets SIGINT/SIGTERM; set DEMO_EXIT=1 to exit after the checks)"
  while kill -0 "$pid_manager" 2>/dev/null && kill -0 "$pid_controlplane" 2>/dev/null && platforms_alive; do
    sleep 1 &
    sleeper=$!
    wait "$sleeper" || true
    sleeper=
  done
  die "a demo process exited on its own; see the logs in $logs"
}

platforms_alive() {
  local p
  for p in $platforms; do
    kill -0 "$(eval "echo \${pid_fake_${p,,}:-0}")" 2>/dev/null || return 1
  done
}

# platform_port TYPE: the port each fake prefers (the next free one if taken).
platform_port() {
  case $1 in
    Lago) echo 8093 ;;
    Metronome) echo 8094 ;;
    OpenMeter) echo 8095 ;;
    *) echo 8096 ;;
  esac
}
