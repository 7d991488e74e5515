package deploy_test

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/sharding"
	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fixtures"
	"github.com/settlement-operator/settlement-operator/test/sender"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// operatorNamespace and managerUser are what the README and docs tell platform teams;
// the suite checks the installer really produces them.
const (
	operatorNamespace = "settlement-operator-system"
	managerUser       = "system:serviceaccount:settlement-operator-system:settlement-operator-controller-manager"
	leaseName         = "settlement-operator.hooks.settlement.dev"
)

var _ = Describe("the installer (make build-installer: dist/install.yaml)", Ordered, func() {
	It("holds the CRDs, least-privilege RBAC, a hardened two-replica Deployment, its Services and a PDB", func() {
		kinds := map[string]int{}
		for _, o := range objects {
			kinds[o.GetKind()]++
			switch o.GetKind() {
			case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			default:
				Expect(o.GetNamespace()).To(Equal(operatorNamespace), objectKey(o))
			}
		}
		crdFiles, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(kinds).To(SatisfyAll(
			HaveKeyWithValue("Namespace", 1), HaveKeyWithValue("CustomResourceDefinition", len(crdFiles)),
			HaveKeyWithValue("ServiceAccount", 1), HaveKeyWithValue("Deployment", 1),
			HaveKeyWithValue("Service", 2), HaveKeyWithValue("PodDisruptionBudget", 1),
			HaveKeyWithValue("ValidatingAdmissionPolicy", 1), HaveKeyWithValue("ValidatingAdmissionPolicyBinding", 1)))
		Expect(objects[0].GetKind()).To(Equal("Namespace"), "the namespace comes first, so one apply creates everything")
		// config/operator is the same minus the CRDs (for GitOps setups that apply CRDs first).
		var withoutCRDs, operator []string
		for _, o := range objects {
			if o.GetKind() != "CustomResourceDefinition" {
				withoutCRDs = append(withoutCRDs, objectKey(o))
			}
		}
		for _, o := range decodeAll(run(kustomize, "build", filepath.Join(testenv.RepoRoot(), "config", "operator"))) {
			operator = append(operator, objectKey(o))
		}
		Expect(operator).To(ConsistOf(withoutCRDs))
		Expect(objects[0].GetLabels()).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))

		dep := deployment()
		Expect(*dep.Spec.Replicas).To(Equal(int32(2)))
		Expect(dep.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue()).To(Equal(0), "both receivers stay up during a rollout")
		pod := dep.Spec.Template.Spec
		Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Args).To(ContainElements("--leader-elect", "--receiver-bind-address=:8090"))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--metrics-secure")), "metrics are authenticated by default")
		Expect(c.Ports).To(ContainElement(SatisfyAll(
			HaveField("Name", "receiver"), HaveField("ContainerPort", int32(8090)))))
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			Expect(c.Resources.Requests).To(HaveKey(r))
			Expect(c.Resources.Limits).To(HaveKey(r))
		}

		podLabels := labels.Set(dep.Spec.Template.Labels)
		ports := map[string]bool{}
		for _, p := range c.Ports {
			ports[p.Name] = true
		}
		for _, name := range []string{"settlement-operator-webhook-receiver", "settlement-operator-controller-manager-metrics-service"} {
			svc := decode[corev1.Service](find("Service", name))
			Expect(labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels)).To(BeTrue(), name+" selects the manager Pods")
			Expect(ports).To(HaveKey(svc.Spec.Ports[0].TargetPort.StrVal), name+" targets a named container port")
		}
		pdb := decode[policyv1.PodDisruptionBudget](find("PodDisruptionBudget", "settlement-operator-controller-manager"))
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		Expect(err).NotTo(HaveOccurred())
		Expect(sel.Matches(podLabels)).To(BeTrue())

		// The record-protection policy knows the manager by the binding's parameter, the
		// Deployment's ServiceAccount, also when an overlay renames everything.
		Expect(recordProtectionParam(objects)).To(Equal(dep.Namespace + "/" + pod.ServiceAccountName))
		overlay := must(os.MkdirTemp(testenv.RepoRoot(), ".overlay-"))
		DeferCleanup(os.RemoveAll, overlay)
		Expect(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(
			"namespace: billing-ops\nnamePrefix: acme-\nresources:\n- ../config/default\n"), 0o600)).To(Succeed())
		renamed := decodeAll(run(kustomize, "build", overlay))
		var renamedSA string
		for _, o := range renamed {
			if o.GetKind() == "Deployment" {
				d := decode[appsv1.Deployment](o)
				renamedSA = d.Namespace + "/" + d.Spec.Template.Spec.ServiceAccountName
			}
		}
		Expect(renamedSA).To(Equal("billing-ops/acme-settlement-operator-controller-manager"))
		Expect(recordProtectionParam(renamed)).To(Equal(renamedSA))

		// Least privilege: no wildcards anywhere, and Secrets are only ever read by name.
		for _, o := range objects {
			var rules []rbacv1.PolicyRule
			switch o.GetKind() {
			case "ClusterRole":
				rules = decode[rbacv1.ClusterRole](o).Rules
			case "Role":
				rules = decode[rbacv1.Role](o).Rules
			}
			for _, r := range rules {
				Expect(slices.Concat(r.Verbs, r.Resources, r.APIGroups)).NotTo(ContainElement("*"), objectKey(o))
				if slices.Contains(r.Resources, "secrets") {
					Expect(r.Verbs).To(Equal([]string{"get"}), objectKey(o)+": Secrets are read by name, never listed or watched")
				}
			}
		}
	})

	It("applies with kubectl apply --server-side, and applying it again changes nothing", func() {
		out := kubectl(adminKC, "apply", "--server-side", "-f", install)
		Expect(strings.Count(out, " serverside-applied")).To(Equal(len(objects)), out)
		kubectl(adminKC, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
		before := stableResourceVersions()
		Expect(before).To(HaveLen(len(objects)))

		kubectl(adminKC, "apply", "--server-side", "-f", install)
		Expect(resourceVersions()).To(Equal(before), "a second apply must not write anything")
		diff, stderr, err := kubectlE(adminKC, "diff", "--server-side", "-f", install)
		Expect(err).NotTo(HaveOccurred(), "kubectl diff exits 0 only when there is no difference:\n%s%s", diff, stderr)
		Expect(diff).To(BeEmpty())
	})

	It("upgrades in place: applying a new image changes the Deployment and nothing else", func() {
		before := stableResourceVersions()
		rendered, err := os.ReadFile(install)
		Expect(err).NotTo(HaveOccurred())
		upgraded := strings.Replace(string(rendered), "image: settlement-operator:v0.1.0",
			"image: registry.example.com/settlement-operator:v0.2.0", 1)
		Expect(upgraded).NotTo(Equal(string(rendered)), "the installer names the image settlement-operator:v0.1.0")
		path := filepath.Join(workDir, "install-v0.2.0.yaml")
		Expect(os.WriteFile(path, []byte(upgraded), 0o600)).To(Succeed())
		kubectl(adminKC, "apply", "--server-side", "-f", path)
		var changed []string
		for k, rv := range resourceVersions() {
			if before[k] != rv {
				changed = append(changed, k)
			}
		}
		Expect(changed).To(ConsistOf("Deployment/" + operatorNamespace + "/settlement-operator-controller-manager"))
	})

	It("owns the CRDs by server-side apply; client-side apply would fit too, with room to spare", func() {
		var crds apiextensionsv1.CustomResourceDefinitionList
		Expect(k8s.List(ctx, &crds)).To(Succeed())
		Expect(crds.Items).NotTo(BeEmpty())
		for _, crd := range crds.Items {
			Expect(crd.Annotations).NotTo(HaveKey(corev1.LastAppliedConfigAnnotation),
				"server-side apply keeps no last-applied copy of the object")
			Expect(crd.ManagedFields).To(ContainElement(SatisfyAll(
				HaveField("Manager", "kubectl"), HaveField("Operation", metav1.ManagedFieldsOperationApply))))
		}
		// Client-side apply would copy each CRD into the last-applied-configuration
		// annotation, and all annotations of an object share a 256 KiB limit. Ours are far
		// below it; this fails once one reaches half, so the README is revisited in time.
		files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		for _, f := range files {
			b, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			objs := decodeAll(string(b))
			Expect(objs).To(HaveLen(1))
			j, err := json.Marshal(objs[0].Object)
			Expect(err).NotTo(HaveOccurred())
			Expect(len(j)).To(BeNumerically("<", 128<<10), "%s as JSON", filepath.Base(f))
		}
		out := kubectl(adminKC, "apply", "--dry-run=server", "-f", filepath.Join(testenv.RepoRoot(), "config", "crd", "bases"))
		Expect(out).To(ContainSubstring("(server dry run)"))
	})

	It("runs the manager as the Deployment's ServiceAccount: every replica receives, the leader settles exactly once", func() {
		dep := deployment()
		Expect("system:serviceaccount:" + dep.Namespace + ":" + dep.Spec.Template.Spec.ServiceAccountName).To(Equal(managerUser))
		saKC := filepath.Join(workDir, "manager.kubeconfig")
		Expect(testenv.WriteKubeconfig(saKC, cfg, "as-manager", managerUser)).To(Succeed())
		// The kubeconfig is the ServiceAccount and has nothing but its RBAC.
		Expect(kubectl(saKC, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")).To(Equal(managerUser))
		Expect(kubectl(saKC, "auth", "can-i", "get", "secrets", "-n", "tenant")).To(Equal("yes\n"))
		out, _, err := kubectlE(saKC, "auth", "can-i", "list", "secrets", "-A")
		Expect(err).To(HaveOccurred())
		Expect(out).To(Equal("no\n"))
		// Leases: only the namespace claims by name (docs/design.md §16), and create.
		Expect(kubectl(saKC, "auth", "can-i", "update", "leases/settlement-operator-shard", "-n", "tenant")).To(Equal("yes\n"))
		out, _, err = kubectlE(saKC, "auth", "can-i", "update", "leases/kube-scheduler", "-n", "kube-system")
		Expect(err).To(HaveOccurred())
		Expect(out).To(Equal("no\n"))

		billing, err := fakebilling.Start(fakebilling.Options{Token: "deploy-suite-token"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(billing.Close)
		const ns, whsec = "tenant", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-webhook-secret"},
			StringData: map[string]string{"key": whsec}})).To(Succeed())
		// The billing token opts in to being sent to this endpoint, as the README shows.
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-api-token",
			Labels:      map[string]string{hooksv1alpha1.LabelCredentialFor: hooksv1alpha1.CredentialForBilling},
			Annotations: map[string]string{hooksv1alpha1.AnnotationCredentialDestinations: billing.URL()}},
			StringData: map[string]string{"token": "deploy-suite-token"}})).To(Succeed())
		Expect(k8s.Create(ctx, &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing"},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: billing.URL(), AllowInsecureHTTP: true,
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "billing-api-token", Key: "token"},
				RequestTimeout:       &metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		// The README's Standard Webhooks sample, as a user would apply it.
		kubectl(adminKC, "apply", "--server-side", "-n", ns, "-f",
			filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_webhookprovider.yaml"))

		replicas := []*replica{startReplica(dep, saKC), startReplica(dep, saKC)}
		DeferCleanup(func() {
			for _, r := range replicas {
				r.session.Kill()
			}
		})
		Eventually(func() metav1.ConditionStatus {
			var wp hooksv1alpha1.WebhookProvider
			if k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inference"}, &wp) != nil {
				return ""
			}
			for _, c := range wp.Status.Conditions {
				if c.Type == hooksv1alpha1.ConditionReady {
					return c.Status
				}
			}
			return ""
		}).Should(Equal(metav1.ConditionTrue), "the leader's controllers run with the shipped RBAC")

		send := func(r *replica, id, job string, tokens int) sender.Response {
			GinkgoHelper()
			body := fmt.Sprintf(`{"type":"job.completed","data":{"job_id":%q,"version":1,"state":"succeeded",`+
				`"completed_at":"2026-11-30T12:00:00Z","customer":"cus_deploy","usage":{"tokens":%d}}}`, job, tokens)
			resp, err := sender.Send(ctx, nil, sender.Delivery{
				URL: "http://" + r.receiver + identity.EndpointPath(ns, "inference"), ID: id, Body: []byte(body),
				Signature: signature.Config{Scheme: signature.SchemeStandardWebhooks}, Secret: []byte(whsec),
			})
			Expect(err).NotTo(HaveOccurred())
			return resp
		}
		// Each replica receives, whichever holds the Lease.
		for i, r := range replicas {
			Eventually(func() int { return send(r, fmt.Sprintf("msg_%d", i), fmt.Sprintf("job-%d", i), 100+i).Status }).
				Should(Equal(http.StatusOK))
		}
		dup := send(replicas[1], "msg_0", "job-0", 100)
		Expect(dup.Status).To(Equal(http.StatusOK))
		Expect(dup.Body).To(ContainSubstring(`"duplicate"`))
		Expect(send(replicas[0], "msg_1", "job-1", 999).Status).To(Equal(http.StatusConflict))

		for i := range replicas {
			key := identity.JobSettlementKey(ns, "inference", fmt.Sprintf("job-%d", i))
			Eventually(func() hooksv1alpha1.SettlementState {
				var bs hooksv1alpha1.BillingSettlement
				if k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.SettlementNameFor("inference", key)}, &bs) != nil {
					return ""
				}
				return bs.Status.State
			}).Should(Equal(hooksv1alpha1.SettlementSettled))
			Eventually(func() hooksv1alpha1.EventPhase {
				var ev hooksv1alpha1.WebhookEvent
				if k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: identity.EventName(ns, "inference", fmt.Sprintf("msg_%d", i))}, &ev) != nil {
					return ""
				}
				return ev.Status.Phase
			}).Should(Equal(hooksv1alpha1.EventComplete))
			Expect(billing.Charges(key)).To(Equal(1))
		}
		// The leader's reconciliation pass writes its report as the manager: the
		// record-protection policy leaves reports to it alone (created, then its status).
		Eventually(func() hooksv1alpha1.ReportPhase {
			var l hooksv1alpha1.ReconciliationReportList
			Expect(k8s.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{hooksv1alpha1.LabelBillingProvider: "billing"})).To(Succeed())
			for _, rr := range l.Items {
				if rr.Status.Phase != "" {
					return rr.Status.Phase
				}
			}
			return ""
		}).Should(Equal(hooksv1alpha1.ReportCompleted))
		// The receiver recorded the conflicting reuse as a Warning event (events.k8s.io).
		Eventually(func() []string {
			var evs eventsv1.EventList
			Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range evs.Items {
				reasons = append(reasons, e.Reason)
			}
			return reasons
		}).Should(ContainElement(hooksv1alpha1.ReasonConflictingEventReuse))

		var lease coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: leaseName}, &lease)).To(Succeed())
		Expect(lease.Spec.HolderIdentity).To(HaveValue(Not(BeEmpty())))
		// Serving all namespaces, the deployment claims them with one Lease in its own.
		var claim coordinationv1.Lease
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: sharding.LeaseName}, &claim)).To(Succeed())
		Expect(claim.Spec.HolderIdentity).To(HaveValue(Equal(operatorNamespace + "/" + leaseName)))
		Expect(claim.Annotations).To(HaveKeyWithValue(sharding.AnnotationScope, sharding.ScopeAllNamespaces))

		// Metrics are served over HTTPS to an authenticated, authorized client only: no
		// token is 401, a ServiceAccount without the metrics-reader role 403, with it 200.
		reader, nosy := metricsToken("prometheus", true), metricsToken("nosy", false)
		for _, r := range replicas {
			Expect(scrape(r.metrics, "").status).To(Equal(http.StatusUnauthorized))
			// controller-runtime's filter answers a token the API server rejects with 500
			// ("Authentication failed"), not 401: refused all the same (docs/decisions.md).
			Expect(scrape(r.metrics, "not-a-token").status).To(Equal(http.StatusInternalServerError))
			Expect(scrape(r.metrics, nosy).status).To(Equal(http.StatusForbidden))
			Expect(scrape(r.metrics, reader).status).To(Equal(http.StatusOK))
			// Plain HTTP gets Go's TLS server's 400 "client sent an HTTP request to an HTTPS server".
			resp, err := http.Get("http://" + r.metrics + "/metrics")
			Expect(err).NotTo(HaveOccurred())
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
			Expect(string(must(io.ReadAll(resp.Body)))).To(ContainSubstring("HTTPS server"))
			Expect(resp.Body.Close()).To(Succeed())
		}
		// Every metric this scenario exercises is exposed (the leader has the controllers').
		// settlement_dead_letters_total is not: it has namespace and billing_provider
		// labels now, and a series appears with the first dead letter.
		var exposed strings.Builder
		for _, r := range replicas {
			exposed.WriteString(scrape(r.metrics, reader).body)
		}
		for _, m := range []string{"settlement_receiver_requests_total", "settlement_receiver_request_duration_seconds",
			"settlement_receiver_in_flight_requests", "settlement_receiver_signature_key_matches_total",
			"settlement_provider_calls_total", "settlement_transitions_total",
			"settlement_receipt_to_settled_seconds", "settlement_job_completion_transitions_total", "settlement_objects",
			"settlement_billing_call_duration_seconds", "settlement_oldest_unsettled_seconds"} {
			Expect(exposed.String()).To(ContainSubstring("# TYPE "+m+" "), m)
		}

		for _, r := range replicas {
			r.session.Terminate().Wait(45 * time.Second)
			Expect(r.session).To(gexec.Exit(0))
			logs := string(r.session.Out.Contents()) + string(r.session.Err.Contents())
			Expect(logs).NotTo(ContainSubstring("forbidden"), "a request of the manager was refused by RBAC")
		}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: leaseName}, &lease)).To(Succeed())
		Expect(lease.Spec.HolderIdentity).To(Or(BeNil(), HaveValue(BeEmpty())), "the leader released its Lease on shutdown")
	})

	It("lets the settlement-replayer role replay a settlement (the manager resumes it) or an event, and nothing else", func() {
		const ns, user, adminUser = "finance", "oncall@example.com", "tenant-admin@example.com"
		role := find("ClusterRole", "settlement-operator-settlement-replayer")
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "replayers"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.GetName()},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		})).To(Succeed())
		nsAdmin := namespaceAdmin(ns, adminUser)

		// A settlement the provider refuses once: it dead-letters, and only a replay
		// settles it.
		billing, err := fakebilling.Start(fakebilling.Options{Token: "finance-token"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(billing.Close)
		billing.RejectNext(1, http.StatusBadRequest, "invalid_request")
		Expect(k8s.Create(ctx, &corev1.Secret{
			ObjectMeta: fixtures.CredentialMeta(ns, "billing-api-token", hooksv1alpha1.CredentialForBilling, billing.URL()),
			StringData: map[string]string{"token": "finance-token"}})).To(Succeed())
		Expect(k8s.Create(ctx, &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing"},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: billing.URL(), AllowInsecureHTTP: true,
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "billing-api-token", Key: "token"},
				RequestTimeout:       &metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		// A charge made by hand is created as the manager (the runbook's break-glass:
		// nobody else creates a Charge).
		sample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_billingsettlement.yaml")
		kubectl(managerKubeconfig(), "create", "-n", ns, "-f", sample)
		stl := decodeAll(string(must(os.ReadFile(sample))))[0]
		name, key := stl.GetName(), must(func() (string, error) {
			k, _, err := unstructured.NestedString(stl.Object, "spec", "settlementKey")
			return k, err
		}())

		r := startReplica(deployment(), managerKubeconfig())
		DeferCleanup(func() { r.session.Kill() })
		settlement := func() *hooksv1alpha1.BillingSettlement {
			GinkgoHelper()
			var bs hooksv1alpha1.BillingSettlement
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &bs)).To(Succeed())
			return &bs
		}
		Eventually(func() bool {
			bs := settlement()
			return bs.Status.State == hooksv1alpha1.SettlementFailed &&
				hasCondition(bs.Status.Conditions, hooksv1alpha1.ConditionDeadLettered, metav1.ConditionTrue)
		}).Should(BeTrue(), "the provider's refusal dead-letters the settlement")
		Expect(settlement().Finalizers).To(ContainElement(hooksv1alpha1.FinalizerSettlementProtection))

		oncall := filepath.Join(workDir, "oncall.kubeconfig")
		Expect(testenv.WriteKubeconfig(oncall, cfg, "oncall", user)).To(Succeed())
		kubectl(oncall, "annotate", "-n", ns, "billingsettlement", name, hooksv1alpha1.AnnotationReplay+"=after-outage-1")
		Eventually(func() hooksv1alpha1.SettlementState { return settlement().Status.State }).
			Should(Equal(hooksv1alpha1.SettlementSettled), "the replay resumes the settlement through the manager")
		Expect(settlement().Status.Replay).To(HaveValue(SatisfyAll(
			HaveField("LastToken", "after-outage-1"), HaveField("Count", int32(1)))))
		Expect(billing.Charges(key)).To(Equal(1))
		// Whoever may patch may also ask for a lookup by key.
		kubectl(nsAdmin, "annotate", "-n", ns, "billingsettlement", name, hooksv1alpha1.AnnotationReconcileRequest+"=by-hand-1")
		Expect(settlement().Annotations).To(HaveKeyWithValue(hooksv1alpha1.AnnotationReconcileRequest, "by-hand-1"))

		for _, denied := range [][]string{
			{"create", "billingsettlements"}, {"delete", "billingsettlements"},
			{"patch", "billingsettlements", "--subresource=status"},
			{"get", "secrets"}, {"create", "webhookevents"}, {"delete", "webhookevents"}, {"patch", "jobcompletions"},
		} {
			out, _, err := kubectlE(oncall, append([]string{"auth", "can-i", "-n", ns}, denied...)...)
			Expect(err).To(HaveOccurred(), strings.Join(denied, " "))
			Expect(out).To(Equal("no\n"), strings.Join(denied, " "))
		}

		// `patch` covers all of metadata as far as RBAC knows; the admission policy
		// leaves a person only the two annotations above. Finalizers are removed by
		// patching metadata (there is no finalizers endpoint for custom resources), so
		// that is what is tried, as the replayer and as a namespace admin.
		const (
			whyFinalizer = "finalizers are added and removed only by the settlement-operator"
			whyOwner     = "ownerReferences are refused on financial records"
			whyMetadata  = "only the hooks.settlement.dev/replay and hooks.settlement.dev/reconcile-request annotations may be changed"
			whyDelete    = "may be deleted only by the settlement-operator"
			whyStatus    = "status is written only by the settlement-operator"
		)
		for _, kc := range []string{oncall, nsAdmin} {
			refused(kc, whyFinalizer, "patch", "-n", ns, "billingsettlement", name, "--type=merge",
				"-p", `{"metadata":{"finalizers":null}}`)
			refused(kc, whyFinalizer, "patch", "-n", ns, "billingsettlement", name, "--type=json",
				"-p", `[{"op":"remove","path":"/metadata/finalizers/0"}]`)
			refused(kc, whyOwner, "patch", "-n", ns, "billingsettlement", name, "--type=merge", "-p", missingOwner)
			refused(kc, whyMetadata, "label", "-n", ns, "billingsettlement", name, "--overwrite", hooksv1alpha1.LabelProvider+"=other")
			refused(kc, whyMetadata, "annotate", "-n", ns, "billingsettlement", name, "example.com/note=x")
			refused(kc, whyMetadata, "annotate", "-n", ns, "billingsettlement", name, hooksv1alpha1.AnnotationFreshForJob+"=forged")
		}
		_, stderr, err := kubectlE(oncall, "delete", "-n", ns, "billingsettlement", name)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`cannot delete resource "billingsettlements"`), "RBAC refuses the replayer a delete")
		refused(nsAdmin, whyDelete, "delete", "-n", ns, "billingsettlement", name)
		refused(nsAdmin, whyDelete, "delete", "-n", ns, "billingsettlements", "--all")
		refused(nsAdmin, whyStatus, "patch", "-n", ns, "billingsettlement", name, "--subresource=status", "--type=merge",
			"-p", `{"status":{"exposure":"None","state":"Failed"}}`)
		// The spec stays immutable (the CRD's own rule answers first).
		_, stderr, err = kubectlE(oncall, "patch", "-n", ns, "billingsettlement", name, "--type=merge",
			"-p", `{"spec":{"customer":"cus_other"}}`)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("immutable"))

		bs := settlement()
		Expect(bs.Finalizers).To(ConsistOf(hooksv1alpha1.FinalizerSettlementProtection))
		Expect(bs.OwnerReferences).To(BeEmpty())
		Expect(bs.DeletionTimestamp).To(BeNil())
		Expect(bs.Labels).To(HaveKeyWithValue(hooksv1alpha1.LabelProvider, "inference"))
		Expect(bs.Annotations).NotTo(HaveKey("example.com/note"))
		Expect(bs.Status.State).To(Equal(hooksv1alpha1.SettlementSettled))

		// The same for a JobCompletion, the memory that a job was seen.
		jcSample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_jobcompletion.yaml")
		kubectl(managerKubeconfig(), "create", "-n", ns, "-f", jcSample)
		jc := decodeAll(string(must(os.ReadFile(jcSample))))[0].GetName()
		refused(nsAdmin, whyFinalizer, "patch", "-n", ns, "jobcompletion", jc, "--type=merge",
			"-p", `{"metadata":{"finalizers":["example.com/hold"]}}`)
		refused(nsAdmin, whyOwner, "patch", "-n", ns, "jobcompletion", jc, "--type=merge", "-p", missingOwner)
		refused(nsAdmin, whyMetadata, "label", "-n", ns, "jobcompletion", jc, hooksv1alpha1.LabelJob+"=other")
		refused(nsAdmin, "the spec is written only by the settlement-operator", "patch", "-n", ns, "jobcompletion", jc,
			"--type=merge", "-p", `{"spec":{"completion":{"version":9}}}`)
		refused(nsAdmin, whyStatus, "patch", "-n", ns, "jobcompletion", jc, "--subresource=status", "--type=merge",
			"-p", `{"status":{"appliedVersion":9}}`)
		refused(nsAdmin, whyDelete, "delete", "-n", ns, "jobcompletion", jc)
		kubectl(nsAdmin, "annotate", "-n", ns, "jobcompletion", jc, hooksv1alpha1.AnnotationReconcileRequest+"=by-hand-1")
		// And for a WebhookEvent, the receipt behind a 2xx: deleting it before dispatch,
		// or writing its phase, would lose a charge the sender never redelivers.
		evSample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_webhookevent.yaml")
		kubectl(managerKubeconfig(), "create", "-n", ns, "-f", evSample)
		ev := decodeAll(string(must(os.ReadFile(evSample))))[0].GetName()
		refused(nsAdmin, whyDelete, "delete", "-n", ns, "webhookevent", ev)
		// An event is replayed (its unmapped job states read again) by the same role and
		// annotation as a settlement, and the manager records it; deleting it to have the
		// sender redeliver is refused above, to the replayer by RBAC too.
		kubectl(oncall, "annotate", "-n", ns, "webhookevent", ev, hooksv1alpha1.AnnotationReplay+"=mapped-1")
		Eventually(func() *hooksv1alpha1.EventReplayStatus {
			var we hooksv1alpha1.WebhookEvent
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ev}, &we)).To(Succeed())
			return we.Status.Replay
		}).Should(HaveValue(SatisfyAll(HaveField("LastToken", "mapped-1"), HaveField("Count", int32(1)))),
			"the manager acts on the replayer's annotation")
		_, stderr, err = kubectlE(oncall, "delete", "-n", ns, "webhookevent", ev)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`cannot delete resource "webhookevents"`))
		refused(oncall, whyMetadata, "annotate", "-n", ns, "webhookevent", ev, "example.com/note=x")
		refused(nsAdmin, whyStatus, "patch", "-n", ns, "webhookevent", ev, "--subresource=status", "--type=merge",
			"-p", `{"status":{"phase":"Ignored"}}`)
		refused(nsAdmin, whyFinalizer, "patch", "-n", ns, "webhookevent", ev, "--type=merge",
			"-p", `{"metadata":{"finalizers":["example.com/hold"]}}`)
		// Not even the operator (nor a cluster admin) gives a record an owner: the
		// garbage collector would delete it.
		other := decodeAll(string(must(os.ReadFile(jcSample))))[0]
		other.SetName(jc + "-x")
		other.SetNamespace(ns)
		other.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone",
			UID: "00000000-0000-0000-0000-000000000000"}})
		owned := filepath.Join(workDir, "owned-jobcompletion.json")
		Expect(os.WriteFile(owned, must(other.MarshalJSON()), 0o600)).To(Succeed())
		refused(managerKubeconfig(), whyOwner, "create", "-f", owned)
		refused(adminKC, whyOwner, "create", "-f", owned)

		r.session.Terminate().Wait(45 * time.Second)
		Expect(r.session).To(gexec.Exit(0))
		Expect(string(r.session.Out.Contents())+string(r.session.Err.Contents())).NotTo(ContainSubstring("forbidden"),
			"the policy refused the manager something")
	})

	It("lets a namespace being deleted take its records, while a settlement that may have moved money stays held", func() {
		const ns, adminUser = "leaving", "leaving-admin@example.com"
		namespaceController := "system:serviceaccount:kube-system:namespace-controller"
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		nsAdmin := namespaceAdmin(ns, adminUser)
		asNamespaceController := filepath.Join(workDir, "namespace-controller.kubeconfig")
		Expect(testenv.WriteKubeconfig(asNamespaceController, cfg, "namespace-controller", namespaceController)).To(Succeed())

		stlSample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_billingsettlement.yaml")
		jcSample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_jobcompletion.yaml")
		kubectl(managerKubeconfig(), "create", "-n", ns, "-f", stlSample, "-f", jcSample)
		stl := decodeAll(string(must(os.ReadFile(stlSample))))[0].GetName()
		jc := decodeAll(string(must(os.ReadFile(jcSample))))[0].GetName()
		// A hand-made settlement may have been sent in an earlier life: its finalizer
		// holds it until the provider answers (it has no BillingProvider here).
		r := startReplica(deployment(), managerKubeconfig())
		DeferCleanup(func() { r.session.Kill() })
		Eventually(func() []string {
			var bs hooksv1alpha1.BillingSettlement
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stl}, &bs)).To(Succeed())
			return bs.Finalizers
		}).Should(ContainElement(hooksv1alpha1.FinalizerSettlementProtection))

		// In a live namespace the exemption is not the namespace controller's name.
		refused(asNamespaceController, "may be deleted only by the settlement-operator", "delete", "-n", ns, "jobcompletion", jc)

		// envtest runs no namespace controller: the namespace stays Terminating and the
		// suite deletes what the controller would, as the controller.
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		kubectl(asNamespaceController, "delete", "-n", ns, "jobcompletions", "--all", "--wait=false")
		kubectl(asNamespaceController, "delete", "-n", ns, "billingsettlements", "--all", "--wait=false")
		var jcs hooksv1alpha1.JobCompletionList
		Expect(k8s.List(ctx, &jcs, client.InNamespace(ns))).To(Succeed())
		Expect(jcs.Items).To(BeEmpty())
		Consistently(func() []string {
			var bs hooksv1alpha1.BillingSettlement
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stl}, &bs)).To(Succeed())
			Expect(bs.DeletionTimestamp).NotTo(BeNil())
			return bs.Finalizers
		}, 3*time.Second).Should(ContainElement(hooksv1alpha1.FinalizerSettlementProtection),
			"exposure Possible: the operator keeps it until the provider answers")
		// The finalizer is still the operator's alone, in a namespace being deleted too,
		// whoever asks (a cluster admin included).
		for _, kc := range []string{nsAdmin, adminKC} {
			refused(kc, "finalizers are added and removed only by the settlement-operator", "patch", "-n", ns,
				"billingsettlement", stl, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		}
		r.session.Terminate().Wait(45 * time.Second)
		Expect(r.session).To(gexec.Exit(0))
	})

	It("lets only the manager create records, and the compensators the install lists create a Refund or Void", func() {
		const ns, compensator, group = "intake", "refunds@example.com", "finance-oncall"
		intruder := "system:serviceaccount:" + ns + ":intruder"
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "intruder"}})).To(Succeed())
		// RBAC grants all three create: what stands between them and a charge is the policy.
		Expect(k8s.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "record-creator"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{hooksv1alpha1.GroupVersion.Group},
				Resources: []string{"webhookevents", "jobcompletions", "billingsettlements"}, Verbs: []string{"create", "get"}}},
		})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "record-creator"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "record-creator"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "intruder"},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: compensator},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: group}},
		})).To(Succeed())
		intruderKC := filepath.Join(workDir, "intruder.kubeconfig")
		Expect(testenv.WriteKubeconfig(intruderKC, cfg, "intruder", intruder)).To(Succeed())
		compensatorKC := filepath.Join(workDir, "compensator.kubeconfig")
		Expect(testenv.WriteKubeconfig(compensatorKC, cfg, "compensator", compensator)).To(Succeed())
		for _, kc := range []string{intruderKC, compensatorKC} {
			for _, res := range []string{"webhookevents", "jobcompletions", "billingsettlements"} {
				Expect(kubectl(kc, "auth", "can-i", "create", res, "-n", ns)).To(Equal("yes\n"), res)
			}
		}

		samples := filepath.Join(testenv.RepoRoot(), "config", "samples")
		event := filepath.Join(samples, "hooks_v1alpha1_webhookevent.yaml")
		job := filepath.Join(samples, "hooks_v1alpha1_jobcompletion.yaml")
		charge := filepath.Join(samples, "hooks_v1alpha1_billingsettlement.yaml")
		refund := filepath.Join(samples, "hooks_v1alpha1_billingsettlement_refund.yaml")
		// A Void of the same charge, under its own key.
		voidObj := decodeAll(string(must(os.ReadFile(refund))))[0]
		voidObj.SetName("inference-stl-00000000000000000000000000000001")
		Expect(unstructured.SetNestedField(voidObj.Object, "Void", "spec", "type")).To(Succeed())
		Expect(unstructured.SetNestedField(voidObj.Object, "void/inference/job-7781", "spec", "settlementKey")).To(Succeed())
		Expect(unstructured.SetNestedField(voidObj.Object, "stl_00000000000000000000000000000001", "spec", "idempotencyKey")).To(Succeed())
		void := filepath.Join(workDir, "void.json")
		Expect(os.WriteFile(void, must(voidObj.MarshalJSON()), 0o600)).To(Succeed())

		const (
			whyEvent        = "WebhookEvents are created only by the settlement-operator"
			whyJob          = "JobCompletions are created only by the settlement-operator"
			whyCharge       = "Charge settlements are created only by the settlement-operator"
			whyCompensation = "Refund and Void settlements are created only by the settlement-operator and the compensators"
		)
		// A receipt nobody delivered, a job version nobody reported, a charge nobody
		// owes: refused to a ServiceAccount RBAC allows, and to a cluster admin.
		for _, kc := range []string{intruderKC, adminKC} {
			refused(kc, whyEvent, "create", "-n", ns, "-f", event)
			refused(kc, whyJob, "create", "-n", ns, "-f", job)
			refused(kc, whyCharge, "create", "-n", ns, "-f", charge)
			refused(kc, whyCompensation, "create", "-n", ns, "-f", refund)
		}
		// The message says who is refused and what to do instead.
		refused(intruderKC, "("+intruder+")", "create", "-n", ns, "-f", charge)
		refused(intruderKC, "docs/runbook.md", "create", "-n", ns, "-f", job)
		refused(intruderKC, "hooks.settlement.dev/compensator-users and hooks.settlement.dev/compensator-groups "+
			"annotations of ServiceAccount "+operatorNamespace+"/settlement-operator-controller-manager", "create", "-n", ns, "-f", refund)

		// The install lists its compensators on the manager's ServiceAccount (the
		// policy's parameter), with the overlay docs/runbook.md shows: a user and a group.
		listCompensators("someone@example.com, "+compensator, group)
		// The policy reads its parameter from an informer: allowed once it has the change.
		Eventually(func() error {
			_, stderr, err := kubectlE(compensatorKC, "create", "-n", ns, "-f", refund)
			if err != nil {
				return fmt.Errorf("%w: %s", err, stderr)
			}
			return nil
		}).Should(Succeed(), "a listed compensator creates a Refund")
		kubectl(adminKC, "--as=finance-bot@example.com", "--as-group="+group, "create", "-n", ns, "-f", void)
		// A compensator creates compensations, nothing else.
		refused(compensatorKC, whyEvent, "create", "-n", ns, "-f", event)
		refused(compensatorKC, whyJob, "create", "-n", ns, "-f", job)
		refused(compensatorKC, whyCharge, "create", "-n", ns, "-f", charge)
		refused(intruderKC, whyCompensation, "create", "-n", ns, "-f", void)

		// The manager creates all of them.
		kubectl(managerKubeconfig(), "create", "-n", ns, "-f", event, "-f", job, "-f", charge)
		var got hooksv1alpha1.BillingSettlementList
		Expect(k8s.List(ctx, &got, client.InNamespace(ns))).To(Succeed())
		Expect(got.Items).To(HaveLen(3))
	})

	It("lets only the manager write ReconciliationReports: a hand-written confirmation would have a settlement archived and deleted", func() {
		const ns, adminUser = "audited", "audited-admin@example.com"
		namespaceController := "system:serviceaccount:kube-system:namespace-controller"
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		// Every verb on every hooks.settlement.dev resource of the namespace, reports and
		// their status included: what stands between them and a confirmation is the policy.
		nsAdmin := namespaceAdmin(ns, adminUser)
		Expect(kubectl(nsAdmin, "auth", "can-i", "patch", "reconciliationreports", "--subresource=status", "-n", ns)).To(Equal("yes\n"))
		asNamespaceController := filepath.Join(workDir, "namespace-controller.kubeconfig")
		Expect(testenv.WriteKubeconfig(asNamespaceController, cfg, "namespace-controller", namespaceController)).To(Succeed())

		writeReport := func(name string) string {
			GinkgoHelper()
			rr := hooksv1alpha1.ReconciliationReport{
				TypeMeta: metav1.TypeMeta{APIVersion: hooksv1alpha1.GroupVersion.String(), Kind: "ReconciliationReport"},
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
					Labels: map[string]string{hooksv1alpha1.LabelBillingProvider: "billing"}},
				Spec: hooksv1alpha1.ReconciliationReportSpec{BillingProviderRef: "billing",
					WindowStart: metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)),
					WindowEnd:   metav1.NewTime(time.Date(2026, 12, 1, 0, 10, 0, 0, time.UTC))},
			}
			path := filepath.Join(workDir, name+".json")
			Expect(os.WriteFile(path, must(json.Marshal(rr)), 0o600)).To(Succeed())
			return path
		}
		kept := "billing-20261201t001000z"
		keptFile := writeReport(kept)
		// The manager's pass creates its report and writes its status (as the manager's
		// pass does: create, then one status patch).
		kubectl(managerKubeconfig(), "create", "-f", keptFile)
		kubectl(managerKubeconfig(), "patch", "-n", ns, "rr", kept, "--subresource=status", "--type=merge",
			"-p", `{"status":{"phase":"Completed"}}`)

		// A confirmation of a settlement the provider never recorded: the archiver would
		// archive it as Reconciled and delete it from the cluster.
		forged := `{"status":{"confirmed":{"billingProviderUID":"0b7c2c4e-0000-4000-8000-000000000001",` +
			`"byReason":[{"reason":"ConfirmedByProvider","settlements":["0b7c2c4e-0000-4000-8000-000000000002/42"]}]}}}`
		other := writeReport("billing-20261201t002000z")
		const (
			whyStatus = "the status of a ReconciliationReport is written only by the settlement-operator"
			whyCreate = "ReconciliationReports are created only by the settlement-operator"
			whyChange = "a ReconciliationReport is changed only by the settlement-operator"
			whyDelete = "ReconciliationReports are deleted only by the settlement-operator"
		)
		for _, kc := range []string{nsAdmin, adminKC} {
			refused(kc, whyStatus, "patch", "-n", ns, "rr", kept, "--subresource=status", "--type=merge", "-p", forged)
			refused(kc, whyCreate, "create", "-f", other)
			refused(kc, whyChange, "label", "-n", ns, "rr", kept, hooksv1alpha1.LabelBillingProvider+"=other", "--overwrite")
			refused(kc, whyChange, "annotate", "-n", ns, "rr", kept, "hooks.settlement.dev/replay=1")
			refused(kc, whyDelete, "delete", "-n", ns, "rr", kept)
		}
		// The message says who is refused and where to read on.
		refused(nsAdmin, "("+adminUser+")", "create", "-f", other)
		refused(nsAdmin, "docs/runbook.md", "patch", "-n", ns, "rr", kept, "--subresource=status", "--type=merge", "-p", forged)
		var rr hooksv1alpha1.ReconciliationReport
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: kept}, &rr)).To(Succeed())
		Expect(rr.Status.Confirmed).To(BeNil(), "no confirmation was written")
		Expect(rr.Labels).To(HaveKeyWithValue(hooksv1alpha1.LabelBillingProvider, "billing"))

		// The manager writes confirmations and prunes reports.
		kubectl(managerKubeconfig(), "patch", "-n", ns, "rr", kept, "--subresource=status", "--type=merge", "-p", forged)
		kubectl(managerKubeconfig(), "create", "-f", other)
		kubectl(managerKubeconfig(), "delete", "-n", ns, "rr", "billing-20261201t002000z")

		// In a namespace being deleted its reports go with it, as the other records do
		// (envtest runs no namespace controller: the suite deletes as it would).
		refused(asNamespaceController, whyDelete, "delete", "-n", ns, "rr", kept)
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		kubectl(asNamespaceController, "delete", "-n", ns, "reconciliationreports", "--all", "--wait=false")
		var left hooksv1alpha1.ReconciliationReportList
		Expect(k8s.List(ctx, &left, client.InNamespace(ns))).To(Succeed())
		Expect(left.Items).To(BeEmpty())
	})

	It("lets a listed compensator refund a settled charge with kubectl settlement refund, and the manager sends it", func() {
		const ns, compensator, stranger = "refunds", "refunds@example.com", "stranger@example.com"
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		billing, err := fakebilling.Start(fakebilling.Options{Token: "refunds-token"})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(billing.Close)
		Expect(k8s.Create(ctx, &corev1.Secret{
			ObjectMeta: fixtures.CredentialMeta(ns, "billing-api-token", hooksv1alpha1.CredentialForBilling, billing.URL()),
			StringData: map[string]string{"token": "refunds-token"}})).To(Succeed())
		Expect(k8s.Create(ctx, &hooksv1alpha1.BillingProvider{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing"},
			Spec: hooksv1alpha1.BillingProviderSpec{Endpoint: billing.URL(), AllowInsecureHTTP: true,
				CredentialsSecretRef: hooksv1alpha1.SecretKeyReference{Name: "billing-api-token", Key: "token"},
				RequestTimeout:       &metav1.Duration{Duration: 2 * time.Second}},
		})).To(Succeed())
		// What the plugin needs, by RBAC, for both users.
		Expect(k8s.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "refunder"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{hooksv1alpha1.GroupVersion.Group},
				Resources: []string{"billingsettlements", "webhookproviders"}, Verbs: []string{"get", "list", "create"}}},
		})).To(Succeed())
		Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "refunder"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "refunder"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: compensator},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: stranger}},
		})).To(Succeed())

		sample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_billingsettlement.yaml")
		kubectl(managerKubeconfig(), "create", "-n", ns, "-f", sample)
		charge := decodeAll(string(must(os.ReadFile(sample))))[0].GetName()
		r := startReplica(deployment(), managerKubeconfig())
		DeferCleanup(func() { r.session.Kill() })
		settlement := func(name string) *hooksv1alpha1.BillingSettlement {
			GinkgoHelper()
			var bs hooksv1alpha1.BillingSettlement
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &bs); err != nil {
				return &hooksv1alpha1.BillingSettlement{}
			}
			return &bs
		}
		Eventually(func() hooksv1alpha1.SettlementState { return settlement(charge).Status.State }).
			Should(Equal(hooksv1alpha1.SettlementSettled))

		plugin := must(gexec.Build("github.com/settlement-operator/settlement-operator/cmd/kubectl-settlement"))
		refundAs := func(user string) (string, string, error) {
			kc := filepath.Join(workDir, user+".kubeconfig")
			Expect(testenv.WriteKubeconfig(kc, cfg, user, user)).To(Succeed())
			return runE(plugin, "refund", charge, "--full", "-n", ns, "--kubeconfig", kc)
		}
		listCompensators(compensator, "")
		_, stderr, err := refundAs(stranger)
		Expect(err).To(HaveOccurred(), "a user RBAC lets create settlements, not listed as a compensator")
		Expect(stderr).To(SatisfyAll(ContainSubstring("not allowed to create the refund"),
			ContainSubstring("Refund and Void settlements are created only by the settlement-operator and the compensators"),
			ContainSubstring("("+stranger+")")))
		var out string
		Eventually(func() error { // once the policy's informer has the list
			var stderr string
			out, stderr, err = refundAs(compensator)
			if err != nil {
				return fmt.Errorf("%w: %s", err, stderr)
			}
			return nil
		}).Should(Succeed())
		Expect(out).To(ContainSubstring("created refund"))
		var refund string
		Eventually(func() []string { return settlement(charge).Status.ReversedBy }).Should(HaveLen(1))
		refund = settlement(charge).Status.ReversedBy[0]
		Eventually(func() hooksv1alpha1.SettlementState { return settlement(refund).Status.State }).
			Should(Equal(hooksv1alpha1.SettlementSettled), "the manager sends the compensator's refund")
		Expect(settlement(refund).Spec.Type).To(Equal(hooksv1alpha1.SettlementRefund))

		r.session.Terminate().Wait(45 * time.Second)
		Expect(r.session).To(gexec.Exit(0))
		// (The namespace an earlier spec left Terminating refuses the manager's events
		// there: "forbidden", but not the policy.)
		Expect(string(r.session.Out.Contents())+string(r.session.Err.Contents())).NotTo(ContainSubstring("ValidatingAdmissionPolicy"),
			"the policy refused the manager something")
	})

	It("keeps the key of a settled settlement deleted with its namespace in a tombstone, with the manager's own permissions", func() {
		const ns = "leaving-settled"
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		asNamespaceController := filepath.Join(workDir, "namespace-controller.kubeconfig")
		Expect(testenv.WriteKubeconfig(asNamespaceController, cfg, "namespace-controller",
			"system:serviceaccount:kube-system:namespace-controller")).To(Succeed())
		stlSample := filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_billingsettlement.yaml")
		kubectl(managerKubeconfig(), "apply", "--server-side", "-n", ns, "-f", stlSample)
		sample := decodeAll(string(must(os.ReadFile(stlSample))))[0]
		stl := sample.GetName()
		r := startReplica(deployment(), managerKubeconfig())
		DeferCleanup(func() { r.session.Kill() })
		Eventually(func() []string {
			var bs hooksv1alpha1.BillingSettlement
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stl}, &bs)).To(Succeed())
			return bs.Finalizers
		}).Should(ContainElement(hooksv1alpha1.FinalizerSettlementProtection))
		// As if the provider had settled it (only the manager's identity may write status).
		kubectl(managerKubeconfig(), "patch", "-n", ns, "billingsettlement", stl, "--subresource=status", "--type=merge", "-p",
			`{"status":{"state":"Settled","exposure":"Confirmed","attempts":1,"providerRef":"pay_1",`+
				`"firstSubmittedAt":"2026-01-01T00:00:00Z","settledAt":"2026-01-01T00:00:01Z"}}`)

		// No archive is configured: the settlement goes with its namespace once the
		// manager, as its ServiceAccount, has written its tombstone in its own namespace.
		Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		kubectl(asNamespaceController, "delete", "-n", ns, "billingsettlements", "--all", "--wait=false")
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: stl}, &hooksv1alpha1.BillingSettlement{}))
		}).WithTimeout(time.Minute).Should(BeTrue())
		var cms corev1.ConfigMapList
		Expect(k8s.List(ctx, &cms, client.InNamespace(operatorNamespace),
			client.MatchingLabels{hooksv1alpha1.LabelTombstonesOf: ns})).To(Succeed())
		Expect(cms.Items).To(HaveLen(1))
		Expect(cms.Items[0].Data).To(HaveKeyWithValue(stl, ContainSubstring(`"idempotencyKey":"stl_81831a7c17b547c9ae4a86e4cceefbb0"`)))
		r.session.Terminate().Wait(45 * time.Second)
		Expect(r.session).To(gexec.Exit(0))
	})

	It("ships NetworkPolicy and ServiceMonitor add-ons that select the installed Pods and metrics Service", func() {
		dep := deployment()
		podLabels := labels.Set(dep.Spec.Template.Labels)
		ports := map[string]bool{}
		for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
			ports[p.Name] = true
		}
		// As the README says: kubectl apply --server-side -k config/network-policy.
		dir := filepath.Join(testenv.RepoRoot(), "config", "network-policy")
		Expect(kubectl(adminKC, "apply", "--server-side", "-k", dir)).To(ContainSubstring("serverside-applied"))
		policies := decodeAll(run(kustomize, "build", dir))
		Expect(policies).To(HaveLen(2))
		for _, o := range policies {
			var np networkingv1.NetworkPolicy
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, &np)).To(Succeed())
			Expect(np.Namespace).To(Equal(operatorNamespace))
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			Expect(err).NotTo(HaveOccurred())
			Expect(sel.Matches(podLabels)).To(BeTrue(), np.Name)
			for _, rule := range np.Spec.Ingress {
				for _, p := range rule.Ports {
					Expect(ports).To(HaveKey(p.Port.StrVal), np.Name+" admits a named port of the manager")
				}
			}
		}

		// The ServiceMonitor's CRD belongs to the Prometheus Operator, so it is checked
		// against the installer rather than applied; the identity it scrapes as is applied.
		// Its alerts are checked by test/prometheus (PromQL, metric names, runbook links).
		monitoring := decodeAll(run(kustomize, "build", filepath.Join(testenv.RepoRoot(), "config", "prometheus")))
		Expect(monitoring).To(HaveLen(5))
		kinds := map[string]*unstructured.Unstructured{}
		var scraper []*unstructured.Unstructured
		for _, o := range monitoring {
			kinds[o.GetKind()] = o
			if o.GroupVersionKind().Group != "monitoring.coreos.com" {
				scraper = append(scraper, o)
			}
		}
		expectScraperIdentity(monitoring, find("ClusterRole", "settlement-operator-metrics-reader").GetName())
		var manifest strings.Builder
		for _, o := range scraper {
			manifest.Write(must(o.MarshalJSON()))
			manifest.WriteString("\n")
		}
		scraperPath := filepath.Join(workDir, "prometheus-scraper.json")
		Expect(os.WriteFile(scraperPath, []byte(manifest.String()), 0o600)).To(Succeed())
		Expect(kubectl(adminKC, "apply", "--server-side", "-f", scraperPath)).To(ContainSubstring("serverside-applied"))
		as := "--as=system:serviceaccount:" + operatorNamespace + ":settlement-operator-metrics-scraper"
		Expect(kubectl(adminKC, "auth", "can-i", "get", "/metrics", as)).To(Equal("yes\n"))
		out, _, err := kubectlE(adminKC, "auth", "can-i", "get", "secrets", "-n", operatorNamespace, as)
		Expect(err).To(HaveOccurred())
		Expect(out).To(Equal("no\n"))
		Expect(kinds).To(HaveKey("PrometheusRule"))
		Expect(kinds["PrometheusRule"].GetNamespace()).To(Equal(operatorNamespace))
		sm := kinds["ServiceMonitor"]
		Expect(sm).NotTo(BeNil())
		Expect(sm.GetNamespace()).To(Equal(operatorNamespace))
		match, _, err := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		Expect(err).NotTo(HaveOccurred())
		metricsSvc := decode[corev1.Service](find("Service", "settlement-operator-controller-manager-metrics-service"))
		receiverSvc := decode[corev1.Service](find("Service", "settlement-operator-webhook-receiver"))
		Expect(labels.SelectorFromSet(match).Matches(labels.Set(metricsSvc.Labels))).To(BeTrue())
		Expect(labels.SelectorFromSet(match).Matches(labels.Set(receiverSvc.Labels))).To(BeFalse())
		endpoints, _, err := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		Expect(err).NotTo(HaveOccurred())
		Expect(endpoints).To(HaveLen(1))
		Expect(endpoints[0]).To(HaveKeyWithValue("port", metricsSvc.Spec.Ports[0].Name))
		Expect(endpoints[0]).To(SatisfyAll(HaveKeyWithValue("scheme", "https"), HaveKey("authorization"),
			HaveKey("tlsConfig")), "Prometheus authenticates with the scraper's token over TLS")
	})

	It("undeploys like `make undeploy`: the operator goes, the CRDs and every record stay", func() {
		var before hooksv1alpha1.BillingSettlementList
		Expect(k8s.List(ctx, &before)).To(Succeed())
		Expect(before.Items).NotTo(BeEmpty())
		rendered := run(kustomize, "build", filepath.Join(testenv.RepoRoot(), "config", "operator"))
		path := filepath.Join(workDir, "operator.yaml")
		Expect(os.WriteFile(path, []byte(rendered), 0o600)).To(Succeed())
		kubectl(adminKC, "delete", "--ignore-not-found", "--wait=false", "-f", path)
		_, _, err := kubectlE(adminKC, "get", "-n", operatorNamespace, "deployment/settlement-operator-controller-manager")
		Expect(err).To(HaveOccurred(), "the Deployment is gone")
		var crds apiextensionsv1.CustomResourceDefinitionList
		Expect(k8s.List(ctx, &crds)).To(Succeed())
		files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(crds.Items).To(HaveLen(len(files)))
		var after hooksv1alpha1.BillingSettlementList
		Expect(k8s.List(ctx, &after)).To(Succeed())
		Expect(after.Items).To(HaveLen(len(before.Items)))
	})

	It("documents only metrics the operator defines", func() {
		readme := string(must(os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))))
		documented := regexp.MustCompile("`(settlement_[a-z_]+)`").FindAllStringSubmatch(readme, -1)
		Expect(documented).NotTo(BeEmpty())
		var source strings.Builder
		for _, dir := range []string{"controllers", "internal"} {
			Expect(filepath.WalkDir(filepath.Join(testenv.RepoRoot(), dir), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
					source.Write(must(os.ReadFile(p)))
				}
				return err
			})).To(Succeed())
		}
		for _, m := range documented {
			Expect(source.String()).To(ContainSubstring(`"`+m[1]+`"`), "README names metric %s", m[1])
		}
	})
})

