package testenv

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig renders cfg (an envtest admin config: client certificate, CA) as a
// kubeconfig whose only context is name, so separate processes — kubectl, the manager
// binary — can talk to a control plane a test or the demo started. When impersonate
// is not empty every request acts as that user: "system:serviceaccount:<ns>:<name>"
// gets exactly the ServiceAccount's RBAC (the API server adds its groups), which is how
// a suite proves that the deployed RBAC is enough without a kubelet to mount tokens.
func Kubeconfig(cfg *rest.Config, name, impersonate string) ([]byte, error) {
	host, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("parse API server URL %q: %w", cfg.Host, err)
	}
	if host.Scheme == "" {
		host.Scheme = "https"
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server: host.Scheme + "://" + host.Host + cfg.APIPath, CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken,
		Impersonate: impersonate,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: "default"}
	kc.CurrentContext = name
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, fmt.Errorf("serialize kubeconfig: %w", err)
	}
	return b, nil
}

// WriteKubeconfig writes Kubeconfig(cfg, name, impersonate) to path, readable by the
// owner only (it holds a client key), replacing the file atomically so a process
// polling for it never reads half a file.
func WriteKubeconfig(path string, cfg *rest.Config, name, impersonate string) error {
	b, err := Kubeconfig(cfg, name, impersonate)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".kubeconfig-*")
	if err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}
