# settlement-operator Makefile, in the kubebuilder go/v4 tradition.

# The release: the chart's appVersion (charts/settlement-operator/Chart.yaml), the one
# place it is written; the image is tagged with it, never latest.
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/settlement-operator/Chart.yaml)
IMG ?= settlement-operator:$(VERSION)

# Tool versions are pinned here; binaries are installed into ./bin on first use.
CONTROLLER_TOOLS_VERSION ?= v0.23.0
# kustomize v5.8.3 needs Go 1.27; v5.8.2 is the newest that builds with Go 1.26.
KUSTOMIZE_VERSION ?= v5.8.2

LOCALBIN ?= $(shell pwd)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
KUSTOMIZE ?= $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)

# The control plane for tests (kube-apiserver, etcd, kubectl) matching k8s.io/api in
# go.mod. hack/setup-envtest.sh finds it in setup-envtest's store, or builds it from
# source the first time (several minutes), and prints its directory.
ENVTEST_ASSETS = $(shell hack/setup-envtest.sh)

# kubectl for install/deploy: the one on PATH, else the control plane's.
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo "$$(hack/setup-envtest.sh)/kubectl")

GO_TEST_FLAGS ?=
# How long `make fuzz` runs each fuzz target, and `make fuzz-smoke` (part of `make test`).
FUZZTIME ?= 1m
FUZZ_SMOKE_TIME ?= 3s
# Extra flags for `make bench`, e.g. BENCH_FLAGS="-retained 1000,10000 -budget 10m"
# (all flags: go run ./test/bench/cmd -h).
BENCH_FLAGS ?=

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

.DEFAULT_GOAL := help

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate CRDs and the manager's ClusterRole from the markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases
	@# Join the hard-wrapped doc comments into paragraphs for `kubectl explain`.
	go run ./hack/reflow-crds config/crd/bases/*.yaml
	@# Copy the CRDs, manager ClusterRole, record-protection policy and alerting rules into the Helm chart.
	go run ./hack/chart-sync

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: envtest
envtest: ## Obtain the test control plane (built from source on first use) and print its directory.
	@hack/setup-envtest.sh

.PHONY: demo
demo: ## Run the operator's whole job on a local control plane (no cluster needed); DEMO_EXIT=1 exits after the checks; DEMO_BILLING=Lago|Metronome|OpenMeter|platforms bills through usage-billing platforms' fakes.
	@hack/demo.sh

.PHONY: test
test: manifests generate fmt vet kustomize ## Generate, vet, then run unit tests, fuzz smoke tests and the envtest suites against a real API server.
	@assets="$$(hack/setup-envtest.sh)"; \
	echo "control plane: $$assets"; \
	KUBEBUILDER_ASSETS="$$assets" KUSTOMIZE="$(KUSTOMIZE)" go test -timeout 30m $(GO_TEST_FLAGS) ./...
	@$(MAKE) --no-print-directory fuzz-smoke

# Length of the e2e soak; CI runs a short one, `E2E_SOAK=5m make test-e2e` the full one.
E2E_SOAK ?= 45s

.PHONY: test-e2e
test-e2e: manifests generate ## Run the operator as real processes (2 replicas, leader election) through the failure matrix, kill -9, API server restarts and a soak.
	@assets="$$(hack/setup-envtest.sh)"; \
	KUBEBUILDER_ASSETS="$$assets" E2E_SOAK=$(E2E_SOAK) go test -v -tags e2e -count=1 -timeout 30m ./test/e2e/ -ginkgo.v

.PHONY: fuzz
fuzz: ## Fuzz every target for FUZZTIME each (default 1m, ~9 min in all), FuzzReceiver on a real API server; not part of `make test`.
	@FUZZTIME=$(FUZZTIME) hack/fuzz.sh

.PHONY: fuzz-smoke
fuzz-smoke: ## Fuzz every target but FuzzReceiver for FUZZ_SMOKE_TIME (3s); `go test` runs FuzzReceiver's seeds.
	@FUZZTIME=$(FUZZ_SMOKE_TIME) hack/fuzz.sh --skip '^FuzzReceiver$$'

.PHONY: bench
bench: ## Benchmark ingestion, request-to-Settled latency, cost per event and manager memory on a local control plane; prints a table, writes bench/results.json.
	@assets="$$(hack/setup-envtest.sh)"; \
	KUBEBUILDER_ASSETS="$$assets" go run ./test/bench/cmd -out bench/results.json $(BENCH_FLAGS)

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the manager binary into bin/.
	go build -o bin/manager ./cmd

.PHONY: run
run: manifests generate fmt vet ## Run the manager against the cluster in your kubeconfig.
	go run ./cmd

.PHONY: docker-build
docker-build: ## Build the manager image (needs a Docker engine).
	docker build -t $(IMG) .

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the cluster in your kubeconfig (server-side apply, as in production).
	$(KUBECTL) apply --server-side -f config/crd/bases

.PHONY: uninstall
uninstall: manifests ## Remove the CRDs (and every object of their kinds!) from the cluster.
	$(KUBECTL) delete --ignore-not-found -f config/crd/bases

.PHONY: deploy
deploy: manifests kustomize ## Deploy the operator to the cluster in your kubeconfig.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: kustomize ## Remove the operator from the cluster; the CRDs and every record stay (`make uninstall` removes those).
	$(KUSTOMIZE) build config/operator | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: build-installer
build-installer: manifests generate kustomize ## Write one dist/install.yaml with CRDs, RBAC and the Deployment.
	mkdir -p dist
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default > dist/install.yaml

##@ Dependencies

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Install controller-gen into bin/.
$(CONTROLLER_GEN):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) GOFLAGS= go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $(CONTROLLER_GEN)

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Install kustomize into bin/.
$(KUSTOMIZE):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) GOFLAGS= go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(LOCALBIN)/kustomize $(KUSTOMIZE)