// listCompensators applies the installer through the kustomize overlay docs/runbook.md
// shows ("Compensate"), listing users and groups on the manager's ServiceAccount, and
// checks that it changes that ServiceAccount and nothing else. Applying the installer
// again at the end of the spec lists nobody.
func listCompensators(users, groups string) {
	GinkgoHelper()
	overlay := must(os.MkdirTemp(testenv.RepoRoot(), ".overlay-"))
	DeferCleanup(os.RemoveAll, overlay)
	Expect(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(`resources:
- ../config/default
patches:
- target: {kind: ServiceAccount, name: settlement-operator-controller-manager}
  patch: |-
    - op: replace
      path: /metadata/annotations/hooks.settlement.dev~1compensator-users
      value: `+users+`
    - op: replace
      path: /metadata/annotations/hooks.settlement.dev~1compensator-groups
      value: `+groups+`
`), 0o600)).To(Succeed())
	listed := filepath.Join(workDir, "install-with-compensators.yaml")
	Expect(os.WriteFile(listed, []byte(run(kustomize, "build", overlay)), 0o600)).To(Succeed())
	kubectl(adminKC, "apply", "--server-side", "-f", install) // the image of an earlier spec's upgrade back
	before := stableResourceVersions()
	kubectl(adminKC, "apply", "--server-side", "-f", listed)
	var changed []string
	for k, rv := range resourceVersions() {
		if before[k] != rv {
			changed = append(changed, k)
		}
	}
	Expect(changed).To(ConsistOf("ServiceAccount/"+operatorNamespace+"/settlement-operator-controller-manager"),
		"listing compensators changes the ServiceAccount alone")
	DeferCleanup(func() { kubectl(adminKC, "apply", "--server-side", "-f", install) })
}

