// Package argocd tests the Argo CD health checks in config/argocd: each script runs
// in gopher-lua, the Lua VM Argo CD runs them in, with the object as `obj` (decoded
// from its JSON as Argo CD does), against objects of every kind in each state. The
// runner is exported so the integration suite runs the same scripts on objects the
// operator wrote to a real API server.
package argocd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// T is what the runner needs of a test: testing.T and Ginkgo's GinkgoT() both fit.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Scripts reads config/argocd/argocd-cm.yaml: kind → health script.
func Scripts(t T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "argocd", "argocd-cm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	prefix := "resource.customizations.health." + hooksv1alpha1.GroupVersion.Group + "_"
	for k, v := range cm.Data {
		if !strings.HasPrefix(k, prefix) {
			t.Fatalf("unexpected key %q", k)
		}
		out[strings.TrimPrefix(k, prefix)] = v
	}
	return out
}

// toLua decodes a JSON value into Lua values as Argo CD does (objects and arrays
// become tables, numbers float).
func toLua(l *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case map[string]any:
		t := l.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	case []any:
		t := l.NewTable()
		for _, e := range x {
			t.Append(toLua(l, e))
		}
		return t
	case string:
		return lua.LString(x)
	case float64:
		return lua.LNumber(x)
	case bool:
		return lua.LBool(x)
	}
	return lua.LNil
}

// Health runs a script on obj and returns its status and message.
func Health(t T, script string, obj any) (string, string) {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	l := lua.NewState(lua.Options{SkipOpenLibs: false})
	defer l.Close()
	l.SetGlobal("obj", toLua(l, m))
	if err := l.DoString(script); err != nil {
		t.Fatalf("script failed: %v", err)
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("script returned %s, not a table", l.Get(-1).Type())
	}
	return ret.RawGetString("status").String(), ret.RawGetString("message").String()
}