// replica is one manager process, started as the Deployment would start it.
type replica struct {
	session                   *gexec.Session
	receiver, metrics, probes string
}

// startReplica runs the manager binary with the Deployment's container args, the bind
// addresses moved to free loopback ports and the Lease namespace given explicitly
// (outside a Pod there is no namespace file to read it from).
func startReplica(dep *appsv1.Deployment, kubeconfig string) *replica {
	GinkgoHelper()
	r := &replica{receiver: freeAddr(), metrics: freeAddr(), probes: freeAddr()}
	args := []string{"--kubeconfig", kubeconfig, "--leader-election-namespace", dep.Namespace}
	replaced := 0
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		for flag, addr := range map[string]string{"--receiver-bind-address=": r.receiver,
			"--metrics-bind-address=": r.metrics, "--health-probe-bind-address=": r.probes} {
			if strings.HasPrefix(a, flag) {
				a = flag + addr
				replaced++
			}
		}
		args = append(args, a)
	}
	Expect(replaced).To(Equal(3), "the Deployment sets the receiver, metrics and probe addresses")
	cmd := exec.Command(managerBin, args...)
	// As the Deployment's downward API gives the Pod its namespace.
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+dep.Namespace)
	s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	r.session = s
	Eventually(func() int {
		resp, err := http.Get("http://" + r.probes + "/readyz")
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}).Should(Equal(http.StatusOK))
	return r
}

func deployment() *appsv1.Deployment {
	GinkgoHelper()
	d := decode[appsv1.Deployment](find("Deployment", "settlement-operator-controller-manager"))
	return &d
}

func find(kind, name string) *unstructured.Unstructured {
	GinkgoHelper()
	for _, o := range objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	Fail(fmt.Sprintf("the installer has no %s %s", kind, name))
	return nil
}

func decode[T any](u *unstructured.Unstructured) T {
	GinkgoHelper()
	var t T
	Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t)).To(Succeed())
	return t
}

// resourceVersions reads every object of the installer back from the API server.
func resourceVersions() map[string]string {
	GinkgoHelper()
	var list unstructured.UnstructuredList
	Expect(json.Unmarshal([]byte(kubectl(adminKC, "get", "-f", install, "-o", "json")), &list.Object)).To(Succeed())
	items, _, err := unstructured.NestedSlice(list.Object, "items")
	Expect(err).NotTo(HaveOccurred())
	out := map[string]string{}
	for _, it := range items {
		u := &unstructured.Unstructured{Object: it.(map[string]any)}
		out[objectKey(u)] = u.GetResourceVersion()
	}
	return out
}

// stableResourceVersions waits until the API server's own follow-up writes (CRD status
// after establishing) are done, so a later comparison sees only what an apply did.
func stableResourceVersions() map[string]string {
	GinkgoHelper()
	var last map[string]string
	Eventually(func() bool {
		cur := resourceVersions()
		same := last != nil && maps.Equal(cur, last)
		last = cur
		return same
	}).WithPolling(time.Second).Should(BeTrue())
	return last
}

func must[T any](v T, err error) T {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	return v
}

// missingOwner is a merge patch giving an object an owner that does not exist: the
// garbage collector would delete the object at once.
const missingOwner = `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone",` +
	`"uid":"00000000-0000-0000-0000-000000000000"}]}}`

// managerKubeconfig writes a kubeconfig that acts as the manager's ServiceAccount.
func managerKubeconfig() string {
	GinkgoHelper()
	path := filepath.Join(workDir, "manager.kubeconfig")
	Expect(testenv.WriteKubeconfig(path, cfg, "as-manager", managerUser)).To(Succeed())
	return path
}

// namespaceAdmin gives user every verb on every hooks.settlement.dev resource of ns
// (more than a tenant admin usually gets) and returns a kubeconfig acting as user.
func namespaceAdmin(ns, user string) string {
	GinkgoHelper()
	Expect(k8s.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settlement-admin"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{hooksv1alpha1.GroupVersion.Group}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	})).To(Succeed())
	Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settlement-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "settlement-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())
	path := filepath.Join(workDir, ns+"-admin.kubeconfig")
	Expect(testenv.WriteKubeconfig(path, cfg, ns+"-admin", user)).To(Succeed())
	return path
}

// refused runs kubectl and expects the API server to refuse it with a message that
// contains why.
func refused(kubeconfig, why string, args ...string) {
	GinkgoHelper()
	out, stderr, err := kubectlE(kubeconfig, args...)
	Expect(err).To(HaveOccurred(), "kubectl %s was allowed:\n%s", strings.Join(args, " "), out)
	Expect(stderr).To(ContainSubstring(why), "kubectl %s", strings.Join(args, " "))
}

func hasCondition(conds []metav1.Condition, typ string, status metav1.ConditionStatus) bool {
	for _, c := range conds {
		if c.Type == typ && c.Status == status {
			return true
		}
	}
	return false
}

// recordProtectionParam is "<namespace>/<name>" of the ServiceAccount the record
// protection policy's binding takes as its parameter (the manager's identity).
func recordProtectionParam(objs []*unstructured.Unstructured) string {
	GinkgoHelper()
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicyBinding" {
			b := decode[admissionregistrationv1.ValidatingAdmissionPolicyBinding](o)
			Expect(b.Spec.ParamRef).NotTo(BeNil())
			Expect(b.Spec.ParamRef.ParameterNotFoundAction).To(HaveValue(Equal(admissionregistrationv1.DenyAction)))
			return b.Spec.ParamRef.Namespace + "/" + b.Spec.ParamRef.Name
		}
	}
	Fail("the installer has no ValidatingAdmissionPolicyBinding")
	return ""
}

// scraped is one answer of a replica's metrics endpoint.
type scraped struct {
	status int
	body   string
}

// scrape GETs https://<addr>/metrics with a bearer token ("" sends none). The manager
// serves a self-signed certificate (no --metrics-cert-dir), so it is not verified;
// that it is TLS at all is checked by the request succeeding.
func scrape(addr, token string) scraped {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
	Expect(err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the manager's self-signed certificate
	}}
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	return scraped{status: resp.StatusCode, body: string(must(io.ReadAll(resp.Body)))}
}

// metricsToken creates ServiceAccount monitoring/<name>, bound to the installer's
// metrics-reader ClusterRole when reader is true, and returns a token for it from the
// TokenRequest API (as a kubelet would mount into Prometheus' Pod).
func metricsToken(name string, reader bool) string {
	GinkgoHelper()
	const ns = "monitoring"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), err.Error())
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	Expect(k8s.Create(ctx, sa)).To(Succeed())
	if reader {
		role := find("ClusterRole", "settlement-operator-metrics-reader")
		Expect(k8s.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.GetName()},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		})).To(Succeed())
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	Expect(k8s.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
	Expect(tr.Status.Token).NotTo(BeEmpty())
	return tr.Status.Token
}
